#include "services/router/worker_pool.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/grpc_keepalive.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/retry_hint.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/create_channel.h"

namespace cleave::router {

bool Worker::servesDecode() const {
  return info.role() == v1::WORKER_ROLE_DECODE || info.role() == v1::WORKER_ROLE_BOTH;
}
bool Worker::servesPrefill() const {
  return info.role() == v1::WORKER_ROLE_PREFILL || info.role() == v1::WORKER_ROLE_BOTH;
}

namespace {

absl::Status checkRegistration(const v1::RegisterRequest& r) {
  auto bad = [](const std::string& m) { return absl::InvalidArgumentError(m); };
  if (r.role() == v1::WORKER_ROLE_UNSPECIFIED) return bad("role is unspecified");
  if (r.tp_size() < 1) return bad("tp_size must be >= 1");
  if (r.ranks_size() != static_cast<int>(r.tp_size()))
    return bad(absl::StrCat("ranks has ", r.ranks_size(), " entries, tp_size is ", r.tp_size()));
  if (!r.has_model() || r.model().model_id().empty() || r.model().sha256().size() != 64)
    return bad("model needs a model_id and a 64-character sha256");
  if (r.model().vocab_size() < 1 || r.model().context_length() < 1)
    return bad("model.vocab_size and model.context_length must be >= 1");
  for (const v1::LoraAdapterFingerprint& a : r.model().adapters()) {
    if (a.name().empty() || a.name() == r.model().model_id() || a.sha256().size() != 64)
      return bad("model.adapters need a name other than the model's and a 64-character sha256");
  }
  const v1::KvLayout& kv = r.kv_layout();
  if (kv.dtype() == v1::KV_DTYPE_UNSPECIFIED || kv.block_size() < 1 || kv.num_layers() < 1 ||
      kv.num_kv_heads() < 1 || kv.head_dim() < 1)
    return bad("kv_layout needs a dtype and block_size, num_layers, num_kv_heads, head_dim >= 1");
  const bool decodes = r.role() != v1::WORKER_ROLE_PREFILL;
  if (decodes && (r.kv_capacity().total_blocks() < 1 || r.kv_capacity().target_concurrency() < 1))
    return bad("a decode worker needs kv_capacity.total_blocks and target_concurrency >= 1");
  if (r.control_address().empty()) return bad("control_address is empty");
  return absl::OkStatus();
}

// The `outcome` label of cleave_router_admissions_total for admit()'s status.
const char* admissionOutcome(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk: return "admitted";
    case absl::StatusCode::kUnavailable: return "no_decode_worker";
    case absl::StatusCode::kInvalidArgument: return "too_large";
    case absl::StatusCode::kResourceExhausted: return "queue_full";
    case absl::StatusCode::kDeadlineExceeded: return "deadline";
    case absl::StatusCode::kCancelled: return "cancelled";
    default: return "other";
  }
}

// A worker's LoRA adapters as "name:sha256" in name order.
std::vector<std::string> adapterSet(const v1::ModelFingerprint& model) {
  std::vector<std::string> set;
  for (const v1::LoraAdapterFingerprint& a : model.adapters())
    set.push_back(absl::StrCat(a.name(), ":", a.sha256().substr(0, 12)));
  std::sort(set.begin(), set.end());
  return set;
}

bool contains(const std::vector<std::string>& ids, const std::string& id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

}  // namespace

WorkerPool::WorkerPool(WorkerPoolOptions options,
                       std::function<void(std::shared_ptr<const Worker>)> on_join,
                       std::function<void(const std::string&)> on_leave)
    : options_(options),
      on_join_(std::move(on_join)),
      on_leave_(std::move(on_leave)),
      queue_gauge_(plainGauge("cleave_router_queue_depth", "Requests waiting for admission")),
      reserved_gauge_(plainGauge("cleave_router_reserved_blocks",
                                 "KV blocks reserved for admitted requests on all decode workers")),
      admitted_gauge_(plainGauge("cleave_router_admitted_requests",
                                 "Requests holding KV blocks on some decode worker")),
      workers_gauge_(plainGauge("cleave_router_workers", "Registered workers")),
      admissions_(prometheus::BuildCounter()
                      .Name("cleave_router_admissions_total")
                      .Help("Admission decisions by outcome (admitted or why not)")
                      .Register(metricsRegistry())),
      worker_admitted_(prometheus::BuildGauge()
                           .Name("cleave_router_worker_admitted_requests")
                           .Help("Requests holding KV blocks on each decode worker")
                           .Register(metricsRegistry())),
      worker_reserved_(prometheus::BuildGauge()
                           .Name("cleave_router_worker_reserved_blocks")
                           .Help("KV blocks the router reserved on each decode worker")
                           .Register(metricsRegistry())) {
  expiry_.start([this](std::stop_token stop) { expire(stop); });
}

WorkerPool::~WorkerPool() { expiry_.stop(); }

absl::StatusOr<v1::RegisterResponse> WorkerPool::add(const v1::RegisterRequest& request) {
  if (absl::Status valid = checkRegistration(request); !valid.ok()) return valid;
  absl::MutexLock membership(&membership_mu_);
  for (const v1::LoraAdapterFingerprint& a : request.model().adapters()) {
    if (contains(options_.served_model_names, a.name())) {
      return absl::FailedPreconditionError(
          absl::StrCat("LoRA adapter '", a.name(),
                       "' has a name this router serves the base model by "
                       "(--served-model-name); rename the adapter or the model"));
    }
  }
  auto worker = std::make_shared<Worker>();
  worker->info = request;
  worker->id = request.worker_id().empty() ? request.control_address() : request.worker_id();
  worker->info.set_worker_id(worker->id);
  auto channel = grpc::CreateCustomChannel(request.control_address(),
                                           options_.worker_credentials != nullptr
                                               ? options_.worker_credentials
                                               : grpc::InsecureChannelCredentials(),
                                           keepaliveChannelArguments());
  worker->decode = v1::DecodeControl::NewStub(channel);
  worker->prefill = v1::PrefillControl::NewStub(channel);
  bool replaced = false;
  std::vector<std::string> superseded;  // Earlier processes at this address.
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, other] : workers_) {
      if (id == worker->id) continue;
      const v1::RegisterRequest& o = other.worker->info;
      using google::protobuf::util::MessageDifferencer;
      if (o.model().model_id() != request.model().model_id()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "this router serves model '", o.model().model_id(), "' (worker ", id,
            "); a worker of '", request.model().model_id(), "' needs a router of its own"));
      }
      if (o.model().sha256() != request.model().sha256() ||
          !MessageDifferencer::Equals(o.kv_layout(), request.kv_layout())) {
        return absl::FailedPreconditionError(absl::StrCat(
            "model '", request.model().model_id(), "' differs from worker ", id, "'s: fingerprint ",
            request.model().sha256().substr(0, 12), " vs ", o.model().sha256().substr(0, 12),
            ", KV layout [", request.kv_layout().ShortDebugString(), "] vs [",
            o.kv_layout().ShortDebugString(), "]; load the same file on both"));
      }
      if (o.model().context_length() != request.model().context_length()) {
        return absl::FailedPreconditionError(
            absl::StrCat("this worker serves sequences of up to ", request.model().context_length(),
                         " tokens, worker ", id, " of up to ", o.model().context_length(),
                         "; start every worker with the same --max-model-len"));
      }
      if (adapterSet(o.model()) != adapterSet(request.model())) {
        return absl::FailedPreconditionError(absl::StrCat(
            "this worker's LoRA adapters [", absl::StrJoin(adapterSet(request.model()), ", "),
            "] differ from worker ", id, "'s [", absl::StrJoin(adapterSet(o.model()), ", "),
            "]; start every worker with the same --lora-modules"));
      }
    }
    replaced = workers_.erase(worker->id) > 0;
    // A worker at the same address under another id is a process that ended (its
    // successor is registering): drop it now rather than at its lease's end.
    for (auto it = workers_.begin(); it != workers_.end();) {
      if (it->second.worker->info.control_address() == request.control_address()) {
        CLEAVE_LOG(INFO) << "worker " << it->first << " replaced by " << worker->id
                         << " at the same address";
        superseded.push_back(it->first);
        prefixes_.forget(it->first);
        it = workers_.erase(it);
      } else {
        ++it;
      }
    }
    workers_[worker->id] = {.worker = worker, .last_seen = std::chrono::steady_clock::now()};
    prefixes_.forget(worker->id);  // A new process: its cache is empty.
    ++changes_;
    updateGauges();
  }
  if (replaced) on_leave_(worker->id);
  for (const std::string& id : superseded) on_leave_(id);
  on_join_(worker);
  CLEAVE_LOG(INFO) << "worker " << worker->id << " joined: " << v1::WorkerRole_Name(request.role())
                   << ", tp " << request.tp_size() << ", " << request.kv_capacity().total_blocks()
                   << " KV blocks, target concurrency "
                   << request.kv_capacity().target_concurrency();
  v1::RegisterResponse response;
  response.set_worker_id(worker->id);
  response.set_heartbeat_interval_ms(static_cast<uint32_t>(options_.heartbeat_interval.count()));
  response.set_lease_timeout_ms(static_cast<uint32_t>(options_.lease_timeout.count()));
  response.set_router_id(options_.router_id);
  return response;
}

