// Chat templates against Hugging Face's own Jinja environment (goldens from
// tests/golden/gen_chat_templates.py: whole templates in the styles of the model families
// Cleave serves, SmolLM2's real one, and a case per feature and error), plus loading from
// model files and the bounds that keep a bad template from hanging a server.
#include "common/tokenizer/chat_template.h"

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/jinja/template.h"

namespace cleave::tokenizer {
namespace {

using OrderedJson = nlohmann::ordered_json;

const std::string kGolden = std::string(CLEAVE_GOLDEN_DIR) + "/chat_templates/golden.json";
const std::string kSmolLm2 = std::string(CLEAVE_MODEL_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";

OrderedJson readGolden() {
  std::ifstream in(kGolden);
  EXPECT_TRUE(in.good()) << kGolden;
  return OrderedJson::parse(in);
}

TEST(ChatTemplateGoldenTest, RendersAsHuggingFaceDoes) {
  const OrderedJson golden = readGolden();
  ASSERT_GE(golden["cases"].size(), 60u);
  int rendered = 0, refused = 0;
  for (const auto& c : golden["cases"]) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    auto t = ChatTemplate::fromSource(c["template"], "", "");
    const std::string context = c["context"].dump();
    if (!c.contains("error")) {
      if (!t.ok()) {
        ADD_FAILURE() << t.status();
        continue;
      }
      auto out = t->renderContext(context);
      if (!out.ok()) {
        ADD_FAILURE() << out.status();
        continue;
      }
      EXPECT_EQ(*out, c["expected"].get<std::string>());
      ++rendered;
      continue;
    }
    const std::string kind = c["error"];
    ++refused;
    if (kind == "syntax") {
      EXPECT_FALSE(t.ok()) << "parsed a template Jinja refuses";
      if (!t.ok()) EXPECT_TRUE(absl::StrContains(t.status().message(), "line ")) << t.status();
      continue;
    }
    if (!t.ok()) {
      ADD_FAILURE() << t.status();
      continue;
    }
    auto out = t->renderContext(context);
    if (out.ok()) {
      ADD_FAILURE() << "rendered where Jinja fails: " << *out;
      continue;
    }
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << out.status();
    if (absl::StartsWith(kind, "raised: ")) {
      EXPECT_EQ(out.status().message(),
                absl::StrCat("the chat template refused the conversation: ", kind.substr(8)));
    } else if (kind == "undefined") {
      EXPECT_TRUE(absl::StrContains(out.status().message(), "undefined")) << out.status();
    }
  }
  EXPECT_GT(rendered, 50);
  EXPECT_GT(refused, 5);
}

TEST(ChatTemplateTest, SmolLm2FileCarriesItsTemplate) {
  auto tokenizer = Tokenizer::load(kSmolLm2);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  auto t = ChatTemplate::load(kSmolLm2, **tokenizer);
  ASSERT_TRUE(t.ok()) << t.status();
  ChatInput input;
  input.messages = {{"user", "Name three rivers in Europe.", ""}};
  auto out = t->render(input);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nName three rivers in Europe.<|im_end|>\n"
            "<|im_start|>assistant\n");
  input.add_generation_prompt = false;
  input.messages.insert(input.messages.begin(), {"system", "Be brief.", ""});
  out = t->render(input);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nName three rivers in "
            "Europe.<|im_end|>\n");
}

