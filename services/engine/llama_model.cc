#include "services/engine/llama_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/vector_ops.h"
#include "services/engine/checked_matmul.h"

namespace cleave::engine {

using cpu::addRowBias;

LlamaModel::LlamaModel(const LlamaWeights& weights, cpu::ThreadPool& pool, Communicator* comm)
    : w_(weights),
      pool_(pool),
      solo_(comm ? nullptr : soloCommunicator()),
      comm_(comm ? comm : solo_.get()),
      rope_(weights.config, weights.rope_pairing),
      sliding_rope_(cpu::slidingRope(weights.config, weights.rope_pairing)) {
  if (weights.config.moe) moe_.emplace(*weights.config.moe, weights.config.hidden_size, pool);
  if (weights.config.mla) mla_.emplace(weights.config, weights.dims.heads.size, pool);
  if (weights.config.linear_attention) linear_.emplace(weights.config, weights.dims, pool);
}

int64_t logitRows(std::span<const SequenceChunk> batch) {
  int64_t rows = 0;
  for (const SequenceChunk& chunk : batch) rows += chunk.logits;
  return rows;
}

absl::Status validateBatch(std::span<const SequenceChunk> batch, uint32_t vocab_size,
                           int64_t block_size, int64_t total_blocks, int64_t state_slots) {
  if (batch.empty()) return absl::InvalidArgumentError("empty batch");
  for (size_t s = 0; s < batch.size(); ++s) {
    const SequenceChunk& chunk = batch[s];
    if (chunk.tokens.empty())
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, " has no tokens"));
    for (uint32_t id : chunk.tokens) {
      if (id >= vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("token id ", id, " is outside the vocabulary (", vocab_size, ")"));
      }
    }
    if (chunk.logits < 1 || chunk.logits > static_cast<int64_t>(chunk.tokens.size())) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, " asks for ", chunk.logits,
                                                     " rows of logits from ", chunk.tokens.size(),
                                                     " tokens"));
    }
    const int64_t end = chunk.start + static_cast<int64_t>(chunk.tokens.size());
    if (chunk.start < 0 ||
        (end + block_size - 1) / block_size > static_cast<int64_t>(chunk.blocks.size())) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": ", chunk.blocks.size(),
                                                     " blocks cannot hold ", end, " positions"));
    }
    for (int32_t b : chunk.blocks) {
      if (b < 0 || b >= total_blocks) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", s, ": block ", b, " is outside the cache"));
      }
    }
    if (state_slots == 0) {
      if (chunk.state_from >= 0 || chunk.state_to >= 0 || !chunk.row_states.empty())
        return absl::InvalidArgumentError(absl::StrCat(
            "sequence ", s,
            " names a state checkpoint or row state; the model keeps no linear-attention state"));
      continue;
    }
    if (chunk.row_states.size() >= chunk.tokens.size())
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", s, " keeps the state after ", chunk.row_states.size(),
                       " rows of its ", chunk.tokens.size(), " (at most all but the last)"));
    for (int32_t slot : chunk.row_states) {
      if (slot < -1 || slot >= state_slots)
        return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": row state ", slot,
                                                       " is outside the cache's ", state_slots,
                                                       " state slots"));
    }
    if (chunk.state < 0 || chunk.state >= state_slots) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", s, ": state slot ", chunk.state, " is outside the cache's ", state_slots,
          " (a model with linear-attention layers needs one per sequence)"));
    }
    for (size_t other = 0; other < s; ++other) {
      if (batch[other].state == chunk.state) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequences ", other, " and ", s, " share state slot ", chunk.state));
      }
    }
    for (const auto& [slot, what] :
         {std::pair{chunk.state_from, "state_from"}, std::pair{chunk.state_to, "state_to"}}) {
      if (slot < -1 || slot >= state_slots)
        return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": ", what, " ", slot,
                                                       " is outside the cache's ", state_slots,
                                                       " state slots"));
    }
    if (chunk.state_from >= 0 && chunk.start == 0)
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", s, " starts at position 0 from a state checkpoint (a fresh state)"));
  }
  // Checkpoint slots apart from every sequence's slot, and no slot written twice or both
  // read and written.
  for (size_t s = 0; s < batch.size() && state_slots > 0; ++s) {
    for (size_t other = 0; other < batch.size(); ++other) {
      const SequenceChunk& a = batch[s];
      const SequenceChunk& b = batch[other];
      if ((a.state_from >= 0 && a.state_from == b.state) ||
          (a.state_to >= 0 && (a.state_to == b.state || a.state_to == b.state_from ||
                               (other != s && a.state_to == b.state_to)))) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", s, "'s state checkpoint slot (from ", a.state_from, ", to ",
                         a.state_to, ") is one sequence ", other, " uses too"));
      }
      // A row state is written: no other slot of the batch may be it.
      for (size_t i = 0; i < a.row_states.size(); ++i) {
        const int32_t slot = a.row_states[i];
        if (slot < 0) continue;
        const bool twice = std::find(b.row_states.begin() + (other == s ? i + 1 : 0),
                                     b.row_states.end(), slot) != b.row_states.end();
        if (twice || slot == b.state || slot == b.state_from || slot == b.state_to)
          return absl::InvalidArgumentError(absl::StrCat("sequence ", s, "'s row state slot ", slot,
                                                         " is one sequence ", other, " uses too"));
      }
    }
  }
  return absl::OkStatus();
}

