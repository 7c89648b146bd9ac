#include "services/engine/scheduler.h"

#include <algorithm>
#include <limits>
#include <unordered_set>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "services/engine/regex_constraint.h"
#include "services/roofline/roofline.h"

namespace cleave::engine {

Scheduler::Scheduler(TpGroup& model, const tokenizer::Tokenizer* tokenizer,
                     const SchedulerOptions& options)
    : model_(model),
      tokenizer_(tokenizer),
      options_(options),
      cache_({.block_size = model.blockSize(), .num_blocks = model.numBlocks()}) {
  if (model.config().linear_attention) {
    // A linear-attention layer's state covers a whole prefix and cannot step back: no KV
    // block alone resumes a sequence (a cached prefix ends at a checkpoint of the state),
    // and a draft rejected is taken back by the state kept after the row before it.
    const int64_t slots = model.stateSlots();
    const int64_t checkpoints =
        options_.prefix_caching
            ? std::clamp<int64_t>(options_.state_checkpoints, 0, std::max<int64_t>(slots - 1, 0))
            : 0;
    options_.prefix_caching = checkpoints > 0;
    const bool rows = model.rowStates() && model.multiRowLogits();
    const int64_t drafts = options_.speculative.tokens > 0 && rows
                               ? std::clamp<int64_t>(options_.draft_states, 0,
                                                     std::max<int64_t>(slots - 1 - checkpoints, 0))
                               : 0;
    if (options_.speculative.tokens > 0 && drafts == 0) {
      CLEAVE_LOG(WARNING) << "speculative decoding is off: the model's linear-attention state "
                          << (rows ? "has no slots for its drafts' rows"
                                   : "cannot be kept after each row by this backend");
      options_.speculative.tokens = 0;
    }
    sequence_states_ = slots - checkpoints - drafts;
    for (int64_t slot = sequence_states_ - 1; slot >= 0; --slot)
      free_states_.push_back(static_cast<int32_t>(slot));
    for (int64_t slot = sequence_states_ + drafts - 1; slot >= sequence_states_; --slot)
      free_drafts_.push_back(static_cast<int32_t>(slot));
    for (int64_t slot = slots - 1; slot >= sequence_states_ + drafts; --slot)
      free_checkpoints_.push_back(static_cast<int32_t>(slot));
  }
}

void Scheduler::pin(uint64_t checkpoint) {
  Checkpoint& c = checkpoints_.at(checkpoint);
  ++c.pins;
  checkpoint_lru_.splice(checkpoint_lru_.end(), checkpoint_lru_, c.lru);  // Used last.
}

void Scheduler::unpin(uint64_t checkpoint) {
  auto it = checkpoints_.find(checkpoint);
  if (it != checkpoints_.end() && it->second.pins > 0) --it->second.pins;
}

int32_t Scheduler::checkpointSlot() {
  if (!free_checkpoints_.empty()) {
    const int32_t slot = free_checkpoints_.back();
    free_checkpoints_.pop_back();
    return slot;
  }
  for (auto it = checkpoint_lru_.begin(); it != checkpoint_lru_.end(); ++it) {
    auto held = checkpoints_.find(*it);
    if (held->second.pins > 0) continue;
    const int32_t slot = held->second.slot;
    checkpoints_.erase(held);
    checkpoint_lru_.erase(it);
    return slot;
  }
  return -1;
}

void Scheduler::settleCheckpoints(std::span<Sequence* const> members, bool ran) {
  for (Sequence* seq : members) {
    if (seq->restore) {
      unpin(*seq->restore);
      seq->restore.reset();
    }
    if (seq->save_slot < 0) continue;
    // Two chunks of a step that end the same prefix: the first one's stays.
    if (ran && !checkpoints_.contains(seq->save_chain)) {
      checkpoint_lru_.push_back(seq->save_chain);
      checkpoints_.emplace(seq->save_chain, Checkpoint{.slot = seq->save_slot,
                                                       .lru = std::prev(checkpoint_lru_.end())});
    } else {
      free_checkpoints_.push_back(seq->save_slot);
    }
    seq->save_slot = -1;
  }
}

int64_t Scheduler::alignChunk(Sequence& seq, int64_t take) {
  const int64_t bs = cache_.blockSize();
  const std::span<const uint32_t> prompt(seq.request.prompt);
  const int64_t size = static_cast<int64_t>(prompt.size());
  int64_t end = seq.cached + take;
  if (seq.cached < seq.shared_end && seq.shared_end < end &&
      !checkpoints_.contains(chainTo(seq, seq.shared_end)) && slotToSpare()) {
    // Where another prompt's cached blocks part from this one's: the next prompt sharing
    // them resumes there.
    end = seq.shared_end;
  } else if (end < size) {
    // A chunk short of the prompt's end stops at the boundary before its end.
    if (end / bs * bs > seq.cached) end = end / bs * bs;
  } else {
    // The last one first stops at the last boundary before the prompt's end (one step
    // more), the longest prefix of it that a prompt starting with it (this one again, or a
    // conversation's next turn) can reuse, when a checkpoint is to be left there.
    const int64_t last = (size - 1) / bs * bs;
    if (last > seq.cached && !checkpoints_.contains(chainTo(seq, last)) && slotToSpare())
      end = last;
  }
  if (end % bs == 0) saveCheckpoint(seq, end);
  return end - seq.cached;
}

uint64_t Scheduler::chainTo(const Sequence& seq, int64_t end) const {
  const int64_t bs = cache_.blockSize();
  const std::span<const uint32_t> tokens(seq.tokens);
  uint64_t chain = seq.chain;
  for (int64_t at = seq.published * bs; at < end; at += bs)
    chain = KvBlockPool::chainHash(chain, tokens.subspan(at, bs));
  return chain;
}

bool Scheduler::slotToSpare() const {
  return !free_checkpoints_.empty() ||
         std::any_of(checkpoints_.begin(), checkpoints_.end(),
                     [](const auto& held) { return held.second.pins == 0; });
}

void Scheduler::saveCheckpoint(Sequence& seq, int64_t end) {
  const uint64_t chain = chainTo(seq, end);
  if (checkpoints_.contains(chain)) return;
  seq.save_chain = chain;
  // A decoding sequence keeps one checkpoint of its output, the latest (a conversation's
  // next turn resumes there): the one before gives its slot unless someone holds it.
  if (seq.prefilled() && seq.output_checkpoint) {
    if (auto it = checkpoints_.find(*seq.output_checkpoint);
        it != checkpoints_.end() && it->second.pins == 0) {
      seq.save_slot = it->second.slot;
      checkpoint_lru_.erase(it->second.lru);
      checkpoints_.erase(it);
    }
  }
  if (seq.save_slot < 0) seq.save_slot = checkpointSlot();
  if (seq.prefilled()) seq.output_checkpoint = chain;
}

void Scheduler::unreserveCheckpoint(uint64_t id) {
  if (auto checkpoint = reserved_checkpoints_.find(id); checkpoint != reserved_checkpoints_.end()) {
    unpin(checkpoint->second);
    reserved_checkpoints_.erase(checkpoint);
  }
}

bool Scheduler::awaits(const Sequence& seq, const std::unordered_set<uint64_t>& computing) const {
  if (computing.empty()) return false;
  const int64_t bs = cache_.blockSize();
  const std::span<const uint32_t> prompt(seq.request.prompt);
  const int64_t reusable = (static_cast<int64_t>(prompt.size()) - 1) / bs;
  uint64_t chain = seq.chain;
  for (int64_t j = seq.published; j < reusable; ++j) {
    chain = KvBlockPool::chainHash(chain, prompt.subspan(j * bs, bs));
    if (computing.contains(chain)) return true;
    if (!checkpointed()) break;  // Others take the cache block by block: the next one.
  }
  return false;
}

void Scheduler::restoreFrom(Sequence& seq, const PrefixHit& hit) {
  if (!checkpointed()) return;
  seq.shared_end = std::max(seq.shared_end, hit.reach);
  if (hit.blocks.empty()) return;
  if (seq.restore) unpin(*seq.restore);
  pin(hit.chain);
  seq.restore = hit.chain;
}

void Scheduler::freeState(Sequence& seq) {
  if (seq.restore) {
    unpin(*seq.restore);
    seq.restore.reset();
  }
  if (seq.state < 0 || seq.mode != Mode::kGenerate) return;  // Else the reservation's.
  free_states_.push_back(seq.state);
  seq.state = -1;
}

int32_t Scheduler::reservedState(uint64_t id) const {
  auto it = reserved_states_.find(id);
  return it == reserved_states_.end() ? -1 : it->second;
}

absl::Status Scheduler::validate(const GenerationRequest& request) const {
  const model::ModelConfig& c = model_.config();
  if (request.prompt.empty()) return absl::InvalidArgumentError("prompt is empty");
  for (uint32_t id : request.prompt) {
    if (id >= c.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt token id ", id, " is outside the vocabulary (", c.vocab_size, ")"));
    }
  }
  CLEAVE_RETURN_IF_ERROR(validateSamplingParams(request.sampling));
  if (request.adapter < -1 || request.adapter >= static_cast<int32_t>(model_.adapters().size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "adapter ", request.adapter, " is not one of the ", model_.adapters().size(), " loaded"));
  }
  if (request.cache_salt.size() > kMaxCacheSaltBytes) {
    return absl::InvalidArgumentError(absl::StrCat("cache_salt has ", request.cache_salt.size(),
                                                   " bytes; at most ", kMaxCacheSaltBytes));
  }
  const char* constrained = request.json_object ? "a JSON object output"
                            : request.regex     ? "a regex output"
                            : request.grammar   ? "a grammar output"
                                                : nullptr;
  if (constrained != nullptr) {
    if (tokenizer_ == nullptr || request.stop.stop_token_ids.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(constrained, " needs the model's tokenizer and an end-of-sequence token"));
    }
    if (token_bytes_ == nullptr) token_bytes_ = std::make_shared<const TokenBytes>(*tokenizer_);
    if (!token_bytes_->exact()) {
      return absl::UnimplementedError(absl::StrCat(
          constrained,
          " needs a vocabulary whose tokens' bytes add up (byte-level BPE, as Llama 3, Qwen and "
          "SmolLM use); this model's decoder joins tokens otherwise"));
    }
  }
  if (request.stop.max_new_tokens <= 0)
    return absl::InvalidArgumentError("max_new_tokens must be > 0");
  if (request.stop.min_new_tokens < 0 ||
      request.stop.min_new_tokens > request.stop.max_new_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_new_tokens must be in [0, max_new_tokens = ", request.stop.max_new_tokens,
                     "], got ", request.stop.min_new_tokens));
  }
  if (constrained != nullptr && !request.adjustments.allowed.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("allowed_token_ids cannot be combined with ", constrained));
  }
  if (constrained != nullptr && request.stop.min_new_tokens > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_new_tokens cannot hold off the end of ", constrained));
  }
  CLEAVE_RETURN_IF_ERROR(engine::validate(request.adjustments, c.vocab_size));
  if (request.prompt_logprobs < -1 || request.prompt_logprobs > kMaxLogprobs) {
    return absl::InvalidArgumentError(absl::StrCat("prompt_logprobs must be in [0, ", kMaxLogprobs,
                                                   "] (or -1 for none), got ",
                                                   request.prompt_logprobs));
  }
  if (request.prompt_logprobs >= 0 && !model_.multiRowLogits()) {
    return absl::UnimplementedError(
        "prompt log-probabilities need a model that returns several rows of logits a step; "
        "this one's backend does not");
  }
  // A prefill for its hidden state keeps no new token: the prompt alone must fit.
  const int64_t total = static_cast<int64_t>(request.prompt.size()) +
                        (request.hidden_state ? 0 : request.stop.max_new_tokens);
  if (total > c.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("prompt + max_new_tokens = ", total,
                                                   " is past the context length ",
                                                   c.max_position_embeddings));
  }
  if (cache_.blocksFor(total) > cache_.totalBlocks()) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt + max_new_tokens = ", total, " tokens needs ", cache_.blocksFor(total),
                     " KV blocks; the whole pool has ", cache_.totalBlocks()));
  }
  return absl::OkStatus();
}

