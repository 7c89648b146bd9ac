#include "common/flags.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/version.h"

namespace cleave {
namespace {

size_t editDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1] ? 1u : 0u)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

absl::StatusOr<bool> parseBool(absl::string_view text) {
  std::string lower = absl::AsciiStrToLower(text);
  if (lower == "true" || lower == "1" || lower == "yes") return true;
  if (lower == "false" || lower == "0" || lower == "no") return false;
  return absl::InvalidArgumentError("expected true or false");
}

}  // namespace

absl::StatusOr<uint64_t> parseBytes(absl::string_view text) {
  absl::string_view digits = text;
  size_t end = 0;
  while (end < digits.size() && (absl::ascii_isdigit(digits[end]) || digits[end] == '.')) ++end;
  absl::string_view number = digits.substr(0, end);
  std::string suffix = absl::AsciiStrToLower(digits.substr(end));
  double value = 0;
  if (number.empty() || !absl::SimpleAtod(number, &value)) {
    return absl::InvalidArgumentError("expected a byte count such as 8GiB, 512MiB or 1000000");
  }
  double scale = 0;
  if (suffix.empty() || suffix == "b")
    scale = 1;
  else if (suffix == "k" || suffix == "kb")
    scale = 1e3;
  else if (suffix == "m" || suffix == "mb")
    scale = 1e6;
  else if (suffix == "g" || suffix == "gb")
    scale = 1e9;
  else if (suffix == "t" || suffix == "tb")
    scale = 1e12;
  else if (suffix == "kib")
    scale = 1024.0;
  else if (suffix == "mib")
    scale = 1024.0 * 1024;
  else if (suffix == "gib")
    scale = 1024.0 * 1024 * 1024;
  else if (suffix == "tib")
    scale = 1024.0 * 1024 * 1024 * 1024;
  else
    return absl::InvalidArgumentError(
        absl::StrCat("unknown size suffix '", suffix, "'; use K, M, G, T, KiB, MiB, GiB or TiB"));
  double bytes = value * scale;
  if (bytes >= 1.8e19) return absl::InvalidArgumentError("byte count too large");
  return static_cast<uint64_t>(bytes);
}

FlagSet::FlagSet(std::string program, std::string usage, std::string summary)
    : program_(std::move(program)), usage_(std::move(usage)), summary_(std::move(summary)) {
  addString("log-level", &log_level_,
            "Least severe log messages shown: debug, info, warning, error");
}

void FlagSet::add(std::string name, Target target, std::string help) {
  CLEAVE_CHECK(find(name) == nullptr) << "flag --" << name << " declared twice";
  std::string default_text = std::visit(
      [](auto* value) -> std::string {
        using T = std::remove_pointer_t<decltype(value)>;
        if constexpr (std::is_same_v<T, std::string>)
          return absl::StrCat("\"", *value, "\"");
        else if constexpr (std::is_same_v<T, bool>)
          return *value ? "true" : "false";
        else
          return absl::StrCat(*value);
      },
      target);
  flags_.push_back(Flag{std::move(name), target, std::move(help), std::move(default_text)});
}

void FlagSet::addString(std::string name, std::string* value, std::string help) {
  add(std::move(name), value, std::move(help));
}
void FlagSet::addInt(std::string name, int64_t* value, std::string help) {
  add(std::move(name), value, std::move(help));
}
void FlagSet::addDouble(std::string name, double* value, std::string help) {
  add(std::move(name), value, std::move(help));
}
void FlagSet::addBool(std::string name, bool* value, std::string help) {
  add(std::move(name), value, std::move(help));
}
void FlagSet::addBytes(std::string name, uint64_t* value, std::string help) {
  add(std::move(name), value, std::move(help));
}

const FlagSet::Flag* FlagSet::find(absl::string_view name) const {
  for (const Flag& flag : flags_) {
    if (flag.name == name) return &flag;
  }
  return nullptr;
}

std::string FlagSet::suggestion(absl::string_view name) const {
  const Flag* best = nullptr;
  size_t best_distance = 3;  // Suggest only close matches.
  for (const Flag& flag : flags_) {
    size_t distance = editDistance(name, flag.name);
    if (distance < best_distance) {
      best_distance = distance;
      best = &flag;
    }
  }
  return best ? absl::StrCat(" (did you mean --", best->name, "?)") : "";
}

