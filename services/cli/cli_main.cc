// cleave: the command-line tool. `cleave COMMAND [flags]`.
#include <cstdio>
#include <cstring>
#include <string_view>

#include "common/grpc_logging.h"
#include "common/process_init.h"
#include "common/version.h"
#include "services/cli/commands.h"

namespace {

struct Command {
  const char* name;
  const char* summary;
  int (*run)(int argc, char** argv);
};

constexpr Command kCommands[] = {
    {"info", "Show a running router's version, queue and workers", cleave::cli::runInfo},
    {"generate", "Generate text from a prompt (on this CPU, or through --router)",
     cleave::cli::runGenerate},
    {"up", "Start a router and workers on this machine and run until Ctrl-C", cleave::cli::runUp},
    {"roofline", "The floor of a step on given hardware, term by term", cleave::cli::runRoofline},
    {"bench", "Load-test a router: throughput, goodput, latency percentiles, sweeps",
     cleave::cli::runBench},
    {"bench-report", "Compare `cleave bench --json` results in one HTML report",
     cleave::cli::runBenchReport},
    {"inspect", "Show a model file's architecture, tensors and weight bytes",
     cleave::cli::runInspect},
    {"tokenize", "Print the token ids of a text", cleave::cli::runTokenize},
    {"detokenize", "Print the text of token ids", cleave::cli::runDetokenize},
};

void printUsage(std::FILE* out) {
  std::fprintf(out, "Usage: cleave COMMAND [flags]\n\nCommands:\n");
  for (const Command& command : kCommands) {
    std::fprintf(out, "  %-12s %s\n", command.name, command.summary);
  }
  std::fprintf(out,
               "  %-12s %s\n  %-12s %s\n\nRun 'cleave COMMAND --help' for a command's flags.\n",
               "help", "Show this help", "version", "Show the version");
}

}  // namespace

int main(int argc, char** argv) {
  cleave::initProcess();
  cleave::routeGrpcLogsToDebug();
  if (argc < 2) {
    printUsage(stderr);
    return 2;
  }
  std::string_view name = argv[1];
  if (name == "help" || name == "--help" || name == "-h") {
    printUsage(stdout);
    return 0;
  }
  if (name == "version" || name == "--version") {
    std::printf("cleave %s\n", cleave::versionString().c_str());
    return 0;
  }
  for (const Command& command : kCommands) {
    // The command parses argv[2..]; argv[1] stays as its name.
    if (name == command.name) return command.run(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "cleave: error: unknown command '%s'\nRun 'cleave help' for the list.\n",
               argv[1]);
  return 2;
}
