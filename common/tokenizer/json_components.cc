#include "common/tokenizer/json_components.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/tokenizer/patterns.h"
#include "common/tokenizer/utf8.h"

namespace cleave::tokenizer {
namespace {

absl::StatusOr<std::string> typeOf(const JsonReader& r, const Json& node, const std::string& path) {
  if (!node.is_object()) return r.error(path, "must be an object or null");
  return r.string(node, "type", path + ".type");
}

absl::Status tooDeep(const JsonReader& r, const std::string& path) {
  return r.error(path, absl::StrCat("sequences nest deeper than ", kMaxJsonNesting));
}

absl::Status tooManySteps(const JsonReader& r, const std::string& path) {
  return r.error(path, absl::StrCat("more than ", kMaxPipelineSteps, " steps"));
}

absl::StatusOr<std::shared_ptr<const Regex>> compileRegex(const JsonReader& r,
                                                          const std::string& pattern,
                                                          const std::string& path) {
  auto regex = Regex::compile(pattern);
  if (!regex.ok()) return r.error(path, regex.status().message());
  return std::shared_ptr<const Regex>(*std::move(regex));
}

// {"String": "..."} or {"Regex": "..."}: exactly one of `literal` / `regex` is set.
absl::Status parsePattern(const JsonReader& r, const Json& node, const std::string& path,
                          std::string* literal, std::shared_ptr<const Regex>* regex) {
  const Json* pattern = JsonReader::member(node, "pattern");
  if (pattern == nullptr) return r.error(path, "missing");
  if (!pattern->is_object()) return r.error(path, "must be {\"String\": ...} or {\"Regex\": ...}");
  if (const Json* s = JsonReader::member(*pattern, "String")) {
    if (!s->is_string()) return r.error(path + ".String", "must be a string");
    *literal = s->get<std::string>();
    return absl::OkStatus();
  }
  if (const Json* s = JsonReader::member(*pattern, "Regex")) {
    if (!s->is_string()) return r.error(path + ".Regex", "must be a string");
    CLEAVE_ASSIGN_OR_RETURN(*regex, compileRegex(r, s->get<std::string>(), path + ".Regex"));
    return absl::OkStatus();
  }
  return r.error(path, "must be {\"String\": ...} or {\"Regex\": ...}");
}

// A string holding exactly one character.
absl::StatusOr<std::string> oneChar(const JsonReader& r, const Json& node, const char* key,
                                    const std::string& path, std::string fallback) {
  CLEAVE_ASSIGN_OR_RETURN(std::string s, r.string(node, key, path, fallback));
  if (s.empty() || utf8SequenceLength(s, 0) != s.size()) {
    return r.error(path, "must be a single character");
  }
  return s;
}

absl::StatusOr<PrependScheme> prependScheme(const JsonReader& r, const Json& node,
                                            const std::string& path) {
  if (const Json* scheme = JsonReader::member(node, "prepend_scheme")) {
    if (!scheme->is_string()) return r.error(path + ".prepend_scheme", "must be a string");
    const auto s = scheme->get<std::string>();
    if (s == "always") return PrependScheme::kAlways;
    if (s == "first") return PrependScheme::kFirst;
    if (s == "never") return PrependScheme::kNever;
    return r.error(path + ".prepend_scheme", "must be \"always\", \"first\" or \"never\"");
  }
  // Older files: add_prefix_space (default true).
  CLEAVE_ASSIGN_OR_RETURN(bool add,
                          r.boolean(node, "add_prefix_space", path + ".add_prefix_space", true));
  return add ? PrependScheme::kAlways : PrependScheme::kNever;
}

absl::StatusOr<SplitBehavior> splitBehavior(const JsonReader& r, const Json& node,
                                            const std::string& path) {
  CLEAVE_ASSIGN_OR_RETURN(std::string b, r.string(node, "behavior", path, "Isolated"));
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return r.error(path, absl::StrCat("unknown split behavior \"", b, "\""));
}

}  // namespace

absl::Status parseNormalizer(const JsonReader& r, const Json* node, const std::string& path,
                             int depth, Normalizer* out) {
  if (node == nullptr || node->is_null()) return absl::OkStatus();
  if (depth > kMaxJsonNesting) return tooDeep(r, path);
  CLEAVE_ASSIGN_OR_RETURN(std::string type, typeOf(r, *node, path));
  if (type == "Sequence") {
    CLEAVE_ASSIGN_OR_RETURN(const Json* list,
                            r.requireArray(*node, "normalizers", path + ".normalizers"));
    for (size_t i = 0; i < list->size(); ++i) {
      CLEAVE_RETURN_IF_ERROR(parseNormalizer(
          r, &(*list)[i], absl::StrCat(path, ".normalizers[", i, "]"), depth + 1, out));
    }
    return absl::OkStatus();
  }
  NormalizerStep step;
  if (type == "Prepend") {
    step.kind = NormalizerStep::Kind::kPrepend;
    CLEAVE_ASSIGN_OR_RETURN(step.text, r.string(*node, "prepend", path + ".prepend"));
  } else if (type == "Replace") {
    step.kind = NormalizerStep::Kind::kReplace;
    CLEAVE_RETURN_IF_ERROR(parsePattern(r, *node, path + ".pattern", &step.text, &step.regex));
    CLEAVE_ASSIGN_OR_RETURN(step.content, r.string(*node, "content", path + ".content"));
  } else if (type == "NFC") {
    step.kind = NormalizerStep::Kind::kNfc;
  } else if (type == "Strip") {
    step.kind = NormalizerStep::Kind::kStrip;
    CLEAVE_ASSIGN_OR_RETURN(step.strip_left,
                            r.boolean(*node, "strip_left", path + ".strip_left", true));
    CLEAVE_ASSIGN_OR_RETURN(step.strip_right,
                            r.boolean(*node, "strip_right", path + ".strip_right", true));
  } else {
    return r.error(path + ".type",
                   absl::StrCat("normalizer \"", type,
                                "\" is not supported (supported: Prepend, Replace, Strip, NFC, "
                                "Sequence)"));
  }
  if (out->numSteps() >= kMaxPipelineSteps) return tooManySteps(r, path);
  out->addStep(std::move(step));
  return absl::OkStatus();
}

absl::Status parsePreTokenizer(const JsonReader& r, const Json* node, const std::string& path,
                               int depth, PreTokenizer* out, bool* byte_level) {
  if (node == nullptr || node->is_null()) return absl::OkStatus();
  if (depth > kMaxJsonNesting) return tooDeep(r, path);
  CLEAVE_ASSIGN_OR_RETURN(std::string type, typeOf(r, *node, path));
  if (*byte_level) {
    return r.error(path, "steps after a ByteLevel pre-tokenizer are not supported");
  }
  if (type == "Sequence") {
    CLEAVE_ASSIGN_OR_RETURN(const Json* list,
                            r.requireArray(*node, "pretokenizers", path + ".pretokenizers"));
    for (size_t i = 0; i < list->size(); ++i) {
      CLEAVE_RETURN_IF_ERROR(parsePreTokenizer(r, &(*list)[i],
                                               absl::StrCat(path, ".pretokenizers[", i, "]"),
                                               depth + 1, out, byte_level));
    }
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    CLEAVE_ASSIGN_OR_RETURN(bool prefix,
                            r.boolean(*node, "add_prefix_space", path + ".add_prefix_space", true));
    CLEAVE_ASSIGN_OR_RETURN(bool use_regex,
                            r.boolean(*node, "use_regex", path + ".use_regex", true));
    if (out->numSteps() + 2 > kMaxPipelineSteps) return tooManySteps(r, path);
    if (prefix) out->addStep(PreTokenizerStep{.kind = PreTokenizerStep::Kind::kPrefixSpace});
    if (use_regex) {
      CLEAVE_ASSIGN_OR_RETURN(auto regex, compileRegex(r, patterns::kGpt2, path));
      out->addStep(PreTokenizerStep{.kind = PreTokenizerStep::Kind::kSplit, .regex = regex});
    }
    *byte_level = true;
    return absl::OkStatus();
  }
  PreTokenizerStep step;
  if (type == "Split") {
    CLEAVE_RETURN_IF_ERROR(parsePattern(r, *node, path + ".pattern", &step.literal, &step.regex));
    CLEAVE_ASSIGN_OR_RETURN(step.behavior, splitBehavior(r, *node, path + ".behavior"));
    CLEAVE_ASSIGN_OR_RETURN(step.invert, r.boolean(*node, "invert", path + ".invert", false));
  } else if (type == "Digits") {
    CLEAVE_ASSIGN_OR_RETURN(
        bool individual, r.boolean(*node, "individual_digits", path + ".individual_digits", false));
    CLEAVE_ASSIGN_OR_RETURN(
        step.regex, compileRegex(r, individual ? patterns::kDigit : patterns::kDigits, path));
  } else if (type == "Metaspace") {
    step.kind = PreTokenizerStep::Kind::kMetaspace;
    CLEAVE_ASSIGN_OR_RETURN(step.replacement,
                            oneChar(r, *node, "replacement", path + ".replacement", "\u2581"));
    CLEAVE_ASSIGN_OR_RETURN(step.prepend_scheme, prependScheme(r, *node, path));
    CLEAVE_ASSIGN_OR_RETURN(step.split, r.boolean(*node, "split", path + ".split", true));
  } else if (type == "WhitespaceSplit") {
    step.behavior = SplitBehavior::kRemoved;
    CLEAVE_ASSIGN_OR_RETURN(step.regex, compileRegex(r, R"(\s+)", path));
  } else if (type == "Whitespace") {
    step.behavior = SplitBehavior::kRemoved;
    step.invert = true;
    CLEAVE_ASSIGN_OR_RETURN(step.regex, compileRegex(r, R"(\w+|[^\w\s]+)", path));
  } else {
    return r.error(path + ".type",
                   absl::StrCat("pre-tokenizer \"", type,
                                "\" is not supported (supported: ByteLevel, Split, Digits, "
                                "Metaspace, Whitespace, WhitespaceSplit, Sequence)"));
  }
  if (out->numSteps() >= kMaxPipelineSteps) return tooManySteps(r, path);
  out->addStep(std::move(step));
  return absl::OkStatus();
}

absl::Status parseDecoder(const JsonReader& r, const Json* node, const std::string& path, int depth,
                          Decoder* out) {
  if (node == nullptr || node->is_null()) {
    if (depth == 0) out->addStep(DecoderStep{.kind = DecoderStep::Kind::kJoinWithSpace});
    return absl::OkStatus();
  }
  if (depth > kMaxJsonNesting) return tooDeep(r, path);
  CLEAVE_ASSIGN_OR_RETURN(std::string type, typeOf(r, *node, path));
  if (type == "Sequence") {
    CLEAVE_ASSIGN_OR_RETURN(const Json* list,
                            r.requireArray(*node, "decoders", path + ".decoders"));
    for (size_t i = 0; i < list->size(); ++i) {
      CLEAVE_RETURN_IF_ERROR(
          parseDecoder(r, &(*list)[i], absl::StrCat(path, ".decoders[", i, "]"), depth + 1, out));
    }
    return absl::OkStatus();
  }
  DecoderStep step;
  if (type == "ByteLevel") {
    step.kind = DecoderStep::Kind::kByteLevel;
  } else if (type == "ByteFallback") {
    step.kind = DecoderStep::Kind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = DecoderStep::Kind::kFuse;
  } else if (type == "Replace") {
    step.kind = DecoderStep::Kind::kReplace;
    std::shared_ptr<const Regex> regex;
    CLEAVE_RETURN_IF_ERROR(parsePattern(r, *node, path + ".pattern", &step.pattern, &regex));
    if (regex != nullptr) {
      return r.error(path + ".pattern", "a Regex pattern in a Replace decoder is not supported");
    }
    CLEAVE_ASSIGN_OR_RETURN(step.content, r.string(*node, "content", path + ".content"));
  } else if (type == "Strip") {
    step.kind = DecoderStep::Kind::kStrip;
    CLEAVE_ASSIGN_OR_RETURN(step.pattern, oneChar(r, *node, "content", path + ".content", " "));
    CLEAVE_ASSIGN_OR_RETURN(step.strip_start,
                            r.uintMember(*node, "start", path + ".start", 1u << 20, 0));
    CLEAVE_ASSIGN_OR_RETURN(step.strip_stop,
                            r.uintMember(*node, "stop", path + ".stop", 1u << 20, 0));
  } else if (type == "Metaspace") {
    step.kind = DecoderStep::Kind::kMetaspace;
    CLEAVE_ASSIGN_OR_RETURN(step.pattern,
                            oneChar(r, *node, "replacement", path + ".replacement", "\u2581"));
    CLEAVE_ASSIGN_OR_RETURN(PrependScheme scheme, prependScheme(r, *node, path));
    step.metaspace_prepend = scheme != PrependScheme::kNever;
  } else if (type == "BPEDecoder") {
    step.kind = DecoderStep::Kind::kBpeSuffix;
    CLEAVE_ASSIGN_OR_RETURN(step.pattern, r.string(*node, "suffix", path + ".suffix", "</w>"));
  } else {
    return r.error(path + ".type",
                   absl::StrCat("decoder \"", type,
                                "\" is not supported (supported: ByteLevel, Metaspace, Replace, "
                                "ByteFallback, Fuse, Strip, BPEDecoder, Sequence)"));
  }
  if (out->numSteps() >= kMaxPipelineSteps) return tooManySteps(r, path);
  out->addStep(std::move(step));
  return absl::OkStatus();
}

namespace {

// ["<s>", 1] as RobertaProcessing and BertProcessing write their tokens.
absl::StatusOr<TokenId> pairToken(const JsonReader& r, const Json& node, const char* key,
                                  const std::string& path) {
  const Json* v = JsonReader::member(node, key);
  if (v == nullptr) return r.error(path, "missing");
  if (!v->is_array() || v->size() != 2 || !(*v)[0].is_string()) {
    return r.error(path, "must be [\"token\", id]");
  }
  CLEAVE_ASSIGN_OR_RETURN(uint64_t id, r.uint((*v)[1], path + "[1]", UINT32_MAX));
  return static_cast<TokenId>(id);
}

absl::Status parseTemplate(const JsonReader& r, const Json& node, const std::string& path,
                           TokenLookup find, std::vector<TokenId>* prefix,
                           std::vector<TokenId>* suffix) {
  CLEAVE_ASSIGN_OR_RETURN(const Json* single, r.requireArray(node, "single", path + ".single"));
  const Json* specials = JsonReader::member(node, "special_tokens");
  std::vector<TokenId> before;
  std::vector<TokenId> after;
  bool seen_sequence = false;
  for (size_t i = 0; i < single->size(); ++i) {
    const std::string item_path = absl::StrCat(path, ".single[", i, "]");
    const Json& item = (*single)[i];
    if (JsonReader::member(item, "Sequence") != nullptr) {
      seen_sequence = true;
      continue;
    }
    const Json* special = JsonReader::member(item, "SpecialToken");
    if (special == nullptr) {
      return r.error(item_path, "must be {\"SpecialToken\": ...} or {\"Sequence\": ...}");
    }
    CLEAVE_ASSIGN_OR_RETURN(std::string name,
                            r.string(*special, "id", item_path + ".SpecialToken.id"));
    std::vector<TokenId> ids;
    const Json* entry = specials != nullptr ? JsonReader::member(*specials, name.c_str()) : nullptr;
    if (entry != nullptr) {
      const std::string entry_path = path + ".special_tokens." + name + ".ids";
      CLEAVE_ASSIGN_OR_RETURN(const Json* list, r.requireArray(*entry, "ids", entry_path));
      for (size_t k = 0; k < list->size(); ++k) {
        CLEAVE_ASSIGN_OR_RETURN(
            uint64_t id, r.uint((*list)[k], absl::StrCat(entry_path, "[", k, "]"), UINT32_MAX));
        ids.push_back(static_cast<TokenId>(id));
      }
    } else if (auto id = find(name)) {
      ids.push_back(*id);
    } else {
      return r.error(
          item_path + ".SpecialToken.id",
          absl::StrCat("token \"", name, "\" is not in special_tokens or the vocabulary"));
    }
    auto& target = seen_sequence ? after : before;
    target.insert(target.end(), ids.begin(), ids.end());
  }
  prefix->insert(prefix->begin(), before.begin(), before.end());
  suffix->insert(suffix->end(), after.begin(), after.end());
  return absl::OkStatus();
}

}  // namespace

absl::Status parsePostProcessor(const JsonReader& r, const Json* node, const std::string& path,
                                int depth, TokenLookup find, std::vector<TokenId>* prefix,
                                std::vector<TokenId>* suffix) {
  if (node == nullptr || node->is_null()) return absl::OkStatus();
  if (depth > kMaxJsonNesting) return tooDeep(r, path);
  CLEAVE_ASSIGN_OR_RETURN(std::string type, typeOf(r, *node, path));
  if (type == "Sequence") {
    CLEAVE_ASSIGN_OR_RETURN(const Json* list,
                            r.requireArray(*node, "processors", path + ".processors"));
    for (size_t i = 0; i < list->size(); ++i) {
      CLEAVE_RETURN_IF_ERROR(parsePostProcessor(r, &(*list)[i],
                                                absl::StrCat(path, ".processors[", i, "]"),
                                                depth + 1, find, prefix, suffix));
    }
    return absl::OkStatus();
  }
  if (type == "ByteLevel") return absl::OkStatus();  // Offsets only.
  if (type == "TemplateProcessing") return parseTemplate(r, *node, path, find, prefix, suffix);
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    CLEAVE_ASSIGN_OR_RETURN(TokenId cls, pairToken(r, *node, "cls", path + ".cls"));
    CLEAVE_ASSIGN_OR_RETURN(TokenId sep, pairToken(r, *node, "sep", path + ".sep"));
    prefix->insert(prefix->begin(), cls);
    suffix->push_back(sep);
    return absl::OkStatus();
  }
  return r.error(path + ".type",
                 absl::StrCat("post-processor \"", type,
                              "\" is not supported (supported: TemplateProcessing, ByteLevel, "
                              "RobertaProcessing, BertProcessing, Sequence)"));
}

}  // namespace cleave::tokenizer
