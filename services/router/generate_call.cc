// GenerationService::generate: one client request through admission and the worker
// protocol (see generation_service.h).
#include <algorithm>
#include <random>
#include <span>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "common/retry_hint.h"
#include "common/tokenizer/utf8.h"
#include "grpcpp/client_context.h"
#include "services/engine/kv_block_pool.h"
#include "services/engine/logit_adjustments.h"
#include "services/router/context_overflow.h"
#include "services/router/generation_service.h"
#include "services/router/prompt_tokens.h"
#include "services/router/request_validation.h"
#include "services/router/sampling_defaults.h"
#include "services/router/text_stream.h"

namespace cleave::router {
namespace {

using Clock = std::chrono::steady_clock;

// SamplingParams.bad_words as token sequences (each word as it is, and after a space where
// that makes a word of its own, as vLLM's), added to bad_words_token_ids; all of them
// checked as the workers check them.
absl::Status banWords(const tokenizer::Tokenizer* words, uint32_t vocab_size,
                      v1::SamplingParams& sampling) {
  constexpr int kMaxWords = 64;
  constexpr size_t kMaxWordBytes = 256;
  if (sampling.bad_words_size() > 0 && words == nullptr) {
    return absl::FailedPreconditionError(
        "sampling.bad_words: this router has no tokenizer (start it with --model); send "
        "bad_words_token_ids");
  }
  if (sampling.bad_words_size() > kMaxWords) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sampling.bad_words: ", sampling.bad_words_size(), " words; at most ", kMaxWords));
  }
  engine::LogitAdjustments banned;
  for (const v1::TokenIds& given : sampling.bad_words_token_ids())
    banned.banned.emplace_back(given.ids().begin(), given.ids().end());
  auto add = [&](std::vector<uint32_t> ids) {
    if (!ids.empty() &&
        std::find(banned.banned.begin(), banned.banned.end(), ids) == banned.banned.end()) {
      banned.banned.push_back(std::move(ids));
    }
  };
  for (const std::string& word : sampling.bad_words()) {
    if (word.size() > kMaxWordBytes) {
      return absl::InvalidArgumentError(absl::StrCat("sampling.bad_words: a word of ", word.size(),
                                                     " bytes; at most ", kMaxWordBytes));
    }
    const std::string bare(absl::StripLeadingAsciiWhitespace(word));
    if (bare.empty()) continue;  // Nothing to ban (a lone space is no word).
    const tokenizer::EncodeOptions plain_text{.add_special_tokens = false, .parse_special = false};
    std::vector<uint32_t> plain = words->encode(bare, plain_text);
    std::vector<uint32_t> spaced = words->encode(" " + bare, plain_text);
    // The spaced form only as a new first token and as many tokens (not a space token before
    // the same word).
    const bool own_word =
        !plain.empty() && spaced.size() == plain.size() && spaced.front() != plain.front();
    add(std::move(plain));
    if (own_word) add(std::move(spaced));
  }
  if (absl::Status valid = engine::validate(banned, vocab_size); !valid.ok())
    return absl::InvalidArgumentError(absl::StrCat("sampling.", valid.message()));
  sampling.clear_bad_words();
  sampling.clear_bad_words_token_ids();
  for (const std::vector<uint32_t>& ids : banned.banned)
    sampling.add_bad_words_token_ids()->mutable_ids()->Add(ids.begin(), ids.end());
  return absl::OkStatus();
}

double msSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

grpc::Status error(grpc::StatusCode code, const std::string& message) { return {code, message}; }

// How long a Release or Cancel may take once the client's call is over.
constexpr auto kCleanupTimeout = std::chrono::seconds(5);

// A context for a call to a worker, bounded by the client's deadline.
std::unique_ptr<grpc::ClientContext> workerContext(std::chrono::system_clock::time_point deadline) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(deadline);
  return context;
}

// A call to a worker on behalf of the client's `call`: bounded by its deadline, and
// cancelled with it (a client that leaves while its prompt is computed stops it).
std::unique_ptr<grpc::ClientContext> callContext(grpc::ServerContext* call,
                                                 std::chrono::system_clock::time_point deadline) {
  if (call == nullptr) return workerContext(deadline);
  return grpc::ClientContext::FromServerContext(*call);
}

// Reserves refused for want of blocks the router counted free, each placed again; such a
// refusal comes at once (one for want of staging rows, after a wait, is not retried).
constexpr int kCrowdedRetries = 3;
constexpr auto kCrowdedAnswer = std::chrono::seconds(1);

