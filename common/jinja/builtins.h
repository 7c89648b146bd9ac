// What a template can call: Jinja's filters and tests, Python's str and dict methods, and
// the globals chat templates rely on (range, namespace, dict, raise_exception,
// strftime_now). Each follows Jinja 3 / CPython; errors say which filter, test or method
// and why. Lists and dicts are read-only here, as in Hugging Face's sandbox (no append).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/jinja/value.h"

namespace cleave::jinja {

bool isFilter(absl::string_view name);
bool isTest(absl::string_view name);

absl::StatusOr<Value> applyFilter(const std::string& name, const Value& input,
                                  const CallArgs& args);
absl::StatusOr<bool> applyTest(const std::string& name, const Value& input, const CallArgs& args);

// `object.name` as Jinja resolves it: a method of a str or dict (bound to the object), else
// a dict key or namespace attribute, else Undefined. `object` must not be Undefined.
Value getAttribute(const Value& object, const std::string& name);
// `object[key]`: a dict key, a list or str index (negative from the end), else (for a str
// key) as getAttribute; Undefined when missing.
Value getItem(const Value& object, const Value& key);

// The globals every template sees (render's context is looked up first).
const Dict& globals();

// The message raise_exception(message) fails with, so callers can tell it from other
// errors: "raised: " + message.
inline constexpr absl::string_view kRaisedPrefix = "raised: ";

// Items of a value Jinja iterates: a list's items, a dict's keys, a str's characters,
// nothing for Undefined; an error for other kinds.
absl::StatusOr<List> iterate(const Value& value);

}  // namespace cleave::jinja