void copyStateCheckpoints(std::span<const SequenceChunk> batch, KvStorage& cache, bool before) {
  const size_t bytes = static_cast<size_t>(cache.options().state_floats) * sizeof(float);
  for (const SequenceChunk& chunk : batch) {
    if (before && chunk.state_from >= 0)
      std::memcpy(cache.state(chunk.state), cache.state(chunk.state_from), bytes);
    if (!before && chunk.state_to >= 0)
      std::memcpy(cache.state(chunk.state_to), cache.state(chunk.state), bytes);
  }
}

int32_t LlamaModel::addAdapter(std::shared_ptr<const LoraAdapter> adapter) {
  adapters_.push_back(std::move(adapter));
  return static_cast<int32_t>(adapters_.size() - 1);
}

void LlamaModel::addLora(int64_t layer, const float* x, int64_t ldx,
                         std::initializer_list<LoraOutput> outputs) {
  if (!lora_step_) return;
  lora_runs_.clear();
  int64_t width = 0;    // Of the outputs an adapter updates, end to end.
  int64_t updated = 0;  // Rows of the widest output's runs.
  int64_t step_rows = 0;
  for (const LoraOutput& output : outputs) {
    int64_t row = 0, out = 0, rows = 0;
    for (const SequenceChunk& chunk : batch_) {
      const int64_t n = static_cast<int64_t>(chunk.tokens.size());
      const LoraProjection* p =
          chunk.adapter >= 0 ? adapters_[chunk.adapter]->find(layer, output.target) : nullptr;
      if (p != nullptr) {
        lora_runs_.push_back({p, &output, row, n, width});
        out = p->out;
        rows += n;
      }
      row += n;
    }
    width += out;
    updated = std::max(updated, rows);
    step_rows = row;
  }
  if (lora_runs_.empty()) return;
  // Every update in one pool job. Row t of a run gets y[t] += sum_i (A x[t])[i] * bt[i] over
  // its columns: r dots, then r runs of axpy. Each element sees the same operations in the
  // same order whatever the split, so a row's result does not depend on the step it is in (a
  // prompt and its decode, chunked or not, batched or alone, agree bit for bit). A decode
  // step's few rows split by columns (each thread redoes their r dots, cheap next to a pool
  // job per product); a prompt's many split by rows.
  const bool by_rows = updated >= 4 * pool_.size();
  pool_.parallelFor(by_rows ? step_rows : width, by_rows ? 1 : 64, [&](int64_t begin, int64_t end) {
    for (const LoraRun& run : lora_runs_) {
      if (by_rows) {
        addLoraRun(run, x, ldx, std::max(begin, run.row), std::min(end, run.row + run.rows), 0,
                   run.p->out);
      } else {
        addLoraRun(run, x, ldx, run.row, run.row + run.rows,
                   std::max(begin, run.column) - run.column,
                   std::min(end, run.column + run.p->out) - run.column);
      }
    }
  });
}

