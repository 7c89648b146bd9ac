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
