// Tokenizer throughput: encode and decode MB/s on ~1 MB of English text, one core.
//
//   build/default/bin/bench_tokenizer --benchmark_repetitions=5 --benchmark_report_aggregates_only
//
// Tokenizer: $CLEAVE_TOKENIZER (a .gguf, tokenizer.json or folder), else the demo model
// models/SmolLM2-135M-Instruct.Q4_1.gguf (found from the working directory or the binary's).
// Text: $CLEAVE_TOKENIZER_BENCH_TEXT (a file), else ~1 MB generated deterministically.
// Counters: bytes_per_second is text bytes (encode) or decoded bytes (decode) per second.
// ChatTemplate renders the model's chat template over a 16-turn conversation (~6 KB); its
// peer is ChatPromptEncode, the tokenization of the prompt it renders, which the router does
// next for every chat request: the render should cost a fraction of it.
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "services/engine/json_constraint.h"
#include "services/engine/regex_constraint.h"

namespace {

using cleave::tokenizer::EncodeOptions;
using cleave::tokenizer::IncrementalDetokenizer;
using cleave::tokenizer::TokenId;
using cleave::tokenizer::Tokenizer;

constexpr size_t kTextBytes = 1 << 20;
constexpr const char* kDemoModel = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

std::string findTokenizerPath() {
  if (const char* env = std::getenv("CLEAVE_TOKENIZER")) return env;
  std::error_code ec;
  if (std::filesystem::exists(kDemoModel, ec)) return kDemoModel;
  // build/<preset>/bin/bench_tokenizer -> the checkout is three folders up.
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  for (int up = 0; !ec && up < 5 && exe.has_parent_path(); ++up) {
    exe = exe.parent_path();
    if (std::filesystem::exists(exe / kDemoModel, ec)) return (exe / kDemoModel).string();
  }
  return "";
}

// English-like prose: common words, capitals, punctuation, contractions, numbers, newlines.
std::string generateText(size_t bytes) {
  static const char* const kWords[] = {
      "the",         "of",          "and",         "to",          "in",        "a",
      "is",          "that",        "for",         "it",          "as",        "was",
      "with",        "be",          "by",          "on",          "not",       "he",
      "this",        "are",         "or",          "his",         "from",      "at",
      "which",       "but",         "have",        "an",          "had",       "they",
      "you",         "were",        "their",       "one",         "all",       "we",
      "can",         "her",         "has",         "there",       "been",      "if",
      "more",        "when",        "will",        "would",       "who",       "so",
      "no",          "model",       "serving",     "request",     "latency",   "through",
      "accelerator", "memory",      "schedule",    "batches",     "prefix",    "cache",
      "tokens",      "language",    "quickly",     "however",     "important", "different",
      "between",     "without",     "government",  "children",    "question",  "understand",
      "experience",  "information", "development", "particularly"};
  static const char* const kContractions[] = {"don't", "it's",  "we're",  "they've",
                                              "I'm",   "can't", "she'll", "wouldn't"};
  uint64_t state = 0x2545F4914F6CDD1DULL;
  auto next = [&](uint64_t n) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state % n;
  };
  std::string text;
  text.reserve(bytes + 256);
  bool sentence_start = true;
  while (text.size() < bytes) {
    std::string word;
    const uint64_t kind = next(100);
    if (kind < 3) {
      word = std::to_string(next(100000));
    } else if (kind < 6) {
      word = kContractions[next(std::size(kContractions))];
    } else {
      word = kWords[next(std::size(kWords))];
    }
    if (sentence_start || next(20) == 0) word[0] = static_cast<char>(std::toupper(word[0]));
    if (!sentence_start) text.push_back(' ');
    text += word;
    sentence_start = false;
    const uint64_t punct = next(100);
    if (punct < 8) {
      text += ". ";
      sentence_start = true;
      if (next(6) == 0) text += "\n\n";
    } else if (punct < 13) {
      text.push_back(',');
    } else if (punct < 14) {
      text += "? ";
      sentence_start = true;
    }
  }
  return text;
}

struct Fixture {
  std::unique_ptr<Tokenizer> tokenizer;
  std::string text;
  std::vector<TokenId> ids;
  std::string error;
  std::optional<cleave::tokenizer::ChatTemplate> chat;
  cleave::tokenizer::ChatInput conversation;
  std::string chat_prompt;

