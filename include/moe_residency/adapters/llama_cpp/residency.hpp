#pragma once
/// Residency of a memory-mapped GGUF's experts in an unmodified llama.cpp.
///
/// Stock llama.cpp maps the model file and lets page faults read it: on a
/// model larger than memory the kernel's LRU evicts the experts the next
/// token needs and every layer faults page by page ("a fault storm"). This
/// sink acts on what the observer knows before each layer's expert matmuls
/// run — the exact routing (`ffn_moe_topk-il`), a stale-gate prediction of
/// the next layer, each expert's address in the mapping — through memory
/// advice (advice.hpp), in four parts that can each be switched on alone:
///
/// - dense: the non-expert tensors' pages locked once (mlock), so reclaim
///   never takes the weights every token needs;
/// - exact: at layer l's routing, every routed expert's slices of every
///   expert tensor of the layer are requested at once (MADV_WILLNEED from the
///   eval thread: every miss queued at the device in large requests), then
///   waited for on the read scheduler's lanes (MADV_POPULATE_READ, or mlock
///   for the cache) while the eval thread waits: not fault by fault; with it, the expert ranges are advised MADV_RANDOM so a stray
///   fault reads one page, not a read-around window;
/// - predicted: the stale-gate's ranking of the next MoE layer through the
///   speculation planner (cap, residents free) onto the same lanes, behind
///   the demanded reads; never waited for (disowned at the next layer), and
///   counted as useful, late or wasted;
/// - cache: an expert_cache<Policy> over decode load batches decides
///   residency within a byte budget; an admitted expert's pages are locked,
///   an evicted one's unlocked and advised cold (or paged out), so the policy,
///   not the kernel's LRU, decides which experts stay. Prompt batches are
///   prefetched but never pinned (one touches nearly every expert of a layer).
///
/// When the whole model fits in the memory limit (with llama.cpp's own memory
/// and the margin), the default is to stand down: nothing is advised and the
/// graph is not split for routing, so leaving it on costs nothing measurable.
///
/// Advice never changes what the engine computes: logits stay bit-identical.
/// Failures of madvise/mlock are counted per kind, never thrown across the C
/// boundary. The first graph teaches the observer the structure; management
/// starts with the next graph (or call activate() yourself after it).
///
///   mrl::observer obs(model);                      // as in observer.hpp
///   mrl::residency_options o;  o.pin_dense = o.exact = o.predicted = o.cache = true;
///   mrl::mmap_residency<> res(obs, "model.gguf", o); // budget 0: sized from the memory limit
///   obs.set_sink(&res);                            // res.set_next(&other_sink) to chain
///
/// Destroy it before the model (it unlocks what it locked). Linux first; on
/// other systems the calls that exist are used and the rest are counted as
/// unsupported (ENOSYS). See docs/llama-cpp-residency.md.

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
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <sys/stat.h>
#include <unistd.h>
#endif

#include "moe_residency/adapters/llama_cpp/advice.hpp"
#include "moe_residency/adapters/llama_cpp/gguf.hpp"
#include "moe_residency/adapters/llama_cpp/observer.hpp"
#include "moe_residency/cache/expert_cache.hpp"
#include "moe_residency/cache/lru.hpp"
#include "moe_residency/io.hpp"
#include "moe_residency/plan.hpp"
#include "moe_residency/predict/gate.hpp"

namespace moe_residency::llama_cpp {

/// What the manager does when the whole model fits in the memory limit.
enum class when_fits : std::uint8_t {
  stand_down,  ///< act on nothing and ask nothing of the graph: plain mmap's speed, safe to leave on
  act,         ///< act anyway (tests; a limit the manager cannot see)
};

/// Which parts are on, and how they are sized.
struct residency_options {
  bool pin_dense = false;  ///< lock the non-expert tensors once
  bool exact = false;      ///< read each layer's routed experts on the lanes before its matmuls
  bool predicted = false;  ///< stale-gate speculative reads of the next MoE layer
  bool cache = false;      ///< a budgeted, pinned expert cache
  /// Pinned cache budget, bytes. 0: sized from the memory limit (see auto_budget).
  std::uint64_t cache_budget_bytes = 0;
  /// Auto budget: at most this many bytes (0: no ceiling).
  std::uint64_t cache_ceiling_bytes = 0;
  /// Auto budget: bytes kept free besides the dense weights and llama.cpp's
  /// own buffers (0: max(256 MiB, limit / 8), plus two reads in flight per
  /// lane and per speculative slot, plus one layer's routed experts).
  std::uint64_t margin_bytes = 0;
  /// With exact: advise the expert ranges MADV_RANDOM (no read-around on faults).
  bool random_faults = true;
  /// What an evicted expert's pages are advised: cold or pageout.
  advice release = advice::cold;
  std::size_t lanes = 2;     ///< read lanes (storage saturates at ~2; LAB.md)
  std::size_t spec_cap = 2;  ///< predicted reads per layer at most
  std::size_t horizon = 1;   ///< 1: stale-gate (l -> l+1); 2: l -> l+2
  /// Share of predicted slots replaced by a wrong expert (seeded): lets a lab
  /// degrade a random-weight model's flattering stale-gate to a real model's.
  double degrade = 0.0;
  std::uint64_t seed = 1;
  /// mincore every routed expert before acting: the page cache's own hit rate.
  bool measure = false;
  /// The default stands down when the mapped model, llama.cpp's anonymous
  /// memory and the auto margin all fit in the memory limit (auto_budget's).
  when_fits fits = when_fits::stand_down;

