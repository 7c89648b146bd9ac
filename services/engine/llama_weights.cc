#include "services/engine/llama_weights.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace cleave::engine {
namespace {

using model::Architecture;

std::string shapeText(const std::vector<uint64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) absl::StrAppend(&s, i ? ", " : "", d[i]);
  return s + "]";
}

// Where the loader finds tensors, in one file format with that format's names. Shapes are
// given as the model sees them: a matrix is [rows = outputs, cols = inputs].
class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // The name of a per-layer tensor, `role` being one of the keys of the name tables below.
  virtual std::string layerTensor(uint32_t layer, const std::string& role) const = 0;
  virtual std::string embeddingName() const = 0;
  virtual std::string outputNormName() const = 0;
  virtual std::string outputName() const = 0;
  // The stored bytes of tensor `name` with `dims` in the model's [rows, cols] order.
  struct Stored {
    model::TensorType type;
    const uint8_t* data;
  };
  virtual absl::StatusOr<Stored> find(const std::string& name,
                                      std::vector<uint64_t> dims) const = 0;
  virtual absl::StatusOr<MoeBlock> moe(uint32_t layer, const model::ModelConfig& c) const = 0;

  absl::StatusOr<cpu::CpuMatrix> matrix(const std::string& name, uint64_t rows,
                                        uint64_t cols) const {
    CLEAVE_ASSIGN_OR_RETURN(Stored t, find(name, {rows, cols}));
    auto m = cpu::CpuMatrix::create({.type = t.type,
                                     .rows = static_cast<int64_t>(rows),
                                     .cols = static_cast<int64_t>(cols),
                                     .data = t.data});
    if (!m.ok())
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", name, "\": ", m.status().message()));
    return m;
  }
  absl::StatusOr<std::vector<float>> vector(const std::string& name, uint64_t size) const {
    CLEAVE_ASSIGN_OR_RETURN(Stored t, find(name, {size}));
    std::vector<float> out(size);
    CLEAVE_RETURN_IF_ERROR(model::dequantize(t.type, t.data, size, out.data()));
    return out;
  }
};

class GgufSource final : public TensorSource {
 public:
  explicit GgufSource(const model::GgufFile& file) : file_(file) {}
  std::string layerTensor(uint32_t layer, const std::string& role) const override {
    static const std::map<std::string, std::string> kNames = {{"attn_norm", "attn_norm.weight"},
                                                              {"q", "attn_q.weight"},
                                                              {"k", "attn_k.weight"},
                                                              {"v", "attn_v.weight"},
                                                              {"o", "attn_output.weight"},
                                                              {"q_bias", "attn_q.bias"},
                                                              {"k_bias", "attn_k.bias"},
                                                              {"v_bias", "attn_v.bias"},
                                                              {"q_norm", "attn_q_norm.weight"},
                                                              {"k_norm", "attn_k_norm.weight"},
                                                              {"ffn_norm", "ffn_norm.weight"},
                                                              {"gate", "ffn_gate.weight"},
                                                              {"up", "ffn_up.weight"},
                                                              {"down", "ffn_down.weight"}};
    return absl::StrCat("blk.", layer, ".", kNames.at(role));
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
    return Stored{t->type, t->data};
  }
  absl::StatusOr<MoeBlock> moe(uint32_t, const model::ModelConfig&) const override {
    return absl::UnimplementedError(
        absl::StrCat(file_.path(),
                     ": mixture-of-experts GGUF files are not supported "
                     "yet; use the Hugging Face checkpoint"));
  }

 private:
  const model::GgufFile& file_;
};