void LlamaModel::addLoraRun(const LoraRun& run, const float* x, int64_t ldx, int64_t t0, int64_t t1,
                            int64_t from, int64_t to) {
  if (t0 >= t1 || from >= to) return;
  const LoraProjection& p = *run.p;
  thread_local std::vector<float> mid;
  mid.resize(p.r);
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t i = 0; i < p.r; ++i) mid[i] = cpu::dot(p.a.data() + i * p.in, x + t * ldx, p.in);
    float* y = run.output->y + t * run.output->ldy;
    for (int64_t i = 0; i < p.r; ++i) {
      cpu::axpy(mid[i], p.bt.data() + i * p.out + from, y + from, to - from);
    }
  }
}

absl::Status LlamaModel::reduce(float* data, int64_t count) {
  if (comm_->size() == 1) return absl::OkStatus();
  return comm_->allReduceSum({data, static_cast<size_t>(count)});
}

absl::Status LlamaModel::gatherLogits(int64_t rows) {
  const int64_t vocab = w_.config.vocab_size;
  if (comm_->size() == 1) {
    std::memcpy(logits_.data(), local_logits_.data(), rows * vocab * sizeof(float));
    return absl::OkStatus();
  }
  // Rank r holds vocabulary rows vocab_r of every row; the gather lays them out rank
  // after rank, and each rank's block is put back in place.
  std::vector<int64_t> counts(comm_->size());
  std::vector<Span> parts(comm_->size());
  for (int r = 0; r < comm_->size(); ++r) {
    parts[r] = *splitEvenly(vocab, 1, comm_->size(), r, "vocabulary rows");
    counts[r] = rows * parts[r].size;
  }
  gathered_.resize(rows * vocab);
  CLEAVE_RETURN_IF_ERROR(comm_->allGather(
      {local_logits_.data(), static_cast<size_t>(rows * w_.dims.vocab.size)}, counts, gathered_));
  const float* block = gathered_.data();
  for (const Span& part : parts) {
    for (int64_t s = 0; s < rows; ++s) {
      std::memcpy(logits_.data() + s * vocab + part.begin, block + s * part.size,
                  part.size * sizeof(float));
    }
    block += rows * part.size;
  }
  return absl::OkStatus();
}

void LlamaModel::ensureScratch(int64_t tokens, int64_t rows) {
  const model::ModelConfig& c = w_.config;
  x_.resize(tokens * c.hidden_size);
  h_.resize(tokens * c.hidden_size);
  if (mla_) {
    attn_.resize(tokens * w_.dims.heads.size * c.mla->v_head_dim);
  } else {
    const int64_t q_dim = w_.dims.heads.size * c.head_dim;
    const int64_t kv_dim = w_.dims.kv_heads.size * c.head_dim;
    q_.resize(tokens * q_dim);
    k_.resize(tokens * kv_dim);
    v_.resize(tokens * kv_dim);
    attn_.resize(tokens * q_dim);
    if (c.attention_output_gate) q_gate_.resize(tokens * 2 * q_dim);
  }
  if (linear_) mixer_.resize(tokens * c.hidden_size);
  if (moe_) moe_out_.resize(tokens * c.hidden_size);
  gate_.resize(tokens * w_.dims.ffn.size);
  up_.resize(tokens * w_.dims.ffn.size);
  positions_.resize(tokens);
  tables_.resize(tokens);
  last_.resize(rows * c.hidden_size);
  local_logits_.resize(rows * w_.dims.vocab.size);
  logits_.resize(rows * c.vocab_size);
}

