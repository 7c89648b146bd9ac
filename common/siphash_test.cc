#include "common/siphash.h"

#include <gtest/gtest.h>

#include <vector>

namespace cleave {
namespace {

// The reference vectors of the SipHash paper's implementation (vectors.h): key bytes 0..15,
// messages of bytes 0..n-1.
TEST(SipHashTest, MatchesTheReferenceVectors) {
  const SipKey key{.k0 = 0x0706050403020100ull, .k1 = 0x0f0e0d0c0b0a0908ull};
  std::vector<uint8_t> message;
  for (uint8_t i = 0; i < 16; ++i) message.push_back(i);
  EXPECT_EQ(sipHash24(key, std::span(message).first(0)), 0x726fdb47dd0e0e31ull);
  EXPECT_EQ(sipHash24(key, std::span(message).first(1)), 0x74f839c593dc67fdull);
  EXPECT_EQ(sipHash24(key, std::span(message).first(8)), 0x93f5f5799a932462ull);
  EXPECT_EQ(sipHash24(key, std::span(message).first(15)), 0xa129ca6149be45e5ull);
  EXPECT_NE(sipHash24(SipKey{.k0 = 1}, std::span(message).first(15)), 0xa129ca6149be45e5ull);
  EXPECT_EQ(&processSipKey(), &processSipKey());
}

}  // namespace
}  // namespace cleave
