// This CPU as a roofline::Hardware, measured on the spot with `threads` threads: read
// bandwidth and the SIMD peak of the weights' products (int8 for block-quantized weights, as
// the quantized kernels issue it: AVX-512 VNNI or AVX2; f32 FMA otherwise; float weights'
// products at the f32 peak, or with `bf16_weights` at the bf16 dot peak where the BF16
// weights' kernel runs, cpu::bf16DotsChosen: all of them, F32 ones too, since a floor
// must not price any product above its time; attention always at the f32 peak).
// Workers, `cleave roofline --hardware cpu` and bench_engine all measure through this, so
// a live step's floor and a benchmark's floor are the same number for the same step.
#pragma once

#include <cstdint>

#include "services/roofline/roofline.h"

namespace cleave::roofline {

// `bandwidth_bytes`: the buffer read to measure bandwidth (far larger than the caches).
Hardware measureCpuHardware(int threads, bool quantized_weights, int reps = 5,
                            int64_t bandwidth_bytes = int64_t{256} << 20,
                            bool bf16_weights = false);

}  // namespace cleave::roofline
