// `cleave bench-report --html OUT A.json B.json ...`: one HTML page that overlays the
// results of several `cleave bench --json` runs (e.g. one deployment against another).
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "services/cli/commands.h"
#include "services/loadgen/report.h"

namespace cleave::cli {

int runBenchReport(int argc, char** argv) {
  std::string html_path, title = "cleave bench";
  FlagSet flags("cleave bench-report", "--html OUT RESULT.json...",
                "Draws the results of `cleave bench --json` runs in one HTML report, each run "
                "a series labelled with its --label.");
  flags.addString("html", &html_path, "The report to write");
  flags.addString("title", &title, "The report's title");
  std::vector<std::string> inputs = parseFlagsOrExit(flags, argc, argv);
  if (html_path.empty() || inputs.empty()) {
    exitWithUsageError(flags,
                       absl::InvalidArgumentError("give --html OUT and at least one result file"));
  }
  std::vector<loadgen::BenchRun> runs;
  for (const std::string& path : inputs) {
    std::ifstream in(path, std::ios::binary);
    if (!in) exitWithUsageError(flags, absl::NotFoundError(absl::StrCat("cannot open ", path)));
    std::stringstream text;
    text << in.rdbuf();
    absl::StatusOr<loadgen::BenchRun> run = loadgen::runFromJson(text.str(), path);
    if (!run.ok()) exitWithUsageError(flags, run.status());
    runs.push_back(*std::move(run));
  }
  std::ofstream out(html_path, std::ios::binary);
  out << loadgen::htmlReport(runs, title);
  out.close();
  if (!out) {
    std::fprintf(stderr, "cleave bench-report: cannot write %s\n", html_path.c_str());
    return 1;
  }
  return 0;
}

}  // namespace cleave::cli
