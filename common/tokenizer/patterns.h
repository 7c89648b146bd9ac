// Pre-tokenizer regex patterns used by name (Hugging Face's ByteLevel default and the sets
// llama.cpp selects with tokenizer.ggml.pre).
#pragma once

namespace cleave::tokenizer::patterns {

// GPT-2, as Hugging Face's ByteLevel pre-tokenizer uses it (with the trailing \s+).
inline constexpr const char* kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// GPT-2 as llama.cpp writes it (without the trailing \s+; whitespace before a non-space
// that \s+(?!\S) leaves over stays unmatched and becomes a piece of its own).
inline constexpr const char* kGpt2LlamaCpp =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";

inline constexpr const char* kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

inline constexpr const char* kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

inline constexpr const char* kDigit = R"(\p{N})";
inline constexpr const char* kDigits = R"(\p{N}+)";

// llama.cpp's "default" set, applied one after another.
inline constexpr const char* kDefaultPunctuation = R"([\p{P}\$\+<=>\^~\|]+)";
inline constexpr const char* kThreeAsciiDigits = R"([0-9][0-9][0-9])";

}  // namespace cleave::tokenizer::patterns
