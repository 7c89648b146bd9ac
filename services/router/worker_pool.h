// The router's view of its workers: the registry (registration, leases, compatibility)
// and admission against each decode worker's KV budget.
//
// Admission: a request needs ceil((prompt + max_new_tokens) / block_size) blocks for its
// whole life, less the blocks of its prompt's cached prefix it shares with requests already
// on a worker: a worker with prefix caching keeps one block per cached prefix block however
// many sequences use it, and the router counts it once (see settle()). It goes to the
// least-loaded decode worker that has the blocks it needs there free and
// room under its target concurrency plus as many requests again prefilled ahead (blocks
// permitting); otherwise it waits in a bounded FIFO (only the head may go, so a
// large request is not starved by small ones) until room frees, its deadline passes or its
// caller gives up. A worker decodes at most its target concurrency at once and starts a
// prefilled request in the step after a sequence finishes (engine/scheduler.h), so with
// requests prefilled ahead the decode batch stays at the target while requests wait. The router is
// the only one reserving on its workers, so it keeps their block counts itself; a worker's
// heartbeat reports its own view for the logs and metrics.
//
// Overload: a request that would have to wait is refused at once (RESOURCE_EXHAUSTED)
// when the queue is full, or when it could not finish before its deadline: the recent
// service time of finished requests (admission to end, less any wait for a place in the
// decode batch) says how fast places in the decode batches free, so how long the requests
// ahead of it (admitted or waiting) hold it back, and then how long it takes itself (per new
// token allowed). A waiting request whose turn comes when its deadline no longer leaves
// that time gives its place up (DEADLINE_EXCEEDED) instead of taking decode work that would
// be thrown away.
//
// Draining: a worker that says in a heartbeat that it is stopping gets no new admission or
// prefill from then on; what it holds finishes there.
//
// Compatibility: every worker of a model must report the same fingerprint and KV layout;
// a different one is refused at registration (FAILED_PRECONDITION, and logged), never by
// failing requests later.
//
// Threading: all methods are thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cleave/v1/worker.grpc.pb.h"
#include "common/service_thread.h"
#include "grpcpp/security/credentials.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "services/router/prefix_index.h"

namespace cleave::router {

// Workers found unreachable outside the registry (their token stream cannot be reopened),
// for the pool to drop without waiting for their lease. Shared by whoever finds them and
// the pool, so neither outlives the other's use of it.
class LostWorkers {
 public:
  void add(const std::string& worker_id);
  std::vector<std::string> take();

