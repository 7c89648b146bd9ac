#include "services/engine/gpt_oss_experts.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace cleave::engine {
namespace {

using model::SafetensorsTensor;
using model::TensorType;

constexpr int64_t kMxfp4Group = 32;  // Elements per E8M0 scale.

// Output rows of one expert's projection, as the stacked tensor stores them: row r of the
// model's matrix is stored row (or column) offset + stride * r (gate: 0, 2; up: 1, 2).
struct Picked {
  Span rows;  // Of the model's matrix, in its own numbering.
  Span cols;  // Input columns kept.
  int64_t stride = 1;
  int64_t offset = 0;
  int64_t storedRow(int64_t r) const { return offset + stride * (rows.begin + r); }
};

std::string shapeText(const std::vector<uint64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<const SafetensorsTensor*> tensorOf(const model::SafetensorsCheckpoint& ckpt,
                                                  const std::string& name,
                                                  const std::vector<uint64_t>& shape) {
  const SafetensorsTensor* t = ckpt.find(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("tensor \"", name, "\" is missing"));
  if (t->shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat(t->file, ": tensor \"", name, "\" has shape ",
                                                   shapeText(t->shape), ", the config implies ",
                                                   shapeText(shape)));
  }
  return t;
}

// Expert `e`'s picked matrix from a float tensor stored inputs first ([experts, in, outs]).
absl::StatusOr<cpu::CpuMatrix> floatMatrix(const SafetensorsTensor& t, int64_t e, int64_t in,
                                           int64_t outs, const Picked& p, bool cpu_kernels) {
  if (t.dtype != TensorType::kF32 && t.dtype != TensorType::kF16 && t.dtype != TensorType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat(t.file, ": tensor \"", t.name, "\" is ", model::tensorTypeName(t.dtype),
                     "; expected F32, F16 or BF16 (or MXFP4 _blocks and _scales)"));
  }
  const int64_t element = static_cast<int64_t>(*model::tensorBytes(t.dtype, 1));
  auto copy = std::make_shared<std::vector<uint8_t>>(p.rows.size * p.cols.size * element);
  const uint8_t* expert = t.data + e * in * outs * element;
  for (int64_t r = 0; r < p.rows.size; ++r) {
    uint8_t* dst = copy->data() + r * p.cols.size * element;
    const uint8_t* src = expert + p.storedRow(r) * element;
    for (int64_t c = 0; c < p.cols.size; ++c)
      std::memcpy(dst + c * element, src + (p.cols.begin + c) * outs * element, element);
  }
  const cpu::WeightMatrix w{
      .type = t.dtype, .rows = p.rows.size, .cols = p.cols.size, .data = copy->data()};
  return cpu_kernels ? cpu::CpuMatrix::create(w, copy) : cpu::CpuMatrix::asStored(w, copy);
}

}  // namespace

std::vector<uint8_t> mxfp4Blocks(const uint8_t* codes, const uint8_t* exps, int64_t groups) {
  std::vector<uint8_t> out(groups * 17);
  for (int64_t g = 0; g < groups; ++g) {
    uint8_t* block = out.data() + g * 17;
    block[0] = exps[g];
    const uint8_t* pairs = codes + g * (kMxfp4Group / 2);
    auto code = [&](int64_t i) { return i % 2 == 0 ? pairs[i / 2] & 0x0f : pairs[i / 2] >> 4; };
    for (int64_t j = 0; j < 16; ++j)
      block[1 + j] = static_cast<uint8_t>(code(j) | (code(j + 16) << 4));
  }
  return out;
}

namespace {

// Expert `e`'s picked matrix from MXFP4 blocks and scales stored outputs first, as MXFP4
// blocks (mxfp4Blocks) the int8 kernels read.
absl::StatusOr<cpu::CpuMatrix> mxfp4Matrix(const SafetensorsTensor& blocks,
                                           const SafetensorsTensor& scales, int64_t e, int64_t outs,
                                           int64_t in, const Picked& p, bool cpu_kernels) {
  if (p.cols.begin % kMxfp4Group != 0 || p.cols.size % kMxfp4Group != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor \"", blocks.name, "\": columns [",
                                                   p.cols.begin, ", ", p.cols.begin + p.cols.size,
                                                   ") do not fall on MXFP4's 32-element groups"));
  }
  const int64_t row_bytes = in / 2, groups = in / kMxfp4Group;
  const int64_t kept_groups = p.cols.size / kMxfp4Group;
  auto out = std::make_shared<std::vector<uint8_t>>();
  out->reserve(p.rows.size * kept_groups * 17);
  for (int64_t r = 0; r < p.rows.size; ++r) {
    const int64_t row = e * outs + p.storedRow(r);
    const std::vector<uint8_t> converted =
        mxfp4Blocks(blocks.data + row * row_bytes + p.cols.begin / 2,
                    scales.data + row * groups + p.cols.begin / kMxfp4Group, kept_groups);
    out->insert(out->end(), converted.begin(), converted.end());
  }
  const cpu::WeightMatrix w{
      .type = TensorType::kMXFP4, .rows = p.rows.size, .cols = p.cols.size, .data = out->data()};
  if (!cpu_kernels) return cpu::CpuMatrix::asStored(w, out);  // Read by another backend.
  CLEAVE_ASSIGN_OR_RETURN(cpu::CpuMatrix matrix, cpu::CpuMatrix::create(w, out));
  matrix.dropSource();  // Packed, the regrouped copy is not read again: one copy in memory.
  return matrix;
}

