#include "services/engine/kv_cache.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

namespace cleave::engine {
namespace {

TEST(KvCacheTest, AllocatesDistinctBlocksAndRefusesToOvercommit) {
  KvCache cache({.num_layers = 2, .kv_dim = 8, .block_size = 4, .num_blocks = 10});
  EXPECT_EQ(cache.blocksFor(0), 0);
  EXPECT_EQ(cache.blocksFor(4), 1);
  EXPECT_EQ(cache.blocksFor(5), 2);
  EXPECT_EQ(cache.bytes(), 2 * 2 * 10 * 4 * 8 * 4);
  auto a = cache.allocate(6);
  ASSERT_TRUE(a.ok());
  auto b = cache.allocate(5);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(cache.freeBlocks(), 4);  // A refused request takes nothing.
  auto c = cache.allocate(4);
  ASSERT_TRUE(c.ok());
  std::set<int32_t> all(a->begin(), a->end());
  all.insert(c->begin(), c->end());
  EXPECT_EQ(all.size(), 10u);
  EXPECT_EQ(cache.freeBlocks(), 0);
  cache.release(*a);
  EXPECT_EQ(cache.freeBlocks(), 6);
}

TEST(KvCacheTest, SharedBlocksAreFreedWithTheirLastReference) {
  KvCache cache({.num_layers = 1, .kv_dim = 4, .block_size = 16, .num_blocks = 3});
  auto blocks = cache.allocate(2);
  ASSERT_TRUE(blocks.ok());
  cache.retain(*blocks);
  cache.release(*blocks);
  EXPECT_EQ(cache.freeBlocks(), 1);
  cache.release(*blocks);
  EXPECT_EQ(cache.freeBlocks(), 3);
}

TEST(KvCacheDeathTest, ReleasingAFreeBlockIsABrokenInvariant) {
  KvCache cache({.num_layers = 1, .kv_dim = 4, .block_size = 16, .num_blocks = 2});
  std::vector<int32_t> never_allocated = {1};
  EXPECT_DEATH(cache.release(never_allocated), "release of unallocated block 1");
}

}  // namespace
}  // namespace cleave::engine

namespace cleave::engine {
namespace {

TEST(KvCachePrefixTest, PublishedBlocksAreFoundReusedAndEvictedOldestFirst) {
  KvCache cache({.num_layers = 1, .kv_dim = 4, .block_size = 2, .num_blocks = 3});
  const std::vector<uint32_t> a = {5, 6}, b = {7, 8};
  const uint64_t ha = KvCache::chainHash(0, a), hb = KvCache::chainHash(ha, b);
  EXPECT_NE(ha, KvCache::chainHash(1, a));  // The chain matters, not just the tokens.
  auto blocks = *cache.allocate(2);
  cache.publish(blocks[0], ha, a);
  cache.publish(blocks[1], hb, b);
  EXPECT_EQ(cache.lookup(ha, a), blocks[0]);
  EXPECT_EQ(cache.lookup(hb, b), blocks[1]);
  EXPECT_FALSE(cache.lookup(ha, b).has_value());  // Same hash, other tokens: no hit.
  cache.release(blocks);
  EXPECT_EQ(cache.freeBlocks(), 3);               // Cached blocks count as available...
  cache.retain(std::vector<int32_t>{blocks[1]});  // ...and come back into use on a hit.
  EXPECT_EQ(cache.freeBlocks(), 2);
  cache.release(std::vector<int32_t>{blocks[1]});
  // Taking all three evicts the cached ones, least recently released first.
  auto all = *cache.allocate(3);
  EXPECT_FALSE(cache.lookup(ha, a).has_value());
  EXPECT_FALSE(cache.lookup(hb, b).has_value());
  cache.release(all);
}

}  // namespace
}  // namespace cleave::engine
