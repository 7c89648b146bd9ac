// What a worker's gRPC services (DecodeControl, PrefillControl) share: the engine loop, the
// requests it holds under the router's ids, pending prefills, and the token streams to the
// routers (proto/cleave/v1/worker.proto for the protocol and its invariants).
//
// Threading: every method may be called from any gRPC thread at once; onStep() runs on
// the engine thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cleave/v1/worker.grpc.pb.h"
#include "common/service_thread.h"
#include "grpcpp/server_context.h"
#include "services/roofline/roofline.h"
#include "services/transfer/kv_transport.h"
#include "services/worker/engine_loop.h"
#include "services/worker/kv_staging.h"
#include "services/worker/worker_metrics.h"

namespace cleave::worker {

struct WorkerCoreOptions {
  std::string worker_id;  // This worker's id: a prefill destination naming it is local.
  engine::SchedulerOptions scheduler;
  std::vector<uint32_t> eos_ids;  // The model's end-of-sequence ids.
  v1::KvLayout layout;            // This worker's; a destination must match it.
  // Writes prompt KV into other workers' pools (null: this worker prefills only for itself).
  transfer::KvTransport* transport = nullptr;
  std::chrono::milliseconds transfer_timeout{30000};
  // False on a decode worker: Prefill computes only prompts this worker decodes itself (the
  // router's --local-prefill-tokens), never one to send to a peer.
  bool prefills_for_peers = true;
  // A cache elsewhere (a GPU): the group's host rows are a staging area (kv_staging.h),
  // not the pool: rows [0, staging_send_blocks) for prompts this worker sends, the next
  // staging_receive_blocks for prompts written into it. Both 0: the host rows are the cache
  // (the CPU model), and transfers read and write the pool's blocks themselves.
  int64_t staging_send_blocks = 0;
  int64_t staging_receive_blocks = 0;
  // A reservation not started within this is fenced (ReserveRequest.ttl_ms overrides it),
  // and so are a router's requests once no token stream of that router has been open for
  // this long (the router is presumed lost; those decoding are freed).
  std::chrono::milliseconds lease_timeout{10000};
  // How long a fenced reservation's blocks stay out of use (ReleaseRequest.writer_may_be_active):
  // a late KV write from a writer nobody could stop lands in them meanwhile.
  std::chrono::milliseconds quarantine{300000};
  // Sequences this worker decodes at once (0 for a prefill-only worker), for the metrics.
  int64_t target_concurrency = 0;
  // What this machine can do (measured at start); each step's floor is computed against
  // it. Unset: no floor.
  std::optional<roofline::Hardware> hardware;
  // Each rank on its own device (GPUs, `hardware` being one of them): a step's floor is a
  // rank's share over one device's bandwidth, plus the all-reduces. Else the ranks share
  // the machine `hardware` describes.
  bool rank_per_device = false;
};

class WorkerCore {
 public:
  WorkerCore(engine::TpGroup& model, const tokenizer::Tokenizer* tokenizer,
             WorkerCoreOptions options);
  ~WorkerCore();

  void setWorkerId(std::string id);
  // Reserves the sequence's blocks and, on a worker that stages transfers, the staging rows
  // its prompt is written into (waiting, within the call's deadline and the transfer
  // timeout, while transfers not yet started hold them all); `context` may be null.
  absl::StatusOr<v1::ReserveResponse> reserve(const v1::ReserveRequest& request,
                                              grpc::ServerContext* context = nullptr);
  // Prefills into this worker's own reservation (a BOTH worker serving itself), or into
  // local blocks that are then written into the destination worker's reserved blocks over
  // the KV transport. Waits for the first token (and the transfer); a cancelled call
  // cancels the prefill.
  // Computes a prompt in blocks of this worker's own (its cached prefix reused, and what it
  // computes cached for later) and returns the model's last hidden state at its last token.
  // The blocks are freed when it returns; a cancelled call cancels the prefill.
  absl::StatusOr<v1::EmbedPromptResponse> embed(const v1::EmbedPromptRequest& request,
                                                grpc::ServerContext* context);
  absl::StatusOr<v1::PrefillResponse> prefill(const v1::PrefillRequest& request,
                                              grpc::ServerContext* context);
  absl::Status startDecode(const v1::StartDecodeRequest& request);
  // Frees a request's blocks, or fences them (a reservation not started whose writer may
  // still write: see ReleaseRequest).
  v1::ReleaseResponse release(const v1::ReleaseRequest& request);
  // Cancels a request; one whose prompt is being written to a peer stops first, and no
  // write of it lands after this returns.
  bool cancel(const std::string& request_id);
  // Writes router_id's token events until the call is cancelled or another stream for the
  // same router replaces it (then ABORTED).
  grpc::Status streamTokens(const std::string& router_id, grpc::ServerContext* context,
                            grpc::ServerWriter<v1::TokenEvents>* writer);
  // `router_id`: the router this worker is registered with (RegisterResponse); what that
  // router does not count (other routers' requests, fenced blocks) is kv_blocks_foreign.
  // Never waits out a long step (a heartbeat must not miss the router's lease): when the
  // engine has not answered within kLoadWait, the pool as the last step or call left it
  // (and the foreign blocks last counted).
  v1::LoadSnapshot load(const std::string& router_id = "");
  static constexpr std::chrono::milliseconds kLoadWait{250};
  // Requests (reserved, prefilling or decoding) this worker holds.
  int64_t heldRequests();

