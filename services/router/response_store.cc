#include "services/router/response_store.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"

namespace cleave::router {

namespace {

using Json = nlohmann::json;

// What an entry takes besides its strings: the map's node, the list's and the strings'
// headers.
constexpr int64_t kOverhead = 256;

// Invalid UTF-8 replaced, never throwing; parses back whole.
std::string text(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

Json parsed(const std::string& text) {
  return Json::parse(text, nullptr, /*allow_exceptions=*/false);
}

}  // namespace

void ResponseStore::put(const std::string& id, Response response) {
  Entry made{.owner = std::move(response.owner),
             .previous = std::move(response.previous),
             .input = text(response.input),
             .response = text(response.response)};
  made.bytes =
      kOverhead + static_cast<int64_t>(id.size() + made.owner.size() + made.previous.size() +
                                       made.input.size() + made.response.size());
  absl::MutexLock lock(&mu_);
  if (auto it = entries_.find(id); it != entries_.end()) drop(it);
  if (made.bytes > max_bytes_) return;
  while (bytes_ + made.bytes > max_bytes_ && !lru_.empty()) drop(entries_.find(lru_.front()));
  Entry& entry = entries_[id] = std::move(made);
  entry.lru = lru_.insert(lru_.end(), id);
  bytes_ += entry.bytes;
}

ResponseStore::Entry* ResponseStore::find(const std::string& id, const std::string& owner) {
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.owner != owner) return nullptr;
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
  std::string input, response;
  Response out;
  {
    absl::MutexLock lock(&mu_);
    const Entry* entry = find(id, owner);
    if (entry == nullptr) return std::nullopt;
    out.owner = entry->owner;
    out.previous = entry->previous;
    input = entry->input;
    response = entry->response;
  }
  out.input = parsed(input);
  out.response = parsed(response);
  return out;
}

bool ResponseStore::erase(const std::string& id, const std::string& owner) {
  absl::MutexLock lock(&mu_);
  if (find(id, owner) == nullptr) return false;
  drop(entries_.find(id));
  return true;
}

absl::StatusOr<Json> ResponseStore::history(const std::string& id, const std::string& owner) {
  std::vector<std::pair<std::string, std::string>> chain;  // Input and response, newest first.
  {
    absl::MutexLock lock(&mu_);
    for (std::string at = id; !at.empty();) {
      // Every step finds another entry: more steps than entries means a loop.
      const Entry* entry = chain.size() <= entries_.size() ? find(at, owner) : nullptr;
      if (entry == nullptr) {
        return absl::NotFoundError(at == id
                                       ? absl::StrCat("no stored response '", id, "'")
                                       : absl::StrCat("response '", at, "', an earlier turn of '",
                                                      id, "', is no longer stored"));
      }
      chain.emplace_back(entry->input, entry->response);
      at = entry->previous;
    }
  }
  Json items = Json::array();
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    for (Json& item : parsed(it->first)) items.push_back(std::move(item));
    Json response = parsed(it->second);
    if (auto output = response.find("output"); output != response.end() && output->is_array()) {
      for (Json& item : *output) items.push_back(std::move(item));
    }
  }
  return items;
}

int64_t ResponseStore::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

}  // namespace cleave::router
