// Small hand-made tokenizer.json documents for the unit tests. The expected ids in the tests
// were produced by the Hugging Face tokenizers library (0.23) from these same documents.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_format.h"
#include "common/tokenizer/byte_level.h"

namespace cleave::tokenizer::testing {

inline nlohmann::json addedToken(int id, const std::string& content, bool special,
                                 bool strip = false) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", strip},
          {"rstrip", strip}, {"normalized", false}, {"special", special}};
}

inline nlohmann::json bosTemplate(const std::string& bos, int id) {
  return {{"type", "TemplateProcessing"},
          {"single",
           {{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
            {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
          {"pair", nlohmann::json::array()},
          {"special_tokens", {{bos, {{"id", bos}, {"ids", {id}}, {"tokens", {bos}}}}}}};
}

// GPT-2-style: ids 0-255 are the bytes (as their byte-level characters), 256-263 merges,
// 264 <|eot|> (special), 265 <tool> (not special, strips whitespace on both sides),
// 266 <|bos|> (special, prepended by the template).
inline nlohmann::json tinyByteLevel() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byteLevelEncode(std::string(1, static_cast<char>(b)))] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {"i", "n"},
      {"Ġ", "c"}, {"a", "t"}, {"Ġc", "at"}, {"Ġ", "in"}};
  nlohmann::json merge_list = nlohmann::json::array();
  for (const auto& [a, b] : merges) {
    vocab[a + b] = static_cast<int>(vocab.size());
    merge_list.push_back(a + " " + b);
  }
  return {
      {"version", "1.0"},
      {"added_tokens",
       {addedToken(264, "<|eot|>", true), addedToken(265, "<tool>", false, true),
        addedToken(266, "<|bos|>", true)}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", bosTemplate("<|bos|>", 266)},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"unk_token", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", merge_list}}}};
}

// Llama-2-style: <unk> <s> </s>, <0x00>..<0xFF> at 3-258, then pieces; normalizer
// Prepend("▁") + Replace(" ", "▁"), no pre-tokenizer, byte fallback, fused unknowns.
inline nlohmann::json tinySpm() {
  nlohmann::json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b)
    vocab[absl::StrFormat("<0x%02X>", b)] = static_cast<int>(vocab.size());
  for (const char* p : {"▁", "h", "e", "l", "o", "w", "r", "d", "▁h", "▁he", "ll", "llo", "▁hello",
                        "▁w", "or", "▁wor", "ld", "▁world", "▁▁"}) {
    vocab[p] = static_cast<int>(vocab.size());
  }
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& [a, b] : std::vector<std::pair<std::string, std::string>>{{"▁", "h"},
                                                                             {"▁h", "e"},
                                                                             {"l", "l"},
                                                                             {"ll", "o"},
                                                                             {"▁he", "llo"},
                                                                             {"▁", "w"},
                                                                             {"o", "r"},
                                                                             {"▁w", "or"},
                                                                             {"l", "d"},
                                                                             {"▁wor", "ld"},
                                                                             {"▁", "▁"}}) {
    merges.push_back({a, b});
  }
  return {{"version", "1.0"},
          {"added_tokens",
           {addedToken(0, "<unk>", true), addedToken(1, "<s>", true), addedToken(2, "</s>", true)}},
          {"normalizer",
           {{"type", "Sequence"},
            {"normalizers",
             {{{"type", "Prepend"}, {"prepend", "▁"}},
              {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}}}}}},
          {"pre_tokenizer", nullptr},
          {"post_processor", bosTemplate("<s>", 1)},
          {"decoder",
           {{"type", "Sequence"},
            {"decoders",
             {{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
              {{"type", "ByteFallback"}},
              {{"type", "Fuse"}},
              {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
          {"model",
           {{"type", "BPE"},
            {"unk_token", "<unk>"},
            {"fuse_unk", true},
            {"byte_fallback", true},
            {"ignore_merges", false},
            {"vocab", vocab},
            {"merges", merges}}}};
}

}  // namespace cleave::tokenizer::testing