void LlamaModel::normRows(float* rows, const std::vector<float>& norm, int64_t n) {
  if (norm.empty()) return;
  const int64_t hidden = w_.config.hidden_size;
  const float eps = static_cast<float>(w_.config.rms_norm_eps);
  pool_.parallelFor(n, 32, [&](int64_t begin, int64_t end) {
    float* x = rows + begin * hidden;
    cpu::rmsNorm(x, hidden, norm.data(), end - begin, hidden, eps, x, hidden);
  });
}

void LlamaModel::addAndNorm(const float* delta, const float* norm, int64_t n) {
  const int64_t hidden = w_.config.hidden_size;
  const float eps = static_cast<float>(w_.config.rms_norm_eps);
  pool_.parallelFor(n, 32, [&](int64_t begin, int64_t end) {
    float* x = x_.data() + begin * hidden;
    if (delta != nullptr)
      cpu::addInPlace(x, hidden, delta + begin * hidden, hidden, end - begin, hidden);
    if (norm != nullptr)
      cpu::rmsNorm(x, hidden, norm, end - begin, hidden, eps, h_.data() + begin * hidden, hidden);
  });
}

void LlamaModel::addAndPrepare(float* delta, const std::vector<float>& norm, int64_t n) {
  scaleDelta(delta, n);
  addAndNorm(delta, norm.empty() ? nullptr : norm.data(), n);
  if (norm.empty()) std::memcpy(h_.data(), x_.data(), n * w_.config.hidden_size * sizeof(float));
}

void LlamaModel::scaleDelta(float* delta, int64_t n) {
  const float scale = static_cast<float>(w_.config.residual_scale);
  if (delta == nullptr || scale == 1.0f) return;
  for (int64_t i = 0; i < n * w_.config.hidden_size; ++i) delta[i] *= scale;
}

absl::Status LlamaModel::normQkAcrossHeads(const LlamaLayer& layer, int64_t n) {
  const model::ModelConfig& c = w_.config;
  const int64_t q_dim = w_.dims.heads.size * c.head_dim;
  const int64_t kv_dim = w_.dims.kv_heads.size * c.head_dim;
  qk_squares_.resize(2 * n);
  auto squares = [](const float* x, int64_t count) {
    double sum = 0;
    for (int64_t i = 0; i < count; ++i) sum += double{x[i]} * x[i];
    return static_cast<float>(sum);
  };
  pool_.parallelFor(n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      qk_squares_[i] = squares(q_.data() + i * q_dim, q_dim);
      qk_squares_[n + i] = squares(k_.data() + i * kv_dim, kv_dim);
    }
  });
  CLEAVE_RETURN_IF_ERROR(reduce(qk_squares_.data(), 2 * n));
  const double eps = c.rms_norm_eps;
  const double q_all = static_cast<double>(c.num_heads) * c.head_dim;
  const double k_all = static_cast<double>(c.num_kv_heads) * c.head_dim;
  pool_.parallelFor(n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float q_inverse = static_cast<float>(1.0 / std::sqrt(qk_squares_[i] / q_all + eps));
      const float k_inverse = static_cast<float>(1.0 / std::sqrt(qk_squares_[n + i] / k_all + eps));
      float* q = q_.data() + i * q_dim;
      float* k = k_.data() + i * kv_dim;
      for (int64_t j = 0; j < q_dim; ++j) q[j] = q[j] * q_inverse * layer.q_norm[j];
      for (int64_t j = 0; j < kv_dim; ++j) k[j] = k[j] * k_inverse * layer.k_norm[j];
    }
  });
  return absl::OkStatus();
}

