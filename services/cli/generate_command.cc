// `cleave generate --model MODEL PROMPT`: offline generation on this machine's CPU,
// streamed to the terminal.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "common/flags.h"
#include "common/tokenizer/tokenizer.h"
#include "kernels/cpu/thread_pool.h"
#include "services/cli/commands.h"
#include "services/engine/llama_model.h"

namespace cleave::cli {
namespace {

int fail(const absl::Status& status) {
  std::fprintf(stderr, "cleave generate: %s\n", std::string(status.message()).c_str());
  return 1;
}

}  // namespace

int runGenerate(int argc, char** argv) {
  std::string model;
  int64_t max_tokens = 128;
  int64_t threads = static_cast<int64_t>(std::thread::hardware_concurrency());
  int64_t context = 4096;
  bool chat = true;
  FlagSet flags("cleave generate", "--model MODEL [flags] PROMPT",
                "Generates a continuation of PROMPT with greedy decoding on the CPU and streams it "
                "to standard output; timings go to standard error.");
  flags.addString("model", &model, "A GGUF file of a Llama-family model");
  flags.addInt("max-tokens", &max_tokens, "Most tokens to generate");
  flags.addInt("threads", &threads, "CPU threads");
  flags.addInt("context", &context, "Context length to reserve (prompt + output)");
  flags.addBool("chat", &chat,
                "Wrap PROMPT as a user turn of the model's chat format (--no-chat: raw text)");
  std::vector<std::string> positional = parseFlagsOrExit(flags, argc, argv);
  if (model.empty()) exitWithUsageError(flags, absl::InvalidArgumentError("--model is required"));
  if (positional.size() != 1) {
    exitWithUsageError(flags, absl::InvalidArgumentError("give exactly one PROMPT (quote it)"));
  }
  if (max_tokens < 1 || threads < 1 || context < 2) {
    exitWithUsageError(flags, absl::InvalidArgumentError(
                                  "--max-tokens, --threads must be >= 1 and --context >= 2"));
  }
  auto tokenizer = tokenizer::Tokenizer::load(model);
  if (!tokenizer.ok()) return fail(tokenizer.status());
  auto weights = engine::loadLlamaGguf(model);
  if (!weights.ok()) return fail(weights.status());

  std::string text = positional[0];
  if (chat) {
    // The ChatML turn format SmolLM2, Qwen and others use.
    text = "<|im_start|>user\n" + text + "<|im_end|>\n<|im_start|>assistant\n";
  }
  std::vector<tokenizer::TokenId> prompt =
      (*tokenizer)->encode(text, {.add_special_tokens = true, .parse_special = chat});
  if (prompt.empty()) return fail(absl::InvalidArgumentError("the prompt has no tokens"));

  cpu::ThreadPool pool(static_cast<int>(threads));
  engine::LlamaRunner runner(**weights, pool, context);
  std::vector<uint32_t> eos = (*weights)->config.eos_token_ids;
  if (auto id = (*tokenizer)->eosId()) eos.push_back(*id);
  if (chat) {
    std::vector<tokenizer::TokenId> end =
        (*tokenizer)->encode("<|im_end|>", {.add_special_tokens = false, .parse_special = true});
    if (end.size() == 1) eos.push_back(end[0]);
  }

  auto start = std::chrono::steady_clock::now();
  auto logits = runner.forward(prompt);
  if (!logits.ok()) return fail(logits.status());
  auto prefilled = std::chrono::steady_clock::now();
  tokenizer::IncrementalDetokenizer detokenizer(**tokenizer);
  int64_t generated = 0;
  while (generated < max_tokens) {
    uint32_t next =
        static_cast<uint32_t>(std::max_element(logits->begin(), logits->end()) - logits->begin());
    if (std::find(eos.begin(), eos.end(), next) != eos.end()) break;
    ++generated;
    std::string piece = detokenizer.push(next);
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    if (runner.position() + 1 > context) break;
    logits = runner.forward(std::span<const uint32_t>(&next, 1));
    if (!logits.ok()) return fail(logits.status());
  }
  std::string rest = detokenizer.finish();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  auto done = std::chrono::steady_clock::now();
  double prefill_s = std::chrono::duration<double>(prefilled - start).count();
  double decode_s = std::chrono::duration<double>(done - prefilled).count();
  std::fprintf(stderr,
               "prompt %zu tokens in %.1f ms (%.0f tok/s); generated %lld tokens in %.1f ms (%.1f "
               "tok/s), %lld threads\n",
               prompt.size(), prefill_s * 1e3, prompt.size() / prefill_s,
               static_cast<long long>(generated), decode_s * 1e3,
               generated / std::max(decode_s, 1e-9), static_cast<long long>(threads));
  return 0;
}

}  // namespace cleave::cli
