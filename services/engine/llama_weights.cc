#include "services/engine/llama_weights.h"

#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/model/quantization.h"
#include "common/status_macros.h"
#include "services/engine/gpt_oss_experts.h"

namespace cleave::engine {
namespace {

using model::Architecture;

std::string shapeText(const std::vector<uint64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) absl::StrAppend(&s, i ? ", " : "", d[i]);
  return s + "]";
}

// Which part of a matrix a rank keeps: all of it, a run of rows (column-parallel), or a
// run of columns (row-parallel; copied out, since a column run is not contiguous).
struct Slice {
  enum class Axis { kAll, kRows, kCols } axis = Axis::kAll;
  Span span;
};

// Where the loader finds tensors, in one file format with that format's names. Shapes are
// given as the model sees them: a matrix is [rows = outputs, cols = inputs].
class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // Whether the CPU kernels will multiply the matrices (TpShard::cpu_kernels): else they are
  // kept as stored, for another backend to copy.
  void setCpuKernels(bool cpu_kernels) { cpu_kernels_ = cpu_kernels; }
  bool cpuKernels() const { return cpu_kernels_; }
  // Whether tensors are laid out as llama.cpp's converter writes them (GGUF) rather than as
  // the checkpoint has them.
  virtual bool ggufLayout() const { return false; }
  // What the stored RMSNorm weights lack: Gemma's checkpoints store w for a scale of 1 + w
  // (llama.cpp's files store 1 + w).
  void setNormOffset(float offset) { norm_offset_ = offset; }
  // RMSNorm weights `name` of `size` (as the norms multiply: the stored ones plus the
  // offset), or the `part` of them a rank uses.
  absl::StatusOr<std::vector<float>> norm(const std::string& name, uint64_t size,
                                          std::optional<Span> part = std::nullopt) const {
    CLEAVE_ASSIGN_OR_RETURN(std::vector<float> w, vector(name, size, part));
    for (float& v : w) v += norm_offset_;
    return w;
  }
  // The name of a per-layer tensor, `role` being one of the keys of the name tables below.
  virtual std::string layerTensor(uint32_t layer, const std::string& role) const = 0;
  virtual std::string embeddingName() const = 0;
  virtual std::string outputNormName() const = 0;
  virtual std::string outputName() const = 0;
  // Layer `layer`'s e4m3 KV cache scale for its keys (`kv` "k") or values ("v"), value =
  // stored x scale: the checkpoint's when it has one, else 1.
  virtual absl::StatusOr<float> kvScale(uint32_t layer, const std::string& kv) const {
    return 1.0f;
  }
  // The stored bytes of tensor `name` with `dims` in the model's [rows, cols] order.
  struct Stored {
    model::TensorType type;
    const uint8_t* data;
  };
  virtual absl::StatusOr<Stored> find(const std::string& name,
                                      std::vector<uint64_t> dims) const = 0;
  virtual absl::StatusOr<MoeBlock> moe(uint32_t layer, const model::ModelConfig& c,
                                       const ShardDims& dims) const = 0;
  // Layer `layer`'s kv_b_proj for the rank's heads as MLA runs it (absorbKvB): each head's
  // W_UKᵀ into w.k_absorb, its W_UV into w.v_up. From kv_b_proj; a GGUF file may hold the
  // two already split.
  virtual absl::Status latentUp(uint32_t layer, const model::ModelConfig& c, const ShardDims& d,
                                MlaWeights& w) const {
    const model::MlaConfig& m = *c.mla;
    const std::string name = layerTensor(layer, "kv_b");
    const int64_t kv_b = m.qk_nope_head_dim + m.v_head_dim;
    CLEAVE_ASSIGN_OR_RETURN(
        cpu::CpuMatrix up,
        matrix(name, uint64_t{c.num_heads} * kv_b, m.kv_lora_rank,
               rows({.begin = d.heads.begin * kv_b, .size = d.heads.size * kv_b})));
    absl::Status absorbed =
        absorbKvB(std::make_shared<const cpu::CpuMatrix>(std::move(up)), m, d.heads.size, w);
    if (!absorbed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", name, "\": ", absorbed.message()));
    }
    return absl::OkStatus();
  }
  // The stored codes of matrix `name` ([rows, cols] as the model sees it) and, for FP8 or
  // NVFP4 weights, their scales over the whole matrix (offsets 0).
  struct StoredMatrix {
    Stored codes;
    std::shared_ptr<std::vector<float>> scale_values;
    cpu::BlockScales scales;
    std::shared_ptr<std::vector<uint8_t>> rewritten;  // The codes, when made at load.
  };
  virtual absl::StatusOr<StoredMatrix> findMatrix(const std::string& name, uint64_t rows,
                                                  uint64_t cols) const {
    CLEAVE_ASSIGN_OR_RETURN(Stored t, find(name, {rows, cols}));
    return StoredMatrix{.codes = t};
  }

  static Slice rows(Span span) { return {Slice::Axis::kRows, span}; }
  static Slice cols(Span span) { return {Slice::Axis::kCols, span}; }

  absl::StatusOr<cpu::CpuMatrix> matrix(const std::string& name, uint64_t rows, uint64_t cols,
                                        Slice slice = {}) const {
    CLEAVE_ASSIGN_OR_RETURN(StoredMatrix stored, findMatrix(name, rows, cols));
    return matrixOf(stored, name, rows, cols, slice);
  }
  // `slice` of the [rows, cols] matrix `stored` (found under `name`, for errors).
  absl::StatusOr<cpu::CpuMatrix> matrixOf(const StoredMatrix& stored, const std::string& name,
                                          uint64_t rows, uint64_t cols, Slice slice) const {
    const Stored& t = stored.codes;
    cpu::WeightMatrix w{.type = t.type,
                        .rows = static_cast<int64_t>(rows),
                        .cols = static_cast<int64_t>(cols),
                        .data = t.data,
                        .scales = stored.scales};
    std::shared_ptr<std::vector<uint8_t>> copy;
    // Codes made at load (int4's Q4_0) are kept only for the part this rank reads.
    std::shared_ptr<std::vector<uint8_t>> rewritten = stored.rewritten;
    const uint64_t whole = slice.axis == Slice::Axis::kRows ? rows : cols;
    if (slice.span.begin == 0 && static_cast<uint64_t>(slice.span.size) == whole) {
      slice.axis = Slice::Axis::kAll;  // A group of one keeps the stored bytes in place.
    }
    if (slice.axis == Slice::Axis::kRows) {
      w.data += slice.span.begin * w.rowBytes();
      w.rows = slice.span.size;
      w.scales.row_offset = slice.span.begin;
      if (rewritten) {
        copy = std::make_shared<std::vector<uint8_t>>(w.data, w.data + w.rows * w.rowBytes());
        w.data = copy->data();
        rewritten.reset();
      }
    } else if (slice.axis == Slice::Axis::kCols) {
      const std::optional<uint64_t> skip = model::tensorBytes(t.type, slice.span.begin);
      const std::optional<uint64_t> keep = model::tensorBytes(t.type, slice.span.size);
      if (!skip || !keep) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor \"", name, "\": columns [", slice.span.begin, ", ",
                         slice.span.begin + slice.span.size, ") do not fall on ",
                         model::tensorTypeName(t.type), " block boundaries"));
      }
      const int64_t row_bytes = w.rowBytes();
      copy = std::make_shared<std::vector<uint8_t>>(*keep * rows);
      for (uint64_t r = 0; r < rows; ++r)
        std::memcpy(copy->data() + r * *keep, t.data + r * row_bytes + *skip, *keep);
      w.data = copy->data();
      w.cols = slice.span.size;
      w.scales.col_offset = slice.span.begin;
      rewritten.reset();
    }
    auto owner = std::make_shared<
        std::tuple<decltype(copy), decltype(stored.scale_values), decltype(rewritten)>>(
        copy, stored.scale_values, rewritten);
    auto m = cpu_kernels_ ? cpu::CpuMatrix::create(w, std::move(owner))
                          : cpu::CpuMatrix::asStored(w, std::move(owner));
    if (!m.ok())
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", name, "\": ", m.status().message()));
    return m;
  }
  // `part` of the columns of a gated MLP [width] wide (its gate and up rows, its down
  // columns): a routed expert's whole, or a rank's run of a dense or shared MLP.
  absl::StatusOr<MoeExpert> gatedMlp(const std::string& gate, const std::string& up,
                                     const std::string& down, uint64_t width, uint64_t hidden,
                                     Span part) const {
    MoeExpert mlp;
    CLEAVE_ASSIGN_OR_RETURN(mlp.gate, matrix(gate, width, hidden, rows(part)));
    CLEAVE_ASSIGN_OR_RETURN(mlp.up, matrix(up, width, hidden, rows(part)));
    CLEAVE_ASSIGN_OR_RETURN(mlp.down, matrix(down, hidden, width, cols(part)));
    return mlp;
  }
  // A gate of one row of `hidden` weights ([1, hidden]; Qwen3.5-MoE's shared-expert gate).
  absl::StatusOr<std::vector<float>> gateRow(const std::string& name, uint64_t hidden) const {
    CLEAVE_ASSIGN_OR_RETURN(Stored gate, find(name, {1, hidden}));
    std::vector<float> out(hidden);
    CLEAVE_RETURN_IF_ERROR(model::dequantize(gate.type, gate.data, hidden, out.data()));
    return out;
  }
  absl::StatusOr<std::vector<float>> vector(const std::string& name, uint64_t size,
                                            std::optional<Span> part = std::nullopt) const {
    CLEAVE_ASSIGN_OR_RETURN(Stored t, find(name, {size}));
    std::vector<float> out(size);
    CLEAVE_RETURN_IF_ERROR(model::dequantize(t.type, t.data, size, out.data()));
    if (part)
      out = std::vector<float>(out.begin() + part->begin, out.begin() + part->begin + part->size);
    return out;
  }

 private:
  bool cpu_kernels_ = true;
  float norm_offset_ = 0.0f;
};

