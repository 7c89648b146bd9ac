#include "services/engine/gloo_communicator.h"

#include <exception>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gloo/allgatherv.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/hash_store.h"
#include "gloo/transport/tcp/device.h"

namespace cleave::engine {
namespace {

// Gloo reports failures by throwing; nothing else in the engine does.
template <typename F>
absl::Status guarded(const char* what, int rank, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("gloo ", what, " on rank ", rank, ": ", e.what()));
  }
  return absl::OkStatus();
}

class GlooCommunicator final : public Communicator {
 public:
  explicit GlooCommunicator(std::shared_ptr<gloo::rendezvous::Context> context)
      : context_(std::move(context)) {}

  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }

  absl::Status allReduceSum(std::span<float> data) override {
    return guarded("all-reduce", rank(), [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(data.data(), data.size());
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      opts.setTag(nextTag());
      gloo::allreduce(opts);
    });
  }

  absl::Status allGather(std::span<const float> in, std::span<const int64_t> counts,
                         std::span<float> out) override {
    std::vector<size_t> elements(counts.begin(), counts.end());
    return guarded("all-gather", rank(), [&] {
      gloo::AllgathervOptions opts(context_);
      opts.setInput(const_cast<float*>(in.data()), in.size());
      opts.setOutput(out.data(), elements);
      opts.setTag(nextTag());
      gloo::allgatherv(opts);
    });
  }

  absl::Status broadcast(std::span<std::byte> data, int root) override {
    return guarded("broadcast", rank(), [&] {
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(reinterpret_cast<uint8_t*>(data.data()), data.size());
      opts.setRoot(root);
      opts.setTag(nextTag());
      gloo::broadcast(opts);
    });
  }

  absl::Status barrier() override {
    return guarded("barrier", rank(), [&] {
      gloo::BarrierOptions opts(context_);
      opts.setTag(nextTag());
      gloo::barrier(opts);
    });
  }

 private:
  // Every rank issues the same collectives in the same order, so their tags agree.
  uint32_t nextTag() { return tag_++; }

  std::shared_ptr<gloo::rendezvous::Context> context_;
  uint32_t tag_ = 0;
};

class SoloCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  absl::Status allReduceSum(std::span<float>) override { return absl::OkStatus(); }
  absl::Status allGather(std::span<const float> in, std::span<const int64_t>,
                         std::span<float> out) override {
    std::copy(in.begin(), in.end(), out.begin());
    return absl::OkStatus();
  }
  absl::Status broadcast(std::span<std::byte>, int) override { return absl::OkStatus(); }
  absl::Status barrier() override { return absl::OkStatus(); }
};

}  // namespace

std::unique_ptr<Communicator> soloCommunicator() { return std::make_unique<SoloCommunicator>(); }

GlooRendezvous::GlooRendezvous(int size, std::chrono::milliseconds timeout)
    : size_(size), timeout_(timeout), store_(std::make_shared<gloo::rendezvous::HashStore>()) {}

GlooRendezvous::~GlooRendezvous() = default;

absl::StatusOr<std::unique_ptr<Communicator>> GlooRendezvous::connect(int rank) {
  if (rank < 0 || rank >= size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside a group of ", size_));
  }
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size_);
  absl::Status status = guarded("connect", rank, [&] {
    gloo::transport::tcp::attr attr("127.0.0.1");
    auto device = gloo::transport::tcp::CreateDevice(attr);
    context->setTimeout(timeout_);
    context->connectFullMesh(*store_, device);
  });
  if (!status.ok()) return status;
  return std::unique_ptr<Communicator>(new GlooCommunicator(std::move(context)));
}

}  // namespace cleave::engine
