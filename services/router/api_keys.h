// The API keys a router accepts (--api-keys FILE). Clients send `authorization: Bearer KEY`
// metadata on every cleave.v1.Generation call; a missing or unknown key is UNAUTHENTICATED.
//
// The file holds one key per line, optionally after a name and whitespace ("team-a KEY");
// blank lines and lines starting with '#' are skipped. It is read again when its
// modification time or size changes (looked at no more than once a second), so keys are
// added and revoked without a restart; a file that becomes unreadable or holds no key
// keeps the last good keys and logs why. Keys never appear in logs or errors; names do.
//
// A rate limit (requests per second per key, bursts up to one second's worth) makes a key
// over its rate get RESOURCE_EXHAUSTED from takeRequest().
//
// Threading: every method may be called from any thread.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/server_context.h"

namespace cleave::router {

class ApiKeys {
 public:
  // Fails naming the file (not found, unreadable, or no key in it). `rate_per_second` 0
  // means no rate limit.
  static absl::StatusOr<std::unique_ptr<ApiKeys>> load(const std::string& path,
                                                       double rate_per_second = 0);

  // The name of the key the call presents, or Unauthenticated saying what is wrong.
  absl::StatusOr<std::string> check(const grpc::ServerContext& context);
  // As check(), for the value of an authorization header.
  absl::StatusOr<std::string> checkHeader(absl::string_view authorization);
  // Counts one request against key `name`'s rate: ResourceExhausted when over it, with the
  // time until the key has a request to spend as its retry hint (retry_hint.h).
  absl::Status takeRequest(const std::string& name);

 private:
  struct Key {
    std::string name;
    std::string secret;
  };
  struct Stamp {
    int64_t mtime_ns = 0;
    int64_t size = 0;
    bool operator==(const Stamp&) const = default;
  };
  explicit ApiKeys(std::string path) : path_(std::move(path)) {}
  static absl::StatusOr<std::vector<Key>> read(const std::string& path, Stamp& stamp);
  void reloadIfChanged() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  struct Bucket {
    double tokens = 0;
    std::chrono::steady_clock::time_point filled;
  };
  const std::string path_;
  double rate_ = 0;
  absl::Mutex mu_;
  std::vector<Key> keys_ ABSL_GUARDED_BY(mu_);
  Stamp stamp_ ABSL_GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point checked_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<std::string, Bucket> buckets_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cleave::router
