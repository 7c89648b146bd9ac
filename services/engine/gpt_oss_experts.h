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
// float weights copied out transposed, MXFP4 rows regrouped as GGUF MXFP4 blocks (the same
// codes and exponents). A rank takes its experts and, of each, its intermediate columns
// (ShardDims).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "common/model/safetensors_file.h"
#include "services/engine/moe_block.h"
#include "services/engine/tensor_parallel.h"

namespace cleave::engine {

// `groups` MXFP4 groups as OpenAI stores them (`codes`: 16 bytes a group, element 2k in the
// low nibble of byte k; `exps`: an E8M0 exponent each) as GGUF MXFP4 blocks
// (model::TensorType::kMXFP4: the exponent, then element j in the low nibble of byte j and
// element 16 + j in its high nibble), which the CPU's int8 kernels multiply.
std::vector<uint8_t> mxfp4Blocks(const uint8_t* codes, const uint8_t* exps, int64_t groups);

// The rank's experts of layer `layer`: dims.experts of them, each cut to dims.expert_ffn; MXFP4
// projections as GGUF MXFP4 blocks (mxfp4Blocks). With `cpu_kernels` (TpShard::cpu_kernels)
// the matrices are packed for the CPU's kernels and the regrouped copies dropped; without,
// they are kept as stored for another backend to read (cpu::CpuMatrix::asStored).
absl::StatusOr<std::vector<MoeExpert>> loadGptOssExperts(
    const model::SafetensorsCheckpoint& checkpoint, const model::ModelConfig& config,
    const ShardDims& dims, uint32_t layer, bool cpu_kernels = true);

}  // namespace cleave::engine