class GgufSource final : public TensorSource {
 public:
  GgufSource(const model::GgufFile& file, Architecture arch) : file_(file), arch_(arch) {}
  bool ggufLayout() const override { return true; }
  std::string layerTensor(uint32_t layer, const std::string& role) const override {
    // gpt-oss, GLM-4.5 and Qwen3.5 name their second norm for where it sits.
    if ((arch_ == Architecture::kGptOss || arch_ == Architecture::kGlm4Moe ||
         arch_ == Architecture::kQwen35) &&
        role == "ffn_norm")
      return absl::StrCat("blk.", layer, ".post_attention_norm.weight");
    // Gemma 3's norms after attention and after the MLP.
    if (role == "post_attn_norm") return absl::StrCat("blk.", layer, ".post_attention_norm.weight");
    if (role == "post_ffn_norm") return absl::StrCat("blk.", layer, ".post_ffw_norm.weight");
    static const std::map<std::string, std::string> kNames = {
        {"attn_norm", "attn_norm.weight"},
        {"q", "attn_q.weight"},
        {"k", "attn_k.weight"},
        {"v", "attn_v.weight"},
        {"o", "attn_output.weight"},
        {"q_bias", "attn_q.bias"},
        {"k_bias", "attn_k.bias"},
        {"v_bias", "attn_v.bias"},
        {"o_bias", "attn_output.bias"},
        {"sinks", "attn_sinks.weight"},
        {"q_norm", "attn_q_norm.weight"},
        {"k_norm", "attn_k_norm.weight"},
        {"ffn_norm", "ffn_norm.weight"},
        {"gate", "ffn_gate.weight"},
        {"up", "ffn_up.weight"},
        {"down", "ffn_down.weight"},
        // Phi-3's fused matrices.
        {"qkv", "attn_qkv.weight"},
        {"gate_up", "ffn_up.weight"},
        // DeepSeek's latent attention.
        {"q_a", "attn_q_a.weight"},
        {"q_a_norm", "attn_q_a_norm.weight"},
        {"q_b", "attn_q_b.weight"},
        {"kv_a", "attn_kv_a_mqa.weight"},
        {"kv_a_norm", "attn_kv_a_norm.weight"},
        {"kv_b", "attn_kv_b.weight"},
        // Qwen3.5's Gated DeltaNet (A as −exp(A_log)).
        {"linear_qkv", "attn_qkv.weight"},
        {"linear_z", "attn_gate.weight"},
        {"linear_b", "ssm_beta.weight"},
        {"linear_a", "ssm_alpha.weight"},
        {"linear_conv", "ssm_conv1d.weight"},
        {"linear_a_log", "ssm_a"},
        {"linear_dt_bias", "ssm_dt.bias"},
        {"linear_norm", "ssm_norm.weight"},
        {"linear_out", "ssm_out.weight"},
        {"linear_ba", "ssm_ba.weight"}};
    return absl::StrCat("blk.", layer, ".", kNames.at(role));
  }
  // llama.cpp's files split kv_b_proj per head (older ones keep it whole): attn_k_b
  // [heads][kv_lora][nope] holds each head's W_UKᵀ, attn_v_b [heads][v][kv_lora] its W_UV.
  absl::Status latentUp(uint32_t layer, const model::ModelConfig& c, const ShardDims& d,
                        MlaWeights& w) const override {
    if (file_.findTensor(layerTensor(layer, "kv_b")) != nullptr)
      return TensorSource::latentUp(layer, c, d, w);
    const model::MlaConfig& m = *c.mla;
    const std::string blk = absl::StrCat("blk.", layer, ".");
    w.k_absorb.clear();
    w.v_up.clear();
    for (int64_t h = d.heads.begin; h < d.heads.begin + d.heads.size; ++h) {
      CLEAVE_ASSIGN_OR_RETURN(cpu::CpuMatrix k, slab(blk + "attn_k_b.weight", c.num_heads,
                                                     m.kv_lora_rank, m.qk_nope_head_dim, h));
      CLEAVE_ASSIGN_OR_RETURN(cpu::CpuMatrix v, slab(blk + "attn_v_b.weight", c.num_heads,
                                                     m.v_head_dim, m.kv_lora_rank, h));
      w.k_absorb.push_back(std::move(k));
      w.v_up.push_back(std::move(v));
    }
    return absl::OkStatus();
  }
  std::string embeddingName() const override { return "token_embd.weight"; }
  std::string outputNormName() const override { return "output_norm.weight"; }
  std::string outputName() const override { return "output.weight"; }
  absl::StatusOr<Stored> find(const std::string& name, std::vector<uint64_t> dims) const override {
    const model::GgufTensor* t = file_.findTensor(name);
    if (t == nullptr)
      return absl::NotFoundError(absl::StrCat(file_.path(), ": tensor \"", name, "\" is missing"));
    std::vector<uint64_t> stored(dims.rbegin(), dims.rend());  // GGUF lists the fastest dim first.
    if (t->dims != stored) {
      return absl::InvalidArgumentError(absl::StrCat(file_.path(), ": tensor \"", name,
                                                     "\" has dims ", shapeText(t->dims),
                                                     ", the config implies ", shapeText(stored)));
    }
    // Some NVFP4 producers write a per-tensor scale beside the blocks (X.scale or
    // X.weight.scale); reading the blocks without it would give wrong values.
    if (t->type == model::TensorType::kNVFP4 && absl::EndsWith(name, ".weight")) {
      for (const std::string& scale :
           {absl::StrCat(name.substr(0, name.size() - 7), ".scale"), name + ".scale"}) {
        if (file_.findTensor(scale) == nullptr) continue;
        return absl::UnimplementedError(absl::StrCat(
            file_.path(), ": tensor \"", scale, "\" (a per-tensor scale of the NVFP4 blocks of \"",
            name, "\") is not supported: write the scale into the blocks' own scales"));
      }
    }
    return Stored{t->type, t->data};
  }
  // As llama.cpp's converter writes them: a layer's experts stacked in one tensor per
  // projection (ffn_gate_exps, ffn_up_exps: [experts, ffn, hidden]; ffn_down_exps:
  // [experts, hidden, ffn]), the router as ffn_gate_inp, DeepSeek's bias as exp_probs_b,
  // shared experts as one MLP (ffn_gate_shexp, ffn_up_shexp, ffn_down_shexp).
  absl::StatusOr<MoeBlock> moe(uint32_t layer, const model::ModelConfig& c,
                               const ShardDims& dims) const override {
    const uint64_t hidden = c.hidden_size, ffn = c.moe->expert_intermediate_size;
    const uint64_t experts = c.moe->num_experts;
    const std::string blk = absl::StrCat("blk.", layer, ".");
    // Expert e's [rows, cols] slab of the stacked tensor `name`.
    auto slab = [&](const std::string& name, uint64_t rows, uint64_t cols, int64_t e, Slice slice) {
      return this->slab(blk + name, experts, rows, cols, e, slice);
    };
    MoeBlock block;
    CLEAVE_ASSIGN_OR_RETURN(block.router, matrix(blk + "ffn_gate_inp.weight", experts, hidden));
    block.expert_begin = dims.experts.begin;
    for (int64_t e = dims.experts.begin; e < dims.experts.begin + dims.experts.size; ++e) {
      MoeExpert expert;
      CLEAVE_ASSIGN_OR_RETURN(expert.gate,
                              slab("ffn_gate_exps.weight", ffn, hidden, e, rows(dims.expert_ffn)));
      CLEAVE_ASSIGN_OR_RETURN(expert.up,
                              slab("ffn_up_exps.weight", ffn, hidden, e, rows(dims.expert_ffn)));
      CLEAVE_ASSIGN_OR_RETURN(expert.down,
                              slab("ffn_down_exps.weight", hidden, ffn, e, cols(dims.expert_ffn)));
      block.experts.push_back(std::move(expert));
    }
    if (c.moe->score_correction_bias) {
      CLEAVE_ASSIGN_OR_RETURN(block.score_bias, vector(blk + "exp_probs_b.bias", experts));
    }
    if (c.moe->shared_experts > 0) {
      CLEAVE_ASSIGN_OR_RETURN(
          block.shared,
          gatedMlp(blk + "ffn_gate_shexp.weight", blk + "ffn_up_shexp.weight",
                   blk + "ffn_down_shexp.weight",
                   uint64_t{c.moe->shared_experts} * c.moe->shared_expert_intermediate_size, hidden,
                   dims.shared_ffn));
    }
    if (c.moe->shared_expert_gate) {  // Qwen3.5-MoE's
      CLEAVE_ASSIGN_OR_RETURN(block.shared_gate,
                              gateRow(blk + "ffn_gate_inp_shexp.weight", hidden));
    }
    if (c.moe->router_bias) {
      CLEAVE_ASSIGN_OR_RETURN(block.router_bias, vector(blk + "ffn_gate_inp.bias", experts));
    }
    if (c.moe->expert_bias) {
      // `part` of row e of a stacked [experts, width] bias.
      auto bias = [&](const std::string& name, uint64_t width, int64_t e,
                      Span part) -> absl::StatusOr<std::vector<float>> {
        CLEAVE_ASSIGN_OR_RETURN(Stored t, find(blk + name, {experts, width}));
        const std::optional<uint64_t> row_bytes = model::tensorBytes(t.type, width);
        if (!row_bytes) {
          return absl::InvalidArgumentError(
              absl::StrCat(file_.path(), ": tensor \"", blk, name, "\": rows of ", width, " ",
                           model::tensorTypeName(t.type), " elements are not whole blocks"));
        }
        std::vector<float> row(width);
        CLEAVE_RETURN_IF_ERROR(
            model::dequantize(t.type, t.data + e * *row_bytes, width, row.data()));
        return std::vector<float>(row.begin() + part.begin, row.begin() + part.begin + part.size);
      };
      for (size_t i = 0; i < block.experts.size(); ++i) {
        MoeExpert& x = block.experts[i];
        const int64_t e = dims.experts.begin + static_cast<int64_t>(i);
        CLEAVE_ASSIGN_OR_RETURN(x.gate_bias, bias("ffn_gate_exps.bias", ffn, e, dims.expert_ffn));
        CLEAVE_ASSIGN_OR_RETURN(x.up_bias, bias("ffn_up_exps.bias", ffn, e, dims.expert_ffn));
        if (dims.expert_ffn.begin == 0) {  // The rank whose sum the bias joins.
          CLEAVE_ASSIGN_OR_RETURN(x.down_bias,
                                  bias("ffn_down_exps.bias", hidden, e,
                                       {.begin = 0, .size = static_cast<int64_t>(hidden)}));
        }
      }
    }
    return block;
  }

