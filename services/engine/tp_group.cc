#include "services/engine/tp_group.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "kernels/cpu/thread_pool.h"
#include "services/engine/gloo_communicator.h"
#include "services/engine/shared_memory_communicator.h"

namespace cleave::engine {
namespace {

// A backend's step takes no adapters (addAdapter refuses them there).
absl::Status refuseAdapters(std::span<const SequenceChunk> batch) {
  for (const SequenceChunk& chunk : batch) {
    if (chunk.adapter >= 0)
      return absl::UnimplementedError("LoRA adapters run on the CPU backend only");
  }
  return absl::OkStatus();
}

}  // namespace

struct TpGroup::Rank {
  int index = 0;
  // The CPU model and its weights: released once backends hold their own copy.
  std::unique_ptr<LlamaWeights> weights;
  int64_t layers = 0;        // The shard's with KV rows, kept past the release.
  int64_t state_floats = 0;  // Its linear-attention state per sequence (KvStorageOptions).
  Span kv_heads;
  Span linear_key_heads;
  int64_t cpu_weight_bytes = 0;
  int64_t cpu_routed_expert_bytes = 0;
  roofline::Workload::FloatProducts cpu_float_products;
  bool cpu_multiplies_int8 = false;
  bool cpu_multiplies_bf16 = false;
  std::unique_ptr<cpu::ThreadPool> pool;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<KvStorage> kv;  // The CPU model's cache, or a backend's host rows.
  // The CPU model's host staging rows, apart from its cache (allocateKv's host_blocks).
  std::unique_ptr<KvStorage> staging;
  StepOutput output;  // Of the last step.
};

// One thread per rank, each running the job of the moment for its rank.
class TpGroup::Threads {
 public:
  explicit Threads(int count) : results_(count) {
    for (int i = 0; i < count; ++i) threads_.emplace_back([this, i] { loop(i); });
  }
  ~Threads() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    for (std::thread& t : threads_) t.join();
  }

  // Runs job(i) on thread i for every i; returns each thread's Status once all are done.
  std::vector<absl::Status> run(const std::function<absl::Status(int)>& job) {
    absl::MutexLock lock(&mu_);
    job_ = &job;
    pending_ = static_cast<int>(threads_.size());
    ++generation_;
    mu_.Await(absl::Condition(
        +[](int* pending) { return *pending == 0; }, &pending_));
    job_ = nullptr;
    return results_;
  }

 private:
  void loop(int index) {
    uint64_t seen = 0;
    while (true) {
      const std::function<absl::Status(int)>* job;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_ || generation_ != seen;
        };
        mu_.Await(absl::Condition(&ready));
        if (stop_) return;
        seen = generation_;
        job = job_;
      }
      absl::Status status = (*job)(index);
      absl::MutexLock lock(&mu_);
      results_[index] = std::move(status);
      --pending_;
    }
  }

  absl::Mutex mu_;
  const std::function<absl::Status(int)>* job_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<absl::Status> results_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

TpGroup::TpGroup() = default;
TpGroup::~TpGroup() = default;

