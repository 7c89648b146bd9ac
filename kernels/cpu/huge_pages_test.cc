#include "kernels/cpu/huge_pages.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace cleave::cpu {
namespace {

bool allZero(const uint8_t* p, int64_t n) {
  return std::all_of(p, p + n, [](uint8_t b) { return b == 0; });
}

TEST(HugePagesTest, LargeBuffersStartOnA2MiBBoundaryAndAreZeroedAndWritable) {
  for (int64_t bytes : {int64_t{2} << 20, (int64_t{5} << 20) + 123}) {
    auto buffer = allocateOnHugePages(bytes);
    ASSERT_NE(buffer, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer.get()) % (uintptr_t{2} << 20), 0u);
    EXPECT_TRUE(allZero(buffer.get(), bytes));
    std::memset(buffer.get(), 0xa5, bytes);  // Every byte is ours (a fault would end the test).
    EXPECT_EQ(buffer.get()[bytes - 1], 0xa5);
  }
}

TEST(HugePagesTest, SmallBuffersAreAlignedDisjointZeroedAndOutliveEachOther) {
  // Sizes and alignments mixed, so the carving has to skip to each alignment.
  const int64_t sizes[] = {1, 100, 4096, 70000, 5, (int64_t{1} << 20) + 3, 64, 999};
  const int64_t alignments[] = {64, 4096, 8, 64, 4096, 64, 1, 16};
  std::vector<std::shared_ptr<uint8_t>> buffers;
  for (size_t i = 0; i < std::size(sizes); ++i) {
    auto b = allocateOnHugePages(sizes[i], alignments[i]);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.get()) % alignments[i], 0u) << i;
    EXPECT_TRUE(allZero(b.get(), sizes[i])) << i;
    std::memset(b.get(), static_cast<int>(i + 1), sizes[i]);
    buffers.push_back(std::move(b));
  }
  // Each still holds its own bytes: no two overlap.
  for (size_t i = 0; i < buffers.size(); ++i) {
    const uint8_t* p = buffers[i].get();
    EXPECT_TRUE(std::all_of(p, p + sizes[i], [&](uint8_t b) { return b == i + 1; })) << i;
  }
  // Dropping the first ones leaves the rest readable (the slab lives while any part does).
  buffers.erase(buffers.begin(), buffers.begin() + 4);
  EXPECT_EQ(buffers.back().get()[998], 8);
}

TEST(HugePagesTest, ManySmallBuffersSpanSeveralSlabs) {
  std::vector<std::shared_ptr<uint8_t>> buffers;
  for (int i = 0; i < 100; ++i) {  // 100 x 1 MiB: at least four 32 MiB slabs.
    buffers.push_back(allocateOnHugePages(int64_t{1} << 20));
    ASSERT_NE(buffers.back(), nullptr);
    buffers.back().get()[0] = static_cast<uint8_t>(i);
    buffers.back().get()[(1 << 20) - 1] = static_cast<uint8_t>(i);
  }
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(buffers[i].get()[0], i);
    EXPECT_EQ(buffers[i].get()[(1 << 20) - 1], i);
  }
}

TEST(HugePagesTest, RefusesBadSizesAndAlignments) {
  EXPECT_EQ(allocateOnHugePages(0), nullptr);
  EXPECT_EQ(allocateOnHugePages(-5), nullptr);
  EXPECT_EQ(allocateOnHugePages(64, 48), nullptr);    // Not a power of two.
  EXPECT_EQ(allocateOnHugePages(64, 8192), nullptr);  // Above a page.
}

TEST(HugePagesTest, ReadsTheKernelsMode) {
  const std::string mode = hugePageMode();
  EXPECT_TRUE(mode.empty() || mode == "always" || mode == "madvise" || mode == "never") << mode;
}

}  // namespace
}  // namespace cleave::cpu
