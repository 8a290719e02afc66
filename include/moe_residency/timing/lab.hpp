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
/// docs/wall-clock.md ("Against this machine") writes each mapping down.
///
/// Standard library only.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <list>
#include <string>
#include <utility>
#include <vector>

#include "moe_residency/replay.hpp"
#include "moe_residency/timing.hpp"
#include "moe_residency/trace/batches.hpp"

namespace moe_residency {

/// The lab's configurations (docs/memlab.md, "The configurations").
enum class lab_config : std::uint8_t { mmap, observer, dense, exact, predicted, cache, all, degraded, resident };

inline const char* to_string(lab_config c) noexcept {
  switch (c) {
    case lab_config::mmap: return "mmap";
    case lab_config::observer: return "observer";
    case lab_config::dense: return "dense";
    case lab_config::exact: return "exact";
    case lab_config::predicted: return "predicted";
    case lab_config::cache: return "cache";
    case lab_config::all: return "all";
    case lab_config::degraded: return "degraded";
    case lab_config::resident: return "resident";
  }
  return "?";
}

/// Throws `error` naming the text and the configurations expected.
inline lab_config parse_lab_config(const std::string& s) {
  for (lab_config c : {lab_config::mmap, lab_config::observer, lab_config::dense, lab_config::exact,
                       lab_config::predicted, lab_config::cache, lab_config::all, lab_config::degraded,
                       lab_config::resident})
    if (s == to_string(c)) return c;
  throw error("lab configuration '" + s +
              "'; expected mmap, observer, dense, exact, predicted, cache, all, degraded or resident");
}

/// What is known of one lab run before it runs.
struct lab_setup {
  double limit_mib = 0;       ///< the cgroup's memory limit; 0: none (resident)
  double dense_mib = 0;       ///< the file's non-expert bytes (the trace header's dense_bytes)
  double overhead_mib = 64;   ///< the cgroup's other memory: llama.cpp's buffers, the binary's pages (assumed)
  double budget_mib = 0;      ///< the pinned cache's budget (--residency-budget)
  double stale_gate_pct = 100;  ///< the stale-gate's slot accuracy (measured by an observer run)
  double degraded_pct = 88.6;   ///< the `degraded` configuration's target accuracy
  std::size_t lanes = 2;        ///< the manager's read lanes (--lanes)
  std::size_t spec_cap = 2;     ///< predicted reads per layer at most (--spec-cap)
  double readaround_mib = 16;   ///< a fault's read-around window (read_ahead_kb × 2 under FADV_SEQUENTIAL)
};

/// How a configuration is modelled.
enum class lab_model_kind : std::uint8_t {
  resident,  ///< the file in the page cache: no reads, compute only
  lanes,     ///< the manager reads every miss of an expert-granular LRU on lanes before the layer's matmuls
  faults,    ///< page faults with read-around through a page-granular two-list page cache, one at a time
};

inline const char* to_string(lab_model_kind k) noexcept {
  return k == lab_model_kind::resident ? "resident" : k == lab_model_kind::lanes ? "lanes" : "faults";
}

struct lab_mapping {
  lab_model_kind kind = lab_model_kind::lanes;
  /// lanes: expert bytes the page cache (and the pinned cache inside it) holds;
  /// faults: the page cache's bytes for the file (dense included unless pinned).
  double cache_mib = 0;
  bool dense_pinned = false;  ///< faults: the dense pages are locked, outside the page cache's lists
  std::size_t lanes = 1;      ///< concurrent demanded reads
  replay_speculation speculation;  ///< predicted reads (lanes only)
};

/// The mapping of docs/wall-clock.md ("Against this machine"). Throws `error`
/// when a limited configuration's memory is not larger than what it must hold.
inline lab_mapping map_lab_config(lab_config c, const lab_setup& s) {
  lab_mapping m;
  if (c == lab_config::resident) {
    m.kind = lab_model_kind::resident;
    return m;
  }
  if (!(s.limit_mib > 0))
    throw error(std::string("lab configuration ") + to_string(c) + ": limit " + std::to_string(s.limit_mib) +
                " MiB; expected a memory limit > 0 (only resident runs without one)");
  switch (c) {
    case lab_config::mmap:
    case lab_config::observer:
    case lab_config::predicted:
    case lab_config::dense:
      // No exact reads: the expert ranges are not advised MADV_RANDOM, so every
      // miss is a fault that reads a read-around window. `predicted` alone
      // issues its reads the same way; they are not modelled (docs).
      m.kind = lab_model_kind::faults;
      m.dense_pinned = c == lab_config::dense;
      m.cache_mib = s.limit_mib - s.overhead_mib - (m.dense_pinned ? s.dense_mib : 0.0);
      m.lanes = 1;
      break;
    case lab_config::exact:
    case lab_config::cache:
    case lab_config::all:
    case lab_config::degraded:
      // The page cache holds the experts besides the dense weights (read every
      // token, so never the LRU's victims) and the overhead; the pinned cache
      // is part of that memory, so the union behaves as one LRU of that size.
      m.kind = lab_model_kind::lanes;
      m.cache_mib = s.limit_mib - s.dense_mib - s.overhead_mib;
      // cache alone reads its misses inline on the eval thread: one lane.
      m.lanes = c == lab_config::cache ? 1 : s.lanes;
      if (c == lab_config::all || c == lab_config::degraded) {
        m.speculation.source = speculation_source::oracle;
        m.speculation.oracle_p = std::min(1.0, (c == lab_config::all ? s.stale_gate_pct : s.degraded_pct) / 100.0);
        m.speculation.cap = s.spec_cap;
        m.speculation.horizon = 1;
      }
      break;
    case lab_config::resident: break;
  }
  if (!(m.cache_mib > 0))
    throw error(std::string("lab configuration ") + to_string(c) + ": limit " + std::to_string(s.limit_mib) +
                " MiB leaves " + std::to_string(m.cache_mib) +
                " MiB for the page cache after the dense weights and the overhead; expected > 0");
  return m;
}

/// The file as the fault model sees it: per layer, its dense bytes and then
/// `tensors` expert tensors (gate, up, down) of n_expert slices each, every
/// block page-aligned. An approximation of the GGUF's layout (its global
/// tensors sit elsewhere; the dense share is what matters for the LRU).
struct lab_file_layout {
  std::uint64_t page = 4096;
  std::uint64_t pages = 0;
  struct layer_blocks {
    std::uint64_t dense_first = 0, dense_pages = 0;
    std::vector<std::uint64_t> tensor_first;  ///< first page of each expert tensor
    std::uint64_t slice_bytes = 0;            ///< one expert's bytes in one tensor
  };
  std::vector<layer_blocks> layers;

