#pragma once
/// The memory lab's configurations (scripts/memlab.sh, docs/memlab.md) as
/// inputs of the timing model (timing.hpp): which cache, which lanes, which
/// speculation each one is, and — for the configurations that leave reading
/// to page faults — a page cache with read-around that turns a route trace
/// into the faults a run takes. Everything here is known *before* the
/// configuration runs: the route trace (routing is the same in every lab run:
/// same file, prompt, seed, bit-identical logits), the memory limit, the
/// cache budget, the configuration's levers, and the device's parameters.
/// Nothing of the target run's own measurement goes in.
/// docs/lab-predict.md writes each mapping down.
///
/// Its parts: moe_residency_lab/mapping.hpp (the configurations, lab_setup and their
/// mapping), moe_residency_lab/page_cache.hpp and moe_residency_lab/fault_loads.hpp (the
/// fault model's page cache and the loads it gives), moe_residency_lab/manager_counts.hpp
/// (the manager's requests and pins per load). This header predicts a
/// configuration's decode timing from them: predict_lab.
///
/// Standard library only.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "moe_residency/cache.hpp"
#include "moe_residency/plan.hpp"
#include "moe_residency/replay.hpp"
#include "moe_residency/timing.hpp"
#include "moe_residency_lab/fault_loads.hpp"
#include "moe_residency_lab/manager_counts.hpp"
#include "moe_residency_lab/mapping.hpp"
#include "moe_residency_lab/page_cache.hpp"
#include "moe_residency/trace/batches.hpp"

namespace moe_residency::lab {

/// One lab cell's predicted decode timing (and the replay's figures).
struct lab_prediction {
  lab_mapping mapping;
  timing_summary summary;
  std::vector<token_timing> tokens;
  std::vector<load_event> loads;  ///< decode loads (for calibration)
};

/// Predicts one configuration. `p` holds the device (curve) and the fitted parameters; its `lanes` and
/// ψ (kernel_overlap) are the mapping's; for faults, its curve is the curve's top and β is β_f
/// (timing_params::fault_scale). A walk in `s` (the fault walk; for `cache`, the inline walk) replaces
/// the curve, β, λ and κ; the inline walk also ψ and ν_p's kernel part, which its own wall and kernel time hold.
inline lab_prediction predict_lab(const route_trace& trace, lab_config c, const lab_setup& s, timing_params p) {
  lab_prediction out;
  out.mapping = map_lab_config(c, s);
  p.lanes = out.mapping.lanes;
  p.mgmt_ms_per_request = s.request_ms;  // measured with every expert resident (lab_setup)
  p.mgmt_ms_per_pin = out.mapping.pin_ms(s);
  p.kernel_overlap = out.mapping.reads_inline ? 1.0 : 0.0;  // ψ
  // A walk of this shape (lab_setup): a MiB read costs what it cost the walk, off the CPU and in the kernel.
  const auto walked = [&p](double off_cpu_ms_per_mib, double sys_ms_per_mib) {
    p.curve = storage_curve({{1.0, 1000.0 / off_cpu_ms_per_mib}});
    p.bandwidth_scale = 1, p.read_latency_ms = 0, p.read_cpu_ms_per_mib = sys_ms_per_mib;
  };
  if (out.mapping.reads_inline && s.inline_walk_off_cpu_ms_per_mib > 0) {
    walked(s.inline_walk_off_cpu_ms_per_mib, s.inline_walk_sys_ms_per_mib);
    // The walk's wall holds what overlap there is, its kernel time the pins' own.
    p.kernel_overlap = 0, p.mgmt_ms_per_pin = out.mapping.pin_user_ms(s);
  }
  if (out.mapping.kind == lab_model_kind::faults) {
    // A read-around window is one large request that the block layer splits
    // into many in flight: the device's bandwidth at its deepest measured
    // concurrency (the curve's top), one window after another.
    double top = 0;
    for (const auto& q : p.curve.points()) top = std::max(top, q.second);
    p.curve = storage_curve({{1.0, top}});
    // What the device delivers to read-around need not be what it delivers to
    // the manager's lanes (the run history docs/lab-predict.md links, "The fault path's own bandwidth").
    p.bandwidth_scale = p.fault_scale();
    if (out.mapping.walk_applies && s.fault_walk_off_cpu_ms_per_mib > 0)
      walked(s.fault_walk_off_cpu_ms_per_mib, s.fault_walk_sys_ms_per_mib);
    // predicted: its reads share the device with the faults (equation 7);
    // each one made resident is a request of the manager (WILLNEED, POPULATE_READ).
    timing_simulator sim(trace.shape(), p);
    replay_observer obs = sim.observer();
    const auto forward = obs.on_load;
    obs.on_load = [&](const load_event& e) {
      load_event x = e;
      set_manager_counts(x, out.mapping, 0);
      forward(x);
    };
    out.loads = readaround_loads(trace, out.mapping, out.mapping.readaround_mib, 3, page_reclaim::two_list, obs);
    for (load_event& e : out.loads) set_manager_counts(e, out.mapping, 0);
    out.tokens = sim.tokens();
  } else {
    const routed_replay_input in = routed_replay_input::from_trace(trace);
    dynamic_replay_options o;
    o.policy = "lru";
    o.guard = cycle_guard::off;
    if (out.mapping.kind == lab_model_kind::resident) {
      // Every expert resident: the loads without any read.
      o.budget_mib = 0;
      for (std::size_t l = 0; l < in.shape().n_layers(); ++l)
        o.budget_mib +=
            to_mib(in.shape().expert_bytes(layer_id(static_cast<std::uint16_t>(l))) * in.shape().n_experts());
      o.budget_mib += 1;
      out.loads = replay_dynamic(in, o).decode_loads;
      for (load_event& e : out.loads) {
        e.hits = static_cast<std::uint16_t>(e.hits + e.misses);
        e.misses = 0;
        e.demanded_bytes = 0;
        e.evictions = 0;
      }
      out.tokens = simulate_timing(in.shape(), p, out.loads);
    } else {
      o.budget_mib = out.mapping.cache_mib;
      o.speculation = out.mapping.speculation;
      o.prefill_cached = out.mapping.prompt_cached;
      // The pinned cache's misses at each load (none without the cache).
      const std::optional<pinned_misses> pins =
          out.mapping.pinned_mib > 0 ? std::optional<pinned_misses>(std::in_place, trace, out.mapping.pinned_mib)
                                     : std::nullopt;
      const auto count = [&](load_event& e) { set_manager_counts(e, out.mapping, pins ? pins->at(e) : 0); };
      if (out.mapping.speculation.source == speculation_source::none) {
        out.loads = replay_dynamic(in, o).decode_loads;
        for (load_event& e : out.loads) count(e);
        out.tokens = simulate_timing(in.shape(), p, out.loads);
      } else {
        timing_simulator sim(in.shape(), p);
        replay_observer obs = sim.observer();
        const auto forward = obs.on_load;
        obs.on_load = [&](const load_event& e) {
          load_event x = e;
          count(x);
          forward(x);
        };
        out.loads = replay_dynamic(in, o, obs).decode_loads;
        for (load_event& e : out.loads) count(e);
        out.tokens = sim.tokens();
      }
    }
  }
  out.summary = summarize_timing(out.tokens);
  return out;
}

}  // namespace moe_residency::lab
