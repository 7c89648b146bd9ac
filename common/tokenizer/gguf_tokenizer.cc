// The tokenizer embedded in a GGUF file, with llama.cpp's semantics:
//  * tokenizer.ggml.model "gpt2": byte-level BPE with tokenizer.ggml.merges; the
//    pre-tokenizer regex set is chosen by tokenizer.ggml.pre.
//  * tokenizer.ggml.model "llama": SentencePiece BPE; merges are implied by the token scores
//    (the pair whose merged token scores highest goes first); <0xXX> byte tokens for
//    characters outside the vocabulary; a space is put before every text fragment
//    (tokenizer.ggml.add_space_prefix).
// token_type: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte. Control and
// unknown tokens are special (parsed only with parse_special, skipped when decoding with
// skip_special_tokens); user-defined tokens are always matched in the text.
//
// Unlike llama.cpp, ill-formed UTF-8 in the input is tokenized byte for byte instead of as
// U+FFFD, so decode(encode(bytes)) gives the bytes back.
#include <algorithm>
#include <map>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/model/gguf_file.h"
#include "common/status_macros.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/patterns.h"
#include "common/tokenizer/pipeline_tokenizer.h"
#include "common/tokenizer/utf8.h"

namespace cleave::tokenizer {
namespace {

enum TokenType : int64_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

struct GgufVocab {
  const std::vector<std::string>* tokens = nullptr;
  std::vector<int64_t> types;
  absl::flat_hash_map<std::string, TokenId> by_text;  // A repeated text maps to its last id.
};

absl::Status fieldError(const model::GgufFile& file, absl::string_view key,
                        absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(file.path(), ": ", key, ": ", what));
}

absl::StatusOr<std::optional<bool>> optionalBool(const model::GgufFile& file,
                                                 absl::string_view key) {
  if (file.find(key) == nullptr) return std::optional<bool>();
  CLEAVE_ASSIGN_OR_RETURN(bool v, file.getBool(key));
  return std::optional<bool>(v);
}

absl::StatusOr<std::optional<TokenId>> optionalId(const model::GgufFile& file,
                                                  absl::string_view key, size_t n_tokens) {
  if (file.find(key) == nullptr) return std::optional<TokenId>();
  CLEAVE_ASSIGN_OR_RETURN(uint64_t v, file.getUint(key));
  if (v >= n_tokens) {
    return fieldError(file, key,
                      absl::StrCat("token id ", v, " is out of range (", n_tokens, " tokens)"));
  }
  return std::optional<TokenId>(static_cast<TokenId>(v));
}

absl::StatusOr<GgufVocab> readVocab(const model::GgufFile& file) {
  GgufVocab vocab;
  CLEAVE_ASSIGN_OR_RETURN(vocab.tokens, file.getStringArray("tokenizer.ggml.tokens"));
  const size_t n = vocab.tokens->size();
  if (n == 0) return fieldError(file, "tokenizer.ggml.tokens", "empty");
  if (n > (size_t{1} << 31)) return fieldError(file, "tokenizer.ggml.tokens", "too many tokens");
  vocab.types.assign(n, kNormal);
  if (file.find("tokenizer.ggml.token_type") != nullptr) {
    CLEAVE_ASSIGN_OR_RETURN(const std::vector<int64_t>* types,
                            file.getIntArray("tokenizer.ggml.token_type"));
    if (types->size() != n) {
      return fieldError(file, "tokenizer.ggml.token_type",
                        absl::StrCat(types->size(), " entries for ", n, " tokens"));
    }
    vocab.types = *types;
  }
  vocab.by_text.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string& text = (*vocab.tokens)[i];
    if (!isValidUtf8(text)) {
      return fieldError(file, absl::StrCat("tokenizer.ggml.tokens[", i, "]"), "not valid UTF-8");
    }
    vocab.by_text.insert_or_assign(text, static_cast<TokenId>(i));
  }
  return vocab;
}

// Pre-tokenizer regexes of llama.cpp's tokenizer.ggml.pre values, applied in order (each
// splits the pieces of the previous one; matches and gaps both become pieces).
struct PreSet {
  std::vector<const char*> regexes;
  bool ignore_merges = false;
  bool add_bos = false;  // Default when tokenizer.ggml.add_bos_token is absent.
};