 private:
  absl::Mutex mu_;
  std::vector<std::string> ids_ ABSL_GUARDED_BY(mu_);
};

struct WorkerPoolOptions {
  std::chrono::milliseconds heartbeat_interval{1000};
  std::chrono::milliseconds lease_timeout{5000};
  int64_t queue_capacity = 1024;
  // How long a request waits, within its deadline, for a worker of a role none of which is
  // registered (every one restarting) before it fails with Unavailable.
  std::chrono::milliseconds restart_patience{20000};
  // Dropped on the next lease check (every 200 ms) when set.
  std::shared_ptr<LostWorkers> lost;
  // For the router's calls to workers (null: plaintext).
  std::shared_ptr<grpc::ChannelCredentials> worker_credentials;
  // Prefill goes where it would finish first counting cached prefixes (pickPrefill); off,
  // to the prefill worker with the fewest prompt tokens outstanding.
  bool prefix_aware = true;
  // A decode worker (role decode or both) computes a prompt itself, even where prefill
  // workers are registered, when at most this many of its tokens are not in its cache (a
  // conversation's next turn): nothing moves, and the prefill workers' queues are skipped.
  // 0: prefill workers always take the prompts.
  int64_t local_prefill_tokens = 0;
  // The names clients call the model by (--served-model-name; the first is the one
  // reported); empty: the model id its workers register.
  std::vector<std::string> served_model_names;
  // This router's id (ReserveRequest.router_id), told to workers at registration.
  std::string router_id;
};

// One registered worker. Immutable after registration except where noted.
struct Worker {
  std::string id;
  v1::RegisterRequest info;
  std::unique_ptr<v1::DecodeControl::Stub> decode;
  std::unique_ptr<v1::PrefillControl::Stub> prefill;
  bool servesDecode() const;
  bool servesPrefill() const;
};

// A prompt being prefilled on a worker, counted toward its outstanding prefill tokens until
// releasePrefill().
struct PrefillLease {
  std::shared_ptr<const Worker> worker;
  int64_t tokens = 0;
  std::vector<uint64_t> blocks;  // The prompt's blocks a cache may supply (prefix_index.h).
  std::string decode_id;         // Where the KV goes: its cache keeps the blocks too.
};

// A request's place on a decode worker: its blocks, held until release().
struct Admission {
  std::shared_ptr<const Worker> worker;
  int64_t blocks = 0;  // Its reservation's size.
  // The blocks of its prompt's cached prefix it shares with other requests on the worker
  // (their PrefixIndex::blockHashes), counted once there however many share each, and the
  // rest of its blocks, its own.
  std::vector<uint64_t> shared;
  int64_t own = 0;
  std::chrono::steady_clock::time_point since;
};

// How a request that finished normally on its decode worker spent its time there (its
// admission to its release).
struct Served {
  // Waiting for a place in the decode batch: queueing, not service.
  double decode_wait_s = 0;
  // From its first decoded token to its last, and the tokens decoded in that span (the
  // first one's event excluded). 0 when the prefill's token ended it.
  double decode_s = 0;
  int64_t decoded_tokens = 0;
};

class WorkerPool {
 public:
  // `on_join` / `on_leave` are called (outside the pool's lock) when a worker is added or
  // removed, e.g. to open and close its token stream.
  WorkerPool(WorkerPoolOptions options, std::function<void(std::shared_ptr<const Worker>)> on_join,
             std::function<void(const std::string& worker_id)> on_leave);
  ~WorkerPool();

  // Registry.
  absl::StatusOr<v1::RegisterResponse> add(const v1::RegisterRequest& request);
  // False when the worker is unknown (it must register again).
  bool heartbeat(const v1::HeartbeatRequest& request);
  void remove(const std::string& worker_id, const std::string& reason);

  // What clients see: the model served (empty when no worker is registered), its
  // context length and KV block size.
  struct AdapterView {
    std::string name;
    std::string sha256;
  };
  struct ModelView {
    std::string model_id;            // As the workers register it.
    std::vector<std::string> names;  // What clients call it: the served names, or model_id.
    uint32_t context_length = 0;
    uint32_t vocab_size = 0;
    uint32_t block_size = 0;
    std::vector<AdapterView> adapters;  // The LoRA adapters every worker serves.
    const AdapterView* adapter(absl::string_view name) const {
      for (const AdapterView& a : adapters) {
        if (a.name == name) return &a;
      }
      return nullptr;
    }
    // True when a request naming `name` runs on the base model (empty names it too).
    bool isBase(absl::string_view name) const {
      return name.empty() || std::find(names.begin(), names.end(), name) != names.end();
    }
    // Every name a request may give, quoted, for an error message.
    std::string served() const;
  };
  std::optional<ModelView> model() const;
  // The same, waiting while no worker is registered (a lone worker the router dropped for a
  // late heartbeat and that registers again, or one restarting): up to the restart
  // patience, within `deadline`, until `cancelled()`. nullopt when none comes.
  std::optional<ModelView> awaitModel(std::chrono::system_clock::time_point deadline,
                                      const std::function<bool()>& cancelled);