TEST(ChatTemplateTest, RenderPassesFieldsToolsAndKeywordArguments) {
  auto t = ChatTemplate::fromSource(
      "{{ bos_token }}{% for m in messages %}[{{ m.role }}|{{ m.content }}"
      "{% if m.tool_calls is defined %}|{{ m.tool_calls | tojson }}{% endif %}"
      "{% if m.name is defined %}|named{% endif %}]{% endfor %}"
      "{% if tools is not none %}{{ tools | map(attribute='name') | join(',') }}{% endif %}"
      "{% if enable_thinking is defined and enable_thinking is false %}<no-think>{% endif %}"
      "{% if add_generation_prompt %}>{% endif %}{{ eos_token }}",
      "<s>", "</s>");
  ASSERT_TRUE(t.ok()) << t.status();
  ChatInput input;
  input.messages = {
      {"user", "hi", R"({"name": null})"},
      {"assistant", "", R"({"tool_calls": [{"name": "f", "arguments": {"x": 1.5}}]})"}};
  input.tools_json = R"([{"name": "f"}, {"name": "g"}])";
  input.kwargs_json = R"({"enable_thinking": false})";
  auto out = t->render(input);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out,
            "<s>[user|hi][assistant||[{\"name\": \"f\", \"arguments\": {\"x\": 1.5}}]]f,g"
            "<no-think>></s>");
}

TEST(ChatTemplateTest, ContinuingTheFinalMessageEndsThePromptInsideIt) {
  auto t = ChatTemplate::fromSource(
      "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</{{ m.role }}>\n{% endfor %}"
      "{% if add_generation_prompt %}<assistant>{% endif %}",
      "", "");
  ASSERT_TRUE(t.ok()) << t.status();
  ChatInput input;
  input.messages = {{"user", "Count to three.", ""}, {"assistant", "One, two,", ""}};
  input.continue_final_message = true;
  auto out = t->render(input);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "<user>Count to three.</user>\n<assistant>One, two,");
  // A template that drops the content cannot be continued.
  auto silent =
      ChatTemplate::fromSource("{% for m in messages %}<{{ m.role }}>{% endfor %}", "", "");
  ASSERT_TRUE(silent.ok());
  EXPECT_TRUE(
      absl::StrContains(silent->render(input).status().message(), "continue_final_message"));
  // Empty content continues at the turn's start; a content list at its last text part.
  input.messages.back().content = "";
  out = t->render(input);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "<user>Count to three.</user>\n<assistant>");
  auto parts = ChatTemplate::fromSource(
      "{% for m in messages %}<{{ m.role }}>{% for p in m.content %}{{ p.text }}|{% endfor %}"
      "{% endfor %}",
      "", "");
  ASSERT_TRUE(parts.ok());
  input.messages = {{"assistant", "", R"({"content": [{"type": "text", "text": "One,"},
                                                   {"type": "image"}]})"}};
  out = parts->render(input);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "<assistant>One,");
  input.messages = {{"assistant", "", R"({"content": [{"type": "image"}]})"}};
  EXPECT_TRUE(absl::StrContains(parts->render(input).status().message(), "no text content"));
}

TEST(ChatTemplateTest, ReasoningIsGivenUnderEveryName) {
  auto t = ChatTemplate::fromSource("{% for m in messages %}{{ m | tojson }}{% endfor %}", "", "");
  ASSERT_TRUE(t.ok());
  ChatInput input;
  input.messages = {{"assistant", "4", R"({"reasoning": "2+2"})"}};
  auto out = t->render(input);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(
      *out,
      R"({"thinking": "2+2", "role": "assistant", "content": "4", "reasoning": "2+2", "reasoning_content": "2+2"})");
}

TEST(ChatTemplateTest, BadRequestFieldsNameTheField) {
  auto t = ChatTemplate::fromSource("{{ messages | length }}", "", "");
  ASSERT_TRUE(t.ok());
  ChatInput input;
  input.messages = {{"user", "a", ""}, {"user", "b", "[1]"}};
  auto out = t->render(input);
  ASSERT_FALSE(out.ok());
  EXPECT_TRUE(absl::StrContains(out.status().message(), "messages[1].fields_json")) << out.status();
  input.messages[1].fields_json = "{bad";
  EXPECT_TRUE(absl::StrContains(t->render(input).status().message(), "messages[1].fields_json"));
  input.messages[1].fields_json = "";
  input.tools_json = "{}";
  EXPECT_TRUE(absl::StrContains(t->render(input).status().message(), "tools_json"));
  input.tools_json = "";
  input.kwargs_json = R"({"messages": []})";
  EXPECT_TRUE(absl::StrContains(t->render(input).status().message(), "template_kwargs_json"));
}