std::optional<PreSet> preSet(const std::string& pre) {
  using namespace patterns;  // NOLINT(build/namespaces)
  static const std::map<std::string, PreSet, std::less<>> kSets = {
      {"default", {{kDefaultPunctuation, kGpt2LlamaCpp, kDigits, kThreeAsciiDigits}}},
      {"gpt-2", {{kGpt2LlamaCpp}}},
      {"gpt2", {{kGpt2LlamaCpp}}},
      {"phi-2", {{kGpt2LlamaCpp}}},
      {"mpt", {{kGpt2LlamaCpp}}},
      {"olmo", {{kGpt2LlamaCpp}}},
      {"jais", {{kGpt2LlamaCpp}}},
      {"llama3", {{kLlama3}, true, true}},
      {"llama-v3", {{kLlama3}, true, true}},
      {"llama-bpe", {{kLlama3}, true, true}},
      {"falcon3", {{kLlama3}, true, true}},
      {"pixtral", {{kLlama3}, true, true}},
      {"dbrx", {{kLlama3}}},
      {"smaug-bpe", {{kLlama3}}},
      {"qwen2", {{kQwen2}}},
      {"stablelm2", {{kQwen2}}},
      {"deepseek-r1-qwen", {{kQwen2}}},
      {"smollm", {{kDigit, kGpt2LlamaCpp}}},
      {"starcoder", {{kDigit, kGpt2LlamaCpp}}},
      {"refact", {{kDigit, kGpt2LlamaCpp}}},
      {"command-r", {{kDigit, kGpt2LlamaCpp}}},
      {"codeshell", {{kDigit, kGpt2LlamaCpp}}},
      {"exaone", {{kDigit, kGpt2LlamaCpp}}},
  };
  auto it = kSets.find(pre);
  if (it == kSets.end()) return std::nullopt;
  return it->second;
}

std::string knownPreNames() {
  return "default, gpt-2, phi-2, mpt, olmo, jais, llama3, llama-v3, llama-bpe, falcon3, pixtral, "
         "dbrx, smaug-bpe, qwen2, stablelm2, deepseek-r1-qwen, smollm, starcoder, refact, "
         "command-r, codeshell, exaone";
}

// Added tokens: every token llama.cpp searches in the text (control, user-defined, unknown).
std::unique_ptr<AddedTokenMatcher> addedTokens(const GgufVocab& vocab) {
  std::vector<AddedToken> tokens;
  for (size_t i = 0; i < vocab.types.size(); ++i) {
    const int64_t t = vocab.types[i];
    if (t != kControl && t != kUserDefined && t != kUnknown) continue;
    tokens.push_back(AddedToken{.content = (*vocab.tokens)[i],
                                .id = static_cast<TokenId>(i),
                                .special = t != kUserDefined});
  }
  return std::make_unique<AddedTokenMatcher>(std::move(tokens), AddedTokenPolicy::kLongestFirst);
}

void fillIdTable(const GgufVocab& vocab, PipelineParts* parts) {
  const size_t n = vocab.tokens->size();
  parts->pieces = *vocab.tokens;
  parts->present.assign(n, true);
  parts->special.assign(n, false);
  for (size_t i = 0; i < n; ++i) {
    parts->special[i] = vocab.types[i] == kControl || vocab.types[i] == kUnknown;
  }
}

