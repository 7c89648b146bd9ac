#include "services/engine/kv_block_pool.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

namespace cleave::engine {
namespace {

TEST(KvBlockPoolTest, AllocatesDistinctBlocksAndRefusesToOvercommit) {
  KvBlockPool pool({.block_size = 4, .num_blocks = 10});
  EXPECT_EQ(pool.blocksFor(0), 0);
  EXPECT_EQ(pool.blocksFor(4), 1);
  EXPECT_EQ(pool.blocksFor(5), 2);
  auto a = pool.allocate(6);
  ASSERT_TRUE(a.ok());
  auto b = pool.allocate(5);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool.freeBlocks(), 4);  // A refused request takes nothing.
  auto c = pool.allocate(4);
  ASSERT_TRUE(c.ok());
  std::set<int32_t> all(a->begin(), a->end());
  all.insert(c->begin(), c->end());
  EXPECT_EQ(all.size(), 10u);
  EXPECT_EQ(pool.freeBlocks(), 0);
  pool.release(*a);
  EXPECT_EQ(pool.freeBlocks(), 6);
}

TEST(KvBlockPoolTest, SharedBlocksAreFreedWithTheirLastReference) {
  KvBlockPool pool({.block_size = 16, .num_blocks = 3});
  auto blocks = pool.allocate(2);
  ASSERT_TRUE(blocks.ok());
  pool.retain(*blocks);
  pool.release(*blocks);
  EXPECT_EQ(pool.freeBlocks(), 1);
  pool.release(*blocks);
  EXPECT_EQ(pool.freeBlocks(), 3);
}

TEST(KvBlockPoolDeathTest, ReleasingAFreeBlockIsABrokenInvariant) {
  KvBlockPool pool({.block_size = 16, .num_blocks = 2});
  std::vector<int32_t> never_allocated = {1};
  EXPECT_DEATH(pool.release(never_allocated), "release of unallocated block 1");
}

}  // namespace
}  // namespace cleave::engine

namespace cleave::engine {
namespace {

TEST(KvBlockPoolPrefixTest, PublishedBlocksAreFoundReusedAndEvictedOldestFirst) {
  KvBlockPool pool({.block_size = 2, .num_blocks = 3});
  const std::vector<uint32_t> a = {5, 6}, b = {7, 8};
  const uint64_t ha = KvBlockPool::chainHash(0, a), hb = KvBlockPool::chainHash(ha, b);
  EXPECT_NE(ha, KvBlockPool::chainHash(1, a));  // The chain matters, not just the tokens.
  auto blocks = *pool.allocate(2);
  pool.publish(blocks[0], ha, a);
  pool.publish(blocks[1], hb, b);
  EXPECT_EQ(pool.lookup(ha, a), blocks[0]);
  EXPECT_EQ(pool.lookup(hb, b), blocks[1]);
  EXPECT_FALSE(pool.lookup(ha, b).has_value());  // Same hash, other tokens: no hit.
  pool.release(blocks);
  EXPECT_EQ(pool.freeBlocks(), 3);               // Cached blocks count as available...
  pool.retain(std::vector<int32_t>{blocks[1]});  // ...and come back into use on a hit.
  EXPECT_EQ(pool.freeBlocks(), 2);
  pool.release(std::vector<int32_t>{blocks[1]});
  // Taking all three evicts the poold ones, least recently released first.
  auto all = *pool.allocate(3);
  EXPECT_FALSE(pool.lookup(ha, a).has_value());
  EXPECT_FALSE(pool.lookup(hb, b).has_value());
  pool.release(all);
}

// A sequence's blocks go back last to first: its tail is evicted before its head, which
// later prompts share more often.
TEST(KvBlockPoolPrefixTest, AReleasedSequenceLosesItsTailFirst) {
  KvBlockPool pool({.block_size = 1, .num_blocks = 3});
  const std::vector<uint32_t> tokens = {3, 1, 4};
  std::vector<int32_t> blocks = *pool.allocate(3);
  std::vector<uint64_t> hashes;
  uint64_t chain = 0;
  for (size_t i = 0; i < 3; ++i) {
    chain = KvBlockPool::chainHash(chain, {&tokens[i], 1});
    hashes.push_back(chain);
    pool.publish(blocks[i], chain, {&tokens[i], 1});
  }
  pool.release(blocks);
  EXPECT_EQ(*pool.allocate(1), std::vector<int32_t>{blocks[2]});
  EXPECT_EQ(pool.lookup(hashes[0], {&tokens[0], 1}), blocks[0]);
  EXPECT_EQ(pool.lookup(hashes[1], {&tokens[1], 1}), blocks[1]);
  EXPECT_FALSE(pool.lookup(hashes[2], {&tokens[2], 1}).has_value());
}

}  // namespace
}  // namespace cleave::engine
