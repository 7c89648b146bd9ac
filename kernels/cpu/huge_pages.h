// Host memory for the buffers a step streams through at memory speed: the KV cache, weights
// repacked at load (and float weights copied at load, CpuMatrix::create), the bandwidth
// probe that sets their floor.
//
// On 4 KiB pages such a stream is slower than the memory: every KV block of a head lands on
// pages of its own (a TLB miss, and a page walk, per block), and the hardware prefetchers stop
// at each 4 KiB boundary. On this project's 2-core Zen 3 machine, 2 MiB pages took decode
// attention at long context from 23 to 31 GB/s and the read probe from 25 to 34 GB/s
// (docs/engine.md). So these buffers ask for transparent huge pages (MADV_HUGEPAGE), which
// the kernel grants where /sys/kernel/mm/transparent_hugepage/enabled is "madvise" or
// "always" and 2 MiB of free contiguous memory can be found; elsewhere they are ordinary
// pages, and everything works the same, slower.
//
// A buffer of 2 MiB or more is a mapping of its own starting on a 2 MiB boundary; a smaller
// one is carved from a shared 32 MiB mapping (so a small model's many small matrices share
// huge pages too), which is unmapped once every buffer carved from it is gone.
#pragma once

#include <cstdint>
#include <memory>

namespace cleave::cpu {

// `bytes` (> 0) of zeroed memory aligned to `alignment` (a power of two, at most 4096), or
// null when the system has no memory for it. Thread-safe.
std::shared_ptr<uint8_t> allocateOnHugePages(int64_t bytes, int64_t alignment = 64);

// "always", "madvise" or "never" (the kernel's transparent-huge-page mode), or "" where the
// kernel does not say.
const char* hugePageMode();

}  // namespace cleave::cpu
