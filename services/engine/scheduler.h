// Continuous batching on one model replica (a TpGroup of one or more ranks): requests join and
// leave between steps; every step runs one batch holding a token of each decoding sequence and,
// within the step's token budget, chunks of the prompts still being prefilled.
//
// KV memory is reserved at admission for the whole request (prompt + max_new_tokens), so
// a running sequence can never run out of blocks and nothing is ever preempted; a request
// that does not fit yet waits (first come, first served); one that could never fit is
// refused when added. Full blocks are published in the cache as their KV is computed
// (prefix caching), generated tokens' too: a request starting with the same tokens reuses
// them and prefills only the rest, whether it generates here or only prefills (its
// reservation's leading blocks become the cached ones). Prompts that arrive together with a
// prefix nobody has computed yet compute it once: one computes each block, the others wait
// a step and take it from the cache.
//
// A model with linear-attention layers (Qwen3.5) also gives each sequence one of the group's
// state slots (TpGroup::stateSlots): add()'s from admission to its end, a reservation's from
// reserve() to release() (its prefill leaves the state there for its decode; reserve() is
// ResourceExhausted while every slot is held). Its state covers the whole prefix and cannot
// step back: drafts are verified with the state after each row kept in a slot of its own
// (draft_states of them; SequenceChunk::row_states), and a sequence whose drafts are rejected
// takes the slot holding the state after its last accepted one (giving its own up). It
// caches prefixes only with
// state_checkpoints: the last slots of the group keep the state after a prefix (a
// checkpoint), and a prompt reuses the longest cached prefix that ends at one, starting its
// state from a copy. Prompt chunks end on block boundaries where they can, the last one
// at the prompt's last boundary before its end or where its cached blocks (another
// prompt's) end, and each boundary a chunk ends at leaves a checkpoint, as does a decoding
// sequence's latest block boundary (the least recently used checkpoint gives way), so
// prompts sharing a system prompt, and a conversation's next turn (past the reply where its
// tokens are the same), find one.
//
// Disaggregated serving splits a request in three calls (proto/cleave/v1/worker.proto):
// reserve() sets blocks aside for it, addPrefill() computes its prompt into them and
// samples the first token, startDecode() continues it from that token. A reservation is
// freed by release(), cancel(), or the end of its decoding; prefill alone never frees it.
//
// Threading: one thread (the worker's engine thread) calls every method.
#pragma once

#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"
#include "services/engine/grammar.h"
#include "services/engine/json_constraint.h"
#include "services/engine/kv_block_pool.h"
#include "services/engine/llama_model.h"
#include "services/engine/logit_adjustments.h"
#include "services/engine/memory_plan.h"
#include "services/engine/regex.h"
#include "services/engine/sampler.h"
#include "services/engine/speculative.h"
#include "services/engine/stop_checker.h"
#include "services/engine/tp_group.h"