absl::Status Scheduler::add(GenerationRequest request) {
  CLEAVE_RETURN_IF_ERROR(validate(request));
  if (request.hidden_state)
    return absl::InvalidArgumentError("hidden_state is for a prefill (addPrefill)");
  waiting_.push_back(std::move(request));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> Scheduler::reserve(uint64_t id, int64_t count,
                                                        std::span<const uint32_t> prompt,
                                                        int64_t* cached, int32_t adapter,
                                                        std::string_view cache_salt) {
  if (cached != nullptr) *cached = 0;
  if (count < 1) return absl::InvalidArgumentError("num_blocks must be >= 1");
  if (auto it = reservations_.find(id); it != reservations_.end()) {
    if (static_cast<int64_t>(it->second.size()) == count) return it->second;
    return absl::AlreadyExistsError(
        absl::StrCat("request ", id, " already holds ", it->second.size(), " blocks, not ", count));
  }
  if (adapter < -1 || adapter >= static_cast<int32_t>(model_.adapters().size()))
    return absl::InvalidArgumentError(absl::StrCat("no LoRA adapter ", adapter));
  if (cache_salt.size() > kMaxCacheSaltBytes)
    return absl::InvalidArgumentError(absl::StrCat("cache_salt has ", cache_salt.size(), " bytes"));
  const bool stateful = model_.config().linear_attention.has_value();
  if (stateful && free_states_.empty()) {
    return absl::ResourceExhaustedError(absl::StrCat("every one of the ", sequence_states_,
                                                     " linear-attention state slots is held"));
  }
  const PrefixHit hit = lookupPrefix(prompt, 0, chainRoot(adapter, cache_salt));
  std::vector<int32_t> blocks = hit.blocks;
  // Cut short, a checkpointed prefix no longer ends at its checkpoint.
  if (static_cast<int64_t>(blocks.size()) > count) blocks.resize(stateful ? 0 : count);
  cache_.retain(blocks);
  absl::StatusOr<std::vector<int32_t>> fresh =
      cache_.allocate(count - static_cast<int64_t>(blocks.size()));
  if (!fresh.ok()) {
    cache_.release(blocks);
    return fresh.status();
  }
  const bool hit_any = !blocks.empty();
  if (cached != nullptr) *cached = static_cast<int64_t>(blocks.size());
  blocks.insert(blocks.end(), fresh->begin(), fresh->end());
  if (stateful) {
    reserved_states_.emplace(id, free_states_.back());
    free_states_.pop_back();
    // Its prefill (here) starts from the checkpoint that ends its cached blocks.
    if (hit_any) {
      pin(hit.chain);
      reserved_checkpoints_.emplace(id, hit.chain);
    }
  }
  reservations_.emplace(id, std::move(blocks));
  return reservations_.at(id);
}

uint64_t Scheduler::chainRoot(int32_t adapter, std::string_view cache_salt) const {
  return KvBlockPool::saltedRoot(
      adapter < 0 ? 0 : KvBlockPool::adapterRoot(model_.adapters()[adapter]->sha256), cache_salt);
}

Scheduler::PrefixHit Scheduler::lookupPrefix(std::span<const uint32_t> prompt, int64_t from,
                                             uint64_t chain) const {
  PrefixHit hit{.chain = chain};
  if (!options_.prefix_caching) return hit;
  const int64_t bs = cache_.blockSize();
  const int64_t reusable = (static_cast<int64_t>(prompt.size()) - 1) / bs;
  PrefixHit checkpointed_hit{.chain = chain};  // Up to the last block a checkpoint ends.
  for (int64_t j = from; j < reusable; ++j) {
    std::span<const uint32_t> tokens = prompt.subspan(j * bs, bs);
    const uint64_t hash = KvBlockPool::chainHash(hit.chain, tokens);
    std::optional<int32_t> block = cache_.lookup(hash, tokens);
    if (!block) break;
    hit.blocks.push_back(*block);
    hit.chain = hash;
    hit.reach = (j + 1) * bs;
    if (checkpoints_.contains(hash)) checkpointed_hit = hit;
  }
  checkpointed_hit.reach = hit.reach;
  return checkpointed() ? checkpointed_hit : hit;
}

Scheduler::PrefixHit Scheduler::continuation(const Sequence& seq) const {
  if (!options_.prefix_caching || seq.cached != seq.published * cache_.blockSize() ||
      seq.request.prompt_logprobs >= 0) {
    return {.chain = seq.chain};
  }
  return lookupPrefix(seq.request.prompt, seq.published, seq.chain);
}

void Scheduler::extendFromCache(Sequence& seq) { take(seq, continuation(seq)); }

void Scheduler::take(Sequence& seq, const PrefixHit& hit) {
  const int64_t bs = cache_.blockSize();
  for (size_t i = 0; i < hit.blocks.size(); ++i) {
    const size_t j = static_cast<size_t>(seq.published) + i;
    const int32_t block = hit.blocks[i];
    int32_t& own = seq.blocks[j];
    if (own == block) continue;  // Taken at reserve() already.
    // Its own block holds nothing yet. A reservation's ids went out (a peer's write may
    // still land there): it stays held until the reservation ends.
    cache_.retain({&block, 1});
    if (seq.mode == Mode::kGenerate) {
      cache_.release({&own, 1});
    } else {
      reservations_.at(seq.request.id)[j] = block;
      spares_[seq.request.id].push_back(own);
    }
    own = block;
  }
  seq.chain = hit.chain;
  seq.published += static_cast<int64_t>(hit.blocks.size());
  const int64_t gained = static_cast<int64_t>(hit.blocks.size()) * bs;
  seq.cached += gained;
  seq.hit_tokens += gained;
  prefix_hit_tokens_ += gained;
  restoreFrom(seq, hit);
}

void Scheduler::startPast(Sequence& seq, const PrefixHit& hit) {
  seq.published = static_cast<int64_t>(hit.blocks.size());
  seq.cached = seq.hit_tokens = seq.published * cache_.blockSize();
  seq.chain = hit.chain;
  prefix_hit_tokens_ += seq.hit_tokens;
  prefix_lookup_tokens_ += static_cast<int64_t>(seq.request.prompt.size());
  restoreFrom(seq, hit);
}

int64_t Scheduler::release(uint64_t id) {
  stop(id);
  if (auto spare = spares_.find(id); spare != spares_.end()) {
    cache_.release(spare->second);
    spares_.erase(spare);
  }
  if (auto state = reserved_states_.find(id); state != reserved_states_.end()) {
    free_states_.push_back(state->second);
    reserved_states_.erase(state);
  }
  unreserveCheckpoint(id);
  auto it = reservations_.find(id);
  if (it == reservations_.end()) return 0;
  const int64_t freed = static_cast<int64_t>(it->second.size());
  cache_.release(it->second);
  reservations_.erase(it);
  return freed;
}

int64_t Scheduler::trim(uint64_t id, int64_t keep) {
  auto it = reservations_.find(id);
  if (it == reservations_.end()) return 0;
  std::vector<int32_t>& blocks = it->second;
  const auto kept = static_cast<std::ptrdiff_t>(
      std::clamp<int64_t>(keep, 0, static_cast<int64_t>(blocks.size())));
  const std::vector<int32_t> rest(blocks.begin() + kept, blocks.end());
  blocks.resize(static_cast<size_t>(kept));
  cache_.release(rest);
  return static_cast<int64_t>(rest.size());
}

void Scheduler::stop(uint64_t id) {
  std::erase_if(waiting_, [id](const GenerationRequest& r) { return r.id == id; });
  for (auto it = ready_.begin(); it != ready_.end(); ++it) {
    if ((*it)->request.id == id) {
      ready_.erase(it);
      break;
    }
  }
  for (size_t i = 0; i < running_.size(); ++i) {
    if (running_[i]->request.id == id) {
      // A reserved sequence's blocks are the reservation's: release() frees them, once.
      if (running_[i]->mode == Mode::kGenerate) cache_.release(running_[i]->blocks);
      freeState(*running_[i]);
      running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
  }
}

std::vector<int32_t> Scheduler::reservation(uint64_t id) const {
  auto it = reservations_.find(id);
  return it == reservations_.end() ? std::vector<int32_t>{} : it->second;
}

int64_t Scheduler::decodingSequences() const {
  int64_t n = 0;
  for (const auto& seq : running_) n += seq->prefilled() && seq->mode != Mode::kPrefillOnly;
  return n;
}

int64_t Scheduler::heldOnlyBy(std::span<const uint64_t> ids) const {
  std::unordered_set<int32_t> held, elsewhere;
  for (const auto* map : {&reservations_, &spares_}) {
    for (const auto& [id, blocks] : *map) {
      auto& into = std::find(ids.begin(), ids.end(), id) != ids.end() ? held : elsewhere;
      into.insert(blocks.begin(), blocks.end());
    }
  }
  return static_cast<int64_t>(
      std::count_if(held.begin(), held.end(), [&](int32_t b) { return !elsewhere.contains(b); }));
}

int64_t Scheduler::reservedBlocks() const {
  // Reservations may share cached blocks: each counts once.
  std::unordered_set<int32_t> held;
  for (const auto* map : {&reservations_, &spares_}) {
    for (const auto& [id, blocks] : *map) held.insert(blocks.begin(), blocks.end());
  }
  return static_cast<int64_t>(held.size());
}

absl::StatusOr<const std::vector<int32_t>*> Scheduler::reservationFor(
    const GenerationRequest& request, int64_t tokens) const {
  auto it = reservations_.find(request.id);
  if (it == reservations_.end())
    return absl::NotFoundError(absl::StrCat("request ", request.id, " has no KV reservation"));
  if (cache_.blocksFor(tokens) > static_cast<int64_t>(it->second.size())) {
    return absl::InvalidArgumentError(absl::StrCat(tokens, " tokens need ",
                                                   cache_.blocksFor(tokens), " KV blocks; request ",
                                                   request.id, " reserved ", it->second.size()));
  }
  for (const auto& seq : running_) {
    if (seq->request.id == request.id)
      return absl::FailedPreconditionError(absl::StrCat("request ", request.id, " is running"));
  }
  for (const auto& seq : ready_) {
    if (seq->request.id == request.id)
      return absl::FailedPreconditionError(absl::StrCat("request ", request.id, " is running"));
  }
  return &it->second;
}

absl::Status Scheduler::addPrefill(GenerationRequest request) {
  CLEAVE_RETURN_IF_ERROR(validate(request));
  if (request.hidden_state && !model_.hiddenStates())
    return absl::UnimplementedError("this model's backend returns no hidden states");
  CLEAVE_RETURN_IF_ERROR(
      reservationFor(request, static_cast<int64_t>(request.prompt.size())).status());
  const std::vector<int32_t>& blocks = reservations_.at(request.id);
  auto seq = makeSequence(std::move(request), Mode::kPrefillOnly, blocks);
  seq->state = reservedState(seq->request.id);
  // The cached prefix's blocks take the place of the reservation's first ones (the same
  // ones when reserve() was given the prompt): checked before they do, so a refusal leaves
  // the reservation and the hit counters as they were.
  const PrefixHit hit = continuation(*seq);
  CLEAVE_RETURN_IF_ERROR(writable(*seq, seq->published + static_cast<int64_t>(hit.blocks.size()),
                                  cache_.blocksFor(seq->request.prompt.size())));
  take(*seq, hit);
  unreserveCheckpoint(seq->request.id);  // The sequence pins what it starts from itself.
  prefix_lookup_tokens_ += static_cast<int64_t>(seq->request.prompt.size());
  running_.push_back(std::move(seq));
  return absl::OkStatus();
}

absl::Status Scheduler::startDecode(GenerationRequest request, uint32_t first_token) {
  CLEAVE_RETURN_IF_ERROR(validate(request));
  if (first_token >= model_.config().vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("first token id ", first_token,
                                                   " is outside the vocabulary (",
                                                   model_.config().vocab_size, ")"));
  }
  CLEAVE_ASSIGN_OR_RETURN(const std::vector<int32_t>* blocks,
                          reservationFor(request, static_cast<int64_t>(request.prompt.size()) +
                                                      request.stop.max_new_tokens));
  auto seq = makeSequence(std::move(request), Mode::kDecode, *blocks);
  seq->state = reservedState(seq->request.id);
  unreserveCheckpoint(seq->request.id);  // A peer prefilled it: its state came whole.
  CLEAVE_RETURN_IF_ERROR(
      writable(*seq, static_cast<int64_t>(seq->request.prompt.size()) / cache_.blockSize(),
               static_cast<int64_t>(seq->blocks.size())));
  // The prompt's KV is in place; the first token was sampled by the prefill: account for
  // it as this process would have.
  seq->cached = static_cast<int64_t>(seq->request.prompt.size());
  publishFull(*seq);
  seq->sampler->observe(first_token);
  std::string text = seq->detokenizer ? seq->detokenizer->push(first_token) : std::string();
  seq->stopper->push(first_token, text);
  if (seq->stopper->stopped()) {
    return absl::InvalidArgumentError("the first token already ends the request");
  }
  seq->tokens.push_back(first_token);
  if (seq->constraint) seq->constraint->accept(first_token);
  ready_.push_back(std::move(seq));
  return absl::OkStatus();
}

absl::Status Scheduler::writable(const Sequence& seq, int64_t from, int64_t to) const {
  for (int64_t j = from; j < to && j < static_cast<int64_t>(seq.blocks.size()); ++j) {
    if (cache_.published(seq.blocks[j])) {
      return absl::FailedPreconditionError(absl::StrCat(
          "request ", seq.request.id, ": reserved block ", j,
          " holds a cached prefix this sequence would write over (reserve it with this "
          "prompt, or without one for a scored prompt)"));
    }
  }
  return absl::OkStatus();
}

std::unique_ptr<Scheduler::Sequence> Scheduler::makeSequence(GenerationRequest request, Mode mode,
                                                             std::vector<int32_t> blocks) {
  auto seq = std::make_unique<Sequence>();
  seq->request = std::move(request);
  seq->mode = mode;
  seq->blocks = std::move(blocks);
  seq->tokens = seq->request.prompt;
  seq->chain = chainRoot(seq->request.adapter, seq->request.cache_salt);
  seq->sampler = std::make_unique<Sampler>(seq->request.sampling, seq->request.prompt);
  seq->stopper = std::make_unique<StopChecker>(seq->request.stop);
  if (tokenizer_ != nullptr)
    seq->detokenizer = std::make_unique<tokenizer::IncrementalDetokenizer>(*tokenizer_);
  // validate() saw the tokenizer and an end token, and made token_bytes_.
  if (seq->request.json_object) {
    seq->constraint = std::make_unique<JsonConstraint>(
        token_bytes_, seq->request.stop.stop_token_ids, seq->request.json_schema);
  } else if (seq->request.regex) {
    seq->constraint = std::make_unique<RegexConstraint>(
        token_bytes_, seq->request.stop.stop_token_ids, seq->request.regex);
  } else if (seq->request.grammar) {
    seq->constraint = std::make_unique<GrammarConstraint>(
        token_bytes_, seq->request.stop.stop_token_ids, seq->request.grammar);
  }
  if (seq->constraint) {
    const std::vector<uint32_t>& prompt = seq->request.prompt;
    const int64_t output =
        std::min<int64_t>(seq->request.output_in_prompt, static_cast<int64_t>(prompt.size()));
    for (size_t i = prompt.size() - static_cast<size_t>(output); i < prompt.size(); ++i) {
      if (!seq->constraint->accept(prompt[i])) {
        CLEAVE_LOG(WARNING) << "request " << seq->request.id
                            << ": its output so far is not the start of what it must be";
        break;
      }
    }
  }
  return seq;
}

void Scheduler::admit() {
  // Prefilled sequences take the decode slots that finished ones left.
  for (int64_t decoding = decodingSequences(); !ready_.empty() && decoding < options_.max_sequences;
       ++decoding) {
    running_.push_back(std::move(ready_.front()));
    ready_.pop_front();
  }
  while (!waiting_.empty() && static_cast<int64_t>(running_.size()) < options_.max_sequences) {
    // A model with linear-attention layers runs as many sequences as it has state slots.
    if (model_.config().linear_attention && free_states_.empty()) return;
    GenerationRequest& next = waiting_.front();
    const int64_t total = static_cast<int64_t>(next.prompt.size()) + next.stop.max_new_tokens;
    // The longest cached prefix's blocks, then fresh ones (a prompt scored: none).
    const uint64_t root = chainRoot(next.adapter, next.cache_salt);
    const PrefixHit hit =
        next.prompt_logprobs < 0 ? lookupPrefix(next.prompt, 0, root) : PrefixHit{.chain = root};
    std::vector<int32_t> blocks = hit.blocks;
    cache_.retain(blocks);
    absl::StatusOr<std::vector<int32_t>> fresh =
        cache_.allocate(cache_.blocksFor(total) - static_cast<int64_t>(blocks.size()));
    if (!fresh.ok()) {
      cache_.release(blocks);
      return;  // First come, first served: later requests wait too.
    }
    blocks.insert(blocks.end(), fresh->begin(), fresh->end());
    auto seq = makeSequence(std::move(next), Mode::kGenerate, std::move(blocks));
    if (model_.config().linear_attention) {
      seq->state = free_states_.back();
      free_states_.pop_back();
    }
    waiting_.pop_front();
    startPast(*seq, hit);
    running_.push_back(std::move(seq));
  }
}

void Scheduler::publishFull(Sequence& seq) {
  if (!options_.prefix_caching) return;
  const int64_t bs = cache_.blockSize();
  const int64_t full = std::min<int64_t>(seq.cached, static_cast<int64_t>(seq.tokens.size())) / bs;
  for (; seq.published < full; ++seq.published) {
    std::span<const uint32_t> tokens =
        std::span<const uint32_t>(seq.tokens).subspan(seq.published * bs, bs);
    seq.chain = KvBlockPool::chainHash(seq.chain, tokens);
    cache_.publish(seq.blocks[seq.published], seq.chain, tokens);
  }
}

void Scheduler::finish(size_t index) {
  Sequence& seq = *running_[index];
  freeState(seq);
  if (seq.mode == Mode::kGenerate) {
    cache_.release(seq.blocks);
  } else if (seq.mode == Mode::kDecode || seq.stopper->stopped()) {
    // A decode ends its reservation; so does a prefill whose first token ends the request.
    const uint64_t id = seq.request.id;
    running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(index));
    release(id);
    return;
  }
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(index));
}