class SafetensorsSource final : public TensorSource {
 public:
  explicit SafetensorsSource(const model::SafetensorsCheckpoint& checkpoint) : ckpt_(checkpoint) {}
  std::string layerTensor(uint32_t layer, const std::string& role) const override {
    static const std::map<std::string, std::string> kNames = {
        {"attn_norm", "input_layernorm.weight"},
        {"q", "self_attn.q_proj.weight"},
        {"k", "self_attn.k_proj.weight"},
        {"v", "self_attn.v_proj.weight"},
        {"o", "self_attn.o_proj.weight"},
        {"q_bias", "self_attn.q_proj.bias"},
        {"k_bias", "self_attn.k_proj.bias"},
        {"v_bias", "self_attn.v_proj.bias"},
        {"q_norm", "self_attn.q_norm.weight"},
        {"k_norm", "self_attn.k_norm.weight"},
        {"ffn_norm", "post_attention_layernorm.weight"},
        {"gate", "mlp.gate_proj.weight"},
        {"up", "mlp.up_proj.weight"},
        {"down", "mlp.down_proj.weight"}};
    return absl::StrCat("model.layers.", layer, ".", kNames.at(role));
  }
  std::string embeddingName() const override { return "model.embed_tokens.weight"; }
  std::string outputNormName() const override { return "model.norm.weight"; }
  std::string outputName() const override { return "lm_head.weight"; }
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
  // Mixtral names its MoE block "block_sparse_moe" with experts w1 (gate), w3 (up),
  // w2 (down); Qwen3-MoE and DeepSeek-V3 "mlp" with gate_proj / up_proj / down_proj, and
  // DeepSeek adds gate.e_score_correction_bias and shared_experts.
  absl::StatusOr<MoeBlock> moe(uint32_t layer, const model::ModelConfig& c) const override {
    const bool mixtral = c.architecture == Architecture::kMixtral;
    const std::string base =
        absl::StrCat("model.layers.", layer, ".", mixtral ? "block_sparse_moe." : "mlp.");
    const uint64_t hidden = c.hidden_size, ffn = c.moe->expert_intermediate_size;
    auto mlp = [&](const std::string& x, uint64_t width) -> absl::StatusOr<MoeExpert> {
      MoeExpert expert;
      CLEAVE_ASSIGN_OR_RETURN(
          expert.gate, matrix(x + (mixtral ? "w1.weight" : "gate_proj.weight"), width, hidden));
      CLEAVE_ASSIGN_OR_RETURN(
          expert.up, matrix(x + (mixtral ? "w3.weight" : "up_proj.weight"), width, hidden));
      CLEAVE_ASSIGN_OR_RETURN(
          expert.down, matrix(x + (mixtral ? "w2.weight" : "down_proj.weight"), hidden, width));
      return expert;
    };
    MoeBlock block;
    CLEAVE_ASSIGN_OR_RETURN(block.router, matrix(base + "gate.weight", c.moe->num_experts, hidden));
    for (uint32_t e = 0; e < c.moe->num_experts; ++e) {
      CLEAVE_ASSIGN_OR_RETURN(MoeExpert expert, mlp(absl::StrCat(base, "experts.", e, "."), ffn));
      block.experts.push_back(std::move(expert));
    }
    if (c.moe->score_correction_bias) {
      CLEAVE_ASSIGN_OR_RETURN(block.score_bias,
                              vector(base + "gate.e_score_correction_bias", c.moe->num_experts));
    }
    if (c.moe->shared_experts > 0) {
      CLEAVE_ASSIGN_OR_RETURN(
          block.shared, mlp(base + "shared_experts.", uint64_t{c.moe->shared_experts} *
                                                          c.moe->shared_expert_intermediate_size));
    }
    return block;
  }

 private:
  const model::SafetensorsCheckpoint& ckpt_;
};

absl::Status checkSupported(const model::ModelConfig& c, const std::string& path) {
  const Architecture a = c.architecture;
  if (a != Architecture::kLlama && a != Architecture::kQwen2 && a != Architecture::kQwen3 &&
      a != Architecture::kMixtral && a != Architecture::kQwen3Moe) {
    return absl::UnimplementedError(absl::StrCat(
        path, ": architecture ", model::architectureName(a),
        " is not supported by the engine yet (Llama, Qwen2, Qwen3, Mixtral and Qwen3-MoE are)"));
  }
  return cpu::ropeSupported(c.rope_scaling);
}

