#include "services/engine/output_constraint.h"

#include <limits>

namespace cleave::engine {

void keepOnly(std::span<const uint8_t> keep, std::span<const uint32_t> ends,
              std::span<float> logits) {
  constexpr float kNever = -std::numeric_limits<float>::infinity();
  bool any = false;
  for (size_t id = 0; id < logits.size(); ++id) {
    if (keep[id]) {
      any = true;
    } else {
      logits[id] = kNever;
    }
  }
  if (!any && !ends.empty() && ends[0] < logits.size()) logits[ends[0]] = 0.0f;
}

}  // namespace cleave::engine
