// gpt-oss's routed experts as its checkpoints store them, loaded into MoeExperts.
//
// A layer's experts are stacked, one tensor per projection, under
// model.layers.N.mlp.experts.:
//  * as transformers saves them (bf16 or f32), inputs first (the model computes x @ W):
//    gate_up_proj [experts, hidden, 2 ffn] with gate and up columns interleaved (gate i is
//    column 2i, up i column 2i + 1), down_proj [experts, ffn, hidden];
//  * as OpenAI publishes them (MXFP4, config.json "quantization_config": {"quant_method":
//    "mxfp4"}), outputs first: gate_up_proj_blocks [experts, 2 ffn, hidden / 32, 16] U8 of
//    E2M1 codes two per byte (element 2k in the low nibble) with gate_up_proj_scales
//    [experts, 2 ffn, hidden / 32] U8 of E8M0 exponents (one per 32 elements: value = e2m1 x
//    2^(scale - 127)), gate and up rows interleaved the same way; down_proj_blocks and
//    down_proj_scales likewise [experts, hidden, ...];
//  * and biases gate_up_proj_bias [experts, 2 ffn] (interleaved), down_proj_bias
//    [experts, hidden] in either.
// Each expert becomes [rows = outputs, cols = inputs] matrices as the CPU kernels take them:
// float weights copied out transposed, MXFP4 rows copied with their scales as E2M1 block
// scales. A rank takes its experts and, of each, its intermediate columns (ShardDims).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "common/model/safetensors_file.h"
#include "services/engine/moe_block.h"
#include "services/engine/tensor_parallel.h"

namespace cleave::engine {

// MXFP4 rows (`codes`: rows x cols / 2 bytes; `exps`: rows x cols / 32 E8M0 exponents) as
// Q8_0 blocks holding the same values: an E2M1 code is k / 2 with k in {0, 1, 2, 3, 4, 6, 8,
// 12} and a sign, so code x 2^(s - 127) = k x 2^(s - 128), an int8 and a half-float power of
// two per 32 elements. The int8 kernels multiply those at Q8_0's speed (activations rounded to
// int8 per 32, as for every quantized format) where E2M1 is dequantized row by row to floats.
// nullopt when an exponent is beyond a half's range (or NaN).
std::optional<std::shared_ptr<std::vector<uint8_t>>> mxfp4AsQ8_0(const std::vector<uint8_t>& codes,
                                                                 const std::vector<uint8_t>& exps,
                                                                 int64_t rows, int64_t cols);

// The rank's experts of layer `layer`: dims.experts of them, each cut to dims.expert_ffn; MXFP4
// projections as Q8_0 (mxfp4AsQ8_0) where their exponents allow, else E2M1.
absl::StatusOr<std::vector<MoeExpert>> loadGptOssExperts(
    const model::SafetensorsCheckpoint& checkpoint, const model::ModelConfig& config,
    const ShardDims& dims, uint32_t layer);

}  // namespace cleave::engine