bool WorkerPool::heartbeat(const v1::HeartbeatRequest& request) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(request.worker_id());
  if (it == workers_.end()) return false;
  it->second.last_seen = std::chrono::steady_clock::now();
  if (request.has_load() && it->second.foreign != request.load().kv_blocks_foreign()) {
    it->second.foreign = request.load().kv_blocks_foreign();
    ++changes_;
  }
  if (request.draining() && !it->second.draining) {
    it->second.draining = true;
    ++changes_;
    CLEAVE_LOG(INFO) << "worker " << request.worker_id() << " is draining: no new work for it";
  }
  return true;
}

void WorkerPool::remove(const std::string& worker_id, const std::string& reason) {
  absl::MutexLock membership(&membership_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (workers_.erase(worker_id) == 0) return;
    prefixes_.forget(worker_id);
    ++changes_;
    updateGauges();
  }
  CLEAVE_LOG(INFO) << "worker " << worker_id << " left: " << reason;
  on_leave_(worker_id);
}

void LostWorkers::add(const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  ids_.push_back(worker_id);
}

std::vector<std::string> LostWorkers::take() {
  absl::MutexLock lock(&mu_);
  return std::exchange(ids_, {});
}

void WorkerPool::expire(std::stop_token stop) {
  while (sleepFor(stop, std::chrono::milliseconds(200))) {
    if (options_.lost != nullptr) {
      for (const std::string& id : options_.lost->take()) {
        remove(id, "its token stream cannot be reopened");
      }
    }
    std::vector<std::string> lost;
    {
      absl::MutexLock lock(&mu_);
      const auto now = std::chrono::steady_clock::now();
      bool unfenced = false;
      for (auto& [id, entry] : workers_) {
        if (now - entry.last_seen > options_.lease_timeout) lost.push_back(id);
        // Fences the worker's heartbeats count by now (or over).
        const size_t before = entry.fenced.size();
        std::erase_if(entry.fenced, [now](const auto& fence) { return fence.first <= now; });
        unfenced = unfenced || entry.fenced.size() != before;
      }
      if (unfenced) ++changes_;
    }
    for (const std::string& id : lost) remove(id, "no heartbeat within the lease timeout");
  }
}

