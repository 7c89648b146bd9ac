#include "common/progress.h"

#include <unistd.h>

#include "absl/strings/str_format.h"

namespace cleave {

ProgressLine::ProgressLine(std::FILE* out) : out_(out), enabled_(isatty(fileno(out)) == 1) {}

void ProgressLine::update(std::string_view text, bool force) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (!force && drawn_ && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  drawn_ = true;
  // Carriage return, the text, then erase whatever a longer previous line left.
  std::fprintf(out_, "\r%.*s\x1b[K", static_cast<int>(text.size()), text.data());
  std::fflush(out_);
}

void ProgressLine::finish() {
  if (!enabled_ || !drawn_) return;
  std::fprintf(out_, "\r\x1b[K");
  std::fflush(out_);
  drawn_ = false;
}

std::string humanBytes(uint64_t bytes) {
  constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return absl::StrFormat("%d B", bytes);
  double value = static_cast<double>(bytes) / 1024;
  size_t unit = 0;
  while (value >= 1024 && unit + 1 < std::size(kUnits)) {
    value /= 1024;
    ++unit;
  }
  if (value < 10) return absl::StrFormat("%.2f %s", value, kUnits[unit]);
  return absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

}  // namespace cleave
