// The responses the HTTP API keeps for OpenAI's Responses API: a response made with
// `store` (the default) can be continued by a later request's `previous_response_id`, read
// back (GET /v1/responses/ID, .../input_items) and deleted (DELETE /v1/responses/ID).
//
// Each response keeps its own input items, its output items and the id of the response it
// continued, so a conversation of n turns holds each turn once; the context of a new turn is
// the chain's inputs and outputs, oldest first. Responses are kept as their JSON text (a
// tenth of what a parsed tree of many small values, such as logprobs, takes; parsed again
// when read), so memory is counted exactly: past `max_bytes` (the text, the ids and a fixed
// overhead per response) the least recently used responses go, and
// continuing a conversation uses every response of its chain. A response belongs to the
// credentials that made it (the Authorization header, compared whole): other credentials
// see no such response.
//
// Kept in this router's memory only: another router, or this one restarted, knows none of
// them (clients of several routers send the whole conversation, or stick to one router).
//
// Threading: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "nlohmann/json.hpp"

namespace cleave::router {

class ResponseStore {
 public:
  struct Response {
    std::string owner;        // The Authorization header it was made with ("" for none).
    std::string previous;     // The response it continued ("" for none).
    nlohmann::json input;     // This request's input items (ids given), oldest first.
    nlohmann::json response;  // The response object as the client received it.
  };

  explicit ResponseStore(int64_t max_bytes) : max_bytes_(max_bytes) {}

  // Keeps `response` under `id` (ids are unique: a used one is replaced). One larger than
  // the whole store is not kept.
  void put(const std::string& id, Response response);
  // The response `id` made with `owner`'s credentials.
  std::optional<Response> get(const std::string& id, const std::string& owner);
  // Deletes it; false when there was none for `owner`.
  bool erase(const std::string& id, const std::string& owner);
  // The conversation a turn after `id` continues: the input and output items of every
  // response of its chain, oldest first. NotFound naming the response missing (never kept,
  // deleted, evicted, or another owner's).
  absl::StatusOr<nlohmann::json> history(const std::string& id, const std::string& owner);

  int64_t bytes() const;

 private:
  struct Entry {
    std::string owner, previous;
    std::string input, response;  // JSON text.
    int64_t bytes = 0;
    std::list<std::string>::iterator lru;  // Position in lru_ (most recent last).
  };
  // The entry `id` of `owner`, made most recently used; null when none.
  Entry* find(const std::string& id, const std::string& owner) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void drop(std::unordered_map<std::string, Entry>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t max_bytes_;
  mutable absl::Mutex mu_;
  std::unordered_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::list<std::string> lru_ ABSL_GUARDED_BY(mu_);  // Least recently used first.
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace cleave::router