// Waits `pause`, or less when the call is cancelled or its deadline comes first; false then.
bool pauseFor(std::chrono::milliseconds pause, std::chrono::system_clock::time_point deadline,
              const std::function<bool()>& cancelled) {
  const auto until = std::min(deadline, std::chrono::system_clock::now() + pause);
  while (std::chrono::system_clock::now() < until) {
    if (cancelled && cancelled()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return std::chrono::system_clock::now() < deadline;
}

// Stops `prefiller`'s Prefill of request `id` (CancelPrefill): true once it answered, after
// which none of that prefill's KV writes lands; false when it could not be reached (it may
// be frozen, or cut off from this router but not from the decode worker, and still write).
bool stopPrefill(const Worker& prefiller, const std::string& id) {
  v1::CancelRequest cancel;
  cancel.set_request_id(id);
  v1::CancelResponse cancelled;
  auto ctx = workerContext(std::chrono::system_clock::now() + kCleanupTimeout);
  grpc::Status status = prefiller.prefill->CancelPrefill(ctx.get(), cancel, &cancelled);
  if (!status.ok()) {
    CLEAVE_LOG(WARNING) << "stopping the prefill of " << id << " on " << prefiller.id << ": "
                        << status.error_message() << "; its KV blocks will be fenced";
  }
  return status.ok();
}

}  // namespace

grpc::Status GenerationService::generate(grpc::ServerContext* context,
                                         const v1::GenerateRequest& request,
                                         grpc::ServerWriter<v1::GenerateResponse>* writer,
                                         const std::string& client, Record& record) {
  const auto received = Clock::now();
  std::optional<WorkerPool::ModelView> model = pool_.model();
  if (!model) {
    return error(grpc::StatusCode::UNAVAILABLE,
                 "no decode worker is registered with this router; start cleave-worker with "
                 "--router pointing at it");
  }
  absl::StatusOr<const WorkerPool::AdapterView*> named = adapterNamed(*model, request.model());
  if (!named.ok()) return toGrpcStatus(named.status());
  const WorkerPool::AdapterView* adapter = *named;
  // The prompt.
  std::vector<uint32_t> prompt;
  if (request.has_text()) {
    if (tokenizer_ == nullptr) {
      return error(grpc::StatusCode::FAILED_PRECONDITION, kNoPromptTokenizer);
    }
    prompt = tokenizer_->encode(request.text(), {.add_special_tokens = request.add_special_tokens(),
                                                 .parse_special = request.parse_special_tokens()});
    if (prompt.empty()) {
      return error(grpc::StatusCode::INVALID_ARGUMENT, "text tokenizes to no tokens");
    }
  } else if (request.has_chat()) {
    absl::StatusOr<ChatPrompt> chat = chatPrompt(request.chat());
    if (!chat.ok()) {
      return error(static_cast<grpc::StatusCode>(chat.status().code()),
                   std::string(chat.status().message()));
    }
    prompt = std::move(chat->ids);
  } else {
    prompt.assign(request.token_ids().ids().begin(), request.token_ids().ids().end());
  }
  if (absl::Status s =
          truncatePrompt(request.truncate_prompt_tokens(), model->context_length, prompt);
      !s.ok()) {
    return toGrpcStatus(s);
  }
  if (absl::Status s = checkVocabulary(prompt, model->vocab_size); !s.ok()) return toGrpcStatus(s);
  const int64_t context_length = model->context_length;
  const int64_t prompt_tokens = static_cast<int64_t>(prompt.size());
  record.prompt_tokens = prompt_tokens;
  // Worded as OpenAI's and vLLM's, which clients match to trim a conversation.
  if (prompt_tokens >= context_length) {
    return error(grpc::StatusCode::INVALID_ARGUMENT,
                 absl::StrCat(kContextOverflow, context_length,
                              " tokens. However, your prompt has ", prompt_tokens,
                              " tokens and needs room for at least one new token. Please reduce "
                              "the length of the prompt."));
  }
  const int64_t max_new = request.stopping().has_max_new_tokens()
                              ? request.stopping().max_new_tokens()
                              : context_length - prompt_tokens;
  if (prompt_tokens + max_new > context_length) {
    return error(grpc::StatusCode::INVALID_ARGUMENT,
                 absl::StrCat(kContextOverflow, context_length, " tokens. However, you requested ",
                              prompt_tokens + max_new, " tokens (", prompt_tokens,
                              " in the prompt, ", max_new,
                              " in the completion: stopping.max_new_tokens). Please reduce the "
                              "length of the prompt or completion."));
  }
  if (request.stopping().min_new_tokens() > max_new) {
    return error(grpc::StatusCode::INVALID_ARGUMENT,
                 absl::StrCat("stopping.min_new_tokens ", request.stopping().min_new_tokens(),
                              " exceeds the ", max_new, " new tokens the context leaves"));
  }
  // Scores of a long prompt with many alternatives each would not fit one message.
  if (request.has_prompt_logprobs() &&
      (prompt_tokens - 1) * (int64_t{request.prompt_logprobs()} + 1) > kMaxPromptLogprobEntries) {
    return error(grpc::StatusCode::INVALID_ARGUMENT,
                 absl::StrCat("prompt_logprobs: ", prompt_tokens, " prompt tokens with ",
                              request.prompt_logprobs(), " alternatives each exceed ",
                              kMaxPromptLogprobEntries,
                              " scores in all; ask fewer alternatives or score a shorter prompt"));
  }
  auto outside = [&](uint32_t id) { return id >= model->vocab_size; };
  for (const auto& [id, bias] : request.sampling().logit_bias()) {
    if (outside(id)) {
      return error(grpc::StatusCode::INVALID_ARGUMENT,
                   absl::StrCat("sampling.logit_bias: token id ", id,
                                " is outside the vocabulary (", model->vocab_size, " tokens)"));
    }
  }
  for (uint32_t id : request.sampling().allowed_token_ids()) {
    if (outside(id)) {
      return error(grpc::StatusCode::INVALID_ARGUMENT,
                   absl::StrCat("sampling.allowed_token_ids: token id ", id,
                                " is outside the vocabulary (", model->vocab_size, " tokens)"));
    }
  }
  const int64_t blocks = (prompt_tokens + max_new + model->block_size - 1) / model->block_size;

  // The sequence so far: the prompt, then every token the client has been sent. A
  // placement prefills all of it on a decode worker and decodes the rest there; when that
  // worker is lost mid-stream, the sequence is placed again (migrated) and continues.
  const std::string id = absl::StrCat(relay_.routerId(), "-", next_request_++);
  if (record.id.empty()) record.id = id;
  v1::SamplingParams sampling = request.sampling();
  applySamplingDefaults(options_.sampling_defaults, sampling);
  if (!sampling.has_seed()) sampling.set_seed(std::random_device{}() * 0x100000001ull);
  if (absl::Status banned = banWords(tokenizer_.get(), model->vocab_size, sampling); !banned.ok()) {
    return error(static_cast<grpc::StatusCode>(banned.code()), std::string(banned.message()));
  }
  Sequence sequence{
      .id = id,
      .tokens = prompt,
      .prompt_tokens = prompt_tokens,
      .remaining = max_new,
      .blocks = blocks,
      .sampling = sampling,
      .stopping = request.stopping(),
      .logprobs =
          request.has_logprobs() ? std::optional<uint32_t>(request.logprobs()) : std::nullopt,
      .deadline = context->deadline(),
      .cancelled = [context] { return context->IsCancelled(); },
      .call = context,
      .client = client,
      .priority = request.priority(),
      .prompt_logprobs = request.has_prompt_logprobs()
                             ? std::optional<uint32_t>(request.prompt_logprobs())
                             : std::nullopt,
      .adapter = adapter ? adapter->name : std::string(),
      .cache_salt = request.cache_salt(),
      .chain_root = engine::KvBlockPool::saltedRoot(
          adapter ? engine::KvBlockPool::adapterRoot(adapter->sha256) : 0, request.cache_salt())};
  std::vector<std::string> lost;  // Decode workers this request could not use.
  std::unique_ptr<Placement> placed;
  grpc::Status status = place(sequence, lost, placed);
  if (!status.ok()) return status;
  const double queue_wait_ms = placed->queue_wait_ms;
  const v1::PrefillResponse first_prefill = placed->prefilled;

  TextStream text(tokenizer_.get(), request.stopping(),
                  !request.has_skip_special_tokens() || request.skip_special_tokens());
  uint32_t& completion_tokens = record.completion_tokens;
  int migrations = 0;
  std::string& path = record.workers;  // Decode workers used, for errors.
  path = placed->admission.worker->id;
  record.cached_tokens = first_prefill.cached_prompt_tokens();
  const double ttft_ms = record.ttft_ms = msSince(received);
  double decode_wait_ms = 0;  // Over every placement.
  auto finalInfo = [&](v1::FinishReason reason, const std::string& matched) {
    v1::FinalInfo info;
    info.set_finish_reason(reason);
    info.set_matched_stop(matched);
    info.mutable_usage()->set_prompt_tokens(static_cast<uint32_t>(prompt_tokens));
    info.mutable_usage()->set_completion_tokens(completion_tokens);
    info.mutable_usage()->set_cached_prompt_tokens(first_prefill.cached_prompt_tokens());
    v1::Timings* t = info.mutable_timings();
    t->set_queue_wait_ms(queue_wait_ms);
    t->set_prefill_ms(first_prefill.prefill_ms());
    t->set_kv_transfer_ms(first_prefill.kv_transfer_ms());
    t->set_time_to_first_token_ms(ttft_ms);
    t->set_total_ms(msSince(received));
    t->set_decode_wait_ms(decode_wait_ms);
    queue_wait_.Observe(queue_wait_ms / 1e3);
    ttft_.Observe(ttft_ms / 1e3);
    request_time_.Observe(t->total_ms() / 1e3);
    prefill_.Observe(first_prefill.prefill_ms() / 1e3);
    decode_wait_.Observe(decode_wait_ms / 1e3);
    if (first_prefill.kv_transfer_ms() > 0) {
      kv_transfer_.Observe(first_prefill.kv_transfer_ms() / 1e3);
    }
    return info;
  };
  // Sends `tokens` (the end of the sequence when `reason` is set); false when the call is
  // over (finished, or the client went away: then `status` says so).
  auto last_sent = Clock::now();
  bool first_message = true;
  auto send = [&](std::span<const uint32_t> tokens, const auto& logprobs,
                  std::optional<v1::FinishReason> reason, std::string matched) {
    v1::GenerateResponse message;
    if (first_message) {
      message.set_request_id(request.request_id().empty() ? id : request.request_id());
      *message.mutable_prompt_logprobs() = first_prefill.prompt_logprobs();
      message.set_cached_prompt_tokens(first_prefill.cached_prompt_tokens());
      if (request.echo_prompt_token_ids()) {
        message.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
      }
    } else if (!tokens.empty()) {
      const auto now = Clock::now();
      const double gap = std::chrono::duration<double>(now - last_sent).count();
      for (size_t i = 0; i < tokens.size(); ++i) inter_token_.Observe(gap / tokens.size());
    }
    last_sent = Clock::now();
    first_message = false;
    for (size_t i = 0; i < tokens.size(); ++i) {
      const bool last = i + 1 == tokens.size();
      message.add_token_ids(tokens[i]);
      message.mutable_text()->append(text.push(tokens[i], last ? reason : std::nullopt));
      sequence.tokens.push_back(tokens[i]);
      --sequence.remaining;
      ++completion_tokens;
      if (!(last && reason) && text.stoppedByString()) {  // What comes after it is not sent.
        reason = v1::FINISH_REASON_STOP_STRING;
        matched = text.matched();
        break;
      }
    }
    if (tokens.empty() && reason) message.mutable_text()->append(text.end());
    message.mutable_logprobs()->CopyFrom(logprobs);
    if (message.logprobs_size() > message.token_ids_size()) {
      message.mutable_logprobs()->DeleteSubrange(
          message.token_ids_size(), message.logprobs_size() - message.token_ids_size());
    }
    if (tokenizer_ != nullptr) {
      // A token may be part of a character: its bytes go as they are, its text with
      // U+FFFD (a proto string must be UTF-8).
      auto describe = [&](auto& lp) {
        const uint32_t id = lp.token_id();
        std::string bytes = tokenizer_->decode({&id, 1}, false);
        lp.set_text(tokenizer::sanitizeUtf8(bytes));
        lp.set_token_bytes(std::move(bytes));
      };
      for (auto* list : {message.mutable_logprobs(), message.mutable_prompt_logprobs()}) {
        for (v1::TokenLogprob& lp : *list) {
          describe(lp);
          for (v1::TopLogprob& top : *lp.mutable_top()) describe(top);
        }
      }
    }
    if (reason) {
      record.finish = reason;
      placed->finished = true;
      // Its decode worker's cache keeps the blocks of the prompt and the reply: the next
      // turn of a conversation finds them there.
      if (placed->mailbox != nullptr) {
        pool_.decoded(
            *placed->admission.worker,
            PrefixIndex::blockHashes(sequence.tokens, model->block_size, sequence.chain_root));
      }
      *message.mutable_final() = finalInfo(*reason, matched);
      writer->Write(message);
      status = grpc::Status::OK;
      return false;
    }
    if (!writer->Write(message)) {
      status = error(grpc::StatusCode::CANCELLED, "the client went away");
      return false;
    }
    return true;
  };
  // A placement's first token comes from its prefill.
  auto sendPrefilled = [&] {
    const v1::PrefillResponse& p = placed->prefilled;
    google::protobuf::RepeatedPtrField<v1::TokenLogprob> logprobs;
    if (p.has_first_logprob()) *logprobs.Add() = p.first_logprob();
    const uint32_t token = p.first_token_id();
    return send({&token, 1}, logprobs,
                p.has_finish_reason() ? std::optional(p.finish_reason()) : std::nullopt,
                p.matched_stop());
  };
  if (!sendPrefilled()) return status;

  // Decode: the rest arrives on the worker's token stream.
  while (true) {
    const Worker& worker = *placed->admission.worker;
    std::optional<absl::StatusOr<v1::SequenceEvent>> next =
        placed->mailbox->next(std::chrono::milliseconds(50));
    const bool cancelled = context->IsCancelled();
    const bool expired = std::chrono::system_clock::now() >= sequence.deadline;
    if (cancelled || expired) {
      v1::CancelRequest cancel;
      cancel.set_request_id(sequence.id);
      cancel.set_reason(cancelled ? "client cancelled" : "deadline");
      v1::CancelResponse response;
      auto ctx = workerContext(std::chrono::system_clock::now() + kCleanupTimeout);
      worker.decode->Cancel(ctx.get(), cancel, &response);
      return cancelled ? error(grpc::StatusCode::CANCELLED, "cancelled by the client")
                       : error(grpc::StatusCode::DEADLINE_EXCEEDED,
                               "the deadline passed while the request was decoding");
    }
    if (!next) continue;
    std::optional<v1::FinishReason> reason;
    if (next->ok() && (*next)->has_finish_reason()) reason = (*next)->finish_reason();
    // The decode worker left (its lease expired or it deregistered) or dropped the
    // sequence (it is stopping): continue on another one.
    const bool worker_left = !next->ok() && next->status().code() == absl::StatusCode::kUnavailable;
    if (worker_left || reason == v1::FINISH_REASON_CANCELLED ||
        reason == v1::FINISH_REASON_ABORTED) {
      const std::string why =
          next->ok() ? "it stopped the sequence" : std::string(next->status().message());
      if (migrations == options_.max_migrations) {
        return error(grpc::StatusCode::UNAVAILABLE,
                     absl::StrCat("the request lost its decode worker ", migrations + 1, " times (",
                                  path, "; last: ", why, "); the --max-migrations limit is ",
                                  options_.max_migrations));
      }
      if (sequence.remaining <= 0) {  // Every token was sent; only the ending was lost.
        send({}, google::protobuf::RepeatedPtrField<v1::TokenLogprob>(), v1::FINISH_REASON_LENGTH,
             "");
        return status;
      }
      ++migrations;
      migrations_.Increment();
      CLEAVE_LOG(WARNING) << "request " << id << " lost decode worker " << worker.id << " (" << why
                          << ") after " << completion_tokens << " tokens; placing it again";
      if (!worker_left) lost.push_back(worker.id);
      placed.reset();
      // Workers know each placement by its own id: nothing a worker still holds of an
      // earlier one can be taken for this one's.
      sequence.id = absl::StrCat(id, ".", migrations);
      status = place(sequence, lost, placed);
      if (!status.ok()) return status;
      absl::StrAppend(&path, ", ", placed->admission.worker->id);
      if (!sendPrefilled()) return status;
      continue;
    }
    if (!next->ok()) return toGrpcStatus(next->status());
    const v1::SequenceEvent& event = **next;
    placed->decode_wait_ms += event.batch_wait_us() / 1e3;
    if (placed->first_decoded_at) {
      placed->decoded_tokens += event.token_ids_size();
    } else {
      placed->first_decoded_at = Clock::now();
    }
    decode_wait_ms += event.batch_wait_us() / 1e3;
    const std::vector<uint32_t> tokens(event.token_ids().begin(), event.token_ids().end());
    if (!send(tokens, event.logprobs(), reason, event.matched_stop())) return status;
  }
}

grpc::Status GenerationService::place(const Sequence& sequence, std::vector<std::string>& lost,
                                      std::unique_ptr<Placement>& placed) {
  // Admission (blocks on a decode worker), Reserve, Prefill, StartDecode. Nothing of this
  // placement has reached the client yet, so a decode worker that cannot be reached is
  // passed over and the sequence placed again.
  const auto placing = Clock::now();
  const std::optional<WorkerPool::ModelView> model =
      pool_.awaitModel(sequence.deadline, sequence.cancelled);
  if (!model) {
    return error(grpc::StatusCode::UNAVAILABLE, "every worker left this router");
  }
  const int64_t tokens = static_cast<int64_t>(sequence.tokens.size());
  // The blocks of the sequence a worker's prefix cache may hold.
  const std::vector<uint64_t> prefix =
      PrefixIndex::blockHashes(sequence.tokens, model->block_size, sequence.chain_root);
  v1::StoppingCriteria stopping = sequence.stopping;
  stopping.set_max_new_tokens(static_cast<uint32_t>(sequence.remaining));
  // A moved sequence's tokens already sent count toward its minimum.
  const int64_t sent = tokens - sequence.prompt_tokens;
  stopping.set_min_new_tokens(
      static_cast<uint32_t>(std::max<int64_t>(0, int64_t{stopping.min_new_tokens()} - sent)));
  grpc::Status status;
  auto passOver = [&](const Worker& worker) {
    CLEAVE_LOG(WARNING) << "decode worker " << worker.id << " unreachable for " << sequence.id
                        << " (" << status.error_message() << "); placing the request again";
    lost.push_back(worker.id);
    placed.reset();
  };
  int crowded = 0;  // Reserves refused for want of blocks the router counted free.
  std::vector<std::string> unstoppable;  // Prefill workers whose writes could not be stopped.
  // A scored prompt is computed whole: no cached block is shared.
  const bool scored = sequence.prompt_logprobs && tokens == sequence.prompt_tokens;
  const std::span<const uint64_t> shareable =
      scored ? std::span<const uint64_t>() : std::span<const uint64_t>(prefix);
  while (true) {
    absl::StatusOr<Admission> admitted =
        pool_.admit(sequence.blocks, sequence.deadline, sequence.cancelled, lost, sequence.client,
                    sequence.remaining, shareable, sequence.priority);
    if (!admitted.ok())
      return status.ok() ? toGrpcStatus(admitted.status(), *sequence.call) : status;
    placed.reset(new Placement(*this, *admitted, sequence.id));
    placed->queue_wait_ms = msSince(placing);
    const Worker& worker = *placed->admission.worker;

    v1::ReserveRequest reserve;
    reserve.set_request_id(sequence.id);
    reserve.set_router_id(relay_.routerId());
    reserve.set_num_blocks(static_cast<uint32_t>(sequence.blocks));
    reserve.set_prompt_tokens(static_cast<uint32_t>(tokens));
    reserve.set_max_new_tokens(static_cast<uint32_t>(sequence.remaining));
    reserve.set_adapter(sequence.adapter);
    reserve.set_cache_salt(sequence.cache_salt);
    // The decode worker shares the blocks of the prefix its cache holds: not sent again
    // (unless the prompt is scored: a worker prefilling for itself computes it whole).
    if (!scored)
      reserve.mutable_prompt_token_ids()->Add(sequence.tokens.begin(), sequence.tokens.end());
    // The reservation outlives this router by at most the ttl (until StartDecode) or the
    // client's deadline.
    reserve.set_ttl_ms(10 * 60 * 1000);
    if (sequence.deadline < std::chrono::system_clock::now() + std::chrono::hours(24 * 365)) {
      reserve.set_deadline_unix_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                                       sequence.deadline.time_since_epoch())
                                       .count());
    }
    v1::ReserveResponse reserved;
    const auto reserving = Clock::now();
    status = worker.decode->Reserve(callContext(sequence.call, sequence.deadline).get(), reserve,
                                    &reserved);
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
      passOver(worker);
      continue;
    }
    // Refused at once for want of blocks (not after waiting for staging rows): the worker
    // holds more than this router counts (another router's requests: this one restarted);
    // its next heartbeat says how much. Placed again after it.
    if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED && crowded < kCrowdedRetries &&
        Clock::now() - reserving < kCrowdedAnswer) {
      CLEAVE_LOG(WARNING) << "decode worker " << worker.id << " is fuller than counted for "
                          << sequence.id << " (" << status.error_message()
                          << "); placing it again after its next heartbeat";
      ++crowded;
      placed.reset();
      if (!pauseFor(2 * pool_.heartbeatInterval(), sequence.deadline, sequence.cancelled)) {
        return sequence.cancelled()
                   ? error(grpc::StatusCode::CANCELLED, "cancelled by the client")
                   : error(grpc::StatusCode::DEADLINE_EXCEEDED,
                           "the deadline passed while the request waited for room on a decode "
                           "worker");
      }
      status = grpc::Status::OK;  // Not this placement's outcome: the next one's is.
      continue;
    }
    if (!status.ok()) return status;
    pool_.settle(placed->admission, reserved.cached_blocks(), shareable);

    v1::PrefillRequest prefill;
    prefill.set_request_id(sequence.id);
    prefill.mutable_prompt_token_ids()->Add(sequence.tokens.begin(), sequence.tokens.end());
    prefill.set_adapter(sequence.adapter);
    prefill.set_cache_salt(sequence.cache_salt);
    *prefill.mutable_sampling() = sequence.sampling;
    *prefill.mutable_stopping() = stopping;
    if (sequence.logprobs) prefill.set_logprobs(*sequence.logprobs);
    if (scored) prefill.set_prompt_logprobs(*sequence.prompt_logprobs);
    prefill.set_output_tokens(static_cast<uint32_t>(static_cast<int64_t>(sequence.tokens.size()) -
                                                    sequence.prompt_tokens));
    v1::KvDestination* destination = prefill.mutable_destination();
    destination->set_decode_worker_id(worker.id);
    *destination->mutable_ranks() = worker.info.ranks();
    *destination->mutable_layout() = worker.info.kv_layout();
    const int64_t prompt_blocks = (tokens + model->block_size - 1) / model->block_size;
    if (reserved.block_ids_size() < prompt_blocks) {
      return grpc::Status(
          grpc::StatusCode::INTERNAL,
          absl::StrCat("decode worker ", worker.id, " named ", reserved.block_ids_size(),
                       " KV blocks for a prompt of ", prompt_blocks));
    }
    if (reserved.cached_blocks() >= prompt_blocks) {
      return grpc::Status(
          grpc::StatusCode::INTERNAL,
          absl::StrCat("decode worker ", worker.id, " holds ", reserved.cached_blocks(),
                       " cached blocks of a prompt of ", prompt_blocks, ": none left to write"));
    }
    destination->mutable_block_ids()->Add(reserved.block_ids().begin(),
                                          reserved.block_ids().begin() + prompt_blocks);
    destination->set_skip_blocks(reserved.cached_blocks());
    // A linear-attention model's state goes to the slot the reservation holds.
    if (reserved.has_state_slot()) destination->set_state_slot(reserved.state_slot());
    // A prefill worker that cannot be reached or whose KV transfer fails is skipped; the
    // next one writes the same blocks again, once the failed one is known to have stopped
    // writing (else the blocks are fenced and the sequence placed again, in other blocks).
    // When every one fails, the decode worker's side may be what failed (a transfer into a
    // worker that died): place the sequence again.
    // Those that could not be stopped are passed over by every placement of the sequence.
    std::vector<std::string> failed = unstoppable;
    bool every_prefill_failed = false, writer_unconfirmed = false;
    while (true) {
      absl::StatusOr<PrefillLease> prefiller = pool_.pickPrefill(worker, tokens, prefix, failed);
      // No prefill worker (every one restarting, or none but those passed over): wait for
      // one to register, as long as a restart takes.
      const bool none_failed_here = failed.size() == unstoppable.size();
      if (!prefiller.ok() && none_failed_here &&
          pool_.awaitPrefill(worker, unstoppable, sequence.deadline, sequence.cancelled)) {
        prefiller = pool_.pickPrefill(worker, tokens, prefix, failed);
      }
      if (!prefiller.ok()) {
        if (sequence.cancelled && sequence.cancelled())
          return error(grpc::StatusCode::CANCELLED, "cancelled by the client");
        if (std::chrono::system_clock::now() >= sequence.deadline) {
          return error(grpc::StatusCode::DEADLINE_EXCEEDED,
                       "the deadline passed while the request waited for a prefill worker");
        }
        if (none_failed_here && !unstoppable.empty()) {
          return error(grpc::StatusCode::UNAVAILABLE,
                       absl::StrCat("no prefill worker can take the prompt: ",
                                    absl::StrJoin(unstoppable, ", "),
                                    " could not be stopped after failing it, and no other is "
                                    "registered"));
        }
        if (none_failed_here) return toGrpcStatus(prefiller.status());
        every_prefill_failed = true;
        break;
      }
      status = prefiller->worker->prefill->Prefill(
          callContext(sequence.call, sequence.deadline).get(), prefill, &placed->prefilled);
      pool_.releasePrefill(*prefiller, status.ok());
      if (status.ok()) break;
      if (status.error_code() != grpc::StatusCode::UNAVAILABLE) {
        // Given up (deadline, cancellation) or failed: stopped before the blocks are freed.
        placed->prefilling = prefiller->worker;
        break;
      }
      CLEAVE_LOG(WARNING) << "prefill of " << sequence.id << " on " << prefiller->worker->id
                          << " failed (" << status.error_message() << "); trying another worker";
      failed.push_back(prefiller->worker->id);
      if (!stopPrefill(*prefiller->worker, sequence.id)) {
        unstoppable.push_back(prefiller->worker->id);
        writer_unconfirmed = true;
        break;
      }
    }
    if (writer_unconfirmed) {
      // Placed again in other blocks; a decode worker that could not be told to fence these
      // is passed over (its reservation may stand: the same id would get the same blocks).
      placed->writer_unconfirmed = true;
      if (!placed->release()) lost.push_back(worker.id);
      placed.reset();
      status = grpc::Status::OK;  // Not this placement's outcome: the next one's is.
      continue;
    }
    if (every_prefill_failed) {
      passOver(worker);
      continue;
    }
    if (!status.ok()) return status;
    if (placed->prefilled.has_finish_reason()) return grpc::Status::OK;  // Nothing to decode.

    placed->mailbox = relay_.open(sequence.id, worker.id);
    v1::StartDecodeRequest start;
    start.set_request_id(sequence.id);
    start.set_adapter(sequence.adapter);
    start.set_cache_salt(sequence.cache_salt);
    start.mutable_prompt_token_ids()->Add(sequence.tokens.begin(), sequence.tokens.end());
    start.set_first_token_id(placed->prefilled.first_token_id());
    *start.mutable_sampling() = sequence.sampling;
    *start.mutable_stopping() = stopping;
    if (sequence.logprobs) start.set_logprobs(*sequence.logprobs);
    start.set_output_tokens(prefill.output_tokens());
    v1::StartDecodeResponse started;
    status = worker.decode->StartDecode(callContext(sequence.call, sequence.deadline).get(), start,
                                        &started);
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
      passOver(worker);
      continue;
    }
    return status;
  }
}