  /// Pages [first, last) of expert e's slice in tensor t of layer l.
  std::pair<std::uint64_t, std::uint64_t> slice_pages(std::size_t l, std::size_t t, std::size_t e) const {
    const layer_blocks& b = layers[l];
    const std::uint64_t off = b.tensor_first[t] * page + static_cast<std::uint64_t>(e) * b.slice_bytes;
    return {off / page, (off + b.slice_bytes + page - 1) / page};
  }
};

inline lab_file_layout make_lab_file_layout(const trace_header& h, std::size_t tensors = 3, std::uint64_t page = 4096) {
  if (tensors == 0 || page == 0) throw error("make_lab_file_layout: tensors and page must be > 0");
  lab_file_layout f;
  f.page = page;
  auto pages_of = [&](std::uint64_t bytes) { return (bytes + page - 1) / page; };
  for (std::size_t l = 0; l < h.n_layer; ++l) {
    lab_file_layout::layer_blocks b;
    b.dense_first = f.pages;
    b.dense_pages = pages_of(l < h.dense_bytes.size() ? h.dense_bytes[l] : 0);
    f.pages += b.dense_pages;
    const std::uint64_t eb = l < h.expert_bytes.size() ? h.expert_bytes[l] : 0;
    b.slice_bytes = eb / tensors;
    for (std::size_t t = 0; t < tensors; ++t) {
      b.tensor_first.push_back(f.pages);
      f.pages += pages_of(b.slice_bytes * h.n_expert);
    }
    f.layers.push_back(std::move(b));
  }
  return f;
}

/// How the modelled page cache chooses its victims.
enum class page_reclaim : std::uint8_t {
  /// One LRU list: a touch moves a page to the most recent end.
  lru,
  /// Linux's two lists, reduced to what decides which file pages stay: a new
  /// page (faulted or read around) enters the inactive list; a touch only
  /// marks it referenced (the page table's accessed bit — mapped pages are
  /// not moved on access); reclaim takes the inactive list's oldest page,
  /// but a referenced one is rotated instead (its bit cleared, the second
  /// reference remembered) and one found referenced on two scans is
  /// activated; the active list keeps at most half the pages, its oldest
  /// demoted to the inactive list. So read-around pages that are never
  /// touched go first and pages the matmuls used get a second chance —
  /// which is why a limit of 1/1.5 of the file keeps part of it (docs).
  two_list,
};

/// A page cache of `capacity` pages in which touching a missing page is a
/// fault that reads the window of `window` pages centred on it (clipped to the
/// file; only missing pages are read), as Linux's mmap read-around does.
/// Pinned pages are resident and outside the lists.
class readaround_page_cache {
 public:
  readaround_page_cache(std::uint64_t pages, std::uint64_t capacity, std::uint64_t window,
                        page_reclaim reclaim = page_reclaim::lru)
      : state_(pages, absent), ref_(pages, 0), seen_(pages, 0), pos_(pages), capacity_(capacity),
        window_(std::max<std::uint64_t>(1, window)), reclaim_(reclaim) {
    if (capacity == 0) throw error("readaround_page_cache: capacity 0 pages; expected > 0");
  }