namespace cleave::engine {

struct SchedulerOptions {
  int64_t max_batch_tokens = 512;  // Tokens per step (decode tokens + prefill chunks).
  int64_t max_sequences = 64;      // Sequences admitted at once; sequences decoding at once.
  // Sequences of one step, when the model takes at most so many (a GPU model's batch is
  // sized at start): prefill chunks past it wait for a later step. 0: no limit.
  int64_t max_step_sequences = 0;
  // Reuse the KV of cached prompt prefixes; off, every prompt is computed whole and no
  // block is published.
  bool prefix_caching = true;
  // A model with linear-attention layers: state slots (the group's last ones) kept for
  // prefix caching's checkpoints; the others are the sequences'. 0: no prefix caching for
  // such a model. Ignored for other models.
  int64_t state_checkpoints = 0;
  // Such a model's speculative decoding: state slots (before the checkpoints') that keep
  // the state after each draft of a step; a sequence drafts no more than are free, so 0
  // turns drafting off for it. The group's backend must keep them (TpGroup::rowStates).
  int64_t draft_states = 0;
  // Speculative decoding: each decoding sequence drafts tokens by prompt lookup
  // (speculative.h) and one forward pass verifies them. A sampled token that equals the
  // draft before it accepts it, so the output is what decoding one token a step gives:
  // greedy the same tokens, sampled the same distribution (with a seed the same tokens,
  // each drawn once), up to the rounding of batched sums; only more come per step when
  // drafts are right. Drafts take what is
  // left of the step's token budget after decode tokens and prompt chunks.
  SpeculativeOptions speculative;
};

struct GenerationRequest {
  uint64_t id = 0;
  std::vector<uint32_t> prompt;
  SamplingParams sampling;
  StopCriteria stop;  // max_new_tokens must be > 0.
  // Constrain the output to one JSON object (json_constraint.h), ended by one of
  // stop.stop_token_ids (needs a tokenizer). The last `output_in_prompt` prompt tokens are
  // output already (a moved sequence): the constraint starts past them.
  bool json_object = false;
  int64_t output_in_prompt = 0;
  // With json_object: the schema the object must be an instance of (json_schema.h).
  std::shared_ptr<const JsonSchema> json_schema;
  // Else, when set: the pattern the output must match whole (regex_constraint.h), ended as
  // a JSON object is; output_in_prompt counts for it too.
  std::shared_ptr<const Regex> regex;
  // Else, when set: the grammar whose root the output must be (grammar.h), ended likewise.
  std::shared_ptr<const Grammar> grammar;
  bool constrained() const { return json_object || regex != nullptr || grammar != nullptr; }
  // logit_bias and allowed_token_ids (logit_adjustments.h); stop tokens are held off until
  // stop.min_new_tokens.
  LogitAdjustments adjustments;
  // n >= 0: score the prompt, each token from the second on given those before it, with
  // the n most likely tokens there (TokenEvent::prompt_logprobs); -1: none. Needs a model
  // with several rows of logits a step (TpGroup::multiRowLogits). Such a prompt is computed
  // whole (no prefix cache),
  // kPromptLogprobRows tokens a step for all scored prompts together; a reservation it
  // prefills into must hold no cached blocks (reserve() without the prompt).
  int32_t prompt_logprobs = -1;
  // The LoRA adapter the request runs with (TpGroup::addAdapter's index), or -1: the base
  // model. Its KV is cached apart: prefixes are shared only among requests of one adapter.
  int32_t adapter = -1;
  // Non-empty: the prefix cache is shared only among requests of this salt (and adapter);
  // KvBlockPool::saltedRoot.
  std::string cache_salt;
  // With addPrefill(): its TokenEvent also carries TokenEvent::hidden (an embedding's
  // input). Needs a model with TpGroup::hiddenStates().
  bool hidden_state = false;
};

// What one step produced for one sequence.
struct TokenEvent {
  uint64_t id = 0;
  uint32_t token = 0;
  std::string text;  // UTF-8-safe text delta (empty without a tokenizer).
  std::optional<float> logprob;
  std::vector<std::pair<uint32_t, float>> top_logprobs;  // When sampling.logprobs > 0.
  bool finished = false;
  // The first token of an addPrefill() request: its sequence leaves the batch (finished
  // tells whether the token also ends the request); its reservation stays.
  bool prefilled = false;
  StopReason reason = StopReason::kNone;
  // The stop string that matched, or the stop token's decimal id, when `reason` says so.
  std::string matched_stop;
  // On the first token this scheduler sampled for a sequence: its prompt tokens whose KV
  // came from the prefix cache.
  int64_t cached_tokens = 0;
  // On that first token, with GenerationRequest::prompt_logprobs: prompt tokens 1.. scored.
  std::vector<SampledToken> prompt_logprobs;
  // On that first token, with GenerationRequest::hidden_state: the model's last hidden state
  // (after its final norm) at the prompt's last token, [hidden size].
  std::vector<float> hidden;
};

class Scheduler {
 public:
  // Runs `model`, whose KV blocks (TpGroup::allocateKv) the scheduler hands out.
  // `tokenizer` (may be null) turns tokens into text for stop strings and text deltas.
  Scheduler(TpGroup& model, const tokenizer::Tokenizer* tokenizer, const SchedulerOptions& options);

