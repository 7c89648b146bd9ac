#include "common/siphash.h"

#include <random>

namespace cleave {
namespace {

constexpr uint64_t rotl(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

struct State {
  uint64_t v0, v1, v2, v3;
  void round() {
    v0 += v1;
    v1 = rotl(v1, 13);
    v1 ^= v0;
    v0 = rotl(v0, 32);
    v2 += v3;
    v3 = rotl(v3, 16);
    v3 ^= v2;
    v0 += v3;
    v3 = rotl(v3, 21);
    v3 ^= v0;
    v2 += v1;
    v1 = rotl(v1, 17);
    v1 ^= v2;
    v2 = rotl(v2, 32);
  }
  void absorb(uint64_t m) {
    v3 ^= m;
    round();
    round();
    v0 ^= m;
  }
};

uint64_t littleEndian(const uint8_t* p, size_t n) {
  uint64_t word = 0;
  for (size_t i = 0; i < n; ++i) word |= static_cast<uint64_t>(p[i]) << (8 * i);
  return word;
}

}  // namespace

uint64_t sipHash24(const SipKey& key, std::span<const uint8_t> bytes) {
  State s{.v0 = key.k0 ^ 0x736f6d6570736575ull,
          .v1 = key.k1 ^ 0x646f72616e646f6dull,
          .v2 = key.k0 ^ 0x6c7967656e657261ull,
          .v3 = key.k1 ^ 0x7465646279746573ull};
  const size_t whole = bytes.size() / 8 * 8;
  for (size_t at = 0; at < whole; at += 8) s.absorb(littleEndian(bytes.data() + at, 8));
  s.absorb(littleEndian(bytes.data() + whole, bytes.size() - whole) |
           (static_cast<uint64_t>(bytes.size() & 0xff) << 56));
  s.v2 ^= 0xff;
  for (int i = 0; i < 4; ++i) s.round();
  return s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
}

const SipKey& processSipKey() {
  static const SipKey key = [] {
    std::random_device source;
    auto draw = [&] { return (static_cast<uint64_t>(source()) << 32) ^ source(); };
    return SipKey{.k0 = draw(), .k1 = draw()};
  }();
  return key;
}

}  // namespace cleave