// Elements [offset + stride * i for i in part] of row `e` of the float tensor `t` ([experts,
// width]).
absl::StatusOr<std::vector<float>> biasOf(const SafetensorsTensor& t, int64_t e, int64_t width,
                                          Span part, int64_t stride, int64_t offset) {
  std::vector<float> row(width);
  const std::optional<uint64_t> row_bytes = model::tensorBytes(t.dtype, width);
  if (!row_bytes) return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name, "\""));
  CLEAVE_RETURN_IF_ERROR(model::dequantize(t.dtype, t.data + e * *row_bytes, width, row.data()));
  std::vector<float> out(part.size);
  for (int64_t i = 0; i < part.size; ++i) out[i] = row[offset + stride * (part.begin + i)];
  return out;
}

}  // namespace

absl::StatusOr<std::vector<MoeExpert>> loadGptOssExperts(const model::SafetensorsCheckpoint& ckpt,
                                                         const model::ModelConfig& c,
                                                         const ShardDims& d, uint32_t layer,
                                                         bool cpu_kernels) {
  const std::string base = absl::StrCat("model.layers.", layer, ".mlp.experts.");
  const int64_t experts = c.moe->num_experts, hidden = c.hidden_size,
                ffn = c.moe->expert_intermediate_size;
  const uint64_t E = experts, H = hidden, F = ffn;
  const bool mxfp4 = ckpt.find(base + "gate_up_proj") == nullptr &&
                     ckpt.find(base + "gate_up_proj_blocks") != nullptr;
  const SafetensorsTensor *gate_up = nullptr, *down = nullptr, *gate_up_scales = nullptr,
                          *down_scales = nullptr;
  if (mxfp4) {
    if (hidden % kMxfp4Group != 0 || ffn % kMxfp4Group != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          c.source, ": MXFP4 experts need hidden_size and intermediate_size in whole groups of ",
          kMxfp4Group));
    }
    const uint64_t G = kMxfp4Group;
    CLEAVE_ASSIGN_OR_RETURN(gate_up,
                            tensorOf(ckpt, base + "gate_up_proj_blocks", {E, 2 * F, H / G, 16}));
    CLEAVE_ASSIGN_OR_RETURN(gate_up_scales,
                            tensorOf(ckpt, base + "gate_up_proj_scales", {E, 2 * F, H / G}));
    CLEAVE_ASSIGN_OR_RETURN(down, tensorOf(ckpt, base + "down_proj_blocks", {E, H, F / G, 16}));
    CLEAVE_ASSIGN_OR_RETURN(down_scales, tensorOf(ckpt, base + "down_proj_scales", {E, H, F / G}));
    for (const SafetensorsTensor* t : {gate_up, gate_up_scales, down, down_scales}) {
      if (t->dtype != TensorType::kU8) {
        return absl::InvalidArgumentError(absl::StrCat(t->file, ": tensor \"", t->name, "\" is ",
                                                       model::tensorTypeName(t->dtype),
                                                       "; MXFP4 blocks and scales are U8"));
      }
    }
  } else {
    CLEAVE_ASSIGN_OR_RETURN(gate_up, tensorOf(ckpt, base + "gate_up_proj", {E, H, 2 * F}));
    CLEAVE_ASSIGN_OR_RETURN(down, tensorOf(ckpt, base + "down_proj", {E, F, H}));
  }
  CLEAVE_ASSIGN_OR_RETURN(const SafetensorsTensor* gate_up_bias,
                          tensorOf(ckpt, base + "gate_up_proj_bias", {E, 2 * F}));
  CLEAVE_ASSIGN_OR_RETURN(const SafetensorsTensor* down_bias,
                          tensorOf(ckpt, base + "down_proj_bias", {E, H}));

  const Span all_hidden{.begin = 0, .size = hidden};
  const Picked gate{.rows = d.expert_ffn, .cols = all_hidden, .stride = 2, .offset = 0};
  const Picked up{.rows = d.expert_ffn, .cols = all_hidden, .stride = 2, .offset = 1};
  const Picked down_part{.rows = all_hidden, .cols = d.expert_ffn};
  std::vector<MoeExpert> out;
  for (int64_t e = d.experts.begin; e < d.experts.begin + d.experts.size; ++e) {
    MoeExpert x;
    if (mxfp4) {
      CLEAVE_ASSIGN_OR_RETURN(
          x.gate, mxfp4Matrix(*gate_up, *gate_up_scales, e, 2 * ffn, hidden, gate, cpu_kernels));
      CLEAVE_ASSIGN_OR_RETURN(
          x.up, mxfp4Matrix(*gate_up, *gate_up_scales, e, 2 * ffn, hidden, up, cpu_kernels));
      CLEAVE_ASSIGN_OR_RETURN(
          x.down, mxfp4Matrix(*down, *down_scales, e, hidden, ffn, down_part, cpu_kernels));
    } else {
      CLEAVE_ASSIGN_OR_RETURN(x.gate, floatMatrix(*gate_up, e, hidden, 2 * ffn, gate, cpu_kernels));
      CLEAVE_ASSIGN_OR_RETURN(x.up, floatMatrix(*gate_up, e, hidden, 2 * ffn, up, cpu_kernels));
      CLEAVE_ASSIGN_OR_RETURN(x.down, floatMatrix(*down, e, ffn, hidden, down_part, cpu_kernels));
    }
    CLEAVE_ASSIGN_OR_RETURN(x.gate_bias, biasOf(*gate_up_bias, e, 2 * ffn, d.expert_ffn, 2, 0));
    CLEAVE_ASSIGN_OR_RETURN(x.up_bias, biasOf(*gate_up_bias, e, 2 * ffn, d.expert_ffn, 2, 1));
    if (d.expert_ffn.begin == 0) {  // The rank whose sum the bias joins.
      CLEAVE_ASSIGN_OR_RETURN(x.down_bias, biasOf(*down_bias, e, hidden, all_hidden, 1, 0));
    }
    out.push_back(std::move(x));
  }
  return out;
}

}  // namespace cleave::engine
