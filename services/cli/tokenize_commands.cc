// `cleave tokenize` and `cleave detokenize`: check a model's tokenization by hand.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "common/flags.h"
#include "common/tokenizer/tokenizer.h"
#include "services/cli/commands.h"

namespace cleave::cli {
namespace {

int fail(const char* command, const absl::Status& status) {
  std::fprintf(stderr, "%s: %s\n", command, std::string(status.message()).c_str());
  return 1;
}

}  // namespace

int runTokenize(int argc, char** argv) {
  std::string model;
  bool json = false;
  bool add_special = true;
  bool parse_special = false;
  FlagSet flags("cleave tokenize", "--model MODEL [flags] TEXT",
                "Prints the token ids of TEXT (\"-\" reads standard input), space-separated; "
                "--json prints each id with its vocabulary piece.");
  flags.addString("model", &model, "A GGUF file, a tokenizer.json, or a model folder");
  flags.addBool("json", &json, "Print [{\"id\": ..., \"piece\": ...}, ...] instead");
  flags.addBool("add-special", &add_special, "Add the model's special tokens (e.g. BOS)");
  flags.addBool("parse-special", &parse_special,
                "Read special-token text such as <|im_start|> as that token");
  std::vector<std::string> positional = parseFlagsOrExit(flags, argc, argv);
  if (model.empty()) exitWithUsageError(flags, absl::InvalidArgumentError("--model is required"));
  if (positional.size() != 1) {
    exitWithUsageError(flags, absl::InvalidArgumentError("give exactly one TEXT (quote it)"));
  }
  std::string text = positional[0];
  if (text == "-") text.assign(std::istreambuf_iterator<char>(std::cin), {});
  auto tokenizer = tokenizer::Tokenizer::load(model);
  if (!tokenizer.ok()) return fail("cleave tokenize", tokenizer.status());
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