  // Queues a request. InvalidArgument (naming the field) for an empty prompt, a token
  // outside the vocabulary, bad sampling values, a missing max_new_tokens, or a request
  // larger than the whole KV pool.
  absl::Status add(GenerationRequest request);
  // Drops a request wherever it is and frees its blocks (its reservation too). False when
  // unknown.
  bool cancel(uint64_t id);

  // Sets `count` blocks aside for request `id`. ResourceExhausted (taking nothing) when
  // fewer are free; AlreadyExists when `id` already holds a reservation of another size
  // (the same size returns the same blocks). With `prompt` (the request's, known already),
  // the cached blocks of its longest cached prefix come first, before allocation can evict
  // them; `cached` (when given) says how many (0 for an existing reservation).
  // The prompt's cached prefix is that of the requests of `adapter` and `cache_salt`
  // (GenerationRequest's).
  absl::StatusOr<std::vector<int32_t>> reserve(uint64_t id, int64_t count,
                                               std::span<const uint32_t> prompt = {},
                                               int64_t* cached = nullptr, int32_t adapter = -1,
                                               std::string_view cache_salt = {});
  // Frees the reservation of `id`, stopping its sequence if one runs; the blocks freed.
  int64_t release(uint64_t id);
  // Stops the sequence of `id` if one runs or waits (to be prefilled or to decode), keeping
  // its reservation (release() frees it later).
  void stop(uint64_t id);
  // Frees the blocks of `id`'s reservation past its first `keep` (a stopped one's: the
  // blocks no writer was told of); the blocks freed.
  int64_t trim(uint64_t id, int64_t keep);
  // Prefills `request` into its reservation (the same checks as add(), and the
  // reservation must cover the prompt); its TokenEvent has prefilled = true.
  // Unimplemented for hidden_state on a model without TpGroup::hiddenStates(). The blocks of
  // its longest cached prefix replace the reservation's leading ones (those replaced stay
  // held until the reservation ends), and only the rest of the prompt is computed.
  absl::Status addPrefill(GenerationRequest request);
  // Decodes `request` from `first_token`, its prompt's KV being in its reservation already
  // (FailedPrecondition when `id` is running; NotFound without a reservation). It joins
  // the batch at the first step with fewer than max_sequences sequences decoding, so a
  // worker given prefilled requests ahead keeps its decode batch full.
  absl::Status startDecode(GenerationRequest request, uint32_t first_token);
  // The blocks of `id`'s reservation (empty when it has none).
  std::vector<int32_t> reservation(uint64_t id) const;
  // The linear-attention state slot of `id`'s reservation (TpGroup::stateSlots), or -1.
  int32_t reservedState(uint64_t id) const;
  // State checkpoints held (SchedulerOptions::state_checkpoints).
  int64_t stateCheckpoints() const { return static_cast<int64_t>(checkpoints_.size()); }
  // Slots for drafts' row states that no sequence holds: all of draft_states between steps.
  int64_t freeDraftStates() const { return static_cast<int64_t>(free_drafts_.size()); }
  // Blocks held by reservations (each once, shared or not), and those not held by anything.
  int64_t reservedBlocks() const;
  // Blocks the reservations of `ids` hold (each once) that no other reservation holds.
  int64_t heldOnlyBy(std::span<const uint64_t> ids) const;
  int64_t freeBlocks() const { return cache_.freeBlocks(); }

  // Runs one batch and returns the tokens it produced (none when idle).
  absl::StatusOr<std::vector<TokenEvent>> step();

