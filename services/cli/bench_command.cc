// `cleave bench --router ADDR`: a load test against a running router. Closed loop
// (--concurrency clients) or open loop (Poisson --rate), prompt and output lengths fixed,
// uniform or from a file, a warm-up, a request count or duration; prints throughput,
// goodput under an SLO, and TTFT / inter-token / end-to-end percentiles, and writes JSON
// and an HTML report. --sweep runs one point per concurrency (or --sweep-rate per rate).
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/flags.h"
#include "common/progress.h"
#include "services/cli/commands.h"
#include "services/cli/router_client.h"
#include "services/loadgen/load_runner.h"
#include "services/loadgen/openai_sender.h"
#include "services/loadgen/report.h"

namespace cleave::cli {
namespace {

using loadgen::SweepPoint;

// "1,4,16" -> {1, 4, 16}; every value must be > 0.
absl::StatusOr<std::vector<double>> parseList(const std::string& text, const char* flag) {
  std::vector<double> values;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    double v = 0;
    if (!absl::SimpleAtod(item, &v) || !(v > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": '", item, "' is not a number > 0 (write e.g. 1,4,16)"));
    }
    values.push_back(v);
  }
  return values;
}

// The model's vocabulary size, for random prompts.
absl::StatusOr<uint32_t> vocabularyOf(client::RouterClient& client, const std::string& model) {
  absl::StatusOr<v1::ListModelsResponse> models = client.listModels();
  if (!models.ok()) return models.status();
  for (const v1::ModelInfo& info : models->models()) {
    // Without --model, the base model (listed first; its names and adapters share the
    // vocabulary).
    if (info.id() == model || model.empty()) return info.vocab_size();
  }
  return absl::FailedPreconditionError(
      models->models().empty() ? "the router has no registered worker yet; start one or wait for it"
                               : absl::StrCat("the router serves no model named ", model,
                                              "; name one of ListModels with --model"));
}

// `chat`: text prompts go as a user turn of the model's chat template.
loadgen::Sender senderFor(client::RouterClient& client, const std::string& model,
                          double temperature, int64_t timeout_s, bool chat) {
  return [&client, model, temperature, timeout_s, chat](
             const loadgen::PlannedRequest& planned, const std::function<void(uint32_t)>& on_tokens,
             loadgen::PromptUsage& prompt) {
    v1::GenerateRequest request;
    request.set_model(model);
    request.set_request_id(absl::StrCat("bench-", planned.index));
    if (!planned.prompt_text.empty() && chat) {
      v1::ChatMessage* turn = request.mutable_chat()->add_messages();
      turn->set_role("user");
      turn->set_content(planned.prompt_text);
    } else if (!planned.prompt_text.empty()) {
      request.set_text(planned.prompt_text);
    } else {
      request.mutable_token_ids()->mutable_ids()->Assign(planned.prompt_ids.begin(),
                                                         planned.prompt_ids.end());
    }
    request.mutable_sampling()->set_temperature(static_cast<float>(temperature));
    request.mutable_sampling()->set_seed(planned.index);
    request.mutable_stopping()->set_max_new_tokens(planned.output_tokens);
    request.mutable_stopping()->set_ignore_eos(true);
    return client.generate(
        request,
        [&](const v1::GenerateResponse& message) {
          on_tokens(static_cast<uint32_t>(message.token_ids_size()));
          if (message.has_final()) {
            prompt.tokens = message.final().usage().prompt_tokens();
            prompt.cached = message.final().usage().cached_prompt_tokens();
          }
          return true;
        },
        std::chrono::seconds(timeout_s));
  };
}

