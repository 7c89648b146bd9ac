#include "services/engine/shared_memory_communicator.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "common/log.h"

namespace cleave::engine {

struct SharedMemoryGroup::State {
  explicit State(int n) : size(n), slots(n) {}

  // Sense-reversing barrier: the last rank to arrive opens the next generation.
  void arrive() {
    const uint64_t generation = generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == size) {
      arrived_.store(0, std::memory_order_relaxed);
      generation_.store(generation + 1, std::memory_order_release);
      return;
    }
    for (int spin = 0; generation_.load(std::memory_order_acquire) == generation; ++spin) {
      if (spin > 2000) std::this_thread::yield();
    }
  }

  const int size;
  // Rank r's buffer of the collective in progress. Written by rank r before a barrier, read
  // by the others after it.
  std::vector<void*> slots;

 private:
  std::atomic<int> arrived_{0};
  std::atomic<uint64_t> generation_{0};
};

namespace {

class SharedMemoryCommunicator final : public Communicator {
 public:
  SharedMemoryCommunicator(std::shared_ptr<SharedMemoryGroup::State> state, int rank)
      : state_(std::move(state)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return state_->size; }

  absl::Status allReduceSum(std::span<float> data) override {
    auto& s = *state_;
    s.slots[rank_] = data.data();
    s.arrive();
    const int64_t n = static_cast<int64_t>(data.size());
    const int64_t begin = n * rank_ / s.size, end = n * (rank_ + 1) / s.size;
    float* own = data.data();
    for (int r = 0; r < s.size; ++r) {
      if (r == rank_) continue;
      const float* other = static_cast<const float*>(s.slots[r]);
      for (int64_t i = begin; i < end; ++i) own[i] += other[i];
    }
    for (int r = 0; r < s.size; ++r) {
      if (r != rank_)
        std::memcpy(static_cast<float*>(s.slots[r]) + begin, own + begin,
                    (end - begin) * sizeof(float));
    }
    s.arrive();
    return absl::OkStatus();
  }

  absl::Status allGather(std::span<const float> in, std::span<const int64_t> counts,
                         std::span<float> out) override {
    auto& s = *state_;
    s.slots[rank_] = const_cast<float*>(in.data());
    s.arrive();
    float* dst = out.data();
    for (int r = 0; r < s.size; ++r) {
      std::memcpy(dst, s.slots[r], counts[r] * sizeof(float));
      dst += counts[r];
    }
    s.arrive();  // Nobody reuses its input while another rank may still read it.
    return absl::OkStatus();
  }

  absl::Status broadcast(std::span<std::byte> data, int root) override {
    auto& s = *state_;
    s.slots[rank_] = data.data();
    s.arrive();
    if (rank_ != root) std::memcpy(data.data(), s.slots[root], data.size());
    s.arrive();
    return absl::OkStatus();
  }

  absl::Status barrier() override {
    state_->arrive();
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<SharedMemoryGroup::State> state_;
  int rank_;
};

}  // namespace

SharedMemoryGroup::SharedMemoryGroup(int size) : state_(std::make_shared<State>(size)) {}
SharedMemoryGroup::~SharedMemoryGroup() = default;

std::unique_ptr<Communicator> SharedMemoryGroup::communicator(int rank) {
  CLEAVE_CHECK(rank >= 0 && rank < state_->size) << "rank " << rank << " of " << state_->size;
  return std::make_unique<SharedMemoryCommunicator>(state_, rank);
}

}  // namespace cleave::engine
