#include "common/log.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace cleave::log {
namespace {

Level initialLevel() {
  const char* env = std::getenv("CLEAVE_LOG_LEVEL");
  if (env == nullptr) return Level::kInfo;
  absl::StatusOr<Level> level = parseLevel(env);
  return level.ok() ? *level : Level::kInfo;
}

std::atomic<Level>& levelRef() {
  static std::atomic<Level> level{initialLevel()};
  return level;
}

char levelLetter(Level level) {
  switch (level) {
    case Level::kDebug: return 'D';
    case Level::kInfo: return 'I';
    case Level::kWarning: return 'W';
    case Level::kError: return 'E';
    case Level::kFatal: return 'F';
  }
  return '?';
}

absl::string_view baseName(absl::string_view path) {
  size_t slash = path.rfind('/');
  return slash == absl::string_view::npos ? path : path.substr(slash + 1);
}

}  // namespace

void setMinLevel(Level level) { levelRef().store(level, std::memory_order_relaxed); }

Level minLevel() { return levelRef().load(std::memory_order_relaxed); }

absl::StatusOr<Level> parseLevel(absl::string_view text) {
  std::string lower = absl::AsciiStrToLower(text);
  if (lower == "debug") return Level::kDebug;
  if (lower == "info") return Level::kInfo;
  if (lower == "warning" || lower == "warn") return Level::kWarning;
  if (lower == "error") return Level::kError;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown log level '", text, "'; use debug, info, warning or error"));
}

Message::Message(Level level, const char* file, int line) : level_(level) {
  auto now = std::chrono::system_clock::now();
  std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  auto micros =
      std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() %
      1000000;
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char stamp[32];
  std::snprintf(stamp, sizeof(stamp), "%c%02d%02d %02d:%02d:%02d.%06lld", levelLetter(level),
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<long long>(micros));
  stream_ << stamp << ' ' << static_cast<long>(syscall(SYS_gettid)) << ' ' << baseName(file) << ':'
          << line << "] ";
}

Message::~Message() {
  stream_ << '\n';
  std::string text = stream_.str();
  // One write per line keeps concurrent lines whole; a failed write has nowhere to go.
  [[maybe_unused]] ssize_t written = ::write(STDERR_FILENO, text.data(), text.size());
  if (level_ == Level::kFatal) std::abort();
}

}  // namespace cleave::log
