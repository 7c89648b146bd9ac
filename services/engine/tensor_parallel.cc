#include "services/engine/tensor_parallel.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace cleave::engine {
namespace {

// MLP columns are cut on quantization block boundaries: 256 covers the K-quants, 32 the
// other GGUF block formats, 16 the NVFP4 scale groups; a width that is none of them is a
// float model's, cut anywhere.
int64_t columnUnit(int64_t width, int parts) {
  for (int64_t unit : {256, 32, 16}) {
    if (width % unit == 0 && width / unit >= parts) return unit;
  }
  return 1;
}

}  // namespace

absl::StatusOr<MoeSplit> parseMoeSplit(absl::string_view text) {
  if (text == "experts") return MoeSplit::kExperts;
  if (text == "columns") return MoeSplit::kColumns;
  return absl::InvalidArgumentError(
      absl::StrCat("--moe-split is experts or columns, not '", text, "'"));
}

absl::StatusOr<Span> splitEvenly(int64_t total, int64_t unit, int parts, int index,
                                 const char* what) {
  if (parts < 1 || index < 0 || index >= parts) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", index, " of ", parts, " ranks"));
  }
  if (unit < 1 || total % unit != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", total, " is not a whole number of ", unit));
  }
  const int64_t units = total / unit;
  if (units < parts) {
    return absl::InvalidArgumentError(absl::StrCat("cannot split the ", units, " ", what, " over ",
                                                   parts,
                                                   " tensor-parallel ranks; use --tp <= ", units));
  }
  const int64_t base = units / parts, extra = units % parts;
  const int64_t begin = index * base + std::min<int64_t>(index, extra);
  const int64_t size = base + (index < extra ? 1 : 0);
  return Span{.begin = begin * unit, .size = size * unit};
}

absl::StatusOr<ShardDims> planShard(const model::ModelConfig& c, TpShard shard) {
  ShardDims d;
  d.shard = shard;
  if (c.mla) {
    // Every rank keeps the whole latent (one cached head) and a run of the query heads.
    d.kv_heads = {.begin = 0, .size = 1};
    CLEAVE_ASSIGN_OR_RETURN(d.heads,
                            splitEvenly(c.num_heads, 1, shard.size, shard.rank, "attention heads"));
  } else {
    CLEAVE_ASSIGN_OR_RETURN(d.kv_heads,
                            splitEvenly(c.num_kv_heads, 1, shard.size, shard.rank, "KV heads"));
    const int64_t group = c.num_kv_heads ? c.num_heads / c.num_kv_heads : 0;
    d.heads = {.begin = d.kv_heads.begin * group, .size = d.kv_heads.size * group};
  }
  if (c.linear_attention) {
    // Linear attention: a run of key heads with the value heads that read them.
    const model::LinearAttentionConfig& la = *c.linear_attention;
    if (la.tiled_value_heads && shard.size > 1) {
      return absl::UnimplementedError(absl::StrCat(
          c.source,
          ": its linear-attention value heads are tiled over the key heads (llama.cpp's "
          "Qwen3.5 layout), so no rank holds a run of them; run it with --tp 1, or the Hugging "
          "Face checkpoint with --tp ",
          shard.size));
    }
    CLEAVE_ASSIGN_OR_RETURN(d.linear_key_heads, splitEvenly(la.key_heads, 1, shard.size, shard.rank,
                                                            "linear-attention key heads"));
    const int64_t group = la.value_heads / la.key_heads;
    d.linear_value_heads = {.begin = d.linear_key_heads.begin * group,
                            .size = d.linear_key_heads.size * group};
  }
  CLEAVE_ASSIGN_OR_RETURN(d.vocab,
                          splitEvenly(c.vocab_size, 1, shard.size, shard.rank, "vocabulary rows"));
  if (c.intermediate_size > 0) {
    CLEAVE_ASSIGN_OR_RETURN(
        d.ffn, splitEvenly(c.intermediate_size, columnUnit(c.intermediate_size, shard.size),
                           shard.size, shard.rank, "MLP columns"));
  }
  if (c.moe) {
    const int64_t expert_ffn = c.moe->expert_intermediate_size;
    if (shard.moe_split == MoeSplit::kExperts) {
      CLEAVE_ASSIGN_OR_RETURN(
          d.experts, splitEvenly(c.moe->num_experts, 1, shard.size, shard.rank, "experts"));
      d.expert_ffn = {.begin = 0, .size = expert_ffn};
    } else {
      d.experts = {.begin = 0, .size = c.moe->num_experts};
      CLEAVE_ASSIGN_OR_RETURN(
          d.expert_ffn, splitEvenly(expert_ffn, columnUnit(expert_ffn, shard.size), shard.size,
                                    shard.rank, "expert columns"));
    }
    const int64_t shared = int64_t{c.moe->shared_experts} * c.moe->shared_expert_intermediate_size;
    if (shared > 0) {
      CLEAVE_ASSIGN_OR_RETURN(
          d.shared_ffn, splitEvenly(shared, columnUnit(shared, shard.size), shard.size, shard.rank,
                                    "shared-expert columns"));
    }
  }
  return d;
}

}  // namespace cleave::engine
