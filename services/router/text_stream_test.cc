// The text a client sees of a sequence's tokens (GPT-2's byte-level BPE from the goldens):
// stop strings across tokens, what is held back and flushed at an end, stop tokens.
#include "services/router/text_stream.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

namespace cleave::router {
namespace {

class TextStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto loaded = tokenizer::Tokenizer::load(std::string(CLEAVE_GOLDEN_DIR) +
                                             "/tokenizers/gpt2_bpe/tokenizer.json");
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    tokenizer_ = std::move(*loaded);
  }
  std::vector<uint32_t> ids(const std::string& text) {
    return tokenizer_->encode(text, {.add_special_tokens = false});
  }
  static v1::StoppingCriteria stop(const std::string& s, bool include = false) {
    v1::StoppingCriteria c;
    c.add_stop(s);
    c.set_include_stop_str_in_output(include);
    return c;
  }
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
};

// A stop string over several tokens, none of which ends the sequence on its worker (it
// began before the sequence moved there): the text stops before it, the stream reports it,
// and nothing after it comes out.
TEST_F(TextStreamTest, AStopStringAcrossTokensEndsTheText) {
  const std::vector<uint32_t> tokens = ids("Sure, here it is.\n\nUser: and then more text");
  for (const bool include : {false, true}) {
    TextStream text(tokenizer_.get(), stop("\n\nUser:", include), true);
    std::string out;
    size_t stopped_at = tokens.size();
    for (size_t i = 0; i < tokens.size(); ++i) {
      out += text.push(tokens[i], std::nullopt);
      if (text.stoppedByString() && stopped_at == tokens.size()) stopped_at = i;
    }
    EXPECT_EQ(out, include ? "Sure, here it is.\n\nUser:" : "Sure, here it is.");
    EXPECT_TRUE(text.stoppedByString());
    EXPECT_EQ(text.matched(), "\n\nUser:");
    EXPECT_LT(stopped_at, tokens.size() - 1);  // Before the last token.
    EXPECT_EQ(text.end(), "");
  }
}

// Text that might begin a stop string is held back; an end without a token (its worker lost
// after the last one) gives it out, as a last token would have.
TEST_F(TextStreamTest, HeldBackTextComesOutAtAnEnd) {
  const std::vector<uint32_t> tokens = ids("The answer is 42\n\nUs");
  TextStream text(tokenizer_.get(), stop("\n\nUser:"), true);
  std::string out;
  for (uint32_t t : tokens) out += text.push(t, std::nullopt);
  EXPECT_EQ(out, "The answer is 42");  // "\n\nUs" may still become the stop string.
  EXPECT_FALSE(text.stoppedByString());
  out += text.end();
  EXPECT_EQ(out, "The answer is 42\n\nUs");
  EXPECT_EQ(text.push(tokens[0], std::nullopt), "");  // Over.
}

// A stop token's own text is not returned; any other last token's is, with what was held.
TEST_F(TextStreamTest, AStopTokensTextIsLeftOut) {
  const std::vector<uint32_t> tokens = ids("One two three");
  TextStream stopped(tokenizer_.get(), v1::StoppingCriteria(), true);
  std::string out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const bool last = i + 1 == tokens.size();
    out +=
        stopped.push(tokens[i], last ? std::optional(v1::FINISH_REASON_STOP_TOKEN) : std::nullopt);
  }
  EXPECT_EQ(out, tokenizer_->decode({tokens.data(), tokens.size() - 1}, true));
  EXPECT_NE(out, "One two three");
  EXPECT_FALSE(stopped.stoppedByString());
  TextStream length(tokenizer_.get(), v1::StoppingCriteria(), true);
  out.clear();
  for (size_t i = 0; i < tokens.size(); ++i) {
    const bool last = i + 1 == tokens.size();
    out += length.push(tokens[i], last ? std::optional(v1::FINISH_REASON_LENGTH) : std::nullopt);
  }
  EXPECT_EQ(out, "One two three");
  TextStream none(nullptr, stop("x"), true);
  EXPECT_EQ(none.push(tokens[0], std::nullopt), "");
}

}  // namespace
}  // namespace cleave::router
