// `cleave up`: a whole deployment on this machine — cleave-router plus prefill, decode or
// combined workers as child processes on loopback. Waits until every worker has
// registered, prints the endpoints, and on Ctrl-C (SIGINT) or SIGTERM stops the children
// cleanly (workers first). If a child dies, the rest are stopped and `cleave up` fails.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cstdlib>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/flags.h"
#include "common/ready_file.h"
#include "common/shutdown.h"
#include "common/tokenizer/tokenizer.h"
#if CLEAVE_HAVE_CUDA
#include "kernels/cuda/device.h"
#endif
#include "nlohmann/json.hpp"
#include "services/cli/commands.h"
#include "services/cli/router_client.h"
#include "services/engine/kv_block_pool.h"
#include "services/engine/lora_adapter.h"
#include "services/engine/speculative.h"

extern char** environ;

namespace cleave::cli {
namespace {

// The share of a GPU's memory its workers fill when no budget is given (the rest for the
// CUDA contexts and what lives outside the models' allocations).
constexpr double kGpuMemoryShare = 0.9;

struct Child {
  std::string name;
  std::string ready_file;
  std::string gpus;  // CUDA_VISIBLE_DEVICES of a GPU worker, else empty
  pid_t pid = -1;
  nlohmann::json ready;
};

absl::Status spawn(Child& child, std::vector<std::string> args) {
  args.push_back("--ready-file=" + child.ready_file);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // This process's environment, with the child's GPUs when it has some.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    if (child.gpus.empty() || !absl::StartsWith(*e, "CUDA_VISIBLE_DEVICES="))
      env_strings.push_back(*e);
  }
  if (!child.gpus.empty()) env_strings.push_back("CUDA_VISIBLE_DEVICES=" + child.gpus);
  std::vector<char*> env;
  for (std::string& e : env_strings) env.push_back(e.data());
  env.push_back(nullptr);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);  // Children handle their own signals.
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  const int rc = posix_spawn(&child.pid, argv[0], nullptr, &attr, argv.data(), env.data());
  posix_spawnattr_destroy(&attr);
  if (rc != 0)
    return absl::UnavailableError(absl::StrCat("cannot start ", args[0], ": ", strerror(rc)));
  return absl::OkStatus();
}

// True once the child wrote its ready file; an error when it exited first.
absl::StatusOr<bool> ready(Child& child) {
  int status = 0;
  if (waitpid(child.pid, &status, WNOHANG) == child.pid) {
    child.pid = -1;
    return absl::UnavailableError(absl::StrCat(child.name, " exited (status ", status,
                                               ") before it was ready; see its log above"));
  }
  std::ifstream in(child.ready_file);
  if (!in.good()) return false;
  child.ready = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return !child.ready.is_discarded();
}

void stopAll(std::vector<Child>& children) {
  // Workers first (they deregister from the router), then the router.
  for (auto it = children.rbegin(); it != children.rend(); ++it) {
    if (it->pid <= 0) continue;
    kill(it->pid, SIGTERM);
    waitpid(it->pid, nullptr, 0);
    it->pid = -1;
  }
}

}  // namespace

