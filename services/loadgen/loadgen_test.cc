#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <thread>

#include "services/loadgen/lengths.h"
#include "services/loadgen/load_runner.h"
#include "services/loadgen/openai_sender.h"
#include "services/loadgen/report.h"
#include "services/loadgen/summary.h"
#include "services/loadgen/svg_chart.h"
#include "services/loadgen/workload.h"

namespace cleave::loadgen {
namespace {

using ::testing::HasSubstr;

TEST(LengthRangeTest, ParsesFixedAndUniform) {
  auto fixed = LengthRange::parse("128", "--prompt-len");
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_EQ(fixed->min, 128u);
  EXPECT_EQ(fixed->max, 128u);
  auto range = LengthRange::parse("64:256", "--prompt-len");
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(range->min, 64u);
  EXPECT_EQ(range->max, 256u);
  EXPECT_EQ(range->toString(), "64:256");
  std::mt19937_64 rng(7);
  bool low = false, high = false;
  for (int i = 0; i < 2000; ++i) {
    const uint32_t v = range->sample(rng);
    ASSERT_GE(v, 64u);
    ASSERT_LE(v, 256u);
    low |= v < 80;
    high |= v > 240;
  }
  EXPECT_TRUE(low && high) << "uniform samples should reach both ends";
}

TEST(LengthRangeTest, RejectsWhatIsNotALength) {
  for (const char* bad : {"0", "abc", "", "9:3", "4:", "-1"}) {
    auto r = LengthRange::parse(bad, "--output-len");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_THAT(r.status().message(), HasSubstr("--output-len")) << bad;
  }
}

std::string writeTemp(const std::string& text) {
  char path[] = "/tmp/loadgen_test_XXXXXX";
  const int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  ::close(fd);
  std::ofstream(path) << text;
  return path;
}

TEST(LengthsFileTest, ReadsTokenCountsAndPrompts) {
  const std::string path = writeTemp(
      "{\"prompt_tokens\": 300, \"output_tokens\": 20}\n\n{\"prompt\": \"Hi there\", "
      "\"output_tokens\": 5}\n");
  auto shapes = readLengthsFile(path);
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  ASSERT_EQ(shapes->size(), 2u);
  EXPECT_EQ((*shapes)[0].prompt_tokens, 300u);
  EXPECT_EQ((*shapes)[0].output_tokens, 20u);
  EXPECT_EQ((*shapes)[1].prompt, "Hi there");
  EXPECT_EQ((*shapes)[1].output_tokens, 5u);
  std::remove(path.c_str());
}

TEST(LengthsFileTest, ErrorsNameTheLineAndField) {
  struct Case {
    const char* text;
    const char* expected;
  };
  for (const Case& c :
       {Case{"{\"prompt_tokens\": 3}\n", ":1: \"output_tokens\""},
        Case{"{\"prompt_tokens\": 3, \"output_tokens\": 2}\nnot json\n", ":2: not a JSON object"},
        Case{"{\"output_tokens\": 2}\n", "give \"prompt\""},
        Case{"{\"prompt\": 7, \"output_tokens\": 2}\n", "\"prompt\" must be"},
        Case{"\n\n", "has no requests"}}) {
    const std::string path = writeTemp(c.text);
    auto shapes = readLengthsFile(path);
    ASSERT_FALSE(shapes.ok()) << c.text;
    EXPECT_THAT(shapes.status().message(), HasSubstr(c.expected));
    EXPECT_THAT(shapes.status().message(), HasSubstr(path));
    std::remove(path.c_str());
  }
  EXPECT_FALSE(readLengthsFile("/nonexistent/lengths.jsonl").ok());
}

TEST(WorkloadTest, RequestsAreAFunctionOfSeedAndIndex) {
  const Workload workload(
      {.prompt_len = {10, 40}, .output_len = {3, 9}, .vocab_size = 1600, .seed = 5});
  for (uint64_t i = 0; i < 50; ++i) {
    const PlannedRequest a = workload.at(i), b = workload.at(i);
    EXPECT_EQ(a.prompt_ids, b.prompt_ids);
    EXPECT_EQ(a.output_tokens, b.output_tokens);
    EXPECT_GE(a.prompt_ids.size(), 10u);
    EXPECT_LE(a.prompt_ids.size(), 40u);
    EXPECT_GE(a.output_tokens, 3u);
    EXPECT_LE(a.output_tokens, 9u);
    for (uint32_t id : a.prompt_ids) {
      ASSERT_GE(id, 100u);  // Past the first 1/16 of the vocabulary.
      ASSERT_LT(id, 1600u);
    }
  }
  EXPECT_NE(workload.at(0).prompt_ids, workload.at(1).prompt_ids);
  const Workload other(
      {.prompt_len = {10, 40}, .output_len = {3, 9}, .vocab_size = 1600, .seed = 6});
  EXPECT_NE(workload.at(0).prompt_ids, other.at(0).prompt_ids);
}

TEST(WorkloadTest, GroupsShareTheirPrefixAndNothingElse) {
  const Workload workload({.prompt_len = {10, 10},
                           .output_len = {3, 3},
                           .vocab_size = 1600,
                           .shared_prefix_len = 50,
                           .prefix_groups = 3});
  auto head = [&](uint64_t i) {
    const std::vector<uint32_t> p = workload.at(i).prompt_ids;
    EXPECT_EQ(p.size(), 60u);
    return std::vector<uint32_t>(p.begin(), p.begin() + 50);
  };
  auto tail = [&](uint64_t i) {
    const std::vector<uint32_t> p = workload.at(i).prompt_ids;
    return std::vector<uint32_t>(p.begin() + 50, p.end());
  };
  EXPECT_EQ(head(0), head(3));
  EXPECT_EQ(head(1), head(7));
  EXPECT_NE(head(0), head(1));
  EXPECT_NE(head(1), head(2));
  EXPECT_NE(tail(0), tail(3));
  // The prefix is drawn apart from the requests' own tokens: without it they are the same.
  const Workload plain({.prompt_len = {10, 10}, .output_len = {3, 3}, .vocab_size = 1600});
  EXPECT_EQ(tail(4), plain.at(4).prompt_ids);
}

TEST(WorkloadTest, ShapesFromAFileAreCycled) {
  const Workload workload({.shapes = {{"", 4, 2}, {"text", 0, 7}}, .vocab_size = 100});
  EXPECT_EQ(workload.at(0).prompt_ids.size(), 4u);
  EXPECT_EQ(workload.at(1).prompt_text, "text");
  EXPECT_TRUE(workload.at(1).prompt_ids.empty());
  EXPECT_EQ(workload.at(3).output_tokens, 7u);
}

// numpy.percentile([1..10], [50, 90, 99]) = 5.5, 9.1, 9.91.
TEST(SummaryTest, PercentilesInterpolateLikeNumpy) {
  const Distribution d = distributionOf({10, 3, 1, 7, 2, 9, 4, 8, 6, 5});
  EXPECT_EQ(d.count, 10);
  EXPECT_DOUBLE_EQ(d.mean, 5.5);
  EXPECT_DOUBLE_EQ(d.p50, 5.5);
  EXPECT_NEAR(d.p90, 9.1, 1e-12);
  EXPECT_NEAR(d.p99, 9.91, 1e-12);
  EXPECT_DOUBLE_EQ(d.max, 10);
  EXPECT_EQ(distributionOf({}).count, 0);
  EXPECT_DOUBLE_EQ(distributionOf({4}).p99, 4);
}

RequestRecord record(double sent, double first, double done, uint32_t prompt, uint32_t out) {
  RequestRecord r;
  r.arrival_s = sent;
  r.sent_s = sent;
  r.first_token_s = first;
  r.done_s = done;
  r.prompt_tokens = prompt;
  r.output_tokens = out;
  return r;
}

// By hand: measured requests span 1.0 s .. 3.0 s; A (TTFT 100 ms, 50 ms/token) meets
// the SLO, B (TTFT 500 ms) does not, C failed, the warm-up one is not counted.
TEST(SummaryTest, RatesAndGoodputByHand) {
  std::vector<RequestRecord> records;
  records.push_back(record(0.0, 0.5, 0.9, 10, 4));
  records.back().warmup = true;
  records.push_back(record(1.0, 1.1, 1.6, 20, 11));  // (1.6 - 1.1) / 10 = 50 ms per token.
  records.back().itl_s = std::vector<double>(10, 0.05);
  records.push_back(record(1.5, 2.0, 3.0, 30, 6));  // TTFT 500 ms, 200 ms per token.
  records.back().itl_s = std::vector<double>(5, 0.2);
  records.push_back(record(2.0, -1, 2.5, 40, 0));
  records.back().status = absl::UnavailableError("worker gone");
  const Summary s = summarize(records, {.ttft_ms = 200, .itl_ms = 60});
  EXPECT_EQ(s.requests, 3);
  EXPECT_EQ(s.failed, 1);
  EXPECT_THAT(s.first_error, HasSubstr("worker gone"));
  EXPECT_DOUBLE_EQ(s.duration_s, 2.0);
  EXPECT_EQ(s.prompt_tokens, 50);
  EXPECT_EQ(s.output_tokens, 17);
  EXPECT_DOUBLE_EQ(s.request_rate, 1.0);
  EXPECT_DOUBLE_EQ(s.output_token_rate, 8.5);
  EXPECT_DOUBLE_EQ(s.total_token_rate, 33.5);
  EXPECT_DOUBLE_EQ(s.goodput, 0.5);
  EXPECT_NEAR(s.slo_attainment, 1.0 / 3, 1e-12);
  EXPECT_NEAR(s.mean_in_flight, (0.6 + 1.5 + 0.5) / 2.0, 1e-12);
  EXPECT_EQ(s.ttft_ms.count, 2);
  EXPECT_NEAR(s.ttft_ms.p50, 300, 1e-9);
  EXPECT_EQ(s.itl_ms.count, 15);
  EXPECT_NEAR(s.tpot_ms.max, 200, 1e-9);
  EXPECT_NEAR(s.e2e_ms.p50, 1050, 1e-9);
}

// A stand-in server: answers after `delay` with the planned tokens in two messages and
// counts how many requests it holds at once.
struct SlowServer {
  std::chrono::milliseconds delay;
  std::atomic<int> now{0}, most{0}, calls{0};
  Sender sender() {
    return [this](const PlannedRequest& request, const std::function<void(uint32_t)>& on_tokens,
                  PromptUsage& prompt) {
      const int held = ++now;
      for (int seen = most.load(); held > seen && !most.compare_exchange_weak(seen, held);) {
      }
      ++calls;
      std::this_thread::sleep_for(delay / 2);
      on_tokens(1);
      std::this_thread::sleep_for(delay / 2);
      on_tokens(request.output_tokens - 1);
      prompt = {.tokens = 99, .cached = 32};
      --now;
      return absl::OkStatus();
    };
  }
};

const Workload kSmall({.prompt_len = {4, 4}, .output_len = {5, 5}, .vocab_size = 64});

TEST(LoadRunnerTest, ClosedLoopKeepsConcurrencyRequestsInFlight) {
  SlowServer server{std::chrono::milliseconds(20)};
  std::atomic<int> reports{0};
  const std::vector<RequestRecord> records =
      runLoad(kSmall, server.sender(),
              {.concurrency = 4,
               .warmup = 3,
               .requests = 20,
               .on_progress = [&](const RunProgress&) { ++reports; },
               .progress_interval = std::chrono::milliseconds(10)});
  ASSERT_EQ(records.size(), 23u);
  EXPECT_EQ(server.most.load(), 4);
  EXPECT_GE(reports.load(), 2);
  for (const RequestRecord& r : records) {
    EXPECT_EQ(r.warmup, r.index < 3);
    EXPECT_TRUE(r.status.ok());
    EXPECT_EQ(r.output_tokens, 5u);
    EXPECT_EQ(r.prompt_tokens, 99u);
    EXPECT_EQ(r.cached_prompt_tokens, 32u);
    EXPECT_EQ(r.itl_s.size(), 4u);  // The second message's 4 tokens.
    EXPECT_LE(r.sent_s, r.first_token_s);
    EXPECT_LE(r.first_token_s, r.done_s);
  }
  EXPECT_EQ(summarize(records, {}).requests, 20);
}

TEST(LoadRunnerTest, OpenLoopArrivalsFollowTheRate) {
  SlowServer server{std::chrono::milliseconds(2)};
  const std::vector<RequestRecord> records =
      runLoad(kSmall, server.sender(), {.concurrency = 8, .rate = 200, .requests = 200, .seed = 3});
  ASSERT_EQ(records.size(), 200u);
  double last_arrival = 0;
  std::vector<double> arrivals(200);
  for (const RequestRecord& r : records) arrivals[r.index] = r.arrival_s;
  for (double a : arrivals) {
    EXPECT_GE(a, last_arrival);
    last_arrival = a;
  }
  // 200 exponential gaps of mean 5 ms: the mean is within 25% of it (about 3.5 sigma).
  EXPECT_NEAR(last_arrival / 200, 0.005, 0.00125);
  for (const RequestRecord& r : records) EXPECT_GE(r.sent_s + 1e-9, r.arrival_s);
}

TEST(LoadRunnerTest, DurationEndsThePoint) {
  SlowServer server{std::chrono::milliseconds(10)};
  const std::vector<RequestRecord> records =
      runLoad(kSmall, server.sender(), {.concurrency = 2, .duration_s = 0.2});
  const Summary s = summarize(records, {});
  EXPECT_GE(s.requests, 10);
  EXPECT_LE(s.requests, 60);
  double last_sent = 0;
  for (const RequestRecord& r : records) last_sent = std::max(last_sent, r.sent_s);
  EXPECT_LT(last_sent, 0.2 + 0.1);
}

TEST(SvgChartTest, EveryPointIsACircleWithItsValues) {
  const std::string svg =
      renderSvg({"Latency <p99>",
                 "tok/s",
                 "ms",
                 {{"a & b", {10, 20, 30}, {1, 2, 3}, {}}, {"c", {5, 15}, {40, 55.5}, {}, true}}});
  size_t circles = 0;
  for (size_t at = svg.find("class=\"point\""); at != std::string::npos;
       at = svg.find("class=\"point\"", at + 1)) {
    ++circles;
  }
  EXPECT_EQ(circles, 5u);
  EXPECT_THAT(svg, HasSubstr("data-x=\"30\" data-y=\"3\""));
  EXPECT_THAT(svg, HasSubstr("data-x=\"15\" data-y=\"55.5\""));
  EXPECT_THAT(svg, HasSubstr("Latency &lt;p99&gt;"));
  EXPECT_THAT(svg, HasSubstr("data-name=\"a &amp; b\""));
  EXPECT_THAT(svg, HasSubstr("stroke-dasharray"));
  EXPECT_EQ(svg.find("<svg"), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
}

TEST(ReportTest, JsonRoundTripsAndHtmlHasEveryChart) {
  BenchRun run{.label = "both",
               .command = "cleave bench --sweep 1,4",
               .router = "127.0.0.1:1",
               .prompt_len = "64:128",
               .output_len = "32",
               .slo = {500, 80}};
  for (int64_t c : {1, 4}) {
    std::vector<RequestRecord> records{record(0, 0.1 * c, 1.0 * c, 64, 32)};
    records[0].itl_s = {0.02, 0.03};
    run.points.push_back({c, 0, summarize(records, run.slo)});
  }
  auto back = runFromJson(runToJson(run), "both.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->label, "both");
  EXPECT_EQ(back->prompt_len, "64:128");
  EXPECT_DOUBLE_EQ(back->slo.itl_ms, 80);
  ASSERT_EQ(back->points.size(), 2u);
  EXPECT_EQ(back->points[1].concurrency, 4);
  EXPECT_DOUBLE_EQ(back->points[1].summary.ttft_ms.p50, run.points[1].summary.ttft_ms.p50);
  EXPECT_DOUBLE_EQ(back->points[1].summary.output_token_rate,
                   run.points[1].summary.output_token_rate);

  const std::string html = htmlReport(std::vector<BenchRun>{run, *back}, "A <report>");
  size_t charts = 0;
  for (size_t at = html.find("<svg"); at != std::string::npos; at = html.find("<svg", at + 1)) {
    ++charts;
  }
  EXPECT_EQ(charts, 4u);
  EXPECT_THAT(html, HasSubstr("<title>A &lt;report&gt;</title>"));
  EXPECT_THAT(html, HasSubstr("both p99"));

  auto bad = runFromJson("{\"label\": 3}", "x.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("x.json"));
  EXPECT_FALSE(runFromJson("nope", "y.json").ok());
}

TEST(OpenAiSenderTest, UrlsNameHostAndPort) {
  OpenAiTarget target;
  for (const char* url : {"http://127.0.0.1:8000", "http://127.0.0.1:8000/",
                          "http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1/"}) {
    ASSERT_TRUE(parseOpenAiUrl(url, target).ok()) << url;
    EXPECT_EQ(target.host, "127.0.0.1");
    EXPECT_EQ(target.port, 8000);
  }
  ASSERT_TRUE(parseOpenAiUrl("http://llm.internal:80", target).ok());
  EXPECT_EQ(target.host, "llm.internal");
  for (const char* url :
       {"https://h:1", "h:1", "http://h", "http://h:0", "http://h:99999", "http://:8"}) {
    EXPECT_FALSE(parseOpenAiUrl(url, target).ok()) << url;
  }
}

}  // namespace
}  // namespace cleave::loadgen
