// GenerationService::generate: one client request through admission and the worker
// protocol (see generation_service.h).
#include <random>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/log.h"
#include "grpcpp/client_context.h"
#include "services/engine/stop_checker.h"
#include "services/router/generation_service.h"

namespace cleave::router {
namespace {

using Clock = std::chrono::steady_clock;

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

// Turns a sequence's tokens into the text deltas a client sees: UTF-8 safe, stop strings
// and stop tokens left out.
class TextStream {
 public:
  TextStream(const tokenizer::Tokenizer* tokenizer, const v1::StoppingCriteria& stopping)
      : stopper_({.stop_strings = {stopping.stop().begin(), stopping.stop().end()}}) {
    if (tokenizer != nullptr) detokenizer_.emplace(*tokenizer);
  }
  // The text `token` adds; `last` with the reason when it ends the sequence.
  std::string push(uint32_t token, std::optional<v1::FinishReason> finish) {
    if (!detokenizer_ || stopped_) return "";
    if (finish == v1::FINISH_REASON_STOP_TOKEN) {  // Its text is not returned.
      stopped_ = true;
      return stopper_.flush() + detokenizer_->finish();
    }
    std::string text = stopper_.push(token, detokenizer_->push(token));
    if (stopper_.stopped()) {
      stopped_ = true;
      return text;
    }
    if (finish) {
      stopped_ = true;
      return text + stopper_.flush() + detokenizer_->finish();
    }
    return text;
  }

 private:
  engine::StopChecker stopper_;
  std::optional<tokenizer::IncrementalDetokenizer> detokenizer_;
  bool stopped_ = false;
};

}  // namespace

grpc::Status GenerationService::generate(grpc::ServerContext* context,
                                         const v1::GenerateRequest& request,
                                         grpc::ServerWriter<v1::GenerateResponse>* writer) {
  const auto received = Clock::now();
  std::optional<WorkerPool::ModelView> model = pool_.model();
  if (!model) {
    return error(grpc::StatusCode::UNAVAILABLE,
                 "no decode worker is registered with this router; start cleave-worker with "
                 "--router pointing at it");
  }
  if (!request.model().empty() && request.model() != model->model_id) {
    return error(grpc::StatusCode::NOT_FOUND,
                 absl::StrCat("unknown model '", request.model(), "'; this router serves '",
                              model->model_id, "'"));
  }
  // The prompt.
  std::vector<uint32_t> prompt;
  if (request.has_text()) {
    if (tokenizer_ == nullptr) {
      return error(grpc::StatusCode::FAILED_PRECONDITION,
                   "this router has no tokenizer (start it with --model); send token_ids");
    }
    prompt = tokenizer_->encode(request.text(), {.add_special_tokens = request.add_special_tokens(),
                                                 .parse_special = request.parse_special_tokens()});
    if (prompt.empty()) {
      return error(grpc::StatusCode::INVALID_ARGUMENT, "text tokenizes to no tokens");
    }
  } else {
    prompt.assign(request.token_ids().ids().begin(), request.token_ids().ids().end());
  }
  for (uint32_t id : prompt) {
    if (id >= model->vocab_size) {
      return error(grpc::StatusCode::INVALID_ARGUMENT,
                   absl::StrCat("token_ids: id ", id, " is outside the vocabulary (",
                                model->vocab_size, " tokens)"));
    }
  }
  const int64_t context_length = model->context_length;
  const int64_t prompt_tokens = static_cast<int64_t>(prompt.size());
  if (prompt_tokens >= context_length) {
    return error(grpc::StatusCode::INVALID_ARGUMENT,
                 absl::StrCat("the prompt has ", prompt_tokens, " tokens; the context length is ",
                              context_length, " (prompt plus at least one new token)"));
  }
  const int64_t max_new = request.stopping().has_max_new_tokens()
                              ? request.stopping().max_new_tokens()
                              : context_length - prompt_tokens;
  if (prompt_tokens + max_new > context_length) {
    return error(grpc::StatusCode::INVALID_ARGUMENT,
                 absl::StrCat("stopping.max_new_tokens: the prompt's ", prompt_tokens, " tokens + ",
                              max_new, " new ones exceed the context length ", context_length));
  }
  if (request.stopping().has_min_new_tokens() && request.stopping().min_new_tokens() > 0) {
    return error(grpc::StatusCode::UNIMPLEMENTED, "stopping.min_new_tokens is not supported yet");
  }
  const int64_t blocks = (prompt_tokens + max_new + model->block_size - 1) / model->block_size;

  // Placement: blocks on a decode worker (admission, Reserve), the prompt prefilled into
  // them, the sequence started there. Nothing has reached the client yet, so a decode
  // worker that cannot be reached is passed over and the request placed again.
  const auto deadline = context->deadline();
  const auto cancelled = [context] { return context->IsCancelled(); };
  const std::string id = absl::StrCat(relay_.routerId(), "-", next_request_++);
  v1::SamplingParams sampling = request.sampling();
  if (!sampling.has_seed()) sampling.set_seed(std::random_device{}() * 0x100000001ull);
  v1::StoppingCriteria stopping = request.stopping();
  stopping.set_max_new_tokens(static_cast<uint32_t>(max_new));
  // Whatever happens next, the worker's reservation and the router's admission end with
  // the placement.
  struct Placement {
    GenerationService* self;
    Admission admission;
    std::string id;
    ~Placement() {
      self->relay_.close(id);
      v1::ReleaseRequest release;
      release.set_request_id(id);
      v1::ReleaseResponse released;
      auto ctx = workerContext(std::chrono::system_clock::now() + kCleanupTimeout);
      grpc::Status status = admission.worker->decode->Release(ctx.get(), release, &released);
      if (!status.ok()) {
        CLEAVE_LOG(WARNING) << "release of " << id << " on " << admission.worker->id << ": "
                            << status.error_message();
      }
      self->pool_.release(admission);
    }
  };
  std::unique_ptr<Placement> placed;
  std::shared_ptr<Mailbox> mailbox;
  v1::PrefillResponse prefilled;
  double queue_wait_ms = 0;
  grpc::Status status;
  std::vector<std::string> lost;  // Decode workers this request could not reach.
  auto passOver = [&](const Worker& worker) {
    CLEAVE_LOG(WARNING) << "decode worker " << worker.id << " unreachable for " << id << " ("
                        << status.error_message() << "); placing the request again";
    lost.push_back(worker.id);
    placed.reset();
  };
  while (true) {
    absl::StatusOr<Admission> admitted = pool_.admit(blocks, deadline, cancelled, lost);
    if (!admitted.ok()) return lost.empty() ? toGrpcStatus(admitted.status()) : status;
    queue_wait_ms = msSince(received);
    placed.reset(new Placement{this, *admitted, id});
    const Worker& worker = *placed->admission.worker;

    v1::ReserveRequest reserve;
    reserve.set_request_id(id);
    reserve.set_router_id(relay_.routerId());
    reserve.set_num_blocks(static_cast<uint32_t>(blocks));
    reserve.set_prompt_tokens(static_cast<uint32_t>(prompt_tokens));
    reserve.set_max_new_tokens(static_cast<uint32_t>(max_new));
    // The reservation outlives this router by at most the ttl (until StartDecode) or the
    // client's deadline.
    reserve.set_ttl_ms(10 * 60 * 1000);
    if (deadline < std::chrono::system_clock::now() + std::chrono::hours(24 * 365)) {
      reserve.set_deadline_unix_ms(
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline.time_since_epoch())
              .count());
    }
    v1::ReserveResponse reserved;
    status = worker.decode->Reserve(workerContext(deadline).get(), reserve, &reserved);
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
      passOver(worker);
      continue;
    }
    if (!status.ok()) return status;

