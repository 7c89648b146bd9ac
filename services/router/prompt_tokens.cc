#include "services/router/prompt_tokens.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace cleave::router {

absl::StatusOr<const WorkerPool::AdapterView*> adapterNamed(const WorkerPool::ModelView& model,
                                                            const std::string& name) {
  if (model.isBase(name)) return nullptr;
  if (const WorkerPool::AdapterView* adapter = model.adapter(name)) return adapter;
  return absl::NotFoundError(
      absl::StrCat("unknown model '", name, "'; this router serves ", model.served()));
}

absl::Status truncatePrompt(int32_t keep, int64_t context_length, std::vector<uint32_t>& prompt) {
  if (keep == 0) return absl::OkStatus();
  if (keep < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("truncate_prompt_tokens: ", keep,
                     " is neither a number of tokens to keep nor -1 (as many as the context "
                     "allows)"));
  }
  const size_t kept = keep > 0 ? static_cast<size_t>(keep)
                               : static_cast<size_t>(std::max<int64_t>(context_length - 1, 1));
  if (prompt.size() > kept) prompt.erase(prompt.begin(), prompt.end() - kept);
  return absl::OkStatus();
}

absl::Status checkVocabulary(std::span<const uint32_t> ids, uint32_t vocab_size,
                             const char* field) {
  for (uint32_t id : ids) {
    if (id >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": id ", id, " is outside the vocabulary (", vocab_size, " tokens)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace cleave::router
