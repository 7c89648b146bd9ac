#include "services/worker/worker_options.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/kv_format.h"
#include "services/engine/kv_block_pool.h"
#include "services/engine/lora_adapter.h"
#include "services/engine/tensor_parallel.h"

namespace cleave::worker {

void WorkerOptions::addFlags(FlagSet& flags) {
  flags.addString("role", &role, "prefill, decode or both (no disaggregation)");
  flags.addString("model", &model, "Model: a GGUF file or a Hugging Face folder");
  flags.addInt("tp", &tp, "Tensor-parallel degree: rank threads, one per device");
  flags.addString("moe-split", &moe_split,
                  "How --tp cuts MoE layers: experts (whole experts per rank) or columns (every "
                  "expert's intermediate columns)");
  flags.addString("backend", &backend,
                  "Where the model runs: cpu, or cuda (rank r on GPU r; KV transfers staged "
                  "through host rows)");
  flags.addString("kv-dtype", &kv_dtype,
                  "KV cache element type: f32, bf16 or fp8 (e4m3, a quarter of f32's bytes); "
                  "auto: bf16; every worker of a router must use the same");
  flags.addInt("block-size", &block_size,
               "Positions per KV-cache block, a power of two in 8..256: larger blocks read a "
               "long context in fewer runs (faster decode attention) but cache and share "
               "prompt prefixes only in whole blocks; every worker of a router must use the same");
  flags.addString("router", &router, "Router address host:port to register with");
  flags.addString("advertise", &advertise,
                  "host:port the router reaches this worker at, when --listen is 0.0.0.0 or "
                  "behind a NAT (default: the --listen host and the bound port)");
  server.addTo(flags);
  flags.addBytes("memory-budget", &memory_budget,
                 "Memory for weights + workspace + KV cache, e.g. 8GiB (0: on GPUs, "
                 "--gpu-memory-fraction of each; on the CPU, exactly what the target "
                 "concurrency at the planned length needs)");
  flags.addDouble("gpu-memory-fraction", &gpu_memory_fraction,
                  "GPU workers with --memory-budget 0: the share of each GPU's memory the KV "
                  "pool fills up to, after weights and workspace, at most what is free (0: "
                  "exactly what the target concurrency needs; workers sharing a GPU split it)");
  flags.addInt("target-concurrency", &target_concurrency,
               "Sequences a decode worker must be able to run at once");
  flags.addInt("planned-seq-len", &planned_seq_len,
               "Typical sequence length (prompt + output) the KV plan must hold");
  flags.addInt("max-model-len", &max_model_len,
               "The longest sequence (prompt + output) served, when less than the model's "
               "context length (as vLLM's flag): what the router and /v1/models report, and "
               "what a GPU's workspace is sized for (0: the model's)");
  flags.addInt("max-batch-tokens", &max_batch_tokens,
               "Tokens one engine step computes: every decoding sequence's next token, then "
               "prompt chunks in the rest (chunked prefill). More: prompts take fewer, longer "
               "steps; more than the target concurrency on a decode worker. 0: 512, or the "
               "target concurrency + 128 when that is more");
  flags.addInt("kv-staging-tokens", &kv_staging_tokens,
               "Tokens of host rows each direction of KV transfers passes through, apart from "
               "the cache: a prompt goes out in chunks of this, and comes in whole (a longer "
               "one is refused). GPU workers always stage (0: 4096 tokens out; in, the larger "
               "of the context and four planned-length sequences); a CPU worker only when "
               "this is set (else peers write its cache)");
  flags.addInt("threads", &threads, "CPU threads per rank (0: all cores / tp)");
  flags.addBool("prefix-caching", &prefix_caching,
                "Reuse the KV cache of prompt prefixes computed before (--no-prefix-caching: "
                "compute every prompt whole)");
  flags.addInt("state-checkpoints", &state_checkpoints,
               "Models with linear-attention layers (Qwen3.5, Qwen3-Next): state slots kept "
               "for prefix caching, each the state after a cached prefix (its memory is in the "
               "plan's linear-attention state). A prompt reuses the longest cached prefix that "
               "ends at one (-1: --target-concurrency of them, none on a decode worker, "
               "which computes prompts only with the router's --local-prefill-tokens; 0: no "
               "prefix caching for such a model)");
  speculative.addFlags(flags);
  flags.addString("lora-modules", &lora_modules,
                  "LoRA adapters to serve next to the model, NAME=PATH[,NAME=PATH...]: each a "
                  "folder as PEFT saves one (adapter_config.json, adapter_model.safetensors); "
                  "requests run with one by naming it as their model (CPU backend)");
  flags.addInt("lease-timeout-ms", &lease_timeout_ms,
               "Fence a reservation not started within this, and drop a router's requests once "
               "its token stream has been closed this long (sequences freed, reservations not "
               "started fenced)");
  flags.addInt("kv-transfer-timeout-ms", &kv_transfer_timeout_ms,
               "How long one KV transfer (a prompt's blocks to a decode worker) may take before "
               "it is abandoned");
  flags.addInt("kv-quarantine-ms", &kv_quarantine_ms,
               "How long the blocks of a fenced reservation stay out of use: one released while "
               "a prefill worker nobody could stop may still write into it (frozen, or cut off "
               "from the router), so that a late write lands where nothing reads");
  flags.addString("router-ca", &router_ca,
                  "Reach the router over TLS, verifying it with this CA (PEM)");
  flags.addString("tls-cert", &tls_cert,
                  "This worker's certificate (PEM, with --tls-key): presented to the router "
                  "(needed when it has --tls-client-ca) and, with --router-ca, served on "
                  "--listen, which then answers only callers the router's CA signed");
  flags.addString("tls-key", &tls_key, "The private key of --tls-cert (PEM)");
  flags.addInt("drain-timeout-ms", &drain_timeout_ms,
               "On SIGTERM: how long to finish running requests (taking no new ones) before "
               "leaving the router, which moves the rest to other workers");
}

absl::StatusOr<Role> parseRole(absl::string_view text) {
  if (text == "prefill") return Role::kPrefill;
  if (text == "decode") return Role::kDecode;
  if (text == "both") return Role::kBoth;
  return absl::InvalidArgumentError(
      absl::StrCat("--role must be prefill, decode or both, got '", text, "'"));
}

cpu::KvType kvType(const WorkerOptions& options) { return *cpu::parseKvType(options.kv_dtype); }

int64_t batchTokens(const WorkerOptions& options) {
  if (options.max_batch_tokens > 0) return options.max_batch_tokens;
  if (*parseRole(options.role) == Role::kPrefill) return kDefaultBatchTokens;
  return std::max(kDefaultBatchTokens, options.target_concurrency + kDefaultBatchTokens / 4);
}

int64_t stateCheckpoints(const WorkerOptions& options, Role role) {
  if (!options.prefix_caching) return 0;
  if (options.state_checkpoints >= 0) return options.state_checkpoints;
  return role == Role::kDecode ? 0 : options.target_concurrency;
}

int64_t draftStates(const WorkerOptions& options, Role role) {
  if (role == Role::kPrefill) return 0;
  return options.speculative.tokens * options.target_concurrency;
}

absl::Status validate(const WorkerOptions& options) {
  if (absl::StatusOr<Role> role = parseRole(options.role); !role.ok()) return role.status();
  if (options.model.empty()) {
    return absl::InvalidArgumentError("--model is required: a GGUF file or a model folder");
  }
  struct stat info {};
  if (::stat(options.model.c_str(), &info) != 0) {
    return absl::NotFoundError(absl::StrCat("--model ", options.model, ": ", std::strerror(errno)));
  }
  if (options.tp < 1 || options.tp > 64) {
    return absl::InvalidArgumentError(absl::StrCat("--tp must be in 1..64, got ", options.tp));
  }
  if (auto split = engine::parseMoeSplit(options.moe_split); !split.ok()) return split.status();
  if (options.backend != "cpu" && options.backend != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend must be cpu or cuda, got '", options.backend, "'"));
  }
  auto kv = cpu::parseKvType(options.kv_dtype);
  if (!kv.ok())
    return absl::InvalidArgumentError(absl::StrCat("--kv-dtype: ", kv.status().message()));
  if (options.backend == "cuda" && *kv == cpu::KvType::kF32)
    return absl::InvalidArgumentError("--kv-dtype: the GPU stores its KV cache as bf16 or fp8");
  CLEAVE_RETURN_IF_ERROR(engine::validateBlockSize(options.block_size));
  CLEAVE_RETURN_IF_ERROR(engine::validate(options.speculative));
  if (options.state_checkpoints < -1 || options.state_checkpoints > 65536)
    return absl::InvalidArgumentError(absl::StrCat(
        "--state-checkpoints must be in 0..65536, or -1 for --target-concurrency, got ",
        options.state_checkpoints));
  CLEAVE_RETURN_IF_ERROR(engine::parseLoraModules(options.lora_modules).status());
  if (options.backend == "cuda" && !options.lora_modules.empty()) {
    return absl::InvalidArgumentError(
        "--lora-modules: LoRA adapters run on the CPU backend only (not with --backend cuda)");
  }
  if (options.target_concurrency < 1 || options.target_concurrency > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("--target-concurrency must be in 1..4096, got ", options.target_concurrency));
  }
  // A step shorter than the decode batch would leave sequences past it waiting every step.
  if (options.max_batch_tokens < 0 || options.max_batch_tokens > (int64_t{1} << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-batch-tokens must be in 0..1048576 (0: automatic), got ", options.max_batch_tokens));
  }
  if (options.max_batch_tokens > 0 && *parseRole(options.role) != Role::kPrefill &&
      options.max_batch_tokens <= options.target_concurrency) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-batch-tokens ", options.max_batch_tokens, " does not exceed --target-concurrency ",
        options.target_concurrency,
        ": a decode step must hold a token of every sequence decoding and leave room for "
        "prompts; raise it or leave it 0"));
  }
  if (options.max_model_len < 0 || options.max_model_len > (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-model-len must be in 0..2147483648, got ", options.max_model_len));
  }
  if (options.planned_seq_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--planned-seq-len must be >= 1, got ", options.planned_seq_len));
  }
  if (!(options.gpu_memory_fraction >= 0 && options.gpu_memory_fraction <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpu-memory-fraction must be in [0, 1], got ", options.gpu_memory_fraction));
  }
  if (options.kv_staging_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-staging-tokens must be >= 0, got ", options.kv_staging_tokens));
  }
  if (absl::Status valid = options.server.validate(); !valid.ok()) return valid;
  if (options.kv_transfer_timeout_ms < 1 || options.lease_timeout_ms < 1 ||
      options.kv_quarantine_ms < 1) {
    return absl::InvalidArgumentError(
        "--kv-transfer-timeout-ms, --kv-quarantine-ms and --lease-timeout-ms must be >= 1");
  }
  if (options.threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--threads must be >= 0, got ", options.threads));
  }
  return absl::OkStatus();
}

}  // namespace cleave::worker