TEST(ChatTemplateTest, BoundsStopRunawayTemplates) {
  // 10^10 iterations, unbounded recursion, a doubling string and deep nesting.
  for (const char* source :
       {"{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(64) %}"
        "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}"}) {
    SCOPED_TRACE(source);
    auto t = jinja::Template::parse(source);
    ASSERT_TRUE(t.ok()) << t.status();
    auto out =
        t->render({}, {.max_output_bytes = 1 << 20, .max_steps = 1'000'000, .max_call_depth = 32});
    ASSERT_FALSE(out.ok());
    EXPECT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted) << out.status();
  }
  // Deep nesting, in brackets or in a long flat chain, is refused when parsed.
  std::string chain = "{{ 0";
  for (int i = 0; i < 300000; ++i) chain += "+0";
  for (const std::string& source :
       {"{{ " + std::string(1000, '(') + "1" + std::string(1000, ')') + " }}", chain + " }}"}) {
    auto t = jinja::Template::parse(source);
    ASSERT_FALSE(t.ok());
    EXPECT_TRUE(absl::StrContains(t.status().message(), "nested too deeply")) << t.status();
  }
  std::string filters = "{{ 'a'";
  for (int i = 0; i < 1000; ++i) filters += "|trim";
  EXPECT_FALSE(jinja::Template::parse(filters + " }}").ok());
  // Nesting built at run time, a clock limit, and integer edges that would be undefined.
  const std::pair<const char*, absl::StatusCode> runs[] = {
      {"{% set ns = namespace(a=[]) %}{% for i in range(1000) %}{% set ns.a = [ns.a] %}"
       "{% endfor %}{{ ns.a }}",
       absl::StatusCode::kResourceExhausted},
      {"{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
       absl::StatusCode::kResourceExhausted},
      {"{{ (-9223372036854775807 - 1) // -1 }}", absl::StatusCode::kInvalidArgument},
      {"{{ (-9223372036854775807 - 1) % -1 }}", absl::StatusCode::kInvalidArgument},
      {"{{ -(-9223372036854775807 - 1) }}", absl::StatusCode::kInvalidArgument},
      {"{{ (-9223372036854775807 - 1) | abs }}", absl::StatusCode::kInvalidArgument},
      {"{{ 9223372036854775807 + 1 }}", absl::StatusCode::kInvalidArgument},
      {"{{ 3 ** 9223372036854775807 }}", absl::StatusCode::kInvalidArgument},
      // Lists sharing their items: printing would multiply them.
      {"{% set ns = namespace(a='x') %}{% for i in range(40) %}{% set ns.a = [ns.a, ns.a] %}"
       "{% endfor %}{{ ns.a | tojson }}",
       absl::StatusCode::kResourceExhausted},
      // Functions holding functions: a chain as deep as the loop.
      {"{% set ns = namespace(f=none) %}{% for i in range(3000) %}{% set ns.f = {'p': ns.f}.get %}"
       "{% endfor %}",
       absl::StatusCode::kResourceExhausted},
      // Recursion through blocks and macros together stays within the stack's budget.
      {"{% macro m(n) %}{% if n > 0 %}{% if n > 0 %}{% if n > 0 %}{% if n > 0 %}"
       "{{ m(n - 1) ~ 1 ~ 1 ~ 1 ~ 1 ~ 1 ~ 1 ~ 1 ~ 1 ~ 1 ~ 1 ~ 1 ~ 1 ~ 1 ~ 1 ~ 1 ~ 1 }}"
       "{% endif %}{% endif %}{% endif %}{% endif %}{% endmacro %}{{ m(15) }}",
       absl::StatusCode::kOk},
  };
  for (const auto& [source, code] : runs) {
    SCOPED_TRACE(source);
    auto t = jinja::Template::parse(source);
    ASSERT_TRUE(t.ok()) << t.status();
    auto out =
        t->render({}, {.max_steps = int64_t{1} << 40, .max_time = std::chrono::milliseconds(300)});
    EXPECT_EQ(out.status().code(), code) << out.status();
  }
  // Values that stay in range.
  auto edges = jinja::Template::parse(
      "{{ '1e300' | int }} {{ (-9223372036854775807 - 1) // 1 }} {{ -7 is divisibleby(-1) }} "
      "{{ range(9223372036854775800, 9223372036854775807, 4) | list | length }} "
      "{% set ns = namespace() %}{% set ns.me = ns %}{{ ns.me.me is defined }}"
      "{% for i in range(3) %}{% set prev = ns.f %}{% macro f() %}{{ prev }}{% endmacro %}"
      "{% set ns.f = f %}{% endfor %}");
  ASSERT_TRUE(edges.ok()) << edges.status();
  auto out = edges->render({});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "0 -9223372036854775808 True 2 True");
}

