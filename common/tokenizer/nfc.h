// Unicode Normalization Form C (canonical decomposition, then canonical composition), as
// Hugging Face's "NFC" normalizer applies it. Ill-formed bytes pass through unchanged and
// never compose with their neighbours.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace cleave::tokenizer {

std::string toNfc(absl::string_view text);

}  // namespace cleave::tokenizer
