// A parsed Jinja2 template, rendered as Hugging Face renders chat templates (its sandbox
// settings: trim_blocks, lstrip_blocks, loop controls, no autoescape, read-only data; see
// lexer.h, parser.h and builtins.h for what is supported).
//
// Rendering is bounded: a template that would write more than `max_output_bytes`, take
// more than `max_steps` evaluation steps or nest macro calls deeper than `max_call_depth`
// fails with an error saying so, so a bad model file cannot hang or exhaust a server; so
// does one that builds lists nested deeper than `max_value_depth` or runs past `max_time`.
//
// Threading: immutable after parse; render may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/jinja/ast.h"
#include "common/jinja/value.h"

namespace cleave::jinja {

struct RenderLimits {
  size_t max_output_bytes = size_t{16} << 20;  // also the largest str or list built
  int64_t max_steps = 20'000'000;
  int max_call_depth = 16;
  int max_value_depth = 64;  // nesting of the lists and dicts a template builds
  std::chrono::milliseconds max_time{10'000};
};

class Template {
 public:
  // Errors name the line ("line 3: expected '%}', found 'x'").
  static absl::StatusOr<Template> parse(const std::string& source);

  // `context` holds the template's variables (they hide the globals of builtins.h). A
  // raise_exception() in the template fails with its message after builtins.h's
  // kRaisedPrefix; other errors name the line.
  absl::StatusOr<std::string> render(const Dict& context, const RenderLimits& limits = {}) const;

 private:
  explicit Template(std::shared_ptr<const Body> body) : body_(std::move(body)) {}
  std::shared_ptr<const Body> body_;
};

}  // namespace cleave::jinja
