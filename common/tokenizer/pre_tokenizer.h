// Pre-tokenizers: cut a normalized segment into the words the model encodes one by one
// (Hugging Face "pre_tokenizer", llama.cpp's pre-tokenizer regex sets).
//
// Steps run in order; each one splits every piece the previous step produced. Pieces are
// processed depth first and handed to the sink as soon as the last step produced them.
// A piece knows whether it begins the whole input (Metaspace's prepend_scheme "first").
//
// Threading: immutable once built; apply() from any thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/regex.h"

namespace cleave::tokenizer {

// What happens to the matches of a split pattern (as Hugging Face's SplitDelimiterBehavior).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

enum class PrependScheme { kAlways, kFirst, kNever };

struct PreTokenizerStep {
  enum class Kind {
    kSplit,        // Split on `regex` or on the literal `literal`.
    kPrefixSpace,  // Prepend " " unless the piece starts with one (ByteLevel add_prefix_space).
    kMetaspace,    // Spaces to `replacement`, prepend per `prepend_scheme`, split before it.
  };
  Kind kind = Kind::kSplit;
  std::shared_ptr<const Regex> regex;
  std::string literal;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  std::string replacement;  // kMetaspace, UTF-8.
  PrependScheme prepend_scheme = PrependScheme::kAlways;
  bool split = true;  // kMetaspace.
};

class PreTokenizer {
 public:
  using Sink = absl::FunctionRef<void(absl::string_view word)>;

  void addStep(PreTokenizerStep step) { steps_.push_back(std::move(step)); }
  size_t numSteps() const { return steps_.size(); }

  // Hands every word of `segment` to `sink`, in order. `at_start`: the segment begins the
  // input text.
  void apply(absl::string_view segment, bool at_start, Sink sink) const;

 private:
  void run(size_t step, absl::string_view piece, bool at_start, Sink sink) const;
  void runSplit(size_t step, absl::string_view piece, bool at_start, Sink sink) const;
  void runMetaspace(size_t step, absl::string_view piece, bool at_start, Sink sink) const;

  std::vector<PreTokenizerStep> steps_;
};

}  // namespace cleave::tokenizer
