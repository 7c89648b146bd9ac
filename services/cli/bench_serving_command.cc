// `cleave bench-serving --router ADDR`: a streaming workload against a running router:
// chat prompts sent by `--concurrency` clients until `--requests` are done; prints time
// to first token and inter-token latency percentiles and the throughput.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "services/cli/commands.h"
#include "services/cli/router_client.h"

namespace cleave::cli {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kQuestions[] = {
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain in two sentences why the sky is blue.",
    "Give three tips for learning a new language.",
    "What does a compiler do?",
    "Describe a sunrise over the mountains.",
    "Why do cats purr?",
    "Summarize the plot of a detective story in three sentences.",
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

}  // namespace

int runBenchServing(int argc, char** argv) {
  std::string router;
  int64_t requests = 32, concurrency = 16, max_tokens = 64;
  FlagSet flags("cleave bench-serving", "--router ADDR [flags]",
                "Streams chat requests through a running router from --concurrency clients and "
                "reports time to first token, inter-token latency and throughput.");
  flags.addString("router", &router, "Router address host:port");
  flags.addInt("requests", &requests, "Requests to send in all");
  flags.addInt("concurrency", &concurrency, "Requests in flight at once");
  flags.addInt("max-tokens", &max_tokens, "Most tokens per request");
  std::vector<std::string> positional = parseFlagsOrExit(flags, argc, argv);
  if (router.empty()) exitWithUsageError(flags, absl::InvalidArgumentError("--router is required"));
  if (!positional.empty() || requests < 1 || concurrency < 1 || max_tokens < 1) {
    exitWithUsageError(
        flags, absl::InvalidArgumentError("--requests, --concurrency, --max-tokens must be >= 1"));
  }
  client::RouterClient client({.address = router});
  std::atomic<int64_t> next{0};
  std::mutex mu;
  std::vector<double> ttft_ms, itl_ms;
  int64_t tokens = 0, failed = 0;
  std::string first_error;
  const auto start = Clock::now();
  std::vector<std::thread> clients;
  for (int64_t c = 0; c < concurrency; ++c) {
    clients.emplace_back([&] {
      for (int64_t i = next++; i < requests; i = next++) {
        v1::GenerateRequest request;
        request.set_text(absl::StrCat("<|im_start|>user\n", kQuestions[i % std::size(kQuestions)],
                                      "<|im_end|>\n<|im_start|>assistant\n"));
        request.set_parse_special_tokens(true);
        request.mutable_sampling()->set_temperature(0.7f);
        request.mutable_sampling()->set_seed(static_cast<uint64_t>(i));
        request.mutable_stopping()->set_max_new_tokens(static_cast<uint32_t>(max_tokens));
        const auto sent = Clock::now();
        auto last = sent;
        std::vector<double> gaps;
        double first = -1;
        int64_t count = 0;
        absl::Status status = client.generate(
            request,
            [&](const v1::GenerateResponse& message) {
              const auto now = Clock::now();
              if (message.token_ids_size() > 0) {
                const double ms = std::chrono::duration<double, std::milli>(now - last).count();
                if (first < 0) {
                  first = std::chrono::duration<double, std::milli>(now - sent).count();
                } else {
                  gaps.push_back(ms / message.token_ids_size());
                }
                last = now;
                count += message.token_ids_size();
              }
              return true;
            },
            std::chrono::minutes(10));
        std::lock_guard<std::mutex> lock(mu);
        if (!status.ok()) {
          if (failed++ == 0) first_error = std::string(status.message());
          continue;
        }
        ttft_ms.push_back(first);
        itl_ms.insert(itl_ms.end(), gaps.begin(), gaps.end());
        tokens += count;
      }
    });
  }
  for (std::thread& t : clients) t.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf("requests %lld (failed %lld) at concurrency %lld in %.2f s\n",
              static_cast<long long>(requests), static_cast<long long>(failed),
              static_cast<long long>(concurrency), seconds);
  std::printf("output tokens %lld: %.1f tokens/s\n", static_cast<long long>(tokens),
              tokens / seconds);
  std::printf("time to first token (ms): p50 %.1f  p90 %.1f  p99 %.1f\n", percentile(ttft_ms, 0.5),
              percentile(ttft_ms, 0.9), percentile(ttft_ms, 0.99));
  std::printf("inter-token latency (ms): p50 %.1f  p90 %.1f  p99 %.1f\n", percentile(itl_ms, 0.5),
              percentile(itl_ms, 0.9), percentile(itl_ms, 0.99));
  if (failed > 0) {
    std::fprintf(stderr, "cleave bench-serving: %lld requests failed; the first: %s\n",
                 static_cast<long long>(failed), first_error.c_str());
    return 1;
  }
  return 0;
}

}  // namespace cleave::cli
