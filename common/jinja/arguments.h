// Argument handling shared by the filters, tests, methods and globals of builtins.h:
// Python-style binding of positional and keyword arguments, typed access, and the size
// checks that keep one call from building an unbounded string.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/jinja/value.h"

namespace cleave::jinja::args {

// InvalidArgument "WHAT: WHY".
absl::Status bad(absl::string_view what, absl::string_view why);

// Positional and keyword arguments matched to `names` (Python's binding): a value per
// name, Undefined where not given. Errors for extra or unknown arguments.
absl::StatusOr<std::vector<Value>> bind(absl::string_view what, const CallArgs& args,
                                        std::initializer_list<const char*> names);

absl::StatusOr<std::string> stringArg(absl::string_view what, const Value& v);
absl::StatusOr<int64_t> intArg(absl::string_view what, const Value& v);
// The str `v` holds, or nullopt for any other kind.
std::optional<std::string> optionalString(const Value& v);

// No filter or method builds a str longer than 16 MiB (a render's own limits apply too;
// this keeps one call from allocating without bound before they are checked).
absl::Status checkBuilt(absl::string_view what, double bytes);
// The size of s.replace(from, to, count), checked before building it.
absl::Status checkReplace(absl::string_view what, const std::string& s, const std::string& from,
                          const std::string& to, int64_t count);

}  // namespace cleave::jinja::args
