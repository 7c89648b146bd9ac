#define PCRE2_CODE_UNIT_WIDTH 8
#include "common/tokenizer/regex.h"

#include <pcre2.h>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/utf8.h"

namespace cleave::tokenizer {
namespace {

constexpr size_t kJitStackStart = 32 * 1024;
constexpr size_t kJitStackMax = 1024 * 1024;

// Per-thread scratch: match data for the whole-match offsets and a JIT stack.
struct MatchScratch {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;

  MatchScratch() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(kJitStackStart, kJitStackMax, nullptr);
    if (context != nullptr && jit_stack != nullptr) {
      pcre2_jit_stack_assign(context, nullptr, jit_stack);
    }
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
  MatchScratch(const MatchScratch&) = delete;
  MatchScratch& operator=(const MatchScratch&) = delete;
};

MatchScratch& scratch() {
  thread_local MatchScratch s;
  return s;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Regex>> Regex::compile(absl::string_view pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return absl::InvalidArgumentError(absl::StrCat("invalid regex at offset ", offset, ": ",
                                                   reinterpret_cast<const char*>(message)));
  }
  // Without JIT (unsupported platform) matching falls back to the interpreter.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  auto regex = std::unique_ptr<Regex>(new Regex());
  regex->pattern_ = std::string(pattern);
  regex->code_ = code;
  return regex;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

bool Regex::forEachMatch(absl::string_view text,
                         absl::FunctionRef<void(size_t, size_t)> on_match) const {
  auto* code = static_cast<pcre2_code*>(code_);
  MatchScratch& s = scratch();
  if (s.data == nullptr) return false;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  size_t last_end = static_cast<size_t>(-1);
  while (pos <= text.size()) {
    int rc = pcre2_match(code, subject, text.size(), pos, 0, s.data, s.context);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      rc = pcre2_match(code, subject, text.size(), pos, PCRE2_NO_JIT, s.data, s.context);
    }
    if (rc == PCRE2_ERROR_NOMATCH) return true;
    if (rc < 0) return false;
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(s.data);
    const size_t start = ovector[0];
    const size_t end = ovector[1];
    if (start > end || end > text.size()) return false;  // \K tricks; not used by tokenizers.
    if (start == end && end == last_end) {
      if (pos >= text.size()) return true;
      pos += utf8UnitLength(text, pos);
      continue;
    }
    on_match(start, end);
    last_end = end;
    pos = end;
  }
  return true;
}

}  // namespace cleave::tokenizer
