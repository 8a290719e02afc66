#pragma once
/// The residency manager's class: its options, state and the observer's
/// events it answers, with the short members. What it does is said in
/// residency.hpp (include that one); its longer members are defined by job in
/// mmap_residency_activation.hpp (the refusals and one-time advice, in the
/// order that is the contract: everything that can refuse runs before any
/// advice), mmap_residency_reads.hpp (the advice calls, on the lanes and the
/// host, and the expert pool's placements) and mmap_residency_layer.hpp (one
/// layer's step: settle the last layer's reads, look up the cache, read the
/// misses, issue the predictions).

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "moe_residency/adapters/llama_cpp/advice.hpp"
#include "moe_residency/adapters/llama_cpp/expert_pages.hpp"
#include "moe_residency/adapters/llama_cpp/memory_limit.hpp"
#include "moe_residency/adapters/llama_cpp/observer.hpp"
#include "moe_residency/adapters/llama_cpp/gate_ranking.hpp"
#include "moe_residency/adapters/llama_cpp/pinned_cache.hpp"
#include "moe_residency/adapters/llama_cpp/residency_manager.hpp"
#include "moe_residency/adapters/llama_cpp/residency_options.hpp"
#include "moe_residency/cache/expert_cache.hpp"
#include "moe_residency/cache/lru.hpp"
#include "moe_residency/io.hpp"
#include "moe_residency/speculation.hpp"

namespace moe_residency::llama_cpp {

/// The residency manager: an observer_sink (see the top of this header).
template <class Policy = lru_policy>
class mmap_residency final : public residency_manager {
 public:
  using cache_type = expert_cache<detail::eviction_log<Policy>>;
  /// The cache, the planner and the read scheduler: the same glue the session
  /// and the replay run (speculation.hpp), over the mapping as its storage.
  using speculation_type = speculation<detail::pinned_cache<Policy, mmap_residency>>;

  /// `gguf_path`: the file llama.cpp mapped. `advice`: null for the kernel's.
  /// `next`: a sink every event is passed on to. Throws `error` on invalid
  /// options. Activation (see activate) happens at the first routing event
  /// after the observer knows the structure.
  mmap_residency(const observer& obs, std::string gguf_path, residency_options options = {},
                 memory_advice* advice = nullptr, observer_sink* next = nullptr)
      : obs_(&obs), path_(std::move(gguf_path)), options_(options), next_(next) {
    options_.validate();
    if (advice == nullptr) {
      own_advice_ = std::make_unique<system_memory_advice>();
      advice = own_advice_.get();
    }
    advice_ = advice;
    page_ = advice_->page_size();
    if (page_ == 0 || (page_ & (page_ - 1)) != 0)
      throw error("mmap_residency: page size " + std::to_string(page_) + "; expected a power of two");
  }
  // Its cache's warning sink and its lanes' read callback capture `this`: never copied or moved.
  mmap_residency(const mmap_residency&) = delete;
  mmap_residency& operator=(const mmap_residency&) = delete;
  mmap_residency(mmap_residency&&) = delete;
  mmap_residency& operator=(mmap_residency&&) = delete;

  /// Stops the lanes and unlocks every page it locked.
  ~mmap_residency() override {
    settle();
    spec_.reset();  // stops the lanes
    // The pool's experts: the file's pages mapped back, as llama.cpp left them.
    for (std::size_t s = 0; s < slot_of_.size(); ++s)
      if (slot_of_[s] != no_slot) unplace(s / shape_.n_experts(), s % shape_.n_experts());
    for (std::size_t s = 0; s < spec_slot_.size(); ++s)
      if (spec_slot_[s] != no_slot) release_speculative(s / shape_.n_experts(), s % shape_.n_experts(), true);
    if (random_applied_) advise_expert_ranges(advice::normal);
    pages_.drop_all([this](std::uintptr_t a, std::size_t len) { call(advice::unlock, a, len); });
  }

  void set_next(observer_sink* next) noexcept override { next_ = next; }
  const char* policy_name() const noexcept override { return Policy::name; }