  // Waits for a decode worker that can hold `blocks` blocks. Errors: Unavailable (no
  // decode worker, after waiting up to the restart patience for one), InvalidArgument (no worker
  // could ever hold it), ResourceExhausted (the queue is full, or the recent pace says the
  // deadline is out of reach; either with a retry hint, retry_hint.h), DeadlineExceeded, Cancelled
  // (`cancelled` became true). Workers named in `exclude` (found unreachable by this request) are
  // passed over. `client` (an API key's name; empty when keys are off) shares the queue fairly: the
  // waiting client admitted least recently goes next, its oldest request first. `new_tokens`
  // (the new tokens it may generate) scales its expected service time. `prefix`: the
  // prompt's blocks a cache may supply (PrefixIndex::blockHashes): of the workers with room
  // in their decode batch, the one holding the longest cached prefix goes first. `priority`: a
  // waiting request of a lower value goes before every one of a higher value (clients take turns
  // among equals); the queue ahead of it, for its deadline, is what it waits behind.
  absl::StatusOr<Admission> admit(int64_t blocks, std::chrono::system_clock::time_point deadline,
                                  const std::function<bool()>& cancelled,
                                  const std::vector<std::string>& exclude = {},
                                  const std::string& client = "", int64_t new_tokens = 1,
                                  std::span<const uint64_t> prefix = {}, int32_t priority = 0);
  // What the decode worker's Reserve answered: the first `cached` blocks of the prompt,
  // whose hashes begin `prefix` (the same as admit()'s), came from its prefix cache. A
  // cached block is one the worker holds once for every sequence using it, so the admission
  // shares those and owns the rest. Until then it shares the leading blocks of `prefix`
  // that requests admitted there share already (held there, so the worker's Reserve finds
  // them cached, unless they were let go meanwhile).
  void settle(Admission& admission, int64_t cached, std::span<const uint64_t> prefix);
  // `served`: set when the request finished there normally; its time there less the decode
  // batch wait is a service time, which admission estimates go by. `fenced`: the worker's
  // Release kept that many of its blocks out of use for `fenced_for` (a KV write into them
  // may still come); they stay counted against the worker until its heartbeats count them
  // (kv_blocks_foreign), for two heartbeat intervals or `fenced_for` if shorter.
  void release(const Admission& admission, std::optional<Served> served = std::nullopt,
               int64_t fenced = 0,
               std::chrono::milliseconds fenced_for = std::chrono::milliseconds(0));

  // Waits until a worker that can prefill for `decode` is registered (none draining nor in
  // `exclude`: a prefill worker, or `decode` itself when it has both roles): while every
  // prefill worker is restarting, a request waits for one instead of failing. False when
  // `deadline` passes, `cancelled()` turns true, or the restart patience runs out first.
  bool awaitPrefill(const Worker& decode, const std::vector<std::string>& exclude,
                    std::chrono::system_clock::time_point deadline,
                    const std::function<bool()>& cancelled);

  // The worker to prefill a prompt of `tokens` tokens whose cacheable blocks are `prefix`
  // (PrefixIndex::blockHashes) for `decode`: of the prefill workers (none of
  // `exclude`), `decode` itself when at most local_prefill_tokens of the prompt are missing
  // from its cache, else the one that would finish it first — the fewest outstanding
  // prefill tokens once the prompt's tokens it does not hold cached are added
  // (prefix_index.h) — or `decode` itself when it has both roles and no prefill worker is
  // left. Unavailable when there is none.
  // A worker's outstanding tokens count only what it computes, and what it holds counts
  // from the end of its successful prefills (concurrent prompts of a new prefix are not
  // sent to one worker on the strength of blocks nobody has computed yet). The KV
  // transfer, whole prompts whatever was cached, is not counted.
  absl::StatusOr<PrefillLease> pickPrefill(const Worker& decode, int64_t tokens,
                                           std::span<const uint64_t> prefix,
                                           const std::vector<std::string>& exclude = {});
  // The worker to compute a prompt for its own sake (an embedding: Generation.Embed), of
  // those that prefill for others (role prefill or both; none draining nor in `exclude`):
  // the one that would finish it first, as pickPrefill counts it. Unavailable when there is
  // none. Released with releasePrefill.
  absl::StatusOr<PrefillLease> pickEmbedder(int64_t tokens, std::span<const uint64_t> prefix,
                                            const std::vector<std::string>& exclude = {});
  // `prefilled`: the prefill succeeded, so the worker holds the prompt's blocks now, and so
  // does the decode worker the KV went to once it decodes.
  void releasePrefill(const PrefillLease& lease, bool prefilled = false);
  // `worker` decoded a sequence whose blocks a cache may supply are `hashes` (prompt and
  // generated tokens): its cache holds them now.
  void decoded(const Worker& worker, std::span<const uint64_t> hashes);