absl::Status TpGroup::onEveryRank(const std::function<absl::Status(Rank&)>& job) {
  if (!threads_) return job(*ranks_[0]);
  for (absl::Status& status : threads_->run([&](int r) { return job(*ranks_[r]); })) {
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

std::function<void(const LoadProgress&)> showLoadProgress(ProgressLine& line) {
  if (!line.enabled()) return {};
  const auto start = std::chrono::steady_clock::now();
  return [&line, start](const LoadProgress& p) {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    line.update(absl::StrFormat(
                    "loading: layer %d of %d, %s, %s/s", p.layers_done, p.layers_total,
                    humanBytes(p.bytes_done),
                    humanBytes(static_cast<uint64_t>(seconds > 0 ? p.bytes_done / seconds : 0))),
                p.layers_done == p.layers_total);
  };
}

absl::StatusOr<std::unique_ptr<TpGroup>> TpGroup::load(const std::string& path,
                                                       const TpGroupOptions& options) {
  if (options.tp < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--tp must be at least 1, got ", options.tp));
  }
  std::unique_ptr<TpGroup> group(new TpGroup());
  for (int r = 0; r < options.tp; ++r) {
    group->ranks_.push_back(std::make_unique<Rank>());
    group->ranks_.back()->index = r;
  }
  if (options.tp > 1) group->threads_ = std::make_unique<Threads>(options.tp);
  group->backend_factory_ = options.backend;
  group->kv_type_ = options.kv_type;
  group->host_kv_ = options.backend && options.host_kv;
  group->backend_memory_ = options.backend_memory;
  GlooRendezvous rendezvous(options.tp);
  SharedMemoryGroup shared(options.tp);
  const int threads_per_rank = std::max(1, options.threads / options.tp);
  // Every shard loads before any rank connects, so a rank that fails to load never leaves
  // the others waiting for it.
  std::mutex progress_mu;
  LoadProgress progress;
  if (options.on_progress) {
    absl::StatusOr<model::ModelConfig> config = model::loadModelConfig(path);
    if (config.ok()) progress.layers_total = int64_t{config->num_layers} * options.tp;
  }
  auto on_layer = [&](int64_t bytes) {
    std::lock_guard<std::mutex> lock(progress_mu);
    ++progress.layers_done;
    progress.bytes_done += bytes;
    options.on_progress(progress);
  };
  CLEAVE_RETURN_IF_ERROR(group->onEveryRank([&](Rank& rank) -> absl::Status {
    CLEAVE_ASSIGN_OR_RETURN(rank.weights,
                            loadLlama(path,
                                      {.rank = rank.index,
                                       .size = options.tp,
                                       .moe_split = options.moe_split,
                                       .cpu_kernels = !options.backend},
                                      options.on_progress ? LayerLoaded(on_layer) : LayerLoaded()));
    uint32_t& context = rank.weights->config.max_position_embeddings;
    if (options.max_context > int64_t{context}) {
      return absl::InvalidArgumentError(absl::StrCat("--max-model-len ", options.max_context,
                                                     " exceeds the context length of ", path, " (",
                                                     context, " tokens)"));
    }
    if (options.max_context > 0) context = static_cast<uint32_t>(options.max_context);
    rank.layers = rank.weights->config.kvLayers();
    rank.state_floats = linearStateFloats(rank.weights->config, rank.weights->dims);
    rank.kv_heads = rank.weights->dims.kv_heads;
    rank.linear_key_heads = rank.weights->dims.linear_key_heads;
    rank.cpu_weight_bytes = rank.weights->weightBytes();
    rank.cpu_routed_expert_bytes = rank.weights->routedExpertBytes();
    rank.cpu_float_products = rank.weights->floatProducts();
    rank.cpu_multiplies_int8 = rank.weights->multipliesInt8();
    rank.cpu_multiplies_bf16 = rank.weights->multipliesBf16();
    return absl::OkStatus();
  }));
  const LlamaWeights& first = *group->ranks_[0]->weights;
  group->config_ = first.config;
  const LlamaLayer& layer0 = first.layers[0];
  group->weight_type_ = layer0.mla      ? layer0.mla->q_b.type()
                        : layer0.linear ? layer0.linear->out.type()
                                        : layer0.wq.type();
  CLEAVE_RETURN_IF_ERROR(group->onEveryRank([&](Rank& rank) -> absl::Status {
    rank.pool = std::make_unique<cpu::ThreadPool>(threads_per_rank);
    if (options.tp > 1 && options.transport == TpTransport::kGloo) {
      CLEAVE_ASSIGN_OR_RETURN(rank.comm, rendezvous.connect(rank.index));
    } else if (options.tp > 1) {
      rank.comm = shared.communicator(rank.index);
    }
    rank.model = std::make_unique<LlamaModel>(*rank.weights, *rank.pool, rank.comm.get());
    return absl::OkStatus();
  }));
  return group;
}

absl::Status TpGroup::allocateKv(int64_t num_blocks, int64_t block_size, int64_t host_blocks,
                                 int64_t state_slots) {
  if (num_blocks < 1 || block_size < 1 || host_blocks < 0 || state_slots < 0) {
    return absl::InvalidArgumentError(absl::StrCat("a KV pool of ", num_blocks, " blocks of ",
                                                   block_size, " positions (", host_blocks,
                                                   " host blocks)"));
  }
  num_blocks_ = num_blocks;
  block_size_ = block_size;
  state_slots_ = config_.linear_attention ? state_slots : 0;
  if (config_.linear_attention && state_slots < 1) {
    return absl::InvalidArgumentError(
        "a model with linear-attention layers needs state slots (one per running sequence)");
  }
  if (backend_factory_) {
    if (ranks_[0]->weights == nullptr)
      return absl::FailedPreconditionError(
          "the backends hold the weights now: a group with a backend allocates its KV pool once");
    backends_.clear();
    std::vector<const LlamaWeights*> shards;
    for (const auto& rank : ranks_) shards.push_back(rank->weights.get());
    CLEAVE_ASSIGN_OR_RETURN(backends_,
                            backend_factory_(shards, num_blocks, block_size, state_slots_));
    if (backends_.size() != ranks_.size())
      return absl::InternalError("the backend factory made the wrong number of ranks");
    // The backends made their own copy (a GPU's): the CPU model, its weights and their file
    // mappings (TP column slices are host copies) would only hold host memory from now on.
    for (auto& rank : ranks_) {
      rank->model.reset();
      rank->weights.reset();
    }
    if (!host_kv_) return absl::OkStatus();
  }
  // Each rank allocates (and first touches) its own rows; a backend gets them at once, with
  // nothing to copy, so it can prepare them (a GPU page-locks them) before any request.
  const model::KvCacheShape shape = model::kvCacheShape(config_);
  const int64_t rows = !backends_.empty() && host_blocks > 0 ? host_blocks : num_blocks;
  return onEveryRank([&](Rank& rank) -> absl::Status {
    rank.kv.reset();
    rank.staging.reset();
    KvStorageOptions o{.num_layers = rank.layers,
                       .kv_heads = rank.kv_heads.size,
                       .head_dim = shape.head_dim,
                       .block_size = block_size,
                       .num_blocks = rows,
                       .type = kv_type_,
                       .parts = shape.parts,
                       .state_slots = state_slots_,
                       .state_floats = rank.state_floats};
    rank.kv = std::make_unique<KvStorage>(o);
    if (backends_.empty() && host_blocks > 0) {
      o.num_blocks = host_blocks;
      o.state_slots = 0;
      rank.staging = std::make_unique<KvStorage>(o);
    }
    if (!backends_.empty()) return backends_[rank.index]->copyKv(KvCopy::kToHost, {}, {}, *rank.kv);
    return absl::OkStatus();
  });
}

float* TpGroup::states(int rank) {
  Rank& r = *ranks_[rank];
  return r.kv != nullptr && r.kv->stateSlots() > 0 ? r.kv->state(0) : nullptr;
}

int64_t TpGroup::stateFloats(int rank) const { return ranks_[rank]->state_floats; }

absl::StatusOr<std::vector<BackendMemory>> TpGroup::backendMemory(int64_t block_size) const {
  if (!backend_memory_) return absl::FailedPreconditionError("no backend memory estimator");
  if (!backends_.empty() || ranks_[0]->weights == nullptr)
    return absl::FailedPreconditionError("the backends are made: their memory is spent");
  std::vector<const LlamaWeights*> shards;
  for (const auto& rank : ranks_) shards.push_back(rank->weights.get());
  CLEAVE_ASSIGN_OR_RETURN(std::vector<BackendMemory> memory, backend_memory_(shards, block_size));
  if (memory.size() != ranks_.size())
    return absl::InternalError("the backend memory estimator counted the wrong number of ranks");
  return memory;
}

absl::StatusOr<int32_t> TpGroup::addAdapter(const std::string& name, const std::string& folder) {
  if (backend_factory_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "LoRA adapter '", name, "': adapters run on the CPU backend only, not on this one"));
  }
  if (adapterIndex(name) >= 0)
    return absl::AlreadyExistsError(absl::StrCat("a LoRA adapter is already called '", name, "'"));
  std::vector<std::shared_ptr<const LoraAdapter>> loaded(ranks_.size());
  CLEAVE_RETURN_IF_ERROR(onEveryRank([&](Rank& rank) -> absl::Status {
    CLEAVE_ASSIGN_OR_RETURN(loaded[rank.index], loadLoraAdapter(name, folder, *rank.weights));
    return absl::OkStatus();
  }));
  int32_t index = -1;
  for (const auto& rank : ranks_) index = rank->model->addAdapter(loaded[rank->index]);
  adapters_.push_back(loaded[0]);
  return index;
}

