#include "services/worker/worker_core.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <unordered_set>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/faults.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/status_macros.h"
#include "google/protobuf/util/message_differencer.h"
#include "services/engine/gated_delta_net.h"
#include "services/worker/kv_copy_plan.h"
#include "services/worker/request_conversion.h"

namespace cleave::worker {
namespace {

absl::Status invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

// Writes `writes` (`what`: "KV", "state") into `region` of rank `rank` of decode worker `to`
// and counts their bytes; Aborted once `stop` is true, Unavailable naming the peer when the
// transfer fails.
absl::Status writeToRank(transfer::KvTransport& transport, const transfer::RemoteRegion& region,
                         std::span<const transfer::Write> writes, const char* what,
                         const std::string& to, uint32_t rank, uint64_t& bytes,
                         const std::function<bool()>& stop, std::chrono::milliseconds timeout) {
  if (writes.empty()) return absl::OkStatus();
  if (stop()) return absl::AbortedError("the KV transfer was stopped");
  absl::Status sent = transfer::writeAndWait(transport, region, writes, timeout, stop);
  if (sent.code() == absl::StatusCode::kAborted) return sent;
  if (!sent.ok()) {
    return absl::UnavailableError(
        absl::StrCat(what, " transfer to ", to, " rank ", rank, ": ", sent.message()));
  }
  for (const transfer::Write& w : writes) bytes += w.bytes;
  return absl::OkStatus();
}

// `n` rows of `slots`, waiting until the call's deadline (at most `limit`) or until it is
// cancelled; `context` may be null.
absl::StatusOr<std::vector<int32_t>> takeRows(KvStagingSlots& slots, int64_t n,
                                              grpc::ServerContext* context,
                                              std::chrono::milliseconds limit) {
  absl::Time until = absl::Now() + absl::FromChrono(limit);
  if (context != nullptr) until = std::min(until, absl::FromChrono(context->deadline()));
  return slots.take(n, until, [context] { return context != nullptr && context->IsCancelled(); });
}

}  // namespace

WorkerCore::WorkerCore(engine::TpGroup& model, const tokenizer::Tokenizer* tokenizer,
                       WorkerCoreOptions options)
    : model_(model), options_(std::move(options)), metrics_(options_.target_concurrency) {
  worker_id_ = options_.worker_id;
  auto gauge = [](const char* direction, int64_t capacity) {
    prometheus::Gauge& free = WorkerMetrics::stagingFree(direction, capacity);
    return [&free](int64_t n) { free.Set(static_cast<double>(n)); };
  };
  // Without a transport nothing is ever transferred: no staging.
  if (options_.transport == nullptr ||
      (options_.staging_send_blocks == 0 && options_.staging_receive_blocks == 0)) {
    gauge("send", 0)(0);  // Exported alike by every worker: none of either.
    gauge("receive", 0)(0);
  } else {
    send_staging_ = std::make_unique<KvStagingSlots>(0, options_.staging_send_blocks,
                                                     "the send staging area (--kv-staging-tokens)",
                                                     gauge("send", options_.staging_send_blocks));
    receive_staging_ = std::make_unique<KvStagingSlots>(
        static_cast<int32_t>(options_.staging_send_blocks), options_.staging_receive_blocks,
        "the receive staging area (--kv-staging-tokens)",
        gauge("receive", options_.staging_receive_blocks));
  }
  loop_ = std::make_unique<EngineLoop>(model, tokenizer, options_.scheduler,
                                       [this](StepReport& report) { onStep(report); });
  sweeper_.start([this](std::stop_token stop) {
    while (sleepFor(stop, std::chrono::milliseconds(100))) sweep();
  });
}

WorkerCore::~WorkerCore() {
  sweeper_.stop();
  loop_.reset();
}

void WorkerCore::sweep() {
  endQuarantines();
  bool fencing;
  {
    absl::MutexLock lock(&mu_);
    fencing = !fenced_.empty();
  }
  // What fences alone hold changes as the reservations sharing their blocks end.
  if (fencing) reportFenced();
  std::vector<std::pair<std::string, std::string>> expired;  // request, why
  std::vector<std::pair<uint64_t, std::string>> unstarted;   // fenced: id, why
  {
    absl::MutexLock lock(&mu_);
    const auto now = Clock::now();
    const auto wall = std::chrono::system_clock::now();
    std::unordered_set<std::string> routers;  // Those some request names.
    for (const auto& [name, r] : requests_) {
      if (r.router_id.empty()) continue;  // A prefill of this worker's own.
      routers.insert(r.router_id);
      auto stream = streams_.find(r.router_id);
      const bool lost =
          (stream == streams_.end() || !stream->second.open) &&
          now - (stream == streams_.end() ? Clock::time_point() : stream->second.closed_at) >
              options_.lease_timeout;
      if (!r.decoding) {
        // A prefill worker this one cannot stop may still write into it: fenced, not freed.
        // Past its deadline, its router (when not lost) releases it, fencing it if need be.
        if (now > r.expires) {
          unstarted.emplace_back(r.id, "its reservation was not started within its ttl");
        } else if (lost) {
          unstarted.emplace_back(r.id, "its router's token stream stayed closed");
        }
      } else if (wall > r.deadline) {
        expired.emplace_back(name, "its deadline passed");
      } else if (lost) {
        expired.emplace_back(name, "its router's token stream stayed closed");
      }
    }
    // The streams of routers gone (each restart is a new router id), once nothing names
    // them: their undelivered events go with them.
    for (auto it = streams_.begin(); it != streams_.end();) {
      const bool gone = !it->second.open && now - it->second.closed_at > options_.lease_timeout &&
                        !routers.contains(it->first);
      it = gone ? streams_.erase(it) : std::next(it);
    }
  }
  for (const auto& [name, why] : expired) {
    CLEAVE_LOG(WARNING) << "freeing request " << name << ": " << why;
    metrics_.onRequestExpired();
    cancel(name);
  }
  for (const auto& [id, why] : unstarted) {
    if (std::optional<int64_t> blocks = fence(id)) {
      CLEAVE_LOG(WARNING) << "fencing the " << *blocks << " blocks of reservation " << id << " for "
                          << options_.quarantine.count() << " ms: " << why;
      metrics_.onRequestExpired();
    }
  }
}

void WorkerCore::setWorkerId(std::string id) {
  absl::MutexLock lock(&mu_);
  worker_id_ = std::move(id);
}

std::optional<uint64_t> WorkerCore::idOf(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return std::nullopt;
  return it->second.id;
}

void WorkerCore::forget(uint64_t id) {
  auto it = names_.find(id);
  if (it == names_.end()) return;
  if (auto r = requests_.find(it->second); r != requests_.end() && r->second.id == id) {
    giveStaging(r->second);
    requests_.erase(r);
  }
  names_.erase(it);
}

void WorkerCore::giveStaging(Request& request) {
  if (receive_staging_) receive_staging_->give(request.staging);
  request.staging.clear();
}

void WorkerCore::abortPrefill(uint64_t id, const absl::Status& why) {
  auto it = prefills_.find(id);
  if (it == prefills_.end()) return;
  it->second.set_value(why);
  prefills_.erase(it);
}

absl::StatusOr<WorkerCore::CacheScope> WorkerCore::scopeOf(const std::string& name,
                                                           const std::string& salt) const {
  if (salt.size() > engine::kMaxCacheSaltBytes) {
    return absl::InvalidArgumentError(absl::StrCat("cache_salt has ", salt.size(),
                                                   " bytes; at most ", engine::kMaxCacheSaltBytes));
  }
  if (name.empty()) return CacheScope{.salt = salt};
  const int32_t index = model_.adapterIndex(name);
  if (index >= 0) return CacheScope{.adapter = index, .salt = salt};
  std::vector<std::string> loaded;
  for (const auto& adapter : model_.adapters()) loaded.push_back(adapter->name);
  return absl::NotFoundError(absl::StrCat("LoRA adapter '", name, "' is not loaded here (",
                                          loaded.empty() ? "none is" : absl::StrJoin(loaded, ", "),
                                          "; see --lora-modules)"));
}

absl::StatusOr<v1::ReserveResponse> WorkerCore::reserve(const v1::ReserveRequest& r,
                                                        grpc::ServerContext* context) {
  const model::ModelConfig& c = model_.config();
  if (r.request_id().empty()) return invalid("request_id is empty");
  if (r.router_id().empty()) return invalid("router_id is empty");
  if (r.prompt_tokens() < 1) return invalid("prompt_tokens must be >= 1");
  if (r.max_new_tokens() < 1) return invalid("max_new_tokens must be >= 1");
  const int64_t total = int64_t{r.prompt_tokens()} + r.max_new_tokens();
  if (total > c.max_position_embeddings) {
    return invalid(absl::StrCat("prompt_tokens + max_new_tokens = ", total,
                                " is past the context length ", c.max_position_embeddings));
  }
  const int64_t needed = (total + model_.blockSize() - 1) / model_.blockSize();
  if (r.num_blocks() < needed) {
    return invalid(absl::StrCat("num_blocks ", r.num_blocks(), " does not cover ", total,
                                " tokens (", needed, " blocks)"));
  }
  const std::vector<uint32_t> prompt(r.prompt_token_ids().begin(), r.prompt_token_ids().end());
  if (!prompt.empty() && prompt.size() != r.prompt_tokens()) {
    return invalid(absl::StrCat("prompt_token_ids has ", prompt.size(), " ids; prompt_tokens is ",
                                r.prompt_tokens()));
  }
  for (uint32_t t : prompt) {
    if (t >= c.vocab_size) {
      return invalid(absl::StrCat("prompt_token_ids: token id ", t, " is outside the vocabulary (",
                                  c.vocab_size, ")"));
    }
  }
  CLEAVE_ASSIGN_OR_RETURN(const CacheScope scope, scopeOf(r.adapter(), r.cache_salt()));
  uint64_t id;
  bool repeated;
  std::vector<int32_t> staging;  // A repeated Reserve's rows, or the ones taken below.
  int64_t cached = 0;            // Leading blocks from the prefix cache.
  int32_t state_slot = -1;       // Its linear-attention state slot, for such a model.
  {
    absl::MutexLock lock(&mu_);
    auto it = requests_.find(r.request_id());
    repeated = it != requests_.end();
    id = repeated ? it->second.id : next_id_++;
    if (repeated && it->second.ending) {
      // Its blocks may be fenced: never named again.
      return absl::AbortedError(
          absl::StrCat("request ", r.request_id(), " is being released; reserve it again after"));
    }
    if (repeated) {
      // Its staging rows went back when it started decoding: nothing is left to name.
      if (receive_staging_ && it->second.decoding) {
        return absl::FailedPreconditionError(
            absl::StrCat("request ", r.request_id(), " is already decoding"));
      }
      staging = it->second.staging;
      cached = it->second.cached_blocks;
    }
  }
  const bool takes_rows = receive_staging_ && !repeated;
  if (takes_rows) {
    // The prompt's rows first (waiting for them holds nothing of the pool); they free up as
    // the transfers before it start decoding.
    absl::StatusOr<std::vector<int32_t>> rows =
        takeRows(*receive_staging_,
                 (int64_t{r.prompt_tokens()} + model_.blockSize() - 1) / model_.blockSize(),
                 context, options_.transfer_timeout);
    if (!rows.ok()) return rows.status();
    staging = std::move(*rows);
  }
  absl::StatusOr<std::vector<int32_t>> blocks = loop_->call([&](engine::Scheduler& s) {
    int64_t taken = 0;
    auto reserved = s.reserve(id, r.num_blocks(), prompt, &taken, scope.adapter, scope.salt);
    if (!repeated) cached = taken;
    state_slot = s.reservedState(id);
    return reserved;
  });
  if (!blocks.ok()) {
    if (takes_rows) receive_staging_->give(staging);
    return blocks.status();
  }
  // Released, or reserved by a concurrent call, while this one waited; or the router gave
  // up on this call (its Release may have come before this entry).
  bool lost = !repeated && context != nullptr && context->IsCancelled();
  {
    absl::MutexLock lock(&mu_);
    auto it = requests_.find(r.request_id());
    lost =
        lost || (repeated ? it == requests_.end() || it->second.id != id : it != requests_.end());
    if (!lost) {
      const auto ttl = r.has_ttl_ms() && r.ttl_ms() > 0 ? std::chrono::milliseconds(r.ttl_ms())
                                                        : options_.lease_timeout;
      Request& entry = requests_[r.request_id()];
      entry.id = id;
      entry.router_id = r.router_id();
      if (takes_rows) entry.staging = staging;
      entry.cached_blocks = cached;
      entry.prompt_blocks =
          (int64_t{r.prompt_tokens()} + model_.blockSize() - 1) / model_.blockSize();
      entry.expires = Clock::now() + ttl;
      // Past year 2096 (or nonsense) is no deadline: the clock's nanoseconds would overflow.
      if (r.deadline_unix_ms() > 0 && r.deadline_unix_ms() < int64_t{4'000'000'000'000}) {
        entry.deadline =
            std::chrono::system_clock::time_point(std::chrono::milliseconds(r.deadline_unix_ms()));
      }
      names_[id] = r.request_id();
      // A router reserving has a stream or is opening one: its silence counts from now.
      Stream& stream = streams_[r.router_id()];
      if (!stream.open) stream.closed_at = Clock::now();
    }
  }
  if (lost) {
    if (takes_rows) receive_staging_->give(staging);
    // A fresh reservation is this call's to free; a repeated one's, whoever ended it.
    if (!repeated) loop_->call([&](engine::Scheduler& s) { return s.release(id); });
    return absl::AbortedError(
        absl::StrCat("request ", r.request_id(),
                     " was released, reserved again or its call cancelled during Reserve"));
  }
  // Where a prefill worker writes: the staging rows of the prompt, or the pool's blocks.
  v1::ReserveResponse response;
  for (int32_t b : receive_staging_ ? staging : *blocks)
    response.add_block_ids(static_cast<uint32_t>(b));
  response.set_cached_blocks(static_cast<uint32_t>(cached));
  if (state_slot >= 0) response.set_state_slot(static_cast<uint32_t>(state_slot));
  if (!repeated) metrics_.onReserveCached(cached);
  return response;
}

absl::StatusOr<engine::TokenEvent> WorkerCore::runPrefill(uint64_t id,
                                                          const engine::GenerationRequest& request,
                                                          grpc::ServerContext* context) {
  std::future<PrefillResult> done;
  {
    absl::MutexLock lock(&mu_);
    done = prefills_[id].get_future();
  }
  absl::Status added = loop_->call([&](engine::Scheduler& s) { return s.addPrefill(request); });
  if (!added.ok()) {
    absl::MutexLock lock(&mu_);
    prefills_.erase(id);
    return added;
  }
  while (done.wait_for(std::chrono::milliseconds(20)) != std::future_status::ready) {
    if (context != nullptr && context->IsCancelled()) {
      loop_->call([&](engine::Scheduler& s) { return s.cancel(id); });
      absl::MutexLock lock(&mu_);
      abortPrefill(id, absl::CancelledError("the prefill call was cancelled"));
      forget(id);
    }
  }
  return done.get();
}

absl::Status WorkerCore::sendPrompt(uint64_t id, const v1::KvDestination& destination,
                                    grpc::ServerContext* context, const std::atomic<bool>& stop,
                                    uint64_t& bytes) {
  auto stopped = [&] { return stop.load() || (context != nullptr && context->IsCancelled()); };
  // Within the call's deadline too: past it the router may hand the blocks to another request.
  auto timeout = [&] {
    std::chrono::milliseconds left = options_.transfer_timeout;
    if (context != nullptr && context->deadline() != std::chrono::system_clock::time_point::max()) {
      left = std::min(left, std::chrono::duration_cast<std::chrono::milliseconds>(
                                context->deadline() - std::chrono::system_clock::now()));
    }
    return std::max(left, std::chrono::milliseconds(0));
  };
  const std::vector<int32_t> blocks =
      loop_->call([&](engine::Scheduler& s) { return s.reservation(id); });
  const std::vector<uint32_t> remote(destination.block_ids().begin(),
                                     destination.block_ids().end());
  if (remote.size() != blocks.size()) {
    return absl::InvalidArgumentError(absl::StrCat("destination.block_ids has ", remote.size(),
                                                   " blocks; the prompt fills ", blocks.size()));
  }
  // The decode worker's cache holds the leading skip_blocks already.
  const size_t skip = destination.skip_blocks();
  if (skip >= blocks.size()) {
    return absl::InvalidArgumentError(absl::StrCat("destination.skip_blocks ", skip,
                                                   " leaves none of the prompt's ", blocks.size(),
                                                   " blocks to write"));
  }
  // The CPU model's cache is what the transport reads.
  if (!send_staging_) {
    CLEAVE_RETURN_IF_ERROR(sendKv(destination, std::span<const int32_t>(blocks).subspan(skip),
                                  std::span<const uint32_t>(remote).subspan(skip), bytes, stopped,
                                  timeout()));
    return sendState(id, destination, bytes, stopped, timeout());
  }
  // A backend with its own cache (a GPU) copies the prompt out through the send rows, as
  // many blocks at a time as they hold.
  const size_t chunk = static_cast<size_t>(send_staging_->size());
  for (size_t at = skip; at < blocks.size(); at += chunk) {
    const size_t n = std::min(chunk, blocks.size() - at);
    if (stopped()) return absl::AbortedError("the KV transfer was stopped");
    CLEAVE_ASSIGN_OR_RETURN(
        std::vector<int32_t> rows,
        takeRows(*send_staging_, static_cast<int64_t>(n), context, options_.transfer_timeout));
    absl::Cleanup give_back = [&] { send_staging_->give(rows); };
    const std::span<const int32_t> part(blocks.data() + at, n);
    CLEAVE_RETURN_IF_ERROR(loop_->call(
        [&](engine::Scheduler&) { return model_.copyKv(engine::KvCopy::kToHost, part, rows); }));
    CLEAVE_RETURN_IF_ERROR(sendKv(destination, rows,
                                  std::span<const uint32_t>(remote).subspan(at, n), bytes, stopped,
                                  timeout()));
  }
  return sendState(id, destination, bytes, stopped, timeout());
}

absl::Status WorkerCore::sendState(uint64_t id, const v1::KvDestination& destination,
                                   uint64_t& bytes, const std::function<bool()>& stop,
                                   std::chrono::milliseconds timeout) {
  const model::ModelConfig& c = model_.config();
  if (!c.linear_attention) return absl::OkStatus();
  const int64_t layers = c.linearLayers();
  const int64_t group_bytes = engine::gatedDeltaNetGroupFloats(*c.linear_attention) * 4;
  // The peer's numbers, checked before any byte moves.
  CLEAVE_ASSIGN_OR_RETURN(
      const std::vector<RemoteStateLayout> remotes,
      remoteStateLayouts(destination, c.linear_attention->key_heads, layers, group_bytes));
  const int32_t slot = loop_->call([&](engine::Scheduler& s) { return s.reservedState(id); });
  if (slot < 0) return absl::InternalError("the prefilled prompt holds no state slot");
  // A backend with its own states (a GPU) copies the slot out first.
  CLEAVE_RETURN_IF_ERROR(loop_->call(
      [&](engine::Scheduler&) { return model_.copyState(engine::KvCopy::kToHost, slot); }));
  for (int r = 0; r < model_.tp(); ++r) {
    const float* local = model_.states(r) + slot * model_.stateFloats(r);
    for (int i = 0; i < destination.ranks_size(); ++i) {
      const v1::RankEndpoint& rank = destination.ranks(i);
      CLEAVE_RETURN_IF_ERROR(writeToRank(*options_.transport,
                                         {.peer_address = rank.worker_address(),
                                          .base = rank.state_base(),
                                          .key = rank.state_rkey(),
                                          .bytes = rank.state_bytes()},
                                         stateWrites(local, model_.linearKeyHeads(r), remotes[i],
                                                     destination.state_slot(), layers, group_bytes),
                                         "state", destination.decode_worker_id(), rank.rank(),
                                         bytes, stop, timeout));
    }
  }
  return absl::OkStatus();
}

absl::Status WorkerCore::sendKv(const v1::KvDestination& destination,
                                std::span<const int32_t> local, std::span<const uint32_t> remote,
                                uint64_t& bytes, const std::function<bool()>& stop,
                                std::chrono::milliseconds timeout) {
  faults::delay("kv_send_delay_ms");
  if (faults::fire("kv_send_fail")) return absl::UnavailableError("injected fault kv_send_fail");
  // A writer nothing stops: as writes queued before a process froze, which land when it
  // resumes, whatever the router and the call decided meanwhile.
  const std::function<bool()> never = [] { return false; };
  const bool unstoppable = faults::fire("kv_send_unstoppable");
  const std::function<bool()>& stop_if = unstoppable ? never : stop;
  if (unstoppable) timeout = std::chrono::minutes(1);
  const bool replicated = model::kvCacheShape(model_.config()).replicated;
  for (int r = 0; r < model_.tp(); ++r) {
    for (int j = 0; j < destination.ranks_size(); ++j) {
      if (!sendsToRank(replicated, r, model_.tp(), j)) continue;
      const v1::RankEndpoint& rank = destination.ranks(j);
      const int64_t heads = int64_t{rank.kv_head_end()} - rank.kv_head_begin();
      if (heads <= 0 || rank.block_bytes() == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("destination rank ", rank.rank(), " has no KV heads or no pool"));
      }
      RemoteRankLayout target{
          .head_begin = rank.kv_head_begin(),
          .heads = heads,
          .num_blocks = static_cast<int64_t>(rank.kv_pool_bytes() / rank.block_bytes())};
      // A peer's numbers, checked before any byte moves: a block past its pool would land
      // in another layer's rows.
      if (int64_t{rank.kv_head_end()} > destination.layout().num_kv_heads() ||
          target.num_blocks < 1 || target.num_blocks > (int64_t{1} << 31)) {
        return absl::InvalidArgumentError(
            absl::StrCat("destination rank ", rank.rank(), " has heads [", rank.kv_head_begin(),
                         ", ", rank.kv_head_end(), ") of ", destination.layout().num_kv_heads(),
                         " and a pool of ", target.num_blocks, " blocks"));
      }
      for (uint32_t block : remote) {
        if (block >= target.num_blocks) {
          return absl::InvalidArgumentError(absl::StrCat("destination block ", block,
                                                         " is outside rank ", rank.rank(),
                                                         "'s pool of ", target.num_blocks));
        }
      }
      CLEAVE_RETURN_IF_ERROR(
          writeToRank(*options_.transport,
                      {.peer_address = rank.worker_address(),
                       .base = rank.kv_pool_base(),
                       .key = rank.kv_pool_rkey(),
                       .bytes = rank.kv_pool_bytes()},
                      kvWrites(model_.kv(r), model_.kvHeads(r), target, local, remote), "KV",
                      destination.decode_worker_id(), rank.rank(), bytes, stop_if, timeout));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> WorkerCore::reservePrefillBlocks(
    uint64_t id, std::span<const uint32_t> prompt, bool cached, const CacheScope& scope,
    grpc::ServerContext* context) {
  const int64_t blocks =
      (static_cast<int64_t>(prompt.size()) + model_.blockSize() - 1) / model_.blockSize();
  while (true) {
    int64_t total = 0;
    absl::StatusOr<std::vector<int32_t>> reserved =
        loop_->call([&](engine::Scheduler& s) -> absl::StatusOr<std::vector<int32_t>> {
          total = s.cache().totalBlocks();
          return s.reserve(id, blocks, cached ? prompt : std::span<const uint32_t>(), nullptr,
                           scope.adapter, scope.salt);
        });
    // Blocks held by prompts computing or being sent free up soon; a prompt larger than
    // the pool never fits.
    if (reserved.ok() || reserved.status().code() != absl::StatusCode::kResourceExhausted ||
        blocks > total || context == nullptr || context->IsCancelled() ||
        std::chrono::system_clock::now() + std::chrono::milliseconds(5) >= context->deadline()) {
      return reserved;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

absl::StatusOr<v1::PrefillResponse> WorkerCore::prefill(const v1::PrefillRequest& r,
                                                        grpc::ServerContext* context) {
  const auto start = std::chrono::steady_clock::now();
  bool local;
  {
    absl::MutexLock lock(&mu_);
    local = r.destination().decode_worker_id() == worker_id_;
  }
  if (!local && !options_.prefills_for_peers) {
    return absl::FailedPreconditionError(
        "this is a decode worker: it prefills only prompts it decodes itself; send the prompt "
        "to a worker started with --role=prefill or --role=both");
  }
  using google::protobuf::util::MessageDifferencer;
  if (!local && !MessageDifferencer::Equals(r.destination().layout(), options_.layout)) {
    return absl::FailedPreconditionError(
        absl::StrCat("destination KV layout [", r.destination().layout().ShortDebugString(),
                     "] differs from this worker's [", options_.layout.ShortDebugString(), "]"));
  }
  if (!local && model_.config().linear_attention && !r.destination().has_state_slot()) {
    return absl::InvalidArgumentError(
        "destination.state_slot is required: the model's linear-attention layers keep a state "
        "per sequence (ReserveResponse.state_slot)");
  }
  if (!local && options_.transport == nullptr) {
    return absl::FailedPreconditionError(
        "this worker has no KV transport, so it can only prefill for itself");
  }
  CLEAVE_ASSIGN_OR_RETURN(const CacheScope scope, scopeOf(r.adapter(), r.cache_salt()));
  std::optional<uint64_t> id = idOf(r.request_id());
  if (local && !id) {
    return absl::NotFoundError(
        absl::StrCat("request ", r.request_id(), " has no KV reservation on this worker"));
  }
  if (local && receive_staging_) {
    // Computed in its own blocks here, the prompt is never written into its staging rows.
    absl::MutexLock lock(&mu_);
    if (auto it = requests_.find(r.request_id()); it != requests_.end()) giveStaging(it->second);
  }
  if (!local) {
    // The prompt is computed into blocks of this worker's own, then written out.
    {
      absl::MutexLock lock(&mu_);
      auto [it, fresh] = requests_.try_emplace(r.request_id(), Request{.id = next_id_});
      if (!fresh)
        return absl::AlreadyExistsError(absl::StrCat("request ", r.request_id(), " is running"));
      id = next_id_++;
      names_[*id] = r.request_id();
    }
    // A scored prompt is computed whole: no cached blocks for it.
    absl::StatusOr<std::vector<int32_t>> reserved = reservePrefillBlocks(
        *id, {r.prompt_token_ids().data(), static_cast<size_t>(r.prompt_token_ids_size())},
        !r.has_prompt_logprobs(), scope, context);
    if (!reserved.ok()) {
      absl::MutexLock lock(&mu_);
      forget(*id);
      return reserved.status();
    }
  }
  absl::StatusOr<engine::GenerationRequest> request =
      toEngineRequest(*id, partsOf(r), options_.eos_ids, model_.config().max_position_embeddings);
  if (request.ok() && r.has_prompt_logprobs()) {
    if (r.prompt_logprobs() > engine::kMaxLogprobs)
      request = invalid(absl::StrCat("prompt_logprobs must be at most ", engine::kMaxLogprobs));
    else
      request->prompt_logprobs = static_cast<int32_t>(r.prompt_logprobs());
  }
  if (request.ok()) scope.applyTo(*request);
  absl::StatusOr<engine::TokenEvent> first =
      request.ok() ? runPrefill(*id, *request, context) : request.status();
  v1::PrefillResponse response;
  if (first.ok() && local) {
    absl::MutexLock lock(&mu_);
    if (auto it = requests_.find(r.request_id()); it != requests_.end())
      it->second.prefilled_here = true;
  }
  if (first.ok() && !local && !first->finished) {
    // Hand the prompt's KV to the decode worker, then free the local copy. Until the
    // writes end, cancel() may stop them and waits for that.
    const auto sent_at = std::chrono::steady_clock::now();
    uint64_t bytes = 0;
    faults::crashPoint("prefill_before_kv_send");
    std::atomic<bool> stop{false};
    absl::Status sent = absl::AbortedError("the prefill was cancelled before its KV was sent");
    bool registered = false;
    {
      absl::MutexLock lock(&mu_);
      // Not once cancel() claimed it: it returns without waiting for a sender.
      if (auto it = requests_.find(r.request_id());
          it != requests_.end() && it->second.id == *id && !it->second.ending) {
        it->second.stop_sending = &stop;
        registered = true;
      }
    }
    if (registered) {
      sent = sendPrompt(*id, r.destination(), context, stop, bytes);
      absl::MutexLock lock(&mu_);
      if (auto it = requests_.find(r.request_id()); it != requests_.end() && it->second.id == *id)
        it->second.stop_sending = nullptr;
    }
    if (!sent.ok()) first = sent;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - sent_at).count();
    metrics_.onKvSent(bytes, seconds, sent.ok());
    response.set_kv_transfer_ms(seconds * 1e3);
    response.set_bytes_transferred(bytes);
  }
  if (!local) releaseId(*id);
  if (!first.ok()) return first.status();
  response.set_first_token_id(first->token);
  response.set_cached_prompt_tokens(static_cast<uint32_t>(first->cached_tokens));
  if (r.has_logprobs()) *response.mutable_first_logprob() = tokenLogprob(*first);
  for (const engine::SampledToken& scored : first->prompt_logprobs)
    *response.add_prompt_logprobs() = tokenLogprob(scored);
  if (first->finished) {
    response.set_finish_reason(finishReason(first->reason));
    response.set_matched_stop(first->matched_stop);
    absl::MutexLock lock(&mu_);
    forget(*id);  // The scheduler freed the reservation with the request.
  }
  response.set_prefill_ms(
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() -
      response.kv_transfer_ms());
  return response;
}

absl::StatusOr<v1::EmbedPromptResponse> WorkerCore::embed(const v1::EmbedPromptRequest& r,
                                                          grpc::ServerContext* context) {
  if (r.request_id().empty()) return invalid("request_id is empty");
  if (r.prompt_token_ids().empty()) return invalid("prompt_token_ids is empty");
  const model::ModelConfig& c = model_.config();
  for (uint32_t t : r.prompt_token_ids()) {
    if (t >= c.vocab_size) {
      return invalid(absl::StrCat("prompt_token_ids: token id ", t, " is outside the vocabulary (",
                                  c.vocab_size, ")"));
    }
  }
  if (static_cast<int64_t>(r.prompt_token_ids_size()) > int64_t{c.max_position_embeddings}) {
    return invalid(absl::StrCat("prompt_token_ids has ", r.prompt_token_ids_size(),
                                " ids; the context holds ", c.max_position_embeddings));
  }
  if (!model_.hiddenStates()) {
    return absl::UnimplementedError(
        "this worker's backend returns no hidden states, which embeddings need");
  }
  CLEAVE_ASSIGN_OR_RETURN(const CacheScope scope, scopeOf(r.adapter(), r.cache_salt()));
  uint64_t id;
  {
    absl::MutexLock lock(&mu_);
    auto [it, fresh] = requests_.try_emplace(r.request_id(), Request{.id = next_id_});
    if (!fresh)
      return absl::AlreadyExistsError(absl::StrCat("request ", r.request_id(), " is running"));
    id = next_id_++;
    names_[id] = r.request_id();
  }
  engine::GenerationRequest request{
      .id = id,
      .prompt = {r.prompt_token_ids().begin(), r.prompt_token_ids().end()},
      .stop = {.max_new_tokens = 1},
      .hidden_state = true};
  scope.applyTo(request);
  absl::StatusOr<std::vector<int32_t>> reserved =
      reservePrefillBlocks(id, request.prompt, /*cached=*/true, scope, context);
  absl::StatusOr<engine::TokenEvent> done =
      reserved.ok() ? runPrefill(id, request, context) : reserved.status();
  releaseId(id);  // Frees what the finished prefill left, and forgets it.
  if (!done.ok()) return done.status();
  v1::EmbedPromptResponse response;
  response.mutable_hidden()->Add(done->hidden.begin(), done->hidden.end());
  response.set_cached_prompt_tokens(static_cast<uint32_t>(done->cached_tokens));
  return response;
}

absl::Status WorkerCore::startDecode(const v1::StartDecodeRequest& r) {
  std::optional<uint64_t> id = idOf(r.request_id());
  if (!id) {
    return absl::NotFoundError(
        absl::StrCat("request ", r.request_id(), " has no KV reservation on this worker"));
  }
  CLEAVE_ASSIGN_OR_RETURN(const CacheScope scope, scopeOf(r.adapter(), r.cache_salt()));
  absl::StatusOr<engine::GenerationRequest> request =
      toEngineRequest(*id, partsOf(r), options_.eos_ids, model_.config().max_position_embeddings);
  if (!request.ok()) return request.status();
  scope.applyTo(*request);
  // Not when prefilled here, nor for a sequence already decoding (the scheduler refuses
  // that one; its rows must stay).
  bool copy_in = true;
  // The staging rows are this call's while it copies them in: a concurrent StartDecode
  // finds none.
  std::vector<int32_t> staging;
  int64_t cached = 0;  // Leading blocks the cache supplied: nothing to copy in.
  {
    absl::MutexLock lock(&mu_);
    if (auto it = requests_.find(r.request_id()); it != requests_.end() && it->second.id == *id) {
      if (it->second.ending || it->second.starting) {
        return absl::FailedPreconditionError(absl::StrCat(
            "request ", r.request_id(), " is being released, fenced or started by another call"));
      }
      it->second.starting = true;
      copy_in = !it->second.prefilled_here && !it->second.decoding;
      cached = it->second.cached_blocks;
      staging = std::move(it->second.staging);
      it->second.staging.clear();
      // Before the engine can step it: its first event may come before this call returns.
      if (!it->second.decoding) it->second.ready_at = Clock::now();
    }
  }
  absl::Status started = loop_->call([&](engine::Scheduler& s) -> absl::Status {
    if (copy_in) {
      // A transfer wrote the prompt's rows into the host rows (the staging rows, or the
      // pool's own blocks); a backend with its own cache (a GPU) takes them from there.
      std::vector<int32_t> blocks = s.reservation(*id);
      const size_t prompt_blocks = static_cast<size_t>(
          (static_cast<int64_t>(request->prompt.size()) + model_.blockSize() - 1) /
          model_.blockSize());
      blocks.resize(std::min(blocks.size(), prompt_blocks));
      if (!receive_staging_) {
        staging = blocks;
      } else if (staging.size() != blocks.size()) {
        return invalid(absl::StrCat("a prompt of ", request->prompt.size(), " tokens; Reserve ",
                                    "staged ", staging.size(), " blocks for its prompt_tokens"));
      }
      const size_t skip = std::min(static_cast<size_t>(cached), blocks.size());
      CLEAVE_RETURN_IF_ERROR(model_.copyKv(engine::KvCopy::kFromHost,
                                           std::span<const int32_t>(blocks).subspan(skip),
                                           std::span<const int32_t>(staging).subspan(skip)));
      // And the linear-attention state the transfer wrote into the reservation's slot.
      if (model_.stateSlots() > 0)
        CLEAVE_RETURN_IF_ERROR(model_.copyState(engine::KvCopy::kFromHost, s.reservedState(*id)));
    }
    return s.startDecode(*request, r.first_token_id());
  });
  {
    absl::MutexLock lock(&mu_);
    auto it = requests_.find(r.request_id());
    if (it != requests_.end() && it->second.id != *id) it = requests_.end();  // Another since.
    if (it != requests_.end()) it->second.starting = false;
    if (started.ok() && it != requests_.end()) it->second.decoding = true;
    if (receive_staging_) {
      if (!started.ok() && it != requests_.end() && it->second.staging.empty()) {
        it->second.staging = std::move(staging);  // Still the request's: a retry copies them.
      } else {
        receive_staging_->give(staging);  // Copied in, never needed, or the request is gone.
      }
    }
  }
  return started;
}

v1::ReleaseResponse WorkerCore::release(const v1::ReleaseRequest& request) {
  v1::ReleaseResponse response;
  std::optional<uint64_t> id = idOf(request.request_id());
  if (!id) return response;
  if (request.writer_may_be_active()) {
    bool busy = false;  // Decoding, or being started: freed below.
    if (std::optional<int64_t> blocks = fence(*id, &busy)) {
      response.set_blocks_fenced(static_cast<uint32_t>(*blocks));
      response.set_fenced_ms(static_cast<uint32_t>(options_.quarantine.count()));
      return response;
    }
    if (!busy) return response;  // Gone, or another call's (freed or fenced) already.
  }
  response.set_blocks_freed(releaseId(*id));
  return response;
}

WorkerCore::Request* WorkerCore::requestOf(uint64_t id) {
  auto name = names_.find(id);
  if (name == names_.end()) return nullptr;
  auto it = requests_.find(name->second);
  return it != requests_.end() && it->second.id == id ? &it->second : nullptr;
}

std::optional<int64_t> WorkerCore::fence(uint64_t id, bool* busy) {
  int64_t prompt_blocks;
  {
    absl::MutexLock lock(&mu_);
    Request* r = requestOf(id);
    if (busy != nullptr) *busy = r != nullptr && !r->ending && (r->decoding || r->starting);
    if (r == nullptr || r->decoding || r->starting || r->ending) return std::nullopt;
    r->ending = true;  // Ours now: no release, fence or StartDecode takes it.
    prompt_blocks = r->prompt_blocks;
  }
  const int64_t blocks = loop_->call([&](engine::Scheduler& s) {
    s.stop(id);                 // A prompt this worker computes into it stops.
    s.trim(id, prompt_blocks);  // No writer was told of the blocks past the prompt's.
    return static_cast<int64_t>(s.reservation(id).size());
  });
  {
    absl::MutexLock lock(&mu_);
    Request* held = requestOf(id);  // Still there: it was ours to end.
    abortPrefill(id, absl::AbortedError("the reservation was released"));
    fenced_.push_back(
        Fenced{.id = id,
               .staging = held ? std::exchange(held->staging, {}) : std::vector<int32_t>(),
               .until = Clock::now() + options_.quarantine});
    forget(id);
  }
  reportFenced();  // The gauge first: who sees the count of fences sees their blocks.
  metrics_.onFenced();
  return blocks;
}

std::vector<uint64_t> WorkerCore::fencedIds() const {
  std::vector<uint64_t> ids;
  for (const Fenced& f : fenced_) ids.push_back(f.id);
  return ids;
}

void WorkerCore::reportFenced() {
  std::vector<uint64_t> ids;
  {
    absl::MutexLock lock(&mu_);
    ids = fencedIds();
  }
  const int64_t held = loop_->call([&](engine::Scheduler& s) { return s.heldOnlyBy(ids); });
  fenced_blocks_.store(held);
  metrics_.setFencedBlocks(held);
}

void WorkerCore::endQuarantines() {
  std::vector<Fenced> over;
  {
    absl::MutexLock lock(&mu_);
    const auto now = Clock::now();
    auto done = [&](const Fenced& f) { return f.until <= now; };
    for (Fenced& f : fenced_) {
      if (done(f)) over.push_back(std::move(f));
    }
    if (over.empty()) return;
    std::erase_if(fenced_, done);
  }
  loop_->call([&](engine::Scheduler& s) {
    for (const Fenced& f : over) s.release(f.id);
    return 0;
  });
  {
    absl::MutexLock lock(&mu_);
    for (Fenced& f : over) {
      if (receive_staging_) receive_staging_->give(f.staging);
    }
  }
  reportFenced();
}

void WorkerCore::stopSending(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto sending = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto name = names_.find(id);
    if (name == names_.end()) return false;
    auto it = requests_.find(name->second);
    return it != requests_.end() && it->second.id == id && it->second.stop_sending != nullptr;
  };
  if (!sending()) return;
  requests_[names_[id]].stop_sending->store(true);
  auto stopped = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !sending(); };
  mu_.Await(absl::Condition(&stopped));
}

bool WorkerCore::claim(uint64_t id) {
  absl::MutexLock lock(&mu_);
  Request* r = requestOf(id);
  // Unknown (forgotten: freed, or fenced with its blocks held), or another call's to end.
  if (r == nullptr || r->ending) return false;
  r->ending = true;
  return true;
}

uint32_t WorkerCore::releaseId(uint64_t id) {
  if (!claim(id)) return 0;
  stopSending(id);
  const int64_t freed = loop_->call([&](engine::Scheduler& s) { return s.release(id); });
  absl::MutexLock lock(&mu_);
  abortPrefill(id, absl::AbortedError("the reservation was released"));
  forget(id);
  return static_cast<uint32_t>(freed);
}

bool WorkerCore::cancel(const std::string& request_id) {
  std::optional<uint64_t> id = idOf(request_id);
  if (!id || !claim(*id)) return false;
  stopSending(*id);
  const bool found = loop_->call([&](engine::Scheduler& s) { return s.cancel(*id); });
  absl::MutexLock lock(&mu_);
  abortPrefill(*id, absl::AbortedError("the request was cancelled"));
  auto it = requests_.find(request_id);
  if (found && it != requests_.end() && !it->second.router_id.empty()) {
    // The sequence's last event says it was cancelled.
    v1::TokenEvents message;
    v1::SequenceEvent* event = message.add_events();
    event->set_request_id(request_id);
    event->set_finish_reason(v1::FINISH_REASON_CANCELLED);
    streams_[it->second.router_id].pending.push_back(std::move(message));
  }
  forget(*id);
  return found;
}

std::optional<double> WorkerCore::floorOf(const StepReport& report) const {
  if (!report.stepped || !options_.hardware || report.work.tokens <= 0) return std::nullopt;
  // Ranks sharing this machine: the floor of the whole group's bytes and FLOPs. A rank per
  // device: the largest rank's (rank 0's) share on one, and the collectives between them.
  const bool own = options_.rank_per_device;
  double weight_bytes = 0, routed = 0;
  for (int r = 0; r < (own ? 1 : model_.tp()); ++r) {
    weight_bytes += static_cast<double>(model_.weightBytes(r));
    routed += static_cast<double>(model_.routedExpertBytes(r));
  }
  absl::StatusOr<roofline::Terms> floor = roofline::stepFloor(
      model_.config(), *options_.hardware,
      {.tp = own ? model_.tp() : 1,
       .sequences = report.batch_size,
       .new_tokens = report.work.tokens,
       .attended = report.work.attended,
       .kv_positions = report.work.kv_positions,
       .windowed_attended = report.work.windowed_attended,
       .windowed_kv_positions = report.work.windowed_kv_positions,
       .weight_bytes = weight_bytes,
       .routed_expert_bytes = routed,
       .bytes_per_kv = static_cast<double>(cpu::kvElementBytes(model_.kvType())),
       .float_products = model_.floatProducts()});
  if (!floor.ok()) return std::nullopt;
  return floor->floor_seconds;
}

void WorkerCore::onStep(StepReport& report) {
  metrics_.onStep(report, floorOf(report));
  // decode_crash_after_steps=N: the N-th step with sequences decoding is the last.
  if (report.stepped && report.decode_batch > 0 && faults::fire("decode_crash_after_steps") &&
      faults::value("decode_crash_after_steps") == 0) {
    faults::crash("decode_crash_after_steps");
  }
  absl::MutexLock lock(&mu_);
  pool_load_.set_running(static_cast<uint32_t>(report.running_sequences));
  pool_load_.set_waiting(static_cast<uint32_t>(report.waiting_requests));
  pool_load_.set_kv_blocks_free(static_cast<uint32_t>(report.free_blocks));
  pool_load_.set_kv_blocks_reserved(static_cast<uint32_t>(report.reserved_blocks));
  std::unordered_map<std::string, v1::TokenEvents> out;
  // A sequence's tokens of one step (accepted drafts: several, one after another) go out as
  // one SequenceEvent, so the router spreads the step's time over them.
  uint64_t last_id = 0;
  v1::SequenceEvent* last = nullptr;
  for (engine::TokenEvent& event : report.events) {
    if (event.prefilled) {
      // Its call waits by engine id, whether or not the request was released meanwhile
      // (then it finds nothing left to send).
      auto pending = prefills_.find(event.id);
      if (pending != prefills_.end()) {
        pending->second.set_value(event);
        prefills_.erase(pending);
      }
      continue;  // prefill() forgets a request its first token finished.
    }
    auto name = names_.find(event.id);
    if (name == names_.end()) continue;  // Released while the step ran.
    Request& request = requests_.at(name->second);
    v1::SequenceEvent* e = last != nullptr && last_id == event.id ? last : nullptr;
    if (e == nullptr) {
      e = out[request.router_id].add_events();
      e->set_request_id(name->second);
    }
    last_id = event.id;
    last = e;
    if (!request.decode_started) {
      request.decode_started = true;
      const double waited_us =
          std::chrono::duration<double, std::micro>(Clock::now() - request.ready_at).count() -
          report.step_time_us;
      e->set_batch_wait_us(static_cast<uint64_t>(std::max(0.0, waited_us)));
    }
    e->add_token_ids(event.token);
    if (event.logprob) *e->add_logprobs() = tokenLogprob(event);
    if (event.finished) {
      e->set_finish_reason(finishReason(event.reason));
      e->set_matched_stop(event.matched_stop);
      forget(event.id);
    }
  }
  for (auto& [router, message] : out) {
    message.set_step_index(report.step_index);
    message.set_batch_size(static_cast<uint32_t>(report.batch_size));
    message.set_step_time_us(static_cast<uint64_t>(report.step_time_us));
    streams_[router].pending.push_back(std::move(message));
  }
}

grpc::Status WorkerCore::streamTokens(const std::string& router_id, grpc::ServerContext* context,
                                      grpc::ServerWriter<v1::TokenEvents>* writer) {
  if (router_id.empty()) return {grpc::StatusCode::INVALID_ARGUMENT, "router_id is empty"};
  uint64_t me;
  {
    absl::MutexLock lock(&mu_);
    me = next_stream_++;
    streams_[router_id].owner = me;
    streams_[router_id].open = true;
  }
  // Whichever way the call ends, the router's silence counts from then.
  struct Closed {
    WorkerCore* self;
    std::string router;
    uint64_t me;
    ~Closed() {
      absl::MutexLock lock(&self->mu_);
      Stream& stream = self->streams_[router];
      if (stream.owner == me) {
        stream.open = false;
        stream.closed_at = Clock::now();
      }
    }
  } closed{this, router_id, me};
  while (!context->IsCancelled()) {
    std::deque<v1::TokenEvents> batch;
    {
      absl::MutexLock lock(&mu_);
      Stream& stream = streams_[router_id];
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !stream.pending.empty() || stream.owner != me;
      };
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(100));
      if (stream.owner != me) {
        return {grpc::StatusCode::ABORTED, "another token stream for this router replaced it"};
      }
      batch.swap(stream.pending);
    }
    for (v1::TokenEvents& message : batch) {
      if (!writer->Write(message)) return grpc::Status::CANCELLED;
    }
  }
  return grpc::Status::CANCELLED;
}

int64_t WorkerCore::heldRequests() {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(requests_.size());
}

v1::LoadSnapshot WorkerCore::load(const std::string& router_id) {
  // Requests of other routers, by engine id (their blocks are the engine's to count).
  std::vector<uint64_t> foreign;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, r] : requests_) {
      if (!r.router_id.empty() && r.router_id != router_id) foreign.push_back(r.id);
    }
    // Whoever fenced them, no router counts them.
    const std::vector<uint64_t> fenced = fencedIds();
    foreign.insert(foreign.end(), fenced.begin(), fenced.end());
  }
  const bool none_foreign = foreign.empty();
  // Run late (the caller gave up waiting), it still leaves its count for the next ones.
  std::optional<v1::LoadSnapshot> exact =
      loop_->callWithin(kLoadWait, [this, foreign = std::move(foreign)](engine::Scheduler& s) {
        v1::LoadSnapshot load;
        load.set_running(static_cast<uint32_t>(s.runningSequences()));
        load.set_waiting(static_cast<uint32_t>(s.waitingRequests()));
        load.set_kv_blocks_free(static_cast<uint32_t>(s.freeBlocks()));
        load.set_kv_blocks_reserved(static_cast<uint32_t>(s.reservedBlocks()));
        // A prefix this router's requests share too is not foreign.
        const int64_t held = s.heldOnlyBy(foreign);
        foreign_blocks_.store(held);
        load.set_kv_blocks_foreign(static_cast<uint32_t>(held));
        return load;
      });
  if (exact) return *exact;
  v1::LoadSnapshot load;
  {
    absl::MutexLock lock(&mu_);
    load = pool_load_;
  }
  // The larger of the last count and the fenced blocks counted since (a fence the last
  // count missed is not admitted into; one that ended is, a step late).
  load.set_kv_blocks_foreign(static_cast<uint32_t>(
      none_foreign ? 0 : std::max(foreign_blocks_.load(), fenced_blocks_.load())));
  return load;
}

}  // namespace cleave::worker
