// The client-facing cleave.v1.Generation service of the router.
//
// Generate runs one request through the worker protocol (proto/cleave/v1/worker.proto):
// admission on a decode worker (WorkerPool), Reserve, Prefill, StartDecode, then the
// sequence's events from the TokenRelay, turned into UTF-8-safe text deltas for the client.
// Whatever ends the call — the last token, an error, the client cancelling or its
// deadline — releases the reservation on the worker and the admission in the router.
//
// Migration: when the decode worker of a streaming request leaves (its lease expires or it
// deregisters) or drops the sequence, the router places the sequence again — the prompt
// plus every token already sent becomes the new prompt, with the remaining budget — on
// another decode worker, and the client's stream goes on: no gap in the tokens, none
// repeated, the same usage at the end. Greedy requests continue exactly as they would have;
// sampled ones continue with the same seed from a fresh draw, and presence/frequency
// penalties count the tokens before the move as prompt.
//
// Threading: gRPC calls every handler on its own threads, concurrently; shared state is in
// the thread-safe WorkerPool and TokenRelay.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cleave/v1/generation.grpc.pb.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "services/router/api_keys.h"
#include "services/router/token_relay.h"
#include "services/router/worker_pool.h"

namespace cleave::router {

struct GenerationServiceOptions {
  // Capacity of the admission queue, reported by GetServerInfo.
  uint32_t queue_capacity = 1024;
  // How many times one request may move to another decode worker after losing its own
  // (the worker left or dropped the sequence) before it fails with UNAVAILABLE.
  int max_migrations = 3;
  // When set, every call must present one of these keys (else UNAUTHENTICATED).
  std::shared_ptr<ApiKeys> api_keys;
  // Renders `chat` prompts (null: they are refused with FAILED_PRECONDITION, quoting
  // `no_chat_template_reason`).
  std::shared_ptr<const tokenizer::ChatTemplate> chat_template;
  std::string no_chat_template_reason = "no --model";
  // One log line (INFO) per Generate call when it ends: its id, key, sizes, times, workers
  // and outcome — never the prompt or the reply.
  bool log_requests = false;
  // Sampling the model recommends (sampling_defaults.h), for requests that leave it unset.
  v1::SamplingParams sampling_defaults;
};

class GenerationService final : public v1::Generation::Service {
 public:
  // `tokenizer` (may be null: then only token-id prompts are served) is the served model's.
  GenerationService(GenerationServiceOptions options, WorkerPool& pool, TokenRelay& relay,
                    std::shared_ptr<const tokenizer::Tokenizer> tokenizer);

  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override;
  grpc::Status Tokenize(grpc::ServerContext* context, const v1::TokenizeRequest* request,
                        v1::TokenizeResponse* response) override;
  grpc::Status Detokenize(grpc::ServerContext* context, const v1::DetokenizeRequest* request,
                          v1::DetokenizeResponse* response) override;
  grpc::Status ListModels(grpc::ServerContext* context, const v1::ListModelsRequest* request,
                          v1::ListModelsResponse* response) override;
  grpc::Status GetServerInfo(grpc::ServerContext* context, const v1::GetServerInfoRequest* request,
                             v1::GetServerInfoResponse* response) override;
  grpc::Status Embed(grpc::ServerContext* context, const v1::EmbedRequest* request,
                     v1::EmbedResponse* response) override;

 private:
  // Counts one finished call in cleave_router_requests_total and passes the status through.
  grpc::Status finish(const char* method, grpc::Status status);
  // OK when no keys are configured or the call presents a valid one (for Generate and a
  // chat Tokenize, `generate`, also within its key's rate); `client` is then the key's
  // name (empty without keys). A rate refusal carries its retry hint (retry_hint.h).
  grpc::Status authorize(grpc::ServerContext& context, bool generate = false,
                         std::string* client = nullptr) const;
  // What a Generate call's log line says (options_.log_requests), filled as it runs.
  struct Record {
    std::string id;
    int64_t prompt_tokens = -1;  // -1: not known (refused before).
    int64_t cached_tokens = 0;
    uint32_t completion_tokens = 0;
    double ttft_ms = -1;
    std::string workers;  // The decode workers it ran on, in order.
    std::optional<v1::FinishReason> finish;
  };
  grpc::Status embed(grpc::ServerContext* context, const v1::EmbedRequest& request,
                     v1::EmbedResponse& response);
  grpc::Status generate(grpc::ServerContext* context, const v1::GenerateRequest& request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer, const std::string& client,
                        Record& record);