void printPoint(const SweepPoint& p) {
  const loadgen::Summary& s = p.summary;
  std::printf(
      "%-12s %5lld req %3lld failed  %7.2f req/s  %8.1f tok/s  goodput %6.2f req/s (%3.0f%%)  "
      "TTFT p50 %7.1f p99 %7.1f ms  ITL p50 %6.1f p99 %6.1f ms  E2E p50 %7.0f p99 %7.0f ms  "
      "cached %3.0f%%\n",
      loadgen::loadOf(p).c_str(), static_cast<long long>(s.requests),
      static_cast<long long>(s.failed), s.request_rate, s.output_token_rate, s.goodput,
      100 * s.slo_attainment, s.ttft_ms.p50, s.ttft_ms.p99, s.itl_ms.p50, s.itl_ms.p99,
      s.e2e_ms.p50, s.e2e_ms.p99,
      s.prompt_tokens > 0 ? 100.0 * s.cached_prompt_tokens / s.prompt_tokens : 0.0);
  std::fflush(stdout);
}

absl::Status writeFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace

int runBench(int argc, char** argv) {
  std::string router, openai_url, model, prompt_len = "128", output_len = "64", lengths_file, sweep,
                                         sweep_rate, json_path, html_path, label = "cleave";
  int64_t concurrency = 16, requests = 64, warmup = 2, seed = 1, timeout_s = 600, vocab_size = 0,
          shared_prefix_len = 0, prefix_groups = 1;
  double rate = 0, duration_s = 0, slo_ttft_ms = 0, slo_itl_ms = 0, temperature = 0;
  bool chat = false;
  FlagSet flags("cleave bench", "--router ADDR | --openai URL [flags]",
                "Load-tests a running router with streaming requests of random prompt tokens "
                "(or a lengths file) that generate exactly their output length, and reports "
                "throughput, goodput and latency percentiles.");
  flags.addString("router", &router, "Router address host:port");
  flags.addString("openai", &openai_url,
                  "Instead of --router: an OpenAI-compatible HTTP API, http://HOST:PORT (a "
                  "router's --http-listen, or another server's)");
  flags.addInt("vocab-size", &vocab_size,
               "With --openai: the vocabulary random prompt tokens come from, for a server that "
               "does not report it");
  flags.addString("model", &model, "Model id (needed only when the router serves several)");
  flags.addInt("concurrency", &concurrency,
               "Clients in a closed loop; with --rate, the most requests in flight");
  flags.addDouble("rate", &rate, "Open loop: Poisson arrivals per second (0: closed loop)");
  flags.addString("sweep", &sweep, "Run one point per concurrency, e.g. 1,4,16");
  flags.addString("sweep-rate", &sweep_rate, "Run one open-loop point per rate, e.g. 0.5,1,2");
  flags.addInt("requests", &requests, "Measured requests per point (0: until --duration)");
  flags.addDouble("duration", &duration_s, "Seconds per point (0: until --requests)");
  flags.addInt("warmup", &warmup, "Requests sent first at each point and not measured");
  flags.addString("prompt-len", &prompt_len, "Prompt tokens: N or MIN:MAX (uniform)");
  flags.addString("output-len", &output_len, "Generated tokens: N or MIN:MAX (uniform)");
  flags.addInt("shared-prefix-len", &shared_prefix_len,
               "Tokens of a prefix that prompts share (a system prompt, a document), before "
               "their own --prompt-len tokens");
  flags.addInt("prefix-groups", &prefix_groups,
               "Distinct shared prefixes; request i takes prefix i % N");
  flags.addString("lengths-file", &lengths_file,
                  "JSON lines of {\"prompt_tokens\"|\"prompt\", \"output_tokens\"} instead");
  flags.addBool("chat", &chat,
                "Send the lengths file's prompts as user turns through the model's chat template");
  flags.addDouble("slo-ttft-ms", &slo_ttft_ms, "Goodput SLO on time to first token (0: none)");
  flags.addDouble("slo-itl-ms", &slo_itl_ms,
                  "Goodput SLO on time per output token after the first (0: none)");
  flags.addDouble("temperature", &temperature, "Sampling temperature (0: greedy)");
  flags.addInt("seed", &seed, "Seed of prompts and arrival times");
  flags.addInt("timeout", &timeout_s, "Seconds a request may take");
  flags.addString("label", &label, "Name of this run in the report");
  flags.addString("json", &json_path, "Write the results as JSON to this file");
  flags.addString("html", &html_path, "Write an HTML report with charts to this file");
  std::vector<std::string> positional = parseFlagsOrExit(flags, argc, argv);
  auto fail = [&](const std::string& message) {
    exitWithUsageError(flags, absl::InvalidArgumentError(message));
  };
  if (router.empty() == openai_url.empty()) fail("give --router or --openai (one of them)");
  if (vocab_size < 0 || vocab_size > (1 << 30)) fail("--vocab-size must be in 0..2^30");
  if (!positional.empty()) fail(absl::StrCat("unexpected argument '", positional[0], "'"));
  if (concurrency < 1 || warmup < 0 || requests < 0 || duration_s < 0 || rate < 0) {
    fail("--concurrency must be >= 1 and --warmup, --requests, --duration, --rate >= 0");
  }
  if (requests == 0 && duration_s == 0) fail("set --requests or --duration (or both)");
  if (!sweep.empty() && !sweep_rate.empty()) fail("use --sweep or --sweep-rate, not both");
  if (shared_prefix_len < 0 || shared_prefix_len > (1 << 24) || prefix_groups < 1 ||
      prefix_groups > (1 << 24)) {
    fail("--shared-prefix-len must be in 0..2^24 and --prefix-groups in 1..2^24");
  }
  if (shared_prefix_len > 0 && !lengths_file.empty()) {
    fail("--shared-prefix-len prefixes random token prompts: leave out --lengths-file");
  }

  loadgen::WorkloadOptions workload_options{
      .seed = static_cast<uint64_t>(seed),
      .shared_prefix_len = static_cast<uint32_t>(shared_prefix_len),
      .prefix_groups = static_cast<uint32_t>(prefix_groups)};
  if (!lengths_file.empty()) {
    absl::StatusOr<std::vector<loadgen::RequestShape>> shapes =
        loadgen::readLengthsFile(lengths_file);
    if (!shapes.ok()) exitWithUsageError(flags, shapes.status());
    workload_options.shapes = *std::move(shapes);
    prompt_len = output_len = absl::StrCat("file:", lengths_file);
    for (const loadgen::RequestShape& shape : workload_options.shapes) {
      if (chat && shape.prompt.empty()) fail("--chat needs a \"prompt\" text on every row");
    }
  } else {
    if (chat) fail("--chat sends text prompts: give a --lengths-file whose rows have \"prompt\"");
    auto p = loadgen::LengthRange::parse(prompt_len, "--prompt-len");
    auto o = loadgen::LengthRange::parse(output_len, "--output-len");
    if (!p.ok()) exitWithUsageError(flags, p.status());
    if (!o.ok()) exitWithUsageError(flags, o.status());
    workload_options.prompt_len = *p;
    workload_options.output_len = *o;
    if (shared_prefix_len > 0) {
      prompt_len =
          absl::StrCat(shared_prefix_len, " shared (", prefix_groups, " groups) + ", prompt_len);
    }
  }
  // The sweep: (concurrency, rate) per point.
  std::vector<std::pair<int64_t, double>> points;
  if (!sweep.empty() || !sweep_rate.empty()) {
    auto values =
        parseList(sweep.empty() ? sweep_rate : sweep, sweep.empty() ? "sweep-rate" : "sweep");
    if (!values.ok()) exitWithUsageError(flags, values.status());
    for (double v : *values) {
      if (sweep.empty()) {
        points.emplace_back(concurrency, v);
      } else {
        points.emplace_back(static_cast<int64_t>(v), rate);
      }
    }
  } else {
    points.emplace_back(concurrency, rate);
  }

  std::unique_ptr<client::RouterClient> client;
  absl::StatusOr<uint32_t> vocab = static_cast<uint32_t>(vocab_size);
  loadgen::OpenAiTarget target{
      .model = model, .chat = chat, .temperature = temperature, .timeout_s = timeout_s};
  if (!openai_url.empty()) {
    if (absl::Status parsed = loadgen::parseOpenAiUrl(openai_url, target); !parsed.ok()) {
      exitWithUsageError(flags, parsed);
    }
    if (const char* key = std::getenv("CLEAVE_API_KEY"); key != nullptr) target.api_key = key;
    absl::StatusOr<loadgen::OpenAiModel> served = loadgen::openAiModel(target);
    if (!served.ok()) {
      vocab = served.status();
    } else if (vocab_size == 0) {
      vocab =
          served->vocab_size != 0
              ? absl::StatusOr<uint32_t>(served->vocab_size)
              : absl::FailedPreconditionError(absl::StrCat(openai_url,
                                                           " does not report its vocabulary; pass "
                                                           "--vocab-size"));
    }
  } else {
    client = std::make_unique<client::RouterClient>(client::RouterClientOptions{.address = router});
    const absl::Status connected = client->waitUntilConnected();
    vocab = connected.ok() ? vocabularyOf(*client, model) : connected;
  }
  if (!vocab.ok()) {
    std::fprintf(stderr, "cleave bench: %s\n", std::string(vocab.status().message()).c_str());
    return 1;
  }
  workload_options.vocab_size = *vocab;
  if (workload_options.vocab_size < 16) {
    std::fprintf(stderr, "cleave bench: the model reports a vocabulary of %u tokens\n", *vocab);
    return 1;
  }
  const loadgen::Workload workload(workload_options);
  const loadgen::Sender send = client != nullptr
                                   ? senderFor(*client, model, temperature, timeout_s, chat)
                                   : loadgen::openAiSender(target);

  std::vector<std::string> args(argv, argv + argc);
  loadgen::BenchRun run{.label = label,
                        .command = absl::StrCat("cleave ", absl::StrJoin(args, " ")),
                        .router = router.empty() ? openai_url : router,
                        .prompt_len = prompt_len,
                        .output_len = output_len,
                        .slo = {slo_ttft_ms, slo_itl_ms}};
  int64_t failed = 0;
  for (const auto& [point_concurrency, point_rate] : points) {
    ProgressLine progress;
    loadgen::RunOptions options{.concurrency = point_concurrency,
                                .rate = point_rate,
                                .warmup = warmup,
                                .requests = requests,
                                .duration_s = duration_s,
                                .seed = static_cast<uint64_t>(seed)};
    if (progress.enabled()) {
      const std::string load = loadgen::loadOf({point_concurrency, point_rate, {}});
      options.on_progress = [&](const loadgen::RunProgress& p) {
        progress.update(absl::StrFormat(
            "[%s] %d%s done, %d failed, %d in flight, %.0f tok/s, %.1f s", load, p.done,
            requests > 0 ? absl::StrCat("/", requests) : "", p.failed, p.in_flight,
            p.elapsed_s > 0 ? static_cast<double>(p.output_tokens) / p.elapsed_s : 0, p.elapsed_s));
      };
    }
    std::vector<loadgen::RequestRecord> records = loadgen::runLoad(workload, send, options);
    progress.finish();
    SweepPoint point{point_concurrency, point_rate, loadgen::summarize(records, run.slo)};
    printPoint(point);
    if (point.summary.failed > 0) {
      std::fprintf(stderr, "cleave bench: %lld requests failed; the first: %s\n",
                   static_cast<long long>(point.summary.failed), point.summary.first_error.c_str());
    }
    failed += point.summary.failed;
    run.points.push_back(std::move(point));
  }
  for (const auto& [path, text] :
       {std::pair{json_path, json_path.empty() ? "" : loadgen::runToJson(run)},
        std::pair{html_path,
                  html_path.empty()
                      ? ""
                      : loadgen::htmlReport({&run, 1}, absl::StrCat("cleave bench: ", label))}}) {
    if (path.empty()) continue;
    if (absl::Status written = writeFile(path, text); !written.ok()) {
      std::fprintf(stderr, "cleave bench: %s\n", std::string(written.message()).c_str());
      return 1;
    }
  }
  return failed > 0 ? 1 : 0;
}

}  // namespace cleave::cli