  /// Locks pages [first, last) resident (dense pinned); not counted as reads.
  void pin(std::uint64_t first, std::uint64_t last) {
    for (std::uint64_t p = first; p < last && p < state_.size(); ++p) {
      if (state_[p] == inactive) inactive_.erase(pos_[p]);
      if (state_[p] == active) active_.erase(pos_[p]);
      state_[p] = pinned;
    }
  }

  /// Touches pages [first, last) in order. Returns the faults taken; adds the pages read to `pages_read`.
  std::uint32_t touch(std::uint64_t first, std::uint64_t last, std::uint64_t& pages_read) {
    std::uint32_t faults = 0;
    for (std::uint64_t p = first; p < last && p < state_.size(); ++p) {
      if (state_[p] == pinned) continue;
      if (state_[p] != absent) {
        if (reclaim_ == page_reclaim::lru) inactive_.splice(inactive_.end(), inactive_, pos_[p]);
        else ref_[p] = 1;
        continue;
      }
      ++faults;
      const std::uint64_t lo = p >= window_ / 2 ? p - window_ / 2 : 0;
      const std::uint64_t hi = std::min<std::uint64_t>(state_.size(), lo + window_);
      for (std::uint64_t q = lo; q < hi; ++q)
        if (state_[q] == absent && q != p) insert(q, 0), ++pages_read;
      insert(p, 1);  // the faulting page last: the most recently used, referenced
      ++pages_read;
    }
    return faults;
  }

  std::uint64_t resident_pages() const noexcept { return inactive_.size() + active_.size(); }
  std::uint64_t active_pages() const noexcept { return active_.size(); }
  bool is_resident(std::uint64_t p) const noexcept { return state_[p] != absent; }

