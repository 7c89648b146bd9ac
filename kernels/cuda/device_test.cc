#include "kernels/cuda/device.h"

#include <gtest/gtest.h>

namespace cleave::cuda {
namespace {

TEST(CudaDeviceTest, ListsDevicesOrNoneWithoutADriver) {
  auto devices = listDevices();
  ASSERT_TRUE(devices.ok()) << devices.status();
  if (devices->empty()) GTEST_SKIP() << "no CUDA device or driver on this machine";
  for (const DeviceInfo& device : *devices) {
    EXPECT_FALSE(device.name.empty());
    EXPECT_GE(device.sm_major, 7) << device.name;
    EXPECT_GT(device.multiprocessors, 0);
    EXPECT_GT(device.total_memory_bytes, size_t{1} << 30);
  }
}

}  // namespace
}  // namespace cleave::cuda
