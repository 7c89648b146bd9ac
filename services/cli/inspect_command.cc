// `cleave inspect MODEL`: a model's architecture, its tensors and its weight bytes.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/flags.h"
#include "common/model/gguf_file.h"
#include "common/model/model_config.h"
#include "common/model/quantization.h"
#include "common/model/safetensors_file.h"
#include "services/cli/commands.h"

namespace cleave::cli {
namespace {

using model::TensorType;

struct TensorRow {
  std::string name;
  TensorType type;
  std::string shape;
  uint64_t bytes;
};

std::string humanBytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", value, units[unit]);
}

std::string shapeText(const std::vector<uint64_t>& dims) {
  return "[" + absl::StrJoin(dims, ", ") + "]";
}

void printConfig(const model::ModelConfig& c) {
  std::printf("architecture: %s (%s)\n", model::architectureName(c.architecture),
              c.model_type.c_str());
  std::printf("  hidden_size %u, intermediate_size %u, layers %u, heads %u (kv %u), head_dim %u\n",
              c.hidden_size, c.intermediate_size, c.num_layers, c.num_heads, c.num_kv_heads,
              c.head_dim);
  std::printf("  vocab %u, context %u, rms_norm_eps %g, rope_theta %g, rope_scaling %s",
              c.vocab_size, c.max_position_embeddings, c.rms_norm_eps, c.rope_theta,
              c.rope_scaling.type.c_str());
  if (c.rope_scaling.type != "none") std::printf(" (factor %g)", c.rope_scaling.factor);
  if (c.rope_scaling.type == "longrope") {
    // Which set runs depends on the context served (--max-model-len), as vLLM chooses it.
    std::printf(
        "\n  longrope: original context %u, attention factor %g; the long factors for "
        "a served context above %u, else the short ones",
        c.rope_scaling.original_max_position_embeddings,
        c.rope_scaling.attention_factor.value_or(1.0),
        c.rope_scaling.original_max_position_embeddings);
  }
  std::printf("\n  tie_word_embeddings %s, attention_bias %s, qk_norm %s\n",
              c.tie_word_embeddings ? "yes" : "no", c.attention_bias ? "yes" : "no",
              !c.qk_norm               ? "no"
              : c.qk_norm_across_heads ? "yes (across all heads)"
                                       : "yes");
  std::printf("  bos %s, eos [%s]\n",
              c.bos_token_id ? std::to_string(*c.bos_token_id).c_str() : "none",
              absl::StrJoin(c.eos_token_ids, ", ").c_str());
  if (c.rotary_dim > 0) std::printf("  rotary dims: the first %u of each head\n", c.rotary_dim);
  if (!c.nope_layers.empty()) {
    const int64_t nope = std::count(c.nope_layers.begin(), c.nope_layers.end(), true);
    std::printf("  without rotary embedding (NoPE): %lld of %u layers\n",
                static_cast<long long>(nope), c.num_layers);
  }
  if (c.query_scale_beta != 0) {
    std::printf("  query temperature: 1 + %g ln(1 + floor(position / %u))\n", c.query_scale_beta,
                c.query_scale_period);
  }
  if (const auto& la = c.linear_attention) {
    std::printf(
        "  linear attention (Gated DeltaNet) on %u of %u layers: %u key heads of %u, %u value "
        "heads of %u, convolution of %u taps%s; the others attend%s\n",
        c.linearLayers(), c.num_layers, la->key_heads, la->key_head_dim, la->value_heads,
        la->value_head_dim, la->conv_kernel,
        la->grouped_qkvz ? ", projections grouped by key head" : "",
        c.attention_output_gate ? " with an output gate" : "");
  }
  if (c.sliding_window > 0) {
    const int64_t sliding = std::count(c.sliding_layers.begin(), c.sliding_layers.end(), true);
    std::printf("  sliding window %u on %lld of %u layers", c.sliding_window,
                static_cast<long long>(sliding), c.num_layers);
    if (c.sliding_rope_theta > 0) std::printf(" (their rope_theta %g)", c.sliding_rope_theta);
    std::printf("\n");
  }
  if (c.post_norms) {
    std::printf(
        "  norms after attention and the MLP%s, %s MLP, embeddings x %g, softmax scale %g, "
        "final logit soft cap %g%s\n",
        c.pre_norms ? " (and before)" : " only",
        c.mlp_activation == model::MlpActivation::kGeluTanh ? "GELU (tanh)" : "SiLU",
        c.embedding_scale, c.attention_scale, c.final_logit_softcap,
        c.attention_softcap > 0
            ? absl::StrCat(", attention score soft cap ", c.attention_softcap).c_str()
            : "");
  }
  if (c.residual_scale != 1.0 || c.logits_scaling != 1.0) {  // Granite
    std::printf(
        "  embeddings x %g, block outputs x %g before the residual add, softmax scale %g, "
        "logits / %g\n",
        c.embedding_scale, c.residual_scale, c.attention_scale, c.logits_scaling);
  }
  if (c.moe) {
    const model::MoeConfig& m = *c.moe;
    std::printf(
        "  moe: %u experts, top-%u, expert intermediate %u, %s scoring%s, shared %u, groups "
        "%u/%u, scaling %g, first dense layers %u\n",
        m.num_experts, m.experts_per_token, m.expert_intermediate_size,
        m.scoring == model::MoeScoring::kSigmoid ? "sigmoid" : "softmax",
        m.norm_topk_prob ? " (renormalized)" : "", m.shared_experts, m.topk_group, m.n_group,
        m.routed_scaling_factor, m.first_k_dense);
  }
  if (c.mla) {
    std::printf("  mla: q_lora_rank %u, kv_lora_rank %u, qk_nope %u, qk_rope %u, v %u\n",
                c.mla->q_lora_rank, c.mla->kv_lora_rank, c.mla->qk_nope_head_dim,
                c.mla->qk_rope_head_dim, c.mla->v_head_dim);
  }
}

void printTensors(const std::vector<TensorRow>& rows, bool list) {
  std::map<std::string, std::pair<int, uint64_t>> by_type;
  uint64_t total = 0;
  if (list) std::printf("tensors:\n");
  for (const TensorRow& row : rows) {
    if (list) {
      std::printf("  %-48s %-8s %-20s %12llu\n", row.name.c_str(), model::tensorTypeName(row.type),
                  row.shape.c_str(), static_cast<unsigned long long>(row.bytes));
    }
    auto& [count, bytes] = by_type[model::tensorTypeName(row.type)];
    ++count;
    bytes += row.bytes;
    total += row.bytes;
  }
  std::printf("tensors by type:\n");
  for (const auto& [name, entry] : by_type) {
    std::printf("  %-8s %5d tensors %14llu bytes (%s)\n", name.c_str(), entry.first,
                static_cast<unsigned long long>(entry.second), humanBytes(entry.second).c_str());
  }
  std::printf("total weight bytes: %llu (%s) in %zu tensors\n",
              static_cast<unsigned long long>(total), humanBytes(total).c_str(), rows.size());
}

}  // namespace