  // Slab `index` ([rows, cols], a `slice` of it) of the stacked tensor `name` ([count, rows,
  // cols]): a layer's expert, or a head's latent projection.
  absl::StatusOr<cpu::CpuMatrix> slab(const std::string& name, uint64_t count, uint64_t rows,
                                      uint64_t cols, int64_t index, Slice slice = {}) const {
    CLEAVE_ASSIGN_OR_RETURN(Stored t, find(name, {count, rows, cols}));
    const std::optional<uint64_t> row_bytes = model::tensorBytes(t.type, cols);
    if (!row_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(file_.path(), ": tensor \"", name, "\": rows of ", cols, " ",
                       model::tensorTypeName(t.type), " elements are not whole blocks"));
    }
    const StoredMatrix part{.codes = {t.type, t.data + index * rows * *row_bytes}};
    return matrixOf(part, name, rows, cols, slice);
  }

 private:
  const model::GgufFile& file_;
  const Architecture arch_;
};

class SafetensorsSource final : public TensorSource {
 public:
  // `arch`: Gemma 3 names its norms for where they sit, and a multimodal checkpoint (Gemma 3,
  // Mistral 3) keeps the text model under language_model (model.language_model. as
  // transformers 5 writes it, language_model.model. as published) rather than model.
  SafetensorsSource(const model::SafetensorsCheckpoint& checkpoint,
                    model::QuantizationInfo quantization, Architecture arch = Architecture::kLlama)
      : ckpt_(checkpoint), quant_(std::move(quantization)), arch_(arch) {
    for (const char* prefix : {"model.language_model.", "language_model.model."}) {
      if (ckpt_.find(absl::StrCat(prefix, "embed_tokens.weight")) != nullptr) prefix_ = prefix;
    }
  }
  std::string layerTensor(uint32_t layer, const std::string& role) const override {
    if (arch_ == Architecture::kGlm4) {  // Its post norms, and post_attention_layernorm before
      if (role == "post_attn_norm")      // the MLP (the default name).
        return absl::StrCat(prefix_, "layers.", layer, ".post_self_attn_layernorm.weight");
      if (role == "post_ffn_norm")
        return absl::StrCat(prefix_, "layers.", layer, ".post_mlp_layernorm.weight");
    }
    if (arch_ == Architecture::kGemma3 || arch_ == Architecture::kGemma2 ||
        arch_ == Architecture::kOlmo2 || arch_ == Architecture::kExaone4) {
      static const std::map<std::string, std::string> kGemma = {
          {"ffn_norm", "pre_feedforward_layernorm.weight"},
          {"post_attn_norm", "post_attention_layernorm.weight"},
          {"post_ffn_norm", "post_feedforward_layernorm.weight"}};
      if (auto it = kGemma.find(role); it != kGemma.end())
        return absl::StrCat(prefix_, "layers.", layer, ".", it->second);
    }
    static const std::map<std::string, std::string> kNames = {
        {"attn_norm", "input_layernorm.weight"},
        {"q", "self_attn.q_proj.weight"},
        {"k", "self_attn.k_proj.weight"},
        {"v", "self_attn.v_proj.weight"},
        {"o", "self_attn.o_proj.weight"},
        {"qkv", "self_attn.qkv_proj.weight"},
        {"q_bias", "self_attn.q_proj.bias"},
        {"k_bias", "self_attn.k_proj.bias"},
        {"v_bias", "self_attn.v_proj.bias"},
        {"o_bias", "self_attn.o_proj.bias"},
        {"sinks", "self_attn.sinks"},
        {"q_norm", "self_attn.q_norm.weight"},
        {"k_norm", "self_attn.k_norm.weight"},
        {"q_a", "self_attn.q_a_proj.weight"},
        {"q_a_norm", "self_attn.q_a_layernorm.weight"},
        {"q_b", "self_attn.q_b_proj.weight"},
        {"kv_a", "self_attn.kv_a_proj_with_mqa.weight"},
        {"kv_a_norm", "self_attn.kv_a_layernorm.weight"},
        {"kv_b", "self_attn.kv_b_proj.weight"},
        {"ffn_norm", "post_attention_layernorm.weight"},
        {"gate", "mlp.gate_proj.weight"},
        {"up", "mlp.up_proj.weight"},
        {"gate_up", "mlp.gate_up_proj.weight"},
        {"down", "mlp.down_proj.weight"},
        {"linear_qkv", "linear_attn.in_proj_qkv.weight"},
        {"linear_qkvz", "linear_attn.in_proj_qkvz.weight"},
        {"linear_ba", "linear_attn.in_proj_ba.weight"},
        {"linear_z", "linear_attn.in_proj_z.weight"},
        {"linear_b", "linear_attn.in_proj_b.weight"},
        {"linear_a", "linear_attn.in_proj_a.weight"},
        {"linear_conv", "linear_attn.conv1d.weight"},
        {"linear_a_log", "linear_attn.A_log"},
        {"linear_dt_bias", "linear_attn.dt_bias"},
        {"linear_norm", "linear_attn.norm.weight"},
        {"linear_out", "linear_attn.out_proj.weight"}};
    return absl::StrCat(prefix_, "layers.", layer, ".", kNames.at(role));
  }
  std::string embeddingName() const override { return prefix_ + "embed_tokens.weight"; }
  std::string outputNormName() const override { return prefix_ + "norm.weight"; }
  // The published multimodal layout keeps the head beside its text model.
  std::string outputName() const override {
    return prefix_ == "language_model.model." &&
                   ckpt_.find("language_model.lm_head.weight") != nullptr
               ? "language_model.lm_head.weight"
               : "lm_head.weight";
  }
  // ModelOpt and compressed-tensors FP8 KV checkpoints: self_attn.k_scale (or, in older
  // ModelOpt exports, self_attn.k_proj.k_scale), one positive float.
  absl::StatusOr<float> kvScale(uint32_t layer, const std::string& kv) const override {
    const std::string base = absl::StrCat(prefix_, "layers.", layer, ".self_attn.");
    for (const std::string& name :
         {absl::StrCat(base, kv, "_scale"), absl::StrCat(base, kv, "_proj.", kv, "_scale")}) {
      const model::SafetensorsTensor* t = ckpt_.find(name);
      if (t == nullptr) continue;
      float scale = 0;
      if (t->num_elements != 1 || !model::dequantize(t->dtype, t->data, 1, &scale).ok() ||
          !std::isfinite(scale) || scale <= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            t->file, ": tensor \"", name, "\" must hold one positive float (the KV cache scale)"));
      }
      return scale;
    }
    return 1.0f;
  }
  absl::StatusOr<Stored> find(const std::string& name, std::vector<uint64_t> dims) const override {
    const model::SafetensorsTensor* t = ckpt_.find(name);
    if (t == nullptr) return absl::NotFoundError(absl::StrCat("tensor \"", name, "\" is missing"));
    if (t->shape != dims) {
      return absl::InvalidArgumentError(absl::StrCat(t->file, ": tensor \"", name, "\" has shape ",
                                                     shapeText(t->shape), ", the config implies ",
                                                     shapeText(dims)));
    }
    return Stored{t->dtype, t->data};
  }
  // A float tensor is used as stored; FP8 codes, or NVFP4 codes (U8, or missing under the
  // name because compressed-tensors calls them "weight_packed"), come with their scales.
  absl::StatusOr<StoredMatrix> findMatrix(const std::string& name, uint64_t rows,
                                          uint64_t cols) const override {
    const model::SafetensorsTensor* t = ckpt_.find(name);
    const bool plain = t != nullptr && t->dtype != model::TensorType::kF8E4M3 &&
                       t->dtype != model::TensorType::kU8;
    if (plain) return TensorSource::findMatrix(name, rows, cols);
    if (quant_.scheme == model::QuantScheme::kNone) {
      if (t == nullptr)
        return absl::NotFoundError(absl::StrCat("tensor \"", name, "\" is missing"));
      return absl::InvalidArgumentError(absl::StrCat(
          t->file, ": tensor \"", name, "\" is ", model::tensorTypeName(t->dtype),
          " but the checkpoint declares no quantization (config.json quantization_config or "
          "hf_quant_config.json)"));
    }
    CLEAVE_ASSIGN_OR_RETURN(model::QuantizedWeight q,
                            model::resolveQuantizedWeight(ckpt_, quant_, name));
    if (q.rows != rows || q.cols != cols) {
      return absl::InvalidArgumentError(
          absl::StrCat(q.weight->file, ": tensor \"", q.weight->name, "\" holds a [", q.rows, ", ",
                       q.cols, "] matrix, the config implies [", rows, ", ", cols, "]"));
    }
    CLEAVE_ASSIGN_OR_RETURN(model::ScaleGrid grid, model::scaleGrid(q, quant_));
    if (q.codes == model::TensorType::kI4) {
      // Int4 as the CPU kernels' Q4_0 blocks where that is exact, else as floats.
      auto codes = std::make_shared<std::vector<uint8_t>>();
      model::TensorType type = model::TensorType::kQ4_0;
      if (std::optional<std::vector<uint8_t>> q4 = model::int4AsQ4_0(q, grid)) {
        *codes = *std::move(q4);
      } else {
        type = model::TensorType::kF32;
        codes->resize(rows * cols * sizeof(float));
        CLEAVE_RETURN_IF_ERROR(
            model::dequantizeWeight(q, quant_, reinterpret_cast<float*>(codes->data())));
      }
      return StoredMatrix{.codes = {type, codes->data()}, .rewritten = codes};
    }
    StoredMatrix out{.codes = {q.codes, q.weight->data},
                     .scale_values = std::make_shared<std::vector<float>>(std::move(grid.values))};
    out.scales = {.data = out.scale_values->data(),
                  .block_rows = static_cast<int64_t>(grid.block_rows),
                  .block_cols = static_cast<int64_t>(grid.block_cols),
                  .cols = static_cast<int64_t>(grid.grid_cols),
                  .global = grid.global};
    return out;
  }
  // Mixtral and MiniMax-M2 name their MoE block "block_sparse_moe" with experts w1 (gate), w3
  // (up), w2 (down) — MiniMax-M2's correction bias beside the gate; Qwen3-MoE and DeepSeek-V3 "mlp"
  // with gate_proj / up_proj / down_proj, and DeepSeek adds gate.e_score_correction_bias and
  // shared_experts; gpt-oss has a biased mlp.router and stacked experts (gpt_oss_experts.h).
  absl::StatusOr<MoeBlock> moe(uint32_t layer, const model::ModelConfig& c,
                               const ShardDims& dims) const override {
    if (c.architecture == Architecture::kGptOss) {
      const std::string base = absl::StrCat(prefix_, "layers.", layer, ".mlp.router.");
      MoeBlock block;
      CLEAVE_ASSIGN_OR_RETURN(block.router,
                              matrix(base + "weight", c.moe->num_experts, c.hidden_size));
      CLEAVE_ASSIGN_OR_RETURN(block.router_bias, vector(base + "bias", c.moe->num_experts));
      block.expert_begin = dims.experts.begin;
      CLEAVE_ASSIGN_OR_RETURN(block.experts,
                              loadGptOssExperts(ckpt_, c, dims, layer, cpuKernels()));
      return block;
    }
    const bool minimax = c.architecture == Architecture::kMiniMaxM2;
    const bool mixtral = c.architecture == Architecture::kMixtral || minimax;
    const std::string base =
        absl::StrCat(prefix_, "layers.", layer, ".", mixtral ? "block_sparse_moe." : "mlp.");
    const uint64_t hidden = c.hidden_size, ffn = c.moe->expert_intermediate_size;
    // `part` of the MLP's columns: all of a routed expert's, a run of the shared experts'.
    auto mlp = [&](const std::string& x, uint64_t width, Span part) {
      return gatedMlp(x + (mixtral ? "w1.weight" : "gate_proj.weight"),
                      x + (mixtral ? "w3.weight" : "up_proj.weight"),
                      x + (mixtral ? "w2.weight" : "down_proj.weight"), width, hidden, part);
    };
    MoeBlock block;
    CLEAVE_ASSIGN_OR_RETURN(block.router, matrix(base + "gate.weight", c.moe->num_experts, hidden));
    block.expert_begin = dims.experts.begin;
    for (int64_t e = dims.experts.begin; e < dims.experts.begin + dims.experts.size; ++e) {
      CLEAVE_ASSIGN_OR_RETURN(MoeExpert expert,
                              mlp(absl::StrCat(base, "experts.", e, "."), ffn, dims.expert_ffn));
      block.experts.push_back(std::move(expert));
    }
    if (c.moe->score_correction_bias) {
      CLEAVE_ASSIGN_OR_RETURN(
          block.score_bias,
          vector(base + (minimax ? "" : "gate.") + "e_score_correction_bias", c.moe->num_experts));
    }
    if (c.moe->shared_experts > 0) {
      // Qwen3.5-MoE calls its one shared expert shared_expert, gated by shared_expert_gate.
      const bool gated = c.moe->shared_expert_gate;
      CLEAVE_ASSIGN_OR_RETURN(
          block.shared,
          mlp(base + (gated ? "shared_expert." : "shared_experts."),
              uint64_t{c.moe->shared_experts} * c.moe->shared_expert_intermediate_size,
              dims.shared_ffn));
      if (gated) {
        CLEAVE_ASSIGN_OR_RETURN(block.shared_gate,
                                gateRow(base + "shared_expert_gate.weight", hidden));
      }
    }
    return block;
  }

 private:
  const model::SafetensorsCheckpoint& ckpt_;
  model::QuantizationInfo quant_;
  Architecture arch_;
  std::string prefix_ = "model.";
};

