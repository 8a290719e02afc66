#pragma once
/// The residency manager's interface without its cache policy (what
/// make_residency_manager returns for a policy named at run time), and the
/// cache policy wrapper that logs what the manager's cache evicts.
/// mmap_residency (mmap_residency.hpp) implements it; residency.hpp says what it does.

#include <cstdint>
#include <string>
#include <vector>

#include "moe_residency/adapters/llama_cpp/observer.hpp"
#include "moe_residency/adapters/llama_cpp/residency/predictor.hpp"
#include "moe_residency/adapters/llama_cpp/residency_options.hpp"
#include "moe_residency/core.hpp"

namespace moe_residency::llama_cpp {

namespace detail {

/// A cache policy that also logs the slots it evicts (host thread).
template <class Policy>
class eviction_log : public Policy {
 public:
  void init(const model_shape& s, std::uint64_t budget) {
    Policy::init(s, budget);
    log_.reserve(s.n_layers() * s.n_experts());
  }
  void on_evict(std::uint32_t s) noexcept {
    Policy::on_evict(s);
    if (log_.size() < log_.capacity()) log_.push_back(s);
  }
  std::vector<std::uint32_t>& log() noexcept { return log_; }

 private:
  std::vector<std::uint32_t> log_;
};

}  // namespace detail

/// The residency manager's interface without its cache policy: what
/// make_residency_manager (residency_policies.hpp) returns for a policy named
/// at run time. mmap_residency<Policy> (mmap_residency.hpp) documents each member.
class residency_manager : public observer_sink {
 public:
  virtual void activate() = 0;
  virtual void settle() noexcept = 0;
  virtual residency_stats stats() const noexcept = 0;
  virtual std::string summary() const = 0;
  virtual bool active() const noexcept = 0;
  virtual bool standing_down() const noexcept = 0;
  virtual const std::string& fit_note() const noexcept = 0;
  virtual const std::string& status() const noexcept = 0;
  virtual const residency_options& options() const noexcept = 0;
  virtual std::uint64_t budget_bytes() const noexcept = 0;
  virtual const std::string& budget_note() const noexcept = 0;
  virtual std::string unmanaged_note() const = 0;
  virtual const model_shape& managed_shape() const noexcept = 0;
  virtual void set_next(observer_sink* next) noexcept = 0;
  /// See mmap_residency::set_predictor.
  virtual void set_predictor(routing_predictor* p) = 0;
  virtual const char* predictor_name() const noexcept = 0;
  /// The cache policy's name (the registry's, e.g. "lru").
  virtual const char* policy_name() const noexcept = 0;
  /// The ranking the last managed routing predicted for MoE layer `target`
  /// (false when it made none): what its speculative reads were planned from.
  virtual bool last_prediction(layer_id& target, ranking& out) const = 0;
};

}  // namespace moe_residency::llama_cpp