absl::Status LlamaModel::attend(const LlamaLayer& layer, int64_t l, int64_t n, KvStorage& cache) {
  const model::ModelConfig& c = w_.config;
  const int64_t hidden = c.hidden_size;
  const int64_t head_dim = c.head_dim;
  const int64_t heads = w_.dims.heads.size, kv_heads = w_.dims.kv_heads.size;
  const int64_t q_dim = heads * head_dim;
  const int64_t kv_dim = kv_heads * head_dim;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const int64_t block_size = cache.blockSize();
  // Gated attention: wq gives each head its queries, then its gates (split below).
  const bool gated = c.attention_output_gate;
  float* q_out = gated ? q_gate_.data() : q_.data();
  const int64_t ldq_out = gated ? 2 * q_dim : q_dim;
  checkedMatmulsOfOneInput(
      h_.data(), hidden, n,
      {{&layer.wq, q_out, ldq_out}, {&layer.wk, k_.data(), kv_dim}, {&layer.wv, v_.data(), kv_dim}},
      pool_);
  addLora(l, h_.data(), hidden,
          {{LoraTarget::kQ, q_out, ldq_out},
           {LoraTarget::kK, k_.data(), kv_dim},
           {LoraTarget::kV, v_.data(), kv_dim}});
  if (gated) {  // The queries to q_; the gates stay in the second half of each head's row.
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t h = 0; h < heads; ++h) {
        std::memcpy(q_.data() + i * q_dim + h * head_dim,
                    q_gate_.data() + i * 2 * q_dim + h * 2 * head_dim, head_dim * sizeof(float));
      }
    }
  }
  if (!layer.bq.empty()) {
    addRowBias(q_.data(), layer.bq.data(), n, q_dim);
    addRowBias(k_.data(), layer.bk.data(), n, kv_dim);
    addRowBias(v_.data(), layer.bv.data(), n, kv_dim);
  }
  if (!layer.q_norm.empty() && c.qk_norm_across_heads) {
    CLEAVE_RETURN_IF_ERROR(normQkAcrossHeads(layer, n));
  } else if (!layer.q_norm.empty()) {
    // Every head of every token is one row of head_dim values.
    cpu::rmsNorm(q_.data(), head_dim, layer.q_norm.data(), n * heads, head_dim, eps, q_.data(),
                 head_dim);
    cpu::rmsNorm(k_.data(), head_dim, layer.k_norm.data(), n * kv_heads, head_dim, eps, k_.data(),
                 head_dim);
  }
  // RoPE row by row over the pool, with the step's angles computed once; it rotates the
  // leading cpu::rotaryDim values of each head. Sliding layers may have their own.
  const uint32_t window = c.attentionWindow(static_cast<uint32_t>(l));
  const bool local = sliding_rope_ && window > 0;
  const cpu::Rope& rope = local ? *sliding_rope_ : rope_;
  const cpu::RopeAngles& angles = local ? sliding_angles_ : angles_;
  const bool rotate = c.rotates(static_cast<uint32_t>(l));  // SmolLM3's NoPE layers: not.
  pool_.parallelFor(n, 1, [&](int64_t begin, int64_t end) {
    if (rotate) {
      rope.apply(q_.data() + begin * q_dim, q_dim, end - begin, heads, angles, begin, head_dim);
      rope.apply(k_.data() + begin * kv_dim, kv_dim, end - begin, kv_heads, angles, begin,
                 head_dim);
    }
    // Ministral 3's query temperature past the original context.
    for (int64_t i = begin; i < end && c.query_scale_beta != 0; ++i) {
      const float scale = static_cast<float>(c.queryScale(positions_[i]));
      if (scale == 1.0f) continue;
      float* row = q_.data() + i * q_dim;
      for (int64_t j = 0; j < q_dim; ++j) row[j] *= scale;
    }
  });
  const int64_t kv_layer = c.kvLayer(static_cast<uint32_t>(l));
  uint8_t* keys = cache.keys(kv_layer);
  uint8_t* values = cache.values(kv_layer);
  // Each head's row goes to its place in the block ([block][head][position][head_dim]),
  // in the cache's element type.
  const cpu::KvType kv_type = cache.type();
  const int64_t element = cpu::kvElementBytes(kv_type);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t block = tables_[i][positions_[i] / block_size];
    const int64_t slot = positions_[i] % block_size;
    for (int64_t h = 0; h < kv_heads; ++h) {
      const int64_t at = ((block * kv_heads + h) * block_size + slot) * head_dim * element;
      cpu::encodeKv(kv_type, k_.data() + i * kv_dim + h * head_dim, head_dim, layer.k_scale,
                    keys + at);
      cpu::encodeKv(kv_type, v_.data() + i * kv_dim + h * head_dim, head_dim, layer.v_scale,
                    values + at);
    }
  }
  cpu::attention({.q = q_.data(),
                  .ldq = q_dim,
                  .tokens = n,
                  .positions = positions_.data(),
                  .block_tables = tables_.data(),
                  .k_pool = keys,
                  .v_pool = values,
                  .kv_type = kv_type,
                  .k_scale = layer.k_scale,
                  .v_scale = layer.v_scale,
                  .block_size = block_size,
                  .heads = heads,
                  .kv_heads = kv_heads,
                  .head_dim = head_dim,
                  .scale = c.attention_scale > 0 ? static_cast<float>(c.attention_scale)
                                                 : 1.0f / std::sqrt(static_cast<float>(head_dim)),
                  .sinks = layer.sinks.empty() ? nullptr : layer.sinks.data(),
                  .softcap = static_cast<float>(c.attention_softcap),
                  .window = window,
                  .out = attn_.data(),
                  .ldo = q_dim},
                 pool_);
  if (gated) {  // Each output value times the sigmoid of its gate.
    pool_.parallelFor(n, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        for (int64_t h = 0; h < heads; ++h) {
          float* o = attn_.data() + i * q_dim + h * head_dim;
          const float* g = q_gate_.data() + i * 2 * q_dim + h * 2 * head_dim + head_dim;
          for (int64_t j = 0; j < head_dim; ++j) o[j] /= 1.0f + std::exp(-g[j]);
        }
      }
    });
  }
  checkedMatmul(layer.wo, attn_.data(), q_dim, n, h_.data(), hidden, pool_);
  if (!layer.bo.empty()) addRowBias(h_.data(), layer.bo.data(), n, hidden);
  addLora(l, attn_.data(), q_dim, {{LoraTarget::kO, h_.data(), hidden}});
  return absl::OkStatus();
}