  /// Reads the mapping's layout and applies the one-time advice (dense lock,
  /// MADV_RANDOM). Throws `error` with the figures when the structure is not
  /// known yet, no expert tensor is in the file's mapping (a model loaded
  /// without mmap, every expert repacked or offloaded: expert tensors only
  /// some of which are elsewhere are left to llama.cpp, the rest managed;
  /// see unmanaged_note), the locking limit is too low, or the budget cannot
  /// fit. Called automatically otherwise.
  void activate() override;

  bool active() const noexcept override { return active_; }
  /// True when activation found the whole model fits the memory limit
  /// (options().fits == stand_down): nothing is advised, nothing asked.
  bool standing_down() const noexcept override { return standing_down_; }
  /// Why it stands down, or why not (the figures), after activation.
  const std::string& fit_note() const noexcept override { return fit_note_; }
  /// Why the manager is inactive after a failed automatic activation ("" otherwise).
  const std::string& status() const noexcept override { return status_; }
  const residency_options& options() const noexcept override { return options_; }
  /// The pinned cache's budget, bytes (0 without a cache or before activation).
  std::uint64_t budget_bytes() const noexcept override { return budget_; }
  /// How the auto budget was computed ("" unless auto).
  const std::string& budget_note() const noexcept override { return budget_note_; }
  const cache_type* cache() const noexcept { return spec_ ? spec_->cache().get() : nullptr; }
  /// Its speculation object (null before activation, or with none of exact,
  /// predicted and cache): its stats() and lines() are speculation's own.
  const speculation_type* speculation_state() const noexcept { return spec_.get(); }
  /// What the predicted reads are planned from, instead of the stale gate
  /// (null: the stale gate): e.g. forced_routing.hpp's `trace_oracle` when a
  /// recorded trace drives llama.cpp. Before activation only (throws `error`
  /// after it); `p` must outlive the manager.
  void set_predictor(routing_predictor* p) override {
    if (active_) throw error("mmap_residency: set_predictor after activation; expected it before the first routing");
    predictor_ = p;
  }
  /// The predictor's name ("stale-gate", "oracle:0.886", …; "" without `predicted`, or before activation).
  const char* predictor_name() const noexcept override {
    const routing_predictor* p = ranker_.predictor();
    return p != nullptr ? p->name() : "";
  }
  /// The ranking the last managed routing predicted, for MoE layer `target`;
  /// false when it made none (tests and logs: what the reads were planned from).
  bool last_prediction(layer_id& target, ranking& out) const override {
    if (!predicted_now_) return false;
    target = ranked_layer_;
    out = ranking_;
    return true;
  }
  /// The tensors it leaves to llama.cpp because they are not in the file's
  /// mapping (offloaded, repacked): the expert ones with their layers, then
  /// the dense ones; "" when it manages every one (or before activation).
  std::string unmanaged_note() const override { return pages_.unmapped_note(); }
  /// What the cache counts: per layer, the bytes of one expert's tensors in
  /// the mapping (a layer left wholly to llama.cpp: dense here). Valid after activation.
  const model_shape& managed_shape() const noexcept override { return managed_shape_; }

  /// With overlap, the last layer's reads are accounted at the next routing
  /// or batch: call this (between llama_decode calls) before reading stats()
  /// to account them now. Waits for them if they are still on the lanes.
  void settle() noexcept override {
    if (active_ && !standing_down_) settle_demand();
  }
  /// True when the lanes read with owned reads (advice::read), false when
  /// they populate (options().owned_reads off, or the advice has none).
  bool owned_reads() const noexcept { return owned_; }

  residency_stats stats() const noexcept override {
    residency_stats s = stats_;
    if (spec_) {
      try {
        const scheduler_stats ss = spec_->read_stats();
        s.read_wait_ns = ss.demand_ns;
        s.read_waits = ss.demand_waits;
        s.reads_queued = ss.queued;
        s.reads_in_flight = ss.in_flight;
      } catch (...) {  // a mutex that cannot lock: the counters stay 0
      }
    }
    for (std::size_t i = 0; i < advice_kinds; ++i) {
      s.calls[i] = calls_[i].load(std::memory_order_relaxed);
      s.errors[i] = errors_[i].load(std::memory_order_relaxed);
    }
    return s;
  }