  /// Throws `error` naming the option, the value and what was expected.
  void validate() const {
    auto bad = [](const std::string& what) { throw error("residency_options: " + what); };
    if (lanes > 64) bad("lanes " + std::to_string(lanes) + "; expected [0, 64]");
    if (spec_cap > 32) bad("spec_cap " + std::to_string(spec_cap) + "; expected [0, 32]");
    if (horizon != 1 && horizon != 2) bad("horizon " + std::to_string(horizon) + "; expected 1 or 2");
    if (!(degrade >= 0.0 && degrade <= 1.0))
      bad("degrade " + std::to_string(degrade) + "; expected a share in [0, 1]");
    if (release != advice::cold && release != advice::pageout)
      bad(std::string("release ") + to_string(release) + "; expected cold or pageout");
    if (predicted && lanes == 0) bad("predicted reads need lanes; lanes is 0");
  }
};

/// Counters since construction (host thread; read between llama_decode calls).
struct residency_stats {
  std::uint64_t routed_layers = 0;    ///< on_routing events managed
  std::uint64_t inactive_layers = 0;  ///< events before activation (the first graph)
  // exact
  std::uint64_t exact_reads = 0, exact_bytes = 0, exact_failed = 0;
  // predicted
  std::uint64_t predictions = 0;       ///< layers a prediction was made for
  std::uint64_t predicted_issued = 0;  ///< speculative reads queued
  std::uint64_t predicted_rejected = 0;  ///< refused by a full scheduler queue
  std::uint64_t predicted_useful = 0;  ///< completed before the layer, and demanded by it
  std::uint64_t predicted_late = 0;    ///< demanded, but not complete when the layer's routing came
  std::uint64_t predicted_wasted = 0;  ///< not demanded by the layer
  std::uint64_t predicted_bytes = 0;
  // cache
  std::uint64_t cache_hits = 0, cache_misses = 0, evictions = 0;
  /// Expert bytes locked now, and the most after any layer. Within a layer,
  /// its misses are locked before the cache evicts (the engine's batch
  /// accounting): up to one layer's routed experts on top, which the auto
  /// budget's margin includes.
  std::uint64_t pinned_bytes = 0, pinned_peak_bytes = 0;
  std::uint64_t lock_failed = 0;  ///< admitted experts whose lock failed (invalidated)
  std::uint64_t unlock_failed_bytes = 0;  ///< bytes a failed munlock left locked
  // dense
  std::uint64_t dense_bytes = 0;  ///< non-expert bytes locked
  // measure
  std::uint64_t routed_experts = 0, routed_resident = 0;  ///< decode; fully resident at routing
  // every call through memory_advice, and its failures, by advice kind
  std::array<std::uint64_t, advice_kinds> calls{}, errors{};
  std::uint64_t advice_errors() const noexcept {
    std::uint64_t n = 0;
    for (auto e : errors) n += e;
    return n;
  }
  double cache_hit_pct() const noexcept {
    const std::uint64_t n = cache_hits + cache_misses;
    return n ? 100.0 * static_cast<double>(cache_hits) / static_cast<double>(n) : 0.0;
  }
  double resident_pct() const noexcept {
    return routed_experts ? 100.0 * static_cast<double>(routed_resident) / static_cast<double>(routed_experts)
                          : 0.0;
  }
};

/// The memory the process may use, as the auto budget sees it.
struct memory_limit {
  std::uint64_t bytes = 0;  ///< 0: unknown
  std::string source;       ///< "cgroup v2 /sys/fs/cgroup/.../memory.max", "MemAvailable", ...
};

namespace detail {

inline std::uint64_t read_u64_file(const std::string& path, bool& ok) {
  std::ifstream f(path);
  std::string v;
  ok = static_cast<bool>(f >> v) && !v.empty() && v != "max" && v.find_first_not_of("0123456789") == std::string::npos;
  return ok ? std::stoull(v) : 0;
}

/// The tightest memory limit over the process's cgroup and its ancestors
/// (v2 `memory.max` of each level; v1 `hierarchical_memory_limit` of
/// `memory.stat`, which already includes the ancestors, else
/// `memory.limit_in_bytes`), else MemAvailable. `root` prefixes /proc and
/// /sys (tests point it at a fake tree).
inline memory_limit process_memory_limit(const std::string& root = "") {
  memory_limit out;
  auto consider = [&](std::uint64_t v, const std::string& source) {
    if (v < (std::uint64_t{1} << 60) && (out.bytes == 0 || v < out.bytes)) {
      out.bytes = v;
      out.source = source;
    }
  };
  std::ifstream cg(root + "/proc/self/cgroup");
  std::string line;
  while (std::getline(cg, line)) {
    const auto a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    std::string path = line.substr(b + 1);
    if (controllers.empty()) {
      // v2: every level from the process's group up to the root (a scope
      // under a limited slice reads "max" itself).
      for (;;) {
        const std::string file = root + "/sys/fs/cgroup" + (path == "/" ? "" : path) + "/memory.max";
        bool ok = false;
        const std::uint64_t v = read_u64_file(file, ok);
        if (ok) consider(v, "cgroup v2 " + file);
        if (path.empty() || path == "/") break;
        const auto slash = path.rfind('/');
        path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
      }
    } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {
      const std::string dir = root + "/sys/fs/cgroup/memory" + (path == "/" ? "" : path);
      std::ifstream stat(dir + "/memory.stat");
      std::string key;
      std::uint64_t v = 0;
      bool hierarchical = false;
      while (stat >> key >> v)
        if (key == "hierarchical_memory_limit") {
          consider(v, "cgroup v1 " + dir + "/memory.stat hierarchical_memory_limit");
          hierarchical = true;
        }
      bool ok = false;
      const std::uint64_t own = read_u64_file(dir + "/memory.limit_in_bytes", ok);
      if (ok && !hierarchical) consider(own, "cgroup v1 " + dir + "/memory.limit_in_bytes");
    }
  }
  if (out.bytes != 0) return out;
  std::ifstream mi(root + "/proc/meminfo");
  while (std::getline(mi, line))
    if (line.rfind("MemAvailable:", 0) == 0) {
      out.bytes = std::stoull(line.substr(13)) * 1024;
      out.source = "MemAvailable in /proc/meminfo";
    }
  return out;
}

/// True when the mapping at `addr` already carries locked pages' flag
/// (`lo` in /proc/self/smaps: llama.cpp's mlock load mode): the manager's
/// munlock would undo those locks. False when it cannot tell.
inline bool mapping_locked(const void* addr) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  const auto a = reinterpret_cast<std::uintptr_t>(addr);
  bool inside = false;
  while (std::getline(smaps, line)) {
    const auto dash = line.find('-');
    const auto space = line.find(' ');
    if (dash != std::string::npos && space != std::string::npos && dash < space &&
        line.find_first_not_of("0123456789abcdef") == dash) {
      const std::uintptr_t lo = std::stoull(line.substr(0, dash), nullptr, 16);
      const std::uintptr_t hi = std::stoull(line.substr(dash + 1, space - dash - 1), nullptr, 16);
      inside = a >= lo && a < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return (line + " ").find(" lo ") != std::string::npos;
    }
  }
  return false;
}

/// True when this process may page out (MADV_PAGEOUT) and see the residency
/// (mincore) of the file's pages: the kernel allows both only to the file's
/// owner (or CAP_FOWNER) or a process that could write it.
inline bool may_inspect_file(const std::string& path) {
#if MOE_RESIDENCY_ADVICE_POSIX
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  return st.st_uid == ::geteuid() || ::geteuid() == 0 || ::access(path.c_str(), W_OK) == 0;
#else
  (void)path;
  return false;
#endif
}

/// Resident anonymous memory of the process (llama.cpp's KV cache and compute
/// buffers among it), bytes; 0 when unknown.
inline std::uint64_t process_anon_bytes() {
  std::ifstream st("/proc/self/status");
  std::string line;
  while (std::getline(st, line))
    if (line.rfind("RssAnon:", 0) == 0) return std::stoull(line.substr(8)) * 1024;
  return 0;
}

inline std::string mib(std::uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / 1048576.0);
  return buf;
}

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