int runUp(int argc, char** argv) {
  std::string model, listen = "127.0.0.1:50051", ready_file, kv_dtype = "auto", backend = "cpu",
                     chat_template, http_listen, reasoning_parser, tool_call_parser,
                     served_model_name, generation_config = "auto";
  int64_t prefill = 0, decode = 0, both = 0, prefill_tp = 1, decode_tp = 1, threads = 0;
  int64_t local_prefill_tokens = 0;
  bool log_requests = false;
  int64_t target = 16, planned = 2048, timeout_s = 300, batch_tokens = 0, max_model_len = 0,
          block_size = 16;
  uint64_t budget = 0;
  FlagSet flags("cleave up", "--model MODEL [flags]",
                "Starts cleave-router and workers on this machine, waits until they are "
                "serving, prints the endpoints and runs until Ctrl-C. Without --prefill, "
                "--decode or --both it starts one combined worker.");
  flags.addString("model", &model, "Model: a GGUF file or a Hugging Face folder");
  flags.addString("listen", &listen, "The router's gRPC address (port 0 picks a free one)");
  flags.addString("http-listen", &http_listen,
                  "Also serve the OpenAI-compatible HTTP API on this host:port (the router's "
                  "--http-listen)");
  flags.addBool("log-requests", &log_requests,
                "The router's --log-requests: a log line per request when it ends");
  flags.addString("served-model-name", &served_model_name,
                  "The router's --served-model-name: the names clients call the model by");
  flags.addString("generation-config", &generation_config,
                  "The router's --generation-config: auto (requests that leave sampling unset "
                  "get what the model folder's generation_config.json recommends) or none");
  flags.addString("reasoning-parser", &reasoning_parser,
                  "With --http-listen: the router's --reasoning-parser (qwen3, deepseek_r1, glm45, "
                  "openai_gptoss)");
  flags.addString("tool-call-parser", &tool_call_parser,
                  "With --http-listen: the router's --tool-call-parser (hermes, llama3_json, "
                  "mistral, deepseek_v3, qwen3_coder, glm45, pythonic, openai)");
  flags.addInt("prefill", &prefill, "Prefill workers (--role=prefill)");
  flags.addInt("decode", &decode, "Decode workers (--role=decode)");
  flags.addInt("both", &both, "Combined workers (--role=both)");
  flags.addInt("prefill-tp", &prefill_tp, "Tensor-parallel degree of prefill workers");
  flags.addInt("local-prefill-tokens", &local_prefill_tokens,
               "The router's --local-prefill-tokens: decode and --both workers compute a "
               "prompt themselves when at most this many of its tokens are not in their cache");
  flags.addInt("decode-tp", &decode_tp, "Tensor-parallel degree of decode and combined workers");
  flags.addInt("threads", &threads, "CPU threads per rank of each worker (0: the worker decides)");
  flags.addInt("target-concurrency", &target, "Each decode worker's target concurrency");
  flags.addInt("planned-seq-len", &planned, "Sequence length the KV plans must hold");
  flags.addInt("max-model-len", &max_model_len,
               "The workers' --max-model-len: the longest sequence served (0: the model's)");
  flags.addInt("max-batch-tokens", &batch_tokens,
               "The workers' --max-batch-tokens: tokens per engine step (0: automatic)");
  flags.addBytes("memory-budget", &budget,
                 "Each worker's memory budget (0: on GPUs, 90% of each GPU's memory split among "
                 "the worker ranks sharing it; on the CPU, what the plan needs)");
  flags.addString("kv-dtype", &kv_dtype,
                  "Every worker's KV cache element type: f32, bf16 or fp8 (auto: bf16)");
  flags.addInt("block-size", &block_size,
               "Every worker's --block-size: KV-cache positions per block, a power of two in "
               "8..256");
  flags.addString("backend", &backend,
                  "Where the workers run: cpu, or cuda (each worker its own --tp GPUs, in "
                  "order: CUDA_VISIBLE_DEVICES is set per worker)");
  flags.addString("ready-file", &ready_file,
                  "When everything serves, write the router's ports here (JSON)");
  flags.addString("chat-template", &chat_template,
                  "The router's Jinja chat template file, instead of the model's");
  flags.addInt("startup-timeout-s", &timeout_s, "Give up when not serving within this");
  engine::SpeculativeOptions speculative;
  speculative.addFlags(flags);
  std::string lora_modules;
  flags.addString("lora-modules", &lora_modules,
                  "LoRA adapters every worker serves next to the model, NAME=PATH[,...] "
                  "(cleave-worker --lora-modules); requests name one as their model");
  std::vector<std::string> positional = parseFlagsOrExit(flags, argc, argv);
  if (absl::Status valid = engine::parseLoraModules(lora_modules).status(); !valid.ok())
    exitWithUsageError(flags, valid);
  if (absl::Status valid = engine::validate(speculative); !valid.ok())
    exitWithUsageError(flags, valid);
  if (absl::Status valid = engine::validateBlockSize(block_size); !valid.ok())
    exitWithUsageError(flags, valid);
  if (model.empty()) exitWithUsageError(flags, absl::InvalidArgumentError("--model is required"));
  if (!positional.empty()) {
    exitWithUsageError(flags, absl::InvalidArgumentError("unexpected argument " + positional[0]));
  }
  if (backend != "cpu" && backend != "cuda") {
    exitWithUsageError(flags, absl::InvalidArgumentError(
                                  absl::StrCat("--backend is cpu or cuda, not '", backend, "'")));
  }
  if (prefill + decode + both == 0) both = 1;
  if (prefill < 0 || decode < 0 || both < 0 || (decode > 0 && prefill == 0) ||
      (prefill > 0 && decode == 0 && both == 0)) {
    exitWithUsageError(flags, absl::InvalidArgumentError(
                                  "--decode workers need --prefill workers (and the other way "
                                  "round, unless --both workers decode)"));
  }
  blockShutdownSignals();
  const std::filesystem::path bin = std::filesystem::read_symlink("/proc/self/exe").parent_path();
  const std::filesystem::path work =
      std::filesystem::temp_directory_path() / absl::StrCat("cleave-up-", getpid());
  std::filesystem::create_directories(work);
  std::vector<Child> children;
  auto fail = [&](const absl::Status& status) {
    std::fprintf(stderr, "cleave up: %s\n", std::string(status.message()).c_str());
    stopAll(children);
    std::filesystem::remove_all(work);
    return 1;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  auto waitReady = [&](Child& child) -> absl::Status {
    while (true) {
      absl::StatusOr<bool> r = ready(child);
      if (!r.ok()) return r.status();
      if (*r) return absl::OkStatus();
      if (std::chrono::steady_clock::now() > deadline)
        return absl::DeadlineExceededError(child.name + " was not ready in time");
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  };

  // GPU workers take the GPUs this process sees in order (the entries of its own
  // CUDA_VISIBLE_DEVICES when set, which may be ids or UUIDs), sharing them round robin when
  // there are fewer than the workers' ranks.
  std::vector<std::string> gpus;
  int64_t next_gpu = 0;
  int64_t sharing = 1;  // Worker ranks on the busiest GPU: they split its memory.
  if (backend == "cuda") {
    int64_t count = 0;
#if CLEAVE_HAVE_CUDA
    auto devices = cuda::listDevices();
    if (!devices.ok()) return fail(devices.status());
    count = static_cast<int64_t>(devices->size());
#endif
    if (count == 0) return fail(absl::FailedPreconditionError("--backend cuda: no GPU here"));
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    if (visible != nullptr && *visible != '\0') {
      for (absl::string_view id : absl::StrSplit(visible, ',', absl::SkipWhitespace()))
        gpus.emplace_back(absl::StripAsciiWhitespace(id));
      // CUDA stops at the first entry it cannot use: the GPUs seen are the first `count`, and
      // a worker must never be handed one past them.
      if (static_cast<int64_t>(gpus.size()) > count) gpus.resize(count);
    }
    if (static_cast<int64_t>(gpus.size()) != count) {
      gpus.clear();
      for (int64_t g = 0; g < count; ++g) gpus.push_back(absl::StrCat(g));
    }
    const int64_t widest = std::max(prefill > 0 ? prefill_tp : 0, decode_tp);
    if (widest > count)
      return fail(absl::FailedPreconditionError(absl::StrCat(
          "--backend cuda: a worker of --tp ", widest, " needs that many GPUs; ", count, " here")));
    const int64_t ranks = prefill * prefill_tp + (decode + both) * decode_tp;
    sharing = (ranks + count - 1) / count;
    if (ranks > count)
      std::fprintf(stderr, "cleave up: %lld worker ranks share %lld GPUs\n",
                   static_cast<long long>(ranks), static_cast<long long>(count));
  }
  // The router tokenizes text prompts with the model's tokenizer; a model without one is
  // served on token-id prompts alone.
  std::vector<std::string> router_args = {(bin / "cleave-router").string(), "--listen=" + listen,
                                          "--metrics-port=0"};
  if (!http_listen.empty()) router_args.push_back("--http-listen=" + http_listen);
  if (!reasoning_parser.empty()) router_args.push_back("--reasoning-parser=" + reasoning_parser);
  if (!tool_call_parser.empty()) router_args.push_back("--tool-call-parser=" + tool_call_parser);
  if (!served_model_name.empty()) router_args.push_back("--served-model-name=" + served_model_name);
  if (log_requests) router_args.push_back("--log-requests");
  router_args.push_back("--generation-config=" + generation_config);
  if (local_prefill_tokens != 0) {
    router_args.push_back(absl::StrCat("--local-prefill-tokens=", local_prefill_tokens));
  }
  if (auto words = tokenizer::Tokenizer::load(model); words.ok()) {
    router_args.push_back("--model=" + model);
    if (!chat_template.empty()) router_args.push_back("--chat-template=" + chat_template);
  } else {
    std::fprintf(stderr, "cleave up: %s: serving token-id prompts only\n",
                 std::string(words.status().message()).c_str());
  }
  children.push_back({.name = "cleave-router", .ready_file = (work / "router.json").string()});
  if (absl::Status s = spawn(children.back(), router_args);
      !s.ok() || !(s = waitReady(children.back())).ok()) {
    return fail(s);
  }
  const std::string router = absl::StrCat(listen.substr(0, listen.rfind(':')), ":",
                                          children[0].ready["grpc_port"].get<int>());
  auto startWorkers = [&](const char* role, int64_t count, int64_t tp) -> absl::Status {
    for (int64_t i = 0; i < count; ++i) {
      Child child{.name = absl::StrCat(role, "-", i),
                  .ready_file = (work / absl::StrCat(role, i, ".json")).string()};
      if (backend == "cuda") {
        for (int64_t g = 0; g < tp; ++g)
          absl::StrAppend(&child.gpus, child.gpus.empty() ? "" : ",",
                          gpus[next_gpu++ % static_cast<int64_t>(gpus.size())]);
      }
      std::vector<std::string> args = {(bin / "cleave-worker").string(),
                                       std::string("--role=") + role,
                                       "--model=" + model,
                                       "--router=" + router,
                                       "--listen=127.0.0.1:0",
                                       "--metrics-port=0",
                                       absl::StrCat("--tp=", tp),
                                       absl::StrCat("--target-concurrency=", target),
                                       absl::StrCat("--planned-seq-len=", planned),
                                       absl::StrCat("--memory-budget=", budget),
                                       "--kv-dtype=" + kv_dtype,
                                       absl::StrCat("--block-size=", block_size),
                                       "--backend=" + backend};
      if (threads > 0) args.push_back(absl::StrCat("--threads=", threads));
      if (batch_tokens > 0) args.push_back(absl::StrCat("--max-batch-tokens=", batch_tokens));
      if (max_model_len > 0) args.push_back(absl::StrCat("--max-model-len=", max_model_len));
      if (!lora_modules.empty()) args.push_back("--lora-modules=" + lora_modules);
      if (speculative.tokens > 0 && std::string_view(role) != "prefill") {
        args.push_back(absl::StrCat("--speculative-tokens=", speculative.tokens));
        args.push_back(absl::StrCat("--prompt-lookup-min=", speculative.ngram.min));
        args.push_back(absl::StrCat("--prompt-lookup-max=", speculative.ngram.max));
      }
      if (backend == "cuda" && budget == 0)
        args.push_back(absl::StrCat("--gpu-memory-fraction=", kGpuMemoryShare / sharing));
      children.push_back(child);
      if (absl::Status s = spawn(children.back(), args); !s.ok()) return s;
    }
    return absl::OkStatus();
  };
  for (absl::Status s :
       {startWorkers("prefill", prefill, prefill_tp), startWorkers("decode", decode, decode_tp),
        startWorkers("both", both, decode_tp)}) {
    if (!s.ok()) return fail(s);
  }
  for (size_t i = 1; i < children.size(); ++i) {
    if (absl::Status s = waitReady(children[i]); !s.ok()) return fail(s);
  }
  // Serving means every worker registered with the router.
  client::RouterClient client({.address = router});
  while (true) {
    absl::StatusOr<v1::GetServerInfoResponse> info = client.serverInfo();
    if (info.ok() && info->workers_size() == static_cast<int>(children.size() - 1)) break;
    if (std::chrono::steady_clock::now() > deadline)
      return fail(absl::DeadlineExceededError("the workers did not all register in time"));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::printf("cleave up: serving %s\n", std::filesystem::path(model).filename().c_str());
  std::printf("  router   gRPC %s   metrics http://127.0.0.1:%d/metrics\n", router.c_str(),
              children[0].ready["metrics_port"].get<int>());
  const int http_port = children[0].ready.value("http_port", 0);
  if (http_port != 0) {
    std::printf("  router   OpenAI-compatible API http://%s:%d/v1\n",
                http_listen.substr(0, http_listen.rfind(':')).c_str(), http_port);
  }
  for (size_t i = 1; i < children.size(); ++i) {
    std::printf("  %-8s gRPC 127.0.0.1:%d   metrics http://127.0.0.1:%d/metrics\n",
                children[i].name.c_str(), children[i].ready["grpc_port"].get<int>(),
                children[i].ready["metrics_port"].get<int>());
  }
  std::printf("Ctrl-C stops everything.\n");
  std::fflush(stdout);
  if (!ready_file.empty()) {
    std::vector<std::pair<std::string, int64_t>> fields = {
        {"grpc_port", children[0].ready["grpc_port"].get<int>()},
        {"metrics_port", children[0].ready["metrics_port"].get<int>()}};
    if (http_port != 0) fields.push_back({"http_port", http_port});
    for (size_t i = 1; i < children.size(); ++i) {
      fields.push_back(
          {children[i].name + "_metrics_port", children[i].ready["metrics_port"].get<int>()});
    }
    if (absl::Status s = writeReadyFile(ready_file, fields); !s.ok()) return fail(s);
  }
  while (true) {
    if (std::optional<int> signal = waitForShutdownSignal(std::chrono::milliseconds(200))) {
      std::fprintf(stderr, "cleave up: %s, stopping\n", *signal == SIGINT ? "Ctrl-C" : "SIGTERM");
      stopAll(children);
      std::filesystem::remove_all(work);
      return 0;
    }
    for (Child& child : children) {
      int status = 0;
      if (child.pid > 0 && waitpid(child.pid, &status, WNOHANG) == child.pid) {
        child.pid = -1;
        return fail(absl::UnavailableError(
            absl::StrCat(child.name, " exited unexpectedly (status ", status, ")")));
      }
    }
  }
}

}  // namespace cleave::cli