absl::StatusOr<std::span<const float>> LlamaModel::forward(std::span<const SequenceChunk> batch,
                                                           KvStorage& cache) {
  const int64_t state_floats = linearStateFloats(w_.config, w_.dims);
  if (state_floats > 0 && (cache.stateSlots() < 1 || cache.options().state_floats != state_floats))
    return absl::InvalidArgumentError(absl::StrCat(
        "the cache holds ", cache.stateSlots(), " state slots of ", cache.options().state_floats,
        " floats; the model's linear-attention layers need slots of ", state_floats));
  CLEAVE_RETURN_IF_ERROR(validateBatch(batch, w_.config.vocab_size, cache.blockSize(),
                                       cache.totalBlocks(),
                                       state_floats > 0 ? cache.stateSlots() : 0));
  const model::ModelConfig& c = w_.config;
  const int64_t hidden = c.hidden_size;
  const int64_t ffn = w_.dims.ffn.size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  int64_t n = 0;
  for (const SequenceChunk& chunk : batch) n += static_cast<int64_t>(chunk.tokens.size());
  const int64_t rows = logitRows(batch);
  lora_step_ = false;
  for (size_t s = 0; s < batch.size(); ++s) {
    const int32_t adapter = batch[s].adapter;
    if (adapter < -1 || adapter >= static_cast<int32_t>(adapters_.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", s, " names adapter ", adapter, " of ", adapters_.size()));
    }
    lora_step_ |= adapter >= 0;
  }
  batch_ = batch;
  ensureScratch(n, rows);
  if (state_floats > 0) copyStateCheckpoints(batch, cache, /*before=*/true);

  // Token rows of the batch, sequence after sequence: embeddings, positions, block tables.
  // A rank holds the embedding rows of its vocabulary range; the others are summed in.
  const EmbeddingTable& embd = w_.token_embd;
  const int64_t row_bytes = embd.rowBytes();
  int64_t t = 0;
  for (const SequenceChunk& chunk : batch) {
    for (size_t i = 0; i < chunk.tokens.size(); ++i, ++t) {
      const int64_t row = int64_t{chunk.tokens[i]} - embd.row_begin;
      if (row >= 0 && row < embd.rows) {
        CLEAVE_CHECK_OK(model::dequantize(embd.type, embd.data + row * row_bytes, hidden,
                                          x_.data() + t * hidden));
      } else {
        std::memset(x_.data() + t * hidden, 0, hidden * sizeof(float));
      }
      positions_[t] = static_cast<int32_t>(chunk.start + static_cast<int64_t>(i));
      tables_[t] = chunk.blocks.data();
    }
  }
  CLEAVE_RETURN_IF_ERROR(reduce(x_.data(), n * hidden));
  if (c.embedding_scale != 1.0) {  // Gemma: √hidden_size.
    const float scale = static_cast<float>(c.embedding_scale);
    for (int64_t i = 0; i < n * hidden; ++i) x_[i] *= scale;
  }

  rope_.angles(positions_.data(), n, angles_);
  if (sliding_rope_) sliding_rope_->angles(positions_.data(), n, sliding_angles_);
  for (size_t l = 0; l < w_.layers.size(); ++l) {
    const LlamaLayer& layer = w_.layers[l];
    addAndPrepare(nullptr, layer.attn_norm, n);
    if (layer.linear) {
      // Each sequence's state of this layer: its slot's share of the layer.
      const int64_t layer_floats = state_floats / c.linearLayers();
      const int64_t offset = c.linearLayer(static_cast<uint32_t>(l)) * layer_floats;
      linear_runs_.clear();
      linear_after_.clear();
      for (const SequenceChunk& chunk : batch) {
        for (int32_t slot : chunk.row_states)
          linear_after_.push_back(slot >= 0 ? cache.state(slot) + offset : nullptr);
      }
      float* const* after = linear_after_.data();
      for (const SequenceChunk& chunk : batch) {
        linear_runs_.push_back({.tokens = static_cast<int64_t>(chunk.tokens.size()),
                                .reset = chunk.start == 0,
                                .state = cache.state(chunk.state) + offset,
                                .after_rows = {after, chunk.row_states.size()}});
        after += chunk.row_states.size();
      }
      linear_->forward(*layer.linear, h_.data(), linear_runs_, mixer_.data());
      std::swap(h_, mixer_);
    } else if (layer.mla) {
      mla_->forward(*layer.mla,
                    {.x = h_.data(),
                     .tokens = n,
                     .positions = positions_.data(),
                     .block_tables = tables_.data(),
                     .rope = &rope_,
                     .angles = &angles_},
                    cache, c.kvLayer(static_cast<uint32_t>(l)), layer.k_scale, attn_.data());
      const int64_t o_dim = w_.dims.heads.size * c.mla->v_head_dim;
      checkedMatmul(layer.wo, attn_.data(), o_dim, n, h_.data(), hidden, pool_);
    } else {
      CLEAVE_RETURN_IF_ERROR(attend(layer, static_cast<int64_t>(l), n, cache));
    }
    CLEAVE_RETURN_IF_ERROR(reduce(h_.data(), n * hidden));
    normRows(h_.data(), layer.post_attn_norm, n);
    addAndPrepare(h_.data(), layer.ffn_norm, n);
    if (layer.moe) {
      moe_->forward(*layer.moe, h_.data(), n, moe_out_.data());
      CLEAVE_RETURN_IF_ERROR(reduce(moe_out_.data(), n * hidden));
      normRows(moe_out_.data(), layer.post_ffn_norm, n);
      scaleDelta(moe_out_.data(), n);
      addAndNorm(moe_out_.data(), nullptr, n);
      continue;
    }
    checkedMatmulsOfOneInput(h_.data(), hidden, n,
                             {{&layer.w_gate, gate_.data(), ffn}, {&layer.w_up, up_.data(), ffn}},
                             pool_);
    addLora(static_cast<int64_t>(l), h_.data(), hidden,
            {{LoraTarget::kGate, gate_.data(), ffn}, {LoraTarget::kUp, up_.data(), ffn}});
    const auto activation =
        c.mlp_activation == model::MlpActivation::kGeluTanh ? cpu::geluTanhMul : cpu::siluMul;
    pool_.parallelFor(n, 1, [&](int64_t begin, int64_t end) {
      activation(gate_.data() + begin * ffn, up_.data() + begin * ffn, ffn, end - begin, ffn,
                 gate_.data() + begin * ffn, ffn);
    });
    checkedMatmul(layer.w_down, gate_.data(), ffn, n, h_.data(), hidden, pool_);
    addLora(static_cast<int64_t>(l), gate_.data(), ffn, {{LoraTarget::kDown, h_.data(), hidden}});
    CLEAVE_RETURN_IF_ERROR(reduce(h_.data(), n * hidden));
    normRows(h_.data(), layer.post_ffn_norm, n);
    scaleDelta(h_.data(), n);
    addAndNorm(h_.data(), nullptr, n);
  }

  // Only each chunk's last `logits` tokens continue it: norm and project those rows.
  int64_t end = 0, row = 0;
  for (const SequenceChunk& chunk : batch) {
    end += static_cast<int64_t>(chunk.tokens.size());
    std::memcpy(last_.data() + row * hidden, x_.data() + (end - chunk.logits) * hidden,
                chunk.logits * hidden * sizeof(float));
    row += chunk.logits;
  }
  cpu::rmsNorm(last_.data(), hidden, w_.output_norm.data(), rows, hidden, eps, last_.data(),
               hidden);
  last_hidden_ = std::span<const float>(last_.data(), rows * hidden);
  checkedMatmul(w_.output, last_.data(), hidden, rows, local_logits_.data(), w_.dims.vocab.size,
                pool_);
  if (state_floats > 0) copyStateCheckpoints(batch, cache, /*before=*/false);
  CLEAVE_RETURN_IF_ERROR(gatherLogits(rows));
  if (c.logits_scaling != 1.0) {  // Granite.
    const float divisor = static_cast<float>(c.logits_scaling);
    for (int64_t i = 0; i < rows * c.vocab_size; ++i) logits_[i] /= divisor;
  }
  if (c.final_logit_softcap > 0) {
    cpu::softCap(logits_.data(), rows * c.vocab_size, static_cast<float>(c.final_logit_softcap));
  }
  return std::span<const float>(logits_.data(), rows * c.vocab_size);
}

LlamaRunner::LlamaRunner(const LlamaWeights& weights, cpu::ThreadPool& pool, int64_t max_context)
    : model_(weights, pool),
      cache_({.num_layers = weights.config.kvLayers(),
              .kv_heads = weights.dims.kv_heads.size,
              .head_dim = model::kvCacheShape(weights.config).head_dim,
              .block_size = 16,
              .num_blocks = (max_context + 15) / 16,
              .parts = model::kvCacheShape(weights.config).parts,
              .state_slots = weights.config.linear_attention ? 1 : 0,
              .state_floats = linearStateFloats(weights.config, weights.dims)}),
      max_context_(max_context) {
  for (int32_t b = 0; b < cache_.totalBlocks(); ++b) blocks_.push_back(b);
}

absl::StatusOr<std::span<const float>> LlamaRunner::forward(std::span<const uint32_t> tokens) {
  if (position_ + static_cast<int64_t>(tokens.size()) > max_context_) {
    return absl::OutOfRangeError(absl::StrCat("the sequence would reach ",
                                              position_ + tokens.size(),
                                              " tokens, past the context of ", max_context_));
  }
  SequenceChunk chunk{.tokens = tokens,
                      .start = position_,
                      .blocks = blocks_,
                      .state = cache_.stateSlots() > 0 ? 0 : -1};
  CLEAVE_ASSIGN_OR_RETURN(std::span<const float> logits, model_.forward({&chunk, 1}, cache_));
  position_ += static_cast<int64_t>(tokens.size());
  return logits;
}

}  // namespace cleave::engine