std::optional<WorkerPool::ModelView> WorkerPool::model() const {
  absl::MutexLock lock(&mu_);
  return modelLocked();
}

std::optional<WorkerPool::ModelView> WorkerPool::awaitModel(
    std::chrono::system_clock::time_point deadline, const std::function<bool()>& cancelled) {
  absl::MutexLock lock(&mu_);
  absl::Status why;
  waitUntil([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !workers_.empty(); },
            patienceDeadline(deadline), cancelled, why);
  return modelLocked();
}

std::optional<WorkerPool::ModelView> WorkerPool::modelLocked() const {
  if (workers_.empty()) return std::nullopt;
  const v1::RegisterRequest& info = workers_.begin()->second.worker->info;
  ModelView view{.model_id = info.model().model_id(),
                 .names = options_.served_model_names.empty()
                              ? std::vector<std::string>{info.model().model_id()}
                              : options_.served_model_names,
                 .context_length = info.model().context_length(),
                 .vocab_size = info.model().vocab_size(),
                 .block_size = info.kv_layout().block_size()};
  for (const v1::LoraAdapterFingerprint& a : info.model().adapters())
    view.adapters.push_back({.name = a.name(), .sha256 = a.sha256()});
  return view;
}

std::string WorkerPool::ModelView::served() const {
  std::string out = absl::StrCat("'", absl::StrJoin(names, "', '"), "'");
  for (const AdapterView& a : adapters) absl::StrAppend(&out, ", '", a.name, "'");
  if (!adapters.empty()) absl::StrAppend(&out, " (LoRA adapters of the first)");
  return out;
}

int64_t WorkerPool::cachedBlocks(const Entry& entry, std::span<const uint64_t> prefix) const {
  const v1::KvCapacity& capacity = entry.worker->info.kv_capacity();
  if (!options_.prefix_aware || !capacity.prefix_caching() || prefix.empty()) return 0;
  return prefixes_.matched(entry.worker->id, prefix);
}