  /// One line: what each part did.
  std::string summary() const override {
    const residency_stats s = stats();
    std::ostringstream o;
    o << "residency:";
    if (!active_) o << " inactive" << (status_.empty() ? "" : " (" + status_ + ")");
    if (standing_down_) return o.str() + " standing down: " + fit_note_;
    if (options_.pin_dense) o << " dense " << detail::mib(s.dense_bytes) << " locked |";
    if (options_.exact) o << " exact " << s.exact_reads << " reads " << detail::mib(s.exact_bytes) << " |";
    if (options_.predicted)
      o << " predicted issued " << s.predicted_issued << " useful " << s.predicted_useful << " late "
        << s.predicted_late << " wasted " << s.predicted_wasted << " |";
    if (options_.cache && cache()) {
      char buf[96];
      std::snprintf(buf, sizeof buf, " %.2f%% hit", s.cache_hit_pct());
      o << " cache " << Policy::name << " " << detail::mib(budget_) << buf << ", pinned " << detail::mib(s.pinned_bytes)
        << " (peak " << detail::mib(s.pinned_peak_bytes) << ")"
        << (pool_ ? ", in a pool of " + detail::mib(s.pool_bytes) : std::string()) << " |";
    }
    if (options_.measure && !inspectable_) {
      o << " resident at routing: unavailable (the kernel reports every page of a file this process may "
           "not write as resident) |";
    } else if (options_.measure) {
      char buf[64];
      std::snprintf(buf, sizeof buf, " resident at routing %.2f%% |", s.resident_pct());
      o << buf;
    }
    if (!pages_.unmapped().empty()) o << " left to llama.cpp: " << pages_.unmapped_note() << " |";
    if (s.unlock_failed_bytes != 0) o << " munlock failed on " << detail::mib(s.unlock_failed_bytes) << " |";
    o << " advice errors " << s.advice_errors();
    return o.str();
  }

  // ---- observer_sink -------------------------------------------------------

  void on_begin_batch(const batch_info& b) override {
    settle();  // a new graph: the previous one's matmuls are done
    if (spec_ && b.phase == run_phase::decode) spec_->begin_batch(run_phase::decode, b.n_tokens);
    if (next_ != nullptr) next_->on_begin_batch(b);
  }
  /// `begin_batch`, and `routed` while it manages (or has yet to try); the
  /// rest as `next` wants.
  bool wants(engine_event e) const noexcept override {
    const bool mine = e == engine_event::begin_batch ||
                      (e == engine_event::routed && !standing_down_ && (status_.empty() || active_));
    return mine || (next_ != nullptr && next_->wants(e));
  }
  void on_layer_loaded(const layer_batch& b) override {
    if (next_ != nullptr && next_->wants(engine_event::layer_loaded)) next_->on_layer_loaded(b);
  }
  void on_routed(const layer_batch& b) override {
    if (!active_ && status_.empty()) {
      try {
        activate();
      } catch (const std::exception& e) {
        status_ = e.what();
      }
    }
    if (active_ && !standing_down_) manage(b);
    else if (!active_) ++stats_.inactive_layers;
    if (next_ != nullptr && next_->wants(engine_event::routed)) next_->on_routed(b);
  }

 private:
  // ---- activation ----------------------------------------------------------

  void map_layout();

  // Refuses, before any advice, when RLIMIT_MEMLOCK cannot hold what will be
  // locked: the dense weights and the cache's budget (budget_ as known so far).
  void check_lock_limit();

  // The mapping must be ours to manage: not locked by llama.cpp itself, and
  // pageout only where the kernel honours it.
  void check_mapping();

  void pin_dense();

  void advise_expert_ranges(advice a) noexcept;

  // The speculation object: the cache over budget_ (given, or auto_budget's,
  // after check_lock_limit) when the cache part is on, the planner, and the
  // scheduler's lanes (with exact or predicted; synchronous otherwise).
  void make_speculation();

  // The expert pool (options_.pool): a slot per expert the cache can hold,
  // plus one layer's routed experts (a margin: a batch's misses take theirs
  // after its evictions freed slots);
  // in a slot, each expert tensor's whole pages of its slice, in the layer's
  // tensor order. Refuses with the figures before anything is advised.
  void make_pool();

