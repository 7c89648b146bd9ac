#include "services/roofline/roofline.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace cleave::roofline {
namespace {

struct Profile {
  double bandwidth, bf16, fp8, fp4, link, latency;
};

// Per GPU; dense peaks; links one way. RTX PRO 6000: 1792 GB/s less ~10% for ECC, PCIe 5
// P2P; one-shot P2P all-reduce of a small buffer ~8 us.
const std::map<std::string, Profile>& profiles() {
  static const auto* p = new std::map<std::string, Profile>{
      {"rtx-pro-6000", {1.61e12, 500e12, 1000e12, 2000e12, 54e9, 8e-6}},
      {"rtx-5090", {1.79e12, 209e12, 419e12, 838e12, 54e9, 8e-6}},
      {"h100", {3.35e12, 989e12, 1979e12, 1979e12, 450e9, 5e-6}},
      {"h200", {4.8e12, 989e12, 1979e12, 1979e12, 450e9, 5e-6}},
      {"b200", {8.0e12, 2250e12, 4500e12, 9000e12, 900e9, 5e-6}},
  };
  return *p;
}

// Parameters of one layer's attention projections.
double attentionParams(const model::ModelConfig& c) {
  const double h = c.hidden_size;
  if (c.mla) {
    const model::MlaConfig& m = *c.mla;
    const double qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
    const double q = m.q_lora_rank
                         ? h * m.q_lora_rank + static_cast<double>(m.q_lora_rank) * c.num_heads * qk
                         : h * c.num_heads * qk;
    return q + h * (m.kv_lora_rank + m.qk_rope_head_dim) +
           static_cast<double>(m.kv_lora_rank) * c.num_heads * (m.qk_nope_head_dim + m.v_head_dim) +
           static_cast<double>(c.num_heads) * m.v_head_dim * h;
  }
  const double q = static_cast<double>(c.num_heads) * c.head_dim,
               kv = static_cast<double>(c.num_kv_heads) * c.head_dim;
  // Gated attention's query projection gives each head as many gate values.
  return h * ((c.attention_output_gate ? 3 : 2) * q + 2 * kv);
}

// One linear-attention layer: its projections' parameters (queries, keys, values, gate z, b,
// a; the output), the floats of one sequence's state, and the FLOPs of one token's state
// update per layer (decay, Sᵀk, the rank-one update, Sᵀq: about 7 per state element).
struct LinearLayerCost {
  double params = 0, state_floats = 0, flops_per_token = 0;
};
LinearLayerCost linearLayerCost(const model::ModelConfig& c) {
  if (!c.linear_attention) return {};
  const model::LinearAttentionConfig& la = *c.linear_attention;
  const double h = c.hidden_size;
  const double kd = double(la.key_heads) * la.key_head_dim;
  const double vd = double(la.value_heads) * la.value_head_dim;
  const double state = double(la.value_heads) * la.key_head_dim * la.value_head_dim;
  return {.params = h * (2 * kd + 2 * vd + 2.0 * la.value_heads) + vd * h,
          .state_floats = state + (la.conv_kernel - 1.0) * (2 * kd + vd),
          .flops_per_token = 7.0 * state};
}

// KV elements one position stores per layer, and how many ranks share them.
double kvElements(const model::ModelConfig& c) {
  if (c.mla) return c.mla->kv_lora_rank + c.mla->qk_rope_head_dim;  // One latent, all heads.
  return 2.0 * c.num_kv_heads * c.head_dim;
}

// Query-key and value widths of one head, for attention FLOPs.
std::pair<double, double> headDims(const model::ModelConfig& c) {
  if (c.mla) {
    return {c.mla->qk_nope_head_dim + c.mla->qk_rope_head_dim, c.mla->v_head_dim};
  }
  return {c.head_dim, c.head_dim};
}

std::string si(double v, const char* unit) {
  const char* prefixes[] = {"", "K", "M", "G", "T", "P"};
  int i = 0;
  while (std::fabs(v) >= 1000 && i < 5) v /= 1000, ++i;
  return absl::StrFormat("%.3g %s%s", v, prefixes[i], unit);
}

}  // namespace

std::vector<std::string> builtinHardwareNames() {
  std::vector<std::string> names;
  for (const auto& [name, p] : profiles()) names.push_back(name);
  return names;
}