WorkerPool::Entry* WorkerPool::pick(int64_t blocks, const std::vector<std::string>& exclude,
                                    std::span<const uint64_t> prefix) {
  Entry* best = nullptr;
  double best_load = 0;
  int64_t best_cached = 0;
  for (auto& [id, entry] : workers_) {
    const Worker& w = *entry.worker;
    if (!w.servesDecode()) continue;
    if (entry.draining || contains(exclude, id)) continue;
    const v1::KvCapacity& cap = w.info.kv_capacity();
    // A full batch may be prefilled ahead: when a whole batch finishes at once (requests of
    // one length), the next one is ready to decode.
    if (entry.admitted >= 2 * int64_t{cap.target_concurrency()}) continue;
    int64_t fenced = 0;
    for (const auto& fence : entry.fenced) fenced += fence.second;
    if (int64_t{cap.total_blocks()} - entry.reserved - entry.foreign - fenced <
        blocks - sharedBlocks(entry, prefix))
      continue;
    const double load = static_cast<double>(entry.admitted) / cap.target_concurrency();
    // Of the workers with room in their decode batch, the cache decides; past that, load.
    // A worker prefilling for itself computes less; one decoding what a prefill worker
    // computed is sent less, and shares the cached blocks instead of taking new ones.
    const int64_t cached = load < 1 ? cachedBlocks(entry, prefix) : 0;
    if (best == nullptr || cached > best_cached || (cached == best_cached && load < best_load))
      best = &entry, best_load = load, best_cached = cached;
  }
  return best;
}

absl::StatusOr<Admission> WorkerPool::admit(int64_t blocks,
                                            std::chrono::system_clock::time_point deadline,
                                            const std::function<bool()>& cancelled,
                                            const std::vector<std::string>& exclude,
                                            const std::string& client, int64_t new_tokens,
                                            std::span<const uint64_t> prefix, int32_t priority) {
  const char* outcome = nullptr;
  absl::StatusOr<Admission> admission = admitOrWait(blocks, deadline, cancelled, exclude, client,
                                                    new_tokens, prefix, priority, outcome);
  admissions_
      .Add({{"outcome", outcome != nullptr ? outcome : admissionOutcome(admission.status())}})
      .Increment();
  return admission;
}

