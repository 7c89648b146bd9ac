#include "services/worker/registration.h"

#include <chrono>

#include "common/faults.h"
#include "common/grpc_keepalive.h"
#include "common/log.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"

namespace cleave::worker {
namespace {

constexpr auto kCallTimeout = std::chrono::seconds(5);
constexpr auto kRetry = std::chrono::milliseconds(500);

std::unique_ptr<grpc::ClientContext> deadlined() {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + kCallTimeout);
  return context;
}

}  // namespace

RouterRegistration::RouterRegistration(const std::string& router_address,
                                       std::shared_ptr<grpc::ChannelCredentials> credentials,
                                       v1::RegisterRequest request,
                                       std::function<v1::LoadSnapshot(const std::string&)> load)
    : stub_(v1::Registry::NewStub(grpc::CreateCustomChannel(router_address, std::move(credentials),
                                                            keepaliveChannelArguments()))),
      request_(std::move(request)),
      load_(std::move(load)) {
  thread_.start([this](std::stop_token stop) { run(stop); });
}

RouterRegistration::~RouterRegistration() {
  thread_.stop();
  v1::DeregisterRequest request;
  request.set_worker_id(request_.worker_id());
  request.set_reason("shutdown");
  v1::DeregisterResponse response;
  grpc::Status status = stub_->Deregister(deadlined().get(), request, &response);
  if (!status.ok()) CLEAVE_LOG(WARNING) << "deregistering: " << status.error_message();
}

void RouterRegistration::drain() {
  draining_ = true;
  v1::HeartbeatRequest beat;
  beat.set_worker_id(request_.worker_id());
  beat.set_draining(true);
  v1::HeartbeatResponse response;
  grpc::Status status = stub_->Heartbeat(deadlined().get(), beat, &response);
  if (!status.ok())
    CLEAVE_LOG(WARNING) << "telling the router this worker drains: " << status.error_message();
}

void RouterRegistration::run(std::stop_token stop) {
  bool registered = false;
  std::string last_error, router_id;
  std::chrono::milliseconds interval(1000);
  while (!stop.stop_requested()) {
    if (!registered) {
      v1::RegisterResponse response;
      grpc::Status status = stub_->Register(deadlined().get(), request_, &response);
      if (status.ok()) {
        registered = true;
        interval = std::chrono::milliseconds(response.heartbeat_interval_ms());
        router_id = response.router_id();
        CLEAVE_LOG(INFO) << "registered with the router as " << response.worker_id();
        last_error.clear();
      } else if (status.error_message() != last_error) {
        last_error = status.error_message();
        if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
          CLEAVE_LOG(INFO) << "router registration: " << last_error << " (retrying)";
        } else {
          CLEAVE_LOG(ERROR) << "the router refused this worker: " << last_error << " (retrying)";
        }
      }
      sleepFor(stop, registered ? interval : std::chrono::milliseconds(kRetry));
      continue;
    }
    v1::HeartbeatRequest beat;
    beat.set_worker_id(request_.worker_id());
    beat.set_draining(draining_);
    *beat.mutable_load() = load_(router_id);
    // heartbeat_stall=1,heartbeat_stall_ms=T: once, while sequences run, go silent for T.
    if (beat.load().running() > 0 && faults::fire("heartbeat_stall")) {
      faults::delay("heartbeat_stall_ms");
    }
    v1::HeartbeatResponse response;
    grpc::Status status = stub_->Heartbeat(deadlined().get(), beat, &response);
    if (status.ok() && response.reregister()) {
      CLEAVE_LOG(WARNING) << "the router lost this worker; registering again";
      registered = false;
      continue;
    }
    if (!status.ok()) CLEAVE_LOG(WARNING) << "heartbeat: " << status.error_message();
    sleepFor(stop, interval);
  }
}

}  // namespace cleave::worker