absl::StatusOr<Hardware> builtinHardware(const std::string& name, const std::string& dtype) {
  auto it = profiles().find(name);
  if (it == profiles().end()) {
    return absl::NotFoundError(absl::StrCat("unknown hardware '", name, "'; known: ",
                                            absl::StrJoin(builtinHardwareNames(), ", "), ", cpu"));
  }
  const Profile& p = it->second;
  double peak;
  if (dtype == "bf16" || dtype == "fp16") {
    peak = p.bf16;
  } else if (dtype == "fp8") {
    peak = p.fp8;
  } else if (dtype == "fp4" || dtype == "nvfp4") {
    peak = p.fp4;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype must be bf16, fp8 or fp4 on a GPU, got '", dtype, "'"));
  }
  return Hardware{.name = name,
                  .bandwidth = p.bandwidth,
                  .peak_flops = peak,
                  .attention_flops = p.bf16,
                  .link_bandwidth = p.link,
                  .link_latency = p.latency};
}

AttentionSpan attentionSpan(int64_t start, int64_t tokens, int64_t window) {
  if (tokens <= 0) return {};
  // Token i (from 0) sees min(start + i + 1, window) positions: the sum of min(x, window)
  // over x in [start + 1, start + tokens].
  const int64_t first = start + 1, last = start + tokens;
  if (window <= 0) return {.attended = (first + last) * tokens / 2, .kv_positions = last};
  const int64_t top = std::min(last, window);
  int64_t attended = tokens * window;
  if (first <= top) attended = (first + top) * (top - first + 1) / 2 + (last - top) * window;
  return {.attended = attended, .kv_positions = last - std::max<int64_t>(0, start - window + 1)};
}

Workload decodeStep(int64_t sequences, int64_t context, int64_t window) {
  const AttentionSpan all = attentionSpan(context - 1, context > 0 ? 1 : 0, 0);
  const AttentionSpan windowed = attentionSpan(context - 1, context > 0 ? 1 : 0, window);
  return {.sequences = sequences,
          .new_tokens = sequences,
          .attended = sequences * all.attended,
          .kv_positions = sequences * all.kv_positions,
          .windowed_attended = sequences * windowed.attended,
          .windowed_kv_positions = sequences * windowed.kv_positions};
}

Workload prefillChunk(int64_t tokens, int64_t context, int64_t window) {
  const AttentionSpan all = attentionSpan(context, tokens, 0);
  const AttentionSpan windowed = attentionSpan(context, tokens, window);
  return {.sequences = 1,
          .new_tokens = tokens,
          .attended = all.attended,
          .kv_positions = all.kv_positions,
          .windowed_attended = windowed.attended,
          .windowed_kv_positions = windowed.kv_positions};
}

double expectedDistinctExperts(int64_t experts, int64_t k, int64_t tokens) {
  if (experts <= 0) return 0;
  return experts * (1.0 - std::pow(1.0 - static_cast<double>(k) / experts, tokens));
}