  Fixture() {
    const std::string path = findTokenizerPath();
    if (path.empty()) {
      error = std::string(kDemoModel) +
              " not found: run scripts/install-deps.sh or set CLEAVE_TOKENIZER";
      return;
    }
    auto loaded = Tokenizer::load(path);
    if (!loaded.ok()) {
      error = std::string(loaded.status().message());
      return;
    }
    tokenizer = *std::move(loaded);
    if (const char* file = std::getenv("CLEAVE_TOKENIZER_BENCH_TEXT")) {
      std::ifstream in(file, std::ios::binary);
      text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    } else {
      text = generateText(kTextBytes);
    }
    ids = tokenizer->encode(text, EncodeOptions{.add_special_tokens = false});
    auto chat_template = cleave::tokenizer::ChatTemplate::load(path, *tokenizer);
    if (chat_template.ok()) {
      chat = *std::move(chat_template);
      for (int turn = 0; turn < 16; ++turn) {
        conversation.messages.push_back({turn % 2 == 0 ? "user" : "assistant",
                                         text.substr(static_cast<size_t>(turn) * 400, 400), ""});
      }
      auto rendered = chat->render(conversation);
      if (rendered.ok()) chat_prompt = *rendered;
    }
  }
};

const Fixture& fixture() {
  static const Fixture kFixture;
  return kFixture;
}

void BM_Encode(benchmark::State& state) {
  const Fixture& f = fixture();
  if (!f.error.empty()) {
    state.SkipWithError(f.error.c_str());
    return;
  }
  size_t tokens = 0;
  for (auto _ : state) {
    auto ids = f.tokenizer->encode(f.text, EncodeOptions{.add_special_tokens = false});
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * f.text.size()));
  state.counters["tokens"] = static_cast<double>(tokens);
  state.counters["bytes_per_token"] = static_cast<double>(f.text.size()) / tokens;
}
BENCHMARK(BM_Encode)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Decode(benchmark::State& state) {
  const Fixture& f = fixture();
  if (!f.error.empty()) {
    state.SkipWithError(f.error.c_str());
    return;
  }
  size_t bytes = 0;
  for (auto _ : state) {
    std::string text = f.tokenizer->decode(f.ids, /*skip_special_tokens=*/true);
    bytes = text.size();
    benchmark::DoNotOptimize(text.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}
BENCHMARK(BM_Decode)->Unit(benchmark::kMillisecond)->UseRealTime();

// Streaming decode, one push per token, as a server streams a response.
void BM_IncrementalDecode(benchmark::State& state) {
  const Fixture& f = fixture();
  if (!f.error.empty()) {
    state.SkipWithError(f.error.c_str());
    return;
  }
  size_t bytes = 0;
  for (auto _ : state) {
    IncrementalDetokenizer stream(*f.tokenizer);
    bytes = 0;
    for (TokenId id : f.ids) bytes += stream.push(id).size();
    bytes += stream.finish().size();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}
BENCHMARK(BM_IncrementalDecode)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_ChatTemplate(benchmark::State& state) {
  const Fixture& f = fixture();
  if (!f.chat || f.chat_prompt.empty()) {
    state.SkipWithError("the model has no chat template");
    return;
  }
  for (auto _ : state) {
    auto prompt = f.chat->render(f.conversation);
    benchmark::DoNotOptimize(prompt);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * f.chat_prompt.size()));
}
BENCHMARK(BM_ChatTemplate)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_ChatPromptEncode(benchmark::State& state) {
  const Fixture& f = fixture();
  if (f.chat_prompt.empty()) {
    state.SkipWithError("the model has no chat template");
    return;
  }
  for (auto _ : state) {
    auto ids =
        f.tokenizer->encode(f.chat_prompt, {.add_special_tokens = false, .parse_special = true});
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * f.chat_prompt.size()));
}
BENCHMARK(BM_ChatPromptEncode)->Unit(benchmark::kMicrosecond)->UseRealTime();

// Masks a vocabulary of `vocab` tokens each iteration; counts the tokens allowed.
void maskEveryIteration(benchmark::State& state, const cleave::engine::OutputConstraint& constraint,
                        size_t vocab) {
  std::vector<float> logits(vocab, 0.0f);
  for (auto _ : state) {
    std::fill(logits.begin(), logits.end(), 0.0f);
    constraint.mask(logits);
    benchmark::DoNotOptimize(logits.data());
  }
  state.counters["allowed"] = static_cast<double>(std::count(logits.begin(), logits.end(), 0.0f));
  state.counters["vocab"] = static_cast<double>(vocab);
}

// The mask of a JSON-object constraint over the whole vocabulary, the work it adds to each
// constrained draw: inside a string (nearly every token allowed, each simulated in full)
// and where a value starts (most tokens rejected at their first byte).
void BM_JsonObjectMask(benchmark::State& state) {
  const Fixture& f = fixture();
  if (!f.error.empty()) {
    state.SkipWithError(f.error.c_str());
    return;
  }
  static const auto bytes = std::make_shared<const cleave::engine::TokenBytes>(*f.tokenizer);
  cleave::engine::JsonConstraint constraint(bytes, {*f.tokenizer->eosId()});
  const std::string said = state.range(0) == 0 ? R"({"name": "Fel)" : R"({"name": )";
  for (const TokenId id : f.tokenizer->encode(said, EncodeOptions{.add_special_tokens = false})) {
    constraint.accept(id);
  }
  maskEveryIteration(state, constraint, bytes->size());
  state.SetLabel(state.range(0) == 0 ? "in a string" : "at a value");
}
BENCHMARK(BM_JsonObjectMask)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond)->UseRealTime();