/// The residency manager: an observer_sink (see the top of this header).
template <class Policy = lru_policy>
class mmap_residency : public observer_sink {
 public:
  using cache_type = expert_cache<detail::eviction_log<Policy>>;

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
  mmap_residency(const mmap_residency&) = delete;
  mmap_residency& operator=(const mmap_residency&) = delete;

  /// Stops the lanes and unlocks every page it locked.
  ~mmap_residency() override {
    scheduler_.reset();
    if (random_applied_) advise_expert_ranges(advice::normal);
    for (std::size_t p = 0; p < refs_.size();) {
      if (refs_[p] == 0) {
        ++p;
        continue;
      }
      std::size_t q = p;
      while (q < refs_.size() && refs_[q] != 0) refs_[q++] = 0;
      call(advice::unlock, base_ + p * page_, (q - p) * page_);
      p = q;
    }
  }

  void set_next(observer_sink* next) noexcept { next_ = next; }

  /// Reads the mapping's layout and applies the one-time advice (dense lock,
  /// MADV_RANDOM). Throws `error` with the figures when the structure is not
  /// known yet, the expert tensors are not in one file mapping (a model
  /// loaded without mmap, repacked or offloaded weights), the locking limit
  /// is too low, or the budget cannot fit. Called automatically otherwise.
  void activate() {
    if (active_) return;
    if (!obs_->structure_known())
      throw error("mmap_residency: the graph structure is not known yet; evaluate one batch first");
    shape_ = obs_->shape();
    // Everything that can refuse runs before any advice is applied, so a
    // refusal leaves the mapping exactly as llama.cpp left it.
    map_layout();
    check_mapping();
    if (options_.fits == when_fits::stand_down && model_fits()) {
      standing_down_ = true;
      active_ = true;
      return;
    }
    try {
      check_lock_limit();
      if (options_.cache) make_cache();
      if (options_.predicted) make_predictor();
      if (options_.exact || options_.predicted) make_scheduler();
    } catch (...) {
      scheduler_.reset();
      cache_.reset();
      throw;
    }
    if (options_.pin_dense) pin_dense();
    if (options_.exact && options_.random_faults) {
      advise_expert_ranges(advice::random);
      random_applied_ = true;
    }
    active_ = true;
  }

  bool active() const noexcept { return active_; }
  /// True when activation found the whole model fits the memory limit
  /// (options().fits == stand_down): nothing is advised, nothing asked.
  bool standing_down() const noexcept { return standing_down_; }
  /// Why it stands down, or why not (the figures), after activation.
  const std::string& fit_note() const noexcept { return fit_note_; }
  /// Why the manager is inactive after a failed automatic activation ("" otherwise).
  const std::string& status() const noexcept { return status_; }
  const residency_options& options() const noexcept { return options_; }
  /// The pinned cache's budget, bytes (0 without a cache or before activation).
  std::uint64_t budget_bytes() const noexcept { return budget_; }
  /// How the auto budget was computed ("" unless auto).
  const std::string& budget_note() const noexcept { return budget_note_; }
  const cache_type* cache() const noexcept { return cache_.get(); }

