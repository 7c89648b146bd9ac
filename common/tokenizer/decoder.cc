#include "common/tokenizer/decoder.h"

#include <utility>

#include "absl/strings/str_replace.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/utf8.h"

namespace cleave::tokenizer {
namespace {

using Kind = DecoderStep::Kind;

std::string byteLevelToken(absl::string_view token) {
  auto bytes = byteLevelDecode(token);
  return bytes ? *std::move(bytes) : std::string(token);
}

// "<0x41>" -> "A"; anything else unchanged.
std::string byteFallbackToken(std::string token) {
  if (auto byte = parseByteToken(token)) return std::string(1, static_cast<char>(*byte));
  return token;
}

std::string replaceAll(const std::string& token, const DecoderStep& step) {
  if (step.pattern.empty()) return token;
  return absl::StrReplaceAll(token, {{step.pattern, step.content}});
}

// Removes up to `start` leading and `stop` trailing copies of `c` (one UTF-8 character).
std::string stripChar(const std::string& token, const std::string& c, size_t start, size_t stop) {
  if (c.empty()) return token;
  const absl::string_view view = token;
  size_t begin = 0;
  for (size_t i = 0; i < start && view.substr(begin, c.size()) == c; ++i) begin += c.size();
  size_t end = view.size();
  for (size_t i = 0;
       i < stop && end >= begin + c.size() && view.substr(end - c.size(), c.size()) == c; ++i) {
    end -= c.size();
  }
  return std::string(view.substr(begin, end - begin));
}

std::string join(const std::vector<std::string>& tokens, absl::string_view separator) {
  std::string out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i > 0) out.append(separator.data(), separator.size());
    out += tokens[i];
  }
  return out;
}

// Applies one step to the whole list.
void applyStep(const DecoderStep& step, std::vector<std::string>* tokens) {
  std::vector<std::string>& t = *tokens;
  switch (step.kind) {
    case Kind::kByteLevel: {
      std::string joined;
      for (const std::string& s : t) joined += byteLevelToken(s);
      t.assign(1, std::move(joined));
      return;
    }
    case Kind::kReplace:
      for (std::string& s : t) s = replaceAll(s, step);
      return;
    case Kind::kByteFallback:
      for (std::string& s : t) s = byteFallbackToken(std::move(s));
      return;
    case Kind::kFuse: t.assign(1, join(t, "")); return;
    case Kind::kJoinWithSpace: t.assign(1, join(t, " ")); return;
    case Kind::kStrip:
      for (std::string& s : t) s = stripChar(s, step.pattern, step.strip_start, step.strip_stop);
      return;
    case Kind::kMetaspace:
      for (size_t i = 0; i < t.size(); ++i) {
        const bool drop = i == 0 && step.metaspace_prepend;
        t[i] = absl::StrReplaceAll(t[i], {{step.pattern, drop ? "" : " "}});
      }
      return;
    case Kind::kBpeSuffix:
      for (size_t i = 0; i < t.size(); ++i) {
        if (step.pattern.empty()) continue;
        t[i] = absl::StrReplaceAll(t[i], {{step.pattern, i + 1 == t.size() ? "" : " "}});
      }
      return;
  }
}

// Steps that act on each token alone, with no join before them, fold into the table.
bool foldable(const DecoderStep& step) {
  switch (step.kind) {
    case Kind::kByteLevel:
    case Kind::kReplace:
    case Kind::kByteFallback:
    case Kind::kFuse: return true;
    default: return false;
  }
}

}  // namespace

void Decoder::finalize(const std::vector<std::string>& pieces) {
  folded_ = 0;
  joined_ = false;
  while (folded_ < steps_.size() && !joined_ && foldable(steps_[folded_])) {
    const Kind kind = steps_[folded_].kind;
    joined_ = kind == Kind::kByteLevel || kind == Kind::kFuse;
    ++folded_;
  }
  table_.resize(pieces.size());
  for (size_t id = 0; id < pieces.size(); ++id) {
    std::string s = pieces[id];
    for (size_t i = 0; i < folded_; ++i) {
      switch (steps_[i].kind) {
        case Kind::kByteLevel: s = byteLevelToken(s); break;
        case Kind::kReplace: s = replaceAll(s, steps_[i]); break;
        case Kind::kByteFallback: s = byteFallbackToken(std::move(s)); break;
        default: break;  // kFuse: concatenation is what decode() does anyway.
      }
    }
    table_[id] = std::move(s);
  }
}

void Decoder::setTable(std::vector<std::string> table, std::vector<DecoderStep> rest) {
  table_ = std::move(table);
  steps_ = std::move(rest);
  folded_ = 0;
  joined_ = true;
}

void Decoder::decode(std::span<const TokenId> ids, std::string* out) const {
  if (folded_ == steps_.size()) {
    for (TokenId id : ids) {
      if (id < table_.size()) *out += table_[id];
    }
    return;
  }
  std::vector<std::string> tokens;
  if (joined_) {
    tokens.emplace_back();
    for (TokenId id : ids) {
      if (id < table_.size()) tokens[0] += table_[id];
    }
  } else {
    tokens.reserve(ids.size());
    for (TokenId id : ids) {
      if (id < table_.size()) tokens.push_back(table_[id]);
    }
  }
  for (size_t i = folded_; i < steps_.size(); ++i) applyStep(steps_[i], &tokens);
  for (const std::string& s : tokens) *out += s;
}

}  // namespace cleave::tokenizer
