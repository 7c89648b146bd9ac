// cleave-worker: runs prefill, decode or both for one tensor-parallel group.
//
// Start-up: load the model as a TpGroup, plan memory (and refuse to start when the KV
// pool cannot hold the target concurrency), size the KV pool, serve DecodeControl and
// PrefillControl, then register with the router and heartbeat until SIGINT/SIGTERM.
#include <csignal>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/flags.h"
#include "common/grpc_keepalive.h"
#include "common/grpc_logging.h"
#include "common/grpc_threads.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/model/fingerprint.h"
#include "common/process_init.h"
#include "common/ready_file.h"
#include "common/shutdown.h"
#include "common/tls.h"
#include "common/tokenizer/tokenizer.h"
#include "common/version.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server_builder.h"
#include "services/engine/gated_delta_net.h"
#include "services/engine/memory_plan.h"
#include "services/roofline/cpu_hardware.h"
#include "services/transfer/kv_transport.h"
#include "services/worker/control_services.h"
#include "services/worker/gpu_setup.h"
#include "services/worker/kv_staging.h"
#include "services/worker/registration.h"
#include "services/worker/worker_metrics.h"
#include "services/worker/worker_options.h"

namespace cleave::worker {
namespace {

[[noreturn]] void die(const absl::Status& status) {
  CLEAVE_LOG(ERROR) << "cleave-worker: " << status.message();
  std::exit(1);
}

v1::KvDtype kvDtype(cpu::KvType type) {
  switch (type) {
    case cpu::KvType::kF32: return v1::KV_DTYPE_F32;
    case cpu::KvType::kBf16: return v1::KV_DTYPE_BF16;
    case cpu::KvType::kFp8E4M3: return v1::KV_DTYPE_FP8_E4M3;
  }
  return v1::KV_DTYPE_UNSPECIFIED;
}

v1::KvLayout kvLayout(const model::ModelConfig& c, cpu::KvType type, int64_t block_size) {
  v1::KvLayout layout;
  layout.set_dtype(kvDtype(type));
  layout.set_block_size(static_cast<uint32_t>(block_size));
  layout.set_num_layers(c.kvLayers());
  const model::KvCacheShape shape = model::kvCacheShape(c);
  layout.set_num_kv_heads(shape.heads);
  layout.set_head_dim(shape.head_dim);
  layout.set_bytes_per_block(uint64_t(shape.parts) * c.kvLayers() * shape.heads * block_size *
                             shape.head_dim * cpu::kvElementBytes(type));
  if (c.linear_attention) {
    layout.set_linear_layers(c.linearLayers());
    layout.set_linear_key_heads(c.linear_attention->key_heads);
    layout.set_linear_state_group_bytes(
        static_cast<uint64_t>(engine::gatedDeltaNetGroupFloats(*c.linear_attention)) * 4);
  }
  return layout;
}

v1::RegisterRequest registration(const WorkerOptions& options, Role role, engine::TpGroup& group,
                                 const std::string& worker_id, const std::string& address,
                                 int metrics_port, const std::string& sha256,
                                 int64_t target_concurrency, transfer::KvTransport* transport,
                                 const std::vector<std::string>& keys,
                                 const std::vector<std::string>& state_keys) {
  const model::ModelConfig& c = group.config();
  v1::RegisterRequest r;
  r.set_worker_id(worker_id);
  r.set_role(role == Role::kBoth      ? v1::WORKER_ROLE_BOTH
             : role == Role::kPrefill ? v1::WORKER_ROLE_PREFILL
                                      : v1::WORKER_ROLE_DECODE);
  r.set_tp_size(static_cast<uint32_t>(group.tp()));
  v1::ModelFingerprint* model = r.mutable_model();
  model->set_model_id(model::modelIdFromPath(options.model));
  model->set_architecture(model::architectureName(c.architecture));
  model->set_sha256(sha256);
  model->set_vocab_size(c.vocab_size);
  model->set_context_length(c.max_position_embeddings);
  for (const auto& adapter : group.adapters()) {
    v1::LoraAdapterFingerprint* a = model->add_adapters();
    a->set_name(adapter->name);
    a->set_sha256(adapter->sha256);
  }
  *r.mutable_kv_layout() = kvLayout(c, group.kvType(), options.block_size);
  v1::KvCapacity* capacity = r.mutable_kv_capacity();
  const bool decodes = role != Role::kPrefill;
  capacity->set_total_blocks(static_cast<uint32_t>(group.numBlocks()));
  capacity->set_target_concurrency(decodes ? static_cast<uint32_t>(target_concurrency) : 0);
  capacity->set_planned_seq_len(static_cast<uint32_t>(options.planned_seq_len));
  capacity->set_max_batch_tokens(static_cast<uint32_t>(batchTokens(options)));
  // A linear-attention model's scheduler caches prefixes only with state checkpoints.
  capacity->set_prefix_caching(options.prefix_caching && (!group.config().linear_attention ||
                                                          stateCheckpoints(options, role) > 0));
  r.set_control_address(address);
  for (int rank = 0; rank < group.tp(); ++rank) {
    v1::RankEndpoint* endpoint = r.add_ranks();
    endpoint->set_rank(static_cast<uint32_t>(rank));
    endpoint->set_kv_head_begin(static_cast<uint32_t>(group.kvHeads(rank).begin));
    endpoint->set_kv_head_end(
        static_cast<uint32_t>(group.kvHeads(rank).begin + group.kvHeads(rank).size));
    if (c.linear_attention) {
      const engine::Span heads = group.linearKeyHeads(rank);
      endpoint->set_linear_key_head_begin(static_cast<uint32_t>(heads.begin));
      endpoint->set_linear_key_head_end(static_cast<uint32_t>(heads.begin + heads.size));
    }
    if (transport == nullptr) {
      endpoint->set_transport("local");  // No KV transport: the worker serves only itself.
      continue;
    }
    endpoint->set_transport(transport->capabilities().name);
    endpoint->set_worker_address(transport->address());
    if (!decodes) continue;  // Written from, never to.
    engine::KvStorage& kv = group.kv(rank);
    endpoint->set_kv_pool_rkey(keys[rank]);
    endpoint->set_kv_pool_base(reinterpret_cast<uint64_t>(kv.data()));
    endpoint->set_kv_pool_bytes(static_cast<uint64_t>(kv.bytes()));
    endpoint->set_block_bytes(static_cast<uint64_t>(group.kvBlockBytes(rank)));
    if (rank < static_cast<int>(state_keys.size())) {
      endpoint->set_state_rkey(state_keys[rank]);
      endpoint->set_state_base(reinterpret_cast<uint64_t>(group.states(rank)));
      endpoint->set_state_bytes(
          static_cast<uint64_t>(group.stateSlots() * group.stateFloats(rank) * 4));
    }
  }
  r.set_metrics_port(static_cast<uint32_t>(metrics_port));
  r.set_version(version());
  return r;
}

int run(int argc, char** argv) {
  blockShutdownSignals();
  routeGrpcLogsToDebug();
  WorkerOptions options;
  FlagSet flags("cleave-worker", "[flags]",
                "Runs one tensor-parallel group of the Cleave engine as a prefill, decode or "
                "combined worker and registers it with a router.");
  options.addFlags(flags);
  std::vector<std::string> positional = parseFlagsOrExit(flags, argc, argv);
  if (!positional.empty()) {
    exitWithUsageError(flags,
                       absl::InvalidArgumentError("unexpected argument '" + positional[0] + "'"));
  }
  if (absl::Status valid = validate(options); !valid.ok()) exitWithUsageError(flags, valid);
  // No sequence is planned longer than the longest served.
  if (options.max_model_len > 0)
    options.planned_seq_len = std::min(options.planned_seq_len, options.max_model_len);
  const Role role = *parseRole(options.role);
  const int64_t batch_tokens = batchTokens(options);

  const int threads_per_rank =
      options.threads > 0 ? static_cast<int>(options.threads)
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) /
                                            static_cast<int>(options.tp));
  // On the GPU the group steps CUDA models, each with its KV cache on its GPU, and keeps
  // host staging rows for the KV transport (copied around each transfer).
  const bool gpu = options.backend == "cuda";
  // A GPU model's batch is sized at start: the target's decodes and a few prefill chunks
  // beside them. The scheduler keeps every step within it.
  const int64_t step_sequences = gpu ? std::max<int64_t>(options.target_concurrency, 1) + 8 : 0;
  engine::StepBackendFactory step_backend;
  engine::BackendMemoryEstimator backend_memory;
  if (gpu) {
    auto made = gpuBackend(options, batch_tokens, step_sequences);
    if (!made.ok()) die(made.status());
    step_backend = std::move(*made);
    auto counted = gpuBackendMemory(options, batch_tokens, step_sequences);
    if (!counted.ok()) die(counted.status());
    backend_memory = std::move(*counted);
  }
  ProgressLine progress;  // On a terminal only; a log stays clean.
  auto group = engine::TpGroup::load(options.model,
                                     {.tp = static_cast<int>(options.tp),
                                      .moe_split = *engine::parseMoeSplit(options.moe_split),
                                      .threads = threads_per_rank * static_cast<int>(options.tp),
                                      .kv_type = kvType(options),
                                      .on_progress = engine::showLoadProgress(progress),
                                      .backend = step_backend,
                                      .backend_memory = backend_memory,
                                      .host_kv = gpu,
                                      .max_context = options.max_model_len});
  progress.finish();
  if (!group.ok()) die(group.status());
  const model::ModelConfig& config = (*group)->config();
  int64_t adapter_bytes = 0;  // Rank 0's.
  const std::vector<engine::LoraModuleSpec> adapters =
      *engine::parseLoraModules(options.lora_modules);  // validate() checked them
  for (const engine::LoraModuleSpec& spec : adapters) {
    absl::StatusOr<int32_t> added = (*group)->addAdapter(spec.name, spec.path);
    if (!added.ok()) die(added.status());
    const engine::LoraAdapter& adapter = *(*group)->adapters()[*added];
    adapter_bytes += adapter.bytes();
    CLEAVE_LOG(INFO) << "LoRA adapter '" << spec.name << "' from " << spec.path << ": rank "
                     << adapter.rank << ", " << adapter.bytes() / 1024 << " KiB on rank 0";
  }