  residency_stats stats() const noexcept {
    residency_stats s = stats_;
    for (std::size_t i = 0; i < advice_kinds; ++i) {
      s.calls[i] = calls_[i].load(std::memory_order_relaxed);
      s.errors[i] = errors_[i].load(std::memory_order_relaxed);
    }
    return s;
  }

  /// One line: what each part did.
  std::string summary() const {
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
    if (options_.cache && cache_) {
      char buf[96];
      std::snprintf(buf, sizeof buf, " %.2f%% hit", s.cache_hit_pct());
      o << " cache " << Policy::name << " " << detail::mib(budget_) << buf << ", pinned "
        << detail::mib(s.pinned_bytes) << " (peak " << detail::mib(s.pinned_peak_bytes) << ") |";
    }
    if (options_.measure && !inspectable_) {
      o << " resident at routing: unavailable (the kernel reports every page of a file this process may "
           "not write as resident) |";
    } else if (options_.measure) {
      char buf[64];
      std::snprintf(buf, sizeof buf, " resident at routing %.2f%% |", s.resident_pct());
      o << buf;
    }
    if (s.unlock_failed_bytes != 0) o << " munlock failed on " << detail::mib(s.unlock_failed_bytes) << " |";
    o << " advice errors " << s.advice_errors();
    return o.str();
  }

  // ---- observer_sink -------------------------------------------------------

  void on_batch(const batch_info& b) override {
    if (next_ != nullptr) next_->on_batch(b);
  }
  bool wants_layers() const noexcept override { return next_ != nullptr && next_->wants_layers(); }
  bool wants_routing() const noexcept override {
    return (!standing_down_ && (status_.empty() || active_)) || (next_ != nullptr && next_->wants_routing());
  }
  void on_layer(const layer_batch& b) override {
    if (next_ != nullptr && next_->wants_layers()) next_->on_layer(b);
  }
  void on_routing(const layer_batch& b) override {
    if (!active_ && status_.empty()) {
      try {
        activate();
      } catch (const std::exception& e) {
        status_ = e.what();
      }
    }
    if (active_ && !standing_down_) manage(b);
    else if (!active_) ++stats_.inactive_layers;
    if (next_ != nullptr && next_->wants_routing()) next_->on_routing(b);
  }

 private:
  struct tensor_range {
    unsigned char* data = nullptr;  // expert 0 in the mapping
    std::uint64_t stride = 0;       // bytes per expert (nb[2])
    std::size_t n_expert = 0;
  };
  struct layer_ranges {
    std::vector<tensor_range> tensors;
    std::uint64_t bytes = 0;  // one expert, all tensors
  };
  struct issued_read {
    layer_id layer{};
    expert_id expert{};
    std::uint64_t ticket = 0;
  };

  // ---- activation ----------------------------------------------------------

  std::uintptr_t page_floor(const unsigned char* p) const noexcept {
    return reinterpret_cast<std::uintptr_t>(p) & ~static_cast<std::uintptr_t>(page_ - 1);
  }
  std::uintptr_t page_ceil(const unsigned char* p) const noexcept {
    return (reinterpret_cast<std::uintptr_t>(p) + page_ - 1) & ~static_cast<std::uintptr_t>(page_ - 1);
  }

  void map_layout() {
    dense_total_ = 0;
    widest_ = 0;
    gguf_expert_map map(path_, *obs_);
    const detail::gguf_ptr ctx = detail::open_gguf(path_, "mmap_residency");
    const std::uint64_t data_offset = gguf_get_data_offset(ctx.get());
    std::uint64_t file_end = data_offset;
    const std::int64_t n = gguf_get_n_tensors(ctx.get());
    for (std::int64_t i = 0; i < n; ++i)
      file_end = std::max<std::uint64_t>(file_end, data_offset + gguf_get_tensor_offset(ctx.get(), i) +
                                                       gguf_get_tensor_size(ctx.get(), i));
    // The mapping's base: every expert tensor must sit at base + its file offset.
    const unsigned char* base = nullptr;
    layers_.assign(obs_->n_layer(), layer_ranges{});
    // Every weight an expert matmul multiplies is an expert tensor (also in a
    // layer whose routing the observer cannot express): never dense.
    std::vector<std::string> expert_names;
    for (const layer_structure& s : obs_->layers())
      for (const expert_tensor& et : s.experts) expert_names.push_back(et.name);
    for (std::size_t l = 0; l < obs_->n_layer(); ++l) {
      const layer_structure& s = obs_->layers()[l];
      if (!s.moe) continue;
      const auto& ranges = map.ranges(layer_id(static_cast<std::uint16_t>(l)));
      for (std::size_t i = 0; i < s.experts.size(); ++i) {
        const expert_tensor& et = s.experts[i];
        const expert_file_range& fr = ranges[i];
        if (!detail::host_readable(et.tensor))
          throw error("mmap_residency: expert tensor '" + et.name +
                      "' is not in host memory (offloaded); expected a memory-mapped CPU weight");
        const auto* data = static_cast<const unsigned char*>(et.tensor->data);
        const unsigned char* b = data - fr.offset;
        if (base == nullptr) base = b;
        if (b != base)
          throw error("mmap_residency: expert tensor '" + et.name + "' is not at its file offset " +
                      std::to_string(fr.offset) + " in the mapping of " + path_ +
                      "; expected every expert tensor in one mmap of the file (load with use_mmap = true "
                      "and use_extra_bufts = false: repacked weights are copies, not the file)");
        layers_[l].tensors.push_back(tensor_range{const_cast<unsigned char*>(data), et.bytes_per_expert, et.n_expert});
        layers_[l].bytes += et.bytes_per_expert;
      }
    }
    if (base == nullptr) throw error("mmap_residency: the model has no MoE layer with expert tensors");
    base_ = reinterpret_cast<unsigned char*>(page_floor(base));
    const std::uint64_t span_bytes = reinterpret_cast<std::uintptr_t>(base) + file_end - page_floor(base);
    refs_.assign(static_cast<std::size_t>((span_bytes + page_ - 1) / page_), 0);
    pinned_.assign(shape_.n_layers() * shape_.n_experts(), 0);
    // Dense: every other tensor of the file.
    dense_.clear();
    for (std::int64_t i = 0; i < n; ++i) {
      const std::string name = gguf_get_tensor_name(ctx.get(), i);
      if (std::find(expert_names.begin(), expert_names.end(), name) != expert_names.end()) continue;
      const std::uint64_t off = data_offset + gguf_get_tensor_offset(ctx.get(), i);
      const std::uint64_t size = gguf_get_tensor_size(ctx.get(), i);
      if (size != 0) dense_.push_back({const_cast<unsigned char*>(base) + off, size});
      dense_total_ += size;
    }
    for (std::size_t l = 0; l < layers_.size(); ++l) widest_ = std::max(widest_, layers_[l].bytes);
  }

