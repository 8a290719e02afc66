#pragma once
/// The mmap residency manager's predicted reads (residency.hpp's `predicted`
/// part): at each MoE layer's routing, the stale-gate's ranking of the MoE
/// layer `horizon` ahead, planned by the speculation planner around the
/// experts already resident, queued on the read scheduler's lanes as
/// speculative reads, and settled at that layer's routing as useful
/// (complete and demanded), late (demanded, not complete) or wasted.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "moe_residency/adapters/llama_cpp/expert_pages.hpp"
#include "moe_residency/adapters/llama_cpp/observer.hpp"
#include "moe_residency/adapters/llama_cpp/residency_options.hpp"
#include "moe_residency/io.hpp"
#include "moe_residency/plan.hpp"
#include "moe_residency/predict/gate.hpp"

namespace moe_residency::llama_cpp::detail {

class predicted_reads {
 public:
  /// The routers the observer found in host memory. Throws `error` when none is.
  void init(const observer& obs, const model_shape& shape, const residency_options& o) {
    shape_ = shape;
    horizon_ = o.horizon;
    degrade_ = o.degrade;
    bank_ = router_bank(shape_);
    for (std::size_t l = 0; l < obs.n_layer(); ++l) {
      const layer_structure& s = obs.layers()[l];
      if (s.moe && s.router_readable) bank_.set(layer_id(static_cast<std::uint16_t>(l)), s.router, s.spec);
    }
    if (bank_.size() == 0)
      throw error("mmap_residency: predicted reads need the routers in host memory as f32/f16/bf16; none is");
    gate1_.reset(shape_);
    gate2_.reset(shape_);
    planner_ = speculation_planner(o.spec_cap);
    rng_.seed(o.seed);
  }

  /// What became of one speculative read, for settle's `settled`.
  enum class fate : std::uint8_t { ok, failed, not_run };

  /// At layer l's routing (`routed`: its experts): the speculative reads
  /// issued for l are useful (complete and demanded), late (demanded, not
  /// complete) or wasted. `settled(layer, expert, fate, demanded)` is called
  /// for each (the expert pool adopts or releases what it placed); a read
  /// still on a lane is `not_run` unless the scheduler waits for it.
  template <class Settled>
  void settle(read_scheduler& scheduler, layer_id l, const std::vector<expert_id>& routed, residency_stats& st,
              Settled&& settled) {
    const span<const completed_read> done = scheduler.quiesce();
    for (const completed_read& c : done) {
      if (c.outcome == read_outcome::ok) completed_tickets_.push_back(c.ticket);
      else failed_tickets_.push_back(c.ticket);
    }
    std::size_t keep = 0;
    for (const issued_read& r : issued_) {
      if (to_index(r.layer) > to_index(l) && r.layer != l) {
        issued_[keep++] = r;  // a later layer's (horizon 2): settled there
        continue;
      }
      const bool complete =
          std::find(completed_tickets_.begin(), completed_tickets_.end(), r.ticket) != completed_tickets_.end();
      const bool demanded = r.layer == l && std::find(routed.begin(), routed.end(), r.expert) != routed.end();
      if (!demanded) ++st.predicted_wasted;
      else if (complete) ++st.predicted_useful;
      else ++st.predicted_late;
      const bool failed =
          !complete && std::find(failed_tickets_.begin(), failed_tickets_.end(), r.ticket) != failed_tickets_.end();
      settled(r.layer, r.expert, complete ? fate::ok : failed ? fate::failed : fate::not_run, demanded);
    }
    issued_.resize(keep);
    if (issued_.empty()) {
      completed_tickets_.clear();
      failed_tickets_.clear();
    }
  }
  void settle(read_scheduler& scheduler, layer_id l, const std::vector<expert_id>& routed, residency_stats& st) {
    settle(scheduler, l, routed, st, [](layer_id, expert_id, fate, bool) noexcept {});
  }

  /// After layer l's routing, from its input row x: predicts the MoE layer
  /// `horizon` ahead, plans around `resident(layer, expert)` and queues the
  /// plan's reads (a full queue rejects, counted). `claim(layer, expert)`
  /// is asked first for each (false: not issued, counted as rejected) and
  /// `unclaim(layer, expert)` told of a read the scheduler then refused.
  template <class Resident, class Claim, class Unclaim>
  void issue(read_scheduler& scheduler, layer_id l, const float* x,
             const std::vector<expert_pages::layer_ranges>& layers, residency_stats& st, Resident&& resident,
             Claim&& claim, Unclaim&& unclaim) {
    layer_id target{};
    if (!moe_layer_ahead(shape_, l, horizon_, target)) return;
    if (layers[to_index(target)].tensors.empty()) return;  // its experts are left to llama.cpp: nothing to read
    ranking& pr = prediction_;
    const bool ok = horizon_ == 1 ? gate1_.predict(bank_, l, target, x, pr) : gate2_.predict(bank_, l, target, x, pr);
    if (!ok) return;
    ++st.predictions;
    const std::size_t k = shape_.top_k();
    if (degrade_ > 0) degrade(pr, k);
    const speculation_plan plan = planner_.plan(target, pr, k, resident);
    for (std::size_t i = 0; i < plan.size(); ++i) {
      const read_request r{target, plan.id(i), layers[to_index(target)].bytes};
      if (!claim(target, plan.id(i))) {
        ++st.predicted_rejected;
      } else if (scheduler.speculate(r)) {
        issued_.push_back(issued_read{target, plan.id(i), next_ticket_++});
        ++st.predicted_issued;
        st.predicted_bytes += r.bytes;
      } else {
        unclaim(target, plan.id(i));
        ++st.predicted_rejected;
      }
    }
  }
  template <class Resident>
  void issue(read_scheduler& scheduler, layer_id l, const float* x,
             const std::vector<expert_pages::layer_ranges>& layers, residency_stats& st, Resident&& resident) {
    issue(
        scheduler, l, x, layers, st, std::forward<Resident>(resident),
        [](layer_id, expert_id) noexcept { return true; }, [](layer_id, expert_id) noexcept {});
  }

 private:
  struct issued_read {
    layer_id layer{};
    expert_id expert{};
    std::uint64_t ticket = 0;
  };

  // Replaces a seeded share of the top-k predicted slots by experts outside it.
  void degrade(ranking& pr, std::size_t k) {
    ranking out;
    const std::size_t n = shape_.n_experts(), depth = std::min(k, pr.size());
    std::uniform_real_distribution<double> coin(0.0, 1.0);
    std::uniform_int_distribution<std::size_t> pick(0, n - 1);
    std::size_t free = n > depth ? n - depth : 0;  // experts a replacement may take
    for (std::size_t r = 0; r < pr.size(); ++r) {
      expert_id e = pr.id(r);
      if (r < depth && free > 0 && coin(rng_) < degrade_) {
        do e = expert_id(static_cast<std::uint16_t>(pick(rng_)));
        while (pr.contains(e, depth) || out.contains(e));
        --free;
      }
      out.push_back(e, pr.score(r), pr.weight(r));
    }
    pr = out;
  }

  model_shape shape_;
  std::size_t horizon_ = 1;
  double degrade_ = 0.0;
  router_bank bank_;
  stale_gate_predictor gate1_;
  stale_gate_l2_predictor gate2_;
  speculation_planner planner_;
  std::mt19937_64 rng_;
  ranking prediction_;
  std::vector<issued_read> issued_;
  std::vector<std::uint64_t> completed_tickets_, failed_tickets_;
  std::uint64_t next_ticket_ = 0;
};

}  // namespace moe_residency::llama_cpp::detail
