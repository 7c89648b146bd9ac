#include "services/router/worker_pool.h"

#include "absl/strings/str_cat.h"
#include "common/retry_hint.h"
#include "services/engine/kv_block_pool.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <deque>
#include <mutex>
#include <thread>

namespace cleave::router {
namespace {

using ::testing::HasSubstr;

v1::RegisterRequest worker(const std::string& id, v1::WorkerRole role, uint32_t blocks,
                           uint32_t target, const std::string& sha = std::string(64, 'a')) {
  v1::RegisterRequest r;
  r.set_worker_id(id);
  r.set_role(role);
  r.set_tp_size(1);
  r.add_ranks();
  r.mutable_model()->set_model_id("m");
  r.mutable_model()->set_sha256(sha);
  r.mutable_model()->set_vocab_size(100);
  r.mutable_model()->set_context_length(4096);
  v1::KvLayout* kv = r.mutable_kv_layout();
  kv->set_dtype(v1::KV_DTYPE_F32);
  kv->set_block_size(16);
  kv->set_num_layers(2);
  kv->set_num_kv_heads(2);
  kv->set_head_dim(8);
  r.mutable_kv_capacity()->set_total_blocks(blocks);
  r.mutable_kv_capacity()->set_prefix_caching(true);
  if (role != v1::WORKER_ROLE_PREFILL) r.mutable_kv_capacity()->set_target_concurrency(target);
  r.set_control_address("worker-" + id + ".invalid:1");  // Never called here.
  return r;
}

// A prompt of `n` tokens, counting up from `first`.
std::vector<uint32_t> prompt(int n, uint32_t first = 1) {
  std::vector<uint32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = first + i;
  return p;
}

// The prefill worker for `p` (blocks of 16 tokens, as the test workers' layout says).
absl::StatusOr<PrefillLease> pickFor(WorkerPool& pool, const Worker& decode,
                                     const std::vector<uint32_t>& p) {
  return pool.pickPrefill(decode, static_cast<int64_t>(p.size()), PrefixIndex::blockHashes(p, 16));
}

class WorkerPoolTest : public ::testing::Test {
 protected:
  WorkerPool pool_{{.queue_capacity = 2, .restart_patience = std::chrono::milliseconds(50)},
                   [](auto) {},
                   [](const std::string&) {}};
  std::chrono::system_clock::time_point soon(int ms = 2000) {
    return std::chrono::system_clock::now() + std::chrono::milliseconds(ms);
  }
  static bool never() { return false; }
};

// A request at the head of the queue that no worker left can ever hold (the only one large
// enough left while it waited) gives up after the restart patience; the one behind it, which
// fits elsewhere, is admitted instead of waiting out its deadline.
TEST_F(WorkerPoolTest, AHeadNoWorkerCanHoldAnyMoreLetsTheRestGo) {
  ASSERT_TRUE(pool_.add(worker("big", v1::WORKER_ROLE_BOTH, 100, 1)).ok());
  ASSERT_TRUE(pool_.add(worker("small", v1::WORKER_ROLE_BOTH, 10, 4)).ok());
  auto held = pool_.admit(50, soon(), never);  // Only "big" holds it.
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(held->worker->id, "big");
  std::optional<absl::StatusOr<Admission>> head, behind;
  auto queued = [&](int64_t n) {
    for (int i = 0; i < 5000 && pool_.queueDepth() < n; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return pool_.queueDepth() >= n;
  };
  // 60 blocks: only "big" could ever hold them, once "held" is gone.
  std::thread head_thread([&] { head = pool_.admit(60, soon(10000), never); });
  const bool head_waits = queued(1);
  std::thread behind_thread([&] { behind = pool_.admit(2, soon(10000), never); });
  const bool behind_waits = queued(2);
  pool_.remove("big", "test");
  head_thread.join();
  behind_thread.join();
  EXPECT_TRUE(head_waits && behind_waits);
  EXPECT_EQ(head->status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(head->status().message(), HasSubstr("60 KV blocks"));
  ASSERT_TRUE(behind->ok()) << behind->status();
  EXPECT_EQ((*behind)->worker->id, "small");
  pool_.release(**behind);
  pool_.release(*held);
}

TEST_F(WorkerPoolTest, RefusesIncompleteAndIncompatibleWorkers) {
  v1::RegisterRequest bad = worker("a", v1::WORKER_ROLE_BOTH, 10, 2);
  bad.clear_kv_layout();
  EXPECT_THAT(pool_.add(bad).status().message(), HasSubstr("kv_layout"));
  ASSERT_TRUE(pool_.add(worker("a", v1::WORKER_ROLE_BOTH, 10, 2)).ok());
  auto other = pool_.add(worker("b", v1::WORKER_ROLE_DECODE, 10, 2, std::string(64, 'b')));
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(other.status().message(), HasSubstr("fingerprint"));
  v1::RegisterRequest layout = worker("c", v1::WORKER_ROLE_DECODE, 10, 2);
  layout.mutable_kv_layout()->set_block_size(32);
  EXPECT_EQ(pool_.add(layout).status().code(), absl::StatusCode::kFailedPrecondition);
  v1::RegisterRequest shorter = worker("d", v1::WORKER_ROLE_DECODE, 10, 2);
  shorter.mutable_model()->set_context_length(1024);  // Started with --max-model-len 1024.
  EXPECT_THAT(pool_.add(shorter).status().message(), HasSubstr("--max-model-len"));
  EXPECT_EQ(pool_.summaries().size(), 1u);
}

TEST_F(WorkerPoolTest, ANewProcessAtAWorkersAddressReplacesIt) {
  std::vector<std::string> left;
  WorkerPool pool(
      {}, [](auto) {}, [&](const std::string& id) { left.push_back(id); });
  v1::RegisterRequest first = worker("w~1111", v1::WORKER_ROLE_DECODE, 10, 2);
  v1::RegisterRequest again = worker("w~2222", v1::WORKER_ROLE_DECODE, 10, 2);
  again.set_control_address(first.control_address());
  ASSERT_TRUE(pool.add(first).ok());
  ASSERT_TRUE(pool.add(worker("other", v1::WORKER_ROLE_DECODE, 10, 2)).ok());
  ASSERT_TRUE(pool.add(again).ok());
  EXPECT_EQ(left, std::vector<std::string>{"w~1111"});  // Its requests move at once.
  std::vector<std::string> ids;
  for (const v1::WorkerSummary& s : pool.summaries()) ids.push_back(s.worker_id());
  EXPECT_THAT(ids, ::testing::UnorderedElementsAre("w~2222", "other"));
}

TEST_F(WorkerPoolTest, AdmissionHoldsBlocksAndSlotsUntilReleased) {
  EXPECT_EQ(pool_.admit(1, soon(), never).status().code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(pool_.add(worker("a", v1::WORKER_ROLE_BOTH, 10, 1)).ok());
  // Larger than any worker: refused at once, never queued.
  EXPECT_EQ(pool_.admit(11, soon(), never).status().code(), absl::StatusCode::kInvalidArgument);
  auto first = pool_.admit(6, soon(), never);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(pool_.reservedBlocks(), 6);
  // 4 blocks left: a request for 5 waits until its deadline.
  EXPECT_EQ(pool_.admit(5, soon(50), never).status().code(), absl::StatusCode::kDeadlineExceeded);
  // One request ahead (target 1 + 1 prefilled ahead): a second small one fits, a third
  // waits; released blocks let it in.
  auto second = pool_.admit(2, soon(), never);
  ASSERT_TRUE(second.ok());
  std::atomic<bool> admitted{false};
  std::thread waiter([&] {
    auto third = pool_.admit(2, soon(), never);
    EXPECT_TRUE(third.ok());
    admitted = true;
    pool_.release(*third);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(admitted);
  EXPECT_EQ(pool_.queueDepth(), 1);
  pool_.release(*first);
  waiter.join();
  EXPECT_TRUE(admitted);
  pool_.release(*second);
  EXPECT_EQ(pool_.reservedBlocks(), 0);
  EXPECT_EQ(pool_.queueDepth(), 0);
}

// Blocks a Release fenced stay counted against their worker until the fence ends; blocks
// the worker holds for others (its heartbeat says how many: another router's, or fenced on
// its own) are out of admission while it says so.
TEST_F(WorkerPoolTest, FencedBlocksStayCountedUntilTheirFenceEnds) {
  ASSERT_TRUE(pool_.add(worker("a", v1::WORKER_ROLE_BOTH, 10, 2)).ok());
  auto first = pool_.admit(6, soon(), never);
  ASSERT_TRUE(first.ok());
  pool_.release(*first, std::nullopt, 6, std::chrono::milliseconds(600));
  EXPECT_EQ(pool_.reservedBlocks(), 0);
  // 4 blocks left until the fence ends: a request for 5 waits for it.
  const auto asked = std::chrono::steady_clock::now();
  auto second = pool_.admit(5, soon(10000), never);
  ASSERT_TRUE(second.ok());
  EXPECT_GE(std::chrono::steady_clock::now() - asked, std::chrono::milliseconds(500));
  EXPECT_EQ(pool_.reservedBlocks(), 5);
  pool_.release(*second);
  EXPECT_EQ(pool_.reservedBlocks(), 0);

  v1::HeartbeatRequest beat;
  beat.set_worker_id("a");
  beat.mutable_load()->set_kv_blocks_foreign(7);
  ASSERT_TRUE(pool_.heartbeat(beat));
  EXPECT_EQ(pool_.admit(4, soon(100), never).status().code(), absl::StatusCode::kDeadlineExceeded);
  std::thread unfence([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    beat.mutable_load()->set_kv_blocks_foreign(0);
    EXPECT_TRUE(pool_.heartbeat(beat));
  });
  auto third = pool_.admit(4, soon(10000), never);
  unfence.join();
  ASSERT_TRUE(third.ok());
  pool_.release(*third);
}

// Requests whose prompts share a cached prefix on a decode worker count its blocks once:
// the worker holds one copy of each, however many sequences use it.
TEST_F(WorkerPoolTest, ASharedCachedPrefixCountsOnceOnItsDecodeWorker) {
  ASSERT_TRUE(pool_.add(worker("a", v1::WORKER_ROLE_DECODE, 20, 8)).ok());
  // 97 tokens: 6 whole blocks before the last token, 8 blocks with 31 new tokens.
  const std::vector<uint64_t> prefix = PrefixIndex::blockHashes(prompt(97), 16);
  ASSERT_EQ(prefix.size(), 6u);
  // The first computes the prefix: its Reserve found nothing cached, every block its own.
  auto first = pool_.admit(8, soon(), never, {}, "", 31, prefix);
  ASSERT_TRUE(first.ok());
  pool_.settle(*first, 0, prefix);
  EXPECT_EQ(pool_.reservedBlocks(), 8);
  // The second's Reserve found the prefix cached: 6 blocks shared (counted once from now
  // on), 2 its own.
  auto second = pool_.admit(8, soon(), never, {}, "", 31, prefix);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(pool_.reservedBlocks(), 16);
  pool_.settle(*second, 6, prefix);
  EXPECT_EQ(second->shared.size(), 6u);
  EXPECT_EQ(second->own, 2);
  EXPECT_EQ(pool_.reservedBlocks(), 16);
  // Two more of the same prefix need 2 blocks each where 4 are left; without the sharing
  // they would wait for 8.
  auto third = pool_.admit(8, soon(), never, {}, "", 31, prefix);
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(third->own, 2);
  EXPECT_EQ(pool_.reservedBlocks(), 18);
  pool_.settle(*third, 6, prefix);
  auto fourth = pool_.admit(8, soon(), never, {}, "", 31, prefix);
  ASSERT_TRUE(fourth.ok());
  EXPECT_EQ(pool_.reservedBlocks(), 20);
  // Full: the same prefix waits, as does another prompt (another adapter's chain is another).
  EXPECT_EQ(pool_.admit(8, soon(50), never, {}, "", 31, prefix).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(pool_.admit(1, soon(50), never, {}, "", 1, PrefixIndex::blockHashes(prompt(97), 16, 7))
                .status()
                .code(),
            absl::StatusCode::kDeadlineExceeded);
  // The fourth's Reserve found only 2 of the 6 cached (the rest let go meanwhile): it owns 6.
  pool_.settle(*fourth, 2, prefix);
  EXPECT_EQ(fourth->own, 6);
  EXPECT_EQ(pool_.reservedBlocks(), 24);
  // The shared blocks count while any request shares them.
  pool_.release(*second);
  pool_.release(*third);
  EXPECT_EQ(pool_.reservedBlocks(), 8 + 6 + 2);  // The first's, the fourth's own and shared.
  pool_.release(*fourth);
  EXPECT_EQ(pool_.reservedBlocks(), 8);
  EXPECT_EQ(pool_.summaries()[0].kv_blocks_reserved(), 8u);
  // A request that shares nothing (a scored prompt is computed whole) owns every block.
  auto scored = pool_.admit(8, soon(), never);
  ASSERT_TRUE(scored.ok());
  EXPECT_TRUE(scored->shared.empty());
  EXPECT_EQ(scored->own, 8);
  pool_.release(*scored);
  pool_.release(*first);
  EXPECT_EQ(pool_.reservedBlocks(), 0);
}

TEST_F(WorkerPoolTest, AFullQueueAndCancellationAreReported) {
  ASSERT_TRUE(pool_.add(worker("a", v1::WORKER_ROLE_BOTH, 4, 1)).ok());
  auto held = pool_.admit(4, soon(), never);
  ASSERT_TRUE(held.ok());
  std::atomic<bool> stop{false};
  std::vector<std::thread> waiters;
  for (int i = 0; i < 2; ++i) {
    waiters.emplace_back([&] {
      EXPECT_EQ(pool_.admit(1, soon(5000), [&] { return stop.load(); }).status().code(),
                absl::StatusCode::kCancelled);
    });
  }
  while (pool_.queueDepth() < 2) std::this_thread::yield();
  const absl::Status full = pool_.admit(1, soon(), never).status();
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(retryAfter(full), std::chrono::milliseconds(1000));  // No pace known yet.
  // A router with no queue at all still admits what fits at once.
  WorkerPool unqueued(
      {.queue_capacity = 0}, [](auto) {}, [](const std::string&) {});
  ASSERT_TRUE(unqueued.add(worker("b", v1::WORKER_ROLE_BOTH, 4, 1)).ok());
  auto direct = unqueued.admit(2, soon(), never);
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_EQ(unqueued.admit(3, soon(), never).status().code(), absl::StatusCode::kResourceExhausted);
  unqueued.release(*direct);
  stop = true;
  for (auto& t : waiters) t.join();
  pool_.release(*held);
  EXPECT_EQ(pool_.reservedBlocks(), 0);
}

TEST_F(WorkerPoolTest, PrefillGoesToTheLeastLoadedPrefillWorker) {
  ASSERT_TRUE(pool_.add(worker("d", v1::WORKER_ROLE_DECODE, 10, 4)).ok());
  auto none = pickFor(pool_, *pool_.admit(1, soon(), never)->worker, prompt(10));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(pool_.add(worker("p1", v1::WORKER_ROLE_PREFILL, 0, 0)).ok());
  ASSERT_TRUE(pool_.add(worker("p2", v1::WORKER_ROLE_PREFILL, 0, 0)).ok());
  auto admission = pool_.admit(1, soon(), never);
  auto a = pickFor(pool_, *admission->worker, prompt(100));
  auto b = pickFor(pool_, *admission->worker, prompt(10, 1000));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->worker->id, b->worker->id);
  auto c = pickFor(pool_, *admission->worker, prompt(10, 2000));
  EXPECT_EQ(c->worker->id, b->worker->id);  // 20 outstanding there, 100 on the other.
  pool_.releasePrefill(*a);
  pool_.releasePrefill(*b);
  pool_.releasePrefill(*c);
}

// A prompt goes where it would be done first: to the worker that computed its prefix
// (only the rest counted as its work), unless the other would finish the whole prompt
// sooner. A worker registering again starts with nothing cached.
TEST_F(WorkerPoolTest, PrefillFollowsTheCachedPrefixUnlessAnotherWorkerIsDoneSooner) {
  ASSERT_TRUE(pool_.add(worker("d", v1::WORKER_ROLE_DECODE, 100, 4)).ok());
  ASSERT_TRUE(pool_.add(worker("p1", v1::WORKER_ROLE_PREFILL, 64, 0)).ok());
  ASSERT_TRUE(pool_.add(worker("p2", v1::WORKER_ROLE_PREFILL, 64, 0)).ok());
  auto admission = pool_.admit(1, soon(), never);
  ASSERT_TRUE(admission.ok());
  const Worker& decode = *admission->worker;
  const std::vector<uint32_t> shared = prompt(100);  // 6 blocks of 16 a cache may supply
  auto extended = [&](int more, uint32_t from) {
    std::vector<uint32_t> p = shared;
    for (int i = 0; i < more; ++i) p.push_back(from + static_cast<uint32_t>(i));
    return p;
  };
  auto first = pickFor(pool_, decode, shared);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->tokens, 100);
  const std::string home = first->worker->id, other = home == "p1" ? "p2" : "p1";
  // Until it is computed, the prefix counts nowhere: a concurrent copy goes to the other.
  auto concurrent = pickFor(pool_, decode, shared);
  EXPECT_EQ(concurrent->worker->id, other);
  EXPECT_EQ(concurrent->tokens, 100);
  pool_.releasePrefill(*concurrent);  // Failed: the other holds nothing.
  pool_.releasePrefill(*first, true);

  auto again = pickFor(pool_, decode, extended(40, 500));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->worker->id, home);
  EXPECT_EQ(again->tokens, 140 - 96);
  // Busy with it, `home` would finish another copy after 44 + 4 tokens, the other after 100.
  auto third = pickFor(pool_, decode, shared);
  EXPECT_EQ(third->worker->id, home);
  EXPECT_EQ(third->tokens, 4);
  // 48 + 304 there, 400 on the other: still `home`.
  auto big = pickFor(pool_, decode, extended(300, 1000));
  EXPECT_EQ(big->worker->id, home);
  EXPECT_EQ(big->tokens, 304);
  // Now 352 + 4 there, 100 on the other: the other computes it all.
  auto fourth = pickFor(pool_, decode, shared);
  EXPECT_EQ(fourth->worker->id, other);
  EXPECT_EQ(fourth->tokens, 100);
  for (const auto& lease : {*again, *third, *big, *fourth}) pool_.releasePrefill(lease, true);

  ASSERT_TRUE(pool_.add(worker(home, v1::WORKER_ROLE_PREFILL, 64, 0)).ok());
  auto fifth = pickFor(pool_, decode, shared);
  EXPECT_EQ(fifth->worker->id, other);
  EXPECT_EQ(fifth->tokens, 4);
  pool_.releasePrefill(*fifth, true);
  pool_.release(*admission);
}

// Workers that prefill for themselves (role both, no prefill worker): of those with room in
// their decode batch, the one that computed the prompt's prefix is chosen, however loaded;
// with no room there, load decides.
TEST_F(WorkerPoolTest, BothWorkersTakeThePromptsWhosePrefixTheyHoldWhileTheirBatchHasRoom) {
  ASSERT_TRUE(pool_.add(worker("b1", v1::WORKER_ROLE_BOTH, 100, 2)).ok());
  ASSERT_TRUE(pool_.add(worker("b2", v1::WORKER_ROLE_BOTH, 100, 2)).ok());
  const std::vector<uint32_t> shared = prompt(100);
  const std::vector<uint64_t> prefix = PrefixIndex::blockHashes(shared, 16);
  auto admit = [&] { return pool_.admit(8, soon(), never, {}, "", 1, prefix); };
  auto first = admit();
  ASSERT_TRUE(first.ok());
  const std::string home = first->worker->id, other = home == "b1" ? "b2" : "b1";
  auto lease = pickFor(pool_, *first->worker, shared);  // It prefills for itself.
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->worker->id, home);
  pool_.releasePrefill(*lease, true);
  auto second = admit();  // 1 of 2 there, none on the other: the cache wins.
  EXPECT_EQ(second->worker->id, home);
  auto again = pickFor(pool_, *second->worker, shared);
  EXPECT_EQ(again->tokens, 4);
  pool_.releasePrefill(*again, true);
  auto third = admit();  // Its batch is full: the other.
  EXPECT_EQ(third->worker->id, other);
  auto plain = pool_.admit(8, soon(), never);  // No prefix: the least loaded.
  EXPECT_EQ(plain->worker->id, other);
  pool_.release(*plain);
  for (const auto& a : {*first, *second, *third}) pool_.release(a);
  EXPECT_EQ(pool_.reservedBlocks(), 0);
}

// Decode workers fed by a prefill worker: the one a prompt's KV went to caches its blocks, so
// a prompt sharing them goes there while its batch has room (fewer blocks sent, the cached
// ones shared). A failed prefill leaves no guess; neither does --no-prefix-caching there.
TEST_F(WorkerPoolTest, DecodeWorkersTakeThePromptsWhosePrefixWasSentThere) {
  ASSERT_TRUE(pool_.add(worker("d1", v1::WORKER_ROLE_DECODE, 100, 2)).ok());
  ASSERT_TRUE(pool_.add(worker("d2", v1::WORKER_ROLE_DECODE, 100, 2)).ok());
  ASSERT_TRUE(pool_.add(worker("p", v1::WORKER_ROLE_PREFILL, 100, 0)).ok());
  const std::vector<uint32_t> shared = prompt(100);
  const std::vector<uint64_t> prefix = PrefixIndex::blockHashes(shared, 16);
  auto admit = [&] { return pool_.admit(8, soon(), never, {}, "", 1, prefix); };
  auto first = admit();
  ASSERT_TRUE(first.ok());
  const std::string home = first->worker->id, other = home == "d1" ? "d2" : "d1";
  auto failed = pickFor(pool_, *first->worker, shared);
  ASSERT_TRUE(failed.ok());
  EXPECT_EQ(failed->worker->id, "p");
  pool_.releasePrefill(*failed, false);
  auto unsent = admit();  // Nothing reached `home`: the less loaded one.
  EXPECT_EQ(unsent->worker->id, other);
  pool_.release(*unsent);
  auto sent = pickFor(pool_, *first->worker, shared);
  pool_.releasePrefill(*sent, true);
  auto second = admit();  // 1 of 2 there, none on the other: the cache wins.
  EXPECT_EQ(second->worker->id, home);
  auto third = admit();  // Its batch is full: the other.
  EXPECT_EQ(third->worker->id, other);
  for (const auto& a : {*first, *second, *third}) pool_.release(a);
  EXPECT_EQ(pool_.reservedBlocks(), 0);

  // A decode worker without a prefix cache is never credited with one.
  v1::RegisterRequest plain = worker("d3", v1::WORKER_ROLE_DECODE, 100, 2);
  plain.mutable_kv_capacity()->set_prefix_caching(false);
  WorkerPool pool(
      {}, [](auto) {}, [](const std::string&) {});
  ASSERT_TRUE(pool.add(plain).ok());
  ASSERT_TRUE(pool.add(worker("d4", v1::WORKER_ROLE_DECODE, 100, 2)).ok());
  ASSERT_TRUE(pool.add(worker("p", v1::WORKER_ROLE_PREFILL, 100, 0)).ok());
  auto a = pool.admit(8, soon(), never, {"d4"}, "", 1, prefix);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->worker->id, "d3");
  auto lease = pickFor(pool, *a->worker, shared);
  pool.releasePrefill(*lease, true);
  auto b = pool.admit(8, soon(), never, {}, "", 1, prefix);  // d3 holds nothing: load decides.
  EXPECT_EQ(b->worker->id, "d4");
  for (const auto& x : {*a, *b}) pool.release(x);
}

// --local-prefill-tokens: a decode worker (role decode or both) computes a prompt itself
// when little of it is missing from its cache (the blocks sent there, and those of the
// sequences it decoded, prompt and reply); otherwise, and with it 0, the prefill worker does.
TEST(WorkerPoolLocalPrefillTest, ADecodeWorkerComputesAShortRestItself) {
  for (const auto role : {v1::WORKER_ROLE_BOTH, v1::WORKER_ROLE_DECODE})
    for (const int64_t threshold : {int64_t{0}, int64_t{30}}) {
      SCOPED_TRACE(absl::StrCat(v1::WorkerRole_Name(role), " ", threshold));
      WorkerPool pool(
          {.local_prefill_tokens = threshold}, [](auto) {}, [](const std::string&) {});
      ASSERT_TRUE(pool.add(worker("b", role, 100, 4)).ok());
      ASSERT_TRUE(pool.add(worker("p", v1::WORKER_ROLE_PREFILL, 100, 0)).ok());
      auto admission = pool.admit(8, std::chrono::system_clock::now() + std::chrono::seconds(2),
                                  [] { return false; });
      ASSERT_TRUE(admission.ok());
      const Worker& b = *admission->worker;
      std::vector<uint32_t> turn = prompt(100);
      auto first = pickFor(pool, b, turn);  // Nothing cached anywhere: the prefill worker.
      EXPECT_EQ(first->worker->id, "p");
      pool.releasePrefill(*first, true);  // Sent to b too: 6 blocks of 16 there.
      turn.resize(110, 7);
      auto next = pickFor(pool, b, turn);  // 14 tokens missing on b.
      EXPECT_EQ(next->worker->id, threshold >= 14 ? "b" : "p");
      EXPECT_EQ(next->tokens, 14);  // Cached on either.
      pool.releasePrefill(*next, true);
      // b decoded a reply: the full blocks of prompt and reply before the last token (9) are
      // in its cache, not in p's (6).
      turn.resize(160, 9);
      pool.decoded(b, PrefixIndex::blockHashes(turn, 16));
      turn.resize(170, 11);
      auto after = pickFor(pool, b, turn);
      EXPECT_EQ(after->worker->id, threshold > 0 ? "b" : "p");
      EXPECT_EQ(after->tokens, threshold > 0 ? 170 - 9 * 16 : 170 - 6 * 16);
      pool.releasePrefill(*after, true);
      pool.release(*admission);
    }
}

// Without a prefill worker, a decode worker (role decode) computes only a short rest; a
// longer prompt has nowhere to go. One with both roles computes any.
TEST(WorkerPoolLocalPrefillTest, OnlyAWorkerWithBothRolesComputesAWholePromptForItself) {
  for (const auto role : {v1::WORKER_ROLE_BOTH, v1::WORKER_ROLE_DECODE}) {
    SCOPED_TRACE(v1::WorkerRole_Name(role));
    WorkerPool pool(
        {.local_prefill_tokens = 30}, [](auto) {}, [](const std::string&) {});
    ASSERT_TRUE(pool.add(worker("d", role, 100, 4)).ok());
    auto admission = pool.admit(8, std::chrono::system_clock::now() + std::chrono::seconds(2),
                                [] { return false; });
    ASSERT_TRUE(admission.ok());
    auto whole = pickFor(pool, *admission->worker, prompt(100));
    if (role == v1::WORKER_ROLE_BOTH) {
      ASSERT_TRUE(whole.ok());
      EXPECT_EQ(whole->worker->id, "d");
      pool.releasePrefill(*whole, true);
    } else {
      EXPECT_EQ(whole.status().code(), absl::StatusCode::kUnavailable);
    }
    auto rest = pickFor(pool, *admission->worker, prompt(20));
    ASSERT_TRUE(rest.ok());
    EXPECT_EQ(rest->worker->id, "d");
    pool.releasePrefill(*rest, true);
    pool.release(*admission);
  }
}

// --prefill-policy=least_loaded: cached prefixes are not counted.
TEST(WorkerPoolPolicyTest, LeastLoadedPrefillIgnoresCachedPrefixes) {
  WorkerPool pool(
      {.prefix_aware = false}, [](auto) {}, [](const std::string&) {});
  ASSERT_TRUE(pool.add(worker("d", v1::WORKER_ROLE_DECODE, 100, 4)).ok());
  ASSERT_TRUE(pool.add(worker("p1", v1::WORKER_ROLE_PREFILL, 64, 0)).ok());
  ASSERT_TRUE(pool.add(worker("p2", v1::WORKER_ROLE_PREFILL, 64, 0)).ok());
  auto admission = pool.admit(1, std::chrono::system_clock::now() + std::chrono::seconds(2),
                              [] { return false; });
  ASSERT_TRUE(admission.ok());
  auto first = pickFor(pool, *admission->worker, prompt(100));
  auto second = pickFor(pool, *admission->worker, prompt(100));
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_NE(first->worker->id, second->worker->id);  // Not where the prefix went.
  EXPECT_EQ(second->tokens, 100);
  pool.releasePrefill(*first);
  pool.releasePrefill(*second);
  pool.release(*admission);
}

// The guess keeps a worker's most recent blocks, a prompt's head the longest; block names
// are the engine's hash chain over the blocks a cache may supply.
TEST(PrefixIndexTest, KeepsTheMostRecentBlocksHeadsLast) {
  const std::vector<uint32_t> a = prompt(49), b = prompt(49, 1000);
  const std::vector<uint64_t> ha = PrefixIndex::blockHashes(a, 16),
                              hb = PrefixIndex::blockHashes(b, 16);
  ASSERT_EQ(ha.size(), 3u);  // 48 of 49 tokens; the last is always computed
  EXPECT_EQ(PrefixIndex::blockHashes(prompt(48), 16).size(), 2u);
  EXPECT_TRUE(PrefixIndex::blockHashes(prompt(1), 16).empty());
  EXPECT_EQ(ha[1], engine::KvBlockPool::chainHash(
                       engine::KvBlockPool::chainHash(0, std::span(a).subspan(0, 16)),
                       std::span(a).subspan(16, 16)));
  PrefixIndex index;
  index.record("w", ha, 4);
  EXPECT_EQ(index.matched("w", ha), 3);
  EXPECT_EQ(index.matched("v", ha), 0);
  index.record("w", hb, 4);  // Six blocks for four places: `a`'s last two go.
  EXPECT_EQ(index.matched("w", ha), 1);
  EXPECT_EQ(index.matched("w", hb), 3);
  index.forget("w");
  EXPECT_EQ(index.matched("w", hb), 0);
}

// A request that lost its only worker (dropped for a late heartbeat, registering again)
// waits for it to come back instead of failing; with nobody coming, the patience ends it.
TEST_F(WorkerPoolTest, PlacingAgainWaitsWhileNoWorkerIsRegistered) {
  WorkerPool pool(
      {.restart_patience = std::chrono::seconds(5)}, [](auto) {}, [](const std::string&) {});
  EXPECT_FALSE(pool.model().has_value());
  std::thread registers([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_TRUE(pool.add(worker("back", v1::WORKER_ROLE_BOTH, 10, 4)).ok());
  });
  const std::optional<WorkerPool::ModelView> view = pool.awaitModel(soon(5000), never);
  registers.join();
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(view->model_id, pool.model()->model_id);
  // Nobody registers: pool_'s patience (50 ms) ends the wait well before the deadline; a
  // cancelled request does not wait.
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(pool_.awaitModel(soon(5000), never).has_value());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4));
  EXPECT_FALSE(pool_.awaitModel(soon(5000), [] { return true; }).has_value());
}

}  // namespace
}  // namespace cleave::router