absl::Status buildGpt2(const model::GgufFile& file, const GgufVocab& vocab, PipelineParts* parts,
                       bool* add_bos_default) {
  std::string pre = "default";
  if (file.find("tokenizer.ggml.pre") != nullptr) {
    CLEAVE_ASSIGN_OR_RETURN(pre, file.getString("tokenizer.ggml.pre"));
  }
  const std::optional<PreSet> set = preSet(pre);
  if (!set) {
    return fieldError(file, "tokenizer.ggml.pre",
                      absl::StrCat("pre-tokenizer \"", pre,
                                   "\" is not supported (supported: ", knownPreNames(), ")"));
  }
  *add_bos_default = set->add_bos;
  for (const char* pattern : set->regexes) {
    auto regex = Regex::compile(pattern);
    if (!regex.ok()) return regex.status();
    parts->pre_tokenizer.addStep(
        PreTokenizerStep{.kind = PreTokenizerStep::Kind::kSplit,
                         .regex = std::shared_ptr<const Regex>(*std::move(regex)),
                         .behavior = SplitBehavior::kIsolated});
  }

  parts->model = std::make_unique<BpeModel>(
      BpeModelOptions{.unit_mode = UnitMode::kBytes, .ignore_merges = set->ignore_merges});
  const size_t n = vocab.tokens->size();
  for (size_t i = n; i-- > 0;) {  // A repeated text keeps its last id, as llama.cpp's map does.
    if (auto bytes = byteLevelDecode((*vocab.tokens)[i])) {
      parts->model->addToken(*bytes, static_cast<TokenId>(i));
    }
  }
  CLEAVE_ASSIGN_OR_RETURN(const std::vector<std::string>* merges,
                          file.getStringArray("tokenizer.ggml.merges"));
  for (size_t i = 0; i < merges->size(); ++i) {
    const std::string& m = (*merges)[i];
    const std::string key = absl::StrCat("tokenizer.ggml.merges[", i, "]");
    const size_t space = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
    if (space == std::string::npos) return fieldError(file, key, "must be \"a b\"");
    const std::string left = m.substr(0, space);
    const std::string right = m.substr(space + 1);
    auto l = vocab.by_text.find(left);
    auto r = vocab.by_text.find(right);
    auto merged = vocab.by_text.find(left + right);
    if (l == vocab.by_text.end() || r == vocab.by_text.end() || merged == vocab.by_text.end()) {
      return fieldError(file, key,
                        absl::StrCat("\"", m,
                                     "\" references a token missing from "
                                     "tokenizer.ggml.tokens"));
    }
    parts->model->addMerge(l->second, r->second, merged->second, static_cast<uint32_t>(i),
                           /*replace=*/false);
  }
  parts->model->finalize();

  // Decoding, per token as llama.cpp renders it.
  std::vector<std::string> table(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string& text = (*vocab.tokens)[i];
    switch (vocab.types[i]) {
      case kNormal: {
        auto bytes = byteLevelDecode(text);
        table[i] = bytes ? *std::move(bytes) : text;
        break;
      }
      case kControl:
      case kUnknown:
      case kUserDefined: table[i] = text; break;
      default: break;  // Unused and byte tokens render as nothing.
    }
  }
  parts->decoder.setTable(std::move(table), {});
  return absl::OkStatus();
}

