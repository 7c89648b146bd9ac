#include "services/router/reasoning_splitter.h"

#include <span>

#include "gtest/gtest.h"

namespace cleave::router {
namespace {

struct Split {
  std::string reasoning;
  std::string content;
};

// The reply fed in pieces of `step` bytes (0: whole).
Split run(ReasoningFormat format, const std::string& reply, size_t step) {
  ReasoningSplitter splitter(format);
  Split out;
  auto add = [&](const ReasoningSplitter::Parts& parts) {
    out.reasoning += parts.reasoning;
    out.content += parts.content;
  };
  if (step == 0) step = reply.size() + 1;
  for (size_t at = 0; at < reply.size(); at += step) add(splitter.push(reply.substr(at, step)));
  add(splitter.finish());
  return out;
}

struct Case {
  ReasoningFormat format;
  std::string reply;
  std::string reasoning;
  std::string content;
};

// Every case whole and fed in pieces of several sizes.
void checkAll(std::span<const Case> cases) {
  for (const Case& c : cases) {
    for (size_t step : {0, 1, 2, 3, 5, 7}) {
      const Split got = run(c.format, c.reply, step);
      EXPECT_EQ(got.reasoning, c.reasoning) << c.reply << " step " << step;
      EXPECT_EQ(got.content, c.content) << c.reply << " step " << step;
    }
  }
}

TEST(ReasoningSplitterTest, SplitsAtTheTagsHoweverTheReplyArrives) {
  using F = ReasoningFormat;
  const Case cases[] = {
      {F::kQwen3, "<think>\nWhy? Because.\n</think>\n\nThe answer.", "\nWhy? Because.\n",
       "\n\nThe answer."},
      // The template opened the block (QwQ, Qwen3-Thinking): no tag in the reply.
      {F::kQwen3, "Let me see.\n</think>\n\nThe answer.", "Let me see.\n", "\n\nThe answer."},
      {F::kQwen3, "\n <think>x</think>y", "x", "y"},
      {F::kQwen3, "Never closed, all reasoning.", "Never closed, all reasoning.", ""},
      {F::kQwen3, "<thin>k not a tag", "<thin>k not a tag", ""},
      {F::kQwen3, "<", "<", ""},
      {F::kQwen3, "<think>never closed </thi", "never closed </thi", ""},
      {F::kDeepSeekR1, "Let me see.</think>42", "Let me see.", "42"},
      {F::kDeepSeekR1, "<think>Let me see.</think>42", "Let me see.", "42"},
      {F::kDeepSeekR1, "Still thinking when it stopped", "Still thinking when it stopped", ""},
      {F::kDeepSeekR1, "a < b </think>c </think>", "a < b ", "c </think>"},
      {F::kNone, "<think>x</think>y", "", "<think>x</think>y"},
      // GLM-4.5 reasons only in a block it opens; a reply that opens none is content.
      {F::kGlm45, "<think>Let me see.</think>\n42", "Let me see.", "\n42"},
      {F::kGlm45, "\n42, no thinking", "", "\n42, no thinking"},
      {F::kGlm45, "<think>cut off", "cut off", ""},
      {F::kGlm45, "<thin", "", "<thin"},
  };
  checkAll(cases);
}

// gpt-oss's harmony replies (after the prompt's <|start|>assistant), as the model writes them
// with its special tokens kept: analysis bodies are reasoning, final bodies and commentary
// preambles content, a call to a function passed on for the openai tool-call parser.
TEST(ReasoningSplitterTest, SplitsGptOssHarmonyChannels) {
  using F = ReasoningFormat;
  const std::string call = "<|channel|>commentary to=functions.get_weather<|message|>";
  const Case cases[] = {
      {F::kGptOss,
       "<|channel|>analysis<|message|>User asks 2+2. Simple.<|end|><|start|>assistant"
       "<|channel|>final<|message|>2 + 2 = 4.",
       "User asks 2+2. Simple.", "2 + 2 = 4."},
      // A tool call (its <|call|> is a stop token: the reply ends without it), with a
      // preamble, the recipient before <|constrain|>.
      {F::kGptOss,
       "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>"
       "commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>commentary "
       "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}",
       "Need weather.", "Checking." + call + "{\"city\": \"Paris\"}<|call|>"},
      // The recipient in the role part, and the call closed in the text.
      {F::kGptOss,
       "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{}"
       "<|call|>",
       "", call + "{}<|call|>"},
      // Reasoning only (cut off), text that opens no message, a header cut off.
      {F::kGptOss, "<|channel|>analysis<|message|>Hmm, a < b and <|", "Hmm, a < b and <|", ""},
      {F::kGptOss, "Plain text.", "", "Plain text."},
      {F::kGptOss, "<|channel|>fin", "", ""},
      {F::kGptOss, "<|channel|>final<|message|>Done.<|return|>", "", "Done."},
  };
  checkAll(cases);
}

TEST(ReasoningSplitterTest, HoldsBackOnlyWhatMayBeATag) {
  ReasoningSplitter splitter(ReasoningFormat::kDeepSeekR1);
  ReasoningSplitter::Parts parts = splitter.push("step one </th");
  EXPECT_EQ(parts.reasoning, "step one ");
  parts = splitter.push("ink>done");
  EXPECT_EQ(parts.reasoning, "");
  EXPECT_EQ(parts.content, "done");
}

TEST(ReasoningSplitterTest, NamesItsFormats) {
  EXPECT_EQ(*reasoningFormat("qwen3"), ReasoningFormat::kQwen3);
  EXPECT_EQ(*reasoningFormat("deepseek_r1"), ReasoningFormat::kDeepSeekR1);
  EXPECT_EQ(*reasoningFormat("openai_gptoss"), ReasoningFormat::kGptOss);
  EXPECT_EQ(*reasoningFormat("glm45"), ReasoningFormat::kGlm45);
  EXPECT_EQ(*reasoningFormat(""), ReasoningFormat::kNone);
  EXPECT_FALSE(reasoningFormat("hermes").ok());
}

}  // namespace
}  // namespace cleave::router
