#include "services/engine/stop_checker.h"

#include <algorithm>

namespace cleave::engine {

StopChecker::StopChecker(StopCriteria criteria) : criteria_(std::move(criteria)) {}

std::string StopChecker::push(uint32_t id, const std::string& text) {
  if (stopped()) return "";
  ++generated_;
  const bool may_stop = generated_ >= criteria_.min_new_tokens;
  if (may_stop && std::find(criteria_.stop_token_ids.begin(), criteria_.stop_token_ids.end(), id) !=
                      criteria_.stop_token_ids.end()) {
    reason_ = StopReason::kStopToken;
    matched_ = std::to_string(id);
    return flush();
  }
  held_ += text;
  // The earliest stop string in the held text ends the sequence; text before it is shown.
  size_t earliest = std::string::npos;
  for (const std::string& stop : criteria_.stop_strings) {
    size_t at = may_stop ? held_.find(stop) : std::string::npos;
    if (at != std::string::npos && at < earliest) {
      earliest = at;
      matched_ = stop;
    }
  }
  if (earliest != std::string::npos) {
    reason_ = StopReason::kStopString;
    std::string shown = held_.substr(0, earliest);
    held_.clear();
    return shown;
  }
  if (criteria_.max_new_tokens > 0 && generated_ >= criteria_.max_new_tokens) {
    reason_ = StopReason::kLength;
    return flush();
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const std::string& stop : criteria_.stop_strings) {
    for (size_t len = std::min(stop.size() - 1, held_.size()); len > keep; --len) {
      if (held_.compare(held_.size() - len, len, stop, 0, len) == 0) {
        keep = len;
        break;
      }
    }
  }
  std::string shown = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return shown;
}

std::string StopChecker::flush() {
  std::string shown = std::move(held_);
  held_.clear();
  return shown;
}

}  // namespace cleave::engine