absl::StatusOr<Terms> stepFloor(const model::ModelConfig& c, const Hardware& hw,
                                const Workload& w) {
  if (w.tp < 1 || w.sequences < 1 || w.new_tokens < 1 || w.attended < 0) {
    return absl::InvalidArgumentError("tp, sequences and tokens must be >= 1");
  }
  if (hw.bandwidth <= 0 || hw.peak_flops <= 0 || hw.attention_flops <= 0) {
    return absl::InvalidArgumentError("the hardware profile has no bandwidth or peak");
  }
  const double h = c.hidden_size, tp = w.tp;
  int64_t moe_layers = 0;
  for (uint32_t l = 0; l < c.num_layers; ++l) moe_layers += c.isMoeLayer(l);
  const int64_t dense_layers = c.num_layers - moe_layers;
  int64_t sliding = 0;  // Layers attending to a window only.
  for (uint32_t l = 0; l < c.num_layers; ++l)
    sliding += !c.isLinearLayer(l) && c.attentionWindow(l) > 0;
  const double full = static_cast<double>(c.kvLayers() - sliding);
  const double linear_layers = c.linearLayers();
  const LinearLayerCost linear = linearLayerCost(c);
  Terms t;
  // Parameters read, and those each token multiplies with, by product (their peaks may
  // differ: Workload::float_products).
  const double attention = c.kvLayers() * attentionParams(c) + linear_layers * linear.params;
  double mlp = dense_layers * 3.0 * h * c.intermediate_size, experts = 0, router = 0;
  double read = attention + mlp;
  if (c.moe && moe_layers > 0) {
    const model::MoeConfig& m = *c.moe;
    const double expert = 3.0 * h * m.expert_intermediate_size;
    const double shared = 3.0 * h * m.shared_experts * m.shared_expert_intermediate_size;
    t.expected_experts = expectedDistinctExperts(m.num_experts, m.experts_per_token, w.new_tokens);
    read += moe_layers * (t.expected_experts * expert + shared);
    mlp += moe_layers * shared;
    experts = moe_layers * m.experts_per_token * expert;
    router = moe_layers * h * m.num_experts;
  }
  // Split over the ranks, but for the router, which every rank holds and runs whole.
  const double split_per_token = attention + mlp + experts;
  const double lm_head = static_cast<double>(c.vocab_size) * h;
  read += lm_head;
  t.weight_bytes = w.weight_bytes > 0 ? w.weight_bytes : (read / tp + router) * w.bytes_per_weight;
  if (w.weight_bytes > 0 && c.moe && c.moe->num_experts > 0) {
    t.weight_bytes -= w.routed_expert_bytes * (1.0 - t.expected_experts / c.moe->num_experts);
  }
  // MLA's latent is shared by all heads, so every rank keeps all of it.
  const double kv_share = c.mla ? 1.0 : 1.0 / std::min<double>(tp, c.num_kv_heads);
  const double kv_positions = w.kv_positions * full + double(w.windowed_kv_positions) * sliding;
  t.kv_bytes = kv_positions * kvElements(c) * w.bytes_per_kv * kv_share;
  // Each linear-attention layer reads and writes every sequence's state (floats), split by
  // heads over the ranks.
  t.kv_bytes += 2.0 * w.sequences * linear_layers * linear.state_floats * 4 / tp;
  // The residual stream read and written once per layer, in 16 bits.
  t.activation_bytes = double(w.new_tokens) * h * 2 * 2 * c.num_layers;
  t.linear_flops = (2.0 * w.new_tokens * split_per_token + 2.0 * w.sequences * lm_head) / tp +
                   2.0 * w.new_tokens * router;
  const double float_peak = hw.float_peak_flops > 0 ? hw.float_peak_flops : hw.peak_flops;
  const Workload::FloatProducts& f = w.float_products;
  auto seconds = [&](double params, double rows, double float_share, double ranks) {
    return 2.0 * rows * params / ranks *
           (float_share / float_peak + (1.0 - float_share) / hw.peak_flops);
  };
  const double tokens = static_cast<double>(w.new_tokens);
  const double linear_seconds =
      seconds(attention, tokens, f.attention, tp) + seconds(mlp, tokens, f.mlp, tp) +
      seconds(experts, tokens, f.experts, tp) + seconds(router, tokens, 1.0, 1) +
      seconds(lm_head, static_cast<double>(w.sequences), f.lm_head, tp);
  const auto [qk, v] = headDims(c);
  const double attended = w.attended * full + double(w.windowed_attended) * sliding;
  t.attention_flops =
      (2.0 * attended * c.num_heads * (qk + v) + tokens * linear_layers * linear.flops_per_token) /
      tp;
  t.memory_seconds = (t.weight_bytes + t.kv_bytes + t.activation_bytes) / hw.bandwidth;
  t.compute_seconds = linear_seconds + t.attention_flops / hw.attention_flops;
  if (w.tp > 1 && hw.link_bandwidth > 0) {
    const double bytes = double(w.new_tokens) * h * 2;
    const double one = hw.link_latency + 2.0 * (tp - 1) / tp * bytes / hw.link_bandwidth;
    t.collective_seconds = 2.0 * c.num_layers * one;
  }
  t.floor_seconds = std::max(t.memory_seconds, t.compute_seconds) + t.collective_seconds;
  return t;
}

std::string formatTerms(const Terms& t, const Workload& w) {
  std::string s;
  auto row = [&](const std::string& name, const std::string& value) {
    absl::StrAppend(&s, absl::StrFormat("  %-34s %s\n", name, value));
  };
  row("weight bytes read (per rank)", si(t.weight_bytes, "B"));
  if (t.expected_experts > 0) {
    row("distinct experts per MoE layer", absl::StrFormat("%.1f", t.expected_experts));
  }
  row("KV bytes read (per rank)", si(t.kv_bytes, "B"));
  row("activation bytes", si(t.activation_bytes, "B"));
  row("linear FLOPs (per rank)", si(t.linear_flops, "FLOP"));
  row("attention FLOPs (per rank)", si(t.attention_flops, "FLOP"));
  row("memory time", absl::StrFormat("%.3f ms", t.memory_seconds * 1e3));
  row("compute time", absl::StrFormat("%.3f ms", t.compute_seconds * 1e3));
  row("collectives (TP)", absl::StrFormat("%.3f ms", t.collective_seconds * 1e3));
  row("floor", absl::StrFormat("%.3f ms (%s-bound)", t.floor_seconds * 1e3,
                               t.memory_seconds >= t.compute_seconds ? "memory" : "compute"));
  row("ceiling", absl::StrFormat("%.0f tokens/s", w.new_tokens / t.floor_seconds));
  return s;
}

}  // namespace cleave::roofline
