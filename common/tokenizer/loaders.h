// Internal entry points of the tokenizer loaders (tokenizer.json, tokenizer_config.json,
// GGUF). Tokenizer's static factories dispatch here.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/tokenizer.h"

namespace cleave::tokenizer {

// What tokenizer_config.json adds to a tokenizer.json: the BOS/EOS token texts and whether
// encode(add_special_tokens) adds them.
struct TokenizerConfig {
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  std::optional<bool> add_bos_token;
  std::optional<bool> add_eos_token;
};

absl::StatusOr<TokenizerConfig> parseTokenizerConfig(absl::string_view json,
                                                     const std::string& name);

absl::StatusOr<std::unique_ptr<Tokenizer>> buildFromTokenizerJson(absl::string_view json,
                                                                  const std::string& name,
                                                                  const TokenizerConfig* config);

// Reads a whole file (at most `max_bytes`); errors name the path.
absl::StatusOr<std::string> readFileLimited(const std::string& path, size_t max_bytes);

}  // namespace cleave::tokenizer
