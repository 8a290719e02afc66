#pragma once
/// The residency manager: residency of a memory-mapped GGUF's experts in an
/// unmodified llama.cpp, acting on what the observer knows before each MoE
/// layer's expert matmuls run (the routing, a prediction of the next layer,
/// each expert's address in the mapping) through memory advice
/// (residency/advice.hpp). One class, `mmap_residency<Policy>`, an
/// observer_sink; `residency_manager` is its interface without the cache
/// policy (residency/policies.hpp names a policy at run time); its parts
/// (residency/options.hpp) can each be switched on alone:
///
/// - dense: the non-expert tensors' pages locked once (mlock);
/// - exact: at layer l's routing, every routed miss's slices requested at
///   once in the matmuls' order (MADV_WILLNEED from the eval thread), then
///   waited for on the read lanes (MADV_POPULATE_READ, or mlock for the
///   cache) while the layer's matmuls already run; settled at the next
///   routing. The expert ranges are advised MADV_RANDOM;
/// - predicted: a ranking of the next MoE layer (residency/predictor.hpp:
///   the stale gate, or the host's) through the speculation planner onto the
///   same lanes; completed reads are made resident at the next routing;
/// - cache: an expert_cache<Policy> over decode load batches decides
///   residency within a byte budget; an admitted expert is locked, an
///   evicted one unlocked and advised cold (or paged out); or, with the
///   pool, held in memory the manager owns, mapped over its pages.
///
/// The cache, the planner and the read scheduler are a `speculation` object
/// (speculation.hpp), the one the session and the replay run, so the replay
/// of a recorded routing makes the live cache's decisions. The order of its
/// steps is the contract: everything that can refuse runs before any advice;
/// at a routing, the completed predictions are settled and what the cache
/// evicted is released before the layer's reads start. When the whole model
/// fits in the memory limit it stands down. Advice never changes what the
/// engine computes. See docs/llama-cpp-residency.md.
///
/// The file, in order: the interface, the cache as speculation sees it
/// (pinned_cache), the class, then its members by job: activation (every
/// refusal, then the one-time advice), the advice calls (a lane's read, the
/// pool's placements, the locks' release), and one layer's step.

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
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

#include "moe_residency/adapters/llama_cpp/observer.hpp"
#include "moe_residency/adapters/llama_cpp/residency/advice.hpp"
#include "moe_residency/adapters/llama_cpp/residency/expert_pages.hpp"
#include "moe_residency/adapters/llama_cpp/residency/memory_limit.hpp"
#include "moe_residency/adapters/llama_cpp/residency/options.hpp"
#include "moe_residency/adapters/llama_cpp/residency/predictor.hpp"
#include "moe_residency/cache/expert_cache.hpp"
#include "moe_residency/cache/lru.hpp"
#include "moe_residency/core.hpp"
#include "moe_residency/io.hpp"
#include "moe_residency/speculation.hpp"

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
/// make_residency_manager (residency/policies.hpp) returns for a policy named
/// at run time. mmap_residency<Policy> below documents each member.
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

namespace detail {

template <class Policy, class Owner>
class pinned_cache {
 public:
  using cache_type = expert_cache<eviction_log<Policy>>;

  pinned_cache(const model_shape& shape, std::unique_ptr<cache_type> cache, Owner* owner) noexcept
      : shape_(shape), cache_(std::move(cache)), owner_(owner) {}

  const model_shape& shape() const noexcept { return shape_; }
  bool is_resident(layer_id l, expert_id e) const noexcept { return cache_ && cache_->is_resident(l, e); }
  bool insert(layer_id l, expert_id e, run_phase phase) noexcept {
    return cache_ && cache_->insert(l, e, phase) && owner_->pin_inserted(l, e);
  }
  bool invalidate(layer_id l, expert_id e) noexcept { return cache_ && cache_->invalidate(l, e); }
  bool begin_batch(run_phase phase, layer_id l) noexcept { return cache_ && cache_->begin_batch(phase, l); }
  lookup_result lookup(expert_id e) noexcept { return cache_ ? cache_->lookup(e) : lookup_result::rejected; }
  void end_batch() noexcept {
    if (cache_) cache_->end_batch();
  }
  const cache_stats& stats() const noexcept { return cache_ ? cache_->stats() : none_; }
  std::uint64_t budget_bytes() const noexcept { return cache_ ? cache_->budget_bytes() : 0; }

  /// The policy's cache, or null without the cache part.
  cache_type* get() noexcept { return cache_.get(); }
  const cache_type* get() const noexcept { return cache_.get(); }

 private:
  model_shape shape_;
  std::unique_ptr<cache_type> cache_;
  Owner* owner_;
  cache_stats none_{};
};

}  // namespace detail

