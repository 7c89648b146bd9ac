#include "services/router/api_keys.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/log.h"
#include "common/retry_hint.h"

namespace cleave::router {
namespace {

constexpr absl::string_view kBearer = "Bearer ";

// Equal strings, in a time that does not depend on where they first differ.
bool sameSecret(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

absl::StatusOr<std::vector<ApiKeys::Key>> ApiKeys::read(const std::string& path, Stamp& stamp) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    return absl::NotFoundError(absl::StrCat("--api-keys: cannot read ", path));
  }
  stamp = {.mtime_ns = int64_t{info.st_mtim.tv_sec} * 1000000000 + info.st_mtim.tv_nsec,
           .size = static_cast<int64_t>(info.st_size)};
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("--api-keys: cannot read ", path));
  std::vector<Key> keys;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const absl::string_view text = absl::StripAsciiWhitespace(line);
    if (text.empty() || text[0] == '#') continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(text, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.size() > 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("--api-keys: ", path, ":", number, " has ", fields.size(),
                       " fields; write one key per line, optionally after a name: NAME KEY"));
    }
    Key key{.name = fields.size() == 2 ? std::string(fields[0]) : absl::StrCat("line ", number),
            .secret = std::string(fields.back())};
    if (key.secret.size() < 16) {
      return absl::InvalidArgumentError(absl::StrCat("--api-keys: ", path, ":", number,
                                                     ": a key must have at least 16 characters"));
    }
    keys.push_back(std::move(key));
  }
  if (keys.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--api-keys: ", path, " holds no key"));
  }
  return keys;
}

absl::StatusOr<std::unique_ptr<ApiKeys>> ApiKeys::load(const std::string& path,
                                                       double rate_per_second) {
  std::unique_ptr<ApiKeys> keys(new ApiKeys(path));
  keys->rate_ = rate_per_second;
  Stamp stamp;
  absl::StatusOr<std::vector<Key>> read = ApiKeys::read(path, stamp);
  if (!read.ok()) return read.status();
  absl::MutexLock lock(&keys->mu_);
  keys->keys_ = *std::move(read);
  keys->stamp_ = stamp;
  keys->checked_ = std::chrono::steady_clock::now();
  CLEAVE_LOG(INFO) << "API keys: " << keys->keys_.size() << " from " << path;
  return keys;
}

void ApiKeys::reloadIfChanged() {
  const auto now = std::chrono::steady_clock::now();
  if (now - checked_ < std::chrono::seconds(1)) return;
  checked_ = now;
  struct stat info {};
  if (::stat(path_.c_str(), &info) == 0 &&
      Stamp{.mtime_ns = int64_t{info.st_mtim.tv_sec} * 1000000000 + info.st_mtim.tv_nsec,
            .size = static_cast<int64_t>(info.st_size)} == stamp_) {
    return;
  }
  Stamp stamp;
  absl::StatusOr<std::vector<Key>> read = ApiKeys::read(path_, stamp);
  if (!read.ok()) {
    CLEAVE_LOG(WARNING) << read.status().message() << "; keeping the " << keys_.size()
                        << " keys read before";
    stamp_ = stamp;  // Not again until the file changes.
    return;
  }
  keys_ = *std::move(read);
  stamp_ = stamp;
  CLEAVE_LOG(INFO) << "API keys reloaded: " << keys_.size() << " from " << path_;
}

absl::StatusOr<std::string> ApiKeys::checkHeader(absl::string_view authorization) {
  if (authorization.empty()) {
    return absl::UnauthenticatedError(
        "this router needs an API key: send metadata 'authorization: Bearer KEY' (the cleave "
        "CLI and client read CLEAVE_API_KEY)");
  }
  if (!absl::StartsWith(authorization, kBearer)) {
    return absl::UnauthenticatedError("the authorization metadata must be 'Bearer KEY'");
  }
  const absl::string_view presented = authorization.substr(kBearer.size());
  absl::MutexLock lock(&mu_);
  reloadIfChanged();
  const Key* match = nullptr;
  for (const Key& key : keys_) {  // Every key is compared, match or not.
    if (sameSecret(presented, key.secret)) match = &key;
  }
  if (match == nullptr) return absl::UnauthenticatedError("the API key is not valid");
  return match->name;
}

absl::Status ApiKeys::takeRequest(const std::string& name) {
  if (rate_ <= 0) return absl::OkStatus();
  const auto now = std::chrono::steady_clock::now();
  const double burst = std::max(1.0, rate_);
  absl::MutexLock lock(&mu_);
  auto [it, fresh] = buckets_.try_emplace(name, Bucket{.tokens = burst, .filled = now});
  Bucket& bucket = it->second;
  bucket.tokens = std::min(
      burst, bucket.tokens + rate_ * std::chrono::duration<double>(now - bucket.filled).count());
  bucket.filled = now;
  if (bucket.tokens < 1) {
    const auto refill = std::chrono::milliseconds(
        static_cast<int64_t>(std::ceil((1 - bucket.tokens) / rate_ * 1e3)));
    return withRetryAfter(absl::ResourceExhaustedError(
                              absl::StrCat("API key '", name, "' is over its rate of ", rate_,
                                           " requests/s; retry in ", refill.count(), " ms")),
                          refill);
  }
  bucket.tokens -= 1;
  return absl::OkStatus();
}

absl::StatusOr<std::string> ApiKeys::check(const grpc::ServerContext& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return checkHeader("");
  return checkHeader(absl::string_view(it->second.data(), it->second.size()));
}

}  // namespace cleave::router
