#include "services/engine/cuda_moe_layer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/model/tensor_type.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/moe_routing.h"
#include "kernels/cuda/quantize_rows.h"
#include "kernels/cuda/sigmoid_gate.h"
#include "services/engine/cuda_weights.h"

namespace cleave::engine {
namespace {

using bf16 = __nv_bfloat16;
using cuda::ExpertWeightFormat;

}  // namespace

absl::StatusOr<CudaMoeShape> cudaMoeShape(const model::ModelConfig& c, const ShardDims& dims,
                                          std::span<const MoeBlock* const> blocks,
                                          ExpertWeightFormat format, int64_t max_tokens,
                                          int64_t max_decode) {
  if (!c.moe) return absl::InvalidArgumentError("the model has no mixture-of-experts layers");
  CudaMoeShape s;
  s.routing = *c.moe;
  s.hidden = c.hidden_size;
  s.inter = dims.expert_ffn.size;
  s.expert_begin = dims.experts.begin;
  s.local_experts = dims.experts.size;
  s.shared_inter = c.moe->shared_experts > 0 ? dims.shared_ffn.size : 0;
  s.shared_gate = s.shared_inter > 0 && c.moe->shared_expert_gate;
  s.router_bias = c.moe->router_bias;
  s.gate_up_bias = c.moe->expert_bias;
  s.down_bias = c.moe->expert_bias && dims.expert_ffn.begin == 0;
  if (c.moe->swiglu_limit > 0)
    s.activation = {.limit = static_cast<float>(c.moe->swiglu_limit),
                    .alpha = static_cast<float>(c.moe->swiglu_alpha)};
  if (s.local_experts < 1) return absl::InvalidArgumentError("a rank without experts");
  if (!blocks.empty()) {
    if (blocks[0]->experts.empty()) return absl::InvalidArgumentError("a MoE layer has no experts");
    const ExpertWeightFormat first = nativeFormat(blocks[0]->experts[0].gate);
    format = first;
    for (const MoeBlock* block : blocks) {
      for (const MoeExpert& e : block->experts) {
        if (nativeFormat(e.gate) != first || nativeFormat(e.up) != first ||
            nativeFormat(e.down) != first) {
          format = ExpertWeightFormat::kBf16;
        }
      }
    }
    if (format != first) {
      CLEAVE_LOG(INFO) << "experts stored in more than one format: all widened to bf16 on the GPU";
    }
  }
  const int64_t align = format == ExpertWeightFormat::kFp8Block128 ? 128
                        : format == ExpertWeightFormat::kNvfp4     ? 32
                                                                   : 1;
  if (s.hidden % align != 0 || s.inter % align != 0) format = ExpertWeightFormat::kBf16;
  if (s.hidden % 32 != 0 || s.inter % 32 != 0) {
    return absl::UnimplementedError(absl::StrCat(
        "the CUDA expert GEMM needs hidden and expert intermediate sizes that are multiples of "
        "32 (this model: ",
        s.hidden, " and ", s.inter, ")"));
  }
  s.format = format;
  const int experts = static_cast<int>(s.local_experts);
  const int k = static_cast<int>(c.moe->experts_per_token);
  CLEAVE_ASSIGN_OR_RETURN(s.decode_plan, cuda::planMoeLayout(max_decode, k, experts, 16));
  CLEAVE_ASSIGN_OR_RETURN(s.prefill_plan, cuda::planMoeLayout(max_tokens, k, experts, 64));
  return s;
}

CudaMoeWeights placeMoeWeights(Arena& arena, const CudaMoeShape& s) {
  CudaMoeWeights w;
  const int64_t all = s.routing.num_experts;
  w.router = arena.take<bf16>(all * s.hidden);
  if (s.routing.score_correction_bias) w.score_bias = arena.take<float>(all);
  if (s.router_bias) w.router_bias = arena.take<float>(all);
  w.gate_up = placeWeights(arena, s.format, s.experts(), 2 * s.inter, s.hidden);
  if (s.gate_up_bias) w.gate_up_bias = arena.take<bf16>(s.experts() * 2 * s.inter);
  w.down = placeWeights(arena, s.format, s.experts(), s.hidden, s.inter);
  if (s.down_bias) w.down_bias = arena.take<bf16>(s.experts() * s.hidden);
  if (s.shared_inter > 0) {
    w.shared_gu = arena.take<bf16>(2 * s.shared_inter * s.hidden);
    w.shared_down = arena.take<bf16>(s.hidden * s.shared_inter);
    if (s.shared_gate) w.shared_gate = arena.take<float>(s.hidden);
  }
  return w;
}

CudaMoeWorkspace placeMoeWorkspace(Arena& arena, const CudaMoeShape& s) {
  const int64_t tokens = s.prefill_plan.max_tokens;
  const int64_t rows = std::max(s.decode_plan.max_rows, s.prefill_plan.max_rows);
  CudaMoeWorkspace ws;
  ws.router_logits = arena.take<float>(tokens * int64_t{s.routing.num_experts});
  ws.expert_ids = arena.take<int32_t>(tokens * s.k());
  ws.route_weights = arena.take<float>(tokens * s.k());
  ws.layout = arena.take<uint8_t>(static_cast<int64_t>(
      std::max(s.decode_plan.workspace_bytes, s.prefill_plan.workspace_bytes)));
  ws.act = arena.take<bf16>(rows * s.inter);
  ws.y = arena.take<bf16>(rows * s.hidden);
  if (s.shared_inter > 0) {
    ws.shared_gu = arena.take<bf16>(tokens * 2 * s.shared_inter);
    ws.shared_out = arena.take<bf16>(tokens * s.hidden);
  }
  ws.quantized_bytes = std::max(cuda::nativeScratchBytes(s.format, tokens, s.hidden),
                                cuda::nativeScratchBytes(s.format, rows, s.inter));
  if (ws.quantized_bytes > 0) ws.quantized = arena.take<uint8_t>(ws.quantized_bytes);
  return ws;
}

int64_t moeExpertBytes(const CudaMoeShape& s) {
  return matrixBytes(s.format, 2 * s.inter, s.hidden) + matrixBytes(s.format, s.hidden, s.inter);
}

int64_t moeWeightBytes(const CudaMoeShape& s) {
  Arena count;
  CudaMoeWeights w = placeMoeWeights(count, s);
  (void)w;
  return count.used();
}

absl::Status uploadMoe(const MoeBlock& block, const CudaMoeShape& s, const CudaMoeWeights& dst) {
  if (block.expert_begin != s.expert_begin ||
      static_cast<int64_t>(block.experts.size()) != s.experts())
    return absl::InvalidArgumentError("a MoE layer's experts are not this rank's");
  CLEAVE_RETURN_IF_ERROR(uploadDequantized(block.router, dst.router, "the router"));
  const int64_t all = s.routing.num_experts;
  // A bias vector of the layer: `size` values where the shape expects them, none otherwise.
  auto biasOk = [](const std::vector<float>& v, bool expected, int64_t size, const char* what) {
    if (expected ? static_cast<int64_t>(v.size()) == size : v.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("a MoE layer's ", what, " has ", v.size(),
                                                   " values; expected ", expected ? size : 0));
  };
  CLEAVE_RETURN_IF_ERROR(biasOk(block.score_bias, dst.score_bias != nullptr, all, "score bias"));
  CLEAVE_RETURN_IF_ERROR(biasOk(block.router_bias, s.router_bias, all, "router bias"));
  if (dst.score_bias != nullptr)
    CLEAVE_RETURN_IF_ERROR(
        uploadBytes(dst.score_bias, block.score_bias.data(), all * 4, "the score bias"));
  if (s.router_bias)
    CLEAVE_RETURN_IF_ERROR(
        uploadBytes(dst.router_bias, block.router_bias.data(), all * 4, "the router bias"));
  for (int64_t e = 0; e < s.experts(); ++e) {
    const MoeExpert& x = block.experts[e];
    CLEAVE_RETURN_IF_ERROR(uploadRows(x.gate, dst.gate_up, e, 0, "an expert's gate"));
    CLEAVE_RETURN_IF_ERROR(uploadRows(x.up, dst.gate_up, e, s.inter, "an expert's up"));
    CLEAVE_RETURN_IF_ERROR(uploadRows(x.down, dst.down, e, 0, "an expert's down"));
    CLEAVE_RETURN_IF_ERROR(biasOk(x.gate_bias, s.gate_up_bias, s.inter, "expert gate bias"));
    CLEAVE_RETURN_IF_ERROR(biasOk(x.up_bias, s.gate_up_bias, s.inter, "expert up bias"));
    CLEAVE_RETURN_IF_ERROR(biasOk(x.down_bias, s.down_bias, s.hidden, "expert down bias"));
    if (s.gate_up_bias) {
      bf16* at = dst.gate_up_bias + e * 2 * s.inter;
      CLEAVE_RETURN_IF_ERROR(uploadBf16(x.gate_bias, at, "an expert's gate bias"));
      CLEAVE_RETURN_IF_ERROR(uploadBf16(x.up_bias, at + s.inter, "an expert's up bias"));
    }
    if (s.down_bias)
      CLEAVE_RETURN_IF_ERROR(
          uploadBf16(x.down_bias, dst.down_bias + e * s.hidden, "an expert's down bias"));
  }
  if (s.shared_inter > 0) {
    if (!block.shared)
      return absl::InvalidArgumentError("the config has shared experts, the layer none");
    const int64_t gate_elements = block.shared->gate.rows() * block.shared->gate.cols();
    CLEAVE_RETURN_IF_ERROR(
        uploadDequantized(block.shared->gate, dst.shared_gu, "the shared experts' gate"));
    CLEAVE_RETURN_IF_ERROR(uploadDequantized(block.shared->up, dst.shared_gu + gate_elements,
                                             "the shared experts' up"));
    CLEAVE_RETURN_IF_ERROR(
        uploadDequantized(block.shared->down, dst.shared_down, "the shared experts' down"));
    if (block.shared_gate.empty() == s.shared_gate)
      return absl::InvalidArgumentError(
          "a MoE layer's shared_expert_gate does not match the config's (present or not)");
    if (s.shared_gate)
      CLEAVE_RETURN_IF_ERROR(
          uploadF32(block.shared_gate, dst.shared_gate, s.hidden, "shared_expert_gate"));
  }
  return absl::OkStatus();
}

absl::Status fillRandomMoe(const CudaMoeShape& s, const CudaMoeWeights& w, uint64_t seed,
                           cudaStream_t stream) {
  uint64_t id = seed;
  auto fill = [&](void* p, int64_t count, float scale) {
    return cuda::fillUniform(static_cast<bf16*>(p), count, -scale, scale,
                             id++ * 0x9e3779b97f4a7c15ull, stream);
  };
  const float in_scale = 1.0f / std::sqrt(static_cast<float>(s.hidden));
  const float inter_scale = 1.0f / std::sqrt(static_cast<float>(s.inter));
  CLEAVE_RETURN_IF_ERROR(fill(w.router, int64_t{s.routing.num_experts} * s.hidden, in_scale));
  for (const cuda::ExpertWeights* x : {&w.gate_up, &w.down}) {
    const float scale = x == &w.down ? inter_scale : in_scale;
    const int64_t n = int64_t{x->experts} * x->rows * x->cols;
    if (s.format == ExpertWeightFormat::kBf16) {
      CLEAVE_RETURN_IF_ERROR(fill(const_cast<void*>(x->data), n, scale));
    } else if (s.format == ExpertWeightFormat::kNvfp4) {
      // Any byte is two valid codes; scales 0.5 (e4m3 0x30) times a row scale keep the
      // weights within +-scale.
      CLEAVE_RETURN_IF_ERROR(fill(const_cast<void*>(x->data), n / 4, 1.0f));
      CLEAVE_RETURN_IF_ERROR(cuda::cudaStatus(
          cudaMemsetAsync(const_cast<uint8_t*>(x->group_scales), 0x30, n / 16, stream),
          "random NVFP4 scales"));
      const std::vector<float> rows(int64_t{x->experts} * x->rows, scale / 3.0f);
      CLEAVE_RETURN_IF_ERROR(uploadBytes(const_cast<float*>(x->row_scales), rows.data(),
                                         rows.size() * 4, "random NVFP4 row scales"));
    } else {
      // FP8, 128 x 128 blocks: uniform values quantized to e4m3 codes (every code finite),
      // block scales scale / 448 so the weights stay within +-scale.
      const int64_t rows = int64_t{x->experts} * x->rows;
      bf16* values = nullptr;
      float* row_scales = nullptr;
      CLEAVE_RETURN_IF_ERROR(cuda::cudaStatus(
          cudaMalloc(reinterpret_cast<void**>(&values), static_cast<size_t>(n) * sizeof(bf16)),
          "random FP8 staging"));
      absl::Status made =
          cuda::cudaStatus(cudaMalloc(reinterpret_cast<void**>(&row_scales),
                                      static_cast<size_t>(rows * (x->cols / 128)) * 4),
                           "random FP8 staging");
      if (made.ok()) made = fill(values, n, 1.0f);
      if (made.ok())
        made =
            cuda::quantizeRows({.x = values,
                                .x_stride = x->cols,
                                .rows = rows,
                                .k = x->cols,
                                .out = {.codes = static_cast<uint8_t*>(const_cast<void*>(x->data)),
                                        .scales = row_scales}},
                               stream);
      if (made.ok()) made = cuda::cudaStatus(cudaStreamSynchronize(stream), "random FP8 codes");
      cudaFree(values);
      cudaFree(row_scales);
      CLEAVE_RETURN_IF_ERROR(made);
      const std::vector<float> blocks(
          int64_t{x->experts} * ((x->rows + 127) / 128) * (x->cols / 128), scale / 448.0f);
      CLEAVE_RETURN_IF_ERROR(uploadBytes(const_cast<float*>(x->block_scales), blocks.data(),
                                         blocks.size() * 4, "random FP8 block scales"));
    }
  }
  if (w.shared_gu != nullptr) {
    CLEAVE_RETURN_IF_ERROR(fill(w.shared_gu, 2 * s.shared_inter * s.hidden, in_scale));
    CLEAVE_RETURN_IF_ERROR(fill(w.shared_down, s.hidden * s.shared_inter,
                                1.0f / std::sqrt(static_cast<float>(s.shared_inter))));
  }
  if (w.shared_gate != nullptr)
    CLEAVE_RETURN_IF_ERROR(cuda::fillUniform(w.shared_gate, s.hidden, -in_scale, in_scale,
                                             id++ * 0x9e3779b97f4a7c15ull, stream));
  for (float* bias : {w.score_bias, w.router_bias}) {
    if (bias == nullptr) continue;
    CLEAVE_RETURN_IF_ERROR(cuda::cudaStatus(
        cudaMemsetAsync(bias, 0, s.routing.num_experts * 4, stream), "random router biases"));
  }
  if (w.gate_up_bias != nullptr)
    CLEAVE_RETURN_IF_ERROR(fill(w.gate_up_bias, s.experts() * 2 * s.inter, 0.1f));
  if (w.down_bias != nullptr)
    CLEAVE_RETURN_IF_ERROR(fill(w.down_bias, s.experts() * s.hidden, 0.1f));
  return absl::OkStatus();
}

absl::Status enqueueMoe(const CudaMoeShape& s, const CudaMoeWeights& w, const CudaMoeWorkspace& ws,
                        const bf16* h, int64_t n, bool decode, bf16* out, cuda::Gemm& gemm,
                        cudaStream_t stream) {
  const int64_t experts = s.routing.num_experts, k = s.k();
  CLEAVE_RETURN_IF_ERROR(gemm.run({.x = h,
                                   .x_stride = s.hidden,
                                   .w = w.router,
                                   .tokens = n,
                                   .out = experts,
                                   .in = s.hidden,
                                   .y = ws.router_logits,
                                   .y_stride = experts,
                                   .y_float = true},
                                  stream));
  const bool sigmoid = s.routing.scoring == model::MoeScoring::kSigmoid;
  CLEAVE_RETURN_IF_ERROR(cuda::routeExperts(
      {.logits = ws.router_logits,
       .logit_bias = w.router_bias,
       .stride = experts,
       .tokens = n,
       .experts = static_cast<int>(experts),
       .k = static_cast<int>(k),
       .scoring = sigmoid ? cuda::MoeScoring::kSigmoidGrouped : cuda::MoeScoring::kSoftmax,
       .bias = w.score_bias,
       .n_group = static_cast<int>(s.routing.n_group),
       .topk_group = static_cast<int>(s.routing.topk_group),
       .normalize = s.routing.norm_topk_prob,
       .scaling = static_cast<float>(s.routing.routed_scaling_factor),
       .expert_ids = ws.expert_ids,
       .weights = ws.route_weights},
      stream));
  const cuda::MoeLayoutPlan& plan = decode ? s.decode_plan : s.prefill_plan;
  const cuda::MoeLayout layout = cuda::carveMoeLayout(plan, ws.layout);
  CLEAVE_RETURN_IF_ERROR(cuda::buildMoeLayout(plan, ws.expert_ids, n, layout, stream,
                                              static_cast<int>(s.expert_begin)));
  CLEAVE_RETURN_IF_ERROR(cuda::runMoeGemm({.plan = &plan,
                                           .layout = layout,
                                           .x = h,
                                           .x_stride = s.hidden,
                                           .gather = true,
                                           .weights = w.gate_up,
                                           .bias = w.gate_up_bias,
                                           .silu_mul = true,
                                           .activation = s.activation,
                                           .y = ws.act,
                                           .y_stride = s.inter,
                                           .operands = s.operands,
                                           .tokens = n,
                                           .scratch = ws.quantized,
                                           .scratch_bytes = ws.quantized_bytes},
                                          stream));
  CLEAVE_RETURN_IF_ERROR(cuda::runMoeGemm({.plan = &plan,
                                           .layout = layout,
                                           .x = ws.act,
                                           .x_stride = s.inter,
                                           .weights = w.down,
                                           .bias = w.down_bias,
                                           .y = ws.y,
                                           .y_stride = s.hidden,
                                           .operands = s.operands,
                                           .scratch = ws.quantized,
                                           .scratch_bytes = ws.quantized_bytes},
                                          stream));
  if (s.shared_inter > 0) {
    const int64_t si = s.shared_inter;
    CLEAVE_RETURN_IF_ERROR(gemm.run({.x = h,
                                     .x_stride = s.hidden,
                                     .w = w.shared_gu,
                                     .tokens = n,
                                     .out = 2 * si,
                                     .in = s.hidden,
                                     .y = ws.shared_gu,
                                     .y_stride = 2 * si},
                                    stream));
    CLEAVE_RETURN_IF_ERROR(cuda::siluMul(ws.shared_gu, ws.shared_gu + si, 2 * si, n, si,
                                         ws.shared_gu, 2 * si, stream));
    CLEAVE_RETURN_IF_ERROR(gemm.run({.x = ws.shared_gu,
                                     .x_stride = 2 * si,
                                     .w = w.shared_down,
                                     .tokens = n,
                                     .out = s.hidden,
                                     .in = si,
                                     .y = ws.shared_out,
                                     .y_stride = s.hidden},
                                    stream));
    if (s.shared_gate)  // Each token's shared output times σ(h · gate).
      CLEAVE_RETURN_IF_ERROR(cuda::sigmoidRowGate(ws.shared_out, s.hidden, h, s.hidden,
                                                  w.shared_gate, s.hidden, n, s.hidden, stream));
  }
  return cuda::combineExperts({.y = ws.y,
                               .y_stride = s.hidden,
                               .weights = ws.route_weights,
                               .pair_row = layout.pair_row,
                               .tokens = n,
                               .k = static_cast<int>(k),
                               .hidden = static_cast<int>(s.hidden),
                               .shared = s.shared_inter > 0 ? ws.shared_out : nullptr,
                               .shared_stride = s.hidden,
                               .out = out,
                               .out_stride = s.hidden},
                              stream);
}

}  // namespace cleave::engine