  // One line per worker for GetServerInfo: role, model, admitted requests, reserved blocks.
  std::vector<v1::WorkerSummary> summaries() const;
  int64_t queueDepth() const;
  // How often workers heartbeat (their load comes with each heartbeat).
  std::chrono::milliseconds heartbeatInterval() const { return options_.heartbeat_interval; }
  // Blocks the router holds reserved on all workers (0 once every request has ended).
  int64_t reservedBlocks() const;

 private:
  struct Entry {
    std::shared_ptr<Worker> worker;
    std::chrono::steady_clock::time_point last_seen;
    int64_t reserved = 0;  // Blocks of admitted requests (each shared one once).
    // Blocks released into a fence lately, held until the worker's heartbeats count them.
    std::vector<std::pair<std::chrono::steady_clock::time_point, int64_t>> fenced;
    // Blocks the worker holds for others (its heartbeat's kv_blocks_foreign): out of use.
    int64_t foreign = 0;
    // The shared blocks of admitted requests (Admission::shared), with how many share each.
    std::unordered_map<uint64_t, int64_t> shared;
    int64_t admitted = 0;        // Requests holding blocks (prefilling, prefilled or decoding).
    int64_t prefill_tokens = 0;  // Prompt tokens being prefilled here (cached ones not counted).
    bool draining = false;       // It is stopping: no new work.
  };
  std::optional<ModelView> modelLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The leading blocks of `prefix` that requests admitted on `entry` share.
  static int64_t sharedBlocks(const Entry& entry, std::span<const uint64_t> prefix);
  // Counts one more admission sharing `hashes` on `entry` (<0: one fewer).
  static void share(Entry& entry, std::span<const uint64_t> hashes, int64_t delta);
  // The decode worker to admit `blocks` on now, if any: the least loaded, or with `prefix`
  // (see admit()) the one with room in its decode batch that holds most of it.
  Entry* pick(int64_t blocks, const std::vector<std::string>& exclude,
              std::span<const uint64_t> prefix) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `worker`'s cache holds `hashes` now (when it has a prefix cache).
  void holds(const Worker& worker, std::span<const uint64_t> hashes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Blocks of `prefix` the prefix cache of `entry` holds, as the router guesses it (0 for a
  // worker that does not cache, or with the cache-aware policy off).
  // Of the workers whose role `takes`, none draining nor in `exclude`: the one that would
  // finish a prompt of `length` tokens whose cacheable blocks are `prefix` first (its
  // outstanding tokens plus the prompt's it would compute), and what it would compute.
  std::pair<Entry*, int64_t> fastestPrefill(int64_t length, std::span<const uint64_t> prefix,
                                            const std::vector<std::string>& exclude,
                                            const std::function<bool(v1::WorkerRole)>& takes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t cachedBlocks(const Entry& entry, std::span<const uint64_t> prefix) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits (under mu_) until `ready` or the deadline or cancellation; false with `why` set
  // when it gave up.
  bool waitUntil(const std::function<bool()>& ready, std::chrono::system_clock::time_point deadline,
                 const std::function<bool()>& cancelled, absl::Status& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void expire(std::stop_token stop);
  // When a wait for a restarting worker gives up: the restart patience from now, or
  // `deadline` if sooner.
  std::chrono::system_clock::time_point patienceDeadline(
      std::chrono::system_clock::time_point deadline) const;
  // admit() before its outcome is counted; sets `outcome` when the status code alone does
  // not say it.
  absl::StatusOr<Admission> admitOrWait(int64_t blocks,
                                        std::chrono::system_clock::time_point deadline,
                                        const std::function<bool()>& cancelled,
                                        const std::vector<std::string>& exclude,
                                        const std::string& client, int64_t new_tokens,
                                        std::span<const uint64_t> prefix, int32_t priority,
                                        const char*& outcome);
  // The sequences decoding at once on the decode workers not in `exclude` (at least 1), and
  // the requests admitted there.
  struct DecodeLoad {
    int64_t decoding = 0;
    int64_t admitted = 0;
  };
  DecodeLoad decodeLoad(const std::vector<std::string>& exclude) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // How long from now a request allowed `new_tokens`, with `queued_ahead` waiting ahead of
  // it, would take to finish on the workers not in `exclude`; nullopt until enough requests
  // have finished to say.
  std::optional<double> expectedFinishS(int64_t queued_ahead, int64_t new_tokens,
                                        const std::vector<std::string>& exclude) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The waiting request that may go next: of the lowest priority value, fair between
  // clients, oldest first within one.
  uint64_t nextInLine() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void updateGauges() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  WorkerPoolOptions options_;
  std::function<void(std::shared_ptr<const Worker>)> on_join_;
  std::function<void(const std::string&)> on_leave_;
  // Held across a membership change and its on_join_/on_leave_ calls, so that those reach
  // the relay in the order the changes were made (a worker registering again while its
  // earlier registration expires).
  absl::Mutex membership_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  std::unordered_map<std::string, Entry> workers_ ABSL_GUARDED_BY(mu_);
  PrefixIndex prefixes_ ABSL_GUARDED_BY(mu_);  // What each prefill worker may have cached.
  struct Waiting {
    uint64_t ticket = 0;
    std::string client;
    int32_t priority = 0;
  };
  std::vector<Waiting> queue_ ABSL_GUARDED_BY(mu_);  // Waiting admissions, oldest first.
  // When each client last had a waiting request admitted (a count of such admissions).
  std::unordered_map<std::string, uint64_t> last_served_ ABSL_GUARDED_BY(mu_);
  uint64_t served_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  // The mean of the last few samples of a quantity: a window follows a change of load
  // within a few requests and forgets what came before.
  class RecentMean {
   public:
    void add(double x);
    double mean() const { return samples_.empty() ? 0 : sum_ / samples_.size(); }
    bool trusted() const;  // Enough samples to go by.
   private:
    std::vector<double> samples_;  // A ring, oldest at `next_` once full.
    size_t next_ = 0;
    double sum_ = 0;
  };
  // How long admitted requests take, over recent requests that finished: the seconds from
  // admission to release less the wait for a place in the decode batch; the part of it
  // before their first decoded token (prefill, KV transfer: a cost per request); and the
  // seconds per token decoded after it. A request's own time is the second plus the third
  // times its tokens: a pace learned from short requests does not charge a long one their
  // start-up cost once per token.
  RecentMean service_s_ ABSL_GUARDED_BY(mu_);
  RecentMean start_s_ ABSL_GUARDED_BY(mu_);
  RecentMean token_s_ ABSL_GUARDED_BY(mu_);
  uint64_t changes_ ABSL_GUARDED_BY(mu_) = 0;            // Bumped by anything admission depends on.
  prometheus::Gauge& queue_gauge_;                       // cleave_router_queue_depth
  prometheus::Gauge& reserved_gauge_;                    // cleave_router_reserved_blocks
  prometheus::Gauge& admitted_gauge_;                    // cleave_router_admitted_requests
  prometheus::Gauge& workers_gauge_;                     // cleave_router_workers
  prometheus::Family<prometheus::Counter>& admissions_;  // ..._admissions_total{outcome}
  prometheus::Family<prometheus::Gauge>& worker_admitted_;          // ..._worker_admitted_requests
  prometheus::Family<prometheus::Gauge>& worker_reserved_;          // ..._worker_reserved_blocks
  std::vector<std::string> exported_workers_ ABSL_GUARDED_BY(mu_);  // Labels in the two above.
  ServiceThread expiry_{"lease-expiry"};
};

}  // namespace cleave::router
