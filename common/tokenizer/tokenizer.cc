// Tokenizer's factories: dispatch on what the path holds.
#include "common/tokenizer/tokenizer.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/model/gguf_file.h"
#include "common/status_macros.h"
#include "common/tokenizer/loaders.h"

namespace cleave::tokenizer {
namespace {

// tokenizer.json files of real models are up to a few tens of MB.
constexpr size_t kMaxJsonBytes = size_t{256} << 20;
constexpr size_t kMaxConfigBytes = size_t{16} << 20;

bool startsWithGgufMagic(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  char magic[4] = {};
  const size_t n = std::fread(magic, 1, 4, f);
  std::fclose(f);
  return n == 4 && absl::string_view(magic, 4) == "GGUF";
}

// tokenizer.json plus an optional tokenizer_config.json beside it.
absl::StatusOr<std::unique_ptr<Tokenizer>> loadJsonWithConfig(const std::string& json_path,
                                                              const std::string& config_path) {
  CLEAVE_ASSIGN_OR_RETURN(std::string json, readFileLimited(json_path, kMaxJsonBytes));
  std::error_code ec;
  if (!std::filesystem::is_regular_file(config_path, ec)) {
    return buildFromTokenizerJson(json, json_path, nullptr);
  }
  CLEAVE_ASSIGN_OR_RETURN(std::string config_text, readFileLimited(config_path, kMaxConfigBytes));
  CLEAVE_ASSIGN_OR_RETURN(TokenizerConfig config, parseTokenizerConfig(config_text, config_path));
  return buildFromTokenizerJson(json, json_path, &config);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::load(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path p(path);
  if (std::filesystem::is_directory(p, ec)) {
    const std::filesystem::path json = p / "tokenizer.json";
    if (!std::filesystem::is_regular_file(json, ec)) {
      return absl::NotFoundError(
          absl::StrCat(path,
                       ": no tokenizer.json in this folder (pass a .gguf file, a "
                       "tokenizer.json or a folder holding one)"));
    }
    return loadJsonWithConfig(json.string(), (p / "tokenizer_config.json").string());
  }
  if (!std::filesystem::exists(p, ec)) {
    return absl::NotFoundError(absl::StrCat(path, ": no such file or folder"));
  }
  if (absl::EndsWith(path, ".gguf") || startsWithGgufMagic(path)) {
    CLEAVE_ASSIGN_OR_RETURN(std::unique_ptr<model::GgufFile> file, model::GgufFile::open(path));
    return fromGguf(*file);
  }
  return loadJsonWithConfig(path, (p.parent_path() / "tokenizer_config.json").string());
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::fromTokenizerJson(const std::string& path) {
  CLEAVE_ASSIGN_OR_RETURN(std::string json, readFileLimited(path, kMaxJsonBytes));
  return buildFromTokenizerJson(json, path, nullptr);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::fromTokenizerJsonText(
    absl::string_view json, const std::string& name) {
  return buildFromTokenizerJson(json, name, nullptr);
}

}  // namespace cleave::tokenizer