// Layer `i`'s latent attention projections for the rank's query heads.
absl::StatusOr<MlaWeights> loadMla(const TensorSource& f, const model::ModelConfig& c,
                                   const ShardDims& d, uint32_t i) {
  const model::MlaConfig& m = *c.mla;
  auto name = [&](const char* role) { return f.layerTensor(i, role); };
  const uint64_t hidden = c.hidden_size, heads = c.num_heads;
  const uint64_t qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
  const auto rows = TensorSource::rows;
  const Span q_part{.begin = d.heads.begin * int64_t(qk), .size = d.heads.size * int64_t(qk)};
  MlaWeights w;
  if (m.q_lora_rank > 0) {
    CLEAVE_ASSIGN_OR_RETURN(w.q_a, f.matrix(name("q_a"), m.q_lora_rank, hidden));
    CLEAVE_ASSIGN_OR_RETURN(w.q_a_norm, f.vector(name("q_a_norm"), m.q_lora_rank));
    CLEAVE_ASSIGN_OR_RETURN(w.q_b, f.matrix(name("q_b"), heads * qk, m.q_lora_rank, rows(q_part)));
  } else {
    CLEAVE_ASSIGN_OR_RETURN(w.q_b, f.matrix(name("q"), heads * qk, hidden, rows(q_part)));
  }
  CLEAVE_ASSIGN_OR_RETURN(w.kv_a,
                          f.matrix(name("kv_a"), m.kv_lora_rank + m.qk_rope_head_dim, hidden));
  CLEAVE_ASSIGN_OR_RETURN(w.kv_a_norm, f.vector(name("kv_a_norm"), m.kv_lora_rank));
  CLEAVE_RETURN_IF_ERROR(f.latentUp(i, c, d, w));
  return w;
}