  // Memory: rank 0 holds the most (uneven splits give it the larger share).
  engine::MemoryPlanInput plan_input{.budget_bytes = static_cast<int64_t>(options.memory_budget),
                                     .weight_bytes = (*group)->weightBytes(0) + adapter_bytes,
                                     .target_concurrency = options.target_concurrency,
                                     .planned_seq_len = options.planned_seq_len,
                                     .max_batch_tokens = batch_tokens,
                                     .speculative_tokens = options.speculative.tokens,
                                     .block_size = options.block_size,
                                     .kv_element_bytes = cpu::kvElementBytes((*group)->kvType()),
                                     .tp = options.tp,
                                     .state_checkpoints = stateCheckpoints(options, role),
                                     .state_drafts = draftStates(options, role)};
  if (gpu) {
    // The GPUs' own counts (bf16 weights, the kernels' workspace), and with no budget given
    // the devices filled.
    auto memory = (*group)->backendMemory(options.block_size);
    if (!memory.ok()) die(memory.status());
    engine::useBackendMemory(*memory, options.gpu_memory_fraction, plan_input);
  }
  if (plan_input.budget_bytes == 0) {
    // Exactly the target: plan once with everything, then with what that needs.
    plan_input.budget_bytes = int64_t{1} << 50;
    auto probe = engine::planMemory(config, plan_input);
    if (!probe.ok()) die(probe.status());
    const int64_t blocks_per_sequence =
        (options.planned_seq_len + options.block_size - 1) / options.block_size;
    plan_input.budget_bytes =
        probe->weights + probe->workspace + probe->state_bytes +
        options.target_concurrency * blocks_per_sequence * probe->kv_block_bytes;
  }
  auto plan = engine::planMemory(config, plan_input);
  if (!plan.ok()) die(plan.status());
  CLEAVE_LOG(INFO) << plan->table();
  worker::WorkerMetrics::exportMemoryPlan(*plan);
  // A GPU's cache moves through host staging rows (kv_staging.h), not a host copy of the
  // pool; a CPU worker's only when asked (else peers write its cache's blocks).
  const bool staged = gpu || options.kv_staging_tokens > 0;
  const StagingSizes staging =
      staged ? planStaging(role != Role::kDecode, role != Role::kPrefill, options.kv_staging_tokens,
                           config.max_position_embeddings, options.planned_seq_len, plan->kv_blocks,
                           options.block_size)
             : StagingSizes{};
  if (absl::Status kv = (*group)->allocateKv(plan->kv_blocks, options.block_size,
                                             staging.send + staging.receive, plan->state_slots);
      !kv.ok())
    die(kv);
  if (staged) {
    CLEAVE_LOG(INFO) << "KV transfers stage through host rows: " << staging.send << " blocks out, "
                     << staging.receive << " in ("
                     << ((staging.send + staging.receive) * (*group)->kvBlockBytes(0) >> 20)
                     << " MiB per rank; --kv-staging-tokens)";
  }