absl::StatusOr<Admission> WorkerPool::admitOrWait(int64_t blocks,
                                                  std::chrono::system_clock::time_point deadline,
                                                  const std::function<bool()>& cancelled,
                                                  const std::vector<std::string>& exclude,
                                                  const std::string& client, int64_t new_tokens,
                                                  std::span<const uint64_t> prefix,
                                                  int32_t priority, const char*& outcome) {
  absl::MutexLock lock(&mu_);
  int64_t largest = 0;
  bool any = false, draining = false;
  auto survey = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    largest = 0, any = false, draining = false;
    for (const auto& [id, entry] : workers_) {
      if (!entry.worker->servesDecode()) continue;
      if (contains(exclude, id)) continue;
      draining = draining || entry.draining;
      if (entry.draining) continue;
      any = true;
      largest = std::max<int64_t>(largest, entry.worker->info.kv_capacity().total_blocks());
    }
    return any;
  };
  // No decode worker to use (every one restarting or draining): wait for one to register.
  absl::Status ignored;
  if (!survey()) waitUntil(survey, patienceDeadline(deadline), cancelled, ignored);
  if (!any) {
    return absl::UnavailableError(
        draining ? "every decode worker is draining (stopping); retry once a new one registers"
                 : "no decode worker is registered with this router; start cleave-worker with "
                   "--router pointing at it");
  }
  if (blocks > largest) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request needs ", blocks,
                     " KV blocks (prompt + max_new_tokens) but the largest "
                     "decode worker has ",
                     largest, "; shorten the prompt or lower stopping.max_new_tokens"));
  }
  // Only a request that has to wait needs room in the queue.
  const bool must_wait = !queue_.empty() || pick(blocks, exclude, prefix) == nullptr;
  if (must_wait && static_cast<int64_t>(queue_.size()) >= options_.queue_capacity) {
    // A place frees as a decoding sequence finishes (a second until the pace is known).
    const double turnover_s =
        service_s_.trusted() ? service_s_.mean() / decodeLoad(exclude).decoding : 1.0;
    return withRetryAfter(
        absl::ResourceExhaustedError(absl::StrCat(
            "the admission queue is full (", options_.queue_capacity, " requests); retry later")),
        std::chrono::milliseconds(static_cast<int64_t>(std::ceil(turnover_s * 1e3))));
  }
  auto secondsLeft = [&] {
    return std::chrono::duration<double>(deadline - std::chrono::system_clock::now()).count();
  };
  // Refuse now what cannot be admitted and served before the deadline.
  if (must_wait) {
    const int64_t ahead = std::count_if(queue_.begin(), queue_.end(),
                                        [&](const Waiting& w) { return w.priority <= priority; });
    const std::optional<double> finish_s = expectedFinishS(ahead, new_tokens, exclude);
    const double left_s = secondsLeft();
    if (finish_s && *finish_s > left_s) {
      outcome = "deadline_unreachable";
      // Once the queue has moved on by the excess, the same deadline would be reachable.
      return withRetryAfter(
          absl::ResourceExhaustedError(absl::StrFormat(
              "%d requests are waiting ahead; at the decode workers' recent pace this one would "
              "finish in about %.1f s, past its deadline in %.1f s; retry later or with a "
              "longer deadline",
              ahead, *finish_s, left_s)),
          std::chrono::milliseconds(static_cast<int64_t>(std::ceil((*finish_s - left_s) * 1e3))));
    }
  }
  const uint64_t ticket = next_ticket_++;
  queue_.push_back({ticket, client, priority});
  updateGauges();
  Entry* chosen = nullptr;
  absl::Status why;
  // At the head of the queue with no decode worker left that could ever hold it (they left
  // or drain while it waited): after the restart patience it gives up, and those behind go.
  std::optional<std::chrono::steady_clock::time_point> unfit_since;
  bool unfit = false;
  bool admitted = waitUntil(
      [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        if (nextInLine() != ticket) return false;
        if ((chosen = pick(blocks, exclude, prefix)) != nullptr) return true;
        if (survey() && blocks <= largest) {
          unfit_since.reset();
          return false;
        }
        const auto now = std::chrono::steady_clock::now();
        if (!unfit_since) unfit_since = now;
        unfit = now - *unfit_since >= options_.restart_patience;
        return unfit;
      },
      deadline, cancelled, why);
  if (unfit) {
    why = absl::UnavailableError(
        absl::StrCat("no decode worker that can hold the request's ", blocks,
                     " KV blocks is left (they left or are draining); retry once one registers"));
    admitted = false;
  }
  // Its turn came too late to finish: the place goes to a request that can.
  if (admitted && must_wait) {
    const std::optional<double> finish_s = expectedFinishS(0, new_tokens, exclude);
    const double left_s = secondsLeft();
    if (finish_s && *finish_s > left_s) {
      why = absl::DeadlineExceededError(absl::StrFormat(
          "the request waited for room on a decode worker until its deadline was %.1f s away, "
          "less than the about %.1f s it would take; retry with a longer deadline",
          left_s, *finish_s));
      admitted = false;
    }
  }
  queue_.erase(std::find_if(queue_.begin(), queue_.end(),
                            [&](const Waiting& w) { return w.ticket == ticket; }));
  ++changes_;  // The next in line may go now.
  if (admitted && must_wait) last_served_[client] = ++served_;
  if (!admitted) {
    updateGauges();
    return why;
  }
  Admission admission{
      .worker = chosen->worker, .blocks = blocks, .since = std::chrono::steady_clock::now()};
  admission.shared.assign(prefix.begin(), prefix.begin() + sharedBlocks(*chosen, prefix));
  admission.own = blocks - static_cast<int64_t>(admission.shared.size());
  share(*chosen, admission.shared, 1);
  chosen->reserved += admission.own;
  chosen->admitted += 1;
  updateGauges();
  return admission;
}

int64_t WorkerPool::sharedBlocks(const Entry& entry, std::span<const uint64_t> prefix) {
  int64_t n = 0;
  while (n < static_cast<int64_t>(prefix.size()) && entry.shared.contains(prefix[n])) ++n;
  return n;
}

void WorkerPool::share(Entry& entry, std::span<const uint64_t> hashes, int64_t delta) {
  for (uint64_t hash : hashes) {
    int64_t& users = entry.shared[hash];
    if (users == 0) entry.reserved += 1;  // The first to share a block counts it.
    users += delta;
    if (users == 0) {
      entry.shared.erase(hash);
      entry.reserved -= 1;
    }
  }
}

