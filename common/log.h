// Logging and invariant checks.
//
//   CLEAVE_LOG(INFO) << "listening on " << address;
//   CLEAVE_CHECK(block < num_blocks_) << "block id " << block << " out of range";
//
// Each message is one line on stderr, written with a single write(2) so lines from different
// threads never interleave:  I1130 02:51:00.123456 4242 router_main.cc:42] text
// FATAL messages and failed CHECKs print the line and abort(). Thread-safe.
#pragma once

#include <sstream>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace cleave::log {

enum class Level { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };

// Messages below `level` are dropped. Default: kInfo, or CLEAVE_LOG_LEVEL from the environment.
void setMinLevel(Level level);
Level minLevel();

// Parses "debug", "info", "warning", "error" (case-insensitive).
absl::StatusOr<Level> parseLevel(absl::string_view text);

// One log line under construction; emitted by the destructor.
class Message {
 public:
  Message(Level level, const char* file, int line);
  ~Message();
  Message(const Message&) = delete;
  Message& operator=(const Message&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  Level level_;
  std::ostringstream stream_;
};

// Lets `CLEAVE_LOG(X) << ...` be used as a void expression in the ternary of CLEAVE_CHECK.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace cleave::log

#define CLEAVE_LOG_LEVEL_DEBUG ::cleave::log::Level::kDebug
#define CLEAVE_LOG_LEVEL_INFO ::cleave::log::Level::kInfo
#define CLEAVE_LOG_LEVEL_WARNING ::cleave::log::Level::kWarning
#define CLEAVE_LOG_LEVEL_ERROR ::cleave::log::Level::kError
#define CLEAVE_LOG_LEVEL_FATAL ::cleave::log::Level::kFatal

#define CLEAVE_LOG(severity)                                \
  (CLEAVE_LOG_LEVEL_##severity < ::cleave::log::minLevel()) \
      ? (void)0                                             \
      : ::cleave::log::Voidify() &                          \
            ::cleave::log::Message(CLEAVE_LOG_LEVEL_##severity, __FILE__, __LINE__).stream()

// Aborts with the condition text (and anything streamed) when `cond` is false. Always on.
#define CLEAVE_CHECK(cond)                                                                       \
  (cond) ? (void)0                                                                               \
         : ::cleave::log::Voidify() &                                                            \
               ::cleave::log::Message(::cleave::log::Level::kFatal, __FILE__, __LINE__).stream() \
                   << "Check failed: " #cond " "

#define CLEAVE_CHECK_OK(expr)                                                        \
  do {                                                                               \
    const auto& _cleave_st = (expr);                                                 \
    CLEAVE_CHECK(_cleave_st.ok()) << #expr << " returned " << _cleave_st.ToString(); \
  } while (false)