bool Scheduler::cancel(uint64_t id) {
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    if (it->id == id) {
      waiting_.erase(it);
      return true;
    }
  }
  for (const auto& seq : ready_) {
    if (seq->request.id == id) return release(id) > 0;
  }
  for (size_t i = 0; i < running_.size(); ++i) {
    if (running_[i]->request.id == id) {
      if (running_[i]->mode == Mode::kGenerate) {
        finish(i);
      } else {
        release(id);
      }
      return true;
    }
  }
  return release(id) > 0;
}

void Scheduler::draft(std::span<Sequence* const> members, std::span<SequenceChunk> batch,
                      int64_t& budget) {
  const int64_t bs = cache_.blockSize();
  for (size_t i = 0; i < members.size() && budget > 0; ++i) {
    Sequence& seq = *members[i];
    // Every draft accepted and the token after them stay within max_new_tokens and the
    // sequence's blocks.
    if (seq.draft_limit == 0) seq.draft_limit = options_.speculative.tokens;
    int64_t room =
        std::min({seq.draft_limit, budget, seq.request.stop.max_new_tokens - seq.generated() - 1,
                  static_cast<int64_t>(seq.blocks.size()) * bs - seq.cached - 1});
    if (checkpointed()) {
      // A row state a draft, while slots are free. A token completing a block leaves a
      // checkpoint of the state after the step (state_to), right only if no row of it is
      // rejected: that token goes alone, and drafts stop short of it.
      room = std::min(room, static_cast<int64_t>(free_drafts_.size()));
      if (options_.prefix_caching)
        room = seq.save_slot >= 0 ? 0 : std::min(room, bs - 2 - seq.cached % bs);
    }
    if (room <= 0) continue;
    proposeNgram(seq.tokens, options_.speculative.ngram, room, drafts_);
    if (drafts_.empty()) continue;
    seq.verify.assign(1, seq.tokens[seq.cached]);
    seq.verify.insert(seq.verify.end(), drafts_.begin(), drafts_.end());
    batch[i].tokens = seq.verify;
    batch[i].logits = static_cast<int64_t>(seq.verify.size());
    if (checkpointed()) {
      seq.row_states.assign(free_drafts_.end() - static_cast<int64_t>(drafts_.size()),
                            free_drafts_.end());
      free_drafts_.resize(free_drafts_.size() - drafts_.size());
      batch[i].row_states = seq.row_states;
    }
    budget -= static_cast<int64_t>(drafts_.size());
    drafted_tokens_ += static_cast<int64_t>(drafts_.size());
  }
}