absl::Status buildLlama(const model::GgufFile& file, const GgufVocab& vocab,
                        std::optional<TokenId> unk, PipelineParts* parts) {
  const size_t n = vocab.tokens->size();
  std::vector<double> scores(n, 0.0);
  if (file.find("tokenizer.ggml.scores") != nullptr) {
    CLEAVE_ASSIGN_OR_RETURN(const std::vector<double>* s,
                            file.getFloatArray("tokenizer.ggml.scores"));
    if (s->size() != n) {
      return fieldError(file, "tokenizer.ggml.scores",
                        absl::StrCat(s->size(), " entries for ", n, " tokens"));
    }
    scores = *s;
  }
  bool add_space_prefix = true;
  CLEAVE_ASSIGN_OR_RETURN(std::optional<bool> space,
                          optionalBool(file, "tokenizer.ggml.add_space_prefix"));
  if (space) add_space_prefix = *space;

  if (add_space_prefix) {
    parts->normalizer.addStep(NormalizerStep{.kind = NormalizerStep::Kind::kPrepend, .text = " "});
  }
  parts->normalizer.addStep(
      NormalizerStep{.kind = NormalizerStep::Kind::kReplace, .text = " ", .content = "\u2581"});

  parts->model = std::make_unique<BpeModel>(BpeModelOptions{
      .unit_mode = UnitMode::kUtf8LeadLength, .byte_fallback = true, .unk_id = unk});
  for (size_t i = n; i-- > 0;) parts->model->addToken((*vocab.tokens)[i], static_cast<TokenId>(i));

  // Merges implied by scores: every way to cut a token into two tokens is a merge whose rank
  // orders by the merged token's score (highest first; equal scores share a rank).
  std::vector<double> distinct(scores);
  std::sort(distinct.begin(), distinct.end(), std::greater<>());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  auto rankOf = [&](double score) {
    return static_cast<uint32_t>(
        std::lower_bound(distinct.begin(), distinct.end(), score, std::greater<>()) -
        distinct.begin());
  };
  for (const auto& [text, id] : vocab.by_text) {
    const absl::string_view view = text;
    size_t cut = utf8LeadLength(view, 0);
    while (cut < view.size()) {
      auto l = vocab.by_text.find(view.substr(0, cut));
      auto r = vocab.by_text.find(view.substr(cut));
      if (l != vocab.by_text.end() && r != vocab.by_text.end()) {
        parts->model->addMerge(l->second, r->second, id, rankOf(scores[id]), /*replace=*/false);
      }
      cut += utf8LeadLength(view, cut);
    }
  }
  parts->model->finalize();

  std::vector<std::string> table(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string& text = (*vocab.tokens)[i];
    switch (vocab.types[i]) {
      case kNormal: {
        std::string s;
        for (size_t at = 0; at < text.size();) {
          if (text.compare(at, 3, "\u2581") == 0) {
            s.push_back(' ');
            at += 3;
          } else {
            s.push_back(text[at++]);
          }
        }
        table[i] = std::move(s);
        break;
      }
      case kByte:
        if (auto byte = parseByteToken(text)) table[i] = std::string(1, static_cast<char>(*byte));
        break;
      case kControl:
      case kUnknown:
      case kUserDefined: table[i] = text; break;
      default: break;
    }
  }
  std::vector<DecoderStep> rest;
  if (add_space_prefix) {
    rest.push_back(
        DecoderStep{.kind = DecoderStep::Kind::kStrip, .pattern = " ", .strip_start = 1});
  }
  parts->decoder.setTable(std::move(table), std::move(rest));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::fromGguf(const model::GgufFile& file) {
  CLEAVE_ASSIGN_OR_RETURN(std::string kind, file.getString("tokenizer.ggml.model"));
  if (kind != "gpt2" && kind != "llama") {
    return fieldError(
        file, "tokenizer.ggml.model",
        absl::StrCat("tokenizer \"", kind, "\" is not supported (supported: gpt2, llama)"));
  }
  CLEAVE_ASSIGN_OR_RETURN(GgufVocab vocab, readVocab(file));
  const size_t n = vocab.tokens->size();
  PipelineParts parts;
  fillIdTable(vocab, &parts);
  CLEAVE_ASSIGN_OR_RETURN(parts.bos, optionalId(file, "tokenizer.ggml.bos_token_id", n));
  CLEAVE_ASSIGN_OR_RETURN(parts.eos, optionalId(file, "tokenizer.ggml.eos_token_id", n));
  CLEAVE_ASSIGN_OR_RETURN(std::optional<TokenId> unk,
                          optionalId(file, "tokenizer.ggml.unknown_token_id", n));

  bool add_bos = true;  // SentencePiece default.
  if (kind == "gpt2") {
    CLEAVE_RETURN_IF_ERROR(buildGpt2(file, vocab, &parts, &add_bos));
  } else {
    if (!unk) {
      auto it = vocab.by_text.find("<unk>");
      if (it != vocab.by_text.end()) unk = it->second;
    }
    CLEAVE_RETURN_IF_ERROR(buildLlama(file, vocab, unk, &parts));
  }
  parts.raw_tokens = addedTokens(vocab);

  CLEAVE_ASSIGN_OR_RETURN(std::optional<bool> bos_flag,
                          optionalBool(file, "tokenizer.ggml.add_bos_token"));
  CLEAVE_ASSIGN_OR_RETURN(std::optional<bool> eos_flag,
                          optionalBool(file, "tokenizer.ggml.add_eos_token"));
  if (bos_flag.value_or(add_bos) && parts.bos) parts.prefix.push_back(*parts.bos);
  if (eos_flag.value_or(false) && parts.eos) parts.suffix.push_back(*parts.eos);
  return std::make_unique<PipelineTokenizer>(std::move(parts));
}

}  // namespace cleave::tokenizer
