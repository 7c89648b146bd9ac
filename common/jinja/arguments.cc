#include "common/jinja/arguments.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/jinja/text.h"

namespace cleave::jinja::args {
namespace {
constexpr double kMaxBuiltBytes = 16 << 20;
}  // namespace

absl::Status bad(absl::string_view what, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", why));
}

absl::Status checkBuilt(absl::string_view what, double bytes) {
  if (bytes > kMaxBuiltBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": result larger than 16 MiB"));
  }
  return absl::OkStatus();
}

absl::Status checkReplace(absl::string_view what, const std::string& s, const std::string& from,
                          const std::string& to, int64_t count) {
  double hits = static_cast<double>(text::count(s, from));
  if (count >= 0) hits = std::min(hits, static_cast<double>(count));
  return checkBuilt(what, static_cast<double>(s.size()) + hits * static_cast<double>(to.size()));
}

absl::StatusOr<std::vector<Value>> bind(absl::string_view what, const CallArgs& args,
                                        std::initializer_list<const char*> names) {
  std::vector<Value> out(names.size());
  if (args.positional.size() > names.size()) {
    return bad(what, absl::StrCat("takes at most ", names.size(), " arguments, got ",
                                  args.positional.size()));
  }
  for (size_t i = 0; i < args.positional.size(); ++i) out[i] = args.positional[i];
  for (const auto& [key, value] : args.keyword) {
    size_t i = 0;
    for (const char* n : names) {
      if (key == n) break;
      ++i;
    }
    if (i == names.size())
      return bad(what, absl::StrCat("unexpected keyword argument '", key, "'"));
    out[i] = value;
  }
  return out;
}

absl::StatusOr<std::string> stringArg(absl::string_view what, const Value& v) {
  if (!v.isString()) return bad(what, absl::StrCat("expected a str, got ", v.typeName()));
  return v.asString();
}

absl::StatusOr<int64_t> intArg(absl::string_view what, const Value& v) {
  if (!v.isInt() && !v.isBool())
    return bad(what, absl::StrCat("expected an int, got ", v.typeName()));
  return v.asInt();
}

std::optional<std::string> optionalString(const Value& v) {
  if (v.isString()) return v.asString();
  return std::nullopt;
}

}  // namespace cleave::jinja::args