int runInspect(int argc, char** argv) {
  bool list_tensors = true;
  FlagSet flags("cleave inspect", "[flags] MODEL",
                "Prints a model's architecture, tensors (name, type, shape, bytes) and total "
                "weight bytes. MODEL is a GGUF file or a Hugging Face folder (config.json and "
                "*.safetensors).");
  flags.addBool("tensors", &list_tensors, "List every tensor (--no-tensors: totals only)");
  std::vector<std::string> positional = parseFlagsOrExit(flags, argc, argv);
  if (positional.size() != 1) {
    exitWithUsageError(flags, absl::InvalidArgumentError("give exactly one MODEL path"));
  }
  const std::string& path = positional[0];
  auto fail = [&](const absl::Status& status) {
    std::fprintf(stderr, "cleave inspect: %s\n", std::string(status.message()).c_str());
    return 1;
  };
  auto start = std::chrono::steady_clock::now();
  std::vector<TensorRow> rows;
  absl::StatusOr<model::ModelConfig> config;
  std::string format;
  if (std::filesystem::is_directory(path)) {
    auto checkpoint = model::SafetensorsCheckpoint::open(path);
    double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (checkpoint.ok()) {
      format = absl::StrFormat("safetensors, %zu files, opened in %.1f ms",
                               (*checkpoint)->files().size(), ms);
      for (const model::SafetensorsTensor* t : (*checkpoint)->tensors()) {
        rows.push_back({t->name, t->dtype, shapeText(t->shape), t->num_bytes});
      }
    } else if (absl::IsNotFound(checkpoint.status())) {
      format = "config only, no weights";  // A folder with config.json alone.
    } else {
      return fail(checkpoint.status());
    }
    config = model::loadModelConfig(path);
    auto quant = model::readQuantizationInfo(path);
    if (!quant.ok()) return fail(quant.status());
    if (quant->scheme != model::QuantScheme::kNone) {
      absl::StrAppend(&format, ", quantization ", quant->describe());
    }
  } else {
    auto gguf = model::GgufFile::open(path);
    if (!gguf.ok()) return fail(gguf.status());
    double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    format = absl::StrFormat("GGUF v%u, %zu metadata keys, opened in %.1f ms", (*gguf)->version(),
                             (*gguf)->metadata().size(), ms);
    for (const model::GgufTensor& t : (*gguf)->tensors()) {
      rows.push_back({t.name, t.type, shapeText(t.dims), t.num_bytes});
    }
    config = model::configFromGguf(**gguf);
  }
  std::printf("model: %s (%s)\n", path.c_str(), format.c_str());
  if (config.ok()) {
    printConfig(*config);
  } else {
    std::printf("architecture: unreadable: %s\n", std::string(config.status().message()).c_str());
  }
  printTensors(rows, list_tensors);
  return config.ok() ? 0 : 1;
}

}  // namespace cleave::cli