  // The tokenizer turns tokens into text for stop strings; a model without one is served
  // on token ids alone.
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  if (auto loaded = tokenizer::Tokenizer::load(options.model); loaded.ok()) {
    tokenizer = std::move(*loaded);
  } else {
    CLEAVE_LOG(WARNING) << "no tokenizer (" << loaded.status().message()
                        << "): requests with stop strings will not stop on them";
  }
  std::vector<uint32_t> eos = config.eos_token_ids;
  if (tokenizer != nullptr) {
    if (auto id = tokenizer->eosId()) eos.push_back(*id);
  }
  auto sha256 = model::modelSha256(options.model);
  if (!sha256.ok()) die(sha256.status());

  // The KV transport: decode ranks register their pools for prefill workers to write into.
  std::unique_ptr<transfer::KvTransport> transport;
  std::vector<std::string> keys, state_keys;  // And the linear-attention state slots'.
  if (auto ucx = transfer::makeUcxTransport(); ucx.ok()) {
    transport = std::move(*ucx);
    for (int rank = 0; rank < (*group)->tp() && role != Role::kPrefill; ++rank) {
      engine::KvStorage& kv = (*group)->kv(rank);
      auto key = transport->registerMemory(kv.data(), static_cast<uint64_t>(kv.bytes()));
      if (!key.ok()) die(key.status());
      keys.push_back(*key);
      if (float* states = (*group)->states(rank)) {
        auto state_key = transport->registerMemory(
            states,
            static_cast<uint64_t>((*group)->stateSlots() * (*group)->stateFloats(rank) * 4));
        if (!state_key.ok()) die(state_key.status());
        state_keys.push_back(*state_key);
      }
    }
  } else if (role != Role::kBoth) {
    die(ucx.status());
  } else {
    CLEAVE_LOG(WARNING) << "no KV transport (" << ucx.status().message()
                        << "): this worker prefills and decodes only for itself";
  }

