// `cleave tokenize` and `cleave detokenize`: check a model's tokenization by hand.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "common/flags.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "services/cli/commands.h"

namespace cleave::cli {
namespace {

int fail(const char* command, const absl::Status& status) {
  std::fprintf(stderr, "%s: %s\n", command, std::string(status.message()).c_str());
  return 1;
}

// A conversation as JSON — a list of messages, or {"messages": [...], "tools": [...],
// "add_generation_prompt": b, "continue_final_message": b, ...template variables} — as the
// template's input. Each message's role and string content go as such, its other fields
// (or a non-string content) as fields_json.
absl::StatusOr<tokenizer::ChatInput> parseConversation(const std::string& text) {
  using Json = nlohmann::ordered_json;
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("the conversation is not valid JSON");
  const Json& messages = j.is_object() && j.contains("messages") ? j["messages"] : j;
  if (!messages.is_array()) {
    return absl::InvalidArgumentError("give a JSON list of messages or {\"messages\": [...]}");
  }
  tokenizer::ChatInput input;
  for (const Json& m : messages) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return absl::InvalidArgumentError("every message needs a \"role\" string");
    }
    tokenizer::ChatMessage message{.role = m["role"].get<std::string>()};
    Json fields = Json::object();
    for (const auto& [k, v] : m.items()) {
      if (k == "role") continue;
      if (k == "content" && v.is_string()) {
        message.content = v.get<std::string>();
      } else {
        fields[k] = v;
      }
    }
    if (!fields.empty()) message.fields_json = fields.dump();
    input.messages.push_back(std::move(message));
  }
  if (j.is_object()) {
    Json kwargs = Json::object();
    for (const auto& [k, v] : j.items()) {
      if (k == "messages") continue;
      if (k == "tools") {
        input.tools_json = v.dump();
      } else if (k == "add_generation_prompt" && v.is_boolean()) {
        input.add_generation_prompt = v.get<bool>();
      } else if (k == "continue_final_message" && v.is_boolean()) {
        input.continue_final_message = v.get<bool>();
      } else {
        kwargs[k] = v;
      }
    }
    if (!kwargs.empty()) input.kwargs_json = kwargs.dump();
  }
  return input;
}

}  // namespace

int runTokenize(int argc, char** argv) {
  std::string model;
  bool json = false;
  bool add_special = true;
  bool parse_special = false;
  bool chat = false;
  bool show_prompt = false;
  std::string chat_template;
  FlagSet flags("cleave tokenize", "--model MODEL [flags] TEXT",
                "Prints the token ids of TEXT (\"-\" reads standard input), space-separated; "
                "--json prints each id with its vocabulary piece. With --chat, TEXT is a "
                "conversation in JSON rendered by the model's chat template.");
  flags.addString("model", &model, "A GGUF file, a tokenizer.json, or a model folder");
  flags.addBool("json", &json, "Print [{\"id\": ..., \"piece\": ...}, ...] instead");
  flags.addBool("add-special", &add_special, "Add the model's special tokens (e.g. BOS)");
  flags.addBool("parse-special", &parse_special,
                "Read special-token text such as <|im_start|> as that token");
  flags.addBool("chat", &chat,
                "TEXT is a conversation: a JSON list of messages, or {\"messages\": [...], "
                "\"tools\": [...], \"add_generation_prompt\": ..., other template variables}; "
                "its prompt is tokenized as a router does (special tokens parsed, none added)");
  flags.addBool("show-prompt", &show_prompt, "With --chat: print the rendered prompt text");
  flags.addString("chat-template", &chat_template,
                  "With --chat: a Jinja chat template file instead of the model's");
  std::vector<std::string> positional = parseFlagsOrExit(flags, argc, argv);
  if (model.empty()) exitWithUsageError(flags, absl::InvalidArgumentError("--model is required"));
  if (positional.size() != 1) {
    exitWithUsageError(flags, absl::InvalidArgumentError("give exactly one TEXT (quote it)"));
  }
  std::string text = positional[0];
  if (text == "-") text.assign(std::istreambuf_iterator<char>(std::cin), {});
  auto tokenizer = tokenizer::Tokenizer::load(model);
  if (!tokenizer.ok()) return fail("cleave tokenize", tokenizer.status());
  if (chat) {
    auto conversation = parseConversation(text);
    if (!conversation.ok()) exitWithUsageError(flags, conversation.status());
    auto t = tokenizer::ChatTemplate::load(model, **tokenizer, chat_template);
    if (!t.ok()) return fail("cleave tokenize", t.status());
    auto prompt = t->render(*conversation);
    if (!prompt.ok()) return fail("cleave tokenize", prompt.status());
    if (show_prompt) {
      std::fwrite(prompt->data(), 1, prompt->size(), stdout);
      return 0;
    }
    text = *std::move(prompt);
    add_special = false;
    parse_special = true;
  }
  std::vector<tokenizer::TokenId> ids =
      (*tokenizer)
          ->encode(text, {.add_special_tokens = add_special, .parse_special = parse_special});
  if (!json) {
    std::printf("%s\n", absl::StrJoin(ids, " ").c_str());
    return 0;
  }
  nlohmann::json out = nlohmann::json::array();
  for (tokenizer::TokenId id : ids) {
    absl::StatusOr<std::string> piece = (*tokenizer)->piece(id);
    out.push_back({{"id", id}, {"piece", piece.ok() ? *piece : ""}});
  }
  // Pieces may hold invalid UTF-8 (byte tokens); replace rather than fail.
  std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  return 0;
}

int runDetokenize(int argc, char** argv) {
  std::string model;
  bool skip_special = false;
  FlagSet flags("cleave detokenize", "--model MODEL [flags] ID...",
                "Prints the text of the token ids.");
  flags.addString("model", &model, "A GGUF file, a tokenizer.json, or a model folder");
  flags.addBool("skip-special", &skip_special, "Leave special tokens out of the text");
  std::vector<std::string> positional = parseFlagsOrExit(flags, argc, argv);
  if (model.empty()) exitWithUsageError(flags, absl::InvalidArgumentError("--model is required"));
  auto tokenizer = tokenizer::Tokenizer::load(model);
  if (!tokenizer.ok()) return fail("cleave detokenize", tokenizer.status());
  std::vector<tokenizer::TokenId> ids;
  for (const std::string& arg : positional) {
    uint32_t id = 0;
    if (!absl::SimpleAtoi(arg, &id) || id >= (*tokenizer)->vocabSize()) {
      exitWithUsageError(flags, absl::InvalidArgumentError(
                                    "'" + arg + "' is not a token id below the vocabulary size " +
                                    std::to_string((*tokenizer)->vocabSize())));
    }
    ids.push_back(id);
  }
  std::string text = (*tokenizer)->decode(ids, skip_special);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
  return 0;
}

}  // namespace cleave::cli
