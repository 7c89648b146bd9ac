// tokenizer.json sections other than the model: normalizer, pre_tokenizer, decoder and
// post_processor. Each parser reports unsupported types by name and field path.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "common/tokenizer/decoder.h"
#include "common/tokenizer/json_reader.h"
#include "common/tokenizer/normalizer.h"
#include "common/tokenizer/pre_tokenizer.h"

namespace cleave::tokenizer {

// Sequences nest at most this deep, and a pipeline has at most this many steps (the files
// are untrusted input; pre-tokenizer steps run recursively).
inline constexpr int kMaxJsonNesting = 8;
inline constexpr size_t kMaxPipelineSteps = 64;

absl::Status parseNormalizer(const JsonReader& reader, const Json* node, const std::string& path,
                             int depth, Normalizer* out);

// `*byte_level` is set when a ByteLevel step is present (it must be the last step: the model
// then works on raw bytes).
absl::Status parsePreTokenizer(const JsonReader& reader, const Json* node, const std::string& path,
                               int depth, PreTokenizer* out, bool* byte_level);

absl::Status parseDecoder(const JsonReader& reader, const Json* node, const std::string& path,
                          int depth, Decoder* out);

// The ids the post-processor puts before and after a single sequence. `find` maps a token's
// text to its id.
using TokenLookup = absl::FunctionRef<std::optional<TokenId>(const std::string&)>;
absl::Status parsePostProcessor(const JsonReader& reader, const Json* node, const std::string& path,
                                int depth, TokenLookup find, std::vector<TokenId>* prefix,
                                std::vector<TokenId>* suffix);

}  // namespace cleave::tokenizer