// Layer `i`'s Gated DeltaNet projections for the rank's key heads and their value heads.
absl::StatusOr<GatedDeltaNetWeights> loadGatedDeltaNet(const TensorSource& f,
                                                       const model::ModelConfig& c,
                                                       const ShardDims& d, uint32_t i) {
  const model::LinearAttentionConfig& la = *c.linear_attention;
  auto name = [&](const char* role) { return f.layerTensor(i, role); };
  const uint64_t hidden = c.hidden_size;
  const int64_t dk = la.key_head_dim, dv = la.value_head_dim;
  const int64_t key_dim = int64_t{la.key_heads} * dk, value_dim = int64_t{la.value_heads} * dv;
  const int64_t channels = 2 * key_dim + value_dim;
  // The rank's rows of in_proj_qkv (and channels of the convolution): its query, key and
  // value heads, at their sections' offsets.
  const Span q_part{.begin = d.linear_key_heads.begin * dk, .size = d.linear_key_heads.size * dk};
  const Span k_part{.begin = key_dim + q_part.begin, .size = q_part.size};
  const Span v_part{.begin = 2 * key_dim + d.linear_value_heads.begin * dv,
                    .size = d.linear_value_heads.size * dv};
  const Span v_cols{.begin = d.linear_value_heads.begin * dv, .size = v_part.size};
  const auto rows = TensorSource::rows;
  GatedDeltaNetWeights w;
  // Grouped projections hold each key head's rows together: the rank's key heads are one run.
  const int64_t ratio = la.value_heads / la.key_heads;
  const Span& heads = d.linear_key_heads;
  if (la.grouped_ba) {
    CLEAVE_ASSIGN_OR_RETURN(
        w.ba, f.matrix(name("linear_ba"), 2 * la.value_heads, hidden,
                       rows({.begin = heads.begin * 2 * ratio, .size = heads.size * 2 * ratio})));
  } else {
    CLEAVE_ASSIGN_OR_RETURN(
        w.b, f.matrix(name("linear_b"), la.value_heads, hidden, rows(d.linear_value_heads)));
    CLEAVE_ASSIGN_OR_RETURN(
        w.a, f.matrix(name("linear_a"), la.value_heads, hidden, rows(d.linear_value_heads)));
  }
  if (la.grouped_qkvz) {
    const int64_t group = 2 * dk + 2 * ratio * dv;
    CLEAVE_ASSIGN_OR_RETURN(
        w.qkvz, f.matrix(name("linear_qkvz"), la.key_heads * group, hidden,
                         rows({.begin = heads.begin * group, .size = heads.size * group})));
  } else {
    const std::string qkv = name("linear_qkv");
    CLEAVE_ASSIGN_OR_RETURN(TensorSource::StoredMatrix stored, f.findMatrix(qkv, channels, hidden));
    CLEAVE_ASSIGN_OR_RETURN(w.q, f.matrixOf(stored, qkv, channels, hidden, rows(q_part)));
    CLEAVE_ASSIGN_OR_RETURN(w.k, f.matrixOf(stored, qkv, channels, hidden, rows(k_part)));
    CLEAVE_ASSIGN_OR_RETURN(w.v, f.matrixOf(stored, qkv, channels, hidden, rows(v_part)));
    CLEAVE_ASSIGN_OR_RETURN(w.z, f.matrix(name("linear_z"), value_dim, hidden, rows(v_cols)));
  }
  CLEAVE_ASSIGN_OR_RETURN(
      w.out, f.matrix(name("linear_out"), hidden, value_dim, TensorSource::cols(v_cols)));
  // conv1d.weight [channels, 1, taps]: the rank's channels, each row of taps contiguous.
  const std::string conv = name("linear_conv");
  CLEAVE_ASSIGN_OR_RETURN(TensorSource::Stored taps,
                          f.ggufLayout()
                              ? f.find(conv, {uint64_t(channels), la.conv_kernel})  // Squeezed.
                              : f.find(conv, {uint64_t(channels), 1, la.conv_kernel}));
  std::vector<float> all(channels * la.conv_kernel);
  CLEAVE_RETURN_IF_ERROR(model::dequantize(taps.type, taps.data, all.size(), all.data()));
  for (const Span& part : {q_part, k_part, v_part}) {
    w.conv.insert(w.conv.end(), all.begin() + part.begin * la.conv_kernel,
                  all.begin() + (part.begin + part.size) * la.conv_kernel);
  }
  // −exp(A_log): llama.cpp's files store it so (ssm_a), checkpoints A_log.
  CLEAVE_ASSIGN_OR_RETURN(w.a_rate,
                          f.vector(name("linear_a_log"), la.value_heads, d.linear_value_heads));
  if (!f.ggufLayout()) {
    for (float& a : w.a_rate) a = -std::exp(a);
  }
  CLEAVE_ASSIGN_OR_RETURN(w.dt_bias,
                          f.vector(name("linear_dt_bias"), la.value_heads, d.linear_value_heads));
  CLEAVE_ASSIGN_OR_RETURN(w.norm, f.vector(name("linear_norm"), la.value_head_dim));
  return w;
}