int32_t TpGroup::adapterIndex(absl::string_view name) const {
  for (size_t i = 0; i < adapters_.size(); ++i) {
    if (adapters_[i]->name == name) return static_cast<int32_t>(i);
  }
  return -1;
}

absl::StatusOr<std::span<const float>> TpGroup::forward(std::span<const SequenceChunk> batch) {
  if (!backends_.empty()) {
    CLEAVE_RETURN_IF_ERROR(refuseAdapters(batch));
    CLEAVE_RETURN_IF_ERROR(onEveryRank([&](Rank& rank) -> absl::Status {
      CLEAVE_ASSIGN_OR_RETURN(rank.output.logits, backends_[rank.index]->forward(batch));
      return absl::OkStatus();
    }));
    return ranks_[0]->output.logits;
  }
  if (!ranks_[0]->kv) return absl::FailedPreconditionError("forward before allocateKv");
  CLEAVE_RETURN_IF_ERROR(onEveryRank([&](Rank& rank) -> absl::Status {
    CLEAVE_ASSIGN_OR_RETURN(rank.output.logits, rank.model->forward(batch, *rank.kv));
    return absl::OkStatus();
  }));
  return ranks_[0]->output.logits;
}

std::span<const float> TpGroup::lastHidden() const {
  if (!backends_.empty()) return backends_[0]->lastHidden();
  return ranks_[0]->model ? ranks_[0]->model->lastHidden() : std::span<const float>();
}

