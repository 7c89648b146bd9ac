// A one-line progress display for long commands (loading a model, a load test): redrawn in
// place at most ten times a second when the stream is a terminal, silent otherwise so that
// logs and pipes stay clean.
//
// Threading: one thread at a time may call update()/finish().
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace cleave {

class ProgressLine {
 public:
  // Enabled when `out` is a terminal.
  explicit ProgressLine(std::FILE* out = stderr);
  ProgressLine(std::FILE* out, bool enabled) : out_(out), enabled_(enabled) {}
  ~ProgressLine() { finish(); }
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  bool enabled() const { return enabled_; }
  // Shows `text` unless the last redraw was under 100 ms ago (`force` redraws anyway).
  void update(std::string_view text, bool force = false);
  // Erases the line; later updates draw a new one.
  void finish();

 private:
  std::FILE* out_;
  bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_{};
};

// "512 B", "3.2 MiB", "1.50 GiB".
std::string humanBytes(uint64_t bytes);

}  // namespace cleave