    v1::PrefillRequest prefill;
    prefill.set_request_id(id);
    prefill.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
    *prefill.mutable_sampling() = sampling;
    *prefill.mutable_stopping() = stopping;
    if (request.has_logprobs()) prefill.set_logprobs(request.logprobs());
    v1::KvDestination* destination = prefill.mutable_destination();
    destination->set_decode_worker_id(worker.id);
    *destination->mutable_ranks() = worker.info.ranks();
    *destination->mutable_layout() = worker.info.kv_layout();
    const int64_t prompt_blocks = (prompt_tokens + model->block_size - 1) / model->block_size;
    destination->mutable_block_ids()->Add(reserved.block_ids().begin(),
                                          reserved.block_ids().begin() + prompt_blocks);
    // A prefill worker that cannot be reached or whose KV transfer fails is skipped; the
    // next one writes the same blocks again.
    std::vector<std::string> failed;
    while (true) {
      absl::StatusOr<PrefillLease> prefiller = pool_.pickPrefill(worker, prompt_tokens, failed);
      if (!prefiller.ok()) return failed.empty() ? toGrpcStatus(prefiller.status()) : status;
      status =
          prefiller->worker->prefill->Prefill(workerContext(deadline).get(), prefill, &prefilled);
      pool_.releasePrefill(*prefiller);
      if (status.error_code() != grpc::StatusCode::UNAVAILABLE) break;
      CLEAVE_LOG(WARNING) << "prefill of " << id << " on " << prefiller->worker->id << " failed ("
                          << status.error_message() << "); trying another worker";
      failed.push_back(prefiller->worker->id);
    }
    if (!status.ok()) return status;
    if (prefilled.has_finish_reason()) break;  // The first token ends it: nothing to decode.

