#pragma once
/// random: evict a uniformly random evictable entry (splitmix64, seeded, so
/// a run is reproducible). O(1) per access; a victim is found by up to 64
/// random probes, then a scan from a random start.

#include <cstdint>
#include <vector>

#include "moe_residency/cache/expert_cache.hpp"

namespace moe_residency {

class random_policy : public policy_base {
 public:
  static constexpr const char* name = "random";
  static constexpr bool collapses_below_cycle = false;

  explicit random_policy(std::uint64_t seed = 0x5eed) noexcept : state_(seed) {}

  void init(const model_shape& shape, std::uint64_t /*budget*/) {
    const std::size_t n = shape.n_layers() * shape.n_experts();
    pos_.assign(n, 0);
    dense_.clear();
    dense_.reserve(n);
  }
  void on_hit(std::uint32_t) noexcept {}
  void on_insert(std::uint32_t s) noexcept {
    pos_[s] = static_cast<std::uint32_t>(dense_.size());
    dense_.push_back(s);  // reserved in init(): never reallocates
  }
  void on_evict(std::uint32_t s) noexcept {
    const std::uint32_t i = pos_[s], last = dense_.back();
    dense_[i] = last;
    pos_[last] = i;
    dense_.pop_back();
  }
  template <class View>
  std::uint32_t victim(const View& v, std::size_t /*layer*/) noexcept {
    const std::size_t n = dense_.size();
    if (n == 0) return no_slot;
    for (int probe = 0; probe < 64; ++probe) {
      const std::uint32_t s = dense_[next() % n];
      if (v.evictable(s)) return s;
    }
    const std::size_t start = next() % n;
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t s = dense_[(start + i) % n];
      if (v.evictable(s)) return s;
    }
    return no_slot;
  }

 private:
  std::uint64_t next() noexcept {  // splitmix64
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  std::uint64_t state_;
  std::vector<std::uint32_t> pos_, dense_;
};

}  // namespace moe_residency