absl::StatusOr<StepOutput> TpGroup::forwardAndDraw(std::span<const SequenceChunk> batch,
                                                   std::span<const RowOutput> rows) {
  if (rows.size() != batch.size())
    return absl::InvalidArgumentError(
        absl::StrCat("a step of ", batch.size(), " sequences given ", rows.size(), " row outputs"));
  if (backends_.empty()) {
    CLEAVE_ASSIGN_OR_RETURN(std::span<const float> logits, forward(batch));
    return StepOutput{.logits = logits};
  }
  CLEAVE_RETURN_IF_ERROR(refuseAdapters(batch));
  CLEAVE_RETURN_IF_ERROR(onEveryRank([&](Rank& rank) -> absl::Status {
    CLEAVE_ASSIGN_OR_RETURN(rank.output, backends_[rank.index]->forwardAndDraw(batch, rows));
    return absl::OkStatus();
  }));
  return ranks_[0]->output;
}

absl::Status TpGroup::copyKv(KvCopy direction, std::span<const int32_t> blocks,
                             std::span<const int32_t> rows) {
  if (blocks.size() != rows.size())
    return absl::InvalidArgumentError(
        absl::StrCat("copyKv of ", blocks.size(), " blocks to ", rows.size(), " host rows"));
  if (backends_.empty()) {
    if (ranks_[0]->staging == nullptr) {
      if (!std::equal(blocks.begin(), blocks.end(), rows.begin()))
        return absl::InvalidArgumentError(
            "the CPU model's host rows are its cache: rows must equal blocks");
      return absl::OkStatus();
    }
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (blocks[i] < 0 || blocks[i] >= num_blocks_ || rows[i] < 0 ||
          rows[i] >= ranks_[0]->staging->totalBlocks())
        return absl::InvalidArgumentError(
            absl::StrCat("copyKv of block ", blocks[i], " (of ", num_blocks_, ") to host row ",
                         rows[i], " (of ", ranks_[0]->staging->totalBlocks(), ")"));
    }
    return onEveryRank([&](Rank& rank) -> absl::Status {
      if (direction == KvCopy::kToHost) {
        copyBlocks(*rank.kv, blocks, *rank.staging, rows);
      } else {
        copyBlocks(*rank.staging, rows, *rank.kv, blocks);
      }
      return absl::OkStatus();
    });
  }
  if (!host_kv_) return absl::FailedPreconditionError("copyKv on a group without host KV rows");
  return onEveryRank([&](Rank& rank) -> absl::Status {
    return backends_[rank.index]->copyKv(direction, blocks, rows, *rank.kv);
  });
}

