// A model's chat template: the Jinja text that turns a conversation into the prompt the
// model was trained on, rendered exactly as Hugging Face's apply_chat_template renders it
// (common/jinja/template.h), with the context it passes: `messages`, `tools`, `documents`
// (none), `add_generation_prompt`, `bos_token`, `eos_token` and any extra keyword arguments
// (`enable_thinking`, `date_string`...).
//
// Where a model keeps it: a GGUF file's `tokenizer.chat_template`; a Hugging Face folder's
// `chat_template.jinja`, else `tokenizer_config.json`'s `chat_template` (a string, or a list
// of {name, template} of which "default" is used).
//
// Threading: immutable; render may be called from any thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/tokenizer.h"

namespace cleave::jinja {
class Template;
struct Dict;
}  // namespace cleave::jinja

namespace cleave::tokenizer {

struct ChatMessage {
  std::string role;
  std::string content;
  // A JSON object of further fields the template may read (tool_calls, reasoning_content,
  // name, content as a list of parts...); its keys override role and content. May be empty.
  std::string fields_json;
};

struct ChatInput {
  std::vector<ChatMessage> messages;
  std::string tools_json;   // a JSON array of tool schemas, or empty for none
  std::string kwargs_json;  // a JSON object of extra template variables, or empty
  bool add_generation_prompt = true;
  // The prompt ends where the last message's text ends (its content, or the last text part
  // of a content list; no generation prompt), so the reply continues it. The template must
  // print that text.
  bool continue_final_message = false;
};

class ChatTemplate {
 public:
  // Parses `source` (errors name the line); bos/eos are the texts the template may print.
  // `tool_source`, when not empty, renders requests that pass tools (a model's "tool_use"
  // template).
  static absl::StatusOr<ChatTemplate> fromSource(const std::string& source, std::string bos_token,
                                                 std::string eos_token,
                                                 const std::string& tool_source = "");
  // The template `model_path` (a .gguf file or a Hugging Face folder) carries, or the one in
  // `template_file` when given (--chat-template), with the BOS/EOS texts of its `tokenizer`.
  // NotFound when the model has none; errors name the file.
  static absl::StatusOr<ChatTemplate> load(const std::string& model_path,
                                           const Tokenizer& tokenizer,
                                           const std::string& template_file = "");
  // The template in the file `path` (a .jinja text file), as --chat-template passes it.
  static absl::StatusOr<ChatTemplate> loadFile(const std::string& path, const Tokenizer& tokenizer);

  // The prompt text of `input`. Bad JSON names the field (InvalidArgument); a
  // raise_exception() in the template (e.g. "roles must alternate") is InvalidArgument
  // quoting it; the render limits of jinja/template.h are ResourceExhausted; other template
  // errors keep their code, prefixed "chat template: ".
  absl::StatusOr<std::string> render(const ChatInput& input) const;
  // The prompt text for a whole render context (a JSON object), for tests and tools.
  absl::StatusOr<std::string> renderContext(absl::string_view context_json) const;

 private:
  ChatTemplate(std::shared_ptr<const jinja::Template> t,
               std::shared_ptr<const jinja::Template> tools, std::string bos, std::string eos)
      : template_(std::move(t)),
        tool_template_(std::move(tools)),
        bos_(std::move(bos)),
        eos_(std::move(eos)) {}
  // mark_final: the last message's text ends with a mark render() cuts at.
  absl::StatusOr<std::string> renderTurns(const ChatInput& input, bool mark_final) const;
  absl::StatusOr<std::string> renderWith(const jinja::Template& t,
                                         const jinja::Dict& context) const;
  std::shared_ptr<const jinja::Template> template_;
  std::shared_ptr<const jinja::Template> tool_template_;  // may be null
  std::string bos_;
  std::string eos_;
};

}  // namespace cleave::tokenizer