bool Scheduler::adjusted(const Sequence& seq) {
  return !seq.request.adjustments.empty() || seq.holdingOff();
}

SampledToken Scheduler::sample(Sequence& seq, std::span<const float> logits) {
  if (seq.constraint || adjusted(seq)) {
    // The output so far, a moved sequence's earlier tokens included.
    const std::span<const uint32_t> output =
        std::span<const uint32_t>(seq.tokens)
            .subspan(seq.request.prompt.size() - std::clamp<size_t>(seq.request.output_in_prompt, 0,
                                                                    seq.request.prompt.size()));
    const std::span<const uint32_t> held_off =
        seq.holdingOff() ? std::span<const uint32_t>(seq.request.stop.stop_token_ids)
                         : std::span<const uint32_t>();
    for (const bool ban : {true, false}) {
      masked_.assign(logits.begin(), logits.end());
      const bool banned = applyAdjustments(seq.request.adjustments, output, held_off, masked_, ban);
      if (seq.constraint) seq.constraint->mask(masked_);
      // A ban that leaves no token (it took every allowed or constrained one) is dropped.
      if (!banned || std::any_of(masked_.begin(), masked_.end(), [](float l) {
            return l != -std::numeric_limits<float>::infinity();
          })) {
        break;
      }
    }
    logits = masked_;
  }
  return seq.sampler->sample(logits);
}