  // A request's sequence as the workers see it.
  struct Sequence {
    std::string id;  // Workers' id for its placement: the request's, then "<it>.<n>" after n moves.
    std::vector<uint32_t> tokens;  // The prompt, then every token sent to the client.
    int64_t prompt_tokens = 0;     // Of `tokens`, the prompt's.
    int64_t remaining = 0;         // New tokens still allowed.
    int64_t blocks = 0;            // KV blocks for its whole life.
    v1::SamplingParams sampling;
    v1::StoppingCriteria stopping;
    std::optional<uint32_t> logprobs;
    std::chrono::system_clock::time_point deadline;
    std::function<bool()> cancelled;
    grpc::ServerContext* call =
        nullptr;           // Its client's call (set): a refusal's retry hint goes there.
    std::string client;    // Its API key's name, for fair queueing.
    int32_t priority = 0;  // GenerateRequest.priority: lower is admitted first.
    std::optional<uint32_t> prompt_logprobs;  // Asked of its first placement's prefill.
    std::string adapter;      // The LoRA adapter it runs with (empty: the base model), and
    std::string cache_salt;   // the salt its prefix cache is kept apart by (empty: none):
    uint64_t chain_root = 0;  // where its blocks' hash chain starts (KvBlockPool::saltedRoot).
  };
  // The sequence on one decode worker: its admission and reservation (both released when
  // this ends), its prefill's answer and, when it decodes, its token mailbox.
  struct Placement {
    Placement(GenerationService& self, Admission admission, std::string id)
        : self(self), admission(std::move(admission)), id(std::move(id)) {}
    ~Placement() { release(); }
    // Ends the placement, once: stops a prefill that may still write into the reservation
    // (`prefilling`), releases the reservation (fenced when a writer may still write) and
    // the admission. False when the decode worker could not be told (the reservation may
    // still stand there).
    bool release();
    bool released = false;
    GenerationService& self;
    Admission admission;
    std::string id;
    double queue_wait_ms = 0;
    double decode_wait_ms = 0;  // Waiting here for a place in the decode batch.
    bool finished = false;      // The sequence ended here normally.
    // When its first decoded token arrived here, and the tokens decoded after that one's event.
    std::optional<std::chrono::steady_clock::time_point> first_decoded_at;
    int64_t decoded_tokens = 0;
    v1::PrefillResponse prefilled;
    std::shared_ptr<Mailbox> mailbox;  // Null when the prefill finished the sequence.
    // A prefill worker whose Prefill call failed or was given up (its deadline passed, the
    // client left) that may still be writing into the reservation: stopped (CancelPrefill,
    // after which none of its writes lands) before the reservation is released.
    std::shared_ptr<const Worker> prefilling;
    // A prefill worker that could not be stopped may still write into the reservation: the
    // decode worker fences its blocks rather than freeing them (ReleaseRequest).
    bool writer_unconfirmed = false;
  };
  // Places `sequence` (admission, Reserve, Prefill, StartDecode), passing over decode
  // workers in `lost` and adding those it cannot reach.
  grpc::Status place(const Sequence& sequence, std::vector<std::string>& lost,
                     std::unique_ptr<Placement>& placed);
  // A chat request's prompt: the template's text and its ids (tokenized with special
  // tokens parsed, none added). Errors carry the code to answer with.
  struct ChatPrompt {
    std::string text;
    std::vector<uint32_t> ids;
  };
  absl::StatusOr<ChatPrompt> chatPrompt(const v1::Chat& chat) const;
  // The tokenizer for `model` (empty: the served one), or the error to return.
  absl::StatusOr<const tokenizer::Tokenizer*> tokenizerFor(const std::string& model) const;

  GenerationServiceOptions options_;
  WorkerPool& pool_;
  TokenRelay& relay_;
  std::shared_ptr<const tokenizer::Tokenizer> tokenizer_;
  std::atomic<uint64_t> next_request_{1};
  std::chrono::system_clock::time_point started_at_;
  prometheus::Family<prometheus::Counter>& requests_;
  // Latencies of successful requests, s (cleave_router_*_seconds).
  prometheus::Histogram& queue_wait_;
  prometheus::Histogram& ttft_;
  prometheus::Histogram& inter_token_;
  prometheus::Histogram& request_time_;
  prometheus::Histogram& kv_transfer_;
  prometheus::Histogram& prefill_;
  prometheus::Histogram& decode_wait_;
  prometheus::Counter& migrations_;
};

}  // namespace cleave::router