  bool idle() const { return waiting_.empty() && running_.empty() && ready_.empty(); }
  // Whether a step that failed may simply run again. Not for a model with linear-attention
  // layers: the failed step may have advanced its sequences' state, which a second run would
  // advance again.
  bool stepsRetryable() const { return !model_.config().linear_attention; }
  int64_t runningSequences() const { return static_cast<int64_t>(running_.size()); }
  // Running sequences past their prompt (each decodes one token per step).
  int64_t decodingSequences() const;
  // The last step's batch: sequences in it, and of those the ones decoding.
  int64_t lastBatchSequences() const { return last_batch_sequences_; }
  int64_t lastDecodeSequences() const { return last_decode_sequences_; }
  // The last step's work, for its roofline: tokens computed, positions they attended
  // (summed over tokens), and distinct positions whose KV it read; of the tokens, the drafts
  // verified (speculative decoding), and of those, the ones accepted.
  struct StepWork {
    int64_t tokens = 0;
    int64_t attended = 0;
    int64_t kv_positions = 0;
    // The same in the sliding-window layers (roofline::Workload).
    int64_t windowed_attended = 0;
    int64_t windowed_kv_positions = 0;
    int64_t drafted = 0;
    int64_t accepted = 0;
  };
  const StepWork& lastStepWork() const { return last_work_; }
  int64_t waitingRequests() const { return static_cast<int64_t>(waiting_.size() + ready_.size()); }
  const KvBlockPool& cache() const { return cache_; }
  // Prompt tokens whose KV came from the prefix cache instead of being computed.
  int64_t prefixHitTokens() const { return prefix_hit_tokens_; }
  // Prompt tokens looked up in the prefix cache (hit rate: hits / lookups).
  int64_t prefixLookupTokens() const { return prefix_lookup_tokens_; }
  // Tokens drafted for speculative decoding, and those of them accepted, since the start.
  int64_t draftedTokens() const { return drafted_tokens_; }
  int64_t acceptedTokens() const { return accepted_tokens_; }

 private:
  enum class Mode {
    kGenerate,     // add(): prefill then decode, in blocks of its own.
    kPrefillOnly,  // addPrefill(): leaves after the first token; blocks are reserved.
    kDecode,       // startDecode(): decodes in reserved blocks, freeing them at the end.
  };
  struct Sequence {
    GenerationRequest request;
    Mode mode = Mode::kGenerate;
    std::vector<int32_t> blocks;
    std::vector<uint32_t> tokens;  // Prompt, then generated tokens.
    int64_t cached = 0;            // Tokens whose KV is in the cache.
    int64_t published = 0;         // Leading blocks published for reuse.
    uint64_t chain = 0;            // Hash chain through the published blocks.
    int64_t hit_tokens = 0;        // Prompt tokens the prefix cache supplied.
    std::unique_ptr<Sampler> sampler;
    std::unique_ptr<StopChecker> stopper;
    std::unique_ptr<tokenizer::IncrementalDetokenizer> detokenizer;
    std::unique_ptr<OutputConstraint> constraint;  // request.constrained()
    std::vector<uint32_t> verify;                  // A step's last token and drafts.
    std::vector<SampledToken> prompt_scores;       // request.prompt_logprobs, so far.
    std::vector<float> hidden;                     // request.hidden_state, once computed.
    int64_t draft_limit = 0;                       // Drafts next step, at most (0: unset).
    int32_t state = -1;  // Its linear-attention state slot (SequenceChunk::state), or -1.
    // The slots keeping its state after each row but the last of this step's drafts
    // (SequenceChunk::row_states), taken from free_drafts_ until the step ends.
    std::vector<int32_t> row_states;
    // The checkpoint (by hash chain) its next chunk starts from, pinned until that chunk
    // has run: its cached prefix's state.
    std::optional<uint64_t> restore;
    // The checkpoint this step's chunk leaves: the slot it is copied into, and the hash
    // chain through the blocks it ends.
    int32_t save_slot = -1;
    uint64_t save_chain = 0;
    // The checkpoint its decoding left last (it keeps one: the next leaves in its slot).
    std::optional<uint64_t> output_checkpoint;
    // Where the cached KV of its prompt's prefix ends (another prompt's part from this
    // one): a checkpoint there serves the prompts that share that prefix.
    int64_t shared_end = 0;
    bool prefilled() const { return cached >= static_cast<int64_t>(request.prompt.size()); }
    // Tokens this scheduler has appended past the prompt.
    int64_t generated() const {
      return static_cast<int64_t>(tokens.size() - request.prompt.size());
    }
    // Stop tokens held off (min_new_tokens not reached yet).
    bool holdingOff() const { return generated() < request.stop.min_new_tokens; }
  };