// Everything but the source and the RoPE pairing is the same for every file format.
absl::Status loadTensors(const TensorSource& f, LlamaWeights& w, const LayerLoaded& on_layer) {
  const model::ModelConfig& c = w.config;
  const ShardDims& d = w.dims;
  const uint64_t hidden = c.hidden_size, q_dim = uint64_t{c.num_heads} * c.head_dim,
                 kv_dim = uint64_t{c.num_kv_heads} * c.head_dim, ffn = c.intermediate_size;
  const Span q_part{.begin = d.heads.begin * c.head_dim, .size = d.heads.size * c.head_dim};
  const Span kv_part{.begin = d.kv_heads.begin * c.head_dim, .size = d.kv_heads.size * c.head_dim};
  const auto rows = TensorSource::rows, cols = TensorSource::cols;
  // Phi-3 stores Q, K, V in one matrix and gate, up in another: row runs `at` rows on.
  const bool fused = c.architecture == model::Architecture::kPhi3;
  // GLM-4 keeps Q, K and V apart but gate and up in one matrix, as Phi-3 does.
  const bool fused_gate_up = fused || c.architecture == model::Architecture::kGlm4;
  auto shifted = [](Span part, uint64_t at) {
    return Span{.begin = part.begin + static_cast<int64_t>(at), .size = part.size};
  };
  CLEAVE_ASSIGN_OR_RETURN(TensorSource::Stored embd,
                          f.find(f.embeddingName(), {c.vocab_size, hidden}));
  w.token_embd = {.type = embd.type,
                  .data = embd.data,
                  .row_begin = d.vocab.begin,
                  .rows = d.vocab.size,
                  .cols = static_cast<int64_t>(hidden)};
  w.token_embd.data += d.vocab.begin * w.token_embd.rowBytes();
  for (uint32_t i = 0; i < c.num_layers; ++i) {
    auto name = [&](const char* role) { return f.layerTensor(i, role); };
    LlamaLayer layer;
    if (c.pre_norms) {
      CLEAVE_ASSIGN_OR_RETURN(layer.attn_norm, f.norm(name("attn_norm"), hidden));
    }
    const bool linear = c.isLinearLayer(i);
    if (linear) {
      CLEAVE_ASSIGN_OR_RETURN(layer.linear, loadGatedDeltaNet(f, c, d, i));
    } else if (c.mla) {
      const int64_t v = c.mla->v_head_dim;
      CLEAVE_ASSIGN_OR_RETURN(layer.mla, loadMla(f, c, d, i));
      CLEAVE_ASSIGN_OR_RETURN(
          layer.wo, f.matrix(name("o"), hidden, uint64_t{c.num_heads} * v,
                             cols({.begin = d.heads.begin * v, .size = d.heads.size * v})));
    } else {
      if (fused) {  // Q, K and V: row runs of one matrix.
        const std::string qkv = name("qkv");
        const uint64_t qkv_rows = q_dim + 2 * kv_dim;
        CLEAVE_ASSIGN_OR_RETURN(TensorSource::StoredMatrix stored,
                                f.findMatrix(qkv, qkv_rows, hidden));
        CLEAVE_ASSIGN_OR_RETURN(layer.wq, f.matrixOf(stored, qkv, qkv_rows, hidden, rows(q_part)));
        CLEAVE_ASSIGN_OR_RETURN(
            layer.wk, f.matrixOf(stored, qkv, qkv_rows, hidden, rows(shifted(kv_part, q_dim))));
        CLEAVE_ASSIGN_OR_RETURN(layer.wv, f.matrixOf(stored, qkv, qkv_rows, hidden,
                                                     rows(shifted(kv_part, q_dim + kv_dim))));
      } else if (c.attention_output_gate) {  // Each head's query rows, then its gate rows.
        CLEAVE_ASSIGN_OR_RETURN(
            layer.wq, f.matrix(name("q"), 2 * q_dim, hidden,
                               rows({.begin = 2 * q_part.begin, .size = 2 * q_part.size})));
        CLEAVE_ASSIGN_OR_RETURN(layer.wk, f.matrix(name("k"), kv_dim, hidden, rows(kv_part)));
        CLEAVE_ASSIGN_OR_RETURN(layer.wv, f.matrix(name("v"), kv_dim, hidden, rows(kv_part)));
      } else {
        CLEAVE_ASSIGN_OR_RETURN(layer.wq, f.matrix(name("q"), q_dim, hidden, rows(q_part)));
        CLEAVE_ASSIGN_OR_RETURN(layer.wk, f.matrix(name("k"), kv_dim, hidden, rows(kv_part)));
        CLEAVE_ASSIGN_OR_RETURN(layer.wv, f.matrix(name("v"), kv_dim, hidden, rows(kv_part)));
      }
      CLEAVE_ASSIGN_OR_RETURN(layer.wo, f.matrix(name("o"), hidden, q_dim, cols(q_part)));
    }
    if (c.attention_bias && !linear) {
      CLEAVE_ASSIGN_OR_RETURN(layer.bq, f.vector(name("q_bias"), q_dim, q_part));
      CLEAVE_ASSIGN_OR_RETURN(layer.bk, f.vector(name("k_bias"), kv_dim, kv_part));
      CLEAVE_ASSIGN_OR_RETURN(layer.bv, f.vector(name("v_bias"), kv_dim, kv_part));
    }
    if (c.o_bias && d.heads.begin == 0 && !linear) {
      CLEAVE_ASSIGN_OR_RETURN(layer.bo, f.vector(name("o_bias"), hidden));
    }
    if (c.attention_sinks && !linear) {
      CLEAVE_ASSIGN_OR_RETURN(layer.sinks, f.vector(name("sinks"), c.num_heads, d.heads));
    }
    if (linear) {
      // No Q/K norms, no KV cache scales.
    } else if (c.qk_norm && c.qk_norm_across_heads) {  // The rank's heads' part of each.
      CLEAVE_ASSIGN_OR_RETURN(layer.q_norm, f.norm(name("q_norm"), q_dim, q_part));
      CLEAVE_ASSIGN_OR_RETURN(layer.k_norm, f.norm(name("k_norm"), kv_dim, kv_part));
    } else if (c.qk_norm) {
      CLEAVE_ASSIGN_OR_RETURN(layer.q_norm, f.norm(name("q_norm"), c.head_dim));
      CLEAVE_ASSIGN_OR_RETURN(layer.k_norm, f.norm(name("k_norm"), c.head_dim));
    }
    if (!linear) {
      CLEAVE_ASSIGN_OR_RETURN(layer.k_scale, f.kvScale(i, "k"));
      CLEAVE_ASSIGN_OR_RETURN(layer.v_scale, f.kvScale(i, "v"));
    }
    if (c.pre_norms) {
      CLEAVE_ASSIGN_OR_RETURN(layer.ffn_norm, f.norm(name("ffn_norm"), hidden));
    }
    if (c.post_norms) {
      CLEAVE_ASSIGN_OR_RETURN(layer.post_attn_norm, f.norm(name("post_attn_norm"), hidden));
      CLEAVE_ASSIGN_OR_RETURN(layer.post_ffn_norm, f.norm(name("post_ffn_norm"), hidden));
    }
    if (c.isMoeLayer(i)) {
      CLEAVE_ASSIGN_OR_RETURN(layer.moe, f.moe(i, c, d));
    } else {
      if (fused_gate_up) {  // Gate and up: the first and second halves of one matrix's rows.
        const std::string gate_up = name("gate_up");
        CLEAVE_ASSIGN_OR_RETURN(TensorSource::StoredMatrix stored,
                                f.findMatrix(gate_up, 2 * ffn, hidden));
        CLEAVE_ASSIGN_OR_RETURN(layer.w_gate,
                                f.matrixOf(stored, gate_up, 2 * ffn, hidden, rows(d.ffn)));
        CLEAVE_ASSIGN_OR_RETURN(
            layer.w_up, f.matrixOf(stored, gate_up, 2 * ffn, hidden, rows(shifted(d.ffn, ffn))));
      } else {
        CLEAVE_ASSIGN_OR_RETURN(layer.w_gate, f.matrix(name("gate"), ffn, hidden, rows(d.ffn)));
        CLEAVE_ASSIGN_OR_RETURN(layer.w_up, f.matrix(name("up"), ffn, hidden, rows(d.ffn)));
      }
      CLEAVE_ASSIGN_OR_RETURN(layer.w_down, f.matrix(name("down"), hidden, ffn, cols(d.ffn)));
    }
    if (on_layer) on_layer(layer.bytes());
    w.layers.push_back(std::move(layer));
  }
  CLEAVE_ASSIGN_OR_RETURN(w.output_norm, f.norm(f.outputNormName(), hidden));
  const std::string head = c.tie_word_embeddings ? f.embeddingName() : f.outputName();
  CLEAVE_ASSIGN_OR_RETURN(w.output, f.matrix(head, c.vocab_size, hidden, rows(d.vocab)));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<LlamaWeights>> loadLlama(const std::string& path, TpShard shard,
                                                        const LayerLoaded& on_layer) {
  if (path.size() >= 5 && path.substr(path.size() - 5) == ".gguf")
    return loadLlamaGguf(path, shard, on_layer);
  return loadLlamaSafetensors(path, shard, on_layer);
}

absl::StatusOr<std::unique_ptr<LlamaWeights>> loadLlamaGguf(const std::string& path, TpShard shard,
                                                            const LayerLoaded& on_layer) {
  auto w = std::make_unique<LlamaWeights>();
  CLEAVE_ASSIGN_OR_RETURN(w->gguf, model::GgufFile::open(path));
  CLEAVE_ASSIGN_OR_RETURN(w->config, model::configFromGguf(*w->gguf));
  CLEAVE_RETURN_IF_ERROR(cpu::ropeSupported(w->config.rope_scaling));
  CLEAVE_ASSIGN_OR_RETURN(w->dims, planShard(w->config, shard));
  // llama.cpp's converter permutes the Q/K rows of "llama" files (Llama, Mistral, Mixtral)
  // for adjacent-pair rotation, and DeepSeek's rope part rotates adjacent pairs as trained;
  // Qwen files keep Hugging Face's halves (its NEOX rope). SmolLM3's and Granite's files are
  // permuted as llama's; GLM-4's rotary part pairs adjacent values as trained.
  w->rope_pairing = w->config.model_type == "llama" || w->config.model_type == "smollm3" ||
                            w->config.model_type == "granite" || w->config.model_type == "glm4" ||
                            w->config.mla
                        ? cpu::RopePairing::kAdjacent
                        : cpu::RopePairing::kHalves;
  GgufSource source(*w->gguf, w->config.architecture);
  source.setCpuKernels(shard.cpu_kernels);
  CLEAVE_RETURN_IF_ERROR(loadTensors(source, *w, on_layer));
  return w;
}

absl::StatusOr<std::unique_ptr<LlamaWeights>> loadLlamaSafetensors(const std::string& folder,
                                                                   TpShard shard,
                                                                   const LayerLoaded& on_layer) {
  auto w = std::make_unique<LlamaWeights>();
  CLEAVE_ASSIGN_OR_RETURN(w->config, model::loadModelConfig(folder));
  CLEAVE_RETURN_IF_ERROR(cpu::ropeSupported(w->config.rope_scaling));
  CLEAVE_ASSIGN_OR_RETURN(w->dims, planShard(w->config, shard));
  CLEAVE_ASSIGN_OR_RETURN(w->safetensors, model::SafetensorsCheckpoint::open(folder));
  // Hugging Face heads rotate halves; DeepSeek's latent rope part (rope_interleave) and GLM-4's
  // rotary part rotate adjacent pairs.
  w->rope_pairing = (w->config.mla && w->config.mla->rope_interleave) ||
                            w->config.architecture == Architecture::kGlm4
                        ? cpu::RopePairing::kAdjacent
                        : cpu::RopePairing::kHalves;
  CLEAVE_ASSIGN_OR_RETURN(model::QuantizationInfo quantization,
                          model::readQuantizationInfo(folder));
  w->activations_quantized = quantization.activations_quantized;
  SafetensorsSource source(*w->safetensors, quantization, w->config.architecture);
  source.setCpuKernels(shard.cpu_kernels);
  // Gemma's and Qwen3.5's RMSNorms scale by 1 + w (Qwen3.5's gated norm in linear attention by
  // its w, read as a plain vector).
  if (w->config.architecture == model::Architecture::kGemma3 ||
      w->config.architecture == model::Architecture::kGemma2 ||
      w->config.architecture == model::Architecture::kQwen35)
    source.setNormOffset(1.0f);
  CLEAVE_RETURN_IF_ERROR(loadTensors(source, *w, on_layer));
  return w;
}

absl::StatusOr<MoeBlock> loadMoeBlock(const model::SafetensorsCheckpoint& checkpoint,
                                      const model::ModelConfig& config, uint32_t layer) {
  if (!config.moe) return absl::InvalidArgumentError("the model has no mixture-of-experts layers");
  CLEAVE_ASSIGN_OR_RETURN(ShardDims whole, planShard(config, {}));
  return SafetensorsSource(checkpoint, {}).moe(layer, config, whole);
}

void LlamaLayer::forEachMatrix(
    const std::function<void(MatrixKind, const cpu::CpuMatrix&)>& fn) const {
  for (const cpu::CpuMatrix* m : {&wq, &wk, &wv, &wo}) fn(MatrixKind::kAttention, *m);
  if (linear) {
    for (const cpu::CpuMatrix* m : {&linear->q, &linear->k, &linear->v, &linear->z, &linear->b,
                                    &linear->a, &linear->qkvz, &linear->ba, &linear->out})
      fn(MatrixKind::kAttention, *m);
  }
  if (mla) {
    for (const cpu::CpuMatrix* m : {&mla->q_a, &mla->q_b, &mla->kv_a})
      fn(MatrixKind::kAttention, *m);
    for (const auto* heads : {&mla->k_absorb, &mla->v_up})
      for (const cpu::CpuMatrix& m : *heads) fn(MatrixKind::kAttention, m);
  }
  for (const cpu::CpuMatrix* m : {&w_gate, &w_up, &w_down}) fn(MatrixKind::kMlp, *m);
  if (!moe) return;
  fn(MatrixKind::kRouter, moe->router);
  auto expert = [&](MatrixKind kind, const MoeExpert& e) {
    for (const cpu::CpuMatrix* m : {&e.gate, &e.up, &e.down}) fn(kind, *m);
  };
  if (moe->shared) expert(MatrixKind::kMlp, *moe->shared);
  for (const MoeExpert& e : moe->experts) expert(MatrixKind::kRoutedExpert, e);
}

int64_t LlamaLayer::bytes() const {
  int64_t total = static_cast<int64_t>(attn_norm.size() + ffn_norm.size() + post_attn_norm.size() +
                                       post_ffn_norm.size()) *
                  4;
  if (mla) total += static_cast<int64_t>(mla->q_a_norm.size() + mla->kv_a_norm.size()) * 4;
  if (linear) {
    total += static_cast<int64_t>(linear->conv.size() + linear->a_rate.size() +
                                  linear->dt_bias.size() + linear->norm.size()) *
             4;
  }
  forEachMatrix([&](MatrixKind, const cpu::CpuMatrix& m) { total += m.bytes(); });
  return total;
}

int64_t LlamaWeights::routedExpertBytes() const {
  int64_t bytes = 0;
  for (const LlamaLayer& l : layers) {
    l.forEachMatrix([&](MatrixKind kind, const cpu::CpuMatrix& m) {
      if (kind == MatrixKind::kRoutedExpert) bytes += m.bytes();
    });
  }
  return bytes;
}

namespace {

// Parameters of a kind of product, and those of them multiplied as floats.
struct Share {
  double all = 0, floats = 0;
  void add(const cpu::CpuMatrix& m) {
    const double params = static_cast<double>(m.rows()) * static_cast<double>(m.cols());
    all += params;
    if (!m.multipliesInt8()) floats += params;
  }
  double share() const { return all > 0 ? floats / all : 0.0; }
};

// By MatrixKind, and the head last.
std::array<Share, 5> sharesOf(const LlamaWeights& w) {
  std::array<Share, 5> shares;
  for (const LlamaLayer& l : w.layers) {
    l.forEachMatrix([&](MatrixKind kind, const cpu::CpuMatrix& m) {
      shares[static_cast<size_t>(kind)].add(m);
    });
  }
  shares[4].add(w.output);
  return shares;
}

}  // namespace

bool LlamaWeights::multipliesInt8() const {
  for (const Share& s : sharesOf(*this)) {
    if (s.floats < s.all) return true;
  }
  return false;
}

bool LlamaWeights::multipliesBf16() const {
  bool any = output.multipliesBf16();
  for (const LlamaLayer& l : layers)
    l.forEachMatrix([&](MatrixKind, const cpu::CpuMatrix& m) { any = any || m.multipliesBf16(); });
  return any;
}

roofline::Workload::FloatProducts LlamaWeights::floatProducts() const {
  const std::array<Share, 5> s = sharesOf(*this);
  auto of = [&](MatrixKind kind) { return s[static_cast<size_t>(kind)].share(); };
  return {.attention = of(MatrixKind::kAttention),
          .mlp = of(MatrixKind::kMlp),
          .experts = of(MatrixKind::kRoutedExpert),
          .lm_head = s[4].share()};
}

int64_t LlamaWeights::weightBytes() const {
  int64_t bytes = output.bytes() + static_cast<int64_t>(output_norm.size()) * 4;
  for (const LlamaLayer& l : layers) bytes += l.bytes();
  return bytes + token_embd.rowBytes();
}

}  // namespace cleave::engine
