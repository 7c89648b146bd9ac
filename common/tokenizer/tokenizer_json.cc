// Hugging Face tokenizer.json (and tokenizer_config.json) to a PipelineTokenizer.
#include <algorithm>
#include <fstream>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/json_components.h"
#include "common/tokenizer/json_reader.h"
#include "common/tokenizer/loaders.h"
#include "common/tokenizer/pipeline_tokenizer.h"
#include "common/tokenizer/utf8.h"

namespace cleave::tokenizer {
namespace {

// Ids may leave gaps, but not absurd ones: the id table is allocated up to the largest id.
uint64_t maxTokenId(size_t entries) {
  const uint64_t bound = std::max<uint64_t>(2 * entries, entries + 65536);
  return std::min<uint64_t>(bound, (1u << 31) - 1);
}

absl::StatusOr<Json> parseJson(absl::string_view text, const std::string& name) {
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": invalid JSON: ", e.what()));
  }
}

struct ModelVocab {
  std::vector<std::pair<std::string, TokenId>> entries;  // In file order.
  absl::flat_hash_map<std::string, TokenId> by_text;
};

absl::StatusOr<ModelVocab> parseVocab(const JsonReader& r, const Json& model) {
  ModelVocab vocab;
  CLEAVE_ASSIGN_OR_RETURN(const Json* v, r.requireObject(model, "vocab", "model.vocab"));
  vocab.entries.reserve(v->size());
  for (auto it = v->begin(); it != v->end(); ++it) {
    const std::string path = absl::StrCat("model.vocab[\"", it.key(), "\"]");
    if (!isValidUtf8(it.key())) return r.error("model.vocab", "a token is not valid UTF-8");
    CLEAVE_ASSIGN_OR_RETURN(uint64_t id, r.uint(it.value(), path, UINT32_MAX));
    vocab.entries.emplace_back(it.key(), static_cast<TokenId>(id));
    vocab.by_text.try_emplace(it.key(), static_cast<TokenId>(id));
  }
  return vocab;
}

absl::StatusOr<std::vector<AddedToken>> parseAddedTokens(const JsonReader& r, const Json& root) {
  std::vector<AddedToken> tokens;
  const Json* list = JsonReader::member(root, "added_tokens");
  if (list == nullptr) return tokens;
  if (!list->is_array()) return r.error("added_tokens", "must be an array");
  for (size_t i = 0; i < list->size(); ++i) {
    const std::string path = absl::StrCat("added_tokens[", i, "]");
    const Json& item = (*list)[i];
    if (!item.is_object()) return r.error(path, "must be an object");
    AddedToken t;
    const Json* id = JsonReader::member(item, "id");
    if (id == nullptr) return r.error(path + ".id", "missing");
    CLEAVE_ASSIGN_OR_RETURN(uint64_t id_value, r.uint(*id, path + ".id", UINT32_MAX));
    t.id = static_cast<TokenId>(id_value);
    CLEAVE_ASSIGN_OR_RETURN(t.content, r.string(item, "content", path + ".content"));
    if (!isValidUtf8(t.content)) return r.error(path + ".content", "not valid UTF-8");
    CLEAVE_ASSIGN_OR_RETURN(t.special, r.boolean(item, "special", path + ".special", false));
    CLEAVE_ASSIGN_OR_RETURN(t.lstrip, r.boolean(item, "lstrip", path + ".lstrip", false));
    CLEAVE_ASSIGN_OR_RETURN(t.rstrip, r.boolean(item, "rstrip", path + ".rstrip", false));
    CLEAVE_ASSIGN_OR_RETURN(t.single_word,
                            r.boolean(item, "single_word", path + ".single_word", false));
    CLEAVE_ASSIGN_OR_RETURN(t.normalized,
                            r.boolean(item, "normalized", path + ".normalized", !t.special));
    tokens.push_back(std::move(t));
  }
  return tokens;
}

