// cleave-router: the client-facing endpoint of a Cleave deployment.
#include <algorithm>
#include <csignal>
#include <filesystem>
#include <string>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/flags.h"
#include "common/grpc_logging.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/process_init.h"
#include "common/ready_file.h"
#include "common/server_flags.h"
#include "common/shutdown.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "services/router/openai_server.h"
#include "services/router/router_server.h"
#include "services/router/sampling_defaults.h"

int main(int argc, char** argv) {
  cleave::initProcess();
#if defined(__GLIBC__)
  // One malloc arena for every thread. The router's threads only relay small messages, so
  // they do not contend for it; with an arena per thread, glibc's free memory fragments
  // across arenas and resident memory creeps (+1.3% in 10 minutes of streaming load, the
  // live heap flat), against +0.7% and settling with one (tests/e2e/soak_test.py).
  mallopt(M_ARENA_MAX, 1);
#endif
  cleave::blockShutdownSignals();
  cleave::routeGrpcLogsToDebug();

  cleave::ServerFlags server_flags{.listen = "127.0.0.1:50051", .metrics_port = 9400};
  int64_t queue_capacity = 1024;
  int64_t shutdown_grace_ms = 5000;
  int64_t heartbeat_interval_ms = 1000;
  int64_t lease_timeout_ms = 5000;
  int64_t max_migrations = 3;
  std::string prefill_policy = "cache_aware";
  int64_t local_prefill_tokens = 0;
  std::string api_keys_file;
  cleave::ServerTls tls;
  std::string worker_ca;
  double api_key_rate = 0;
  std::string model;
  std::string served_model_name;
  bool log_requests = false;
  std::string generation_config = "auto";
  std::string chat_template_file;
  std::string http_listen;
  int64_t http_threads = 128;
  int64_t http_response_store_mib = 256;
  std::string http_allowed_origins = "*";
  std::string reasoning_parser;
  std::string tool_call_parser;
  cleave::FlagSet flags("cleave-router", "[flags]",
                        "Serves the cleave.v1.Generation API, admits requests against the KV "
                        "budget of the registered decode workers and relays their token "
                        "streams. Also serves grpc.health.v1 and server reflection.");
  server_flags.addTo(flags);
  flags.addInt("queue-capacity", &queue_capacity, "Requests that may wait for admission");
  flags.addBool("log-requests", &log_requests,
                "Log one line per Generate call when it ends: its id, API key name, model, "
                "prompt/cached/completion tokens, time to first token, total time, the decode "
                "workers it ran on and its outcome (never the prompt or the reply)");
  flags.addString("served-model-name", &served_model_name,
                  "The names clients call the model by, comma-separated (the first is the one "
                  "replies and /v1/models report), instead of the id its workers register");
  flags.addString("model", &model,
                  "The model file or folder the workers serve: its tokenizer turns text prompts "
                  "into tokens (without it only token-id prompts are served)");
  flags.addString("generation-config", &generation_config,
                  "auto: requests that leave temperature, top_p, top_k, min_p or "
                  "repetition_penalty unset get the values the --model folder's "
                  "generation_config.json recommends (as vLLM's default); a folder: its "
                  "generation_config.json's; none (or vllm): they do not");
  flags.addString("chat-template", &chat_template_file,
                  "A Jinja chat template file for chat prompts, instead of the one in --model");
  flags.addString(
      "http-listen", &http_listen,
      "Also serve the OpenAI-compatible HTTP API (/v1/completions, "
      "/v1/chat/completions, /v1/models...) on this host:port (port 0 picks one). Plain "
      "HTTP: with --tls-cert only on loopback, for a TLS proxy in front");
  flags.addString("reasoning-parser", &reasoning_parser,
                  "With --http-listen: split chat replies of reasoning models into "
                  "reasoning_content and content: qwen3 (replies that open <think>), "
                  "deepseek_r1 (replies that start inside it), glm45 (replies that reason only "
                  "in a block they open) or openai_gptoss (gpt-oss's harmony channels)");
  flags.addString("tool-call-parser", &tool_call_parser,
                  "With --http-listen: return the tool calls in chat replies to requests with "
                  "tools as tool_calls: hermes (<tool_call> JSON </tool_call>), llama3_json, "
                  "mistral ([TOOL_CALLS]), deepseek_v3 (<｜tool▁calls▁begin｜>), qwen3_coder "
                  "(<tool_call><function=...>), glm45 (<tool_call>NAME<arg_key>...), pythonic "
                  "([f(x=1)]) or openai (gpt-oss's harmony calls, with --reasoning-parser "
                  "openai_gptoss)");
  flags.addInt("http-threads", &http_threads,
               "HTTP requests served at once (each streaming response holds one)");
  flags.addInt("http-response-store-mib", &http_response_store_mib,
               "With --http-listen: memory for Responses API responses kept for "
               "previous_response_id and GET /v1/responses/ID (least recently used go first); "
               "0 keeps none");
  flags.addString("http-allowed-origins", &http_allowed_origins,
                  "With --http-listen: origins whose web pages may call the API (CORS), "
                  "comma-separated, or * for any; empty for none");
  flags.addInt("heartbeat-interval-ms", &heartbeat_interval_ms, "How often workers heartbeat");
  flags.addInt("lease-timeout-ms", &lease_timeout_ms,
               "A worker silent this long is dropped; its requests move to other workers");
  flags.addString("api-keys", &api_keys_file,
                  "A file of API keys (one per line, optionally 'NAME KEY'); when set, client "
                  "calls need 'authorization: Bearer KEY'. Re-read when it changes");
  flags.addString("tls-cert", &tls.cert_file,
                  "Serve TLS with this certificate chain (PEM; with --tls-key)");
  flags.addString("tls-key", &tls.key_file, "The private key of --tls-cert (PEM)");
  flags.addString("tls-client-ca", &tls.client_ca_file,
                  "Workers must present a client certificate signed by this CA (PEM) to "
                  "register; API clients need none");
  flags.addString("worker-ca", &worker_ca,
                  "Call workers over TLS, verifying them with this CA (PEM); the router presents "
                  "its --tls-cert as a client certificate");
  flags.addDouble("api-key-rate", &api_key_rate,
                  "Generate calls per second each API key may make (bursts of one second's "
                  "worth); over it: RESOURCE_EXHAUSTED. 0: no limit");
  flags.addString("prefill-policy", &prefill_policy,
                  "How a prompt's prefill worker is chosen: cache_aware (the one that would "
                  "finish it first, counting the prompt's prefix it holds cached as done) or "
                  "least_loaded (the fewest prompt tokens outstanding)");
  flags.addInt("local-prefill-tokens", &local_prefill_tokens,
               "A decode worker (--role=decode or both) computes a prompt itself, even where "
               "prefill workers are registered, when at most this many of its tokens are not in "
               "its cache (a conversation's next turn: nothing moves); 0: never");
  flags.addInt("max-migrations", &max_migrations,
               "Times one request may move to another decode worker after losing its own");
  flags.addInt("shutdown-grace-ms", &shutdown_grace_ms,
               "On SIGINT/SIGTERM, how long running calls may take to finish");
  std::vector<std::string> positional = cleave::parseFlagsOrExit(flags, argc, argv);
  if (!positional.empty()) {
    cleave::exitWithUsageError(
        flags, absl::InvalidArgumentError("unexpected argument '" + positional[0] + "'"));
  }
  if (absl::Status valid = server_flags.validate(); !valid.ok()) {
    cleave::exitWithUsageError(flags, valid);
  }
  if (queue_capacity < 0 || queue_capacity > (1 << 20)) {
    cleave::exitWithUsageError(
        flags, absl::InvalidArgumentError("--queue-capacity must be in 0..1048576"));
  }

  std::vector<std::string> served_model_names;
  for (absl::string_view name : absl::StrSplit(served_model_name, ',', absl::SkipEmpty())) {
    name = absl::StripAsciiWhitespace(name);
    if (name.empty() || std::find(served_model_names.begin(), served_model_names.end(), name) !=
                            served_model_names.end()) {
      cleave::exitWithUsageError(
          flags,
          absl::InvalidArgumentError("--served-model-name: names must be distinct and not blank"));
    }
    served_model_names.emplace_back(name);
  }
  if (local_prefill_tokens < 0) {
    cleave::exitWithUsageError(flags,
                               absl::InvalidArgumentError("--local-prefill-tokens must be >= 0"));
  }
  if (prefill_policy != "cache_aware" && prefill_policy != "least_loaded") {
    cleave::exitWithUsageError(
        flags, absl::InvalidArgumentError("--prefill-policy must be cache_aware or least_loaded"));
  }
  if (max_migrations < 0 || max_migrations > 100) {
    cleave::exitWithUsageError(flags,
                               absl::InvalidArgumentError("--max-migrations must be in 0..100"));
  }
  if (heartbeat_interval_ms < 1 || lease_timeout_ms <= heartbeat_interval_ms) {
    cleave::exitWithUsageError(
        flags, absl::InvalidArgumentError("--lease-timeout-ms must exceed --heartbeat-interval-ms "
                                          "(both >= 1)"));
  }
  std::shared_ptr<cleave::router::ApiKeys> api_keys;
  if (!api_keys_file.empty()) {
    if (api_key_rate < 0) {
      cleave::exitWithUsageError(flags, absl::InvalidArgumentError("--api-key-rate must be >= 0"));
    }
    auto loaded = cleave::router::ApiKeys::load(api_keys_file, api_key_rate);
    if (!loaded.ok()) cleave::exitWithUsageError(flags, loaded.status());
    api_keys = std::move(*loaded);
  }
  std::shared_ptr<const cleave::tokenizer::Tokenizer> tokenizer;
  if (!model.empty()) {
    auto loaded = cleave::tokenizer::Tokenizer::load(model);
    if (!loaded.ok()) cleave::exitWithUsageError(flags, loaded.status());
    tokenizer = std::move(*loaded);
  }
  std::shared_ptr<const cleave::tokenizer::ChatTemplate> chat_template;
  std::string no_chat_template_reason = "no --model";
  if (!chat_template_file.empty() && tokenizer == nullptr) {
    cleave::exitWithUsageError(flags, absl::InvalidArgumentError("--chat-template needs --model"));
  }
  if (tokenizer != nullptr) {
    auto loaded = cleave::tokenizer::ChatTemplate::load(model, *tokenizer, chat_template_file);
    if (loaded.ok()) {
      chat_template = std::make_shared<const cleave::tokenizer::ChatTemplate>(*std::move(loaded));
    } else if (!chat_template_file.empty()) {
      cleave::exitWithUsageError(flags, loaded.status());
    } else {
      // Text and token-id prompts are still served.
      CLEAVE_LOG(WARNING) << loaded.status().message() << "; chat prompts will be refused";
      no_chat_template_reason = std::string(loaded.status().message());
    }
  }

  cleave::v1::SamplingParams sampling_defaults;
  const std::string recommending = generation_config == "auto" ? model
                                   : generation_config == "none" || generation_config == "vllm"
                                       ? std::string()
                                       : generation_config;
  if (!recommending.empty() && recommending != model &&
      !std::filesystem::is_directory(recommending)) {
    cleave::exitWithUsageError(flags, absl::InvalidArgumentError(absl::StrCat(
                                          "--generation-config must be auto, none or a folder "
                                          "holding a generation_config.json, got '",
                                          generation_config, "'")));
  }
  if (!recommending.empty()) {
    auto defaults = cleave::router::readSamplingDefaults(recommending);
    if (!defaults.ok()) cleave::exitWithUsageError(flags, defaults.status());
    sampling_defaults = std::move(*defaults);
    if (const std::string set = cleave::router::describeSamplingDefaults(sampling_defaults);
        !set.empty()) {
      CLEAVE_LOG(INFO) << "requests that leave them unset sample with the model's " << set
                       << " (its generation_config.json; --generation-config none for not)";
    }
  }

  cleave::registerProcessMetrics("router");
  auto metrics = cleave::MetricsServer::start(server_flags.metrics_address,
                                              static_cast<int>(server_flags.metrics_port));
  if (!metrics.ok()) cleave::exitWithUsageError(flags, metrics.status());

  std::shared_ptr<grpc::ChannelCredentials> to_workers;
  if (!worker_ca.empty()) {
    auto credentials = cleave::channelCredentials(
        {.ca_file = worker_ca, .cert_file = tls.cert_file, .key_file = tls.key_file});
    if (!credentials.ok()) cleave::exitWithUsageError(flags, credentials.status());
    to_workers = *credentials;
  }
  cleave::router::RouterServerOptions options{
      .listen_address = server_flags.listen,
      .generation = {.queue_capacity = static_cast<uint32_t>(queue_capacity),
                     .max_migrations = static_cast<int>(max_migrations),
                     .api_keys = api_keys,
                     .chat_template = chat_template,
                     .no_chat_template_reason = no_chat_template_reason,
                     .log_requests = log_requests,
                     .sampling_defaults = sampling_defaults},
      .workers = {.heartbeat_interval = std::chrono::milliseconds(heartbeat_interval_ms),
                  .lease_timeout = std::chrono::milliseconds(lease_timeout_ms),
                  .queue_capacity = queue_capacity,
                  .worker_credentials = to_workers,
                  .prefix_aware = prefill_policy == "cache_aware",
                  .local_prefill_tokens = local_prefill_tokens,
                  .served_model_names = served_model_names},
      .tokenizer = tokenizer,
      .tls = tls};
  auto server = cleave::router::RouterServer::start(options);
  if (!server.ok()) cleave::exitWithUsageError(flags, server.status());

  // Declared after the router: destroyed first, once the router's calls have ended.
  std::unique_ptr<cleave::router::OpenAiServer> http;
  const absl::StatusOr<cleave::router::ReasoningFormat> reasoning =
      cleave::router::reasoningFormat(reasoning_parser);
  const absl::StatusOr<cleave::router::ToolCallFormat> tool_calls =
      cleave::router::toolCallFormat(tool_call_parser);
  for (const absl::Status& s :
       {reasoning.status(), tool_calls.status(),
        (reasoning_parser.empty() && tool_call_parser.empty()) || !http_listen.empty()
            ? absl::OkStatus()
            : absl::InvalidArgumentError("--reasoning-parser and --tool-call-parser need "
                                         "--http-listen")}) {
    if (!s.ok()) {
      (*server)->shutdown(std::chrono::milliseconds(0));
      cleave::exitWithUsageError(flags, s);
    }
  }
  if (!http_listen.empty()) {
    // The HTTP API has no TLS of its own: a deployment that asks for TLS gets it on
    // loopback only, behind a proxy that terminates TLS.
    const std::string http_host = http_listen.substr(0, http_listen.rfind(':'));
    const bool loopback = http_host == "127.0.0.1" || http_host == "localhost" ||
                          http_host == "[::1]" || http_host.starts_with("127.");
    if (!tls.cert_file.empty() && !loopback) {
      (*server)->shutdown(std::chrono::milliseconds(0));
      cleave::exitWithUsageError(
          flags, absl::InvalidArgumentError(
                     "--http-listen serves plain HTTP; with --tls-cert it must be a loopback "
                     "address (127.0.0.1:PORT) behind a TLS-terminating proxy"));
    }
    if (api_keys != nullptr && !loopback) {
      CLEAVE_LOG(WARNING) << "--http-listen " << http_listen
                          << " is plain HTTP: API keys cross the network unencrypted; put a TLS "
                             "proxy in front";
    }
    if (http_response_store_mib < 0 || http_response_store_mib > (int64_t{1} << 20)) {
      (*server)->shutdown(std::chrono::milliseconds(0));
      cleave::exitWithUsageError(
          flags, absl::InvalidArgumentError("--http-response-store-mib must be in 0..1048576"));
    }
    if (http_threads < 1 || http_threads > 4096) {
      (*server)->shutdown(std::chrono::milliseconds(0));
      cleave::exitWithUsageError(flags,
                                 absl::InvalidArgumentError("--http-threads must be in 1..4096"));
    }
    auto started = cleave::router::OpenAiServer::start(
        {.listen = http_listen, .threads = static_cast<int>(http_threads)},
        (*server)->inProcessChannel(),
        {.reasoning = *reasoning,
         .tool_calls = *tool_calls,
         .response_store_bytes = http_response_store_mib << 20,
         .allowed_origins = http_allowed_origins,
         .sampling_defaults = sampling_defaults});
    if (!started.ok()) {
      (*server)->shutdown(std::chrono::milliseconds(0));
      cleave::exitWithUsageError(flags, started.status());
    }
    http = std::move(*started);
  }
  if (!server_flags.ready_file.empty()) {
    std::vector<std::pair<std::string, int64_t>> ports = {{"grpc_port", (*server)->port()},
                                                          {"metrics_port", (*metrics)->port()}};
    if (http != nullptr) ports.emplace_back("http_port", http->port());
    absl::Status written = cleave::writeReadyFile(server_flags.ready_file, ports);
    if (!written.ok()) {
      (*server)->shutdown(std::chrono::milliseconds(0));
      cleave::exitWithUsageError(flags, written);
    }
  }

  CLEAVE_LOG(INFO) << "cleave-router serving gRPC on port " << (*server)->port()
                   << ", metrics on port " << (*metrics)->port()
                   << (http != nullptr ? ", the OpenAI-compatible HTTP API on port " +
                                             std::to_string(http->port())
                                       : "");
  int signal = cleave::serveUntilShutdownSignal();
  CLEAVE_LOG(INFO) << "received " << (signal == SIGINT ? "SIGINT" : "SIGTERM") << ", shutting down";
  (*server)->shutdown(std::chrono::milliseconds(shutdown_grace_ms));
  CLEAVE_LOG(INFO) << "cleave-router stopped";
  return 0;
}
