#include "services/loadgen/report.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "services/loadgen/svg_chart.h"

namespace cleave::loadgen {
namespace {

using nlohmann::json;

json toJson(const Distribution& d) {
  return {{"count", d.count}, {"mean", d.mean}, {"p50", d.p50},
          {"p90", d.p90},     {"p99", d.p99},   {"max", d.max}};
}

Distribution distributionFrom(const json& j) {
  Distribution d;
  d.count = j.at("count").get<int64_t>();
  d.mean = j.at("mean").get<double>();
  d.p50 = j.at("p50").get<double>();
  d.p90 = j.at("p90").get<double>();
  d.p99 = j.at("p99").get<double>();
  d.max = j.at("max").get<double>();
  return d;
}

json toJson(const Summary& s) {
  return {{"requests", s.requests},
          {"failed", s.failed},
          {"first_error", s.first_error},
          {"duration_s", s.duration_s},
          {"prompt_tokens", s.prompt_tokens},
          {"cached_prompt_tokens", s.cached_prompt_tokens},
          {"output_tokens", s.output_tokens},
          {"request_rate", s.request_rate},
          {"output_token_rate", s.output_token_rate},
          {"total_token_rate", s.total_token_rate},
          {"goodput", s.goodput},
          {"slo_attainment", s.slo_attainment},
          {"mean_in_flight", s.mean_in_flight},
          {"ttft_ms", toJson(s.ttft_ms)},
          {"itl_ms", toJson(s.itl_ms)},
          {"tpot_ms", toJson(s.tpot_ms)},
          {"e2e_ms", toJson(s.e2e_ms)},
          {"queue_ms", toJson(s.queue_ms)}};
}

Summary summaryFrom(const json& j) {
  Summary s;
  s.requests = j.at("requests").get<int64_t>();
  s.failed = j.at("failed").get<int64_t>();
  s.first_error = j.at("first_error").get<std::string>();
  s.duration_s = j.at("duration_s").get<double>();
  s.prompt_tokens = j.at("prompt_tokens").get<int64_t>();
  s.cached_prompt_tokens = j.value("cached_prompt_tokens", int64_t{0});  // Older reports lack it.
  s.output_tokens = j.at("output_tokens").get<int64_t>();
  s.request_rate = j.at("request_rate").get<double>();
  s.output_token_rate = j.at("output_token_rate").get<double>();
  s.total_token_rate = j.at("total_token_rate").get<double>();
  s.goodput = j.at("goodput").get<double>();
  s.slo_attainment = j.at("slo_attainment").get<double>();
  s.mean_in_flight = j.at("mean_in_flight").get<double>();
  s.ttft_ms = distributionFrom(j.at("ttft_ms"));
  s.itl_ms = distributionFrom(j.at("itl_ms"));
  s.tpot_ms = distributionFrom(j.at("tpot_ms"));
  s.e2e_ms = distributionFrom(j.at("e2e_ms"));
  s.queue_ms = distributionFrom(j.at("queue_ms"));
  return s;
}

std::string tableOf(const BenchRun& run) {
  std::string html = absl::StrCat(
      "<h2>", xmlEscape(run.label), "</h2>\n<p><code>", xmlEscape(run.command),
      "</code></p>\n<p>prompt ", xmlEscape(run.prompt_len), " tokens, output ",
      xmlEscape(run.output_len), " tokens",
      run.slo.ttft_ms > 0 || run.slo.itl_ms > 0
          ? absl::StrFormat("; SLO: TTFT &lt;= %g ms, time per output token &lt;= %g ms",
                            run.slo.ttft_ms, run.slo.itl_ms)
          : "",
      "</p>\n<table>\n<tr><th>load</th><th>requests</th><th>failed</th><th>req/s</th>"
      "<th>output tok/s</th><th>goodput req/s</th><th>in flight</th><th>TTFT p50 / p99 ms</th>"
      "<th>ITL p50 / p99 ms</th><th>E2E p50 / p99 ms</th></tr>\n");
  for (const SweepPoint& p : run.points) {
    const Summary& s = p.summary;
    absl::StrAppendFormat(&html,
                          "<tr><td>%s</td><td>%d</td><td>%d</td><td>%.2f</td><td>%.1f</td>"
                          "<td>%.2f</td><td>%.1f</td><td>%.0f / %.0f</td><td>%.1f / %.1f</td>"
                          "<td>%.0f / %.0f</td></tr>\n",
                          loadOf(p), s.requests, s.failed, s.request_rate, s.output_token_rate,
                          s.goodput, s.mean_in_flight, s.ttft_ms.p50, s.ttft_ms.p99, s.itl_ms.p50,
                          s.itl_ms.p99, s.e2e_ms.p50, s.e2e_ms.p99);
  }
  return html + "</table>\n";
}

// A chart of `metric` (p50 solid, p99 dashed) against output throughput, one colour per run.
std::string latencyChart(std::span<const BenchRun> runs, const std::string& title,
                         Distribution Summary::*metric) {
  Chart chart{title, "output tokens/s", "ms", {}};
  for (size_t r = 0; r < runs.size(); ++r) {
    for (const bool p99 : {false, true}) {
      ChartSeries series;
      series.name = absl::StrCat(runs[r].label, p99 ? " p99" : " p50");
      series.dashed = p99;
      series.color = static_cast<int>(r);
      for (const SweepPoint& p : runs[r].points) {
        const Distribution& d = p.summary.*metric;
        series.x.push_back(p.summary.output_token_rate);
        series.y.push_back(p99 ? d.p99 : d.p50);
        series.tips.push_back(absl::StrCat("at ", loadOf(p)));
      }
      chart.series.push_back(std::move(series));
    }
  }
  return renderSvg(chart);
}

}  // namespace

std::string loadOf(const SweepPoint& p) {
  return p.rate > 0 ? absl::StrFormat("%g req/s", p.rate) : absl::StrCat("c=", p.concurrency);
}

std::string runToJson(const BenchRun& run) {
  json points = json::array();
  for (const SweepPoint& p : run.points) {
    points.push_back(
        {{"concurrency", p.concurrency}, {"rate", p.rate}, {"summary", toJson(p.summary)}});
  }
  json j = {{"label", run.label},
            {"command", run.command},
            {"router", run.router},
            {"prompt_len", run.prompt_len},
            {"output_len", run.output_len},
            {"slo", {{"ttft_ms", run.slo.ttft_ms}, {"itl_ms", run.slo.itl_ms}}},
            {"points", points}};
  return j.dump(2) + "\n";
}

absl::StatusOr<BenchRun> runFromJson(absl::string_view text, absl::string_view source) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON"));
  }
  try {
    BenchRun run;
    run.label = j.at("label").get<std::string>();
    run.command = j.at("command").get<std::string>();
    run.router = j.at("router").get<std::string>();
    run.prompt_len = j.at("prompt_len").get<std::string>();
    run.output_len = j.at("output_len").get<std::string>();
    run.slo.ttft_ms = j.at("slo").at("ttft_ms").get<double>();
    run.slo.itl_ms = j.at("slo").at("itl_ms").get<double>();
    for (const json& p : j.at("points")) {
      run.points.push_back({p.at("concurrency").get<int64_t>(), p.at("rate").get<double>(),
                            summaryFrom(p.at("summary"))});
    }
    return run;
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": not a cleave bench result (", e.what(), ")"));
  }
}

