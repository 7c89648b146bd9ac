// Weights of a Llama-family model (Llama 2/3, SmolLM2) in the CPU backend's layout, loaded
// from a GGUF file. Matrices become CpuMatrix (quantized ones repacked once); norms become
// float vectors. The GGUF file stays mapped: the embedding table is read from it in place.
//
// Threading: immutable after load.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/gguf_file.h"
#include "common/model/model_config.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/rope.h"

namespace cleave::engine {

struct LlamaLayer {
  std::vector<float> attn_norm;  // [hidden]
  cpu::CpuMatrix wq;             // [heads * head_dim, hidden]
  cpu::CpuMatrix wk;             // [kv_heads * head_dim, hidden]
  cpu::CpuMatrix wv;             // [kv_heads * head_dim, hidden]
  cpu::CpuMatrix wo;             // [hidden, heads * head_dim]
  std::vector<float> ffn_norm;   // [hidden]
  cpu::CpuMatrix w_gate;         // [intermediate, hidden]
  cpu::CpuMatrix w_up;           // [intermediate, hidden]
  cpu::CpuMatrix w_down;         // [hidden, intermediate]
};

struct LlamaWeights {
  model::ModelConfig config;
  cpu::RopePairing rope_pairing = cpu::RopePairing::kAdjacent;
  std::unique_ptr<model::GgufFile> file;  // Keeps the embedding table mapped.
  const model::GgufTensor* token_embd = nullptr;  // [vocab, hidden] rows in stored format.
  std::vector<LlamaLayer> layers;
  std::vector<float> output_norm;  // [hidden]
  cpu::CpuMatrix output;           // [vocab, hidden]; the embedding table when tied.
  // Bytes a decode step streams for the weights (all matrices + norms + one embedding row).
  int64_t weightBytes() const;
};

// Loads `path` (a GGUF file of a dense Llama-family model). Errors name the file and the
// tensor that is missing or has the wrong shape.
absl::StatusOr<std::unique_ptr<LlamaWeights>> loadLlamaGguf(const std::string& path);

}  // namespace cleave::engine
