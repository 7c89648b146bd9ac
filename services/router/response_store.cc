#include "services/router/response_store.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"

namespace cleave::router {

namespace {

using Json = nlohmann::json;

// What an entry counts against the limit: its JSON text times what a parsed tree of it
// takes per byte of text (a node and its allocation per value, a map node per member; a
// response's logprobs are many small values), plus the map and list entries.
constexpr int64_t kTreeBytesPerTextByte = 4;
constexpr int64_t kOverhead = 512;

int64_t textBytes(const Json& j) {
  return static_cast<int64_t>(j.dump(-1, ' ', false, Json::error_handler_t::replace).size());
}

int64_t sizeOf(const ResponseStore::Response& r) {
  return kOverhead + static_cast<int64_t>(r.owner.size() + r.previous.size()) +
         kTreeBytesPerTextByte * (textBytes(r.input) + textBytes(r.response));
}

}  // namespace

void ResponseStore::put(const std::string& id, Response response) {
  const int64_t size = sizeOf(response) + static_cast<int64_t>(id.size());
  absl::MutexLock lock(&mu_);
  if (auto it = entries_.find(id); it != entries_.end()) drop(it);
  if (size > max_bytes_) return;
  while (bytes_ + size > max_bytes_ && !lru_.empty()) drop(entries_.find(lru_.front()));
  Entry& entry = entries_[id];
  entry.response = std::move(response);
  entry.bytes = size;
  entry.lru = lru_.insert(lru_.end(), id);
  bytes_ += size;
}

ResponseStore::Entry* ResponseStore::find(const std::string& id, const std::string& owner) {
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.response.owner != owner) return nullptr;
  lru_.splice(lru_.end(), lru_, it->second.lru);
  return &it->second;
}

void ResponseStore::drop(std::unordered_map<std::string, Entry>::iterator it) {
  bytes_ -= it->second.bytes;
  lru_.erase(it->second.lru);
  entries_.erase(it);
}

std::optional<ResponseStore::Response> ResponseStore::get(const std::string& id,
                                                          const std::string& owner) {
  absl::MutexLock lock(&mu_);
  const Entry* entry = find(id, owner);
  if (entry == nullptr) return std::nullopt;
  return entry->response;
}

bool ResponseStore::erase(const std::string& id, const std::string& owner) {
  absl::MutexLock lock(&mu_);
  if (find(id, owner) == nullptr) return false;
  drop(entries_.find(id));
  return true;
}

absl::StatusOr<Json> ResponseStore::history(const std::string& id, const std::string& owner) {
  absl::MutexLock lock(&mu_);
  std::vector<const Entry*> chain;  // Newest first.
  for (std::string at = id; !at.empty();) {
    // Every step finds another entry: more steps than entries means a loop.
    const Entry* entry = chain.size() <= entries_.size() ? find(at, owner) : nullptr;
    if (entry == nullptr) {
      return absl::NotFoundError(at == id
                                     ? absl::StrCat("no stored response '", id, "'")
                                     : absl::StrCat("response '", at, "', an earlier turn of '", id,
                                                    "', is no longer stored"));
    }
    chain.push_back(entry);
    at = entry->response.previous;
  }
  Json items = Json::array();
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    for (const Json& item : (*it)->response.input) items.push_back(item);
    if (const Json* output = (*it)->response.response.contains("output")
                                 ? &(*it)->response.response["output"]
                                 : nullptr;
        output != nullptr && output->is_array()) {
      for (const Json& item : *output) items.push_back(item);
    }
  }
  return items;
}

int64_t ResponseStore::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

}  // namespace cleave::router
