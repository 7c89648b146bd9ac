#include "services/loadgen/workload.h"

#include <algorithm>
#include <random>

namespace cleave::loadgen {

PlannedRequest Workload::at(uint64_t index) const {
  std::seed_seq seq{options_.seed, index, uint64_t{0x6c6f6164}};
  std::mt19937_64 rng(seq);
  PlannedRequest request;
  request.index = index;
  uint32_t prompt_tokens = 0;
  if (!options_.shapes.empty()) {
    const RequestShape& shape = options_.shapes[index % options_.shapes.size()];
    request.prompt_text = shape.prompt;
    prompt_tokens = shape.prompt_tokens;
    request.output_tokens = shape.output_tokens;
  } else {
    prompt_tokens = options_.prompt_len.sample(rng);
    request.output_tokens = options_.output_len.sample(rng);
  }
  std::uniform_int_distribution<uint32_t> token(options_.vocab_size / 16, options_.vocab_size - 1);
  if (!request.prompt_text.empty()) return request;
  request.prompt_ids.reserve(options_.shared_prefix_len + prompt_tokens);
  if (options_.shared_prefix_len > 0) {
    const uint64_t group = index % std::max<uint32_t>(options_.prefix_groups, 1);
    std::seed_seq prefix_seq{options_.seed, group, uint64_t{0x70726566}};
    std::mt19937_64 prefix_rng(prefix_seq);
    for (uint32_t i = 0; i < options_.shared_prefix_len; ++i)
      request.prompt_ids.push_back(token(prefix_rng));
  }
  for (uint32_t i = 0; i < prompt_tokens; ++i) request.prompt_ids.push_back(token(rng));
  return request;
}

}  // namespace cleave::loadgen
