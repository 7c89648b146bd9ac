// Tokens to a template's statements (ast.h). Supports what chat templates use: if / elif /
// else, for (tuple targets, an `if` filter, else, loop.*, break, continue), set (names,
// tuples, namespace attributes, blocks), macro, `generation` blocks (their body only), and
// the full expression grammar with Jinja's precedence. Other tags (include, extends, block,
// call, filter, with) are errors naming the tag.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/jinja/ast.h"

namespace cleave::jinja {

// Errors name the line and what was expected.
absl::StatusOr<Body> parse(const std::string& source);

}  // namespace cleave::jinja