 private:
  using Clock = std::chrono::steady_clock;
  struct Request {
    uint64_t id = 0;
    std::string router_id;
    bool decoding = false;  // StartDecode was accepted.
    bool starting = false;  // A StartDecode is handing it to the engine.
    // Being freed (releaseId) or fenced: the other leaves it alone, and StartDecode refuses it.
    bool ending = false;
    Clock::time_point ready_at;   // When StartDecode came.
    bool decode_started = false;  // Its first decode event was sent.
    // Its prompt's KV was computed here (a local prefill), not written in by a transfer:
    // nothing to bring in from the host rows before decoding.
    bool prefilled_here = false;
    // The receive staging rows its prompt is written into (a worker that stages
    // transfers), held until StartDecode has copied them in or the request is forgotten.
    std::vector<int32_t> staging;
    // Leading prompt blocks its reservation took from the prefix cache: no transfer writes
    // them, nothing is copied in for them.
    int64_t cached_blocks = 0;
    int64_t prompt_blocks = 0;  // Those a prefill worker is told to write (and the cached).
    Clock::time_point expires = Clock::time_point::max();  // Unless decoding by then.
    // While its prompt is being written to a peer (a prefill for another worker): set to
    // stop the writes; cancel() waits until the sender has let go (null again).
    std::atomic<bool>* stop_sending = nullptr;
    std::chrono::system_clock::time_point deadline = std::chrono::system_clock::time_point::max();
  };
  struct Stream {
    std::deque<v1::TokenEvents> pending;
    uint64_t owner = 0;  // The call writing it; a newer call takes over.
    bool open = false;
    Clock::time_point closed_at = Clock::now();
  };
  // Frees sequences whose deadline passed and those of routers gone silent; fences
  // reservations not started whose ttl passed or whose router went silent; ends quarantines.
  void sweep();
  using PrefillResult = absl::StatusOr<engine::TokenEvent>;