  // Refuses, before any advice, when RLIMIT_MEMLOCK cannot hold what will be locked.
  void check_lock_limit() {
    const std::uint64_t limit = advice_->lock_limit();
    const std::uint64_t dense = options_.pin_dense ? dense_total_ : 0;
    const std::uint64_t need = dense + (options_.cache ? std::max<std::uint64_t>(options_.cache_budget_bytes, 1) : 0);
    if (limit == UINT64_MAX || need <= limit) return;
    throw error("mmap_residency: locking needs " + detail::mib(need) + " (dense " + detail::mib(dense) +
                (options_.cache ? " + the cache's budget" : std::string()) + ") but RLIMIT_MEMLOCK is " +
                detail::mib(limit) +
                "; raise it (ulimit -l, memlock in limits.conf, LimitMEMLOCK= in a systemd unit) or give the "
                "process CAP_IPC_LOCK");
  }

  // The mapping must be ours to manage: not locked by llama.cpp itself, and
  // pageout only where the kernel honours it.
  void check_mapping() {
    if (detail::mapping_locked(base_))
      throw error("mmap_residency: the model's mapping of " + path_ +
                  " is already locked (llama.cpp's mlock load mode); the manager's unlocks would undo those "
                  "locks: load with LLAMA_LOAD_MODE_MMAP");
    inspectable_ = detail::may_inspect_file(path_);
    if (!inspectable_ && options_.release == advice::pageout)
      throw error("mmap_residency: release = pageout, but the kernel ignores MADV_PAGEOUT on " + path_ +
                  " for a process that neither owns nor may write it; use release = cold");
  }

  void pin_dense() {
    for (const auto& d : dense_) {
      const std::uintptr_t a = page_floor(d.first), b = page_ceil(d.first + d.second);
      if (call(advice::lock, a, b - a) == 0) {
        add_refs(a, b);
        stats_.dense_bytes += d.second;
      } else {
        // mlock marks the range locked before faulting it in: undo a partial lock
        // of the pages no other lock holds.
        add_refs(a, b);
        drop_refs(a, b, false);
      }
    }
  }

  void advise_expert_ranges(advice a) noexcept {
    for (const auto& l : layers_)
      for (const auto& t : l.tensors)
        call(a, page_floor(t.data), page_ceil(t.data + t.stride * t.n_expert) - page_floor(t.data));
  }

  void make_cache() {
    budget_ = options_.cache_budget_bytes;
    if (budget_ == 0) budget_ = auto_budget();
    const std::uint64_t limit = advice_->lock_limit();
    const std::uint64_t need = budget_ + (options_.pin_dense ? dense_total_ : 0);
    if (limit != UINT64_MAX && need > limit)
      throw error("mmap_residency: the pinned cache needs " + detail::mib(need) + " locked (budget " +
                  detail::mib(budget_) + " + dense " + detail::mib(options_.pin_dense ? dense_total_ : 0) +
                  ") but RLIMIT_MEMLOCK is " + detail::mib(limit) +
                  "; raise it (ulimit -l, memlock in limits.conf, LimitMEMLOCK= in a systemd unit) or give the process CAP_IPC_LOCK");
    cache_options o;
    o.budget_bytes = budget_;
    o.guard = cycle_guard::warn;
    o.on_warning = [this](const std::string& m) { cache_warning_ = m; };
    cache_ = std::make_unique<cache_type>(shape_, std::move(o));
  }

  // Kept free besides the dense weights and llama.cpp's own memory (see margin_bytes).
  std::uint64_t margin_for(std::uint64_t limit) const noexcept {
    return options_.margin_bytes != 0 ? options_.margin_bytes
                                      : std::max<std::uint64_t>(256ull << 20, limit / 8) +
                                            (2 * (options_.lanes + options_.spec_cap) + shape_.top_k()) * widest_;
  }

