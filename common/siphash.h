// SipHash-2-4 (Aumasson and Bernstein): a keyed 64-bit hash. With a secret key nobody can
// choose inputs that collide, which a hash over client-chosen data that decides what is
// shared between clients (the KV prefix cache's block chain) needs.
#pragma once

#include <cstdint>
#include <span>

namespace cleave {

struct SipKey {
  uint64_t k0 = 0, k1 = 0;
};

uint64_t sipHash24(const SipKey& key, std::span<const uint8_t> bytes);

// A key drawn from the system's random source once per process.
const SipKey& processSipKey();

}  // namespace cleave
