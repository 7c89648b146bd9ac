#include "services/engine/llama_weights.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace cleave::engine {
namespace {

using model::GgufFile;
using model::GgufTensor;

absl::StatusOr<const GgufTensor*> tensor(const GgufFile& file, const std::string& name,
                                         std::vector<uint64_t> dims) {
  const GgufTensor* t = file.findTensor(name);
  if (t == nullptr) {
    return absl::NotFoundError(absl::StrCat(file.path(), ": tensor \"", name, "\" is missing"));
  }
  if (t->dims != dims) {
    auto text = [](const std::vector<uint64_t>& d) {
      std::string s = "[";
      for (size_t i = 0; i < d.size(); ++i) absl::StrAppend(&s, i ? ", " : "", d[i]);
      return s + "]";
    };
    return absl::InvalidArgumentError(absl::StrCat(file.path(), ": tensor \"", name, "\" has dims ",
                                                   text(t->dims), ", the config implies ",
                                                   text(dims)));
  }
  return t;
}

absl::StatusOr<cpu::CpuMatrix> matrix(const GgufFile& file, const std::string& name, uint64_t rows,
                                      uint64_t cols) {
  CLEAVE_ASSIGN_OR_RETURN(const GgufTensor* t, tensor(file, name, {cols, rows}));
  auto m = cpu::CpuMatrix::create({.type = t->type,
                                   .rows = static_cast<int64_t>(rows),
                                   .cols = static_cast<int64_t>(cols),
                                   .data = t->data});
  if (!m.ok())
    return absl::InvalidArgumentError(
        absl::StrCat(file.path(), ": tensor \"", name, "\": ", m.status().message()));
  return m;
}

absl::StatusOr<std::vector<float>> vector(const GgufFile& file, const std::string& name,
                                          uint64_t size) {
  CLEAVE_ASSIGN_OR_RETURN(const GgufTensor* t, tensor(file, name, {size}));
  std::vector<float> out(size);
  CLEAVE_RETURN_IF_ERROR(model::dequantize(t->type, t->data, size, out.data()));
  return out;
}

absl::Status checkSupported(const model::ModelConfig& c, const std::string& path) {
  if (c.architecture != model::Architecture::kLlama &&
      c.architecture != model::Architecture::kQwen2 &&
      c.architecture != model::Architecture::kQwen3 &&
      c.architecture != model::Architecture::kMixtral &&
      c.architecture != model::Architecture::kQwen3Moe) {
    return absl::UnimplementedError(absl::StrCat(
        path, ": architecture ", model::architectureName(c.architecture),
        " is not supported by the engine yet (Llama, Qwen2, Qwen3, Mixtral and Qwen3-MoE are)"));
  }
  return cpu::ropeSupported(c.rope_scaling);
}

// A safetensors tensor with the expected shape (outermost first).
absl::StatusOr<const model::SafetensorsTensor*> stTensor(const model::SafetensorsCheckpoint& ckpt,
                                                         const std::string& name,
                                                         std::vector<uint64_t> shape) {
  const model::SafetensorsTensor* t = ckpt.find(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("tensor \"", name, "\" is missing"));
  if (t->shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat(t->file, ": tensor \"", name, "\" has ",
                                                   t->shape.size(),
                                                   " dims that do not match the config"));
  }
  return t;
}

absl::StatusOr<cpu::CpuMatrix> stMatrix(const model::SafetensorsCheckpoint& ckpt,
                                        const std::string& name, uint64_t rows, uint64_t cols) {
  CLEAVE_ASSIGN_OR_RETURN(const model::SafetensorsTensor* t, stTensor(ckpt, name, {rows, cols}));
  return cpu::CpuMatrix::create({.type = t->dtype,
                                 .rows = static_cast<int64_t>(rows),
                                 .cols = static_cast<int64_t>(cols),
                                 .data = t->data});
}

absl::StatusOr<std::vector<float>> stVector(const model::SafetensorsCheckpoint& ckpt,
                                            const std::string& name, uint64_t size) {
  CLEAVE_ASSIGN_OR_RETURN(const model::SafetensorsTensor* t, stTensor(ckpt, name, {size}));
  std::vector<float> out(size);
  CLEAVE_RETURN_IF_ERROR(model::dequantize(t->dtype, t->data, size, out.data()));
  return out;
}