  absl::Status validate(const GenerationRequest& request) const;
  // Returns the state slot of `seq` if it holds one of its own (add()'s sequences; a
  // reserved one's is its reservation's), and unpins the checkpoint it was to start from.
  void freeState(Sequence& seq);
  // Whether prefixes of this model end at checkpoints (a model with linear-attention layers).
  bool checkpointed() const { return model_.config().linear_attention.has_value(); }
  void pin(uint64_t checkpoint);
  void unpin(uint64_t checkpoint);
  // A checkpoint slot for a chunk to save into: a free one, else the least recently used
  // unpinned checkpoint's (dropping it); -1 when every one is pinned.
  int32_t checkpointSlot();
  // Unpins the checkpoint `id`'s reservation counts on (from reserve() to its prefill).
  void unreserveCheckpoint(uint64_t id);
  // Whether `seq` (at a block boundary) waits for a chunk of this step that computes what it
  // would take from the cache next step (`computing`: the hash chains of such chunks' blocks
  // or, for a checkpointed() model, of the checkpoints they leave).
  bool awaits(const Sequence& seq, const std::unordered_set<uint64_t>& computing) const;
  // After a step (`ran`: it succeeded): its chunks' checkpoints held, their restores unpinned.
  void settleCheckpoints(std::span<Sequence* const> members, bool ran);
  // How many of `seq`'s next `take` prompt tokens its chunk computes so that it ends on a
  // block boundary where it can (there its state is a checkpoint), and the checkpoint it
  // leaves there, if any.
  int64_t alignChunk(Sequence& seq, int64_t take);
  // The hash chain through `seq`'s blocks up to block boundary `end` (past its published ones).
  uint64_t chainTo(const Sequence& seq, int64_t end) const;
  // Whether checkpointSlot() would find a slot.
  bool slotToSpare() const;
  // Sets `seq`'s chunk of this step, which ends at block boundary `end`, to leave a
  // checkpoint there (save_slot, save_chain) unless one is there already or no slot is free.
  void saveCheckpoint(Sequence& seq, int64_t end);

  // The published blocks of the longest cached prefix of `prompt` that leaves at least one
  // token to compute (its logits give the next token), and the hash chain through them;
  // from block `from` on, `chain` being the chain through the blocks before it. A
  // checkpointed() model's prefix ends where a checkpoint is (its chain names it).
  struct PrefixHit {
    std::vector<int32_t> blocks;
    uint64_t chain = 0;
    // Positions from the prompt's start whose KV the cache holds: past the blocks for a
    // checkpointed() model whose last checkpoint comes before.
    int64_t reach = 0;
  };
  PrefixHit lookupPrefix(std::span<const uint32_t> prompt, int64_t from, uint64_t chain) const;
  // The hash chain's start for the requests of `adapter` (-1: the base model's, 0).
  uint64_t chainRoot(int32_t adapter, std::string_view cache_salt) const;
  // Starts `seq` past the `hit` blocks it holds at its head, counting the lookup.
  void startPast(Sequence& seq, const PrefixHit& hit);
  // A checkpointed() model: `seq`'s next chunk starts from the checkpoint `hit` ends at, and
  // its shared_end moves to the hit's reach.
  void restoreFrom(Sequence& seq, const PrefixHit& hit);
  // Before a prompt chunk: takes the blocks published since (by a prompt sharing the
  // prefix) that continue `seq`'s cached prefix, in place of its own: take(continuation()).
  void extendFromCache(Sequence& seq);
  // The published blocks that continue `seq`'s cached prefix (none when it takes none: no
  // prefix caching, a scored prompt, or a chunk computed past its cached blocks).
  PrefixHit continuation(const Sequence& seq) const;
  // Takes `hit` (continuation(seq)) in place of `seq`'s own blocks, counting the hit.
  void take(Sequence& seq, const PrefixHit& hit);
  void admit();
  std::unique_ptr<Sequence> makeSequence(GenerationRequest request, Mode mode,
                                         std::vector<int32_t> blocks);
  // FailedPrecondition when one of seq.blocks[from, to), which the sequence would write,
  // is published (another prompt's cached KV: a reservation made for another prompt).
  absl::Status writable(const Sequence& seq, int64_t from, int64_t to) const;
  // The reservation of `request` covering `tokens` positions, or an error naming what is
  // missing.
  absl::StatusOr<const std::vector<int32_t>*> reservationFor(const GenerationRequest& request,
                                                             int64_t tokens) const;
  // Publishes the sequence's full blocks whose KV is computed.
  void publishFull(Sequence& seq);
  // Turns decode chunks (batch[i] for members[i], i < decoding) into last token + drafts
  // from `budget`, which they use up.
  void draft(std::span<Sequence* const> members, std::span<SequenceChunk> batch, int64_t& budget);
  // A token drawn from `logits`, the row after `seq`'s last token (adjusted as its request
  // says, masked by its constraint).
  SampledToken sample(Sequence& seq, std::span<const float> logits);
  // Whether `seq`'s next row is sampled from adjusted logits (on the host).
  static bool adjusted(const Sequence& seq);
  // Appends `sampled` to `seq`, and its event to `events`.
  void emit(Sequence& seq, SampledToken sampled, std::vector<TokenEvent>& events);
  // Samples `seq`'s rows after its chunk's tokens in turn while each token sampled equals
  // the draft after it, emitting each; the sequence then continues past the accepted drafts.
  void verify(Sequence& seq, const SequenceChunk& chunk, std::span<const float> logits,
              std::vector<TokenEvent>& events);
  // A linear-attention model's sequence that kept the first `rows` rows of its drafts' step:
  // takes the slot holding the state after them (unless that is the last row's, its own),
  // and gives the step's other row states back. rows 0: gives them all back.
  void keepRowState(Sequence& seq, int64_t rows);
  void finish(size_t index);

