#pragma once
// A fixed-capacity FIFO ring: allocated once at construction, never after.
// Not synchronised; the read scheduler guards it with its mutex.

#include <cstddef>
#include <vector>

#include "moe_residency/error.hpp"

namespace moe_residency::detail {

template <class T>
class io_ring {
 public:
  io_ring() = default;
  explicit io_ring(std::size_t capacity) : slots_(capacity) {}

  std::size_t capacity() const noexcept { return slots_.size(); }
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  bool full() const noexcept { return size_ == slots_.size(); }

  /// False (and nothing stored) when full.
  bool push_back(const T& v) noexcept {
    if (full()) return false;
    slots_[(head_ + size_) % slots_.size()] = v;
    ++size_;
    return true;
  }
  /// Precondition: not empty.
  T pop_front() noexcept {
    MOE_RESIDENCY_ASSERT(!empty());
    T v = slots_[head_];
    head_ = (head_ + 1) % slots_.size();
    --size_;
    return v;
  }
  void clear() noexcept {
    head_ = 0;
    size_ = 0;
  }

 private:
  std::vector<T> slots_;
  std::size_t head_ = 0;
  std::size_t size_ = 0;
};

}  // namespace moe_residency::detail