void WorkerPool::settle(Admission& admission, int64_t cached, std::span<const uint64_t> prefix) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(admission.worker->id);
  if (it == workers_.end() || it->second.worker != admission.worker) return;
  Entry& entry = it->second;
  const std::vector<uint64_t> shared(
      prefix.begin(), prefix.begin() + std::clamp<int64_t>(cached, 0, prefix.size()));
  // The new shares first, so a block in both is never let go in between.
  share(entry, shared, 1);
  share(entry, admission.shared, -1);
  entry.reserved -= admission.own;
  admission.shared = shared;
  admission.own = admission.blocks - static_cast<int64_t>(shared.size());
  entry.reserved += admission.own;
  ++changes_;
  updateGauges();
}

WorkerPool::DecodeLoad WorkerPool::decodeLoad(const std::vector<std::string>& exclude) const {
  DecodeLoad load;
  for (const auto& [id, entry] : workers_) {
    if (!entry.worker->servesDecode() || entry.draining || contains(exclude, id)) continue;
    load.decoding +=
        std::min<int64_t>(entry.admitted, entry.worker->info.kv_capacity().target_concurrency());
    load.admitted += entry.admitted;
  }
  load.decoding = std::max<int64_t>(load.decoding, 1);
  return load;
}

std::optional<double> WorkerPool::expectedFinishS(int64_t queued_ahead, int64_t new_tokens,
                                                  const std::vector<std::string>& exclude) const {
  if (!service_s_.trusted()) return std::nullopt;
  const DecodeLoad load = decodeLoad(exclude);
  const int64_t ahead = queued_ahead + load.admitted;  // Admitted or waiting.
  // Places in the batch free at `decoding` per service time; this request decodes once all
  // but `decoding - 1` of those ahead have finished, then takes its own service time.
  const double batch_wait_s = static_cast<double>(std::max<int64_t>(0, ahead + 1 - load.decoding)) /
                              load.decoding * service_s_.mean();
  return batch_wait_s + start_s_.mean() +
         token_s_.mean() * static_cast<double>(std::max<int64_t>(1, new_tokens));
}

// The window: long enough to span a few bursts of admissions, short enough to follow a change
// of load within seconds.
constexpr size_t kRecentSamples = 16;

void WorkerPool::RecentMean::add(double x) {
  if (samples_.size() < kRecentSamples) {
    samples_.push_back(x);
  } else {
    sum_ -= samples_[next_];
    samples_[next_] = x;
    next_ = (next_ + 1) % kRecentSamples;
  }
  sum_ += x;
}

bool WorkerPool::RecentMean::trusted() const { return samples_.size() >= kRecentSamples / 2; }

uint64_t WorkerPool::nextInLine() const {
  // The first waiting request of the client served longest ago (never: 0).
  const Waiting* next = nullptr;
  uint64_t next_served = 0;
  for (const Waiting& w : queue_) {  // Oldest first, so a client's first entry is its oldest.
    auto it = last_served_.find(w.client);
    const uint64_t served = it == last_served_.end() ? 0 : it->second;
    if (next == nullptr || w.priority < next->priority ||
        (w.priority == next->priority && served < next_served)) {
      next = &w;
      next_served = served;
    }
  }
  return next == nullptr ? 0 : next->ticket;
}

bool WorkerPool::waitUntil(const std::function<bool()>& ready,
                           std::chrono::system_clock::time_point deadline,
                           const std::function<bool()>& cancelled, absl::Status& why) {
  while (!ready()) {
    if (cancelled()) {
      why = absl::CancelledError("the client cancelled the request while it waited");
      return false;
    }
    if (std::chrono::system_clock::now() >= deadline) {
      why = absl::DeadlineExceededError(
          "the deadline passed while the request waited for room on a decode worker");
      return false;
    }
    // Woken by any change to workers, admissions or the queue; the timeout notices
    // cancellation and deadlines.
    const uint64_t seen = changes_;
    auto changed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return changes_ != seen; };
    mu_.AwaitWithTimeout(absl::Condition(&changed), absl::Milliseconds(20));
  }
  return true;
}