bool GenerationService::Placement::release() {
  if (released) return true;
  released = true;
  self.relay_.close(id);
  if (prefilling != nullptr && !stopPrefill(*prefilling, id)) writer_unconfirmed = true;
  v1::ReleaseRequest release;
  release.set_request_id(id);
  release.set_writer_may_be_active(writer_unconfirmed);
  v1::ReleaseResponse answer;
  auto ctx = workerContext(std::chrono::system_clock::now() + kCleanupTimeout);
  grpc::Status status = admission.worker->decode->Release(ctx.get(), release, &answer);
  if (!status.ok()) {
    CLEAVE_LOG(WARNING) << "release of " << id << " on " << admission.worker->id << ": "
                        << status.error_message();
  } else if (answer.blocks_fenced() > 0) {
    CLEAVE_LOG(WARNING) << "the " << answer.blocks_fenced() << " KV blocks of " << id << " on "
                        << admission.worker->id << " are fenced for " << answer.fenced_ms()
                        << " ms: a prefill worker that could not be stopped may still write "
                           "into them";
  }
  std::optional<Served> served;
  if (finished) {
    served = Served{.decode_wait_s = decode_wait_ms / 1e3, .decoded_tokens = decoded_tokens};
    if (first_decoded_at) {
      served->decode_s = std::chrono::duration<double>(Clock::now() - *first_decoded_at).count();
    }
  }
  self.pool_.release(admission, served, answer.blocks_fenced(),
                     std::chrono::milliseconds(answer.fenced_ms()));
  return status.ok();
}

}  // namespace cleave::router