  TpGroup& model_;
  const tokenizer::Tokenizer* tokenizer_;
  SchedulerOptions options_;
  KvBlockPool cache_;
  // State slots for sequences (the rest: drafts' row states, then checkpoints).
  int64_t sequence_states_ = 0;
  std::vector<int32_t> free_states_;  // State slots nothing holds, the next one last.
  // Slots for drafts' row states, free between steps. A sequence may trade its own slot for
  // one of them, so which slots are which changes; their numbers do not.
  std::vector<int32_t> free_drafts_;
  std::unordered_map<uint64_t, int32_t> reserved_states_;  // A reservation's slot.
  // State checkpoints by the hash chain through the prefix they end, each in a slot of its
  // own; pinned ones (a sequence is to start from it, a reservation counts on it) stay.
  struct Checkpoint {
    int32_t slot = -1;
    int32_t pins = 0;
    std::list<uint64_t>::iterator lru;
  };
  std::unordered_map<uint64_t, Checkpoint> checkpoints_;
  std::list<uint64_t> checkpoint_lru_;                           // Least recently used first.
  std::vector<int32_t> free_checkpoints_;                        // Checkpoint slots holding none.
  std::unordered_map<uint64_t, uint64_t> reserved_checkpoints_;  // A reservation's prefix.
  // The vocabulary's bytes per token, made when a request first needs a constraint.
  mutable std::shared_ptr<const TokenBytes> token_bytes_;  // engine thread only
  std::vector<float> masked_;                              // a constrained row's logits
  std::deque<GenerationRequest> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;
  std::deque<std::unique_ptr<Sequence>> ready_;  // startDecode()d, waiting for a decode slot.
  std::unordered_map<uint64_t, std::vector<int32_t>> reservations_;
  // Blocks addPrefill() swapped out of a reservation for cached ones, held until it ends.
  std::unordered_map<uint64_t, std::vector<int32_t>> spares_;
  int64_t prefix_hit_tokens_ = 0;
  int64_t prefix_lookup_tokens_ = 0;
  int64_t drafted_tokens_ = 0;
  int64_t accepted_tokens_ = 0;
  std::vector<uint32_t> drafts_;  // draft()'s scratch
  int64_t last_batch_sequences_ = 0;
  int64_t last_decode_sequences_ = 0;
  StepWork last_work_;
};

}  // namespace cleave::engine
