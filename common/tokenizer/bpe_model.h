// The BPE model: turns one pre-token ("word") into token ids by applying merges in rank
// order (lowest rank first, leftmost first among equal ranks), as Hugging Face tokenizers'
// BPE and llama.cpp's BPE and SentencePiece tokenizers do.
//
// A word is cut into units first: bytes (byte-level vocabularies, whose keys are stored as
// raw bytes) or characters (SentencePiece-style vocabularies). A unit missing from the
// vocabulary becomes <0xXX> byte tokens (byte_fallback), the unknown token, or nothing; in
// byte mode an ill-formed byte the vocabulary lacks reads as the bytes of U+FFFD.
//
// Threading: immutable after finalize(); encodeWord() may be called from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/tokenizer.h"

namespace cleave::tokenizer {

enum class UnitMode {
  kBytes,           // Every byte is a unit; vocabulary keys are raw bytes.
  kUtf8Chars,       // Well-formed characters; each ill-formed byte is a unit of its own.
  kUtf8LeadLength,  // Length from the lead byte alone, as llama.cpp cuts SentencePiece text.
};

struct BpeModelOptions {
  UnitMode unit_mode = UnitMode::kBytes;
  bool byte_fallback = false;  // Unknown units become their <0xXX> tokens.
  std::optional<TokenId> unk_id;
  bool fuse_unk = false;                  // Consecutive unknown units give one unknown token.
  bool ignore_merges = false;             // A word that is itself in the vocabulary is one token.
  std::string continuing_subword_prefix;  // Character modes only.
  std::string end_of_word_suffix;         // Character modes only.
};

class BpeModel {
 public:
  explicit BpeModel(BpeModelOptions options);

  // Adds `key` (in the unit mode's form) for `id`; the first id given for a key is kept.
  void addToken(absl::string_view key, TokenId id);
  std::optional<TokenId> find(absl::string_view key) const;
  // Merges (left, right) into `merged` at `rank`. When the pair is already known the earlier
  // entry is kept unless `replace`.
  void addMerge(TokenId left, TokenId right, TokenId merged, uint32_t rank, bool replace);
  // Builds the lookup tables; call once after the last add.
  void finalize();

  // Appends the ids of `word`.
  void encodeWord(absl::string_view word, std::vector<TokenId>* out) const;

  const BpeModelOptions& options() const { return options_; }
  size_t numMerges() const { return merges_.size(); }

 private:
  struct Merge {
    uint32_t rank;
    TokenId merged;
  };
  struct Symbol {
    TokenId id;
    int32_t prev;
    int32_t next;
  };

  static uint64_t pairKey(TokenId left, TokenId right) {
    return (static_cast<uint64_t>(left) << 32) | right;
  }
  const Merge* findMerge(TokenId left, TokenId right) const {
    auto it = merges_.find(pairKey(left, right));
    return it == merges_.end() ? nullptr : &it->second;
  }
  // The units of `word` as symbols, unknown units already replaced.
  void initialSymbols(absl::string_view word, std::vector<Symbol>* symbols) const;
  void encodePiece(absl::string_view word, std::vector<TokenId>* out) const;
  void mergeSmall(std::vector<Symbol>* symbols) const;
  void mergeLarge(std::vector<Symbol>* symbols) const;

  BpeModelOptions options_;
  absl::flat_hash_map<std::string, TokenId> vocab_;
  absl::flat_hash_map<uint64_t, Merge> merges_;
  // Unit ids for single bytes (kBytes) or ASCII characters without prefix/suffix; -1: none.
  std::array<int64_t, 256> byte_unit_ids_{};
  std::array<int64_t, 256> fallback_ids_{};  // <0xXX> tokens; -1: none.
  bool replacement_units_ = false;           // kBytes: the bytes of U+FFFD are all units.
  static constexpr absl::string_view kMarker = "\u2581";  // SentencePiece's space.
  bool split_at_marker_ = false;  // Words may be cut before "▁" runs (see finalize()).
};

}  // namespace cleave::tokenizer