void Scheduler::emit(Sequence& seq, SampledToken sampled, std::vector<TokenEvent>& events) {
  if (seq.constraint && !seq.constraint->accept(sampled.token)) {
    CLEAVE_LOG(WARNING) << "request " << seq.request.id << ": drew token " << sampled.token
                        << ", which its output's constraint did not allow";
  }
  seq.tokens.push_back(sampled.token);
  TokenEvent event{.id = seq.request.id, .token = sampled.token};
  if (seq.tokens.size() == seq.request.prompt.size() + 1) {
    event.cached_tokens = seq.hit_tokens;
    event.prompt_logprobs = std::move(seq.prompt_scores);
    event.hidden = std::move(seq.hidden);
  }
  if (seq.request.sampling.logprobs >= 0) event.logprob = sampled.logprob;
  event.top_logprobs = std::move(sampled.top);
  event.prefilled = seq.mode == Mode::kPrefillOnly;
  std::string text = seq.detokenizer ? seq.detokenizer->push(sampled.token) : std::string();
  event.text = seq.stopper->push(sampled.token, text);
  if (seq.stopper->stopped()) {
    event.finished = true;
    event.reason = seq.stopper->reason();
    event.matched_stop = seq.stopper->matched();
    // At the length limit the last character may still be incomplete: flush it.
    if (event.reason == StopReason::kLength && seq.detokenizer)
      event.text += seq.detokenizer->finish();
  }
  events.push_back(std::move(event));
}