namespace cleave::router {
namespace {

TEST(WorkerPoolOverloadTest, RefusesAtOnceWhatCannotFinishBeforeItsDeadline) {
  WorkerPool pool(
      {.queue_capacity = 100}, [](auto) {}, [](const std::string&) {});
  ASSERT_TRUE(pool.add(worker("a", v1::WORKER_ROLE_BOTH, 1000, 1)).ok());  // Admits 2.
  auto in = [](int ms) { return std::chrono::system_clock::now() + std::chrono::milliseconds(ms); };
  auto never = [] { return false; };
  using std::chrono::milliseconds;
  // Finished requests of 10 new tokens served in 200 ms each (half of them after waiting 300 ms
  // for a place in the batch, which is not service): 20 ms to the first decoded token, then
  // 20 ms for each of the other 9.
  for (int i = 0; i < 8; ++i) {
    absl::StatusOr<Admission> a = pool.admit(1, in(1000), never, {}, "", 10);
    ASSERT_TRUE(a.ok()) << a.status();
    a->since -= milliseconds(i % 2 == 0 ? 200 : 500);
    pool.release(
        *a, Served{.decode_wait_s = i % 2 == 0 ? 0.0 : 0.3, .decode_s = 0.18, .decoded_tokens = 9});
  }
  // Both places held: a new request decodes after both finish (0.4 s), then takes 0.02 s to
  // its first decoded token and 0.02 s per token.
  std::vector<Admission> held{*pool.admit(1, in(20000), never), *pool.admit(1, in(20000), never)};
  absl::StatusOr<Admission> short_deadline = pool.admit(1, in(400), never, {}, "", 10);
  EXPECT_EQ(short_deadline.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(short_deadline.status().message(), HasSubstr("finish in about 0.6 s"));
  // Its hint: once the queue moved on by the excess, about 0.2 s.
  const auto excess = retryAfter(short_deadline.status());
  ASSERT_TRUE(excess.has_value());
  EXPECT_GE(excess->count(), 200);
  EXPECT_LE(excess->count(), 300);
  absl::StatusOr<Admission> long_output = pool.admit(1, in(800), never, {}, "", 100);
  EXPECT_EQ(long_output.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(long_output.status().message(), HasSubstr("finish in about 2.4 s"));
  // 0.6 s fits in 800 ms: it waits. Its turn comes 500 ms later, when 0.4 s are needed.
  std::optional<absl::StatusOr<Admission>> late, patient;
  std::thread late_thread([&] { late = pool.admit(1, in(800), never, {}, "", 10); });
  while (pool.queueDepth() < 1) std::this_thread::sleep_for(milliseconds(1));
  std::thread patient_thread([&] { patient = pool.admit(1, in(20000), never, {}, "", 10); });
  while (pool.queueDepth() < 2) std::this_thread::sleep_for(milliseconds(1));
  std::this_thread::sleep_for(milliseconds(500));
  pool.release(held.front());
  late_thread.join();
  patient_thread.join();
  EXPECT_EQ(late->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(late->status().message(), HasSubstr("less than the about 0.4 s it would take"));
  ASSERT_TRUE(patient->ok()) << patient->status();  // The place went to the one behind.
  pool.release(held.back());
  pool.release(**patient);
  EXPECT_EQ(pool.reservedBlocks(), 0);
}

// Requests of 12 tokens that spent 2 s before their first decoded token (prefill behind a
// burst of others) and 50 ms per token after it: a 40-token request is charged the 2 s once
// and 50 ms for each token, not 2.55 s / 12 for each of its 40.
TEST(WorkerPoolOverloadTest, AShortRequestsStartUpIsNotChargedPerTokenToALongOne) {
  WorkerPool pool(
      {.queue_capacity = 100}, [](auto) {}, [](const std::string&) {});
  ASSERT_TRUE(pool.add(worker("a", v1::WORKER_ROLE_BOTH, 1000, 1)).ok());  // Admits 2.
  auto in = [](int ms) { return std::chrono::system_clock::now() + std::chrono::milliseconds(ms); };
  auto never = [] { return false; };
  for (int i = 0; i < 8; ++i) {
    absl::StatusOr<Admission> a = pool.admit(1, in(1000), never, {}, "", 12);
    ASSERT_TRUE(a.ok()) << a.status();
    a->since -= std::chrono::milliseconds(2550);
    pool.release(*a, Served{.decode_s = 0.55, .decoded_tokens = 11});
  }
  std::vector<Admission> held{*pool.admit(1, in(60000), never), *pool.admit(1, in(60000), never)};
  // Behind both (2 x 2.55 s), then 2 s + 40 x 50 ms.
  absl::StatusOr<Admission> long_output = pool.admit(1, in(5000), never, {}, "", 40);
  EXPECT_EQ(long_output.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(long_output.status().message(), HasSubstr("finish in about 9.1 s"));
  for (const Admission& a : held) pool.release(a);
  EXPECT_EQ(pool.reservedBlocks(), 0);
}

}  // namespace
}  // namespace cleave::router

namespace cleave::router {
namespace {

// Client "a" queues five requests before "b" queues one: b's goes second, not sixth.
TEST(WorkerPoolFairnessTest, ClientsTakeTurnsInTheQueue) {
  WorkerPool pool(
      {.queue_capacity = 100}, [](auto) {}, [](const std::string&) {});
  ASSERT_TRUE(pool.add(worker("w", v1::WORKER_ROLE_BOTH, 1000, 1)).ok());  // Admits 2.
  auto later = std::chrono::system_clock::now() + std::chrono::seconds(30);
  auto never = [] { return false; };
  std::vector<Admission> running{*pool.admit(1, later, never, {}, "a"),
                                 *pool.admit(1, later, never, {}, "a")};
  std::mutex mu;
  std::vector<std::string> order;  // Guarded by mu.
  std::deque<Admission> admitted;  // Guarded by mu.
  std::vector<std::thread> clients;
  auto enqueue = [&](const std::string& client, size_t depth) {
    clients.emplace_back([&, client] {
      absl::StatusOr<Admission> a = pool.admit(1, later, never, {}, client);
      ASSERT_TRUE(a.ok()) << a.status();
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(client);
      admitted.push_back(*a);
    });
    while (pool.queueDepth() < static_cast<int64_t>(depth)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  };
  for (size_t i = 1; i <= 5; ++i) enqueue("a", i);
  enqueue("b", 6);
  // Free one slot at a time; each admitted request gives its slot back.
  pool.release(running[0]);
  pool.release(running[1]);
  while (true) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::lock_guard<std::mutex> lock(mu);
    if (order.size() == 6) break;
    if (!admitted.empty()) {
      pool.release(admitted.front());
      admitted.pop_front();
    }
  }
  for (std::thread& t : clients) t.join();
  for (const Admission& a : admitted) pool.release(a);
  ASSERT_EQ(order.size(), 6u);
  // The first freed slots go to a (served longest ago: never) then b, not after all of a.
  const auto b = std::find(order.begin(), order.end(), "b") - order.begin();
  EXPECT_LE(b, 2) << "b waited behind a's whole burst";
  EXPECT_EQ(pool.reservedBlocks(), 0);
}

// Waiting requests go by priority (lower first), whatever their client or arrival; clients
// take turns among equals.
TEST(WorkerPoolFairnessTest, LowerPriorityValuesAreAdmittedFirst) {
  WorkerPool pool(
      {.queue_capacity = 100}, [](auto) {}, [](const std::string&) {});
  ASSERT_TRUE(pool.add(worker("w", v1::WORKER_ROLE_BOTH, 1000, 1)).ok());  // Admits 2.
  auto later = std::chrono::system_clock::now() + std::chrono::seconds(30);
  auto never = [] { return false; };
  std::vector<Admission> running{*pool.admit(1, later, never), *pool.admit(1, later, never)};
  std::mutex mu;
  std::vector<std::string> order;  // Guarded by mu.
  std::vector<std::thread> waiting;
  auto enqueue = [&](const std::string& name, const std::string& client, int32_t priority) {
    const int64_t depth = pool.queueDepth() + 1;
    waiting.emplace_back([&, name, client, priority] {
      absl::StatusOr<Admission> a = pool.admit(1, later, never, {}, client, 1, {}, priority);
      ASSERT_TRUE(a.ok()) << a.status();
      {
        std::lock_guard<std::mutex> lock(mu);
        order.push_back(name);
      }
      pool.release(*a);
    });
    while (pool.queueDepth() < depth) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  };
  enqueue("batch-1", "a", 5);
  enqueue("batch-2", "a", 5);
  enqueue("default", "b", 0);
  enqueue("urgent-1", "c", -3);
  enqueue("batch-3", "b", 5);
  enqueue("urgent-2", "c", -3);
  enqueue("urgent-3", "d", -3);
  // One slot frees: the queue drains one request at a time.
  pool.release(running[0]);
  for (std::thread& t : waiting) t.join();
  pool.release(running[1]);
  // c and d take turns among the urgent ones (c was served first, so d goes next), then the
  // default one, then the batch ones, b's before a's second (a was served already).
  EXPECT_EQ(order, (std::vector<std::string>{"urgent-1", "urgent-3", "urgent-2", "default",
                                             "batch-1", "batch-3", "batch-2"}));
  EXPECT_EQ(pool.reservedBlocks(), 0);
}

TEST_F(WorkerPoolTest, AwaitingAPrefillWorkerEndsWhenOneRegistersOrPatienceRunsOut) {
  WorkerPool pool(
      {.restart_patience = std::chrono::seconds(5)}, [](auto) {}, [](const std::string&) {});
  ASSERT_TRUE(pool.add(worker("d", v1::WORKER_ROLE_DECODE, 10, 4)).ok());
  ASSERT_TRUE(pool_.add(worker("d", v1::WORKER_ROLE_DECODE, 10, 4)).ok());
  auto admission = pool.admit(1, soon(), never);
  ASSERT_TRUE(admission.ok());
  // None registered: patience (50 ms in pool_) ends the wait, before the deadline.
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(pool_.awaitPrefill(*admission->worker, {}, soon(5000), never));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4));
  // A cancelled request stops waiting at once.
  EXPECT_FALSE(pool.awaitPrefill(*admission->worker, {}, soon(5000), [] { return true; }));
  // One registering while the request waits ends the wait with a worker to pick.
  std::thread registers([&] {
    // Usually lands while the request waits; earlier, the wait ends at once: true either way.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_TRUE(pool.add(worker("p", v1::WORKER_ROLE_PREFILL, 0, 0)).ok());
  });
  EXPECT_TRUE(pool.awaitPrefill(*admission->worker, {}, soon(5000), never));
  registers.join();
  auto picked = pickFor(pool, *admission->worker, prompt(10));
  ASSERT_TRUE(picked.ok());
  EXPECT_EQ(picked->worker->id, "p");
  pool.releasePrefill(*picked);
  // A worker excluded (one that could not be stopped) is waited past, as if it were not there.
  ASSERT_TRUE(pool_.add(worker("q", v1::WORKER_ROLE_PREFILL, 0, 0)).ok());
  EXPECT_TRUE(pool_.awaitPrefill(*admission->worker, {}, soon(5000), never));
  EXPECT_FALSE(pool_.awaitPrefill(*admission->worker, {"q"}, soon(5000), never));
  pool.release(*admission);
}

TEST_F(WorkerPoolTest, AdmissionWaitsForADecodeWorkerWhileEveryOneRestarts) {
  WorkerPool pool(
      {.restart_patience = std::chrono::seconds(5)}, [](auto) {}, [](const std::string&) {});
  ASSERT_TRUE(pool.add(worker("p", v1::WORKER_ROLE_PREFILL, 0, 0)).ok());
  ASSERT_TRUE(pool.add(worker("gone", v1::WORKER_ROLE_DECODE, 10, 4)).ok());
  // Only a worker this request found unreachable: patience (50 ms in pool_) ends the wait
  // with Unavailable, before the deadline.
  ASSERT_TRUE(pool_.add(worker("gone", v1::WORKER_ROLE_DECODE, 10, 4)).ok());
  const auto start = std::chrono::steady_clock::now();
  auto refused = pool_.admit(1, soon(5000), never, {"gone"});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4));
  // A cancelled request stops waiting at once.
  EXPECT_EQ(pool.admit(1, soon(5000), [] { return true; }, {"gone"}).status().code(),
            absl::StatusCode::kUnavailable);
  // A replacement registering while the request waits is where it is admitted.
  std::thread registers([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_TRUE(pool.add(worker("new", v1::WORKER_ROLE_DECODE, 10, 4)).ok());
  });
  auto admitted = pool.admit(1, soon(5000), never, {"gone"});
  registers.join();
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  EXPECT_EQ(admitted->worker->id, "new");
  pool.release(*admitted);
}

}  // namespace
}  // namespace cleave::router

