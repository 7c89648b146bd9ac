// Aligned pieces of one device allocation: the CUDA model sizes everything with a first
// pass over a null base (only counting), allocates once, then places every piece with a
// second pass over the real base.
#pragma once

#include <cstdint>

namespace cleave::engine {

class Arena {
 public:
  static constexpr int64_t kAlign = 256;
  explicit Arena(uint8_t* base = nullptr) : base_(base) {}
  template <typename T>
  T* take(int64_t count) {
    offset_ = (offset_ + kAlign - 1) / kAlign * kAlign;
    T* p = base_ ? reinterpret_cast<T*>(base_ + offset_) : nullptr;
    offset_ += count * static_cast<int64_t>(sizeof(T));
    return p;
  }
  int64_t used() const { return offset_; }

 private:
  uint8_t* base_;
  int64_t offset_ = 0;
};

}  // namespace cleave::engine
