// `cleave generate --model MODEL PROMPT`: offline generation on this machine's CPU,
// streamed to the terminal; `cleave generate --router ADDR PROMPT`: the same through a
// running deployment.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/flags.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "services/cli/commands.h"
#include "services/cli/router_client.h"
#include "services/engine/scheduler.h"
#include "services/engine/tp_group.h"
#if CLEAVE_HAVE_CUDA
#include "services/engine/cuda_llama_model.h"
#include "services/engine/memory_plan.h"
#endif

namespace cleave::cli {
namespace {

int fail(const absl::Status& status) {
  std::fprintf(stderr, "cleave generate: %s\n", std::string(status.message()).c_str());
  return 1;
}

// The conversation `cleave generate` sends: an optional system turn, then PROMPT as the user's.
std::vector<tokenizer::ChatMessage> conversation(const std::string& system,
                                                 const std::string& prompt) {
  std::vector<tokenizer::ChatMessage> turns;
  if (!system.empty()) turns.push_back({"system", system, ""});
  turns.push_back({"user", prompt, ""});
  return turns;
}

// The prompt text of a chat with the model's template (or --chat-template's); nullopt for
// a model without one (PROMPT then goes as plain text, and that is said).
absl::StatusOr<std::optional<std::string>> chatText(const std::string& model,
                                                    const std::string& template_file,
                                                    const tokenizer::Tokenizer& words,
                                                    const std::string& system,
                                                    const std::string& prompt) {
  auto t = tokenizer::ChatTemplate::load(model, words, template_file);
  if (absl::IsNotFound(t.status()) && template_file.empty()) {
    std::fprintf(stderr, "cleave generate: %s; sending the prompt as plain text\n",
                 std::string(t.status().message()).c_str());
    return std::nullopt;
  }
  if (!t.ok()) return t.status();
  return t->render({.messages = conversation(system, prompt)});
}

// "1 2 3" or "1,2,3" as token ids; InvalidArgument naming what is not one.
absl::StatusOr<std::vector<uint32_t>> parseIds(const std::string& text) {
  std::vector<uint32_t> ids;
  for (absl::string_view part : absl::StrSplit(text, absl::ByAnyChar(", "), absl::SkipEmpty())) {
    uint32_t id = 0;
    if (!absl::SimpleAtoi(part, &id))
      return absl::InvalidArgumentError(
          absl::StrCat("--prompt-ids: '", part, "' is not a token id"));
    ids.push_back(id);
  }
  if (ids.empty()) return absl::InvalidArgumentError("--prompt-ids has no token ids");
  return ids;
}

// What the output must be (--json-schema, --regex, --grammar): texts; empty when unset.
struct OutputShape {
  std::string json_schema;
  std::string regex;
  std::string grammar;
};

// `ids` set: the prompt as token ids (no chat wrapping), else the text.
int generateThroughRouter(const std::string& address, const std::string& prompt,
                          const std::vector<uint32_t>& ids, bool chat, const std::string& system,
                          const engine::SamplingParams& s, int64_t max_tokens,
                          const std::string& stop, bool ignore_eos, bool print_ids,
                          const OutputShape& shape, const std::string& lora) {
  v1::GenerateRequest request;
  request.set_model(lora);  // Empty: the base model.
  if (!ids.empty()) {
    request.mutable_token_ids()->mutable_ids()->Assign(ids.begin(), ids.end());
  } else if (chat) {
    for (const tokenizer::ChatMessage& turn : conversation(system, prompt)) {
      v1::ChatMessage* m = request.mutable_chat()->add_messages();
      m->set_role(turn.role);
      m->set_content(turn.content);
    }
  } else {
    request.set_text(prompt);
    request.set_add_special_tokens(true);
  }
  v1::SamplingParams* p = request.mutable_sampling();
  p->set_temperature(s.temperature);
  p->set_top_k(s.top_k);
  p->set_top_p(s.top_p);
  p->set_min_p(s.min_p);
  p->set_repetition_penalty(s.repetition_penalty);
  p->set_presence_penalty(s.presence_penalty);
  p->set_frequency_penalty(s.frequency_penalty);
  p->set_seed(s.seed);
  if (!shape.json_schema.empty()) {
    p->set_response_format(v1::RESPONSE_FORMAT_JSON_SCHEMA);
    p->set_json_schema(shape.json_schema);
  }
  p->set_regex(shape.regex);
  p->set_grammar(shape.grammar);
  request.mutable_stopping()->set_max_new_tokens(static_cast<uint32_t>(max_tokens));
  if (!stop.empty()) request.mutable_stopping()->add_stop(stop);
  request.mutable_stopping()->set_ignore_eos(ignore_eos);
  client::RouterClient client({.address = address});
  v1::FinalInfo final;
  bool first = true;
  absl::Status status = client.generate(
      request,
      [&](const v1::GenerateResponse& message) {
        std::string shown = message.text();
        if (print_ids) {
          shown.clear();
          for (uint32_t id : message.token_ids()) {
            absl::StrAppend(&shown, first ? "" : " ", id);
            first = false;
          }
        }
        std::fwrite(shown.data(), 1, shown.size(), stdout);
        std::fflush(stdout);
        if (message.has_final()) final = message.final();
        return true;
      },
      std::chrono::minutes(10));
  std::fputc('\n', stdout);
  std::fflush(stdout);  // Before the summary on stderr, which may share the stream.
  if (!status.ok()) return fail(status);
  const v1::Timings& t = final.timings();
  std::fprintf(stderr,
               "prompt %u tokens, generated %u (%s); queue %.1f ms, prefill %.1f ms, KV transfer "
               "%.1f ms, first token %.1f ms, decode batch wait %.1f ms, total %.1f ms\n",
               final.usage().prompt_tokens(), final.usage().completion_tokens(),
               v1::FinishReason_Name(final.finish_reason()).c_str(), t.queue_wait_ms(),
               t.prefill_ms(), t.kv_transfer_ms(), t.time_to_first_token_ms(), t.decode_wait_ms(),
               t.total_ms());
  return 0;
}

}  // namespace

int runGenerate(int argc, char** argv) {
  std::string model;
  int64_t max_tokens = 128;
  int64_t threads = static_cast<int64_t>(std::thread::hardware_concurrency());
  int64_t context = 4096;
  int64_t tp = 1;
  std::string backend = "cpu";
  std::string moe_split = "experts";
  std::string kv_dtype = "auto";
  std::string prompt_ids;
  std::string gemm_operands = "auto";
  std::string router;
  bool print_ids = false;
  bool chat = true;
  std::string system;
  std::string chat_template;
  double temperature = 0.0, top_p = 1.0, min_p = 0.0, repetition_penalty = 1.0;
  double presence_penalty = 0.0, frequency_penalty = 0.0;
  int64_t top_k = 0, seed = 0;
  std::string stop;
  std::string json_schema;
  std::string regex;
  std::string grammar;
  bool ignore_eos = false;
  engine::SpeculativeOptions speculative;
  std::string lora;
  FlagSet flags("cleave generate", "--model MODEL [flags] PROMPT",
                "Generates a continuation of PROMPT on the CPU and streams it to standard output; "
                "timings go to standard error. Greedy unless --temperature > 0.");
  flags.addString("model", &model,
                  "A GGUF file, or a Hugging Face folder, of a supported model (cleave info)");
  flags.addString("router", &router,
                  "Generate through a running router (host:port) instead of loading --model");
  flags.addString("prompt-ids", &prompt_ids,
                  "The prompt as token ids (\"1 2 3\" or 1,2,3) instead of PROMPT: no chat "
                  "wrapping, no tokenizer needed");
  flags.addBool("print-ids", &print_ids,
                "Print the generated token ids, space-separated, instead of the text");
  flags.addInt("max-tokens", &max_tokens, "Most tokens to generate");
  flags.addInt("threads", &threads, "CPU threads (all ranks together)");
  flags.addInt("tp", &tp, "Tensor-parallel ranks (one thread group each)");
  flags.addString("moe-split", &moe_split,
                  "How --tp cuts MoE layers: experts (whole experts per rank) or columns");
  flags.addString("backend", &backend,
                  "Where the model runs: cpu, or cuda (rank r on GPU r, --tp of them)");
  flags.addInt("context", &context, "Context length to reserve (prompt + output)");
  flags.addString("kv-dtype", &kv_dtype,
                  "KV cache element type: f32, bf16 or fp8 (e4m3); auto: bf16");
  flags.addString("gemm-operands", &gemm_operands,
                  "cuda: how FP8 and NVFP4 weights meet the activations: widened (weights to "
                  "bf16: W8A16, W4A16) or auto (activations quantized per row where the GPU "
                  "has the instruction: W8A8 on sm_120, W4A4 on sm_120a; else widened)");
  flags.addBool("chat", &chat,
                "Send PROMPT as a user turn through the model's chat template (--no-chat: as "
                "plain text)");
  flags.addString("system", &system, "A system message before PROMPT (with --chat)");
  flags.addString("chat-template", &chat_template,
                  "A Jinja chat template file instead of the model's (offline; a router uses its "
                  "own)");
  flags.addDouble("temperature", &temperature, "Sampling temperature (0: greedy)");
  flags.addInt("top-k", &top_k, "Keep the k most likely tokens (0: all)");
  flags.addDouble("top-p", &top_p, "Keep the smallest set of tokens with this much probability");
  flags.addDouble("min-p", &min_p, "Drop tokens below this fraction of the top probability");
  flags.addDouble("repetition-penalty", &repetition_penalty,
                  "Penalty on prompt and output tokens (1: off)");
  flags.addDouble("presence-penalty", &presence_penalty, "Subtracted from seen output tokens");
  flags.addDouble("frequency-penalty", &frequency_penalty,
                  "Subtracted per occurrence in the output");
  flags.addInt("seed", &seed, "Random seed (same seed, same output)");
  flags.addString("stop", &stop, "Stop when this text appears (not printed)");
  flags.addString("json-schema", &json_schema,
                  "Constrain the output to an instance of this JSON schema (a file, or the schema "
                  "itself when it starts with '{'; docs/serving.md says what is followed)");
  flags.addString("grammar", &grammar,
                  "Constrain the output to a whole `root` of this GBNF grammar (a file, or the "
                  "grammar itself when it holds '::='; docs/serving.md)");
  flags.addString("regex", &regex,
                  "Constrain the output to match this regular expression whole (Python's "
                  "re.fullmatch; docs/serving.md lists the syntax)");
  flags.addBool("ignore-eos", &ignore_eos,
                "Generate --max-tokens tokens even past the end-of-sequence token");
  speculative.addFlags(flags);
  flags.addString("lora", &lora,
                  "Run with a LoRA adapter: with --model, its folder (as PEFT saves one); with "
                  "--router, the name the workers serve it under (their --lora-modules)");
  std::vector<std::string> positional = parseFlagsOrExit(flags, argc, argv);
  if (absl::Status valid = engine::validate(speculative); !valid.ok())
    exitWithUsageError(flags, valid);
  engine::SamplingParams sampling{.temperature = static_cast<float>(temperature),
                                  .top_k = static_cast<int32_t>(top_k),
                                  .top_p = static_cast<float>(top_p),
                                  .min_p = static_cast<float>(min_p),
                                  .repetition_penalty = static_cast<float>(repetition_penalty),
                                  .presence_penalty = static_cast<float>(presence_penalty),
                                  .frequency_penalty = static_cast<float>(frequency_penalty),
                                  .seed = static_cast<uint64_t>(seed)};
  if (absl::Status valid = engine::validateSamplingParams(sampling); !valid.ok()) {
    // Field names become flag names: "top_k must be ..." -> "--top-k must be ...".
    std::string message(valid.message());
    size_t end = message.find(' ');
    std::replace(message.begin(), message.begin() + end, '_', '-');
    exitWithUsageError(flags, absl::InvalidArgumentError("--" + message));
  }
  if (model.empty() == router.empty()) {
    exitWithUsageError(flags, absl::InvalidArgumentError("give --model or --router (one of them)"));
  }
  std::shared_ptr<const engine::JsonSchema> schema;
  if (!json_schema.empty()) {
    if (!json_schema.starts_with("{")) {
      std::ifstream in(json_schema, std::ios::binary);
      if (!in)
        exitWithUsageError(flags, absl::NotFoundError("--json-schema: cannot read " + json_schema));
      json_schema.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    absl::StatusOr<std::shared_ptr<const engine::JsonSchema>> compiled =
        engine::JsonSchema::compile(json_schema);
    if (!compiled.ok()) {
      exitWithUsageError(
          flags, absl::Status(compiled.status().code(),
                              absl::StrCat("--json-schema: ", compiled.status().message())));
    }
    if (ignore_eos) {
      exitWithUsageError(flags, absl::InvalidArgumentError(
                                    "--json-schema ends the output with end-of-sequence: leave "
                                    "out --ignore-eos"));
    }
    schema = *std::move(compiled);
  }
  absl::StatusOr<std::shared_ptr<const engine::Regex>> pattern = engine::outputPattern(regex, {});
  if (!pattern.ok()) {
    exitWithUsageError(flags, absl::InvalidArgumentError(absl::StrReplaceAll(
                                  pattern.status().message(), {{"sampling.regex", "--regex"}})));
  }
  if (*pattern != nullptr && (ignore_eos || schema != nullptr)) {
    exitWithUsageError(
        flags, absl::InvalidArgumentError("--regex ends the output with end-of-sequence: leave out "
                                          "--ignore-eos and --json-schema"));
  }
  if (!grammar.empty() && grammar.find("::=") == std::string::npos) {
    std::ifstream in(grammar, std::ios::binary);
    if (!in) exitWithUsageError(flags, absl::NotFoundError("--grammar: cannot read " + grammar));
    grammar.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  absl::StatusOr<std::shared_ptr<const engine::Grammar>> rules = engine::outputGrammar(grammar);
  if (!rules.ok()) {
    exitWithUsageError(flags, absl::InvalidArgumentError(absl::StrReplaceAll(
                                  rules.status().message(), {{"sampling.grammar", "--grammar"}})));
  }
  if (*rules != nullptr && (ignore_eos || schema != nullptr || *pattern != nullptr)) {
    exitWithUsageError(flags, absl::InvalidArgumentError(
                                  "--grammar ends the output with end-of-sequence: leave out "
                                  "--ignore-eos, --json-schema and --regex"));
  }
  std::vector<uint32_t> ids;
  if (!prompt_ids.empty()) {
    auto parsed = parseIds(prompt_ids);
    if (!parsed.ok()) exitWithUsageError(flags, parsed.status());
    ids = std::move(*parsed);
    if (!positional.empty())
      exitWithUsageError(flags,
                         absl::InvalidArgumentError("give PROMPT or --prompt-ids, not both"));
    positional.push_back("");
  }
  if (positional.size() != 1) {
    exitWithUsageError(flags, absl::InvalidArgumentError("give exactly one PROMPT (quote it)"));
  }
  if (max_tokens < 1 || threads < 1 || tp < 1 || context < 2) {
    exitWithUsageError(flags, absl::InvalidArgumentError(
                                  "--max-tokens, --threads, --tp must be >= 1 and --context >= 2"));
  }
  if (backend != "cpu" && backend != "cuda") {
    exitWithUsageError(flags, absl::InvalidArgumentError(
                                  absl::StrCat("--backend is cpu or cuda, not '", backend, "'")));
  }
  auto split = engine::parseMoeSplit(moe_split);
  if (!split.ok()) exitWithUsageError(flags, split.status());
  auto kv_type = cpu::parseKvType(kv_dtype);
  if (!kv_type.ok()) {
    exitWithUsageError(flags, absl::InvalidArgumentError(
                                  absl::StrCat("--kv-dtype: ", kv_type.status().message())));
  }
  if (gemm_operands != "auto" && gemm_operands != "widened") {
    exitWithUsageError(
        flags, absl::InvalidArgumentError(
                   absl::StrCat("--gemm-operands is auto or widened, not '", gemm_operands, "'")));
  }
  engine::StepBackendFactory step_backend;
  if (backend == "cuda") {
    if (*kv_type == cpu::KvType::kF32) {
      exitWithUsageError(flags, absl::InvalidArgumentError(
                                    "--kv-dtype: the GPU stores its KV cache as bf16 or fp8"));
    }
#if CLEAVE_HAVE_CUDA
    const cuda::GemmOperands operands =
        gemm_operands == "widened" ? cuda::GemmOperands::kWidened : cuda::GemmOperands::kAuto;
    // One sequence: its row, its drafts, the rows of a prompt scored for log-probabilities.
    step_backend = engine::cudaStepBackend(
        {.max_logit_rows = 1 + speculative.tokens + engine::kPromptLogprobRows,
         .kv_dtype = engine::gpuKvDtype(*kv_type),
         .operands = operands});
#else
    return fail(absl::UnimplementedError(
        "this build has no CUDA backend: configure with -DCLEAVE_CUDA=ON where nvcc exists"));
#endif
  }
  if (!router.empty()) {
    if (!chat_template.empty()) {
      exitWithUsageError(flags,
                         absl::InvalidArgumentError(
                             "--chat-template is for --model; a router renders with its own"));
    }
    return generateThroughRouter(
        router, positional[0], ids, chat, system, sampling, max_tokens, stop, ignore_eos, print_ids,
        {.json_schema = json_schema, .regex = regex, .grammar = grammar}, lora);
  }
  // Token-id prompts need no tokenizer; without one, tokens print as ids.
  auto tokenizer = tokenizer::Tokenizer::load(model);
  if (!tokenizer.ok() && ids.empty()) return fail(tokenizer.status());
  tokenizer::Tokenizer* words = tokenizer.ok() ? tokenizer->get() : nullptr;
  if (words == nullptr) print_ids = true;
  ProgressLine progress;
  auto group = engine::TpGroup::load(model, {.tp = static_cast<int>(tp),
                                             .moe_split = *split,
                                             .threads = static_cast<int>(threads),
                                             .kv_type = *kv_type,
                                             .on_progress = engine::showLoadProgress(progress),
                                             .backend = step_backend});
  progress.finish();
  if (!group.ok()) return fail(group.status());
  const model::ModelConfig& config = (*group)->config();
  int32_t adapter = -1;
  if (!lora.empty()) {
    absl::StatusOr<int32_t> added = (*group)->addAdapter("lora", lora);
    if (!added.ok()) return fail(added.status());
    adapter = *added;
  }

  std::vector<tokenizer::TokenId> prompt(ids.begin(), ids.end());
  if (ids.empty() && chat) {
    auto text = chatText(model, chat_template, *words, system, positional[0]);
    if (!text.ok()) return fail(text.status());
    if (text->has_value()) {
      // The template places the special tokens.
      prompt = words->encode(**text, {.add_special_tokens = false, .parse_special = true});
    } else {
      prompt = words->encode(positional[0], {.add_special_tokens = true, .parse_special = false});
    }
  } else if (ids.empty()) {
    prompt = words->encode(positional[0], {.add_special_tokens = true, .parse_special = false});
  }
  if (prompt.empty()) return fail(absl::InvalidArgumentError("the prompt has no tokens"));
  if (static_cast<int64_t>(prompt.size()) >= context) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "the prompt has ", prompt.size(), " tokens; --context ", context, " leaves no room")));
  }

  std::vector<uint32_t> eos = config.eos_token_ids;
  if (words != nullptr) {
    if (auto id = words->eosId()) eos.push_back(*id);
  }
  if (ignore_eos) {
    eos.clear();
  } else if (chat && words != nullptr && ids.empty()) {
    std::vector<tokenizer::TokenId> end =
        words->encode("<|im_end|>", {.add_special_tokens = false, .parse_special = true});
    if (end.size() == 1) eos.push_back(end[0]);
  }
  constexpr int64_t kBlockSize = 16;
  // A linear-attention model's state: the sequence's slot, and one per draft's row.
  if (absl::Status s = (*group)->allocateKv((context + kBlockSize - 1) / kBlockSize, kBlockSize,
                                            /*host_blocks=*/0,
                                            /*state_slots=*/1 + speculative.tokens);
      !s.ok()) {
    return fail(s);
  }
  engine::Scheduler scheduler(
      **group, words,
      {.max_batch_tokens = 512, .draft_states = speculative.tokens, .speculative = speculative});
  engine::GenerationRequest request{.id = 1, .prompt = prompt, .sampling = sampling};
  request.adapter = adapter;
  request.json_object = schema != nullptr;
  request.json_schema = schema;
  request.regex = *pattern;
  request.grammar = *rules;
  request.stop = {
      .stop_token_ids = eos,
      .stop_strings = stop.empty() ? std::vector<std::string>{} : std::vector<std::string>{stop},
      .max_new_tokens =
          std::min<int64_t>(max_tokens, context - static_cast<int64_t>(prompt.size()))};
  if (absl::Status s = scheduler.add(std::move(request)); !s.ok()) return fail(s);

  auto start = std::chrono::steady_clock::now();
  auto prefilled = start;
  int64_t generated = 0;
  while (!scheduler.idle()) {
    auto events = scheduler.step();
    if (!events.ok()) return fail(events.status());
    for (const engine::TokenEvent& event : *events) {
      if (generated++ == 0) prefilled = std::chrono::steady_clock::now();
      const std::string shown =
          print_ids ? absl::StrCat(generated > 1 ? " " : "", event.token) : event.text;
      std::fwrite(shown.data(), 1, shown.size(), stdout);
      std::fflush(stdout);
    }
  }
  std::fputc('\n', stdout);
  std::fflush(stdout);
  auto done = std::chrono::steady_clock::now();
  // The first token comes out of the prefill step; the rest are decode steps.
  double prefill_s = std::chrono::duration<double>(prefilled - start).count();
  double decode_s = std::chrono::duration<double>(done - prefilled).count();
  std::fprintf(stderr,
               "prompt %zu tokens in %.1f ms (%.0f tok/s); generated %lld tokens, %lld in %.1f ms "
               "after the first (%.1f tok/s); %lld threads, tp %lld\n",
               prompt.size(), prefill_s * 1e3, prompt.size() / prefill_s,
               static_cast<long long>(generated), static_cast<long long>(generated - 1),
               decode_s * 1e3, (generated - 1) / std::max(decode_s, 1e-9),
               static_cast<long long>(threads), static_cast<long long>(tp));
  if (speculative.tokens > 0) {
    std::fprintf(stderr, "speculative: %lld tokens drafted, %lld accepted\n",
                 static_cast<long long>(scheduler.draftedTokens()),
                 static_cast<long long>(scheduler.acceptedTokens()));
  }
  return 0;
}

}  // namespace cleave::cli
