#include "common/tokenizer/pipeline_tokenizer.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace cleave::tokenizer {

PipelineTokenizer::PipelineTokenizer(PipelineParts parts) : parts_(std::move(parts)) {}

std::vector<TokenId> PipelineTokenizer::encode(absl::string_view text,
                                               const EncodeOptions& options) const {
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + parts_.prefix.size() + parts_.suffix.size() + 4);
  if (options.add_special_tokens) out = parts_.prefix;
  if (parts_.raw_tokens == nullptr || parts_.raw_tokens->empty()) {
    encodeText(text, true, options.parse_special, &out);
  } else {
    std::vector<Segment> segments;
    parts_.raw_tokens->split(text, options.parse_special, &segments);
    for (const Segment& s : segments) {
      if (s.id >= 0) {
        out.push_back(static_cast<TokenId>(s.id));
      } else {
        encodeText(text.substr(s.begin, s.end - s.begin), s.begin == 0, options.parse_special,
                   &out);
      }
    }
  }
  if (options.add_special_tokens) out.insert(out.end(), parts_.suffix.begin(), parts_.suffix.end());
  return out;
}

void PipelineTokenizer::encodeText(absl::string_view text, bool at_start, bool parse_special,
                                   std::vector<TokenId>* out) const {
  auto toModel = [&](absl::string_view word) { parts_.model->encodeWord(word, out); };
  if (parts_.normalizer.empty() && parts_.normalized_tokens == nullptr) {
    parts_.pre_tokenizer.apply(text, at_start, toModel);
    return;
  }
  const std::string normalized = parts_.normalizer.apply(text);
  if (parts_.normalized_tokens == nullptr) {
    parts_.pre_tokenizer.apply(normalized, at_start, toModel);
    return;
  }
  std::vector<Segment> segments;
  parts_.normalized_tokens->split(normalized, parse_special, &segments);
  const absl::string_view view = normalized;
  for (const Segment& s : segments) {
    if (s.id >= 0) {
      out->push_back(static_cast<TokenId>(s.id));
    } else {
      parts_.pre_tokenizer.apply(view.substr(s.begin, s.end - s.begin), at_start && s.begin == 0,
                                 toModel);
    }
  }
}

std::string PipelineTokenizer::decode(std::span<const TokenId> ids,
                                      bool skip_special_tokens) const {
  std::vector<TokenId> kept;
  kept.reserve(ids.size());
  for (TokenId id : ids) {
    if (id >= parts_.pieces.size() || !parts_.present[id]) continue;
    if (skip_special_tokens && parts_.special[id]) continue;
    kept.push_back(id);
  }
  std::string out;
  parts_.decoder.decode(kept, &out);
  return out;
}

absl::StatusOr<std::string> PipelineTokenizer::piece(TokenId id) const {
  if (id >= parts_.pieces.size() || !parts_.present[id]) {
    return absl::NotFoundError(
        absl::StrCat("token id ", id, " is not in the vocabulary (size ", vocabSize(), ")"));
  }
  return parts_.pieces[id];
}

bool PipelineTokenizer::isSpecial(TokenId id) const {
  return id < parts_.special.size() && parts_.special[id];
}

}  // namespace cleave::tokenizer