 private:
  enum : std::uint8_t { absent, inactive, active, pinned };
  using list = std::list<std::uint64_t>;
  void push(list& l, std::uint64_t p, std::uint8_t st) {
    l.push_back(p);
    pos_[p] = std::prev(l.end());
    state_[p] = st;
  }
  void evict_one() {
    for (;;) {
      if (inactive_.empty()) {  // everything active: its oldest goes
        const std::uint64_t v = active_.front();
        active_.pop_front();
        state_[v] = absent;
        ref_[v] = seen_[v] = 0;
        return;
      }
      const std::uint64_t v = inactive_.front();
      if (reclaim_ == page_reclaim::two_list && ref_[v]) {
        ref_[v] = 0;
        inactive_.pop_front();
        if (seen_[v]) {  // referenced on two scans: activate
          seen_[v] = 0;
          push(active_, v, active);
          while (active_.size() > capacity_ / 2) {
            const std::uint64_t q = active_.front();
            active_.pop_front();
            push(inactive_, q, inactive);
          }
        } else {
          seen_[v] = 1;
          push(inactive_, v, inactive);
        }
        continue;
      }
      inactive_.pop_front();
      state_[v] = absent;
      ref_[v] = seen_[v] = 0;
      return;
    }
  }
  void insert(std::uint64_t p, std::uint8_t referenced) {
    if (resident_pages() >= capacity_) evict_one();
    push(inactive_, p, inactive);
    ref_[p] = reclaim_ == page_reclaim::two_list ? referenced : 0;
  }
  std::vector<std::uint8_t> state_, ref_, seen_;
  std::vector<list::iterator> pos_;
  list inactive_, active_;
  std::uint64_t capacity_, window_;
  page_reclaim reclaim_;
};

/// The decode loads of a fault-driven run: every batch of the trace (prompt
/// and decode, in order) touches its layer's dense pages, then each routed
/// expert's slices; one load_event per decode (token, layer) whose `misses`
/// are the faults taken and `expert_bytes` the mean bytes a fault read (so
/// timing_simulator's reads are the faults, one after another on one lane).
/// `hits` counts routed experts that took no fault.
inline std::vector<load_event> readaround_loads(const route_trace& trace, const lab_mapping& m,
                                                double readaround_mib, std::size_t tensors = 3,
                                                page_reclaim reclaim = page_reclaim::two_list) {
  if (m.kind != lab_model_kind::faults) throw error("readaround_loads: the mapping is not a fault-driven one");
  const lab_file_layout f = make_lab_file_layout(trace.header, tensors);
  const auto pages = [&](double mib) { return static_cast<std::uint64_t>(mib * 1048576.0 / static_cast<double>(f.page)); };
  std::uint64_t capacity = pages(m.cache_mib);
  readaround_page_cache pc(f.pages, std::max<std::uint64_t>(1, capacity), pages(readaround_mib), reclaim);
  if (m.dense_pinned)
    for (const auto& b : f.layers) pc.pin(b.dense_first, b.dense_first + b.dense_pages);
  const load_batches lb = group_load_batches(trace);
  std::vector<load_event> out;
  std::uint32_t token = 0;
  std::uint32_t last_step = 0;
  bool any_decode = false;
  std::vector<std::uint8_t> seen(trace.header.n_expert, 0);
  for (const load_batch& b : lb.batches) {
    const std::size_t l = to_index(b.layer);
    if (l >= f.layers.size()) continue;
    std::uint64_t read = 0;
    std::uint32_t faults = pc.touch(f.layers[l].dense_first, f.layers[l].dense_first + f.layers[l].dense_pages, read);
    std::uint16_t routed = 0, clean = 0;
    std::vector<expert_id> uniq;
    for (expert_id e : lb.experts_of(b)) {
      if (to_index(e) >= seen.size() || seen[to_index(e)]) continue;
      seen[to_index(e)] = 1;
      uniq.push_back(e);
    }
    for (expert_id e : uniq) {
      seen[to_index(e)] = 0;
      std::uint32_t ef = 0;
      for (std::size_t t = 0; t < tensors; ++t) {
        const auto r = f.slice_pages(l, t, to_index(e));
        ef += pc.touch(r.first, r.second, read);
      }
      faults += ef;
      ++routed;
      clean += ef == 0;
    }
    if (b.phase != run_phase::decode) continue;
    if (any_decode && b.step != last_step) ++token;
    any_decode = true;
    last_step = b.step;
    load_event ev;
    ev.token = token;
    ev.layer = b.layer;
    ev.routed = routed;
    ev.hits = clean;
    ev.misses = static_cast<std::uint16_t>(std::min<std::uint32_t>(faults, 65535));
    ev.demanded_bytes = read * f.page;
    ev.expert_bytes = faults ? read * f.page / faults : 0;
    out.push_back(ev);
  }
  return out;
}

/// One lab cell's predicted decode timing (and the replay's figures).
struct lab_prediction {
  lab_mapping mapping;
  timing_summary summary;
  std::vector<token_timing> tokens;
  std::vector<load_event> loads;  ///< decode loads (for calibration)
};

/// Predicts one configuration. `p` holds the device (curve) and the fitted
/// parameters; its `lanes` is replaced by the mapping's (and, for faults, its
/// curve by the curve's top bandwidth).
inline lab_prediction predict_lab(const route_trace& trace, lab_config c, const lab_setup& s, timing_params p) {
  lab_prediction out;
  out.mapping = map_lab_config(c, s);
  p.lanes = out.mapping.lanes;
  if (out.mapping.kind == lab_model_kind::faults) {
    // A read-around window is one large request that the block layer splits
    // into many in flight: the device's bandwidth at its deepest measured
    // concurrency (the curve's top), one window after another.
    double top = 0;
    for (const auto& q : p.curve.points()) top = std::max(top, q.second);
    p.curve = storage_curve({{1.0, top}});
    out.loads = readaround_loads(trace, out.mapping, s.readaround_mib);
    out.tokens = simulate_timing(trace.shape(), p, out.loads);
  } else {
    const routed_replay_input in = routed_replay_input::from_trace(trace);
    dynamic_replay_options o;
    o.policy = "lru";
    o.guard = cycle_guard::off;
    if (out.mapping.kind == lab_model_kind::resident) {
      // Every expert resident: the loads without any read.
      o.budget_mib = 0;
      for (std::size_t l = 0; l < in.shape().n_layers(); ++l)
        o.budget_mib += to_mib(in.shape().expert_bytes(layer_id(static_cast<std::uint16_t>(l))) * in.shape().n_experts());
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
      timing_simulator sim(in.shape(), p);
      const dynamic_replay_result r =
          out.mapping.speculation.source == speculation_source::none ? replay_dynamic(in, o) : replay_dynamic(in, o, sim.observer());
      out.loads = r.decode_loads;
      out.tokens = out.mapping.speculation.source == speculation_source::none ? simulate_timing(in.shape(), p, out.loads)
                                                                              : sim.tokens();
    }
  }
  out.summary = summarize_timing(out.tokens);
  return out;
}

/// Decode tok/s of a metrics file as the lab counts it: tokens / Σ wall.
inline double metrics_tok_per_s(const token_metrics& m) {
  double wall = 0;
  for (double w : m.wall_ms) wall += w;
  return wall > 0 ? 1000.0 * static_cast<double>(m.size()) / wall : 0.0;
}

}  // namespace moe_residency
