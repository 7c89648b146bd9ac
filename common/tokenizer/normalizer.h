// Normalizers: rewrite a text segment before pre-tokenization (Hugging Face "normalizer").
// Supported steps: Prepend, Replace (string or regex pattern), Strip (whitespace), NFC. A
// segment is the text between two added tokens.
//
// Threading: immutable once built; apply() from any thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/tokenizer/regex.h"

namespace cleave::tokenizer {

struct NormalizerStep {
  enum class Kind { kPrepend, kReplace, kStrip, kNfc };
  Kind kind = Kind::kPrepend;
  std::string text;                    // kPrepend: the prefix. kReplace: the string pattern.
  std::shared_ptr<const Regex> regex;  // kReplace with a regex pattern.
  std::string content;                 // kReplace: the replacement.
  bool strip_left = false;             // kStrip.
  bool strip_right = false;            // kStrip.
};

class Normalizer {
 public:
  void addStep(NormalizerStep step) { steps_.push_back(std::move(step)); }
  bool empty() const { return steps_.empty(); }
  size_t numSteps() const { return steps_.size(); }
  std::string apply(absl::string_view text) const;

 private:
  std::vector<NormalizerStep> steps_;
};

}  // namespace cleave::tokenizer