absl::Status parseMerges(const JsonReader& r, const Json& model, const ModelVocab& vocab,
                         const std::string& subword_prefix, BpeModel* bpe) {
  const Json* merges = JsonReader::member(model, "merges");
  if (merges == nullptr) return absl::OkStatus();
  if (!merges->is_array()) return r.error("model.merges", "must be an array");
  for (size_t i = 0; i < merges->size(); ++i) {
    const std::string path = absl::StrCat("model.merges[", i, "]");
    const Json& m = (*merges)[i];
    std::string left;
    std::string right;
    if (m.is_string()) {
      const auto s = m.get<std::string>();
      std::vector<std::string> parts = absl::StrSplit(s, ' ');
      if (parts.size() != 2) return r.error(path, "must be two tokens separated by one space");
      left = std::move(parts[0]);
      right = std::move(parts[1]);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      return r.error(path, "must be \"a b\" or [\"a\", \"b\"]");
    }
    auto l = vocab.by_text.find(left);
    auto rt = vocab.by_text.find(right);
    if (l == vocab.by_text.end()) {
      return r.error(path, absl::StrCat("token \"", left, "\" is not in model.vocab"));
    }
    if (rt == vocab.by_text.end()) {
      return r.error(path, absl::StrCat("token \"", right, "\" is not in model.vocab"));
    }
    absl::string_view tail = right;
    if (!subword_prefix.empty() && tail.substr(0, subword_prefix.size()) == subword_prefix) {
      tail.remove_prefix(subword_prefix.size());
    }
    const std::string merged = absl::StrCat(left, tail);
    auto mt = vocab.by_text.find(merged);
    if (mt == vocab.by_text.end()) {
      return r.error(path, absl::StrCat("merged token \"", merged, "\" is not in model.vocab"));
    }
    // A repeated pair takes its last rank, as the reference's map does.
    bpe->addMerge(l->second, rt->second, mt->second, static_cast<uint32_t>(i), /*replace=*/true);
  }
  return absl::OkStatus();
}

// The id of a bos_token/eos_token as tokenizer_config.json names it.
std::optional<TokenId> lookupToken(const std::vector<AddedToken>& added, const ModelVocab& vocab,
                                   const std::string& text) {
  for (const AddedToken& t : added) {
    if (t.content == text) return t.id;
  }
  auto it = vocab.by_text.find(text);
  if (it != vocab.by_text.end()) return it->second;
  return std::nullopt;
}

void applyConfig(const TokenizerConfig& config, const std::vector<AddedToken>& added,
                 const ModelVocab& vocab, PipelineParts* parts) {
  if (config.bos_token) {
    if (auto id = lookupToken(added, vocab, *config.bos_token)) parts->bos = id;
  }
  if (config.eos_token) {
    if (auto id = lookupToken(added, vocab, *config.eos_token)) parts->eos = id;
  }
  if (config.add_bos_token && parts->bos) {
    const bool has = !parts->prefix.empty() && parts->prefix.front() == *parts->bos;
    if (*config.add_bos_token && !has) parts->prefix.insert(parts->prefix.begin(), *parts->bos);
    if (!*config.add_bos_token && has) parts->prefix.erase(parts->prefix.begin());
  }
  if (config.add_eos_token && parts->eos) {
    const bool has = !parts->suffix.empty() && parts->suffix.back() == *parts->eos;
    if (*config.add_eos_token && !has) parts->suffix.push_back(*parts->eos);
    if (!*config.add_eos_token && has) parts->suffix.pop_back();
  }
}

// Without tokenizer_config.json: the post-processor's tokens, else well-known names.
void guessBosEos(const std::vector<AddedToken>& added, const ModelVocab& vocab,
                 PipelineParts* parts) {
  if (!parts->bos && !parts->prefix.empty()) parts->bos = parts->prefix.front();
  if (!parts->eos && !parts->suffix.empty()) parts->eos = parts->suffix.back();
  for (const char* name : {"<s>", "<|begin_of_text|>", "<|startoftext|>"}) {
    if (parts->bos) break;
    parts->bos = lookupToken(added, vocab, name);
  }
  for (const char* name : {"</s>", "<|end_of_text|>", "<|endoftext|>", "<|im_end|>"}) {
    if (parts->eos) break;
    parts->eos = lookupToken(added, vocab, name);
  }
}

}  // namespace

absl::StatusOr<std::string> readFileLimited(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0) return absl::InvalidArgumentError(absl::StrCat(path, ": cannot read"));
  if (static_cast<uint64_t>(size) > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", size, " bytes is larger than the limit of ", max_bytes));
  }
  std::string data(static_cast<size_t>(size), '\0');
  in.seekg(0, std::ios::beg);
  if (!in.read(data.data(), size)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": read failed"));
  }
  return data;
}