// The same under a JSON schema (a larger state to copy per token simulated): inside a free
// string, where a key starts (only the properties left), where a value starts, and inside
// a number, free or bounded (json_number_bounds.h).
void BM_JsonSchemaMask(benchmark::State& state) {
  const Fixture& f = fixture();
  if (!f.error.empty()) {
    state.SkipWithError(f.error.c_str());
    return;
  }
  static const auto bytes = std::make_shared<const cleave::engine::TokenBytes>(*f.tokenizer);
  static const auto schema = *cleave::engine::JsonSchema::compile(R"({"type": "object",
      "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                     "weight": {"type": "number", "exclusiveMinimum": 0, "maximum": 120},
                     "color": {"enum": ["red", "green", "blue"]},
                     "tags": {"type": "array", "items": {"type": "string"}}},
      "required": ["name", "age"]})");
  cleave::engine::JsonConstraint constraint(bytes, {*f.tokenizer->eosId()}, schema);
  const char* said[] = {R"({"name": "Fel)", R"({"name": "Felix", )", R"({"name": )", R"({"age": 1)",
                        R"({"weight": 1)"};
  for (const TokenId id :
       f.tokenizer->encode(said[state.range(0)], EncodeOptions{.add_special_tokens = false})) {
    constraint.accept(id);
  }
  maskEveryIteration(state, constraint, bytes->size());
  const char* labels[] = {"in a string", "at a key", "at a value", "in a number",
                          "in a bounded number"};
  state.SetLabel(labels[state.range(0)]);
}
BENCHMARK(BM_JsonSchemaMask)->DenseRange(0, 4)->Unit(benchmark::kMicrosecond)->UseRealTime();

// The mask of a regex constraint (regex_constraint.h): a choice among three words at its
// start; a date half written; free text ([a-z ]+) where nearly every token walks to its
// end. Each state's DFA transitions are cached by the first mask, so this is the steady cost.
void BM_RegexMask(benchmark::State& state) {
  const Fixture& f = fixture();
  if (!f.error.empty()) {
    state.SkipWithError(f.error.c_str());
    return;
  }
  static const auto bytes = std::make_shared<const cleave::engine::TokenBytes>(*f.tokenizer);
  const char* patterns[] = {"positive|negative|neutral", R"(\d{4}-\d{2}-\d{2})", "[a-z ]+"};
  const char* said[] = {"", "2026-1", "the quick"};
  auto regex = cleave::engine::Regex::compile(patterns[state.range(0)]);
  cleave::engine::RegexConstraint constraint(bytes, {*f.tokenizer->eosId()}, *regex);
  for (const TokenId id :
       f.tokenizer->encode(said[state.range(0)], EncodeOptions{.add_special_tokens = false})) {
    constraint.accept(id);
  }
  maskEveryIteration(state, constraint, bytes->size());
  const char* labels[] = {"choice", "date", "free text"};
  state.SetLabel(labels[state.range(0)]);
}
BENCHMARK(BM_RegexMask)->DenseRange(0, 2)->Unit(benchmark::kMicrosecond)->UseRealTime();

// The same for a grammar (grammar.h): inside arithmetic, after an open bracket (the stack
// one deep) and inside a number.
void BM_GrammarMask(benchmark::State& state) {
  const Fixture& f = fixture();
  if (!f.error.empty()) {
    state.SkipWithError(f.error.c_str());
    return;
  }
  static const auto bytes = std::make_shared<const cleave::engine::TokenBytes>(*f.tokenizer);
  static const auto grammar = *cleave::engine::Grammar::compile(R"g(
      root   ::= expr
      expr   ::= term (("+" | "-") term)*
      term   ::= [0-9]+ | "(" expr ")")g");
  const char* said[] = {"1+", "(2*(", "(12"};
  cleave::engine::GrammarConstraint constraint(bytes, {*f.tokenizer->eosId()}, grammar);
  for (const TokenId id :
       f.tokenizer->encode(said[state.range(0)], EncodeOptions{.add_special_tokens = false})) {
    constraint.accept(id);
  }
  maskEveryIteration(state, constraint, bytes->size());
  const char* labels[] = {"after an operator", "in brackets", "in a number"};
  state.SetLabel(labels[state.range(0)]);
}
BENCHMARK(BM_GrammarMask)->DenseRange(0, 2)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