TEST(ChatTemplateTest, RequestJsonIsShallowAndSmall) {
  auto t = ChatTemplate::fromSource("{{ messages | length }}", "", "");
  ASSERT_TRUE(t.ok());
  ChatInput input;
  input.messages = {
      {"user", "a", R"({"x": )" + std::string(100000, '[') + std::string(100000, ']') + "}"}};
  auto deep = t->render(input);
  ASSERT_FALSE(deep.ok());
  EXPECT_TRUE(absl::StrContains(deep.status().message(), "messages[0].fields_json: nested deeper"))
      << deep.status();
  std::string wide = "{";
  for (int i = 0; i < 20000; ++i) wide += absl::StrCat(i ? "," : "", "\"k", i, "\": 1");
  input.messages[0].fields_json = wide + "}";
  auto many = t->render(input);
  ASSERT_FALSE(many.ok());
  EXPECT_TRUE(absl::StrContains(many.status().message(), "more than 10000 members"))
      << many.status();
  // Brackets inside strings do not count.
  input.messages[0].fields_json = R"({"x": ")" + std::string(100, '[') + R"("})";
  EXPECT_TRUE(t->render(input).ok());
  // Variables the request sets itself cannot come again as template arguments.
  input.messages[0].fields_json = "";
  input.kwargs_json = R"({"add_generation_prompt": false})";
  EXPECT_TRUE(absl::StrContains(t->render(input).status().message(), "add_generation_prompt"));
}

TEST(ChatTemplateTest, HuggingFaceFolderTemplates) {
  auto tokenizer = Tokenizer::load(kSmolLm2);
  ASSERT_TRUE(tokenizer.ok());
  const auto dir =
      std::filesystem::temp_directory_path() / absl::StrCat("cleave_chat_template_", ::getpid());
  std::filesystem::create_directories(dir);
  const auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
  };
  ChatInput input;
  input.messages = {{"user", "x", ""}};

  auto missing = ChatTemplate::load(dir.string(), **tokenizer);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "--chat-template")) << missing.status();

  write("tokenizer_config.json",
        R"({"chat_template": [{"name": "tool_use", "template": "T"},
                              {"name": "default", "template": "D{{ messages[0].content }}"}]})");
  auto listed = ChatTemplate::load(dir.string(), **tokenizer);
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(*listed->render(input), "Dx");

  write("tokenizer_config.json", R"({"chat_template": "{% if %}"})");
  auto broken = ChatTemplate::load(dir.string(), **tokenizer);
  ASSERT_FALSE(broken.ok());
  EXPECT_TRUE(absl::StrContains(broken.status().message(), "tokenizer_config.json"))
      << broken.status();

  write("chat_template.jinja", "J{{ bos_token }}{{ messages[0].content }}\n");
  auto file = ChatTemplate::load(dir.string(), **tokenizer);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(*file->render(input),
            absl::StrCat("J", *(*tokenizer)->piece(*(*tokenizer)->bosId()), "x"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace cleave::tokenizer