  // The mapped model, llama.cpp's anonymous memory and the margin fit the limit.
  bool model_fits() {
    const memory_limit lim = detail::process_memory_limit();
    const std::uint64_t mapped = static_cast<std::uint64_t>(refs_.size()) * page_;
    const std::uint64_t anon = detail::process_anon_bytes();
    const std::uint64_t need = mapped + anon + margin_for(lim.bytes);
    const bool fits = lim.bytes != 0 && need <= lim.bytes;
    fit_note_ = "model " + detail::mib(mapped) + " + llama.cpp anonymous " + detail::mib(anon) + " + margin " +
                detail::mib(margin_for(lim.bytes)) + (fits ? " fit" : " exceed") + " the limit " +
                detail::mib(lim.bytes) + " (" + lim.source + ")";
    return fits;
  }

  /// limit − dense − llama.cpp's anonymous memory − margin, capped by the ceiling.
  std::uint64_t auto_budget() {
    const memory_limit lim = detail::process_memory_limit();
    if (lim.bytes == 0)
      throw error("mmap_residency: auto budget: no cgroup limit and no MemAvailable; give cache_budget_bytes");
    const std::uint64_t anon = detail::process_anon_bytes();
    const std::uint64_t margin = margin_for(lim.bytes);
    const std::uint64_t need = dense_total_ + anon + margin;
    std::ostringstream note;
    note << "limit " << detail::mib(lim.bytes) << " (" << lim.source << ") - dense " << detail::mib(dense_total_)
         << " - llama.cpp anonymous " << detail::mib(anon) << " - margin " << detail::mib(margin);
    const std::uint64_t layer_need = widest_ * shape_.top_k();
    if (lim.bytes <= need || lim.bytes - need < layer_need)
      throw error("mmap_residency: auto budget: " + note.str() + " leaves " +
                  detail::mib(lim.bytes > need ? lim.bytes - need : 0) +
                  "; expected at least one layer's routed experts (" + detail::mib(layer_need) +
                  "): raise the memory limit or give a smaller margin_bytes");
    std::uint64_t b = lim.bytes - need;
    if (options_.cache_ceiling_bytes != 0 && b > options_.cache_ceiling_bytes) {
      b = options_.cache_ceiling_bytes;
      note << ", capped at " << detail::mib(b);
    }
    note << " = " << detail::mib(b);
    budget_note_ = note.str();
    return b;
  }

  void make_predictor() {
    bank_ = router_bank(shape_);
    for (std::size_t l = 0; l < obs_->n_layer(); ++l) {
      const layer_structure& s = obs_->layers()[l];
      if (s.moe && s.router_readable) bank_.set(layer_id(static_cast<std::uint16_t>(l)), s.router, s.spec);
    }
    if (bank_.size() == 0)
      throw error("mmap_residency: predicted reads need the routers in host memory as f32/f16/bf16; none is");
    gate1_.reset(shape_);
    gate2_.reset(shape_);
    planner_ = speculation_planner(options_.spec_cap);
    rng_.seed(options_.seed);
  }

  void make_scheduler() {
    scheduler_options so;
    so.lanes = options_.lanes;
    so.mode = quiesce_mode::disown;  // never wait for a speculative read
    so.queue_capacity = std::max<std::size_t>(16, 4 * options_.spec_cap);
    scheduler_ = std::make_unique<read_scheduler>(
        [this](layer_id l, expert_id e, read_reason r) noexcept { return read_expert(l, e, r); }, so);
    requests_.reserve(shape_.n_experts());
    outcomes_.resize(shape_.n_experts());
  }

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

  // Expert e's slice of tensor t, page-aligned outward.
  std::pair<std::uintptr_t, std::uintptr_t> slice(const tensor_range& t, std::size_t e) const noexcept {
    const unsigned char* a = t.data + e * t.stride;
    return {page_floor(a), page_ceil(a + t.stride)};
  }

  // WILLNEED on every slice of expert e of layer l: asynchronous reads in
  // large requests (the kernel's readahead ignores MADV_RANDOM here).
  void start_reads(layer_id l, expert_id e) noexcept {
    for (const auto& t : layers_[to_index(l)].tensors) {
      const auto r = slice(t, to_index(e));
      call(advice::willneed, r.first, r.second - r.first);
    }
  }