void Scheduler::verify(Sequence& seq, const SequenceChunk& chunk, std::span<const float> logits,
                       std::vector<TokenEvent>& events) {
  const int64_t vocab = model_.config().vocab_size;
  int64_t rows = 0;  // Rows sampled: the last token's, then one per accepted draft.
  for (;;) {
    SampledToken sampled = sample(seq, logits.subspan(rows * vocab, vocab));
    const uint32_t token = sampled.token;
    emit(seq, std::move(sampled), events);
    ++rows;
    if (seq.stopper->stopped() || rows == chunk.logits || token != chunk.tokens[rows]) break;
  }
  const int64_t accepted = rows - 1;
  accepted_tokens_ += accepted;
  last_work_.accepted += accepted;
  // The next drafts: twice as many after all were right, one past the right ones after a
  // miss (a sequence whose drafts keep missing verifies one at a time, at little cost).
  seq.draft_limit = accepted == chunk.logits - 1
                        ? std::min(options_.speculative.tokens, 2 * seq.draft_limit)
                        : accepted + 1;
  // The KV of the chunk's first `rows` tokens is the sequence's; the rest is overwritten
  // from there on. So is its state.
  seq.cached = chunk.start + rows;
  keepRowState(seq, rows);
  publishFull(seq);
}

void Scheduler::keepRowState(Sequence& seq, int64_t rows) {
  if (rows > 0 && rows <= static_cast<int64_t>(seq.row_states.size())) {
    std::swap(seq.state, seq.row_states[rows - 1]);
    if (seq.mode != Mode::kGenerate) reserved_states_[seq.request.id] = seq.state;
  }
  free_drafts_.insert(free_drafts_.end(), seq.row_states.begin(), seq.row_states.end());
  seq.row_states.clear();
}

