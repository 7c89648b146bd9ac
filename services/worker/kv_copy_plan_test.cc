#include "services/worker/kv_copy_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>

namespace cleave::worker {
namespace {

// Every (layer, K/V, block, head, position, dim) value a prefill group of `from` ranks
// holds for the prompt blocks arrives at the same coordinates in a decode group of `to`
// ranks, whatever the two TP degrees, and nothing else in the decode pools changes.
void checkCopy(int from, int to) {
  SCOPED_TRACE(testing::Message() << "TP " << from << " -> TP " << to);
  const int64_t layers = 3, heads = 3, dim = 8, bs = 4;
  const std::vector<int32_t> local_blocks = {5, 1, 3};
  const std::vector<uint32_t> remote_blocks = {0, 6, 2};
  std::mt19937 rng(from * 10 + to);
  std::vector<std::unique_ptr<engine::KvStorage>> src, dst;
  std::vector<engine::Span> src_heads, dst_heads;
  for (int r = 0; r < from; ++r) {
    src_heads.push_back(*engine::splitEvenly(heads, 1, from, r, "KV heads"));
    src.push_back(
        std::make_unique<engine::KvStorage>(engine::KvStorageOptions{.num_layers = layers,
                                                                     .kv_heads = src_heads[r].size,
                                                                     .head_dim = dim,
                                                                     .block_size = bs,
                                                                     .num_blocks = 7}));
    float* f = reinterpret_cast<float*>(src[r]->data());
    for (int64_t i = 0; i < src[r]->bytes() / 4; ++i) f[i] = static_cast<float>(rng() % 100000);
  }
  for (int s = 0; s < to; ++s) {
    dst_heads.push_back(*engine::splitEvenly(heads, 1, to, s, "KV heads"));
    dst.push_back(
        std::make_unique<engine::KvStorage>(engine::KvStorageOptions{.num_layers = layers,
                                                                     .kv_heads = dst_heads[s].size,
                                                                     .head_dim = dim,
                                                                     .block_size = bs,
                                                                     .num_blocks = 9}));
    std::memset(dst[s]->data(), 0xFF, dst[s]->bytes());  // Poisoned (NaN).
  }
  for (int r = 0; r < from; ++r) {
    for (int s = 0; s < to; ++s) {
      RemoteRankLayout remote{
          .head_begin = dst_heads[s].begin, .heads = dst_heads[s].size, .num_blocks = 9};
      for (const transfer::Write& w :
           kvWrites(*src[r], src_heads[r], remote, local_blocks, remote_blocks)) {
        ASSERT_LE(w.remote_offset + w.bytes, static_cast<uint64_t>(dst[s]->bytes()));
        std::memcpy(dst[s]->data() + w.remote_offset, w.local, w.bytes);
      }
    }
  }
  auto value = [&](std::vector<std::unique_ptr<engine::KvStorage>>& pools,
                   std::vector<engine::Span>& spans, int64_t layer, int kv, int64_t block,
                   int64_t head, int64_t slot, int64_t d) {
    for (size_t r = 0; r < pools.size(); ++r) {
      if (head >= spans[r].begin && head < spans[r].begin + spans[r].size) {
        const uint8_t* at =
            pools[r]->data() + pools[r]->offset(layer, kv, block, head - spans[r].begin);
        float v;
        std::memcpy(&v, at + (slot * dim + d) * 4, 4);
        return v;
      }
    }
    return -1.0f;
  };
  int64_t checked = 0, untouched_nan = 0;
  for (int64_t layer = 0; layer < layers; ++layer)
    for (int kv = 0; kv < 2; ++kv)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t slot = 0; slot < bs; ++slot)
          for (int64_t d = 0; d < dim; ++d) {
            for (size_t i = 0; i < local_blocks.size(); ++i) {
              ASSERT_EQ(value(dst, dst_heads, layer, kv, remote_blocks[i], h, slot, d),
                        value(src, src_heads, layer, kv, local_blocks[i], h, slot, d));
              ++checked;
            }
            untouched_nan += std::isnan(value(dst, dst_heads, layer, kv, 4, h, slot, d));
          }
  EXPECT_EQ(checked, layers * 2 * heads * bs * dim * 3);
  EXPECT_EQ(untouched_nan, layers * 2 * heads * bs * dim);  // Block 4 was not a target.
}

TEST(KvCopyPlanTest, EveryTpPairingMovesExactlyThePromptBlocks) {
  for (int from : {1, 2, 3})
    for (int to : {1, 2, 3}) checkCopy(from, to);
}

// A latent cache (one part, one head every rank holds whole): each decode rank receives
// every prompt block's rows exactly once, from one prefill rank, whatever the TP degrees.
TEST(KvCopyPlanTest, ALatentCacheReachesEveryRankOnce) {
  const int64_t layers = 2, dim = 24, bs = 4;
  const std::vector<int32_t> local_blocks = {2, 0};
  const std::vector<uint32_t> remote_blocks = {3, 1};
  const engine::KvStorageOptions options{
      .num_layers = layers, .kv_heads = 1, .head_dim = dim, .block_size = bs, .parts = 1};
  for (int from : {1, 2, 3}) {
    for (int to : {1, 2, 3}) {
      SCOPED_TRACE(testing::Message() << "TP " << from << " -> TP " << to);
      std::mt19937 rng(from * 10 + to);
      auto source = options;
      source.num_blocks = 3;
      std::vector<std::unique_ptr<engine::KvStorage>> src;
      for (int r = 0; r < from; ++r) {
        src.push_back(std::make_unique<engine::KvStorage>(source));
        EXPECT_EQ(src[r]->bytes(), layers * 3 * bs * dim * 4);  // No separate values.
        EXPECT_EQ(src[r]->values(1), src[r]->keys(1));
      }
      float* f = reinterpret_cast<float*>(src[0]->data());
      for (int64_t i = 0; i < src[0]->bytes() / 4; ++i) f[i] = static_cast<float>(rng() % 1000);
      for (int r = 1; r < from; ++r) std::memcpy(src[r]->data(), f, src[0]->bytes());
      for (int s = 0; s < to; ++s) {
        auto target = options;
        target.num_blocks = 5;
        engine::KvStorage dst(target);
        std::memset(dst.data(), 0xFF, dst.bytes());
        uint64_t bytes = 0;
        for (int r = 0; r < from; ++r) {
          if (!sendsToRank(true, r, from, s)) continue;
          for (const transfer::Write& w :
               kvWrites(*src[r], {0, 1}, {.head_begin = 0, .heads = 1, .num_blocks = 5},
                        local_blocks, remote_blocks)) {
            ASSERT_LE(w.remote_offset + w.bytes, static_cast<uint64_t>(dst.bytes()));
            std::memcpy(dst.data() + w.remote_offset, w.local, w.bytes);
            bytes += w.bytes;
          }
        }
        EXPECT_EQ(bytes, static_cast<uint64_t>(layers * 2 * bs * dim * 4));
        for (int64_t layer = 0; layer < layers; ++layer) {
          for (size_t i = 0; i < local_blocks.size(); ++i) {
            EXPECT_EQ(std::memcmp(dst.data() + dst.offset(layer, 0, remote_blocks[i], 0),
                                  src[0]->data() + src[0]->offset(layer, 0, local_blocks[i], 0),
                                  dst.headBlockBytes()),
                      0);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace cleave::worker

namespace cleave::worker {
namespace {

// A sequence's linear-attention state ([layer][key head][group]) held by a prefill group of
// `from` ranks arrives whole in slot 2 of a decode group of `to` ranks (3 key heads, split
// unevenly), each value at its (layer, head, element), and no other slot changes.
TEST(StateCopyPlanTest, EveryTpPairingMovesTheSlotWhole) {
  const int64_t layers = 2, heads = 3, group = 5, slots = 3, slot = 2;
  auto value = [](int64_t layer, int64_t head, int64_t i) {
    return static_cast<float>(1000 * layer + 100 * head + i);
  };
  for (int from = 1; from <= 3; ++from) {
    for (int to = 1; to <= 3; ++to) {
      SCOPED_TRACE(testing::Message() << "TP " << from << " -> TP " << to);
      std::vector<std::vector<float>> dst(to);
      std::vector<engine::Span> dst_heads;
      for (int s = 0; s < to; ++s) {
        dst_heads.push_back(*engine::splitEvenly(heads, 1, to, s, "key heads"));
        dst[s].assign(slots * layers * dst_heads[s].size * group, -1.0f);
      }
      for (int r = 0; r < from; ++r) {
        const engine::Span mine = *engine::splitEvenly(heads, 1, from, r, "key heads");
        std::vector<float> src;
        for (int64_t l = 0; l < layers; ++l)
          for (int64_t h = mine.begin; h < mine.begin + mine.size; ++h)
            for (int64_t i = 0; i < group; ++i) src.push_back(value(l, h, i));
        for (int s = 0; s < to; ++s) {
          const RemoteStateLayout remote{
              .key_head_begin = dst_heads[s].begin, .key_heads = dst_heads[s].size, .slots = slots};
          for (const transfer::Write& w :
               stateWrites(src.data(), mine, remote, slot, layers, group * 4)) {
            ASSERT_LE(w.remote_offset + w.bytes, dst[s].size() * 4);
            std::memcpy(reinterpret_cast<uint8_t*>(dst[s].data()) + w.remote_offset, w.local,
                        w.bytes);
          }
        }
      }
      for (int s = 0; s < to; ++s) {
        const engine::Span& held = dst_heads[s];
        for (int64_t at = 0; at < static_cast<int64_t>(dst[s].size()); ++at) {
          const int64_t per_slot = layers * held.size * group;
          const int64_t in_slot = at % per_slot;
          const int64_t l = in_slot / (held.size * group);
          const int64_t h = held.begin + in_slot / group % held.size;
          const float want = at / per_slot == slot ? value(l, h, in_slot % group) : -1.0f;
          ASSERT_EQ(dst[s][at], want) << "rank " << s << " float " << at;
        }
      }
    }
  }
}

}  // namespace
}  // namespace cleave::worker

namespace cleave::worker {
namespace {

// A destination of two decode ranks holding key heads [0, 2) and [2, 3) of a model whose two
// linear layers have 3 key heads of 20 bytes, each rank with 4 slots, slot 3 asked for.
v1::KvDestination stateDestination() {
  v1::KvDestination d;
  d.set_state_slot(3);
  for (const auto& [begin, end] : {std::pair{0u, 2u}, std::pair{2u, 3u}}) {
    v1::RankEndpoint* r = d.add_ranks();
    r->set_rank(d.ranks_size() - 1);
    r->set_linear_key_head_begin(begin);
    r->set_linear_key_head_end(end);
    r->set_state_bytes(4 * 2 * (end - begin) * 20);
  }
  return d;
}

TEST(StateCopyPlanTest, APeersSlotsAreCheckedBeforeAnyByteMoves) {
  auto good = remoteStateLayouts(stateDestination(), 3, 2, 20);
  ASSERT_TRUE(good.ok()) << good.status();
  ASSERT_EQ(good->size(), 2u);
  EXPECT_EQ((*good)[0].key_head_begin, 0);
  EXPECT_EQ((*good)[0].key_heads, 2);
  EXPECT_EQ((*good)[0].slots, 4);
  EXPECT_EQ((*good)[1].key_head_begin, 2);
  EXPECT_EQ((*good)[1].key_heads, 1);
  EXPECT_EQ((*good)[1].slots, 4);

  struct Bad {
    const char* what;
    std::function<void(v1::KvDestination&)> spoil;
    const char* message;
  };
  const std::vector<Bad> bad = {
      {"no slot", [](v1::KvDestination& d) { d.clear_state_slot(); }, "state_slot is required"},
      {"slot past a rank's slots", [](v1::KvDestination& d) { d.set_state_slot(4); }, "no slot 4"},
      {"too few state bytes",
       [](v1::KvDestination& d) { d.mutable_ranks(1)->set_state_bytes(3 * 2 * 20 + 39); },
       "destination rank 1"},
      {"no key heads",
       [](v1::KvDestination& d) { d.mutable_ranks(1)->set_linear_key_head_begin(3); },
       "key heads [3, 3) of 3"},
      {"heads backwards",
       [](v1::KvDestination& d) { d.mutable_ranks(0)->set_linear_key_head_begin(2); },
       "key heads [2, 2)"},
      {"heads past the model's",
       [](v1::KvDestination& d) { d.mutable_ranks(1)->set_linear_key_head_end(4000000000u); },
       "of 3"},
      {"a head nobody holds",
       [](v1::KvDestination& d) {
         d.mutable_ranks(0)->set_linear_key_head_end(1);
         d.mutable_ranks(0)->set_state_bytes(4 * 2 * 20);
       },
       "none holds key head 1"},
      {"no ranks", [](v1::KvDestination& d) { d.clear_ranks(); }, "key head 0"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.what);
    v1::KvDestination d = stateDestination();
    b.spoil(d);
    auto refused = remoteStateLayouts(d, 3, 2, 20);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
    EXPECT_THAT(refused.status().message(), testing::HasSubstr(b.message));
  }
}

}  // namespace
}  // namespace cleave::worker
