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
                                                   text(t->dims), ", the config implies ", text(dims)));
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
  if (!m.ok()) return absl::InvalidArgumentError(absl::StrCat(file.path(), ": tensor \"", name, "\": ", m.status().message()));
  return m;
}

absl::StatusOr<std::vector<float>> vector(const GgufFile& file, const std::string& name, uint64_t size) {
  CLEAVE_ASSIGN_OR_RETURN(const GgufTensor* t, tensor(file, name, {size}));
  std::vector<float> out(size);
  CLEAVE_RETURN_IF_ERROR(model::dequantize(t->type, t->data, size, out.data()));
  return out;
}

}  // namespace

int64_t LlamaWeights::weightBytes() const {
  int64_t bytes = output.bytes() + static_cast<int64_t>(output_norm.size()) * 4;
  for (const LlamaLayer& l : layers) {
    bytes += l.wq.bytes() + l.wk.bytes() + l.wv.bytes() + l.wo.bytes() + l.w_gate.bytes() +
             l.w_up.bytes() + l.w_down.bytes() +
             static_cast<int64_t>(l.attn_norm.size() + l.ffn_norm.size()) * 4;
  }
  return bytes + static_cast<int64_t>(token_embd->num_bytes / token_embd->dims[1]);
}

absl::StatusOr<std::unique_ptr<LlamaWeights>> loadLlamaGguf(const std::string& path) {
  auto w = std::make_unique<LlamaWeights>();
  CLEAVE_ASSIGN_OR_RETURN(w->file, GgufFile::open(path));
  const GgufFile& f = *w->file;
  CLEAVE_ASSIGN_OR_RETURN(w->config, model::configFromGguf(f));
  const model::ModelConfig& c = w->config;
  if (c.architecture != model::Architecture::kLlama) {
    return absl::UnimplementedError(absl::StrCat(path, ": architecture ", model::architectureName(c.architecture),
                                                 " is not supported by the engine yet (dense llama only)"));
  }
  CLEAVE_RETURN_IF_ERROR(cpu::ropeSupported(c.rope_scaling));
  // GGUF llama files store Q/K permuted for adjacent-pair rotation.
  w->rope_pairing = cpu::RopePairing::kAdjacent;
  const uint64_t hidden = c.hidden_size, q_dim = uint64_t{c.num_heads} * c.head_dim,
                 kv_dim = uint64_t{c.num_kv_heads} * c.head_dim, ffn = c.intermediate_size;
  CLEAVE_ASSIGN_OR_RETURN(w->token_embd, tensor(f, "token_embd.weight", {hidden, c.vocab_size}));
  for (uint32_t i = 0; i < c.num_layers; ++i) {
    const std::string p = absl::StrCat("blk.", i, ".");
    LlamaLayer layer;
    CLEAVE_ASSIGN_OR_RETURN(layer.attn_norm, vector(f, p + "attn_norm.weight", hidden));
    CLEAVE_ASSIGN_OR_RETURN(layer.wq, matrix(f, p + "attn_q.weight", q_dim, hidden));
    CLEAVE_ASSIGN_OR_RETURN(layer.wk, matrix(f, p + "attn_k.weight", kv_dim, hidden));
    CLEAVE_ASSIGN_OR_RETURN(layer.wv, matrix(f, p + "attn_v.weight", kv_dim, hidden));
    CLEAVE_ASSIGN_OR_RETURN(layer.wo, matrix(f, p + "attn_output.weight", hidden, q_dim));
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