// ---- the class ------------------------------------------------------------

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
      throw refusal("mmap_residency: page size " + std::to_string(page_) + "; expected a power of two");
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
  const char* predictor_name() const noexcept override { return ranker_ != nullptr ? ranker_->name() : ""; }
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
      o << " predicted (" << predictor_name() << ") issued " << s.predicted_issued << " useful " << s.predicted_useful
        << " late " << s.predicted_late << " wasted " << s.predicted_wasted << " |";
    if (options_.cache && cache()) {
      char buf[96];
      std::snprintf(buf, sizeof buf, " %.2f%% hit (%.1f MiB missed)", s.cache_hit_pct(),
                    static_cast<double>(s.cache_miss_bytes) / 1048576.0);
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
    char manage_ms[64];
    std::snprintf(manage_ms, sizeof manage_ms, " | eval thread in the manager %.1f ms", 1e-6 * double(s.manage_ns));
    o << " advice errors " << s.advice_errors() << manage_ms;
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
    if (active_ && !standing_down_) {
      const auto t0 = std::chrono::steady_clock::now();
      manage(b);
      stats_.manage_ns += static_cast<std::uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
    } else if (!active_) {
      ++stats_.inactive_layers;
    }
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

  // A given budget that cannot fit the memory limit beside the dense weights
  // is refused, whether or not the model fits (auto_budget sizes its own).
  void check_given_budget();

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
  stale_gate_ranking stale_;                // the manager's own predictor
  routing_predictor* predictor_ = nullptr;  // the host's (set_predictor)
  routing_predictor* ranker_ = nullptr;     // what predicted reads are planned from: predictor_, else stale_
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

// ---- activation: the mapping's layout, every refusal, then the one-time advice ----

template <class Policy>
void mmap_residency<Policy>::activate() {
  if (active_) return;
  if (!obs_->structure_known())
    throw error("mmap_residency: the graph structure is not known yet; evaluate one batch first");
  shape_ = obs_->shape();
  // Everything that can refuse runs before any advice is applied, so a
  // refusal leaves the mapping exactly as llama.cpp left it.
  map_layout();
  check_mapping();
  check_given_budget();
  if (options_.fits == when_fits::stand_down && model_fits()) {
    standing_down_ = true;
    active_ = true;
    return;
  }
  bool attached = false;  // every file with experts attached (advice::read, place, restore)
  try {
    // The lock limit is checked as soon as each figure is known: the dense
    // weights and a given budget first, an automatic budget once sized.
    budget_ = options_.cache ? options_.cache_budget_bytes : 0;
    check_lock_limit();
    if (options_.cache && budget_ == 0) {
      budget_ = auto_budget();
      check_lock_limit();
    }
    if (options_.predicted) {
      if (predictor_ == nullptr) stale_.init(*obs_, shape_, options_.horizon);
      ranker_ = predictor_ != nullptr ? predictor_ : &stale_;
    }
    const bool lanes = options_.exact || options_.predicted;
    if (lanes || options_.cache) make_speculation();
    if ((options_.owned_reads && lanes) || options_.pool) {
      attached = true;
      for (const auto& f : pages_.files())
        if (f.file_base != nullptr) {
          const int rc = advice_->attach_file(f.path, f.file_base, f.file_bytes);
          if (rc != 0 && options_.pool)
            throw refusal("mmap_residency: pool: cannot open " + f.path + " for its own reads: " + std::strerror(rc) +
                          "; expected a readable file (or pool = false)");
          attached = attached && rc == 0;
        }
    }
    if (options_.pool) make_pool();
  } catch (...) {
    spec_.reset();
    throw;
  }
  owned_ = options_.owned_reads && (options_.exact || options_.predicted) && attached;
  if (options_.pin_dense) pin_dense();
  // With exact or the cache, the manager reads every routed expert itself
  // (the cache's misses and, for a prompt, its WILLNEED below), so a fault
  // on an expert is stray: it should read one page, not a read-around
  // window (and under mlock, not start the kernel's asynchronous readahead
  // from a marked page). `predicted` alone leaves the faults on.
  if ((options_.exact || options_.cache) && options_.random_faults) {
    advise_expert_ranges(advice::random);
    random_applied_ = true;
  }
  active_ = true;
}

template <class Policy>
void mmap_residency<Policy>::map_layout() {
  pages_.map(path_, *obs_, page_);
  pinned_.assign(shape_.n_layers() * shape_.n_experts(), 0);
  // The cache counts what it pins: each layer's expert tensors in the
  // mapping; a layer with none (offloaded or repacked) is not its business.
  std::vector<std::uint64_t> bytes(shape_.n_layers(), 0);
  std::vector<bool> moe(shape_.n_layers(), false);
  for (std::size_t l = 0; l < shape_.n_layers() && l < pages_.layers().size(); ++l) {
    bytes[l] = pages_.layers()[l].bytes;
    moe[l] = bytes[l] != 0;
  }
  managed_shape_ = model_shape(shape_.name(), shape_.n_experts(), shape_.top_k(), std::move(bytes), std::move(moe));
}

template <class Policy>
void mmap_residency<Policy>::check_lock_limit() {
  const std::uint64_t limit = advice_->lock_limit();
  const std::uint64_t dense = options_.pin_dense ? pages_.dense_bytes() : 0;
  const std::uint64_t cache = options_.cache ? budget_ : 0;  // 0 while an automatic budget is not sized yet
  if (limit == UINT64_MAX || dense + cache <= limit) return;
  throw refusal("mmap_residency: locking needs " + detail::mib(dense + cache) + " (dense " + detail::mib(dense) +
                (options_.cache ? " + the cache's budget " + detail::mib(cache) : std::string()) +
                ") but RLIMIT_MEMLOCK is " + detail::mib(limit) +
                "; raise it (ulimit -l, memlock in limits.conf, LimitMEMLOCK= in a systemd unit) or give the "
                "process CAP_IPC_LOCK");
}

template <class Policy>
void mmap_residency<Policy>::check_given_budget() {
  if (!options_.cache || options_.cache_budget_bytes == 0) return;
  const memory_limit lim = detail::process_memory_limit();
  const std::uint64_t dense = pages_.dense_bytes();
  if (lim.bytes == 0 || options_.cache_budget_bytes + dense < lim.bytes) return;
  throw refusal("mmap_residency: the cache's budget " + detail::mib(options_.cache_budget_bytes) +
                " + the dense weights' " + detail::mib(dense) + " do not fit the memory limit of " +
                detail::mib(lim.bytes) + " (" + lim.source + "); expected a budget below " +
                detail::mib(lim.bytes > dense ? lim.bytes - dense : 0) + ", or an automatic budget (0)");
}

template <class Policy>
void mmap_residency<Policy>::check_mapping() {
  inspectable_ = true;
  for (const auto& f : pages_.files()) {
    if (f.base != nullptr && detail::mapping_locked(f.base))
      throw refusal("mmap_residency: the model's mapping of " + f.path +
                    " is already locked (llama.cpp's mlock load mode); the manager's unlocks would undo those "
                    "locks: load with LLAMA_LOAD_MODE_MMAP");
    const bool may = detail::may_inspect_file(f.path);
    inspectable_ = inspectable_ && may;
    if (!may && options_.release == advice::pageout)
      throw refusal("mmap_residency: release = pageout, but the kernel ignores MADV_PAGEOUT on " + f.path +
                    " for a process that neither owns nor may write it; use release = cold");
  }
}

template <class Policy>
void mmap_residency<Policy>::pin_dense() {
  for (const auto& d : pages_.dense()) {
    const std::uintptr_t a = pages_.floor(d.first), b = pages_.ceil(d.first + d.second);
    if (call(advice::lock, a, b - a) == 0) {
      pages_.add_refs(a, b);
      stats_.dense_bytes += d.second;
    } else {
      // mlock marks the range locked before faulting it in: undo a partial lock
      // of the pages no other lock holds.
      pages_.add_refs(a, b);
      drop_refs(a, b, false);
    }
  }
}

template <class Policy>
void mmap_residency<Policy>::advise_expert_ranges(advice a) noexcept {
  for (const auto& l : pages_.layers())
    for (const auto& t : l.tensors)
      call(a, pages_.floor(t.data), pages_.ceil(t.data + t.stride * t.n_expert) - pages_.floor(t.data));
}

template <class Policy>
void mmap_residency<Policy>::make_speculation() {
  std::unique_ptr<cache_type> cache;
  if (options_.cache) {
    cache_options o;
    o.budget_bytes = budget_;
    o.guard = cycle_guard::warn;
    o.on_warning = [this](const std::string& m) { cache_warning_ = m; };
    cache = std::make_unique<cache_type>(managed_shape_, std::move(o));
  }
  speculation_options so;
  so.enabled = options_.predicted;
  so.cap = options_.spec_cap;
  so.horizon = options_.horizon;
  // The lanes read with exact or predicted; the cache alone reads inline.
  so.scheduler.lanes = options_.exact || options_.predicted ? options_.lanes : 0;
  // Never wait for a speculative read, but with the pool: a disowned read
  // would go on writing a slot the manager then gives to another expert.
  so.scheduler.mode = options_.pool ? quiesce_mode::wait : quiesce_mode::disown;
  so.scheduler.queue_capacity = std::max<std::size_t>(16, 4 * options_.spec_cap);
  so.demanded_reads = false;  // the manager reads its misses itself (overlap, pool, inline)
  spec_ = std::make_unique<speculation_type>(
      managed_shape_, detail::pinned_cache<Policy, mmap_residency>(managed_shape_, std::move(cache), this),
      [this](layer_id l, expert_id e, read_reason r) noexcept { return read_expert(l, e, r); }, std::move(so));
  requests_.reserve(shape_.n_experts());
  outcomes_.resize(shape_.n_experts());
  routings_.resize(1);
  issued_.reserve(4 * max_top_k);
}

template <class Policy>
void mmap_residency<Policy>::make_pool() {
  std::uint64_t smallest = UINT64_MAX;
  slot_bytes_ = 0;
  for (const auto& l : pages_.layers()) {
    if (l.tensors.empty()) continue;
    smallest = std::min(smallest, l.bytes);
    std::uint64_t b = 0;
    for (const auto& t : l.tensors) b += t.stride / page_ * page_;
    slot_bytes_ = std::max(slot_bytes_, b);
  }
  if (slot_bytes_ == 0)
    throw refusal("mmap_residency: pool: every expert slice is smaller than a page (" + std::to_string(page_) +
                  " bytes); nothing to hold in a pool: expected pool = false");
  // Slots of the widest layer's size, as many as the budget holds of those
  // (layers whose experts differ in bytes, as a Q4_K_M file's do: the
  // narrower ones' overflow is locked in the page cache, counted as
  // pool_fallbacks, and auto_budget keeps room for it), + one layer's routed
  // experts, + the speculative placements in flight (options_.predicted): up
  // to spec_cap a layer (the planner takes no more than the top-k), for
  // `horizon` layers ahead.
  (void)smallest;
  const std::uint64_t slots =
      budget_ / slot_bytes_ + shape_.top_k() + (options_.predicted ? spec_reads() * options_.horizon : 0);
  // Each placed slice is a mapping of its own, splits the file's, and its
  // locked shared pages split it again (up to four mappings a slice):
  // the kernel's vm.max_map_count bounds them.
  std::size_t tensors = 0;
  for (const auto& l : pages_.layers()) tensors = std::max(tensors, l.tensors.size());
  const std::uint64_t maps_needed = slots * tensors * 4 + detail::process_map_count();
  const std::uint64_t max_maps = detail::max_map_count();
  if (max_maps != 0 && maps_needed > max_maps)
    throw refusal("mmap_residency: pool: " + std::to_string(slots) + " slots of " + std::to_string(tensors) +
                  " slices need up to " + std::to_string(maps_needed) + " mappings but vm.max_map_count is " +
                  std::to_string(max_maps) + "; raise it (sysctl vm.max_map_count=" + std::to_string(2 * maps_needed) +
                  ") or give a smaller budget");
  const std::uint64_t bytes = slots * slot_bytes_;
  const int rc = advice_->attach_pool(bytes);
  if (rc != 0)
    throw refusal("mmap_residency: pool: " + detail::mib(bytes) + " (" + std::to_string(slots) + " slots of " +
                  detail::mib(slot_bytes_) + ") could not be allocated: " + std::strerror(rc) +
                  (rc == ENOSYS ? std::string("; this system has no expert pool: expected pool = false")
                                : std::string("; expected a smaller budget or a higher memory limit")));
  slot_of_.assign(shape_.n_layers() * shape_.n_experts(), no_slot);
  spec_slot_.assign(shape_.n_layers() * shape_.n_experts(), no_slot);
  free_slots_.clear();
  for (std::uint64_t i = slots; i-- > 0;) free_slots_.push_back(static_cast<std::uint32_t>(i));
  spare_target_ = options_.predicted ? spec_reads() * options_.horizon : 0;
  spare_.reserve(spare_target_);
  refill_spare();
  stats_.pool_bytes = bytes;
  pool_ = true;
}

template <class Policy>
bool mmap_residency<Policy>::model_fits() {
  const memory_limit lim = detail::process_memory_limit();
  const std::uint64_t mapped = pages_.mapped_bytes();
  const std::uint64_t anon = detail::process_anon_bytes();
  const std::uint64_t need = mapped + anon + margin_for(lim.bytes);
  const bool fits = lim.bytes != 0 && need <= lim.bytes;
  fit_note_ = "model " + detail::mib(mapped) + " + llama.cpp anonymous " + detail::mib(anon) + " + margin " +
              detail::mib(margin_for(lim.bytes)) + (fits ? " fit" : " exceed") + " the limit " +
              detail::mib(lim.bytes) + " (" + lim.source + ")";
  return fits;
}

template <class Policy>
std::uint64_t mmap_residency<Policy>::auto_budget() {
  const memory_limit lim = detail::process_memory_limit();
  if (lim.bytes == 0)
    throw refusal("mmap_residency: auto budget: no cgroup limit and no MemAvailable; give cache_budget_bytes");
  const std::uint64_t anon = detail::process_anon_bytes();
  const std::uint64_t margin = margin_for(lim.bytes);
  const std::uint64_t need = pages_.dense_bytes() + anon + margin;
  std::ostringstream note;
  note << "limit " << detail::mib(lim.bytes) << " (" << lim.source << ") - dense " << detail::mib(pages_.dense_bytes())
       << " - llama.cpp anonymous " << detail::mib(anon) << " - margin " << detail::mib(margin);
  const std::uint64_t layer_need = pages_.widest_expert_bytes() * shape_.top_k();
  if (lim.bytes <= need || lim.bytes - need < layer_need)
    throw refusal("mmap_residency: auto budget: " + note.str() + " leaves " +
                  detail::mib(lim.bytes > need ? lim.bytes - need : 0) +
                  "; expected at least one layer's routed experts (" + detail::mib(layer_need) +
                  "): raise the memory limit or give a smaller margin_bytes");
  std::uint64_t b = lim.bytes - need;
  if (options_.pool) {
    // The pool holds b / widest experts in slots of the widest layer's size;
    // a cache of narrower experts holds more, their overflow locked in the
    // page cache: up to b (1 - narrowest / widest) beside the pool's b. So
    // b + b (widest - narrowest) / widest must fit what is left.
    std::uint64_t narrowest = UINT64_MAX;
    for (const auto& l : pages_.layers())
      if (!l.tensors.empty()) narrowest = std::min(narrowest, l.bytes);
    const std::uint64_t widest = pages_.widest_expert_bytes();
    if (narrowest < widest) {
      b = static_cast<std::uint64_t>(static_cast<double>(b) * static_cast<double>(widest) /
                                     static_cast<double>(2 * widest - narrowest));
      note << ", x " << widest << "/(2 x " << widest << " - " << narrowest
           << ") for the pool's widest slots and the narrower experts' overflow";
    }
  }
  if (options_.cache_ceiling_bytes != 0 && b > options_.cache_ceiling_bytes) {
    b = options_.cache_ceiling_bytes;
    note << ", capped at " << detail::mib(b);
  }
  note << " = " << detail::mib(b);
  budget_note_ = note.str();
  return b;
}

// ---- the advice calls: a lane's read, the pool's placements, the locks' release ---

template <class Policy>
void mmap_residency<Policy>::start_reads(layer_id l, expert_id e) noexcept {
  for (const auto& t : pages_.layers()[to_index(l)].tensors) {
    const auto r = pages_.slice(t, to_index(e));
    call(advice::willneed, r.first, r.second - r.first);
  }
}

template <class Policy>
read_status mmap_residency<Policy>::read_expert(layer_id l, expert_id e, read_reason why) noexcept {
  // lock_demanded_ is written by the host before demand() hands the reads
  // to the lanes (under the scheduler's mutex), so lanes see this batch's.
  const bool lock = why == read_reason::demanded && lock_demanded_;
  const detail::expert_pages::layer_ranges& lr = pages_.layers()[to_index(l)];
  if (pool_) {
    const std::size_t s = to_index(l) * shape_.n_experts() + to_index(e);
    std::uint32_t slot = lock ? slot_of_[s] : no_slot;  // a miss's: set by the host before the read was handed over
    if (why == read_reason::speculative) {
      // A spare slot (refill_spare keeps enough for the reads in flight);
      // none: not read, its expert read at its routing if routed.
      {
        std::lock_guard<std::mutex> hold(spare_mu_);
        if (spare_.empty()) return read_status::failed;
        slot = spare_.back();
        spare_.pop_back();
      }
      spec_slot_[s] = slot;  // read by the host after the quiesce that collects this read
    }
    if (slot != no_slot) return place_expert(l, e, slot) ? read_status::ok : read_status::failed;
  }
  bool ok = true;
  if (owned_) {
    // Owned reads, in the order the layer's matmuls read the tensors; a lock
    // then only maps and pins what is cached, and an unlocked read is done:
    // the matmul's faults map the cached pages.
    for (const auto& t : lr.tensors) {
      const auto r = pages_.slice(t, to_index(e));
      ok = call(advice::read, r.first, r.second - r.first) == 0 && ok;
    }
    if (!lock) return ok ? read_status::ok : read_status::failed;
  } else if (why == read_reason::speculative) {
    start_reads(l, e);
  }
  for (const auto& t : lr.tensors) {
    const auto r = pages_.slice(t, to_index(e));
    if (lock) {
      ok = call(advice::lock, r.first, r.second - r.first) == 0 && ok;
    } else if (!populate_unsupported_.load(std::memory_order_relaxed)) {
      const int rc = call(advice::populate_read, r.first, r.second - r.first);
      if (rc == EINVAL || rc == ENOSYS) populate_unsupported_.store(true, std::memory_order_relaxed);
      else if (rc != 0) ok = false;  // e.g. EIO, EFAULT: the expert is not resident
    }
  }
  return ok ? read_status::ok : read_status::failed;
}

template <class Policy>
bool mmap_residency<Policy>::place_expert(layer_id l, expert_id e, std::uint32_t slot) noexcept {
  const std::size_t li = to_index(l), ei = to_index(e);
  const std::uint64_t slot_base = std::uint64_t{slot} * slot_bytes_;
  std::uint64_t at = 0;
  bool ok = true;
  for (const auto& t : pages_.layers()[li].tensors) {
    const unsigned char* a = t.data + ei * t.stride;
    const std::uintptr_t lo = pages_.floor(a), hi = pages_.ceil(a + t.stride);
    const std::uintptr_t ia = pages_.ceil(a), ib = pages_.floor(a + t.stride);
    if (ib > ia) {
      calls_[static_cast<std::size_t>(advice::place)].fetch_add(1, std::memory_order_relaxed);
      if (advice_->place(reinterpret_cast<void*>(ia), ib - ia, slot_base + at) != 0) {
        errors_[static_cast<std::size_t>(advice::place)].fetch_add(1, std::memory_order_relaxed);
        ok = false;
        break;
      }
      if (lo < ia) ok = call(advice::lock, lo, ia - lo) == 0 && ok;
      if (ib < hi) ok = call(advice::lock, ib, hi - ib) == 0 && ok;
    } else {
      ok = call(advice::lock, lo, hi - lo) == 0 && ok;
    }
    at += t.stride / page_ * page_;
  }
  if (!ok) restore_slices(li, ei);
  return ok;
}

template <class Policy>
void mmap_residency<Policy>::restore_slices(std::size_t li, std::size_t ei) noexcept {
  for (const auto& t : pages_.layers()[li].tensors) {
    const unsigned char* a = t.data + ei * t.stride;
    const std::uintptr_t ia = pages_.ceil(a), ib = pages_.floor(a + t.stride);
    if (ib <= ia) continue;
    call(advice::restore, ia, ib - ia);
    if (random_applied_) call(advice::random, ia, ib - ia);
  }
}

template <class Policy>
void mmap_residency<Policy>::unplace(std::size_t li, std::size_t ei) noexcept {
  std::uint32_t& slot = slot_of_[li * shape_.n_experts() + ei];
  restore_slices(li, ei);
  for (const auto& t : pages_.layers()[li].tensors) {
    const unsigned char* a = t.data + ei * t.stride;
    const std::uintptr_t lo = pages_.floor(a), hi = pages_.ceil(a + t.stride);
    const std::uintptr_t ia = pages_.ceil(a), ib = pages_.floor(a + t.stride);
    if (ib <= ia) {
      drop_refs(lo, hi);
      continue;
    }
    if (lo < ia) drop_refs(lo, ia);
    if (ib < hi) drop_refs(ib, hi);
  }
  free_slots_.push_back(slot);
  slot = no_slot;
}

template <class Policy>
void mmap_residency<Policy>::refill_spare() noexcept {
  std::lock_guard<std::mutex> hold(spare_mu_);
  while (spare_.size() < spare_target_ && !free_slots_.empty()) {
    spare_.push_back(free_slots_.back());
    free_slots_.pop_back();
  }
}

template <class Policy>
void mmap_residency<Policy>::release_speculative(std::size_t li, std::size_t ei, bool ran) noexcept {
  std::uint32_t& slot = spec_slot_[li * shape_.n_experts() + ei];
  if (ran) {
    restore_slices(li, ei);
    for (const auto& t : pages_.layers()[li].tensors) {
      const auto r = pages_.slice(t, ei);
      pages_.add_refs(r.first, r.second);
      drop_refs(r.first, r.second, false);
    }
  }
  free_slots_.push_back(slot);
  slot = no_slot;
}

template <class Policy>
void mmap_residency<Policy>::drop_refs(std::uintptr_t a, std::uintptr_t b, bool release) noexcept {
  pages_.drop_refs(a, b, [&](std::uintptr_t run, std::size_t len) {
    // A failed munlock (ENOMEM: a VMA split past vm.max_map_count) leaves
    // the pages locked outside the budget: counted, never hidden.
    if (call(advice::unlock, run, len) != 0) stats_.unlock_failed_bytes += len;
    if (release) call(options_.release, run, len);
  });
}

// ---- one layer's step at its routing ----------------------------------------

template <class Policy>
void mmap_residency<Policy>::manage(const layer_batch& b) {
  ++stats_.routed_layers;
  settle_demand();  // the previous layer's reads: its matmuls, which needed them, are done
  predicted_now_ = false;
  const layer_id l = b.layer;
  const std::size_t li = to_index(l);
  if (li >= pages_.layers().size() || pages_.layers()[li].tensors.empty()) return;
  const bool decode = b.phase == run_phase::decode;

  // The experts this layer reads: the union over its tokens, first-seen order.
  routed_.clear();
  const std::size_t n_expert = shape_.n_experts();
  if (seen_.size() != n_expert) seen_.assign(n_expert, 0);
  for (std::size_t t = 0; t < b.n_tokens; ++t)
    for (std::size_t j = 0; j < b.k; ++j) {
      const std::int32_t id = b.ids[t * b.ids_stride + j];
      if (id < 0 || static_cast<std::size_t>(id) >= n_expert || seen_[static_cast<std::size_t>(id)]) continue;
      seen_[static_cast<std::size_t>(id)] = 1;
      routed_.push_back(expert_id(static_cast<std::uint16_t>(id)));
    }
  for (expert_id e : routed_) seen_[to_index(e)] = 0;
  if (options_.measure && inspectable_ && decode) measure(li);

  // speculation's load (decode): the completed speculative reads made
  // resident and pinned, the routed experts looked up in the cache (one
  // routing per token, token-major), the misses listed for the reads below.
  to_read_.clear();
  const bool cached = cache() != nullptr && decode;
  if (decode && spec_) {
    if (routings_.size() < b.n_tokens) routings_.resize(b.n_tokens);
    drop_masks_.assign(b.n_tokens, 0);
    for (std::size_t t = 0; t < b.n_tokens; ++t) {
      routing& r = routings_[t];
      r.clear();
      r.layer = l;
      r.phase = run_phase::decode;
      r.token = b.position(t);
      for (std::size_t j = 0; j < b.k && r.size() < max_top_k; ++j) {
        const std::int32_t id = b.ids[t * b.ids_stride + j];
        if (id >= 0 && static_cast<std::size_t>(id) < n_expert)
          r.push_back(expert_id(static_cast<std::uint16_t>(id)), 0.0f);
      }
    }
    spec_->routed(span<const routing>(routings_.data(), b.n_tokens),
                  span<std::uint32_t>(drop_masks_.data(), b.n_tokens));
    settle_predictions(l);
    if (cached) {
      for (const read_request& r : spec_->demanded()) to_read_.push_back(r.expert);
      stats_.cache_misses += to_read_.size();
      stats_.cache_miss_bytes += to_read_.size() * pages_.layers()[li].bytes;
      stats_.cache_hits += routed_.size() - to_read_.size();
      // What the batch evicted is released before any miss is locked: a
      // page an evicted expert shares with a miss is unlocked, then locked
      // again by the miss's read (never the other way round, on two threads).
      release_evicted();
    }
  }
  if (!cached && options_.exact) to_read_ = routed_;

  if (!to_read_.empty()) {
    // ggml's mul_mat_id multiplies a layer's experts in id order, tensor
    // by tensor (the observer lists the tensors in the graph's order): the
    // reads go to the device in that order, so the first matmul can start
    // on the first expert while the later ones are still being read.
    std::sort(to_read_.begin(), to_read_.end(), [](expert_id a, expert_id b) { return to_index(a) < to_index(b); });
    const bool lanes_read = options_.exact && owned_;
    if (cached && pool_) take_slots(l);
    const bool placing = pool_ && cached;  // the misses go to the pool, past the page cache
    if (!lanes_read && !placing) start_layer_reads(l);
    if (options_.exact) {
      begin_lane_reads(l, cached);
      if (!options_.overlap || placing) settle_demand();
    } else if (cached) {
      read_inline(l);
    }
  } else if (cache() != nullptr && !decode) {
    // The cache alone, a prompt batch: never pinned, but requested at once
    // (the expert ranges fault one page at a time under MADV_RANDOM).
    for (expert_id e : routed_) start_reads(l, e);
  }
  if (options_.predicted && decode && b.n_tokens > 0) issue_predictions(b);
}

template <class Policy>
void mmap_residency<Policy>::settle_predictions(layer_id l) {
  const std::size_t n_expert = shape_.n_experts();
  for (const completed_read& c : spec_->completed()) {
    for (issued_read& r : issued_)
      if (r.done == 0 && r.layer == c.request.layer && r.expert == c.request.expert) {
        r.done = c.outcome == read_outcome::ok ? 1 : 2;
        break;
      }
    // The pool: a placement the cache did not adopt (its read failed, or the
    // cache refused it) is mapped back and its slot freed.
    if (pool_) {
      const std::size_t li = to_index(c.request.layer), ei = to_index(c.request.expert);
      if (li * n_expert + ei < spec_slot_.size() && spec_slot_[li * n_expert + ei] != no_slot)
        release_speculative(li, ei, true);
    }
  }
  // The reads for this layer: useful (complete and routed), late (routed,
  // not complete) or wasted (not routed); a later layer's wait for theirs.
  std::size_t keep = 0;
  for (const issued_read& r : issued_) {
    if (to_index(r.layer) > to_index(l)) {
      issued_[keep++] = r;
      continue;
    }
    const bool demanded = r.layer == l && std::find(routed_.begin(), routed_.end(), r.expert) != routed_.end();
    if (!demanded) ++stats_.predicted_wasted;
    else if (r.done == 1) ++stats_.predicted_useful;
    else ++stats_.predicted_late;
  }
  issued_.resize(keep);
}

template <class Policy>
void mmap_residency<Policy>::issue_predictions(const layer_batch& b) {
  layer_id target{};
  const bool ranked = moe_layer_ahead(managed_shape_, b.layer, options_.horizon, target) && ranker_ != nullptr &&
                      ranker_->rank(b, target, ranking_);
  if (ranked) {
    ++stats_.predictions;
    predicted_now_ = true;
    ranked_layer_ = target;
  }
  if (pool_) refill_spare();
  const std::uint64_t planned = spec_->stats().planned;
  spec_->layer_loaded(b.layer, ranked ? &ranking_ : nullptr);
  const span<const read_request> issued = spec_->issued();
  for (const read_request& r : issued) {
    if (issued_.size() < issued_.capacity()) issued_.push_back(issued_read{r.layer, r.expert, 0});
    ++stats_.predicted_issued;
    stats_.predicted_bytes += r.bytes;
  }
  stats_.predicted_rejected += spec_->stats().planned - planned - issued.size();
}

template <class Policy>
void mmap_residency<Policy>::measure(std::size_t li) {
  for (expert_id e : routed_) {
    ++stats_.routed_experts;
    bool all = true;
    for (const auto& t : pages_.layers()[li].tensors) {
      const auto r = pages_.slice(t, to_index(e));
      const long pages = advice_->resident_pages(reinterpret_cast<void*>(r.first), r.second - r.first);
      all = all && pages >= 0 && static_cast<std::uint64_t>(pages) == (r.second - r.first) / page_;
    }
    stats_.routed_resident += all;
  }
}

template <class Policy>
void mmap_residency<Policy>::take_slots(layer_id l) noexcept {
  for (expert_id e : to_read_) {
    if (free_slots_.empty()) {
      ++stats_.pool_fallbacks;
      start_reads(l, e);
      continue;
    }
    slot_of_[to_index(l) * shape_.n_experts() + to_index(e)] = free_slots_.back();
    free_slots_.pop_back();
  }
}

template <class Policy>
void mmap_residency<Policy>::start_layer_reads(layer_id l) noexcept {
  for (const auto& t : pages_.layers()[to_index(l)].tensors)
    for (expert_id e : to_read_) {
      const auto r = pages_.slice(t, to_index(e));
      call(advice::willneed, r.first, r.second - r.first);
    }
}

template <class Policy>
void mmap_residency<Policy>::begin_lane_reads(layer_id l, bool lock) {
  lock_demanded_ = lock;
  requests_.clear();
  for (expert_id e : to_read_) requests_.push_back(read_request{l, e, pages_.layers()[to_index(l)].bytes});
  const std::size_t n = requests_.size();
  pending_layer_ = l;
  pending_lock_ = lock;
  pending_demand_ = true;
  spec_->scheduler().begin_demand(span<const read_request>(requests_.data(), n),
                                  span<read_outcome>(outcomes_.data(), n));
}

template <class Policy>
void mmap_residency<Policy>::settle_demand() noexcept {
  if (pending_demand_) {
    pending_demand_ = false;
    spec_->scheduler().end_demand();
    for (std::size_t i = 0; i < requests_.size(); ++i) {
      const bool ok = outcomes_[i] == read_outcome::ok;
      ++stats_.exact_reads;
      stats_.exact_bytes += requests_[i].bytes;
      stats_.exact_failed += !ok;
      if (pending_lock_) admitted(pending_layer_, to_read_[i], ok);
    }
  }
}

template <class Policy>
void mmap_residency<Policy>::read_inline(layer_id l) {
  lock_demanded_ = true;
  for (expert_id e : to_read_) admitted(l, e, read_expert(l, e, read_reason::demanded) == read_status::ok);
}

template <class Policy>
void mmap_residency<Policy>::admitted(layer_id l, expert_id e, bool ok) noexcept {
  const std::size_t s = to_index(l) * shape_.n_experts() + to_index(e);
  const bool pooled = pool_ && slot_of_[s] != no_slot;
  if (!ok && pooled) {  // place_expert mapped the file back; the slot is free again
    free_slots_.push_back(slot_of_[s]);
    slot_of_[s] = no_slot;
  }
  if (!ok) {
    ++stats_.lock_failed;
    spec_->cache().invalidate(l, e);
    // A partly locked expert: unlock what no other lock holds (without
    // releasing it: the layer multiplies it next), then make sure it is
    // resident the way exact reads do.
    for (const auto& t : pages_.layers()[to_index(l)].tensors) {
      const auto r = pages_.slice(t, to_index(e));
      pages_.add_refs(r.first, r.second);
      drop_refs(r.first, r.second, false);
      call(advice::populate_read, r.first, r.second - r.first);
    }
    return;
  }
  pinned_[s] = 1;
  for (const auto& t : pages_.layers()[to_index(l)].tensors) {
    const auto r = pages_.slice(t, to_index(e));
    if (!pooled) {
      pages_.add_refs(r.first, r.second);
      continue;
    }
    // Pooled: only the pages shared with a neighbour are locked.
    const unsigned char* a = t.data + to_index(e) * t.stride;
    const std::uintptr_t ia = pages_.ceil(a), ib = pages_.floor(a + t.stride);
    if (ib <= ia) {
      pages_.add_refs(r.first, r.second);
      continue;
    }
    if (r.first < ia) pages_.add_refs(r.first, ia);
    if (ib < r.second) pages_.add_refs(ib, r.second);
  }
  stats_.pinned_bytes += pages_.layers()[to_index(l)].bytes;
}

template <class Policy>
bool mmap_residency<Policy>::pin_inserted(layer_id l, expert_id e) noexcept {
  const std::size_t s = to_index(l) * shape_.n_experts() + to_index(e);
  bool ok = true;
  if (pool_) {
    // Placed by its lane in a spare slot: adopted, the slot now the cache's.
    ok = spec_slot_[s] != no_slot;
    if (ok) {
      slot_of_[s] = spec_slot_[s];
      spec_slot_[s] = no_slot;
    }
  } else {
    // Read into the page cache by its lane: locked here (the host's thread).
    for (const auto& t : pages_.layers()[to_index(l)].tensors) {
      const auto r = pages_.slice(t, to_index(e));
      ok = call(advice::lock, r.first, r.second - r.first) == 0 && ok;
    }
  }
  admitted(l, e, ok);
  release_evicted();
  return ok;
}

template <class Policy>
void mmap_residency<Policy>::release_evicted() noexcept {
  cache_type* c = spec_ ? spec_->cache().get() : nullptr;
  if (c == nullptr) return;
  auto& log = c->policy().log();  // cleared after each use
  for (std::uint32_t s : log) {
    if (!pinned_[s]) continue;  // invalidated after a failed lock
    pinned_[s] = 0;
    ++stats_.evictions;
    const std::size_t li = s / shape_.n_experts(), e = s % shape_.n_experts();
    if (pool_ && slot_of_[s] != no_slot) {
      unplace(li, e);
    } else {
      for (const auto& t : pages_.layers()[li].tensors) {
        const auto r = pages_.slice(t, e);
        drop_refs(r.first, r.second);
      }
    }
    stats_.pinned_bytes -= pages_.layers()[li].bytes;
  }
  log.clear();
  stats_.pinned_peak_bytes = std::max(stats_.pinned_peak_bytes, stats_.pinned_bytes);
}

}  // namespace moe_residency::llama_cpp
