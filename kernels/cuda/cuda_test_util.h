// What the CUDA kernel tests share: device buffers, bf16 conversion, random inputs, a
// poison value and the comparison against a CPU reference. Test code only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/device.h"

namespace cleave::cuda::testing {

// True when a CUDA device is usable; tests GTEST_SKIP otherwise.
inline bool haveDevice() {
  auto devices = listDevices();
  return devices.ok() && !devices->empty();
}

#define CLEAVE_REQUIRE_GPU() \
  if (!::cleave::cuda::testing::haveDevice()) GTEST_SKIP() << "no CUDA device or driver"

#define CUDA_ASSERT_OK(expr)                                                                     \
  do {                                                                                           \
    cudaError_t cleave_error_ = (expr);                                                          \
    ASSERT_EQ(cleave_error_, cudaSuccess) << #expr << ": " << cudaGetErrorString(cleave_error_); \
  } while (0)

// A device copy of a host vector, freed with it; 0xFF bytes (NaN for bf16 and f32) when
// made from a size alone, so unwritten outputs show.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t count) : count_(count) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&data_), bytes() == 0 ? 1 : bytes()),
              cudaSuccess);
    EXPECT_EQ(cudaMemset(data_, 0xFF, bytes()), cudaSuccess);
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    EXPECT_EQ(cudaMemcpy(data_, host.data(), bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return data_; }
  size_t bytes() const { return count_ * sizeof(T); }
  std::vector<T> copyToHost() const {
    std::vector<T> host(count_);
    EXPECT_EQ(cudaMemcpy(host.data(), data_, bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

 private:
  T* data_ = nullptr;
  size_t count_;
};

using bf16 = __nv_bfloat16;

inline float toFloat(bf16 v) { return __bfloat162float(v); }
inline std::vector<float> toFloat(const std::vector<bf16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __bfloat162float(v[i]);
  return out;
}

// A seed for this run's inputs, printed so a failure can be replayed with CLEAVE_TEST_SEED.
inline uint32_t freshSeed() {
  if (const char* forced = std::getenv("CLEAVE_TEST_SEED")) return std::stoul(forced);
  const uint32_t seed = std::random_device{}();
  std::printf("inputs seeded with CLEAVE_TEST_SEED=%u\n", seed);
  return seed;
}

// Uniform in [-scale, scale), rounded to bf16.
inline std::vector<bf16> randomBf16(size_t count, std::mt19937& rng, float scale = 1.0f) {
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<bf16> out(count);
  for (bf16& v : out) v = __float2bfloat16(dist(rng));
  return out;
}

struct Difference {
  double relative_l2 = 0;  // ||got - want|| / ||want||
  double max_abs = 0;
  int64_t non_finite = 0;
};

inline Difference compare(const std::vector<float>& got, const std::vector<float>& want) {
  Difference d;
  double err = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) {
      ++d.non_finite;
      continue;
    }
    const double e = static_cast<double>(got[i]) - want[i];
    err += e * e;
    norm += static_cast<double>(want[i]) * want[i];
    d.max_abs = std::max(d.max_abs, std::abs(e));
  }
  d.relative_l2 = std::sqrt(err / std::max(norm, 1e-30));
  return d;
}

}  // namespace cleave::cuda::testing
