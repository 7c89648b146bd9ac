// Writes GGUF bytes for tests and fuzz seeds: a builder that can also produce malformed
// files (wrong counts, bad offsets) on purpose. Not used by production code.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace cleave::model::testing {

class GgufBuilder {
 public:
  explicit GgufBuilder(uint32_t version = 3) : version_(version) {}

  template <typename T>
  static void put(std::string& out, T value) {
    out.append(reinterpret_cast<const char*>(&value), sizeof(T));
  }
  static void putString(std::string& out, const std::string& s) {
    put<uint64_t>(out, s.size());
    out += s;
  }

  // Raw metadata entry: key, type id, pre-encoded value bytes.
  GgufBuilder& kvRaw(const std::string& key, uint32_t type, const std::string& value) {
    putString(kvs_, key);
    put<uint32_t>(kvs_, type);
    kvs_ += value;
    ++kv_count_;
    return *this;
  }
  GgufBuilder& kvU32(const std::string& key, uint32_t v) {
    std::string b;
    put(b, v);
    return kvRaw(key, 4, b);
  }
  GgufBuilder& kvF32(const std::string& key, float v) {
    std::string b;
    put(b, v);
    return kvRaw(key, 6, b);
  }
  GgufBuilder& kvBool(const std::string& key, bool v) {
    return kvRaw(key, 7, std::string(1, v ? '\1' : '\0'));
  }
  GgufBuilder& kvString(const std::string& key, const std::string& v) {
    std::string b;
    putString(b, v);
    return kvRaw(key, 8, b);
  }
  GgufBuilder& kvStringArray(const std::string& key, const std::vector<std::string>& v) {
    std::string b;
    put<uint32_t>(b, 8);
    put<uint64_t>(b, v.size());
    for (const auto& s : v) putString(b, s);
    return kvRaw(key, 9, b);
  }
  GgufBuilder& kvI32Array(const std::string& key, const std::vector<int32_t>& v) {
    std::string b;
    put<uint32_t>(b, 5);
    put<uint64_t>(b, v.size());
    for (int32_t x : v) put(b, x);
    return kvRaw(key, 9, b);
  }

  // Tensor info with explicit offset (relative to the data section); `data` is appended to
  // the data section at that offset (zero-padded as needed).
  GgufBuilder& tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t type,
                      uint64_t offset, const std::string& data) {
    putString(infos_, name);
    put<uint32_t>(infos_, static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) put(infos_, d);
    put<uint32_t>(infos_, type);
    put<uint64_t>(infos_, offset);
    ++tensor_count_;
    if (data_.size() < offset + data.size()) data_.resize(offset + data.size(), '\0');
    std::memcpy(data_.data() + offset, data.data(), data.size());
    return *this;
  }

  // Overrides the counts written in the header (to build lying files).
  GgufBuilder& countsOverride(uint64_t tensors, uint64_t kvs) {
    tensor_override_ = tensors;
    kv_override_ = kvs;
    return *this;
  }

  std::string build(uint64_t alignment = 32) const {
    std::string out = "GGUF";
    put<uint32_t>(out, version_);
    put<uint64_t>(out, tensor_override_ ? *tensor_override_ : tensor_count_);
    put<uint64_t>(out, kv_override_ ? *kv_override_ : kv_count_);
    out += kvs_;
    out += infos_;
    out.resize((out.size() + alignment - 1) / alignment * alignment, '\0');
    out += data_;
    return out;
  }

 private:
  uint32_t version_;
  uint64_t kv_count_ = 0;
  uint64_t tensor_count_ = 0;
  std::optional<uint64_t> tensor_override_;
  std::optional<uint64_t> kv_override_;
  std::string kvs_;
  std::string infos_;
  std::string data_;
};

}  // namespace cleave::model::testing