// The MoE block of layer prefix `p` ("model.layers.3."), named as Mixtral or Qwen3-MoE
// checkpoints name it.
absl::StatusOr<MoeBlock> stMoe(const model::SafetensorsCheckpoint& f, const model::ModelConfig& c,
                               const std::string& p) {
  const bool mixtral = c.architecture == model::Architecture::kMixtral;
  const std::string base = p + (mixtral ? "block_sparse_moe." : "mlp.");
  const uint64_t hidden = c.hidden_size, ffn = c.moe->expert_intermediate_size;
  MoeBlock block;
  CLEAVE_ASSIGN_OR_RETURN(block.router,
                          stMatrix(f, base + "gate.weight", c.moe->num_experts, hidden));
  for (uint32_t e = 0; e < c.moe->num_experts; ++e) {
    const std::string x = absl::StrCat(base, "experts.", e, ".");
    MoeExpert expert;
    CLEAVE_ASSIGN_OR_RETURN(
        expert.gate, stMatrix(f, x + (mixtral ? "w1.weight" : "gate_proj.weight"), ffn, hidden));
    CLEAVE_ASSIGN_OR_RETURN(
        expert.up, stMatrix(f, x + (mixtral ? "w3.weight" : "up_proj.weight"), ffn, hidden));
    CLEAVE_ASSIGN_OR_RETURN(
        expert.down, stMatrix(f, x + (mixtral ? "w2.weight" : "down_proj.weight"), hidden, ffn));
    block.experts.push_back(std::move(expert));
  }
  return block;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LlamaWeights>> loadLlama(const std::string& path) {
  if (path.size() >= 5 && path.substr(path.size() - 5) == ".gguf") return loadLlamaGguf(path);
  return loadLlamaSafetensors(path);
}

absl::StatusOr<std::unique_ptr<LlamaWeights>> loadLlamaSafetensors(const std::string& folder) {
  auto w = std::make_unique<LlamaWeights>();
  CLEAVE_ASSIGN_OR_RETURN(w->config, model::loadModelConfig(folder));
  const model::ModelConfig& c = w->config;
  CLEAVE_RETURN_IF_ERROR(checkSupported(c, folder));
  CLEAVE_ASSIGN_OR_RETURN(w->safetensors, model::SafetensorsCheckpoint::open(folder));
  const model::SafetensorsCheckpoint& f = *w->safetensors;
  w->rope_pairing = cpu::RopePairing::kHalves;
  const uint64_t hidden = c.hidden_size, q_dim = uint64_t{c.num_heads} * c.head_dim,
                 kv_dim = uint64_t{c.num_kv_heads} * c.head_dim, ffn = c.intermediate_size;
  CLEAVE_ASSIGN_OR_RETURN(const model::SafetensorsTensor* embd,
                          stTensor(f, "model.embed_tokens.weight", {c.vocab_size, hidden}));
  w->token_embd = {.type = embd->dtype,
                   .data = embd->data,
                   .rows = c.vocab_size,
                   .cols = static_cast<int64_t>(hidden)};
  for (uint32_t i = 0; i < c.num_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    LlamaLayer layer;
    CLEAVE_ASSIGN_OR_RETURN(layer.attn_norm, stVector(f, p + "input_layernorm.weight", hidden));
    CLEAVE_ASSIGN_OR_RETURN(layer.wq, stMatrix(f, p + "self_attn.q_proj.weight", q_dim, hidden));
    CLEAVE_ASSIGN_OR_RETURN(layer.wk, stMatrix(f, p + "self_attn.k_proj.weight", kv_dim, hidden));
    CLEAVE_ASSIGN_OR_RETURN(layer.wv, stMatrix(f, p + "self_attn.v_proj.weight", kv_dim, hidden));
    CLEAVE_ASSIGN_OR_RETURN(layer.wo, stMatrix(f, p + "self_attn.o_proj.weight", hidden, q_dim));
    if (c.attention_bias) {
      CLEAVE_ASSIGN_OR_RETURN(layer.bq, stVector(f, p + "self_attn.q_proj.bias", q_dim));
      CLEAVE_ASSIGN_OR_RETURN(layer.bk, stVector(f, p + "self_attn.k_proj.bias", kv_dim));
      CLEAVE_ASSIGN_OR_RETURN(layer.bv, stVector(f, p + "self_attn.v_proj.bias", kv_dim));
    }
    if (c.qk_norm) {
      CLEAVE_ASSIGN_OR_RETURN(layer.q_norm, stVector(f, p + "self_attn.q_norm.weight", c.head_dim));
      CLEAVE_ASSIGN_OR_RETURN(layer.k_norm, stVector(f, p + "self_attn.k_norm.weight", c.head_dim));
    }
    CLEAVE_ASSIGN_OR_RETURN(layer.ffn_norm,
                            stVector(f, p + "post_attention_layernorm.weight", hidden));
    if (c.isMoeLayer(i)) {
      CLEAVE_ASSIGN_OR_RETURN(layer.moe, stMoe(f, c, p));
    } else {
      CLEAVE_ASSIGN_OR_RETURN(layer.w_gate, stMatrix(f, p + "mlp.gate_proj.weight", ffn, hidden));
      CLEAVE_ASSIGN_OR_RETURN(layer.w_up, stMatrix(f, p + "mlp.up_proj.weight", ffn, hidden));
      CLEAVE_ASSIGN_OR_RETURN(layer.w_down, stMatrix(f, p + "mlp.down_proj.weight", hidden, ffn));
    }
    w->layers.push_back(std::move(layer));
  }
  CLEAVE_ASSIGN_OR_RETURN(w->output_norm, stVector(f, "model.norm.weight", hidden));
  const std::string head = c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
  CLEAVE_ASSIGN_OR_RETURN(w->output, stMatrix(f, head, c.vocab_size, hidden));
  return w;
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

absl::StatusOr<std::unique_ptr<LlamaWeights>> loadLlamaGguf(const std::string& path) {
  auto w = std::make_unique<LlamaWeights>();
  CLEAVE_ASSIGN_OR_RETURN(w->gguf, GgufFile::open(path));
  const GgufFile& f = *w->gguf;
  CLEAVE_ASSIGN_OR_RETURN(w->config, model::configFromGguf(f));
  const model::ModelConfig& c = w->config;
  CLEAVE_RETURN_IF_ERROR(checkSupported(c, path));
  if (c.moe) {
    return absl::UnimplementedError(
        absl::StrCat(path,
                     ": mixture-of-experts GGUF files are not supported yet; "
                     "use the Hugging Face checkpoint"));
  }
  // GGUF llama files store Q/K permuted for adjacent-pair rotation.
  w->rope_pairing = cpu::RopePairing::kAdjacent;
  const uint64_t hidden = c.hidden_size, q_dim = uint64_t{c.num_heads} * c.head_dim,
                 kv_dim = uint64_t{c.num_kv_heads} * c.head_dim, ffn = c.intermediate_size;
  CLEAVE_ASSIGN_OR_RETURN(const GgufTensor* embd,
                          tensor(f, "token_embd.weight", {hidden, c.vocab_size}));
  w->token_embd = {.type = embd->type,
                   .data = embd->data,
                   .rows = c.vocab_size,
                   .cols = static_cast<int64_t>(hidden)};
  for (uint32_t i = 0; i < c.num_layers; ++i) {
    const std::string p = absl::StrCat("blk.", i, ".");
    LlamaLayer layer;
    CLEAVE_ASSIGN_OR_RETURN(layer.attn_norm, vector(f, p + "attn_norm.weight", hidden));
    CLEAVE_ASSIGN_OR_RETURN(layer.wq, matrix(f, p + "attn_q.weight", q_dim, hidden));
    CLEAVE_ASSIGN_OR_RETURN(layer.wk, matrix(f, p + "attn_k.weight", kv_dim, hidden));
    CLEAVE_ASSIGN_OR_RETURN(layer.wv, matrix(f, p + "attn_v.weight", kv_dim, hidden));
    CLEAVE_ASSIGN_OR_RETURN(layer.wo, matrix(f, p + "attn_output.weight", hidden, q_dim));
    if (c.attention_bias) {
      CLEAVE_ASSIGN_OR_RETURN(layer.bq, vector(f, p + "attn_q.bias", q_dim));
      CLEAVE_ASSIGN_OR_RETURN(layer.bk, vector(f, p + "attn_k.bias", kv_dim));
      CLEAVE_ASSIGN_OR_RETURN(layer.bv, vector(f, p + "attn_v.bias", kv_dim));
    }
    if (c.qk_norm) {
      CLEAVE_ASSIGN_OR_RETURN(layer.q_norm, vector(f, p + "attn_q_norm.weight", c.head_dim));
      CLEAVE_ASSIGN_OR_RETURN(layer.k_norm, vector(f, p + "attn_k_norm.weight", c.head_dim));
    }
    CLEAVE_ASSIGN_OR_RETURN(layer.ffn_norm, vector(f, p + "ffn_norm.weight", hidden));
    CLEAVE_ASSIGN_OR_RETURN(layer.w_gate, matrix(f, p + "ffn_gate.weight", ffn, hidden));
    CLEAVE_ASSIGN_OR_RETURN(layer.w_up, matrix(f, p + "ffn_up.weight", ffn, hidden));
    CLEAVE_ASSIGN_OR_RETURN(layer.w_down, matrix(f, p + "ffn_down.weight", hidden, ffn));
    w->layers.push_back(std::move(layer));
  }
  CLEAVE_ASSIGN_OR_RETURN(w->output_norm, vector(f, "output_norm.weight", hidden));
  const std::string head = c.tie_word_embeddings ? "token_embd.weight" : "output.weight";
  CLEAVE_ASSIGN_OR_RETURN(w->output, matrix(f, head, c.vocab_size, hidden));
  return w;
}

}  // namespace cleave::engine
