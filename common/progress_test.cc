#include "common/progress.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace cleave {
namespace {

std::string contents(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string out;
  for (int c; (c = std::fgetc(f)) != EOF;) out += static_cast<char>(c);
  return out;
}

TEST(ProgressLineTest, SilentWhenNotATerminal) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    ProgressLine line(f);  // A regular file is not a terminal.
    EXPECT_FALSE(line.enabled());
    line.update("loading 1 of 2", /*force=*/true);
  }
  EXPECT_EQ(contents(f), "");
  std::fclose(f);
}

TEST(ProgressLineTest, RedrawsInPlaceAndThrottles) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    ProgressLine line(f, /*enabled=*/true);
    line.update("first");
    line.update("dropped: under 100 ms after the first");
    line.update("forced", /*force=*/true);
  }
  EXPECT_EQ(contents(f), "\rfirst\x1b[K\rforced\x1b[K\r\x1b[K");
  std::fclose(f);
}

TEST(ProgressLineTest, HumanBytes) {
  EXPECT_EQ(humanBytes(0), "0 B");
  EXPECT_EQ(humanBytes(1023), "1023 B");
  EXPECT_EQ(humanBytes(1536), "1.50 KiB");
  EXPECT_EQ(humanBytes(uint64_t{100} << 20), "100.0 MiB");
  EXPECT_EQ(humanBytes(uint64_t{3} << 40), "3.00 TiB");
}

}  // namespace
}  // namespace cleave