  // Kept free besides the dense weights and llama.cpp's own memory (see margin_bytes).
  std::uint64_t margin_for(std::uint64_t limit) const noexcept {
    return options_.margin_bytes != 0
               ? options_.margin_bytes
               : std::max<std::uint64_t>(256ull << 20, limit / 8) +
                     (2 * (options_.lanes + spec_reads()) + shape_.top_k()) * pages_.widest_expert_bytes();
  }
  // Speculative reads a layer at most: spec_cap, of the predicted top-k.
  std::size_t spec_reads() const noexcept { return std::min<std::size_t>(options_.spec_cap, shape_.top_k()); }

  // The mapped model, llama.cpp's anonymous memory and the margin fit the limit.
  bool model_fits();

  /// limit − dense − llama.cpp's anonymous memory − margin, capped by the ceiling.
  std::uint64_t auto_budget();

  // ---- advice ---------------------------------------------------------------

  int call(advice a, unsigned char* addr, std::size_t len) noexcept {
    if (len == 0) return 0;
    calls_[static_cast<std::size_t>(a)].fetch_add(1, std::memory_order_relaxed);
    const int rc = advice_->apply(a, addr, len);
    if (rc != 0) errors_[static_cast<std::size_t>(a)].fetch_add(1, std::memory_order_relaxed);
    return rc;
  }
  int call(advice a, std::uintptr_t addr, std::size_t len) noexcept {
    return call(a, reinterpret_cast<unsigned char*>(addr), len);
  }

  // WILLNEED on every slice of expert e of layer l: asynchronous reads in
  // large requests (the kernel's readahead ignores MADV_RANDOM here).
  void start_reads(layer_id l, expert_id e) noexcept;

  // Lanes (and the host thread): wait for one expert of layer l to be
  // resident (populate_read), or lock it for the cache. A demanded read's
  // WILLNEED was issued by the host for the whole layer at once, so every
  // miss of the layer is queued at the device before any lane waits; a
  // speculative read issues its own. noexcept; a failure is the outcome.
  read_status read_expert(layer_id l, expert_id e, read_reason why) noexcept;

  // The pool: expert e of layer l into its slot (slot_of_, set by the host
  // before the read was handed over), tensor by tensor in the matmuls'
  // order: each slice's whole pages placed, its shared first and last pages
  // locked. A failed placement maps the file back over the slices already placed.
  bool place_expert(layer_id l, expert_id e, std::uint32_t slot) noexcept;

  // Expert e's slices' whole pages mapped to the file again (harmless where
  // they were not placed), with the expert ranges' advice.
  void restore_slices(std::size_t li, std::size_t ei) noexcept;

  // An evicted (or, at the end, any) pooled expert: its file pages back, its
  // shared pages' locks dropped, its slot free.
  void unplace(std::size_t li, std::size_t ei) noexcept;

  // A speculative placement not adopted by the cache (its expert was not
  // routed, or its read failed or never ran): its slices mapped back where it
  // was placed, the shared pages it locked (no reference holds them)
  // unlocked unless another holds them, its slot free.
  void release_speculative(std::size_t li, std::size_t ei, bool ran) noexcept;

  // Drops one lock from every page of [a, b); unlocks (and releases) the
  // runs of pages nothing else holds: a page shared with a neighbour that is
  // still pinned stays locked.
  void drop_refs(std::uintptr_t a, std::uintptr_t b, bool release = true) noexcept;

  // ---- per layer ------------------------------------------------------------

  void manage(const layer_batch& b);

  void measure(std::size_t li);

  // Completed speculative reads: counted as useful, late or wasted at their
  // layer's routing; with the pool, a placement the cache did not adopt is released.
  void settle_predictions(layer_id l);

  // After layer l's routing: the ranking of the MoE layer ahead, and
  // speculation's reads for it (the planner around the cache, on the lanes).
  void issue_predictions(const layer_batch& b);

  // The pool's spare slots for speculative placements, topped up from the free
  // ones (host thread; the lanes take them under spare_mu_).
  void refill_spare() noexcept;

  // An expert a completed speculative read made resident (the cache's
  // insert): pinned now (locked in the page cache, or its placement adopted),
  // and what its insertion evicted released. False (and not resident) when the pin failed.
  bool pin_inserted(layer_id l, expert_id e) noexcept;
  friend class detail::pinned_cache<Policy, mmap_residency>;