  void onStep(StepReport& report);  // Engine thread.
  // Runs `request` (engine id `id`, reserved) to its first token.
  absl::StatusOr<engine::TokenEvent> runPrefill(uint64_t id,
                                                const engine::GenerationRequest& request,
                                                grpc::ServerContext* context);
  // The blocks of this worker's pool for `prompt`, which it computes for another worker
  // (its cached prefix's first, when `cached`): waits (within the call's deadline, until it is
  // cancelled) while the pool is full of prompts computing or being sent, which free their blocks
  // soon; ResourceExhausted when the wait ends or the prompt is larger than the pool.
  // (of `scope`'s requests)
  struct CacheScope;
  absl::StatusOr<std::vector<int32_t>> reservePrefillBlocks(uint64_t id,
                                                            std::span<const uint32_t> prompt,
                                                            bool cached, const CacheScope& scope,
                                                            grpc::ServerContext* context);
  // What a request's KV is cached under: its LoRA adapter (an index, -1 for none) and cache
  // salt. Requests share cached blocks only within one scope.
  struct CacheScope {
    int32_t adapter = -1;
    std::string salt;
    void applyTo(engine::GenerationRequest& request) const {
      request.adapter = adapter;
      request.cache_salt = salt;
    }
  };
  // The scope a request names. NotFound naming the loaded adapters for one not loaded;
  // InvalidArgument for a salt over kMaxCacheSaltBytes.
  absl::StatusOr<CacheScope> scopeOf(const std::string& adapter, const std::string& salt) const;
  // Writes the prompt of `id` (its reserved blocks here) into the destination's blocks:
  // straight from the cache, or through the send staging rows a chunk at a time (waiting
  // for them within the call's deadline). Adds the bytes written to `bytes`.
  // Stops (Aborted) when the call is cancelled or CancelPrefill comes (`stop`), and at the
  // call's deadline: no write lands after it returns.
  absl::Status sendPrompt(uint64_t id, const v1::KvDestination& destination,
                          grpc::ServerContext* context, const std::atomic<bool>& stop,
                          uint64_t& bytes);
  // Writes host rows `local` into the destination's blocks `remote`, one for one, each
  // transfer stopped (Aborted) once `stop` is true, and within `timeout`.
  absl::Status sendKv(const v1::KvDestination& destination, std::span<const int32_t> local,
                      std::span<const uint32_t> remote, uint64_t& bytes,
                      const std::function<bool()>& stop, std::chrono::milliseconds timeout);
  // A model with linear-attention layers: writes the state the prompt of `id` left in its
  // reservation's slot into the destination's state_slot (InvalidArgument without one, or
  // for a destination whose ranks name no state slots), as sendKv writes blocks.
  absl::Status sendState(uint64_t id, const v1::KvDestination& destination, uint64_t& bytes,
                         const std::function<bool()>& stop, std::chrono::milliseconds timeout);
  // The engine id of `request_id`, if known.
  std::optional<uint64_t> idOf(const std::string& request_id);
  // Gives `request`'s receive staging rows back (none left after).
  void giveStaging(Request& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops `id`'s request (its name's entry only while it is still `id`'s), giving back its
  // staging rows.
  void forget(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks `id`'s request as being ended by the caller (Request::ending): false when it is
  // unknown or another call's to end already.
  bool claim(uint64_t id);
  // Frees `id`'s reservation and forgets it (after stopSending); the blocks freed.
  uint32_t releaseId(uint64_t id);
  // Forgets `id`'s request, if it has not started decoding, keeping its prompt's blocks (all
  // a prefill worker may write; the rest are freed) and receive staging rows out of use for
  // options_.quarantine. The blocks fenced, or nullopt: unknown, being freed or fenced
  // already, or (`busy` set, when given) decoding or being started.
  std::optional<int64_t> fence(uint64_t id, bool* busy = nullptr);
  // Sets the fenced-blocks gauge (blocks no reservation but a fenced one holds).
  void reportFenced();
  // The request of engine id `id`, if it is still known under its name.
  Request* requestOf(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees the fenced reservations whose quarantine is over.
  void endQuarantines();
  // The engine ids of the fenced reservations.
  std::vector<uint64_t> fencedIds() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A prompt of `id` being written to a peer stops: returns once no write of it can land
  // and the sender has let go of its blocks.
  void stopSending(uint64_t id);
  // Fails a pending prefill of `id`, if any.
  void abortPrefill(uint64_t id, const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  engine::TpGroup& model_;
  WorkerCoreOptions options_;
  // A worker that stages transfers (options_.staging_*): its two areas; else null.
  std::unique_ptr<KvStagingSlots> send_staging_, receive_staging_;
  // The floor of the step `report` describes, when the hardware is known.
  std::optional<double> floorOf(const StepReport& report) const;

  WorkerMetrics metrics_;
  absl::Mutex mu_;
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_stream_ ABSL_GUARDED_BY(mu_) = 1;
  std::unordered_map<std::string, Request> requests_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<uint64_t, std::string> names_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<uint64_t, std::promise<PrefillResult>> prefills_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<std::string, Stream> streams_ ABSL_GUARDED_BY(mu_);
  struct Fenced {
    uint64_t id = 0;               // Its engine reservation, held.
    std::vector<int32_t> staging;  // Receive staging rows, held.
    Clock::time_point until;
  };
  std::vector<Fenced> fenced_ ABSL_GUARDED_BY(mu_);
  v1::LoadSnapshot pool_load_ ABSL_GUARDED_BY(mu_);  // As the last StepReport left it.
  // Blocks the last load() counted foreign, and those only fenced reservations hold
  // (reportFenced()): a load() the engine did not answer in time reports the larger.
  std::atomic<int64_t> foreign_blocks_{0};
  std::atomic<int64_t> fenced_blocks_{0};
  std::unique_ptr<EngineLoop> loop_;              // Its thread calls onStep().
  ServiceThread sweeper_{"reservation-sweeper"};  // Last: it calls into everything above.
};

}  // namespace cleave::worker
