#include "common/model/fingerprint.h"

#include <openssl/evp.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/mapped_file.h"
#include "common/status_macros.h"

namespace cleave::model {
namespace {

struct FreeDigest {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};

}  // namespace

std::string modelIdFromPath(const std::string& path) {
  std::filesystem::path p(path);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();  // "dir/" -> "dir"
  std::string name = p.filename().string();
  if (name.size() > 5 && name.ends_with(".gguf")) name.resize(name.size() - 5);
  return name;
}

absl::StatusOr<std::string> modelSha256(const std::string& path) {
  std::vector<std::string> files;
  if (std::filesystem::is_directory(path)) {
    files.push_back((std::filesystem::path(path) / "config.json").string());
    std::vector<std::string> shards;
    for (const auto& entry : std::filesystem::directory_iterator(path)) {
      if (entry.path().extension() == ".safetensors") shards.push_back(entry.path().string());
    }
    std::sort(shards.begin(), shards.end());
    files.insert(files.end(), shards.begin(), shards.end());
  } else {
    files.push_back(path);
  }
  return filesSha256(files);
}

absl::StatusOr<std::string> filesSha256(const std::vector<std::string>& files) {
  std::unique_ptr<EVP_MD_CTX, FreeDigest> ctx(EVP_MD_CTX_new());
  EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr);
  for (const std::string& file : files) {
    CLEAVE_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> mapped, MappedFile::open(file));
    const std::string name = std::filesystem::path(file).filename().string();
    EVP_DigestUpdate(ctx.get(), name.data(), name.size());
    EVP_DigestUpdate(ctx.get(), mapped->data(), mapped->size());
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &length);
  std::string hex;
  for (unsigned int i = 0; i < length; ++i)
    absl::StrAppend(&hex, absl::Hex(digest[i], absl::kZeroPad2));
  return hex;
}

}  // namespace cleave::model
