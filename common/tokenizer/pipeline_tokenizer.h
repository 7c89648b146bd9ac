// The Tokenizer implementation behind every source: added-token split, normalizer,
// pre-tokenizer, BPE model, post-processor ids, decoder. The tokenizer.json and GGUF
// loaders only differ in how they fill PipelineParts.
//
//   encode: [prefix] + for each part of the text cut by raw_tokens:
//             token -> its id
//             text  -> normalizer -> cut by normalized_tokens -> pre_tokenizer -> model
//           + [suffix]
//   decode: drop unknown ids (and special ones when asked) -> decoder
//
// Threading: immutable after construction; every method may be called from any thread.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/tokenizer/added_tokens.h"
#include "common/tokenizer/bpe_model.h"
#include "common/tokenizer/decoder.h"
#include "common/tokenizer/normalizer.h"
#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/tokenizer.h"

namespace cleave::tokenizer {

struct PipelineParts {
  // Stored text of every id; ids without an entry are absent (piece() fails, decode skips).
  std::vector<std::string> pieces;
  std::vector<bool> present;
  std::vector<bool> special;
  std::unique_ptr<BpeModel> model;
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  Decoder decoder;                                       // Finalized by the loader.
  std::unique_ptr<AddedTokenMatcher> raw_tokens;         // Cut out before normalizing.
  std::unique_ptr<AddedTokenMatcher> normalized_tokens;  // Cut out after (may be null).
  std::vector<TokenId> prefix;                           // add_special_tokens.
  std::vector<TokenId> suffix;
  std::optional<TokenId> bos;
  std::optional<TokenId> eos;
};

class PipelineTokenizer final : public Tokenizer {
 public:
  explicit PipelineTokenizer(PipelineParts parts);

  std::vector<TokenId> encode(absl::string_view text, const EncodeOptions& options) const override;
  std::string decode(std::span<const TokenId> ids, bool skip_special_tokens) const override;
  size_t vocabSize() const override { return parts_.pieces.size(); }
  absl::StatusOr<std::string> piece(TokenId id) const override;
  bool isSpecial(TokenId id) const override;
  std::optional<TokenId> bosId() const override { return parts_.bos; }
  std::optional<TokenId> eosId() const override { return parts_.eos; }

 private:
  void encodeText(absl::string_view text, bool at_start, bool parse_special,
                  std::vector<TokenId>* out) const;

  PipelineParts parts_;
};

}  // namespace cleave::tokenizer
