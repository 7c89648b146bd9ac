// Typed, non-throwing access to parsed JSON for the tokenizer.json loader: every error is
// an InvalidArgument naming the file and the field path ("model.vocab", "decoder.decoders[2]
// .content").
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace cleave::tokenizer {

using Json = nlohmann::json;

class JsonReader {
 public:
  explicit JsonReader(std::string file) : file_(std::move(file)) {}

  const std::string& file() const { return file_; }

  absl::Status error(absl::string_view field, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(file_, ": field '", field, "': ", what));
  }

  // The member `key` of `object`, or null when absent or JSON null.
  static const Json* member(const Json& object, const char* key) {
    if (!object.is_object()) return nullptr;
    auto it = object.find(key);
    if (it == object.end() || it->is_null()) return nullptr;
    return &*it;
  }

  absl::StatusOr<const Json*> requireObject(const Json& object, const char* key,
                                            const std::string& path) const {
    const Json* v = member(object, key);
    if (v == nullptr) return error(path, "missing");
    if (!v->is_object()) return error(path, "must be an object");
    return v;
  }

  absl::StatusOr<const Json*> requireArray(const Json& object, const char* key,
                                           const std::string& path) const {
    const Json* v = member(object, key);
    if (v == nullptr) return error(path, "missing");
    if (!v->is_array()) return error(path, "must be an array");
    return v;
  }

  // A string member; `fallback` when absent (an error when there is none).
  absl::StatusOr<std::string> string(const Json& object, const char* key, const std::string& path,
                                     std::optional<std::string> fallback = std::nullopt) const {
    const Json* v = member(object, key);
    if (v == nullptr) {
      if (fallback) return *fallback;
      return error(path, "missing");
    }
    if (!v->is_string()) return error(path, "must be a string");
    return v->get<std::string>();
  }

  absl::StatusOr<bool> boolean(const Json& object, const char* key, const std::string& path,
                               bool fallback) const {
    const Json* v = member(object, key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) return error(path, "must be true or false");
    return v->get<bool>();
  }

  // A non-negative integer no larger than `max`.
  absl::StatusOr<uint64_t> uint(const Json& value, const std::string& path, uint64_t max) const {
    if (!value.is_number_integer()) return error(path, "must be a non-negative integer");
    if (value.is_number_unsigned()) {
      const auto v = value.get<uint64_t>();
      if (v > max) return error(path, absl::StrCat(v, " is larger than ", max));
      return v;
    }
    const auto v = value.get<int64_t>();
    if (v < 0) return error(path, absl::StrCat(v, " is negative"));
    if (static_cast<uint64_t>(v) > max)
      return error(path, absl::StrCat(v, " is larger than ", max));
    return static_cast<uint64_t>(v);
  }

  absl::StatusOr<uint64_t> uintMember(const Json& object, const char* key, const std::string& path,
                                      uint64_t max, uint64_t fallback) const {
    const Json* v = member(object, key);
    if (v == nullptr) return fallback;
    return uint(*v, path, max);
  }

 private:
  std::string file_;
};

}  // namespace cleave::tokenizer