absl::Status TpGroup::copyState(KvCopy direction, int32_t slot) {
  if (state_slots_ == 0 || backends_.empty()) return absl::OkStatus();
  if (slot < 0 || slot >= state_slots_)
    return absl::InvalidArgumentError(
        absl::StrCat("state slot ", slot, " is outside the group's ", state_slots_));
  if (!host_kv_) return absl::FailedPreconditionError("copyState on a group without host rows");
  return onEveryRank([&](Rank& rank) -> absl::Status {
    return backends_[rank.index]->copyState(direction, slot, *rank.kv);
  });
}

const model::ModelConfig& TpGroup::config() const { return config_; }

int64_t TpGroup::weightBytes(int rank) const {
  if (!backends_.empty()) {
    if (const int64_t stored = backends_[rank]->weightBytes(); stored > 0) return stored;
  }
  return ranks_[rank]->cpu_weight_bytes;
}

int64_t TpGroup::routedExpertBytes(int rank) const {
  if (!backends_.empty() && backends_[rank]->weightBytes() > 0)
    return backends_[rank]->routedExpertBytes();
  return ranks_[rank]->cpu_routed_expert_bytes;
}

roofline::Workload::FloatProducts TpGroup::floatProducts() const {
  roofline::Workload::FloatProducts most;  // Ranks may differ (a slice not of whole blocks).
  if (!backends_.empty()) return most;
  for (const auto& rank : ranks_) {
    const roofline::Workload::FloatProducts& f = rank->cpu_float_products;
    most = {.attention = std::max(most.attention, f.attention),
            .mlp = std::max(most.mlp, f.mlp),
            .experts = std::max(most.experts, f.experts),
            .lm_head = std::max(most.lm_head, f.lm_head)};
  }
  return most;
}

bool TpGroup::multipliesInt8() const {
  if (!backends_.empty()) return model::tensorTypeTraits(weight_type_)->block_elements > 1;
  return std::any_of(ranks_.begin(), ranks_.end(),
                     [](const auto& rank) { return rank->cpu_multiplies_int8; });
}

bool TpGroup::multipliesBf16() const {
  return backends_.empty() && !backend_factory_ &&
         std::any_of(ranks_.begin(), ranks_.end(),
                     [](const auto& rank) { return rank->cpu_multiplies_bf16; });
}

KvStorage& TpGroup::kv(int rank) {
  CLEAVE_CHECK(ranks_[rank]->kv != nullptr);  // After allocateKv (a backend: host_kv).
  return ranks_[rank]->staging ? *ranks_[rank]->staging : *ranks_[rank]->kv;
}

Span TpGroup::kvHeads(int rank) const { return ranks_[rank]->kv_heads; }

Span TpGroup::linearKeyHeads(int rank) const { return ranks_[rank]->linear_key_heads; }

int64_t TpGroup::kvBlockBytes(int rank) const {
  const model::KvCacheShape shape = model::kvCacheShape(config_);
  return shape.parts * ranks_[rank]->layers * ranks_[rank]->kv_heads.size * shape.head_dim *
         block_size_ * cpu::kvElementBytes(kv_type_);
}

}  // namespace cleave::engine
