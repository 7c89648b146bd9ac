#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <map>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "services/transfer/kv_transport.h"

namespace cleave::transfer {
namespace {

absl::Status ucsError(const char* what, ucs_status_t status) {
  return absl::UnavailableError(absl::StrCat("UCX ", what, ": ", ucs_status_string(status)));
}

class UcxTransfer final : public Transfer {
 public:
  // A transfer dropped without abandon() still completes; UCX frees its requests then.
  ~UcxTransfer() override {
    for (void* request : requests) ucp_request_free(request);
  }
  std::vector<void*> requests;  // Outstanding ucp requests (puts, then the flush).
  absl::Status failure;
  std::string peer;  // Its endpoint and keys are dropped when the transfer fails (empty once
                     // abandoned: that already dropped them).
};

class UcxTransport final : public KvTransport {
 public:
  ~UcxTransport() override {
    stop_ = true;
    if (progress_.joinable()) progress_.join();
    absl::MutexLock lock(&mu_);
    for (auto& [key, rkey] : rkeys_) ucp_rkey_destroy(rkey);
    for (auto& [address, ep] : endpoints_) close(ep);
    for (ucp_mem_h memh : regions_) ucp_mem_unmap(context_, memh);
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    if (context_ != nullptr) ucp_cleanup(context_);
  }

