// Decoders: token pieces back to text (Hugging Face "decoder").
//
// Steps work on the list of token strings, as the reference does: ByteLevel (byte-level
// alphabet to bytes, then join), Replace, ByteFallback ("<0x41>" to the byte), Fuse (join),
// Strip (drop leading/trailing copies of a character per string), Metaspace (the
// replacement character back to a space, dropped in the first string unless the prepend
// scheme is "never"), BpeSuffix (end-of-word suffix to a space, dropped at the end), and
// JoinWithSpace (what the reference does without a decoder).
//
// Unlike the reference, byte sequences are kept as they are: a list of ids that splits a
// character decodes to invalid UTF-8 instead of U+FFFD (streaming needs the bytes).
//
// The leading steps that act on each token alone are folded into a per-id table once, so
// decoding the common pipelines is a concatenation.
//
// Threading: immutable after finalize(); decode() from any thread.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"

namespace cleave::tokenizer {

struct DecoderStep {
  enum class Kind {
    kByteLevel,
    kReplace,
    kByteFallback,
    kFuse,
    kStrip,
    kMetaspace,
    kBpeSuffix,
    kJoinWithSpace
  };
  Kind kind = Kind::kFuse;
  std::string pattern;  // kReplace: what to replace; kStrip/kMetaspace: the character;
                        // kBpeSuffix: the suffix.
  std::string content;  // kReplace: the replacement.
  size_t strip_start = 0;
  size_t strip_stop = 0;
  bool metaspace_prepend = true;  // kMetaspace: prepend scheme other than "never".
};

class Decoder {
 public:
  void addStep(DecoderStep step) { steps_.push_back(std::move(step)); }
  size_t numSteps() const { return steps_.size(); }
  // Folds the per-token leading steps over `pieces` (the stored text of every id).
  void finalize(const std::vector<std::string>& pieces);
  // Uses `table` (the bytes of every id) and then `rest` on the joined text.
  void setTable(std::vector<std::string> table, std::vector<DecoderStep> rest);

  // Appends the text of `ids` (already filtered; ids outside the table are skipped).
  void decode(std::span<const TokenId> ids, std::string* out) const;

 private:
  std::vector<DecoderStep> steps_;
  std::vector<std::string> table_;
  size_t folded_ = 0;    // Steps folded into table_.
  bool joined_ = false;  // A folded step joined the strings into one.
};

}  // namespace cleave::tokenizer
