// A LoRA adapter as PEFT saves one (adapter_config.json + adapter_model.safetensors), held
// by one rank of a tensor-parallel group: for each projection it targets, the low-rank
// update a request naming the adapter adds to the base model's product,
//
//   y += scale * B (A x)      A: [r, in], B: [out, r], scale = lora_alpha / r
//                             (lora_alpha / sqrt(r) with use_rslora)
//
// Sharded as the projection is (tensor_parallel.h): a column-parallel projection (Q, K, V,
// gate, up) keeps the rows of B for this rank's outputs and all of A; a row-parallel one (O,
// down) keeps the columns of A for this rank's inputs and all of B. The rank's update of a
// row-parallel product is then a partial sum too — B (A_r x_r) summed over the ranks is
// B (A x) — so it is added before the all-reduce and costs no collective.
//
// Targets: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj of Llama-family
// layers (Llama, Mistral, Qwen2, Qwen3, and the attention of Mixtral / Qwen3-MoE layers).
// Refused with a message naming the file and field: embeddings, the lm-head, experts,
// latent-attention (DeepSeek) models, DoRA, bias training, fan_in_fan_out, rank or alpha
// patterns, modules_to_save.
//
// Threading: immutable after load.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/engine/llama_weights.h"

namespace cleave::engine {

enum class LoraTarget { kQ, kK, kV, kO, kGate, kUp, kDown };
inline constexpr int kLoraTargets = 7;

// PEFT's module name of `target` ("q_proj", ...).
const char* loraTargetName(LoraTarget target);

// One projection's update on this rank, the scale folded into B.
struct LoraProjection {
  int64_t r = 0, in = 0, out = 0;
  std::vector<float> a;   // [r, in]: for O and down, this rank's input columns
  std::vector<float> bt;  // B transposed, [r, out]: for Q, K, V, gate and up, this rank's rows
};

struct LoraAdapter {
  std::string name;    // What requests call it.
  std::string folder;  // Where it was loaded from.
  std::string sha256;  // Of adapter_config.json and the weights file (model::filesSha256).
  int64_t rank = 0;    // r
  float scale = 0;     // lora_alpha / r, or / sqrt(r)
  // [layer][target]: unset where the adapter leaves the projection alone.
  std::vector<std::array<std::optional<LoraProjection>, kLoraTargets>> layers;

  const LoraProjection* find(int64_t layer, LoraTarget target) const {
    const auto& p = layers[layer][static_cast<int>(target)];
    return p ? &*p : nullptr;
  }
  // Bytes of this rank's A and B (float32).
  int64_t bytes() const;
};

// Loads the adapter in `folder` for rank `base.dims` of the model `base`, naming it `name`.
// Errors name the file and the field or tensor: a missing or malformed file, a config this
// loader does not run (above), a tensor of an unknown module, a layer past the model's, a
// shape that does not fit the model, A without B.
absl::StatusOr<std::shared_ptr<const LoraAdapter>> loadLoraAdapter(const std::string& name,
                                                                   const std::string& folder,
                                                                   const LlamaWeights& base);

// One --lora-modules entry: NAME=PATH.
struct LoraModuleSpec {
  std::string name;
  std::string path;
};
// Parses "NAME=PATH[,NAME=PATH...]": names of letters, digits and ._-/: (at most 128), each
// once. InvalidArgument naming the entry otherwise.
absl::StatusOr<std::vector<LoraModuleSpec>> parseLoraModules(const std::string& text);

}  // namespace cleave::engine
