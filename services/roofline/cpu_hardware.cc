#include "services/roofline/cpu_hardware.h"

#include "absl/strings/str_cat.h"
#include "kernels/cpu/machine_peaks.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"

namespace cleave::roofline {

Hardware measureCpuHardware(int threads, bool quantized_weights, int reps, int64_t bandwidth_bytes,
                            bool bf16_weights) {
  cpu::ThreadPool pool(threads);
  const double int8_peak = cpu::int8PeakOps(pool), f32_peak = cpu::f32PeakFlops(pool);
  // The bf16 dots' peak only where BF16 weights run on them.
  const double bf16_peak = bf16_weights && cpu::bf16DotsChosen() ? cpu::bf16PeakFlops(pool) : 0;
  const double float_peak = bf16_peak > 0 ? bf16_peak : f32_peak;
  return {.name = absl::StrCat("cpu (", threads, " threads)"),
          .bandwidth = cpu::readBandwidth(pool, reps, bandwidth_bytes),
          .peak_flops = quantized_weights && int8_peak > 0 ? int8_peak : float_peak,
          .float_peak_flops = float_peak,
          .attention_flops = f32_peak};
}

}  // namespace cleave::roofline