// Everything but the source and the RoPE pairing is the same for every file format.
absl::Status loadTensors(const TensorSource& f, LlamaWeights& w) {
  const model::ModelConfig& c = w.config;
  const uint64_t hidden = c.hidden_size, q_dim = uint64_t{c.num_heads} * c.head_dim,
                 kv_dim = uint64_t{c.num_kv_heads} * c.head_dim, ffn = c.intermediate_size;
  CLEAVE_ASSIGN_OR_RETURN(TensorSource::Stored embd,
                          f.find(f.embeddingName(), {c.vocab_size, hidden}));
  w.token_embd = {.type = embd.type,
                  .data = embd.data,
                  .rows = c.vocab_size,
                  .cols = static_cast<int64_t>(hidden)};
  for (uint32_t i = 0; i < c.num_layers; ++i) {
    auto name = [&](const char* role) { return f.layerTensor(i, role); };
    LlamaLayer layer;
    CLEAVE_ASSIGN_OR_RETURN(layer.attn_norm, f.vector(name("attn_norm"), hidden));
    CLEAVE_ASSIGN_OR_RETURN(layer.wq, f.matrix(name("q"), q_dim, hidden));
    CLEAVE_ASSIGN_OR_RETURN(layer.wk, f.matrix(name("k"), kv_dim, hidden));
    CLEAVE_ASSIGN_OR_RETURN(layer.wv, f.matrix(name("v"), kv_dim, hidden));
    CLEAVE_ASSIGN_OR_RETURN(layer.wo, f.matrix(name("o"), hidden, q_dim));
    if (c.attention_bias) {
      CLEAVE_ASSIGN_OR_RETURN(layer.bq, f.vector(name("q_bias"), q_dim));
      CLEAVE_ASSIGN_OR_RETURN(layer.bk, f.vector(name("k_bias"), kv_dim));
      CLEAVE_ASSIGN_OR_RETURN(layer.bv, f.vector(name("v_bias"), kv_dim));
    }
    if (c.qk_norm) {
      CLEAVE_ASSIGN_OR_RETURN(layer.q_norm, f.vector(name("q_norm"), c.head_dim));
      CLEAVE_ASSIGN_OR_RETURN(layer.k_norm, f.vector(name("k_norm"), c.head_dim));
    }
    CLEAVE_ASSIGN_OR_RETURN(layer.ffn_norm, f.vector(name("ffn_norm"), hidden));
    if (c.isMoeLayer(i)) {
      CLEAVE_ASSIGN_OR_RETURN(layer.moe, f.moe(i, c));
    } else {
      CLEAVE_ASSIGN_OR_RETURN(layer.w_gate, f.matrix(name("gate"), ffn, hidden));
      CLEAVE_ASSIGN_OR_RETURN(layer.w_up, f.matrix(name("up"), ffn, hidden));
      CLEAVE_ASSIGN_OR_RETURN(layer.w_down, f.matrix(name("down"), hidden, ffn));
    }
    w.layers.push_back(std::move(layer));
  }
  CLEAVE_ASSIGN_OR_RETURN(w.output_norm, f.vector(f.outputNormName(), hidden));
  const std::string head = c.tie_word_embeddings ? f.embeddingName() : f.outputName();
  CLEAVE_ASSIGN_OR_RETURN(w.output, f.matrix(head, c.vocab_size, hidden));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<LlamaWeights>> loadLlama(const std::string& path) {
  if (path.size() >= 5 && path.substr(path.size() - 5) == ".gguf") return loadLlamaGguf(path);
  return loadLlamaSafetensors(path);
}

absl::StatusOr<std::unique_ptr<LlamaWeights>> loadLlamaGguf(const std::string& path) {
  auto w = std::make_unique<LlamaWeights>();
  CLEAVE_ASSIGN_OR_RETURN(w->gguf, model::GgufFile::open(path));
  CLEAVE_ASSIGN_OR_RETURN(w->config, model::configFromGguf(*w->gguf));
  CLEAVE_RETURN_IF_ERROR(checkSupported(w->config, path));
  // GGUF llama-family files store Q/K permuted for adjacent-pair rotation.
  w->rope_pairing = cpu::RopePairing::kAdjacent;
  CLEAVE_RETURN_IF_ERROR(loadTensors(GgufSource(*w->gguf), *w));
  return w;
}

absl::StatusOr<std::unique_ptr<LlamaWeights>> loadLlamaSafetensors(const std::string& folder) {
  auto w = std::make_unique<LlamaWeights>();
  CLEAVE_ASSIGN_OR_RETURN(w->config, model::loadModelConfig(folder));
  CLEAVE_RETURN_IF_ERROR(checkSupported(w->config, folder));
  CLEAVE_ASSIGN_OR_RETURN(w->safetensors, model::SafetensorsCheckpoint::open(folder));
  w->rope_pairing = cpu::RopePairing::kHalves;
  CLEAVE_RETURN_IF_ERROR(loadTensors(SafetensorsSource(*w->safetensors), *w));
  return w;
}

absl::StatusOr<MoeBlock> loadMoeBlock(const model::SafetensorsCheckpoint& checkpoint,
                                      const model::ModelConfig& config, uint32_t layer) {
  if (!config.moe) return absl::InvalidArgumentError("the model has no mixture-of-experts layers");
  return SafetensorsSource(checkpoint).moe(layer, config);
}

int64_t LlamaWeights::weightBytes() const {
  int64_t bytes = output.bytes() + static_cast<int64_t>(output_norm.size()) * 4;
  for (const LlamaLayer& l : layers) {
    bytes += l.wq.bytes() + l.wk.bytes() + l.wv.bytes() + l.wo.bytes() + l.w_gate.bytes() +
             l.w_up.bytes() + l.w_down.bytes() +
             static_cast<int64_t>(l.attn_norm.size() + l.ffn_norm.size()) * 4 +
             (l.moe ? l.moe->bytes() : 0);
  }
  return bytes + token_embd.rowBytes();
}

}  // namespace cleave::engine