std::string htmlReport(std::span<const BenchRun> runs, const std::string& title) {
  std::string html = absl::StrCat(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>",
      xmlEscape(title),
      "</title>\n<style>body{font-family:sans-serif;margin:24px;max-width:1300px}"
      "table{border-collapse:collapse;margin-bottom:16px}td,th{border:1px solid #bbb;"
      "padding:3px 8px;text-align:right}svg{margin:6px}</style>\n</head>\n<body>\n<h1>",
      xmlEscape(title), "</h1>\n<div class=\"charts\">\n");
  // Throughput against load: concurrency for closed loops, the offered rate for open ones.
  const bool open_loop = !runs.empty() && !runs[0].points.empty() && runs[0].points[0].rate > 0;
  Chart throughput{"Output throughput",
                   open_loop ? "offered requests/s" : "concurrent requests",
                   "output tokens/s",
                   {}};
  for (const BenchRun& run : runs) {
    ChartSeries series;
    series.name = run.label;
    for (const SweepPoint& p : run.points) {
      series.x.push_back(open_loop ? p.rate : static_cast<double>(p.concurrency));
      series.y.push_back(p.summary.output_token_rate);
      series.tips.push_back(absl::StrFormat("%.2f req/s", p.summary.request_rate));
    }
    throughput.series.push_back(std::move(series));
  }
  html += renderSvg(throughput);
  html += latencyChart(runs, "Time to first token", &Summary::ttft_ms);
  html += latencyChart(runs, "Inter-token latency", &Summary::itl_ms);
  html += latencyChart(runs, "End-to-end latency", &Summary::e2e_ms);
  html += "</div>\n";
  for (const BenchRun& run : runs) html += tableOf(run);
  return html + "</body>\n</html>\n";
}

}  // namespace cleave::loadgen