absl::StatusOr<std::vector<TokenEvent>> Scheduler::step() {
  admit();
  std::vector<TokenEvent> events;
  if (running_.empty()) return events;
  // Decode tokens first (every prefilled sequence advances), then prefill chunks in
  // admission order within what is left of the budget.
  std::vector<SequenceChunk> batch;
  std::vector<Sequence*> members;
  int64_t budget = options_.max_batch_tokens;
  auto full = [&] {
    return budget == 0 || (options_.max_step_sequences > 0 &&
                           static_cast<int64_t>(batch.size()) >= options_.max_step_sequences);
  };
  for (auto& seq : running_) {
    if (!seq->prefilled() || full()) continue;
    // A checkpointed model's token that completes a block leaves a checkpoint there.
    if (options_.prefix_caching && checkpointed() && (seq->cached + 1) % cache_.blockSize() == 0)
      saveCheckpoint(*seq, seq->cached + 1);
    batch.push_back({.tokens = std::span<const uint32_t>(seq->tokens).subspan(seq->cached, 1),
                     .start = seq->cached,
                     .blocks = seq->blocks,
                     .adapter = seq->request.adapter,
                     .state = seq->state,
                     .state_to = seq->save_slot});
    members.push_back(seq.get());
    --budget;
  }
  const size_t decoding = members.size();
  // A prompt whose next block an earlier one computes in this step waits for it (and
  // takes it from the cache next step): a prefix that several arrive with at once is
  // computed once. A checkpointed model's prompt resumes only where a checkpoint is: it
  // waits for a chunk whose end leaves one within its prompt.
  std::unordered_set<uint64_t> computing;
  int64_t scored_rows = kPromptLogprobRows;  // Rows left this step for scored prompts.
  for (auto& seq : running_) {
    if (seq->prefilled() || full()) continue;
    extendFromCache(*seq);
    const int64_t bs = cache_.blockSize();
    const std::span<const uint32_t> prompt(seq->request.prompt);
    const bool scored = seq->request.prompt_logprobs >= 0;
    if (options_.prefix_caching && !scored && seq->cached == seq->published * bs &&
        awaits(*seq, computing)) {
      continue;
    }
    const int64_t left = static_cast<int64_t>(prompt.size()) - seq->cached;
    if (scored && scored_rows == 0) continue;
    int64_t take = std::min({left, budget, scored ? scored_rows : left});
    if (scored) scored_rows -= take;
    if (options_.prefix_caching && checkpointed() && !scored) take = alignChunk(*seq, take);
    batch.push_back({.tokens = std::span<const uint32_t>(seq->tokens).subspan(seq->cached, take),
                     .start = seq->cached,
                     .blocks = seq->blocks,
                     .logits = scored ? take : 1,
                     .adapter = seq->request.adapter,
                     .state = seq->state,
                     .state_from = seq->restore ? checkpoints_.at(*seq->restore).slot : -1,
                     .state_to = seq->save_slot});
    members.push_back(seq.get());
    budget -= take;
    // The full blocks this chunk completes (from its first whole one); a checkpointed
    // model's, the checkpoint it leaves.
    if (checkpointed()) {
      if (seq->save_slot >= 0) computing.insert(seq->save_chain);
    } else if (options_.prefix_caching && seq->cached == seq->published * bs) {
      uint64_t chain = seq->chain;
      for (int64_t at = seq->cached; at + bs <= seq->cached + take; at += bs) {
        chain = KvBlockPool::chainHash(chain, prompt.subspan(at, bs));
        computing.insert(chain);
      }
    }
  }
  if (options_.speculative.tokens > 0 && model_.multiRowLogits())
    draft(std::span(members).first(decoding), std::span(batch).first(decoding), budget);
  // A step that fails gives its drafts' row states back unused.
  absl::Cleanup unused_rows = [&] {
    for (Sequence* seq : members) keepRowState(*seq, 0);
  };
  last_batch_sequences_ = static_cast<int64_t>(batch.size());
  last_decode_sequences_ = decodingSequences();
  last_work_ = {};
  const int64_t window = model_.config().sliding_window;
  for (const SequenceChunk& chunk : batch) {
    const int64_t n = static_cast<int64_t>(chunk.tokens.size());
    last_work_.tokens += n;
    const roofline::AttentionSpan all = roofline::attentionSpan(chunk.start, n, 0);
    const roofline::AttentionSpan windowed = roofline::attentionSpan(chunk.start, n, window);
    last_work_.attended += all.attended;
    last_work_.kv_positions += all.kv_positions;
    last_work_.windowed_attended += windowed.attended;
    last_work_.windowed_kv_positions += windowed.kv_positions;
    if (chunk.logits > 1) last_work_.drafted += chunk.logits - 1;
  }
  // A row whose chunk ends its prompt samples; the backend draws it where it can.
  std::vector<RowOutput> outputs;
  for (size_t i = 0; i < members.size(); ++i) {
    const Sequence& seq = *members[i];
    RowOutput out;
    if (seq.cached + static_cast<int64_t>(batch[i].tokens.size()) >=
        static_cast<int64_t>(seq.request.prompt.size())) {
      // A constrained or adjusted row is drawn here, from its logits; drafts are verified here.
      const bool drafts = batch[i].logits > 1 && seq.prefilled();
      if (!drafts && !seq.constraint && !adjusted(seq)) out.draw = seq.sampler->deviceDraw();
      out.logits = !out.draw.has_value();
    }
    // A prompt being scored: the host reads every row of its chunk, one row or many.
    if (seq.request.prompt_logprobs >= 0 && !seq.prefilled()) out.logits = true;
    outputs.push_back(out);
  }
  absl::StatusOr<StepOutput> ran = model_.forwardAndDraw(batch, outputs);
  settleCheckpoints(members, ran.ok());
  CLEAVE_ASSIGN_OR_RETURN(StepOutput step, std::move(ran));
  const int64_t vocab = model_.config().vocab_size;
  if (step.tokens.empty() && step.logits.size() < static_cast<size_t>(logitRows(batch) * vocab))
    return absl::InternalError("the model returned fewer rows of logits than the step asked");
  // Every row's output is checked before any sequence changes: a step that fails leaves
  // each as it was (the next step computes the same chunk again).
  for (size_t i = 0, row = 0; i < members.size();
       row += static_cast<size_t>(batch[i].logits), ++i) {
    const Sequence& seq = *members[i];
    const bool rows_there =
        step.logits.size() >= (row + static_cast<size_t>(batch[i].logits)) * vocab;
    const bool drafts = batch[i].logits > 1 && seq.prefilled();
    const bool samples = seq.cached + static_cast<int64_t>(batch[i].tokens.size()) >=
                         static_cast<int64_t>(seq.request.prompt.size());
    const bool drawn = samples && !drafts && outputs[i].draw.has_value() && !step.tokens.empty();
    if ((drafts || seq.request.prompt_logprobs >= 0 || (samples && !drawn)) && !rows_there)
      return absl::InternalError("the model returned no logits for a row that needs them");
    if (samples && seq.request.hidden_state &&
        model_.lastHidden().size() < (row + static_cast<size_t>(batch[i].logits)) *
                                         static_cast<size_t>(model_.config().hidden_size))
      return absl::InternalError("the model returned no hidden state for a row that needs it");
    if (!drawn) continue;
    if (step.tokens[i] < 0 || step.tokens[i] >= vocab)
      return absl::InternalError(absl::StrCat("the model drew token ", step.tokens[i],
                                              ", outside its vocabulary of ", vocab));
    if (outputs[i].draw->logprobs >= 0 &&
        (step.logprobs.size() <= i || step.top.size() < (i + 1) * kMaxLogprobs))
      return absl::InternalError("the model drew a row without the log-probabilities it asked");
  }
  std::move(unused_rows).Cancel();  // verify() settles them.
  int64_t row = 0;                  // The first row of logits of batch[i].
  for (size_t i = 0; i < members.size(); row += batch[i].logits, ++i) {
    Sequence& seq = *members[i];
    if (batch[i].logits > 1 && seq.prefilled()) {  // A decoding sequence's drafts.
      verify(seq, batch[i], step.logits.subspan(row * vocab, batch[i].logits * vocab), events);
      continue;
    }
    // A prompt scored: each row but one past its end scores the prompt token after it.
    for (int64_t j = 0; j < batch[i].logits && seq.request.prompt_logprobs >= 0; ++j) {
      const size_t next = static_cast<size_t>(batch[i].start + j + 1);
      if (next >= seq.request.prompt.size()) break;
      seq.prompt_scores.push_back(scoreToken(step.logits.subspan((row + j) * vocab, vocab),
                                             seq.request.prompt[next],
                                             seq.request.prompt_logprobs));
    }
    const int64_t last_row = row + batch[i].logits - 1;
    seq.cached += static_cast<int64_t>(batch[i].tokens.size());
    publishFull(seq);
    if (!seq.prefilled()) continue;  // A prompt chunk that is not the last samples nothing.
    if (seq.request.hidden_state) {
      const int64_t hidden = model_.config().hidden_size;
      const std::span<const float> h = model_.lastHidden().subspan(last_row * hidden, hidden);
      seq.hidden.assign(h.begin(), h.end());
    }
    SampledToken sampled;
    if (outputs[i].draw.has_value() && !step.tokens.empty()) {
      sampled.token = static_cast<uint32_t>(step.tokens[i]);
      seq.sampler->observe(sampled.token);
      const int32_t n = outputs[i].draw->logprobs;
      if (n >= 0) {
        sampled.logprob = step.logprobs[i];
        for (int32_t k = 0; k < n && k < vocab; ++k) {
          const TokenLogprob& t = step.top[i * kMaxLogprobs + k];
          if (t.token < 0 || t.token >= vocab) break;  // None left (the row held NaN).
          sampled.top.emplace_back(static_cast<uint32_t>(t.token), t.logprob);
        }
      }
    } else {
      sampled = sample(seq, step.logits.subspan(last_row * vocab, vocab));
    }
    emit(seq, std::move(sampled), events);
  }
  for (size_t i = running_.size(); i-- > 0;) {
    const Sequence& seq = *running_[i];
    if (seq.stopper->stopped() || (seq.mode == Mode::kPrefillOnly && seq.prefilled())) finish(i);
  }
  return events;
}

}  // namespace cleave::engine
