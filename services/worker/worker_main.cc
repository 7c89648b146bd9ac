// cleave-worker: runs prefill, decode or both for one tensor-parallel group.
#include <cstdio>

#include "common/flags.h"
#include "services/worker/worker_options.h"

int main(int argc, char** argv) {
  cleave::worker::WorkerOptions options;
  cleave::FlagSet flags("cleave-worker", "[flags]",
                        "Runs one tensor-parallel group of the Cleave engine as a prefill, "
                        "decode or combined worker and registers it with a router.");
  options.addFlags(flags);
  std::vector<std::string> positional = cleave::parseFlagsOrExit(flags, argc, argv);
  if (!positional.empty()) {
    cleave::exitWithUsageError(
        flags, absl::InvalidArgumentError("unexpected argument '" + positional[0] + "'"));
  }
  if (absl::Status valid = cleave::worker::validate(options); !valid.ok()) {
    cleave::exitWithUsageError(flags, valid);
  }
  std::fprintf(stderr,
               "cleave-worker: serving is not built yet: the engine runs offline (cleave generate) "
               "but no worker can load %s and serve requests.\n",
               options.model.c_str());
  return 1;
}
