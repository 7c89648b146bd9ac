// Command-line flags for Cleave's binaries and CLI subcommands.
//
// Each program (or subcommand) declares its flags on a FlagSet bound to variables holding
// their defaults, then calls parseFlagsOrExit(). Accepted forms: `--name=value`,
// `--name value`, booleans as `--name`, `--name=true|false` and `--no-name`; `--` ends the
// flags. Every FlagSet also knows --help, --version and --log-level.
//
// Bad flags never crash: an unknown flag, a missing or malformed value, or a value a
// program rejects prints one line saying what to fix and exits with status 2.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace cleave {

class FlagSet {
 public:
  // `program` is what errors and usage print ("cleave-router", "cleave generate");
  // `usage` the argument synopsis ("[flags] MODEL"); `summary` one paragraph of help.
  FlagSet(std::string program, std::string usage, std::string summary);

  void addString(std::string name, std::string* value, std::string help);
  void addInt(std::string name, int64_t* value, std::string help);
  void addDouble(std::string name, double* value, std::string help);
  void addBool(std::string name, bool* value, std::string help);
  // A byte count: plain digits or with a suffix K, M, G, T (powers of 1000), KiB, MiB, GiB,
  // TiB (powers of 1024), e.g. 8GiB, 512MiB, 4000000000.
  void addBytes(std::string name, uint64_t* value, std::string help);

  // Parses `args` (without the program name). On success stores the flag values and returns
  // the positional arguments in order. On failure returns InvalidArgument naming the flag.
  absl::StatusOr<std::vector<std::string>> parse(std::span<const std::string> args);

  bool helpRequested() const { return help_requested_; }
  bool versionRequested() const { return version_requested_; }
  const std::string& logLevel() const { return log_level_; }
  const std::string& program() const { return program_; }

  // The --help text: synopsis, summary and every flag with its default.
  std::string helpText() const;

 private:
  using Target = std::variant<std::string*, int64_t*, double*, bool*, uint64_t*>;
  struct Flag {
    std::string name;
    Target target;
    std::string help;
    std::string default_text;
  };

  void add(std::string name, Target target, std::string help);
  const Flag* find(absl::string_view name) const;
  absl::Status assign(const Flag& flag, absl::string_view value);
  std::string suggestion(absl::string_view name) const;

  std::string program_;
  std::string usage_;
  std::string summary_;
  std::vector<Flag> flags_;
  bool help_requested_ = false;
  bool version_requested_ = false;
  std::string log_level_ = "info";
};

// Parses argv[first..] with `flags`. --help prints the help text and exits 0; --version
// prints the version and exits 0; an error exits 2 via exitWithUsageError. Applies
// --log-level. Returns the positional arguments.
std::vector<std::string> parseFlagsOrExit(FlagSet& flags, int argc, char** argv, int first = 1);

// Prints "PROGRAM: error: MESSAGE" and a pointer to --help on stderr, then exits 2. For
// values that parse but that the program rejects (a port out of range, a missing file).
[[noreturn]] void exitWithUsageError(const FlagSet& flags, const absl::Status& error);

// Parses a byte count as addBytes() accepts it.
absl::StatusOr<uint64_t> parseBytes(absl::string_view text);

}  // namespace cleave