namespace cleave::router {
namespace {

// --served-model-name: requests name the model by its served names (or none), not by the id
// its workers register; an adapter may not take one of those names.
TEST(WorkerPoolServedNamesTest, TheModelGoesByItsServedNames) {
  WorkerPool pool(
      {.served_model_names = {"alias", "other"}}, [](auto) {}, [](const std::string&) {});
  v1::RegisterRequest clash = worker("a", v1::WORKER_ROLE_BOTH, 64, 2);
  v1::LoraAdapterFingerprint* adapter = clash.mutable_model()->add_adapters();
  adapter->set_name("other");
  adapter->set_sha256(std::string(64, 'b'));
  const absl::Status refused = pool.add(clash).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("LoRA adapter 'other'"));
  EXPECT_FALSE(pool.model().has_value());

  adapter->set_name("sql");
  ASSERT_TRUE(pool.add(clash).ok());
  const std::optional<WorkerPool::ModelView> model = pool.model();
  ASSERT_TRUE(model.has_value());
  EXPECT_EQ(model->model_id, "m");
  EXPECT_THAT(model->names, testing::ElementsAre("alias", "other"));
  EXPECT_TRUE(model->isBase("") && model->isBase("alias") && model->isBase("other"));
  EXPECT_FALSE(model->isBase("m"));
  EXPECT_FALSE(model->isBase("sql"));
  EXPECT_EQ(model->served(), "'alias', 'other', 'sql' (LoRA adapters of the first)");

  WorkerPool plain(
      {}, [](auto) {}, [](const std::string&) {});
  ASSERT_TRUE(plain.add(worker("b", v1::WORKER_ROLE_BOTH, 64, 2)).ok());
  EXPECT_TRUE(plain.model()->isBase("m"));
  EXPECT_EQ(plain.model()->served(), "'m'");
}

}  // namespace
}  // namespace cleave::router