  // Lanes (and the host thread): wait for one expert of layer l to be
  // resident (populate_read), or lock it for the cache. A demanded read's
  // WILLNEED was issued by the host for the whole layer at once, so every
  // miss of the layer is queued at the device before any lane waits; a
  // speculative read issues its own. noexcept; a failure is the outcome.
  read_status read_expert(layer_id l, expert_id e, read_reason why) noexcept {
    // lock_demanded_ is written by the host before demand() hands the reads
    // to the lanes (under the scheduler's mutex), so lanes see this batch's.
    const bool lock = why == read_reason::demanded && lock_demanded_;
    const layer_ranges& lr = layers_[to_index(l)];
    bool ok = true;
    if (why == read_reason::speculative) start_reads(l, e);
    for (const auto& t : lr.tensors) {
      const auto r = slice(t, to_index(e));
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

  void add_refs(std::uintptr_t a, std::uintptr_t b) noexcept {
    for (std::uintptr_t p = a; p < b; p += page_) {
      const std::size_t i = (p - reinterpret_cast<std::uintptr_t>(base_)) / page_;
      if (i < refs_.size() && refs_[i] < 255) ++refs_[i];
    }
  }
  // Drops one reference from every page of [a, b); unlocks (and releases) the
  // runs of pages nothing else holds: a page shared with a neighbour that is
  // still pinned stays locked.
  void drop_refs(std::uintptr_t a, std::uintptr_t b, bool release = true) noexcept {
    const std::uintptr_t base = reinterpret_cast<std::uintptr_t>(base_);
    std::uintptr_t run = 0;
    bool in_run = false;
    for (std::uintptr_t p = a; p <= b; p += page_) {
      bool freed = false;
      if (p < b) {
        const std::size_t i = (p - base) / page_;
        if (i < refs_.size() && refs_[i] > 0) freed = --refs_[i] == 0;
      }
      if (freed && !in_run) {
        run = p;
        in_run = true;
      } else if (!freed && in_run) {
        // A failed munlock (ENOMEM: a VMA split past vm.max_map_count) leaves
        // the pages locked outside the budget: counted, never hidden.
        if (call(advice::unlock, run, p - run) != 0) stats_.unlock_failed_bytes += p - run;
        if (release) call(options_.release, run, p - run);
        in_run = false;
      }
    }
  }

  // ---- per layer ------------------------------------------------------------

  void manage(const layer_batch& b) {
    ++stats_.routed_layers;
    const layer_id l = b.layer;
    const std::size_t li = to_index(l);
    if (li >= layers_.size() || layers_[li].tensors.empty()) return;
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

    if (scheduler_) settle_predictions(l);
    if (options_.measure && inspectable_ && decode) measure(li);

    // The cache decides what is read and pinned (decode only).
    to_read_.clear();
    const bool cached = cache_ != nullptr && decode;
    if (cached) {
      cache_->begin_batch(run_phase::decode, l);
      for (expert_id e : routed_) {
        if (cache_->lookup(e) == lookup_result::miss) {
          ++stats_.cache_misses;
          to_read_.push_back(e);
        } else {
          ++stats_.cache_hits;
        }
      }
    } else if (options_.exact) {
      to_read_ = routed_;
    }

    if (!to_read_.empty()) {
      for (expert_id e : to_read_) start_reads(l, e);
      if (options_.exact) read_on_lanes(l, cached);
      else if (cached) read_inline(l);
    }
    if (cached) close_cache_batch();
    if (options_.predicted && decode && b.n_tokens > 0) predict(l, b.x(b.n_tokens - 1));
  }

  void measure(std::size_t li) {
    for (expert_id e : routed_) {
      ++stats_.routed_experts;
      bool all = true;
      for (const auto& t : layers_[li].tensors) {
        const auto r = slice(t, to_index(e));
        const long pages = advice_->resident_pages(reinterpret_cast<void*>(r.first), r.second - r.first);
        all = all && pages >= 0 && static_cast<std::uint64_t>(pages) == (r.second - r.first) / page_;
      }
      stats_.routed_resident += all;
    }
  }

  void read_on_lanes(layer_id l, bool lock) {
    lock_demanded_ = lock;
    requests_.clear();
    for (expert_id e : to_read_) requests_.push_back(read_request{l, e, layers_[to_index(l)].bytes});
    const std::size_t n = requests_.size();
    scheduler_->demand(span<const read_request>(requests_.data(), n), span<read_outcome>(outcomes_.data(), n));
    for (std::size_t i = 0; i < n; ++i) {
      const bool ok = outcomes_[i] == read_outcome::ok;
      ++stats_.exact_reads;
      stats_.exact_bytes += requests_[i].bytes;
      stats_.exact_failed += !ok;
      if (lock) admitted(l, to_read_[i], ok);
    }
  }

  void read_inline(layer_id l) {
    lock_demanded_ = true;
    for (expert_id e : to_read_) admitted(l, e, read_expert(l, e, read_reason::demanded) == read_status::ok);
  }

  // An admitted expert was locked (ok) or not: account it, or invalidate it
  // so the cache does not count as pinned what the kernel refused.
  void admitted(layer_id l, expert_id e, bool ok) {
    const std::size_t s = to_index(l) * shape_.n_experts() + to_index(e);
    if (!ok) {
      ++stats_.lock_failed;
      cache_->invalidate(l, e);
      // A partly locked expert: unlock what no other lock holds (without
      // releasing it: the layer multiplies it next), then make sure it is
      // resident the way exact reads do.
      for (const auto& t : layers_[to_index(l)].tensors) {
        const auto r = slice(t, to_index(e));
        add_refs(r.first, r.second);
        drop_refs(r.first, r.second, false);
        call(advice::populate_read, r.first, r.second - r.first);
      }
      return;
    }
    pinned_[s] = 1;
    for (const auto& t : layers_[to_index(l)].tensors) {
      const auto r = slice(t, to_index(e));
      add_refs(r.first, r.second);
    }
    stats_.pinned_bytes += layers_[to_index(l)].bytes;
  }

  void close_cache_batch() {
    auto& log = cache_->policy().log();  // cleared after each use: it may hold a reopened batch's
    cache_->end_batch();
    for (std::uint32_t s : log) {
      if (!pinned_[s]) continue;  // invalidated after a failed lock
      pinned_[s] = 0;
      ++stats_.evictions;
      const std::size_t li = s / shape_.n_experts(), e = s % shape_.n_experts();
      for (const auto& t : layers_[li].tensors) {
        const auto r = slice(t, e);
        drop_refs(r.first, r.second);
      }
      stats_.pinned_bytes -= layers_[li].bytes;
    }
    log.clear();
    stats_.pinned_peak_bytes = std::max(stats_.pinned_peak_bytes, stats_.pinned_bytes);
  }

  // ---- predicted reads -------------------------------------------------------

  // At layer l's routing: the speculative reads issued for l are useful
  // (complete and demanded), late (demanded, not complete) or wasted.
  void settle_predictions(layer_id l) {
    const span<const completed_read> done = scheduler_->quiesce();
    for (const completed_read& c : done)
      if (c.outcome == read_outcome::ok) completed_tickets_.push_back(c.ticket);
    std::size_t keep = 0;
    for (const issued_read& r : issued_) {
      if (to_index(r.layer) > to_index(l) && r.layer != l) {
        issued_[keep++] = r;  // a later layer's (horizon 2): settled there
        continue;
      }
      const bool complete =
          std::find(completed_tickets_.begin(), completed_tickets_.end(), r.ticket) != completed_tickets_.end();
      const bool demanded = r.layer == l && std::find(routed_.begin(), routed_.end(), r.expert) != routed_.end();
      if (!demanded) ++stats_.predicted_wasted;
      else if (complete) ++stats_.predicted_useful;
      else ++stats_.predicted_late;
    }
    issued_.resize(keep);
    if (issued_.empty()) completed_tickets_.clear();
  }

  void predict(layer_id l, const float* x) {
    layer_id target{};
    if (!moe_layer_ahead(shape_, l, options_.horizon, target)) return;
    ranking& pr = prediction_;
    const bool ok = options_.horizon == 1 ? gate1_.predict(bank_, l, target, x, pr)
                                          : gate2_.predict(bank_, l, target, x, pr);
    if (!ok) return;
    ++stats_.predictions;
    const std::size_t k = shape_.top_k();
    if (options_.degrade > 0) degrade(pr, k);
    const cache_type* c = cache_.get();
    const speculation_plan plan = planner_.plan(
        target, pr, k, [c](layer_id tl, expert_id e) noexcept { return c != nullptr && c->is_resident(tl, e); });
    for (std::size_t i = 0; i < plan.size(); ++i) {
      const read_request r{target, plan.id(i), layers_[to_index(target)].bytes};
      if (scheduler_->speculate(r)) {
        issued_.push_back(issued_read{target, plan.id(i), next_ticket_++});
        ++stats_.predicted_issued;
        stats_.predicted_bytes += r.bytes;
      } else {
        ++stats_.predicted_rejected;
      }
    }
  }

  // Replaces a seeded share of the top-k predicted slots by experts outside it.
  void degrade(ranking& pr, std::size_t k) {
    ranking out;
    const std::size_t n = shape_.n_experts(), depth = std::min(k, pr.size());
    std::uniform_real_distribution<double> coin(0.0, 1.0);
    std::uniform_int_distribution<std::size_t> pick(0, n - 1);
    std::size_t free = n > depth ? n - depth : 0;  // experts a replacement may take
    for (std::size_t r = 0; r < pr.size(); ++r) {
      expert_id e = pr.id(r);
      if (r < depth && free > 0 && coin(rng_) < options_.degrade) {
        do e = expert_id(static_cast<std::uint16_t>(pick(rng_)));
        while (pr.contains(e, depth) || out.contains(e));
        --free;
      }
      out.push_back(e, pr.score(r), pr.weight(r));
    }
    pr = out;
  }

  const observer* obs_;
  std::string path_;
  residency_options options_;
  observer_sink* next_;
  std::unique_ptr<memory_advice> own_advice_;
  memory_advice* advice_ = nullptr;
  std::size_t page_ = 4096;
  bool active_ = false;
  std::string status_, budget_note_, cache_warning_;

  model_shape shape_;
  std::vector<layer_ranges> layers_;
  std::vector<std::pair<unsigned char*, std::uint64_t>> dense_;
  std::uint64_t dense_total_ = 0, widest_ = 0, budget_ = 0;
  unsigned char* base_ = nullptr;
  std::vector<std::uint8_t> refs_;    // locks held per page of the mapping
  std::vector<std::uint8_t> pinned_;  // per (layer, expert): locked by the cache

  std::unique_ptr<cache_type> cache_;
  std::unique_ptr<read_scheduler> scheduler_;
  router_bank bank_;
  stale_gate_predictor gate1_;
  stale_gate_l2_predictor gate2_;
  speculation_planner planner_;
  std::mt19937_64 rng_;
  ranking prediction_;
  std::vector<issued_read> issued_;
  std::vector<std::uint64_t> completed_tickets_;
  std::uint64_t next_ticket_ = 0;

  std::vector<expert_id> routed_, to_read_;
  std::vector<std::uint8_t> seen_;
  std::vector<read_request> requests_;
  std::vector<read_outcome> outcomes_;

  residency_stats stats_;
  std::array<std::atomic<std::uint64_t>, advice_kinds> calls_{}, errors_{};
  std::atomic<bool> populate_unsupported_{false};
  bool random_applied_ = false;
  bool standing_down_ = false;
  std::string fit_note_;  // MADV_RANDOM on the expert ranges: restored by the destructor
  bool inspectable_ = true;      // mincore and pageout work on this file (see may_inspect_file)
  bool lock_demanded_ = false;  // demanded reads of this batch lock (cache admissions)
};

}  // namespace moe_residency::llama_cpp