void WorkerPool::release(const Admission& admission, std::optional<Served> served, int64_t fenced,
                         std::chrono::milliseconds fenced_for) {
  absl::MutexLock lock(&mu_);
  if (served) {
    const double held_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - admission.since).count();
    const double service_s = std::max(0.0, held_s - served->decode_wait_s);
    service_s_.add(service_s);
    start_s_.add(std::max(0.0, service_s - served->decode_s));
    if (served->decoded_tokens > 0) {
      token_s_.add(served->decode_s / static_cast<double>(served->decoded_tokens));
    }
  }
  auto it = workers_.find(admission.worker->id);
  // A worker that left took its accounting with it.
  if (it == workers_.end() || it->second.worker != admission.worker) return;
  share(it->second, admission.shared, -1);
  it->second.reserved -= admission.own;
  // Its fenced blocks (its cached prefix's among them) stay out of use there: held here
  // until the worker's heartbeats count them.
  if (fenced > 0) {
    it->second.fenced.emplace_back(
        std::chrono::steady_clock::now() + std::min(fenced_for, 2 * options_.heartbeat_interval),
        std::min(fenced, admission.blocks));
  }
  it->second.admitted -= 1;
  ++changes_;
  updateGauges();
}

void WorkerPool::updateGauges() {
  int64_t reserved = 0, admitted = 0;
  for (const auto& [id, entry] : workers_) {
    reserved += entry.reserved;
    admitted += entry.admitted;
  }
  queue_gauge_.Set(static_cast<double>(queue_.size()));
  reserved_gauge_.Set(static_cast<double>(reserved));
  admitted_gauge_.Set(static_cast<double>(admitted));
  workers_gauge_.Set(static_cast<double>(workers_.size()));
  // Per decode worker; a worker that left loses its series.
  for (const std::string& id : exported_workers_) {
    if (workers_.contains(id)) continue;
    worker_admitted_.Remove(&worker_admitted_.Add({{"worker", id}}));
    worker_reserved_.Remove(&worker_reserved_.Add({{"worker", id}}));
  }
  exported_workers_.clear();
  for (const auto& [id, entry] : workers_) {
    if (!entry.worker->servesDecode()) continue;
    worker_admitted_.Add({{"worker", id}}).Set(static_cast<double>(entry.admitted));
    worker_reserved_.Add({{"worker", id}}).Set(static_cast<double>(entry.reserved));
    exported_workers_.push_back(id);
  }
}

std::chrono::system_clock::time_point WorkerPool::patienceDeadline(
    std::chrono::system_clock::time_point deadline) const {
  return std::min(deadline, std::chrono::system_clock::now() + options_.restart_patience);
}

bool WorkerPool::awaitPrefill(const Worker& decode, const std::vector<std::string>& exclude,
                              std::chrono::system_clock::time_point deadline,
                              const std::function<bool()>& cancelled) {
  absl::MutexLock lock(&mu_);
  const auto give_up = patienceDeadline(deadline);
  absl::Status why;
  return waitUntil(
      [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        for (const auto& [id, entry] : workers_) {
          if (entry.draining || contains(exclude, id)) continue;
          if (entry.worker->info.role() == v1::WORKER_ROLE_PREFILL) return true;
          if (id == decode.id && decode.info.role() == v1::WORKER_ROLE_BOTH) return true;
        }
        return false;
      },
      give_up, cancelled, why);
}

absl::StatusOr<PrefillLease> WorkerPool::pickPrefill(const Worker& decode, int64_t length,
                                                     std::span<const uint64_t> prefix,
                                                     const std::vector<std::string>& exclude) {
  const int64_t block_size = decode.info.kv_layout().block_size();
  absl::MutexLock lock(&mu_);
  Entry* best = nullptr;
  int64_t tokens = length;  // What `best` would compute.
  // The decode worker computes a short rest itself (--local-prefill-tokens); one that
  // prefills too (role both) all of a prompt where no prefill worker is registered.
  auto self = !contains(exclude, decode.id) ? workers_.find(decode.id) : workers_.end();
  const int64_t local =
      self != workers_.end() ? length - cachedBlocks(self->second, prefix) * block_size : 0;
  if (self != workers_.end() && local <= options_.local_prefill_tokens) {
    best = &self->second;
    tokens = local;
  } else {
    std::tie(best, tokens) = fastestPrefill(length, prefix, exclude, [](v1::WorkerRole role) {
      return role == v1::WORKER_ROLE_PREFILL;
    });
  }
  if (best == nullptr && self != workers_.end() && decode.info.role() == v1::WORKER_ROLE_BOTH) {
    best = &self->second;
    tokens = local;
  }
  if (best == nullptr) {
    return absl::UnavailableError(
        "no prefill worker is registered with this router; start cleave-worker --role=prefill "
        "(or --role=both)");
  }
  best->prefill_tokens += tokens;
  return PrefillLease{.worker = best->worker,
                      .tokens = tokens,
                      .blocks = std::vector<uint64_t>(prefix.begin(), prefix.end()),
                      .decode_id = decode.id};
}