  // What this machine can do, for every step's floor (docs/roofline.md): the GPU's profile,
  // or the CPU measured.
  std::optional<roofline::Hardware> gpu_hardware;
  if (gpu) {
    auto found = gpuHardware((*group)->weightType());
    if (found.ok()) {
      gpu_hardware = *found;
    } else {
      CLEAVE_LOG(WARNING) << found.status().message() << ": step floors use this machine's CPU";
    }
  }
  const roofline::Hardware hardware =
      gpu_hardware ? *gpu_hardware
                   : roofline::measureCpuHardware(threads_per_rank * static_cast<int>(options.tp),
                                                  (*group)->multipliesInt8(), 5, int64_t{256} << 20,
                                                  (*group)->multipliesBf16());
  CLEAVE_LOG(INFO) << "this machine: " << hardware.bandwidth / 1e9 << " GB/s read, "
                   << hardware.peak_flops / 1e9 << " GOP/s for the weights' products";
  worker::WorkerMetrics::exportHardware(hardware);

  registerProcessMetrics("worker");
  auto metrics = MetricsServer::start(options.server.metrics_address,
                                      static_cast<int>(options.server.metrics_port));
  if (!metrics.ok()) die(metrics.status());

  WorkerCore core(**group, tokenizer.get(),
                  {.scheduler = {.max_batch_tokens = batch_tokens,
                                 .max_sequences = std::max<int64_t>(options.target_concurrency, 1),
                                 .max_step_sequences = step_sequences,
                                 .prefix_caching = options.prefix_caching,
                                 .state_checkpoints = plan->state_checkpoints,
                                 .draft_states = plan->state_drafts,
                                 .speculative = options.speculative},
                   .eos_ids = eos,
                   .layout = kvLayout(config, (*group)->kvType(), options.block_size),
                   .transport = transport.get(),
                   .transfer_timeout = std::chrono::milliseconds(options.kv_transfer_timeout_ms),
                   .prefills_for_peers = role != Role::kDecode,
                   .staging_send_blocks = staging.send,
                   .staging_receive_blocks = staging.receive,
                   .lease_timeout = std::chrono::milliseconds(options.lease_timeout_ms),
                   .quarantine = std::chrono::milliseconds(options.kv_quarantine_ms),
                   .target_concurrency = role == Role::kPrefill ? 0 : options.target_concurrency,
                   .hardware = hardware,
                   .rank_per_device = gpu_hardware.has_value()});
  DecodeService decode(core);
  PrefillService prefill(core);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  // With a certificate and the router's CA, this worker serves TLS and answers only callers
  // whose client certificate that CA signed (the router).
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> serving =
      options.tls_cert.empty() || options.router_ca.empty()
          ? absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>>(
                grpc::InsecureServerCredentials())
          : serverCredentials({.cert_file = options.tls_cert,
                               .key_file = options.tls_key,
                               .client_ca_file = options.router_ca,
                               .require_client_cert = true});
  if (!serving.ok()) exitWithUsageError(flags, serving.status());
  // Without this, Linux lets a second worker share the port and take half the router's
  // calls for this one; and a worker restarted at this address proves the old one gone.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(options.server.listen, *serving, &port);
  keepServerThreads(builder);
  useKeepalive(builder);
  if (role != Role::kPrefill) builder.RegisterService(&decode);
  builder.RegisterService(&prefill);  // A decode worker's computes only its own prompts.
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    die(absl::UnavailableError(absl::StrCat("cannot serve on ", options.server.listen)));
  }
  const std::string host = options.server.listen.substr(0, options.server.listen.rfind(':'));
  const std::string address =
      options.advertise.empty() ? absl::StrCat(host, ":", port) : options.advertise;
  // This process's identity: its address and a random incarnation, so that a worker
  // restarted at the same address is a new worker to the router and its peers.
  const std::string worker_id =
      absl::StrFormat("%s~%08x", address, std::random_device{}() & 0xffffffffu);
  core.setWorkerId(worker_id);
  worker::WorkerMetrics::exportInfo(worker_id, options.role, model::modelIdFromPath(options.model),
                                    options.tp);

  if (!options.server.ready_file.empty()) {
    absl::Status written = writeReadyFile(
        options.server.ready_file, {{"grpc_port", port}, {"metrics_port", (*metrics)->port()}});
    if (!written.ok()) die(written);
  }
  CLEAVE_LOG(INFO) << "cleave-worker (" << options.role << ", tp " << options.tp << ") serving "
                   << model::modelIdFromPath(options.model) << " on " << address
                   << ", metrics on port " << (*metrics)->port() << "; KV pool " << plan->kv_blocks
                   << " blocks";
  std::unique_ptr<RouterRegistration> registered;
  if (!options.router.empty()) {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> to_router = channelCredentials(
        {.ca_file = options.router_ca, .cert_file = options.tls_cert, .key_file = options.tls_key});
    if (!to_router.ok()) exitWithUsageError(flags, to_router.status());
    registered = std::make_unique<RouterRegistration>(
        options.router, *to_router,
        registration(options, role, **group, worker_id, address, (*metrics)->port(), *sha256,
                     options.target_concurrency, transport.get(), keys, state_keys),
        [&core](const std::string& router_id) { return core.load(router_id); });
  }
  int signal = serveUntilShutdownSignal();
  CLEAVE_LOG(INFO) << "received " << (signal == SIGINT ? "SIGINT" : "SIGTERM") << ", draining";
  if (registered) {
    // No new work from now; what is running finishes here, up to --drain-timeout-ms.
    registered->drain();
    const auto until =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(options.drain_timeout_ms);
    while (core.heldRequests() > 0 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (const int64_t left = core.heldRequests(); left > 0) {
      CLEAVE_LOG(WARNING) << left << " requests still running after --drain-timeout-ms "
                          << options.drain_timeout_ms << "; the router moves them";
    }
  }
  registered.reset();  // Deregisters: the router moves anything left to other workers.
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  CLEAVE_LOG(INFO) << "cleave-worker stopped";
  return 0;
}

}  // namespace
}  // namespace cleave::worker

int main(int argc, char** argv) {
  cleave::initProcess();
  return cleave::worker::run(argc, argv);
}