    mailbox = relay_.open(id, worker.id);
    v1::StartDecodeRequest start;
    start.set_request_id(id);
    start.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
    start.set_first_token_id(prefilled.first_token_id());
    *start.mutable_sampling() = sampling;
    *start.mutable_stopping() = stopping;
    if (request.has_logprobs()) start.set_logprobs(request.logprobs());
    v1::StartDecodeResponse started;
    status = worker.decode->StartDecode(workerContext(deadline).get(), start, &started);
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
      passOver(worker);
      continue;
    }
    if (!status.ok()) return status;
    break;
  }
  const Worker& worker = *placed->admission.worker;

  // The first message: ids, the first token.
  TextStream text(tokenizer_.get(), request.stopping());
  uint32_t completion_tokens = 1;
  v1::GenerateResponse first;
  first.set_request_id(request.request_id().empty() ? id : request.request_id());
  if (request.echo_prompt_token_ids())
    first.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
  first.add_token_ids(prefilled.first_token_id());
  if (prefilled.has_first_logprob()) *first.add_logprobs() = prefilled.first_logprob();
  std::optional<v1::FinishReason> finish;
  if (prefilled.has_finish_reason()) finish = prefilled.finish_reason();
  first.set_text(text.push(prefilled.first_token_id(), finish));
  const double ttft_ms = msSince(received);
  auto finalInfo = [&](v1::FinishReason reason, const std::string& matched) {
    v1::FinalInfo info;
    info.set_finish_reason(reason);
    info.set_matched_stop(matched);
    info.mutable_usage()->set_prompt_tokens(static_cast<uint32_t>(prompt_tokens));
    info.mutable_usage()->set_completion_tokens(completion_tokens);
    v1::Timings* t = info.mutable_timings();
    t->set_queue_wait_ms(queue_wait_ms);
    t->set_prefill_ms(prefilled.prefill_ms());
    t->set_kv_transfer_ms(prefilled.kv_transfer_ms());
    t->set_time_to_first_token_ms(ttft_ms);
    t->set_total_ms(msSince(received));
    queue_wait_.Observe(queue_wait_ms / 1e3);
    ttft_.Observe(ttft_ms / 1e3);
    request_time_.Observe(t->total_ms() / 1e3);
    prefill_.Observe(prefilled.prefill_ms() / 1e3);
    if (prefilled.kv_transfer_ms() > 0) kv_transfer_.Observe(prefilled.kv_transfer_ms() / 1e3);
    return info;
  };
  if (finish) {
    *first.mutable_final() = finalInfo(*finish, prefilled.matched_stop());
    writer->Write(first);
    return grpc::Status::OK;
  }
  if (!writer->Write(first)) return error(grpc::StatusCode::CANCELLED, "the client went away");

  // Decode: the rest arrives on the worker's token stream.
  auto last_sent = Clock::now();
  while (true) {
    std::optional<absl::StatusOr<v1::SequenceEvent>> next =
        mailbox->next(std::chrono::milliseconds(50));
    const bool cancelled = context->IsCancelled();
    const bool expired = std::chrono::system_clock::now() >= deadline;
    if (cancelled || expired) {
      v1::CancelRequest cancel;
      cancel.set_request_id(id);
      cancel.set_reason(cancelled ? "client cancelled" : "deadline");
      v1::CancelResponse response;
      auto ctx = workerContext(std::chrono::system_clock::now() + kCleanupTimeout);
      worker.decode->Cancel(ctx.get(), cancel, &response);
      return cancelled ? error(grpc::StatusCode::CANCELLED, "cancelled by the client")
                       : error(grpc::StatusCode::DEADLINE_EXCEEDED,
                               "the deadline passed while the request was decoding");
    }
    if (!next) continue;
    if (!next->ok()) return toGrpcStatus(next->status());
    const v1::SequenceEvent& event = **next;
    std::optional<v1::FinishReason> reason;
    if (event.has_finish_reason()) reason = event.finish_reason();
    if (reason == v1::FINISH_REASON_CANCELLED || reason == v1::FINISH_REASON_ABORTED) {
      return error(grpc::StatusCode::ABORTED, "the decode worker stopped the request");
    }
    if (event.token_ids_size() > 0) {
      const auto now = Clock::now();
      const double gap = std::chrono::duration<double>(now - last_sent).count();
      for (int i = 0; i < event.token_ids_size(); ++i)
        inter_token_.Observe(gap / event.token_ids_size());
      last_sent = now;
    }
    v1::GenerateResponse message;
    for (int i = 0; i < event.token_ids_size(); ++i) {
      const bool last = i + 1 == event.token_ids_size();
      message.add_token_ids(event.token_ids(i));
      message.mutable_text()->append(text.push(event.token_ids(i), last ? reason : std::nullopt));
      ++completion_tokens;
    }
    message.mutable_logprobs()->CopyFrom(event.logprobs());
    if (reason) {
      *message.mutable_final() = finalInfo(*reason, event.matched_stop());
      writer->Write(message);
      return grpc::Status::OK;
    }
    if (!writer->Write(message)) return error(grpc::StatusCode::CANCELLED, "the client went away");
  }
}

}  // namespace cleave::router
