// For the constrained-decoding tests: walks a reply through a JsonConstraint and checks its
// mask token by token against the grammar it stands for.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "services/engine/json_constraint.h"

namespace cleave::engine {

// SmolLM2's token bytes and its end-of-sequence token; null when the model is missing.
inline std::shared_ptr<const TokenBytes> smolLm2TokenBytes(uint32_t& end) {
  const std::string model = std::string(CLEAVE_MODEL_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(model)) return nullptr;
  auto tokenizer = tokenizer::Tokenizer::load(model);
  if (!tokenizer.ok()) return nullptr;
  end = *(*tokenizer)->eosId();
  return std::make_shared<const TokenBytes>(**tokenizer);
}

// Feeds `reply` to `constraint` as one-byte tokens, `stride` bytes at a time, and at each
// stop expects its mask to allow exactly the tokens whose bytes a copy of `grammar` (fed
// alike) takes, and `end` only once the grammar is complete.
template <class Grammar>
void expectMaskExact(JsonConstraint& constraint, Grammar grammar, const TokenBytes& bytes,
                     uint32_t end, const std::string& reply, size_t stride) {
  for (size_t at = 0; at <= reply.size(); at += stride) {
    std::vector<float> logits(bytes.size(), 0.0f);
    constraint.mask(logits);
    for (uint32_t id = 0; id < bytes.size(); ++id) {
      Grammar next = grammar;
      const bool want = id == end
                            ? grammar.complete()
                            : !grammar.complete() && !bytes[id].empty() && next.pushAll(bytes[id]);
      ASSERT_EQ(!std::isinf(logits[id]), want)
          << "token " << id << " '" << bytes[id] << "' after " << reply.substr(0, at);
    }
    for (size_t k = at; k < std::min(at + stride, reply.size()); ++k) {
      ASSERT_TRUE(grammar.push(static_cast<uint8_t>(reply[k]))) << reply.substr(0, k + 1);
      const std::vector<uint32_t>& ids = bytes.startingWith(static_cast<uint8_t>(reply[k]));
      const auto one =
          std::find_if(ids.begin(), ids.end(), [&](uint32_t id) { return bytes[id].size() == 1; });
      ASSERT_NE(one, ids.end()) << "no one-byte token for " << int(static_cast<uint8_t>(reply[k]));
      ASSERT_TRUE(constraint.accept(*one));
    }
  }
  EXPECT_TRUE(constraint.complete());
}

}  // namespace cleave::engine