  // A free pool slot for each of layer l's misses (host thread, before the
  // reads are handed over); none left (never, with the pool's sizing): the
  // expert is locked in the page cache instead, counted, its reads started
  // as without the pool.
  void take_slots(layer_id l) noexcept;

  // WILLNEED on every miss of layer l from the eval thread, tensor by tensor
  // in the matmuls' order: every read queued at the device before any lane waits.
  void start_layer_reads(layer_id l) noexcept;

  // Hands layer l's misses to the lanes and returns: settle_demand() (at the
  // next routing, or at once without overlap) waits for them and accounts them.
  void begin_lane_reads(layer_id l, bool lock);

  // The open layer's reads: waited for (normally long done: its matmuls
  // needed every page), accounted, and admitted to the cache (pinned) or, failed, invalidated.
  void settle_demand() noexcept;

  void read_inline(layer_id l);

  // An admitted expert was locked (ok) or not: account it, or invalidate it
  // so the cache does not count as pinned what the kernel refused.
  void admitted(layer_id l, expert_id e, bool ok) noexcept;

  // Unpins and releases what the cache evicted since the last call (its
  // policy's log): a page an evicted expert shares with a pinned one stays locked.
  void release_evicted() noexcept;

  const observer* obs_;
  std::string path_;
  residency_options options_;
  observer_sink* next_;
  std::unique_ptr<memory_advice> own_advice_;
  memory_advice* advice_ = nullptr;
  std::size_t page_ = 4096;
  bool active_ = false;
  std::string status_, budget_note_, cache_warning_;

  model_shape shape_, managed_shape_;
  detail::expert_pages pages_;
  std::uint64_t budget_ = 0;
  std::vector<std::uint8_t> pinned_;  // per (layer, expert): locked by the cache

  std::unique_ptr<speculation_type> spec_;
  detail::gate_ranking ranker_;
  routing_predictor* predictor_ = nullptr;  // the host's (set_predictor), else the stale gate
  ranking ranking_;                         // the last routing's prediction (predicted_now_), for ranked_layer_
  layer_id ranked_layer_{};
  bool predicted_now_ = false;
  // Speculative reads issued and not yet counted at their layer's routing.
  struct issued_read {
    layer_id layer{};
    expert_id expert{};
    std::uint8_t done = 0;  // 0 in flight, 1 completed, 2 failed
  };
  std::vector<issued_read> issued_;
  std::vector<routing> routings_;
  std::vector<std::uint32_t> drop_masks_;

  std::vector<expert_id> routed_, to_read_;
  std::vector<std::uint8_t> seen_;
  std::vector<read_request> requests_;
  std::vector<read_outcome> outcomes_;

  residency_stats stats_;
  std::array<std::atomic<std::uint64_t>, advice_kinds> calls_{}, errors_{};
  std::atomic<bool> populate_unsupported_{false};
  bool random_applied_ = false;
  bool standing_down_ = false;
  std::string fit_note_;        // MADV_RANDOM on the expert ranges: restored by the destructor
  bool inspectable_ = true;     // mincore and pageout work on this file (see may_inspect_file)
  bool lock_demanded_ = false;  // demanded reads of this batch lock (cache admissions)
  bool owned_ = false;          // lanes read with advice::read (attach_file succeeded)
  // The expert pool (options_.pool): each (layer, expert)'s slot, the free ones.
  static constexpr std::uint32_t no_slot = UINT32_MAX;
  bool pool_ = false;
  std::uint64_t slot_bytes_ = 0;
  std::vector<std::uint32_t> slot_of_, free_slots_;
  std::vector<std::uint32_t> spec_slot_;  // speculative placements not yet settled (written by the lanes)
  std::vector<std::uint32_t> spare_;      // free slots the lanes place speculative reads in
  std::size_t spare_target_ = 0;
  std::mutex spare_mu_;
  // The layer whose demanded reads are on the lanes (overlap), and its cache batch.
  bool pending_demand_ = false, pending_lock_ = false;
  layer_id pending_layer_{};
};

}  // namespace moe_residency::llama_cpp
