// libFuzzer target: a chat template from a model file (the input) parsed and rendered over
// a small conversation, under tight limits; any error is fine, a crash, hang or leak is not.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/jinja/template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cleave::jinja;
  auto parsed = Template::parse(std::string(reinterpret_cast<const char*>(data), size));
  if (!parsed.ok()) return 0;
  static const Dict* context = [] {
    auto* d = new Dict;
    List messages;
    for (const char* role : {"system", "user", "assistant", "user"}) {
      Dict m;
      m.set("role", Value(role));
      m.set("content", Value(std::string("  héllo ") + role + " ✓\n"));
      messages.emplace_back(std::move(m));
    }
    d->set("messages", Value(std::move(messages)));
    d->set("tools", Value::none());
    d->set("add_generation_prompt", Value(true));
    d->set("bos_token", Value("<s>"));
    d->set("eos_token", Value("</s>"));
    return d;
  }();
  (void)parsed->render(*context,
                       {.max_output_bytes = 1 << 16, .max_steps = 20000, .max_call_depth = 16});
  return 0;
}