absl::StatusOr<TokenizerConfig> parseTokenizerConfig(absl::string_view json,
                                                     const std::string& name) {
  CLEAVE_ASSIGN_OR_RETURN(Json root, parseJson(json, name));
  JsonReader r(name);
  if (!root.is_object()) return r.error("(root)", "must be an object");
  TokenizerConfig config;
  for (const char* key : {"bos_token", "eos_token"}) {
    const Json* v = JsonReader::member(root, key);
    if (v == nullptr) continue;
    std::string text;
    if (v->is_string()) {
      text = v->get<std::string>();
    } else if (v->is_object()) {
      CLEAVE_ASSIGN_OR_RETURN(text, r.string(*v, "content", absl::StrCat(key, ".content")));
    } else {
      return r.error(key, "must be a string or an object with \"content\"");
    }
    (std::string(key) == "bos_token" ? config.bos_token : config.eos_token) = text;
  }
  for (const char* key : {"add_bos_token", "add_eos_token"}) {
    const Json* v = JsonReader::member(root, key);
    if (v == nullptr) continue;
    if (!v->is_boolean()) return r.error(key, "must be true or false");
    (std::string(key) == "add_bos_token" ? config.add_bos_token : config.add_eos_token) =
        v->get<bool>();
  }
  return config;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> buildFromTokenizerJson(absl::string_view json,
                                                                  const std::string& name,
                                                                  const TokenizerConfig* config) {
  CLEAVE_ASSIGN_OR_RETURN(Json root, parseJson(json, name));
  JsonReader r(name);
  if (!root.is_object()) return r.error("(root)", "must be an object");
  CLEAVE_ASSIGN_OR_RETURN(const Json* model, r.requireObject(root, "model", "model"));
  std::string type;
  if (JsonReader::member(*model, "type") != nullptr) {
    CLEAVE_ASSIGN_OR_RETURN(type, r.string(*model, "type", "model.type"));
  } else if (JsonReader::member(*model, "merges") != nullptr) {
    type = "BPE";  // Older files leave the type out.
  } else {
    return r.error("model.type", "missing");
  }
  if (type != "BPE") {
    return r.error("model.type", absl::StrCat("model \"", type,
                                              "\" is not supported (only BPE: byte-level or "
                                              "SentencePiece-style)"));
  }

  PipelineParts parts;
  bool byte_level = false;
  CLEAVE_RETURN_IF_ERROR(parseNormalizer(r, JsonReader::member(root, "normalizer"), "normalizer", 0,
                                         &parts.normalizer));
  CLEAVE_RETURN_IF_ERROR(parsePreTokenizer(r, JsonReader::member(root, "pre_tokenizer"),
                                           "pre_tokenizer", 0, &parts.pre_tokenizer, &byte_level));

  CLEAVE_ASSIGN_OR_RETURN(ModelVocab vocab, parseVocab(r, *model));
  CLEAVE_ASSIGN_OR_RETURN(std::vector<AddedToken> added, parseAddedTokens(r, root));
  // An added token whose text the model vocabulary already has takes the model's id, as in
  // the reference (its own id then names nothing).
  for (AddedToken& t : added) {
    auto it = vocab.by_text.find(t.content);
    if (it != vocab.by_text.end()) t.id = it->second;
  }

  // The id table.
  const uint64_t max_id = maxTokenId(vocab.entries.size() + added.size());
  uint64_t size = 0;
  for (const auto& [text, id] : vocab.entries) {
    if (id > max_id) {
      return r.error(
          absl::StrCat("model.vocab[\"", text, "\"]"),
          absl::StrCat("id ", id, " is out of range for ", vocab.entries.size(), " entries"));
    }
    size = std::max<uint64_t>(size, uint64_t{id} + 1);
  }
  for (size_t i = 0; i < added.size(); ++i) {
    if (added[i].id > max_id) {
      return r.error(absl::StrCat("added_tokens[", i, "].id"),
                     absl::StrCat("id ", added[i].id, " is out of range"));
    }
    size = std::max<uint64_t>(size, uint64_t{added[i].id} + 1);
  }
  parts.pieces.resize(size);
  parts.present.assign(size, false);
  parts.special.assign(size, false);
  for (const auto& [text, id] : vocab.entries) {
    if (parts.present[id]) continue;
    parts.pieces[id] = text;
    parts.present[id] = true;
  }
  for (const AddedToken& t : added) {
    parts.pieces[t.id] = t.content;
    parts.present[t.id] = true;
    parts.special[t.id] = t.special;
  }

  // The BPE model.
  BpeModelOptions options;
  options.unit_mode = byte_level ? UnitMode::kBytes : UnitMode::kUtf8Chars;
  CLEAVE_ASSIGN_OR_RETURN(options.byte_fallback,
                          r.boolean(*model, "byte_fallback", "model.byte_fallback", false));
  CLEAVE_ASSIGN_OR_RETURN(options.fuse_unk, r.boolean(*model, "fuse_unk", "model.fuse_unk", false));
  CLEAVE_ASSIGN_OR_RETURN(options.ignore_merges,
                          r.boolean(*model, "ignore_merges", "model.ignore_merges", false));
  CLEAVE_ASSIGN_OR_RETURN(std::string unk, r.string(*model, "unk_token", "model.unk_token", ""));
  if (!unk.empty()) {
    auto it = vocab.by_text.find(unk);
    if (it == vocab.by_text.end()) {
      return r.error("model.unk_token", absl::StrCat("\"", unk, "\" is not in model.vocab"));
    }
    options.unk_id = it->second;
  }
  CLEAVE_ASSIGN_OR_RETURN(
      options.continuing_subword_prefix,
      r.string(*model, "continuing_subword_prefix", "model.continuing_subword_prefix", ""));
  CLEAVE_ASSIGN_OR_RETURN(options.end_of_word_suffix,
                          r.string(*model, "end_of_word_suffix", "model.end_of_word_suffix", ""));
  if (byte_level &&
      (!options.continuing_subword_prefix.empty() || !options.end_of_word_suffix.empty())) {
    return r.error("model.continuing_subword_prefix",
                   "subword prefixes and suffixes are not supported with a ByteLevel "
                   "pre-tokenizer");
  }
  const std::string subword_prefix = options.continuing_subword_prefix;
  parts.model = std::make_unique<BpeModel>(std::move(options));
  for (const auto& [text, id] : vocab.entries) {
    if (!byte_level) {
      parts.model->addToken(text, id);
    } else if (auto bytes = byteLevelDecode(text)) {
      // Entries outside the byte alphabet can never come out of the byte-level mapping.
      parts.model->addToken(*bytes, id);
    }
  }
  CLEAVE_RETURN_IF_ERROR(parseMerges(r, *model, vocab, subword_prefix, parts.model.get()));
  parts.model->finalize();

  // Added tokens: those matched in the raw text, and those matched after normalizing.
  std::vector<AddedToken> raw;
  std::vector<AddedToken> normalized;
  for (const AddedToken& t : added) {
    if (t.normalized && !parts.normalizer.empty()) {
      AddedToken n = t;
      n.content = parts.normalizer.apply(t.content);
      normalized.push_back(std::move(n));
    } else if (t.normalized) {
      normalized.push_back(t);
    } else {
      raw.push_back(t);
    }
  }
  parts.raw_tokens =
      std::make_unique<AddedTokenMatcher>(std::move(raw), AddedTokenPolicy::kLeftmostLongest);
  if (!normalized.empty()) {
    parts.normalized_tokens = std::make_unique<AddedTokenMatcher>(
        std::move(normalized), AddedTokenPolicy::kLeftmostLongest);
  }

  CLEAVE_RETURN_IF_ERROR(
      parseDecoder(r, JsonReader::member(root, "decoder"), "decoder", 0, &parts.decoder));
  parts.decoder.finalize(parts.pieces);

  auto find = [&](const std::string& text) { return lookupToken(added, vocab, text); };
  CLEAVE_RETURN_IF_ERROR(parsePostProcessor(r, JsonReader::member(root, "post_processor"),
                                            "post_processor", 0, find, &parts.prefix,
                                            &parts.suffix));
  for (const std::vector<TokenId>* ids : {&parts.prefix, &parts.suffix}) {
    for (TokenId id : *ids) {
      if (id >= parts.pieces.size() || !parts.present[id]) {
        return r.error("post_processor",
                       absl::StrCat("token id ", id, " is not in the vocabulary"));
      }
    }
  }
  if (config != nullptr) applyConfig(*config, added, vocab, &parts);
  guessBosEos(added, vocab, &parts);
  return std::make_unique<PipelineTokenizer>(std::move(parts));
}

}  // namespace cleave::tokenizer
