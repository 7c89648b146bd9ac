#include "common/faults.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"

namespace cleave::faults {
namespace {

struct Faults {
  absl::Mutex mu;
  std::map<std::string, int64_t, std::less<>> values ABSL_GUARDED_BY(mu);
  std::string crash_at;  // Set once, before any reader.
};

void parse(Faults& f) {
  const char* text = std::getenv("CLEAVE_FAULTS");
  if (text == nullptr) return;
  absl::MutexLock lock(&f.mu);
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    if (kv.first == "crash_at") {
      f.crash_at = kv.second;
    } else if (int64_t n = 0; absl::SimpleAtoi(kv.second, &n)) {
      f.values[kv.first] = n;
    } else {
      CLEAVE_LOG(ERROR) << "CLEAVE_FAULTS: '" << item << "' is not NAME=NUMBER or crash_at=POINT";
    }
  }
  CLEAVE_LOG(WARNING) << "fault injection is on: CLEAVE_FAULTS=" << text;
}

Faults& faults() {
  static Faults* const f = new Faults;  // Never destroyed: threads may use it at exit.
  static std::once_flag once;
  std::call_once(once, [] { parse(*f); });
  return *f;
}

}  // namespace

bool fire(absl::string_view name) {
  Faults& f = faults();
  absl::MutexLock lock(&f.mu);
  auto it = f.values.find(name);
  if (it == f.values.end() || it->second <= 0) return false;
  --it->second;
  CLEAVE_LOG(WARNING) << "injected fault: " << name;
  return true;
}

int64_t value(absl::string_view name) {
  Faults& f = faults();
  absl::MutexLock lock(&f.mu);
  auto it = f.values.find(name);
  return it == f.values.end() ? 0 : it->second;
}

void delay(absl::string_view name) {
  if (const int64_t ms = value(name); ms > 0) {
    CLEAVE_LOG(WARNING) << "injected fault: " << name << " " << ms << " ms";
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }
}

void crash(absl::string_view why) {
  CLEAVE_LOG(WARNING) << "injected fault: crash (" << why << ")";
  _exit(86);
}

void crashPoint(absl::string_view point) {
  if (faults().crash_at == point) crash(point);
}

}  // namespace cleave::faults
