#include "common/jinja/lexer.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/jinja/text.h"
#include "common/status_macros.h"

namespace cleave::jinja {
namespace {

bool isNameStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool isNameChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool isBlank(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string rstripWhitespace(std::string s) { return text::strip(s, std::nullopt, false, true); }

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {}

  absl::StatusOr<std::vector<Token>> run() {
    // Whether the text about to be read starts a line (for lstrip_blocks).
    bool line_starting = true;
    bool strip_next = false;  // the previous tag ended with '-'
    while (pos_ < src_.size()) {
      size_t open = findOpen(pos_);
      std::string chunk = src_.substr(pos_, open - pos_);
      if (strip_next) chunk = text::strip(chunk, std::nullopt, true, false);
      strip_next = false;
      if (open == src_.size()) {
        emitText(std::move(chunk));
        pos_ = open;
        break;
      }
      const char kind = src_[open + 1];  // '{', '%' or '#'
      size_t body = open + 2;
      const char modifier = body < src_.size() ? src_[body] : '\0';
      if (modifier == '-') {
        chunk = rstripWhitespace(std::move(chunk));
      } else if (kind != '{' && modifier != '+') {
        // lstrip_blocks: only spaces/tabs between the line's start and the tag.
        const size_t newline = chunk.rfind('\n');
        const size_t line_begin = newline == std::string::npos ? 0 : newline + 1;
        if (newline != std::string::npos || line_starting) {
          const std::u32string tail = text::decode(chunk.substr(line_begin));
          if (std::all_of(tail.begin(), tail.end(), text::isSpace)) chunk.resize(line_begin);
        }
      }
      if (modifier == '-' || modifier == '+') ++body;
      emitText(std::move(chunk));
      line_ += countLines(pos_, open);
      pos_ = body;
      if (kind == '#') {
        CLEAVE_RETURN_IF_ERROR(comment(strip_next));
      } else if (kind == '%' && isRaw()) {
        CLEAVE_RETURN_IF_ERROR(raw(strip_next));
      } else {
        CLEAVE_RETURN_IF_ERROR(tag(kind == '{', strip_next));
      }
      line_starting = pos_ > 0 && src_[pos_ - 1] == '\n';
    }
    tokens_.push_back({TokenKind::kEnd, "", 0, 0, line_});
    return std::move(tokens_);
  }

 private:
  absl::Status error(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat("line ", line_, ": ", what));
  }

  size_t findOpen(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return src_.size();
  }

  int countLines(size_t from, size_t to) const {
    int n = 0;
    for (size_t i = from; i < to && i < src_.size(); ++i) n += src_[i] == '\n';
    return n;
  }

  void advanceTo(size_t to) {
    line_ += countLines(pos_, to);
    pos_ = to;
  }

  void emitText(std::string chunk) {
    if (!chunk.empty()) tokens_.push_back({TokenKind::kText, std::move(chunk), 0, 0, line_});
  }

  // After a `%}` or `#}` without '-': trim_blocks drops one newline.
  void trimBlock() {
    if (pos_ < src_.size() && src_[pos_] == '\n') advanceTo(pos_ + 1);
  }

  absl::Status comment(bool& strip_next) {
    const size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) return error("unterminated comment: no '#}'");
    strip_next = end > pos_ && src_[end - 1] == '-';
    advanceTo(end + 2);
    if (!strip_next) trimBlock();
    return absl::OkStatus();
  }

  // At the body of a `{%`: whether it is `raw %}`.
  bool isRaw() const {
    size_t i = pos_;
    while (i < src_.size() && isBlank(src_[i])) ++i;
    if (src_.compare(i, 3, "raw") != 0 || (i + 3 < src_.size() && isNameChar(src_[i + 3]))) {
      return false;
    }
    i += 3;
    while (i < src_.size() && isBlank(src_[i])) ++i;
    if (i < src_.size() && src_[i] == '-') ++i;
    return src_.compare(i, 2, "%}") == 0;
  }