std::pair<WorkerPool::Entry*, int64_t> WorkerPool::fastestPrefill(
    int64_t length, std::span<const uint64_t> prefix, const std::vector<std::string>& exclude,
    const std::function<bool(v1::WorkerRole)>& takes) {
  Entry* best = nullptr;
  int64_t tokens = length;  // What `best` would compute.
  for (auto& [id, entry] : workers_) {
    if (!takes(entry.worker->info.role())) continue;
    if (entry.draining || contains(exclude, id)) continue;
    const int64_t computed =
        length - cachedBlocks(entry, prefix) * entry.worker->info.kv_layout().block_size();
    const int64_t done = entry.prefill_tokens + computed;
    // Ties go to the less loaded worker.
    if (best == nullptr || done < best->prefill_tokens + tokens ||
        (done == best->prefill_tokens + tokens && entry.prefill_tokens < best->prefill_tokens)) {
      best = &entry;
      tokens = computed;
    }
  }
  return {best, tokens};
}

absl::StatusOr<PrefillLease> WorkerPool::pickEmbedder(int64_t length,
                                                      std::span<const uint64_t> prefix,
                                                      const std::vector<std::string>& exclude) {
  absl::MutexLock lock(&mu_);
  auto [best, tokens] = fastestPrefill(length, prefix, exclude, [](v1::WorkerRole role) {
    return role == v1::WORKER_ROLE_PREFILL || role == v1::WORKER_ROLE_BOTH;
  });
  if (best == nullptr) {
    return absl::UnavailableError(
        "no worker that prefills is registered with this router; start cleave-worker "
        "--role=prefill or --role=both");
  }
  best->prefill_tokens += tokens;
  return PrefillLease{.worker = best->worker,
                      .tokens = tokens,
                      .blocks = std::vector<uint64_t>(prefix.begin(), prefix.end())};
}

void WorkerPool::releasePrefill(const PrefillLease& lease, bool prefilled) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(lease.worker->id);
  if (it == workers_.end() || it->second.worker != lease.worker) return;
  it->second.prefill_tokens -= lease.tokens;
  if (!prefilled || !options_.prefix_aware) return;
  holds(*lease.worker, lease.blocks);
  if (auto decode = workers_.find(lease.decode_id);
      decode != workers_.end() && decode->first != lease.worker->id) {
    holds(*decode->second.worker, lease.blocks);
  }
}

void WorkerPool::holds(const Worker& worker, std::span<const uint64_t> hashes) {
  const v1::KvCapacity& capacity = worker.info.kv_capacity();
  if (!capacity.prefix_caching()) return;
  // Without a reported pool size, a guess as large as a worker of 64k blocks.
  prefixes_.record(worker.id, hashes,
                   capacity.total_blocks() > 0 ? capacity.total_blocks() : int64_t{1} << 16);
}

void WorkerPool::decoded(const Worker& worker, std::span<const uint64_t> hashes) {
  if (!options_.prefix_aware) return;
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker.id);
  if (it == workers_.end() || it->second.worker.get() != &worker) return;  // Gone since.
  holds(worker, hashes);
}

std::vector<v1::WorkerSummary> WorkerPool::summaries() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::WorkerSummary> out;
  const auto now = std::chrono::steady_clock::now();
  for (const auto& [id, entry] : workers_) {
    const v1::RegisterRequest& info = entry.worker->info;
    v1::WorkerSummary s;
    s.set_worker_id(id);
    s.set_role(info.role());
    s.set_tp_size(info.tp_size());
    s.set_model(info.model().model_id());
    s.set_address(info.control_address());
    s.set_healthy(now - entry.last_seen <= 3 * options_.heartbeat_interval);
    s.set_target_concurrency(info.kv_capacity().target_concurrency());
    s.set_running(static_cast<uint32_t>(entry.admitted));
    s.set_kv_blocks_total(info.kv_capacity().total_blocks());
    s.set_kv_blocks_reserved(static_cast<uint32_t>(entry.reserved));
    s.set_kv_blocks_foreign(static_cast<uint32_t>(entry.foreign));
    out.push_back(std::move(s));
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.worker_id() < b.worker_id(); });
  return out;
}

int64_t WorkerPool::queueDepth() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(queue_.size());
}

int64_t WorkerPool::reservedBlocks() const {
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  for (const auto& [id, entry] : workers_) n += entry.reserved;
  return n;
}

}  // namespace cleave::router
