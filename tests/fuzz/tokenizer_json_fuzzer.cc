// libFuzzer target: loading a tokenizer.json, then encoding and decoding with whatever
// loaded, including the streaming detokenizer.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cleave::tokenizer;
  absl::string_view text(reinterpret_cast<const char*>(data), size);
  auto tokenizer = Tokenizer::fromTokenizerJsonText(text, "fuzz/tokenizer.json");
  if (!tokenizer.ok()) return 0;
  // Part of the input doubles as text to encode.
  absl::string_view sample = text.substr(0, std::min<size_t>(size, 256));
  for (bool special : {false, true}) {
    std::vector<TokenId> ids =
        (*tokenizer)->encode(sample, {.add_special_tokens = special, .parse_special = special});
    (void)(*tokenizer)->decode(ids, special);
    IncrementalDetokenizer stream(**tokenizer, special);
    for (TokenId id : ids) (void)stream.push(id);
    (void)stream.finish();
  }
  return 0;
}
