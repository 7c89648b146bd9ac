// Typed, error-reporting access to the fields of a JSON object read from a model file.
// Every error names the file and the field path ("config.json: rope_scaling.factor must be
// a number, got \"8\""). Internal to cleave_model.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace cleave::model {

class JsonFields {
 public:
  JsonFields(const nlohmann::json& object, std::string file, std::string prefix = "")
      : object_(object), file_(std::move(file)), prefix_(std::move(prefix)) {}

  bool has(const std::string& key) const {
    auto it = object_.find(key);
    return it != object_.end() && !it->is_null();
  }
  // Whether the object names `key` at all, null included.
  bool names(const std::string& key) const { return object_.contains(key); }
  const nlohmann::json* get(const std::string& key) const {
    auto it = object_.find(key);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }

  absl::Status error(const std::string& key, absl::string_view message) const {
    return absl::InvalidArgumentError(absl::StrCat(file_, ": ", prefix_, key, " ", message));
  }
  absl::Status missing(const std::string& key) const { return error(key, "is missing"); }

  // Unsigned integer fitting in 32 bits; also accepts integral floats such as 8.0.
  absl::StatusOr<std::optional<uint32_t>> optionalUint(const std::string& key) const {
    const nlohmann::json* v = get(key);
    if (v == nullptr) return std::optional<uint32_t>();
    if (v->is_number_unsigned() && v->get<uint64_t>() <= UINT32_MAX) {
      return std::optional<uint32_t>(v->get<uint32_t>());
    }
    if (v->is_number_float()) {
      double d = v->get<double>();
      if (d >= 0 && d <= UINT32_MAX && d == static_cast<double>(static_cast<uint32_t>(d))) {
        return std::optional<uint32_t>(static_cast<uint32_t>(d));
      }
    }
    return error(key, absl::StrCat("must be a non-negative integer below 2^32, got ", v->dump()));
  }
  absl::StatusOr<uint32_t> uint(const std::string& key) const {
    auto v = optionalUint(key);
    if (!v.ok()) return v.status();
    if (!v->has_value()) return missing(key);
    return **v;
  }
  absl::StatusOr<uint32_t> uintOr(const std::string& key, uint32_t fallback) const {
    auto v = optionalUint(key);
    if (!v.ok()) return v.status();
    return v->value_or(fallback);
  }

  absl::StatusOr<std::optional<double>> optionalNumber(const std::string& key) const {
    const nlohmann::json* v = get(key);
    if (v == nullptr) return std::optional<double>();
    if (!v->is_number()) return error(key, absl::StrCat("must be a number, got ", v->dump()));
    return std::optional<double>(v->get<double>());
  }
  absl::StatusOr<double> numberOr(const std::string& key, double fallback) const {
    auto v = optionalNumber(key);
    if (!v.ok()) return v.status();
    return v->value_or(fallback);
  }

  // An array of numbers (absent or null: empty).
  absl::StatusOr<std::vector<double>> numbers(const std::string& key) const {
    std::vector<double> out;
    const nlohmann::json* v = get(key);
    if (v == nullptr) return out;
    if (!v->is_array())
      return error(key, absl::StrCat("must be an array of numbers, got ", v->dump()));
    for (const nlohmann::json& x : *v) {
      if (!x.is_number()) return error(key, absl::StrCat("must hold numbers only, got ", x.dump()));
      out.push_back(x.get<double>());
    }
    return out;
  }

  absl::StatusOr<bool> boolOr(const std::string& key, bool fallback) const {
    const nlohmann::json* v = get(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) return error(key, absl::StrCat("must be true or false, got ", v->dump()));
    return v->get<bool>();
  }

  absl::StatusOr<std::string> stringOr(const std::string& key, const std::string& fallback) const {
    const nlohmann::json* v = get(key);
    if (v == nullptr) return fallback;
    if (!v->is_string()) return error(key, absl::StrCat("must be a string, got ", v->dump()));
    return v->get<std::string>();
  }

  // A nested object's fields (absent or null: an empty object).
  absl::StatusOr<JsonFields> object(const std::string& key) const {
    const nlohmann::json* v = get(key);
    if (v == nullptr) return JsonFields(empty(), file_, prefix_ + key + ".");
    if (!v->is_object()) return error(key, "must be an object");
    return JsonFields(*v, file_, prefix_ + key + ".");
  }

 private:
  static const nlohmann::json& empty() {
    static const nlohmann::json* e = new nlohmann::json(nlohmann::json::object());
    return *e;
  }

  const nlohmann::json& object_;
  std::string file_;
  std::string prefix_;
};

}  // namespace cleave::model