  absl::Status raw(bool& strip_next) {
    size_t close = src_.find("%}", pos_);
    const bool strip_start = src_[close - 1] == '-';
    advanceTo(close + 2);
    if (!strip_start) trimBlock();
    // The first `{% endraw %}` (any whitespace control) ends it.
    for (size_t at = src_.find("{%", pos_); at != std::string::npos; at = src_.find("{%", at + 2)) {
      size_t i = at + 2;
      const bool strip_end = i < src_.size() && src_[i] == '-';
      if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) ++i;
      while (i < src_.size() && isBlank(src_[i])) ++i;
      if (src_.compare(i, 6, "endraw") != 0) continue;
      i += 6;
      while (i < src_.size() && isBlank(src_[i])) ++i;
      strip_next = i < src_.size() && src_[i] == '-';
      if (strip_next) ++i;
      if (src_.compare(i, 2, "%}") != 0) continue;
      std::string body = src_.substr(pos_, at - pos_);
      if (strip_start) body = text::strip(body, std::nullopt, true, false);
      if (strip_end) body = rstripWhitespace(std::move(body));
      emitText(std::move(body));
      advanceTo(i + 2);
      if (!strip_next) trimBlock();
      return absl::OkStatus();
    }
    return error("'raw' block without '{% endraw %}'");
  }

  absl::Status tag(bool print, bool& strip_next) {
    tokens_.push_back({print ? TokenKind::kPrintOpen : TokenKind::kBlockOpen, "", 0, 0, line_});
    const char closer = print ? '}' : '%';
    int depth = 0;  // open brackets: a '}}' inside `{{ {'a': {}} }}` closes a dict
    while (true) {
      while (pos_ < src_.size() && isBlank(src_[pos_])) advanceTo(pos_ + 1);
      if (pos_ >= src_.size()) {
        return error(print ? "unterminated '{{': no '}}'" : "unterminated '{%': no '%}'");
      }
      const char c = src_[pos_];
      const bool closes_here = depth == 0 && src_.compare(pos_, 2, std::string{closer, '}'}) == 0;
      // `-%}` strips what follows; `+%}` keeps the newline trim_blocks would drop.
      const bool closes_marked = depth == 0 && (c == '-' || (c == '+' && !print)) &&
                                 src_.compare(pos_ + 1, 2, std::string{closer, '}'}) == 0;
      if (closes_here || closes_marked) {
        strip_next = closes_marked && c == '-';
        advanceTo(pos_ + (closes_marked ? 3 : 2));
        tokens_.push_back(
            {print ? TokenKind::kPrintClose : TokenKind::kBlockClose, "", 0, 0, line_});
        if (!print && !closes_marked) trimBlock();
        return absl::OkStatus();
      }
      if (isNameStart(c)) {
        size_t end = pos_;
        while (end < src_.size() && isNameChar(src_[end])) ++end;
        tokens_.push_back({TokenKind::kName, src_.substr(pos_, end - pos_), 0, 0, line_});
        pos_ = end;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        // After a '.', digits are an index (`x.0.1`), never a float.
        const bool index = !tokens_.empty() && tokens_.back().kind == TokenKind::kOperator &&
                           tokens_.back().text == ".";
        CLEAVE_RETURN_IF_ERROR(number(index));
      } else if (c == '\'' || c == '"') {
        CLEAVE_RETURN_IF_ERROR(string());
      } else {
        static const char* kOperators[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                           "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                           "]",  "{",  "}",  ",",  ".",  ":",  "|"};
        const char* found = nullptr;
        for (const char* op : kOperators) {
          if (src_.compare(pos_, std::char_traits<char>::length(op), op) == 0) {
            found = op;
            break;
          }
        }
        if (found == nullptr)
          return error(absl::StrCat("unexpected character '", std::string(1, c), "'"));
        const std::string op = found;
        if (op == "(" || op == "[" || op == "{") ++depth;
        if ((op == ")" || op == "]" || op == "}") && depth > 0) --depth;
        tokens_.push_back({TokenKind::kOperator, op, 0, 0, line_});
        pos_ += op.size();
      }
    }
  }

  // `index`: digits after a '.', an integer however they go on (`x.0.1`).
  absl::Status number(bool index) {
    size_t end = pos_;
    bool is_float = false;
    const auto digits = [&] {
      while (end < src_.size() &&
             (std::isdigit(static_cast<unsigned char>(src_[end])) || src_[end] == '_')) {
        ++end;
      }
    };
    digits();
    if (!index && end + 1 < src_.size() && src_[end] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[end + 1]))) {
      is_float = true;
      ++end;
      digits();
    }
    if (!index && end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
      size_t e = end + 1;
      if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
      if (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) {
        is_float = true;
        end = e;
        digits();
      }
    }
    std::string literal;
    for (size_t i = pos_; i < end; ++i) {
      if (src_[i] != '_') literal += src_[i];
    }
    Token t{is_float ? TokenKind::kFloat : TokenKind::kInteger, literal, 0, 0, line_};
    if (is_float) {
      t.number = std::strtod(literal.c_str(), nullptr);
    } else {
      errno = 0;
      t.integer = std::strtoll(literal.c_str(), nullptr, 10);
      if (errno == ERANGE) return error(absl::StrCat("integer ", literal, " is too large"));
    }
    tokens_.push_back(std::move(t));
    pos_ = end;
    return absl::OkStatus();
  }

  absl::Status string() {
    const char quote = src_[pos_];
    const int start_line = line_;
    std::string value;
    size_t i = pos_ + 1;
    while (i < src_.size() && src_[i] != quote) {
      char c = src_[i];
      if (c == '\\' && i + 1 < src_.size()) {
        const char e = src_[++i];
        switch (e) {
          case 'n': value += '\n'; break;
          case 't': value += '\t'; break;
          case 'r': value += '\r'; break;
          case 'b': value += '\b'; break;
          case 'f': value += '\f'; break;
          case 'v': value += '\v'; break;
          case 'a': value += '\a'; break;
          case '\\': value += '\\'; break;
          case '\'': value += '\''; break;
          case '"': value += '"'; break;
          case '\n': break;  // a line continuation
          case '0':
          case '1':
          case '2':
          case '3':
          case '4':
          case '5':
          case '6':
          case '7': {
            // Up to three octal digits.
            int code = e - '0';
            for (int k = 0;
                 k < 2 && i + 1 < src_.size() && src_[i + 1] >= '0' && src_[i + 1] <= '7'; ++k) {
              code = code * 8 + (src_[++i] - '0');
            }
            value += text::encode(std::u32string(1, static_cast<char32_t>(code)));
            break;
          }
          case 'u':
          case 'U':
          case 'x': {
            const size_t n = e == 'u' ? 4 : e == 'U' ? 8 : 2;
            if (i + n >= src_.size()) return error("truncated escape in a string");
            const std::string hex = src_.substr(i + 1, n);
            if (!std::all_of(hex.begin(), hex.end(),
                             [](char h) { return std::isxdigit(static_cast<unsigned char>(h)); })) {
              return error(absl::StrCat("bad escape '\\", std::string(1, e), hex, "'"));
            }
            char* end = nullptr;
            const long code = std::strtol(hex.c_str(), &end, 16);
            if (end != hex.c_str() + n)
              return error(absl::StrCat("bad escape '\\", std::string(1, e), hex, "'"));
            value += text::encode(std::u32string(1, static_cast<char32_t>(code)));
            i += n;
            break;
          }
          default: value += '\\'; value += e;
        }
        ++i;
        continue;
      }
      value += c;
      ++i;
    }
    if (i >= src_.size()) {
      line_ = start_line;
      return error("unterminated string literal");
    }
    tokens_.push_back({TokenKind::kString, std::move(value), 0, 0, start_line});
    advanceTo(i + 1);
    return absl::OkStatus();
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

absl::StatusOr<std::vector<Token>> tokenize(const std::string& source) {
  // As Jinja: "\r\n" and "\r" read as "\n", and one trailing line end is dropped.
  std::string normalized;
  normalized.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      normalized += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      normalized += source[i];
    }
  }
  if (!normalized.empty() && normalized.back() == '\n') normalized.pop_back();
  return Lexer(std::move(normalized)).run();
}

}  // namespace cleave::jinja
