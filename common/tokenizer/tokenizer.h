// Text <-> token ids for every model Cleave serves.
//
// Sources: a Hugging Face tokenizer.json (byte-level BPE with GPT-2 / Llama-3 / Qwen2 style
// pre-tokenizer patterns; SentencePiece-style BPE with byte fallback and Metaspace, as
// Llama 2 uses; added and special tokens), or the tokenizer embedded in a GGUF file
// (tokenizer.ggml.model "gpt2" with merges, or "llama").
//
// Threading: immutable after loading; encode/decode may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cleave::model {
class GgufFile;
}

namespace cleave::tokenizer {

using TokenId = uint32_t;

struct EncodeOptions {
  // Add the tokens the model's template puts around a sequence (e.g. BOS).
  bool add_special_tokens = true;
  // Recognize special-token text such as "<|im_start|>" in the input as that token. When
  // false, such text is tokenized as ordinary text.
  bool parse_special = false;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Loads `path`: a .gguf file, a tokenizer.json, or a folder holding tokenizer.json (and
  // optionally tokenizer_config.json for BOS/EOS). Errors name the file and the field.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> load(const std::string& path);
  static absl::StatusOr<std::unique_ptr<Tokenizer>> fromTokenizerJson(const std::string& path);
  // Parses tokenizer.json text; `name` is used in error messages.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> fromTokenizerJsonText(absl::string_view json,
                                                                          const std::string& name);
  static absl::StatusOr<std::unique_ptr<Tokenizer>> fromGguf(const model::GgufFile& file);

  // Any bytes are accepted, including invalid UTF-8 (byte-level and byte-fallback
  // vocabularies encode every byte).
  virtual std::vector<TokenId> encode(absl::string_view text,
                                      const EncodeOptions& options) const = 0;
  // The text of `ids` concatenated. May contain invalid UTF-8 when the ids split a
  // character (use IncrementalDetokenizer for streaming).
  virtual std::string decode(std::span<const TokenId> ids, bool skip_special_tokens) const = 0;

  virtual size_t vocabSize() const = 0;
  // The vocabulary entry of `id` as stored (e.g. "Ġhello", "▁hello", "<0x0A>").
  virtual absl::StatusOr<std::string> piece(TokenId id) const = 0;
  virtual bool isSpecial(TokenId id) const = 0;
  virtual std::optional<TokenId> bosId() const = 0;
  virtual std::optional<TokenId> eosId() const = 0;
};

// Streams text for a growing sequence of tokens without ever emitting a broken UTF-8
// sequence: bytes of an incomplete character are held until the character completes.
// Handles tokenizers whose decoding depends on context (e.g. a leading-space strip).
// Decodes only a window of the last few tokens per push (amortized O(1) per token).
// Threading: one instance per stream, used by one thread at a time; `tokenizer` must outlive
// it.
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens = true);
  // Adds one token; returns the newly completed text (possibly empty).
  std::string push(TokenId id);
  // Ends the sequence; returns what was held (invalid bytes as U+FFFD).
  std::string finish();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  // Ids from the prefix offset on; window_[0, read_) are emitted, and decode() of just those
  // is prefix_text_. What decode(window_) has beyond prefix_text_ is new or held text.
  std::vector<TokenId> window_;
  size_t read_ = 0;
  std::string prefix_text_;
};

}  // namespace cleave::tokenizer