  absl::Status start() {
    ucp_config_t* config = nullptr;
    if (ucs_status_t s = ucp_config_read(nullptr, nullptr, &config); s != UCS_OK)
      return ucsError("reading the configuration", s);
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_RMA;
    ucs_status_t s = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    if (s != UCS_OK) return ucsError("init", s);
    ucp_worker_params_t worker_params{};
    worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    worker_params.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // mu_ serializes every call.
    if ((s = ucp_worker_create(context_, &worker_params, &worker_)) != UCS_OK)
      return ucsError("creating a worker", s);
    ucp_address_t* address = nullptr;
    size_t length = 0;
    if ((s = ucp_worker_get_address(worker_, &address, &length)) != UCS_OK)
      return ucsError("reading the worker address", s);
    address_.assign(reinterpret_cast<const char*>(address), length);
    ucp_worker_release_address(worker_, address);
    // Transports without hardware one-sided writes (TCP) complete a peer's writes into our
    // memory only while this worker makes progress: keep it going.
    progress_ = std::thread([this] {
      while (!stop_) {
        unsigned events;
        {
          absl::MutexLock lock(&mu_);
          events = ucp_worker_progress(worker_);
        }
        if (events == 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    });
    return absl::OkStatus();
  }

  Capabilities capabilities() const override { return {.name = "ucx", .cross_process = true}; }
  std::string address() const override { return address_; }

  absl::StatusOr<std::string> registerMemory(void* base, uint64_t bytes) override {
    absl::MutexLock lock(&mu_);
    ucp_mem_map_params_t params{};
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    params.address = base;
    params.length = bytes;
    ucp_mem_h memh = nullptr;
    if (ucs_status_t s = ucp_mem_map(context_, &params, &memh); s != UCS_OK)
      return ucsError("registering memory", s);
    regions_.push_back(memh);
    void* packed = nullptr;
    size_t size = 0;
    if (ucs_status_t s = ucp_rkey_pack(context_, memh, &packed, &size); s != UCS_OK)
      return ucsError("packing a remote key", s);
    std::string key(static_cast<const char*>(packed), size);
    ucp_rkey_buffer_release(packed);
    return key;
  }

  absl::StatusOr<std::unique_ptr<Transfer>> post(const RemoteRegion& target,
                                                 std::span<const Write> writes) override {
    for (const Write& w : writes) {
      if (w.remote_offset + w.bytes > target.bytes) {
        return absl::InvalidArgumentError(absl::StrCat("a write of ", w.bytes, " bytes at offset ",
                                                       w.remote_offset, " leaves the ",
                                                       target.bytes, "-byte region"));
      }
    }
    absl::MutexLock lock(&mu_);
    absl::StatusOr<ucp_ep_h> ep = endpoint(target.peer_address);
    if (!ep.ok()) return ep.status();
    absl::StatusOr<ucp_rkey_h> rkey = remoteKey(*ep, target.peer_address, target.key);
    if (!rkey.ok()) return rkey.status();
    auto transfer = std::make_unique<UcxTransfer>();
    transfer->peer = target.peer_address;
    ucp_request_param_t param{};
    for (const Write& w : writes) {
      void* request =
          ucp_put_nbx(*ep, w.local, w.bytes, target.base + w.remote_offset, *rkey, &param);
      if (UCS_PTR_IS_ERR(request)) {
        transfer->failure = ucsError("put", UCS_PTR_STATUS(request));
        break;
      }
      if (request != nullptr) transfer->requests.push_back(request);
    }
    void* flush = ucp_ep_flush_nbx(*ep, &param);
    if (UCS_PTR_IS_ERR(flush)) {
      transfer->failure = ucsError("flush", UCS_PTR_STATUS(flush));
    } else if (flush != nullptr) {
      transfer->requests.push_back(flush);
    }
    return transfer;
  }

  absl::StatusOr<bool> poll(Transfer& base) override {
    auto& transfer = static_cast<UcxTransfer&>(base);
    absl::MutexLock lock(&mu_);
    if (!progress(transfer)) return false;
    if (!transfer.failure.ok()) {
      if (!transfer.peer.empty()) forget(transfer.peer);
      return transfer.failure;
    }
    return true;
  }

  void abandon(Transfer& base) override {
    auto& transfer = static_cast<UcxTransfer&>(base);
    absl::MutexLock lock(&mu_);
    if (!transfer.requests.empty()) {
      forget(transfer.peer);  // The forced close cancels what the endpoint still holds.
      // Cancelled requests complete as the worker progresses; a bound, should one not.
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (!progress(transfer) && std::chrono::steady_clock::now() < give_up) {
      }
    }
    transfer.failure = absl::CancelledError("the KV transfer was abandoned");
    transfer.peer.clear();
  }

 private:
  // Progresses the worker and frees `transfer`'s completed requests, keeping the first
  // failure; true once none is left.
  bool progress(UcxTransfer& transfer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ucp_worker_progress(worker_);
    for (size_t i = 0; i < transfer.requests.size();) {
      ucs_status_t s = ucp_request_check_status(transfer.requests[i]);
      if (s == UCS_INPROGRESS) {
        ++i;
        continue;
      }
      if (s != UCS_OK && transfer.failure.ok()) transfer.failure = ucsError("write", s);
      ucp_request_free(transfer.requests[i]);
      transfer.requests.erase(transfer.requests.begin() + static_cast<std::ptrdiff_t>(i));
    }
    return transfer.requests.empty();
  }

  void close(ucp_ep_h ep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;  // The peer may be gone.
    void* request = ucp_ep_close_nbx(ep, &param);
    while (UCS_PTR_IS_PTR(request) && ucp_request_check_status(request) == UCS_INPROGRESS) {
      ucp_worker_progress(worker_);
    }
    if (UCS_PTR_IS_PTR(request)) ucp_request_free(request);
  }

  // Drops the endpoint and remote keys of `peer` after a failed transfer to it: a peer that
  // died is never written through a stale endpoint, and one that comes back (a new process
  // has a new address) is connected afresh.
  void forget(const std::string& peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto it = rkeys_.lower_bound(peer); it != rkeys_.end() && it->first.starts_with(peer);) {
      ucp_rkey_destroy(it->second);
      it = rkeys_.erase(it);
    }
    if (auto it = endpoints_.find(peer); it != endpoints_.end()) {
      close(it->second);
      endpoints_.erase(it);
    }
  }

  absl::StatusOr<ucp_ep_h> endpoint(const std::string& peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (auto it = endpoints_.find(peer); it != endpoints_.end()) return it->second;
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    params.address = reinterpret_cast<const ucp_address_t*>(peer.data());
    ucp_ep_h ep = nullptr;
    if (ucs_status_t s = ucp_ep_create(worker_, &params, &ep); s != UCS_OK)
      return ucsError("connecting to a peer", s);
    endpoints_[peer] = ep;
    return ep;
  }

  absl::StatusOr<ucp_rkey_h> remoteKey(ucp_ep_h ep, const std::string& peer, const std::string& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const std::string id = peer + key;
    if (auto it = rkeys_.find(id); it != rkeys_.end()) return it->second;
    ucp_rkey_h rkey = nullptr;
    if (ucs_status_t s = ucp_ep_rkey_unpack(ep, key.data(), &rkey); s != UCS_OK)
      return ucsError("unpacking a remote key", s);
    rkeys_[id] = rkey;
    return rkey;
  }

  absl::Mutex mu_;
  std::atomic<bool> stop_{false};
  std::thread progress_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::string address_;
  std::vector<ucp_mem_h> regions_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, ucp_ep_h> endpoints_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, ucp_rkey_h> rkeys_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<KvTransport>> makeUcxTransport() {
  auto transport = std::make_unique<UcxTransport>();
  if (absl::Status started = transport->start(); !started.ok()) return started;
  return std::unique_ptr<KvTransport>(std::move(transport));
}

}  // namespace cleave::transfer