absl::Status FlagSet::assign(const Flag& flag, absl::string_view value) {
  absl::Status status = std::visit(
      [&](auto* target) -> absl::Status {
        using T = std::remove_pointer_t<decltype(target)>;
        if constexpr (std::is_same_v<T, std::string>) {
          *target = std::string(value);
        } else if constexpr (std::is_same_v<T, int64_t>) {
          if (!absl::SimpleAtoi(value, target))
            return absl::InvalidArgumentError("expected an integer");
        } else if constexpr (std::is_same_v<T, double>) {
          if (!absl::SimpleAtod(value, target))
            return absl::InvalidArgumentError("expected a number");
        } else if constexpr (std::is_same_v<T, bool>) {
          absl::StatusOr<bool> parsed = parseBool(value);
          if (!parsed.ok()) return parsed.status();
          *target = *parsed;
        } else {
          absl::StatusOr<uint64_t> parsed = parseBytes(value);
          if (!parsed.ok()) return parsed.status();
          *target = *parsed;
        }
        return absl::OkStatus();
      },
      flag.target);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid value '", value, "' for --", flag.name, ": ", status.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> FlagSet::parse(std::span<const std::string> args) {
  std::vector<std::string> positional;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      positional.insert(positional.end(), args.begin() + i + 1, args.end());
      break;
    }
    if (arg == "-h" || arg == "--help") {
      help_requested_ = true;
      continue;
    }
    if (arg == "--version") {
      version_requested_ = true;
      continue;
    }
    if (arg.size() < 2 || arg[0] != '-' || arg == "-") {
      positional.push_back(arg);
      continue;
    }
    if (arg[1] != '-') {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown option '", arg, "'; flags are spelled --name=value"));
    }
    absl::string_view body = absl::string_view(arg).substr(2);
    size_t eq = body.find('=');
    absl::string_view name = body.substr(0, eq);
    const Flag* flag = find(name);
    bool negated = false;
    if (flag == nullptr && absl::StartsWith(name, "no-") && eq == absl::string_view::npos) {
      flag = find(name.substr(3));
      negated = flag != nullptr && std::holds_alternative<bool*>(flag->target);
      if (!negated) flag = nullptr;
    }
    if (flag == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name, suggestion(name)));
    }
    if (negated) {
      *std::get<bool*>(flag->target) = false;
      continue;
    }
    if (eq != absl::string_view::npos) {
      CLEAVE_RETURN_IF_ERROR(assign(*flag, body.substr(eq + 1)));
      continue;
    }
    if (std::holds_alternative<bool*>(flag->target)) {
      *std::get<bool*>(flag->target) = true;
      continue;
    }
    if (i + 1 >= args.size()) {
      return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
    }
    CLEAVE_RETURN_IF_ERROR(assign(*flag, args[++i]));
  }
  if (!log::parseLevel(log_level_).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid value '", log_level_, "' for --log-level: use debug, info, warning or error"));
  }
  return positional;
}

std::string FlagSet::helpText() const {
  std::string text =
      absl::StrCat("Usage: ", program_, " ", usage_, "\n\n", summary_, "\n\nFlags:\n");
  for (const Flag& flag : flags_) {
    absl::StrAppend(&text, absl::StrFormat("  --%-24s %s (default: %s)\n", flag.name, flag.help,
                                           flag.default_text));
  }
  absl::StrAppend(&text, absl::StrFormat("  --%-24s %s\n", "help", "Print this help and exit"));
  absl::StrAppend(&text,
                  absl::StrFormat("  --%-24s %s\n", "version", "Print the version and exit"));
  return text;
}

void exitWithUsageError(const FlagSet& flags, const absl::Status& error) {
  std::fprintf(stderr, "%s: error: %s\nRun '%s --help' for usage.\n", flags.program().c_str(),
               std::string(error.message()).c_str(), flags.program().c_str());
  std::exit(2);
}

std::vector<std::string> parseFlagsOrExit(FlagSet& flags, int argc, char** argv, int first) {
  std::vector<std::string> args;
  for (int i = first; i < argc; ++i) args.emplace_back(argv[i]);
  absl::StatusOr<std::vector<std::string>> positional = flags.parse(args);
  if (flags.helpRequested()) {
    std::cout << flags.helpText();
    std::exit(0);
  }
  if (flags.versionRequested()) {
    std::cout << flags.program() << " " << versionString() << "\n";
    std::exit(0);
  }
  if (!positional.ok()) exitWithUsageError(flags, positional.status());
  log::setMinLevel(*log::parseLevel(flags.logLevel()));
  return *std::move(positional);
}

}  // namespace cleave
