// Template source to tokens, with the whitespace rules of the environment chat templates
// are written for (Hugging Face's: trim_blocks and lstrip_blocks on, one trailing newline
// dropped, line ends read as "\n"):
//   * `{%- ` / `{{-` / `{#-` strip all whitespace before the tag, ` -%}` / `-}}` / `-#}`
//     all whitespace after it;
//   * trim_blocks: the newline right after a `%}` or `#}` is dropped;
//   * lstrip_blocks: spaces and tabs between a line's start and a `{%` or `{#` are dropped
//     (`{%+` keeps them);
//   * `{% raw %}...{% endraw %}` is text.
// Comments produce no token.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace cleave::jinja {

enum class TokenKind {
  kText,        // literal output
  kPrintOpen,   // {{
  kPrintClose,  // }}
  kBlockOpen,   // {%
  kBlockClose,  // %}
  kName,
  kString,  // text: the decoded value
  kInteger,
  kFloat,
  kOperator,  // text: + - * / // % ** ~ == != < <= > >= = ( ) [ ] { } , . : |
  kEnd,
};

struct Token {
  TokenKind kind;
  std::string text;
  int64_t integer = 0;
  double number = 0;
  int line = 1;
};

// Errors (an unterminated tag, comment or string, a character that starts no token) name
// the line.
absl::StatusOr<std::vector<Token>> tokenize(const std::string& source);

}  // namespace cleave::jinja
