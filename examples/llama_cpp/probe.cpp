// moe-llama-probe: runs a GGUF model — or a random-weight model of a real
// architecture built in memory — through an unmodified llama.cpp with the
// moe_residency observer attached. Prints the prediction report (stale-gate,
// prev-token, frequency, and the fresh-gate control, which must read 100.0%)
// and the cache line of an LRU cache replaying the engine's load batches;
// optionally writes the route trace and reads every missed expert's bytes
// from the GGUF file, and measures what observing costs.
//
//   moe-llama-probe --random qwen3moe --tokens 32 --decode 64 --budget-mib 8
//   moe-llama-probe --model model.gguf --prompt "Hello" --trace-out run.route.csv --warm pread
//
// For the memory lab (scripts/memlab.sh, docs/memlab.md):
//   moe-llama-probe --random qwen3moe --expert-type q4_K ... --save-model lab.gguf --save-only
//     streams a random model to disk (never held in memory);
//   moe-llama-probe --model lab.gguf --no-observer --per-token-csv run.csv
//     decodes through plain mmap and records each token (wall ms, page faults,
//     bytes read from storage) and prints a digest of every decode token's logits.

#include <CLI/CLI.hpp>

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "moe_residency/adapters/llama_cpp.hpp"
#include "moe_residency/adapters/llama_cpp/forced_routing.hpp"
#include "moe_residency/adapters/llama_cpp/residency.hpp"
#include "moe_residency/adapters/llama_cpp/residency/policies.hpp"
#include "moe_residency/cache/lru.hpp"
#include "moe_residency/replay/oracle_profile.hpp"
#include "moe_residency/score.hpp"
#include "moe_residency/session.hpp"
#include "checked_options.hpp"
#include "proc_counters.hpp"
#include "degraded_ranking.hpp"
#include "random_model.hpp"
#include "trace_shape.hpp"

namespace {

using namespace moe_residency;
namespace mrl = moe_residency::llama_cpp;
namespace mre = moe_residency::llama_cpp::examples;
using mre::mapping_kib;
using mre::proc_mapping;
using mre::proc_read_bytes;
using mre::thread_cpu_ms;

using probe_session =
    session<predictor_set<stale_gate_predictor, prev_token_predictor, frequency_predictor, fresh_gate_control>>;

struct probe_args {
  std::string model_path, random_arch;
  mre::random_model_spec spec;
  std::string router = "f32";
  std::string expert_type = "f32";
  std::string dense_type = "f32";
  std::string shape;               // a named real model's shape (random_model.hpp's named_shapes)
  std::string load_mode = "mmap";  // llama.cpp's own load modes, for the lab's stock baselines
  bool save_only = false;
  int splits = 1;  // --save-model as this many splits (llama.cpp's names)
  bool no_observer = false;
  std::string per_token_csv;
  std::string metrics_csv;  // the phone's metrics format (timing.hpp's parse_token_metrics)
  // The residency manager (mmap_residency): parts, budget, lanes.
  std::string residency = "off";
  std::string residency_budget = "auto";
  std::string policy = "lru";  // the cache policy (live_cache_policies())
  bool policy_given = false;   // --policy on the command line: refused without the cache
  std::size_t lanes = 2;
  std::size_t spec_cap = 2;
  bool serial = false;       // overlap off: the eval thread waits for each layer's reads
  bool owned_reads = false;  // lanes read themselves (advice::read) instead of willneed + populate_read
  bool pool = false;         // the cache's experts in an expert pool (O_DIRECT reads, mapped over the file's pages)
  double degrade = 0.0;
  bool no_hit_measure = false;
  std::string when_fits = "stand-down";  // act: manage a model that fits (the manager's own cost, no reads)
  std::string prompt;
  std::size_t tokens = 32;  // prompt tokens when no --prompt
  std::size_t decode = 64;
  double budget_mib = 0;  // 0: half of all experts' bytes
  std::string trace_out, save_model, warm;
  int threads = 2;
  bool cost = false;
  int cost_rounds = 5;
  std::uint64_t seed = 7;
  // Real routing: llama.cpp's routing replaced by a recorded trace's
  // (forced_routing.hpp); a random model in a trace's shape (trace_shape.hpp).
  std::string route_from, shape_from;
  std::size_t trace_layers = 0;          // 0: every layer of the trace
  std::string predictor = "stale-gate";  // or oracle:P[,PROFILE] (needs --route-from)
  std::uint64_t oracle_seed = replay_speculation{}.seed;
  bool tokens_given = false, decode_given = false;
};

/// --route-from / --shape-from's trace, cut to --trace-layers.
validated_route_trace load_trace(const std::string& path, std::size_t layers) {
  validated_route_trace t = read_route_trace(path);
  if (layers != 0) return first_layers(t, layers, path);
  return t;
}

struct context_deleter {
  void operator()(llama_context* c) const noexcept { llama_free(c); }
};
using context_ptr = std::unique_ptr<llama_context, context_deleter>;

llama_context_params context_params(const probe_args& a, std::size_t n_tokens) {
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<std::uint32_t>(n_tokens + 16);
  cp.n_batch = cp.n_ctx;
  cp.n_ubatch = cp.n_ctx;  // the prompt is one graph
  cp.n_threads = a.threads;
  cp.n_threads_batch = a.threads;
  return cp;
}

std::vector<llama_token> prompt_tokens(const probe_args& a, const llama_model* m) {
  const llama_vocab* vocab = llama_model_get_vocab(m);
  if (!a.prompt.empty()) {
    std::vector<llama_token> t(a.prompt.size() + 16);
    int n = llama_tokenize(vocab, a.prompt.c_str(), static_cast<int32_t>(a.prompt.size()), t.data(),
                           static_cast<int32_t>(t.size()), true, true);
    if (n < 0) {
      t.resize(static_cast<std::size_t>(-n));
      n = llama_tokenize(vocab, a.prompt.c_str(), static_cast<int32_t>(a.prompt.size()), t.data(),
                         static_cast<int32_t>(t.size()), true, true);
    }
    if (n <= 0) throw error("--prompt: the model's vocabulary produced no tokens");
    t.resize(static_cast<std::size_t>(n));
    return t;
  }
  std::mt19937_64 gen(a.seed);
  std::uniform_int_distribution<int> pick(0, llama_vocab_n_tokens(vocab) - 1);
  std::vector<llama_token> t(a.tokens);
  for (auto& x : t) x = pick(gen);
  return t;
}

/// The process's counters that say where a token's time went: page faults
/// (getrusage) and bytes read from storage — the process's own read_bytes
/// (/proc/self/io) and its block-I/O cgroup's bytes read (v1
/// blkio.throttle.io_service_bytes_recursive, v2 io.stat rbytes), the latter a
/// fallback where task I/O accounting reads 0; it counts every process of the
/// cgroup (in the root cgroup: the machine).
struct counters {
  std::uint64_t majflt = 0, minflt = 0, read_bytes = 0, cgroup_read_bytes = 0;
  std::uint64_t engine_majflt = 0;  ///< of the engine's threads only (see engine_threads)
};

/// The threads alive now (/proc/self/task): taken after llama.cpp's first
/// decode and before the residency manager starts its read lanes, they are
/// the engine's — the eval thread and ggml's workers.
std::vector<std::string> current_threads() {
  std::vector<std::string> out;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') out.emplace_back(e->d_name);
    closedir(d);
  }
  return out;
}

/// Major faults of these threads (field 12 of /proc/self/task/TID/stat). The
/// process-wide count (getrusage) also holds the faults the manager's lanes
/// take on purpose — MADV_POPULATE_READ and mlock populate pages through the
/// fault path, and the kernel counts those as major faults of the thread —
/// so this is the count of faults the engine itself stalled on.
std::uint64_t threads_majflt(const std::vector<std::string>& tids) {
  std::uint64_t sum = 0;
  for (const auto& t : tids) {
    std::ifstream in("/proc/self/task/" + t + "/stat");
    std::string line;
    if (!std::getline(in, line)) continue;  // an exited worker
    const auto close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream f(line.substr(close + 2));
    std::string field;
    // fields from 3 (state) on; majflt is field 12
    for (int i = 3; i <= 12 && f >> field; ++i)
      if (i == 12) sum += std::strtoull(field.c_str(), nullptr, 10);
  }
  return sum;
}

/// The block-I/O statistics file of this process's cgroup, or "" (none readable).
std::string cgroup_io_file() {
  std::ifstream in("/proc/self/cgroup");
  std::string line, v1, v2;
  while (std::getline(in, line)) {
    const auto c1 = line.find(':'), c2 = line.find(':', c1 + 1);
    if (c1 == std::string::npos || c2 == std::string::npos) continue;
    const std::string ctrl = line.substr(c1 + 1, c2 - c1 - 1), path = line.substr(c2 + 1);
    if (ctrl.find("blkio") != std::string::npos) v1 = path;
    if (line.compare(0, 3, "0::") == 0) v2 = path;
  }
  for (const std::string& f : {"/sys/fs/cgroup/blkio" + v1 + "/blkio.throttle.io_service_bytes_recursive",
                               "/sys/fs/cgroup/blkio" + v1 + "/blkio.throttle.io_service_bytes",
                               "/sys/fs/cgroup" + v2 + "/io.stat", "/sys/fs/cgroup/unified" + v2 + "/io.stat"})
    if (std::ifstream(f)) return f;
  return "";
}

std::uint64_t cgroup_read_bytes(const std::string& file) {
  if (file.empty()) return 0;
  std::ifstream in(file);
  std::string line;
  std::uint64_t sum = 0;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string dev, word;
    ls >> dev;
    if (file.compare(file.size() - 7, 7, "io.stat") == 0) {
      while (ls >> word)
        if (word.compare(0, 7, "rbytes=") == 0) sum += std::strtoull(word.c_str() + 7, nullptr, 10);
    } else {
      std::uint64_t v = 0;
      if (ls >> word >> v && word == "Read") sum += v;
    }
  }
  return sum;
}

counters sample(const std::string& cg_file, const std::vector<std::string>& engine) {
  counters c;
  c.engine_majflt = threads_majflt(engine);
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  c.majflt = static_cast<std::uint64_t>(ru.ru_majflt);
  c.minflt = static_cast<std::uint64_t>(ru.ru_minflt);
  c.read_bytes = proc_read_bytes();
  c.cgroup_read_bytes = cgroup_read_bytes(cg_file);
  return c;
}

/// One row of --per-token-csv: the prompt batch (token 0) or one decode token.
struct token_record {
  std::size_t token = 0;
  bool prompt = false;
  double wall_ms = 0;
  double cpu_ms = 0;  ///< CPU time of the calling (eval) thread during the call
  double sys_ms = 0;  ///< of which in the kernel (getrusage RUSAGE_THREAD): faults, reclaim, readahead
  std::uint64_t majflt = 0, minflt = 0, read_bytes = 0, cgroup_read_bytes = 0, engine_majflt = 0;
  std::uint64_t prefetch_issued = 0, prefetch_useful = 0, prefetch_late = 0;
  double pinned_mib = 0;
  double hit_pct = -1;                      // < 0: not measured (no residency manager)
  double proc_cpu_ms = 0, proc_sys_ms = 0;  ///< every thread of the process (RUSAGE_SELF): compute, lanes, kernel
  double read_wait_ms = 0;                  ///< the eval thread waiting for the manager's demanded reads
  std::uint64_t read_waits = 0;             ///< layers whose reads it had to wait for
};

struct run_result {
  double decode_s = 0;
  std::vector<token_record> rows;
  std::uint64_t digest = 1469598103934665603ull;  // FNV-1a 64 of every decode token's logits
  std::size_t digested = 0;
  mapping_kib mapping;  // at the end of the decode
};

void fnv1a_bytes(std::uint64_t& h, const void* p, std::size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
}

/// The calling thread's CPU time as getrusage(RUSAGE_THREAD) splits it (Linux),
/// whole microseconds: `sys` is the kernel's part (the page faults it takes,
/// reclaim in its cgroup, readahead it submits), `total` = user + sys.
struct rusage_split {
  std::int64_t total = 0, sys = 0;
};
rusage_split thread_rusage(int who = RUSAGE_THREAD) {
  rusage ru{};
  if (getrusage(who, &ru) != 0) return {};
  auto us = [](const timeval& t) { return std::int64_t{t.tv_sec} * 1000000 + std::int64_t{t.tv_usec}; };
  return {us(ru.ru_utime) + us(ru.ru_stime), us(ru.ru_stime)};
}

/// The kernel's share of `cpu_ms` over one call: getrusage's own split of the
/// interval applied to the exact CPU time. The kernel keeps getrusage's user and
/// system times each monotonic and summing to its own runtime, so the share is in
/// [0, 1] (the probe smoke test checks sys_ms <= cpu_ms on every row). Subtracting
/// getrusage's system time over the CPU clock's interval instead is not bounded by
/// it: getrusage's runtime is not the CPU clock's (on this machine kind its
/// interval ran up to ~130 us longer), and a row's sys_ms came out above cpu_ms.
double kernel_share_ms(const rusage_split& a, const rusage_split& b, double cpu_ms) {
  const std::int64_t total = b.total - a.total;
  if (total <= 0) return 0.0;
  // Integers, so that a share of all of it is exactly 1 and sys_ms then equals cpu_ms.
  return cpu_ms * (static_cast<double>(b.sys - a.sys) / static_cast<double>(total));
}

/// Prompt batch, then `n_decode` tokens sampled from softmax(logits) with a
/// seeded generator. Times every llama_decode call and, with `record`, samples
/// the counters around each; digests the logits every decode token produced.
using residency_manager = mrl::residency_manager;

run_result run(llama_context* ctx, const llama_model* m, const std::vector<llama_token>& prompt, std::size_t n_decode,
               std::uint64_t seed, bool record = false, residency_manager* res = nullptr,
               std::vector<std::string> engine = {}) {
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(m));
  const std::string cg_file = record ? cgroup_io_file() : std::string();
  if (record && engine.empty()) engine = current_threads();
  run_result r;
  auto timed = [&](llama_batch batch, std::size_t token, bool is_prompt) {
    const counters c0 = record ? sample(cg_file, engine) : counters{};
    const mrl::residency_stats r0 = res ? res->stats() : mrl::residency_stats{};
    const double cpu0 = record ? thread_cpu_ms() : 0.0;
    const rusage_split sys0 = record ? thread_rusage() : rusage_split{};
    const rusage_split proc0 = record ? thread_rusage(RUSAGE_SELF) : rusage_split{};
    const auto t0 = std::chrono::steady_clock::now();
    const int rc = llama_decode(ctx, batch);
    // The manager accounts the last layer's reads (still open with overlap) in
    // the token that made them; waiting for any still on the lanes is its time.
    if (res != nullptr) res->settle();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double cpu1 = record ? thread_cpu_ms() : 0.0;
    const rusage_split sys1 = record ? thread_rusage() : rusage_split{};
    const rusage_split proc1 = record ? thread_rusage(RUSAGE_SELF) : rusage_split{};
    if (rc != 0) throw error(is_prompt ? "llama_decode failed on the prompt batch" : "llama_decode failed");
    if (record) {
      const counters c1 = sample(cg_file, engine);
      token_record t;
      t.token = token;
      t.prompt = is_prompt;
      t.wall_ms = 1e3 * s;
      t.cpu_ms = cpu1 - cpu0;
      t.sys_ms = kernel_share_ms(sys0, sys1, t.cpu_ms);
      t.proc_cpu_ms = 1e-3 * static_cast<double>(proc1.total - proc0.total);
      t.proc_sys_ms = 1e-3 * static_cast<double>(proc1.sys - proc0.sys);
      t.majflt = c1.majflt - c0.majflt;
      t.minflt = c1.minflt - c0.minflt;
      t.engine_majflt = c1.engine_majflt - c0.engine_majflt;
      t.read_bytes = c1.read_bytes - c0.read_bytes;
      t.cgroup_read_bytes = c1.cgroup_read_bytes - c0.cgroup_read_bytes;
      if (res) {
        // issued: every read the manager queued (exact and predicted); useful
        // and late: the predicted ones. hit_pct: the routed experts (decode)
        // fully resident when their layer's routing came (mincore).
        const mrl::residency_stats r1 = res->stats();
        t.prefetch_issued = (r1.exact_reads - r0.exact_reads) + (r1.predicted_issued - r0.predicted_issued);
        t.prefetch_useful = r1.predicted_useful - r0.predicted_useful;
        t.prefetch_late = r1.predicted_late - r0.predicted_late;
        t.pinned_mib = to_mib(r1.pinned_bytes + r1.dense_bytes);
        t.read_wait_ms = 1e-6 * static_cast<double>(r1.read_wait_ns - r0.read_wait_ns);
        t.read_waits = r1.read_waits - r0.read_waits;
        const std::uint64_t routed = r1.routed_experts - r0.routed_experts;
        if (routed)
          t.hit_pct =
              100.0 * static_cast<double>(r1.routed_resident - r0.routed_resident) / static_cast<double>(routed);
      }
      r.rows.push_back(t);
    }
    return s;
  };
  std::vector<llama_token> toks = prompt;
  timed(llama_batch_get_one(toks.data(), static_cast<int32_t>(toks.size())), 0, true);
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<double> p(static_cast<std::size_t>(n_vocab));
  for (std::size_t step = 0; step < n_decode; ++step) {
    const float* lg = llama_get_logits_ith(ctx, -1);
    if (step > 0) {
      fnv1a_bytes(r.digest, lg, sizeof(float) * static_cast<std::size_t>(n_vocab));
      ++r.digested;
    }
    float mx = lg[0];
    for (int i = 1; i < n_vocab; ++i) mx = std::max(mx, lg[i]);
    double sum = 0;
    for (int i = 0; i < n_vocab; ++i) sum += p[static_cast<std::size_t>(i)] = std::exp(double(lg[i]) - mx);
    double target = u(gen) * sum;
    llama_token next = n_vocab - 1;
    for (int i = 0; i < n_vocab; ++i)
      if ((target -= p[static_cast<std::size_t>(i)]) <= 0) {
        next = i;
        break;
      }
    r.decode_s += timed(llama_batch_get_one(&next, 1), step + 1, false);
  }
  const float* lg = llama_get_logits_ith(ctx, -1);
  fnv1a_bytes(r.digest, lg, sizeof(float) * static_cast<std::size_t>(n_vocab));
  ++r.digested;
  r.mapping = proc_mapping();
  return r;
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(pos);
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

/// The digest line, the decode summary and --per-token-csv. read_bytes is the
/// process's own counter unless it read 0 over the whole run while the
/// cgroup's did not (task I/O accounting off): then the cgroup's, and the
/// summary says so.
void report_run(const probe_args& a, const run_result& r) {
  std::printf("logits: fnv1a64 %016llx over %zu tokens\n", static_cast<unsigned long long>(r.digest), r.digested);
  if (r.mapping.rss != 0)
    std::printf(
        "mapping: %.1f MiB of the process's %.1f MiB resident mapped by 2 MiB pages (FilePmdMapped), "
        "at the end of the decode\n",
        static_cast<double>(r.mapping.file_pmd_mapped) / 1024.0, static_cast<double>(r.mapping.rss) / 1024.0);
  if (r.rows.empty()) return;
  std::uint64_t proc = 0, cg = 0;
  for (const auto& t : r.rows) {
    proc += t.read_bytes;
    cg += t.cgroup_read_bytes;
  }
  const bool use_cgroup = proc == 0 && cg != 0;
  std::vector<double> ms;
  std::uint64_t majflt = 0, engine_majflt = 0, bytes = 0;
  for (const auto& t : r.rows)
    if (!t.prompt) {
      ms.push_back(t.wall_ms);
      majflt += t.majflt;
      engine_majflt += t.engine_majflt;
      bytes += use_cgroup ? t.cgroup_read_bytes : t.read_bytes;
    }
  const double n = static_cast<double>(ms.size());
  std::printf(
      "decode: %zu tokens, %.3f tok/s, p50 %.1f ms, p90 %.1f ms, %.2f major faults/token "
      "(%.2f in the engine's threads), %.2f MiB read/token (%s)\n",
      ms.size(), r.decode_s > 0 ? n / r.decode_s : 0.0, percentile(ms, 0.5), percentile(ms, 0.9),
      static_cast<double>(majflt) / n, static_cast<double>(engine_majflt) / n, to_mib(bytes) / n,
      use_cgroup ? "the cgroup's I/O statistics" : "the process's read_bytes");
  if (!a.metrics_csv.empty()) {
    // The phone's metrics format, the columns this machine can measure (docs/wall-clock.md,
    // "Against this machine"): one row per decode token; compute_ms = cpu_ms = the eval
    // thread's CPU time in the call (llama.cpp with --threads 1 computes on it; it includes
    // the observer's and the manager's work on that thread and the kernel's fault handling);
    // stall_ms = wall_ms - cpu_ms, the eval thread off the CPU (waiting for faults or the
    // manager's reads, or descheduled); io_ms and mgmt_ms are not measured here.
    std::ofstream m(a.metrics_csv);
    if (!m) throw error("--metrics-csv: cannot write '" + a.metrics_csv + "'");
    m << "step,steps,wall_ms,compute_ms,read_bytes,cache_hit_pct,stall_ms,majflt,cpu_ms,sys_ms\n";
    std::size_t step = 0;
    const std::size_t steps = ms.size();
    char line[512];
    for (const auto& t : r.rows) {
      if (t.prompt) continue;
      char hit[32] = "";
      if (t.hit_pct >= 0) std::snprintf(hit, sizeof hit, "%.2f", t.hit_pct);
      std::snprintf(line, sizeof line, "%zu,%zu,%.3f,%.3f,%llu,%s,%.3f,%llu,%.3f,%.3f\n", ++step, steps, t.wall_ms,
                    t.cpu_ms, static_cast<unsigned long long>(use_cgroup ? t.cgroup_read_bytes : t.read_bytes), hit,
                    std::max(0.0, t.wall_ms - t.cpu_ms), static_cast<unsigned long long>(t.majflt), t.cpu_ms, t.sys_ms);
      m << line;
    }
    if (!m) throw error("--metrics-csv: writing '" + a.metrics_csv + "' failed");
  }
  if (a.per_token_csv.empty()) return;
  std::ofstream out(a.per_token_csv);
  if (!out) throw error("--per-token-csv: cannot write '" + a.per_token_csv + "'");
  out << "token,phase,wall_ms,majflt,minflt,read_bytes,prefetch_issued,prefetch_useful,prefetch_late,"
         "pinned_mib,hit_pct,engine_majflt,proc_cpu_ms,proc_sys_ms,read_wait_ms,read_waits\n";
  char line[512];
  for (const auto& t : r.rows) {
    char hit[32] = "";
    if (t.hit_pct >= 0) std::snprintf(hit, sizeof hit, "%.2f", t.hit_pct);
    std::snprintf(line, sizeof line, "%zu,%s,%.3f,%llu,%llu,%llu,%llu,%llu,%llu,%.1f,%s,%llu,%.3f,%.3f,%.3f,%llu\n",
                  t.token, t.prompt ? "prompt" : "decode", t.wall_ms, static_cast<unsigned long long>(t.majflt),
                  static_cast<unsigned long long>(t.minflt),
                  static_cast<unsigned long long>(use_cgroup ? t.cgroup_read_bytes : t.read_bytes),
                  static_cast<unsigned long long>(t.prefetch_issued),
                  static_cast<unsigned long long>(t.prefetch_useful), static_cast<unsigned long long>(t.prefetch_late),
                  t.pinned_mib, hit, static_cast<unsigned long long>(t.engine_majflt), t.proc_cpu_ms, t.proc_sys_ms,
                  t.read_wait_ms, static_cast<unsigned long long>(t.read_waits));
    out << line;
  }
  if (!out) throw error("--per-token-csv: writing '" + a.per_token_csv + "' failed");
}

/// --residency LIST (dense, exact, predicted, cache; all; none) and the rest
/// of the manager's options. Returns false for none.
bool residency_options_from(const probe_args& a, mrl::residency_options& o) {
  const bool any = mrl::parse_residency_parts(a.residency, o);
  (void)mrl::live_cache_policy(a.policy);  // refused before the model loads
  if (a.policy_given && !o.cache)
    throw error("--policy " + a.policy + " with --residency " + a.residency +
                ": the policy is the cache's, and the cache is not on; expected --residency all or a list with cache");
  if (a.residency_budget != "auto") {
    o.cache_budget_bytes =
        from_mib(moe_residency::detail::parse_real(a.residency_budget, "--residency-budget (auto, or MiB)",
                                                   moe_residency::detail::real_domain::open_closed(0, 1e9)));
  }
  o.lanes = a.lanes;
  o.overlap = !a.serial;
  o.owned_reads = a.owned_reads;
  o.pool = a.pool;
  o.spec_cap = a.spec_cap;
  o.measure = !a.no_hit_measure;  // the page cache's hit rate at routing: the per-token hit_pct
  o.fits = a.when_fits == "act" ? mrl::when_fits::act : mrl::when_fits::stand_down;  // its validator took only these
  o.validate();
  return any;
}

int probe(const probe_args& a) {
  if (a.model_path.empty() == a.random_arch.empty())
    throw error("give exactly one of --model FILE.gguf and --random ARCH");
  if (a.decode == 0) throw error("--decode: 0; expected at least 1 decode token");
  mrl::residency_options ro;
  const bool managed = residency_options_from(a, ro);
  if (managed && a.no_observer) throw error("--residency needs the observer; drop --no-observer");
  if (managed && a.model_path.empty() && a.save_model.empty())
    throw error("--residency manages a memory-mapped file: give --model FILE, or --random with --save-model FILE");
  if (a.save_only && (a.random_arch.empty() || a.save_model.empty()))
    throw error("--save-only needs --random ARCH and --save-model FILE");
  llama_log_set(
      [](ggml_log_level level, const char* text, void*) {
        if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) std::fputs(text, stderr);
      },
      nullptr);
  llama_backend_init();

  // The model: from a file (mmap), or random weights — streamed to a GGUF file
  // and loaded from it (mmap) when a file is wanted, else built in memory.
  mre::model_ptr model;
  std::string gguf_path = a.model_path;
  mre::random_model_spec spec = a.spec;
  if (!a.random_arch.empty()) {
    if (!a.shape_from.empty()) {
      // The trace's shape; the pool, the seed and the vocabulary kind stay as given.
      const mre::trace_shape ts = mre::shape_from_trace(load_trace(a.shape_from, a.trace_layers).header());
      const std::uint32_t pool = spec.expert_pool;
      const std::uint64_t seed = spec.seed;
      const bool text_vocab = spec.text_vocab;
      spec = ts.spec;
      spec.expert_pool = pool;
      spec.seed = seed;
      spec.text_vocab = text_vocab;
      std::printf("shape from %s%s: %s, %u layers x %u experts, top-%u, embedding %u, expert width %u\n",
                  a.shape_from.c_str(),
                  a.trace_layers ? (" (first " + std::to_string(a.trace_layers) + " layers)").c_str() : "",
                  spec.arch.c_str(), spec.n_layer, spec.n_expert, spec.n_expert_used, spec.n_embd, spec.n_ff_exp);
      for (const std::string& n : ts.notes) std::printf("shape note: %s\n", n.c_str());
      if (a.random_arch != spec.arch)
        throw std::invalid_argument("--shape-from " + a.shape_from + " is built as a " + spec.arch +
                                    " model; --random is " + a.random_arch);
    } else if (!a.shape.empty()) {
      // The shape's every field; the pool and the seed stay as given.
      const std::uint32_t pool = spec.expert_pool;
      const std::uint64_t seed = spec.seed;
      const bool text_vocab = spec.text_vocab;
      spec = mre::shape_by_name(a.shape);
      spec.expert_pool = pool;
      spec.seed = seed;
      spec.text_vocab = text_vocab;
      if (a.random_arch != spec.arch)
        throw std::invalid_argument("--shape " + a.shape + " is a " + spec.arch + " model; --random is " +
                                    a.random_arch);
    } else {
      spec.router_type = mre::parse_router_type(a.router);
      // One type, or a comma list of one per layer.
      spec.layer_expert_types.clear();
      for (std::size_t at = 0;;) {
        const std::size_t comma = a.expert_type.find(',', at);
        spec.layer_expert_types.push_back(mre::parse_expert_type(a.expert_type.substr(at, comma - at)));
        if (comma == std::string::npos) break;
        at = comma + 1;
      }
      spec.expert_type = spec.layer_expert_types.front();
      if (spec.layer_expert_types.size() == 1) spec.layer_expert_types.clear();
      spec.dense_type = mre::parse_expert_type(a.dense_type);
    }
    spec.arch = a.random_arch;
    if (!a.save_model.empty() || !a.trace_out.empty() || !a.warm.empty() || a.save_only) {
      gguf_path = !a.save_model.empty() ? a.save_model : std::string("moe-llama-probe-random.gguf");
      const auto t0 = std::chrono::steady_clock::now();
      int last = -1;
      const bool tty = isatty(fileno(stderr)) != 0;
      mre::save_random_gguf(
          spec, gguf_path,
          [&](std::uint64_t done, std::uint64_t total) {
            // A bar redrawn in place on a terminal (every 1%), a line every 10% otherwise.
            const int pct = total ? static_cast<int>(100 * done / total) : 100;
            if (pct == last || (!tty && pct / 10 == last / 10 && pct != 100)) return;
            last = pct;
            const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            const double rate = s > 0 ? to_mib(done) / s : 0.0;
            char bar[41];
            for (int i = 0; i < 40; ++i) bar[i] = i < pct * 40 / 100 ? '#' : '.';
            bar[40] = '\0';
            std::fprintf(stderr, "%smoe-llama-probe: writing %s [%s] %3d%% %.0f / %.0f MiB, %.0f MiB/s, %.0f s left%s",
                         tty ? "\r" : "", gguf_path.c_str(), bar, pct, to_mib(done), to_mib(total), rate,
                         rate > 0 ? (to_mib(total) - to_mib(done)) / rate : 0.0, tty && pct < 100 ? "" : "\n");
          },
          a.splits);
      if (a.save_only) {
        std::uint64_t bytes = 0;
        if (!a.shape_from.empty()) std::fflush(stdout);
        const mrl::gguf_expert_map saved = mrl::gguf_expert_map::by_name(gguf_path);
        for (const std::string& p : saved.paths()) {
          std::ifstream f(p, std::ios::binary | std::ios::ate);
          bytes += static_cast<std::uint64_t>(f.tellg());
        }
        const char* experts = spec.arch == "qwen3"              ? "none (dense)"
                              : !a.shape_from.empty()           ? "as the trace's bytes"
                              : spec.layer_expert_types.empty() ? ggml_type_name(spec.expert_type)
                                                                : a.expert_type.c_str();
        std::printf("saved: %s%s, %.1f MiB, experts %s, in %.1f s\n", gguf_path.c_str(),
                    a.splits > 1 ? (" and its other " + std::to_string(a.splits - 1) + " splits").c_str() : "",
                    to_mib(bytes), experts,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        return 0;
      }
    }
  }
  if (!gguf_path.empty()) {
    llama_model_params mp = llama_model_default_params();
    // No "extra" CPU buffer types: with them, llama.cpp's CPU backend repacks
    // quantised weights (Q4_K, Q8_0, … into interleaved layouts for its GEMM
    // kernels) by copying them out of the mapping into anonymous memory at
    // load. The experts would then no longer be the file's pages — nothing to
    // page in, prefetch or pin, and a model larger than memory could not load.
    mp.use_extra_bufts = false;
    mp.load_mode = LLAMA_LOAD_MODE_MMAP;
    if (a.load_mode == "no-mmap") mp.load_mode = LLAMA_LOAD_MODE_NONE;
    if (a.load_mode == "mlock") mp.load_mode = LLAMA_LOAD_MODE_MMAP_MLOCK;
    if (a.load_mode == "direct-io") mp.load_mode = LLAMA_LOAD_MODE_DIRECT_IO;
    if (a.load_mode != "mmap" && (a.residency != "off" || !a.no_observer))
      throw error("--load-mode " + a.load_mode + " is a stock baseline: it needs --no-observer and no --residency");
    model.reset(llama_model_load_from_file(gguf_path.c_str(), mp));
    if (!model) throw error("--model: llama.cpp could not load '" + gguf_path + "'");
  } else {
    model = mre::make_random_model(spec);
  }
  char desc[256];
  llama_model_desc(model.get(), desc, sizeof desc);
  // Real routing: the trace's, forced at every MoE layer's routing node.
  std::unique_ptr<validated_route_trace> route_trace_in;
  std::unique_ptr<mrl::forced_routing> routes;
  probe_args sized = a;
  if (!a.route_from.empty()) {
    route_trace_in = std::make_unique<validated_route_trace>(load_trace(a.route_from, a.trace_layers));
    routes = std::make_unique<mrl::forced_routing>(*route_trace_in, a.route_from);
    // The trace's prompt and decode lengths, unless given.
    if (!a.tokens_given && a.prompt.empty() && routes->prefill_tokens() > 0) sized.tokens = routes->prefill_tokens();
    if (!a.decode_given) sized.decode = routes->decode_tokens();
  }
  const std::vector<llama_token> prompt = prompt_tokens(sized, model.get());
  const std::size_t n_total = prompt.size() + a.decode;

  if (a.no_observer) {
    // Plain llama.cpp: no callback at all (with --route-from, only the
    // observer's forcing: one graph split a MoE layer, no sink); the same
    // warm-up token as below.
    llama_context_params cp = context_params(sized, n_total);
    std::unique_ptr<mrl::observer> forcing;
    if (routes) {
      forcing = std::make_unique<mrl::observer>(model.get());
      forcing->install(cp);
      forcing->force_routing(routes.get());
    }
    context_ptr ctx(llama_init_from_model(model.get(), cp));
    if (!ctx) throw error("llama_init_from_model failed");
    llama_token t0 = prompt.front();
    if (llama_decode(ctx.get(), llama_batch_get_one(&t0, 1)) != 0) throw error("warm-up decode failed");
    llama_memory_clear(llama_get_memory(ctx.get()), true);
    if (forcing) {
      forcing->set_position(0);
      routes->reset_stats();
    }
    const run_result r = run(ctx.get(), model.get(), prompt, sized.decode, a.seed, true);
    std::printf("model: %s, no observer%s\nrun: %zu prompt tokens, %zu decoded\n", desc,
                routes ? " (routing forced)" : "", prompt.size(), sized.decode);
    if (routes) std::printf("%s\n", routes->note().c_str());
    report_run(a, r);
    return 0;
  }

  // The observer; one warm-up token teaches it the graph (the routers, each
  // layer's spec, the expert tensors) before the session is built.
  mrl::observer obs(model.get());
  llama_context_params cp = context_params(sized, n_total);
  obs.install(cp);
  if (routes) obs.force_routing(routes.get());  // from the warm-up on: every graph routes as the trace
  context_ptr ctx(llama_init_from_model(model.get(), cp));
  if (!ctx) throw error("llama_init_from_model failed");
  mrl::warm_up(ctx.get(), obs, "'" + std::string(desc) + "'", prompt.front());
  const model_shape shape = obs.shape();
  if (routes) {
    routes->check_layers(shape);
    routes->reset_stats();
  }

  session_options so;
  so.on_anomaly = anomaly_action::count;
  probe_session s(shape, so);
  const std::size_t n_routers = mrl::configure_routers(s, obs);

  std::uint64_t budget = from_mib(a.budget_mib);
  if (budget == 0) {
    std::uint64_t all = 0;
    for (std::size_t l = 0; l < shape.n_layers(); ++l)
      all += shape.expert_bytes(layer_id(static_cast<std::uint16_t>(l))) * shape.n_experts();
    budget = all / 2;
  }
  mrl::route_recorder<lru_policy> rec(shape, budget);

  // The trace header's model: the file, or the random model's general.name (no spaces).
  std::string label = !a.model_path.empty() ? a.model_path : !obs.model_name().empty() ? obs.model_name() : obs.arch();
  for (char& c : label)
    if (c == ' ' || c == '\t') c = '_';
  std::unique_ptr<mrl::gguf_expert_map> map;
  std::unique_ptr<mrl::gguf_expert_reader> reader;
  std::uint64_t failed_reads = 0;
  double read_s = 0;
  if (!gguf_path.empty()) {
    map = std::make_unique<mrl::gguf_expert_map>(gguf_path, obs);
    rec.describe(label, obs.arch(), mrl::gguf_dense_bytes(gguf_path, *map, shape.n_layers()));
    if (!a.warm.empty()) {
      reader = std::make_unique<mrl::gguf_expert_reader>(
          *map, a.warm == "pread" ? mrl::gguf_expert_reader::mode::pread : mrl::gguf_expert_reader::mode::fadvise);
      rec.on_miss([&](layer_id l, expert_id e) {
        const auto t0 = std::chrono::steady_clock::now();
        if (!reader->read(l, e)) ++failed_reads;
        read_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      });
    }
  } else {
    rec.describe(label, obs.arch(), std::vector<std::uint64_t>(shape.n_layers(), 0));
  }
  mrl::session_sink<probe_session> sink(s, &rec);
  const std::vector<std::string> engine = current_threads();  // before the manager's lanes
  std::unique_ptr<residency_manager> res;
  // --predictor oracle:P[,PROFILE]: the trace's next layer at accuracy P, the replay's draws.
  std::unique_ptr<mrl::trace_oracle> oracle;
  mrl::stale_gate_ranking stale;
  std::unique_ptr<mre::degraded_ranking> degraded;
  if (a.degrade > 0 && !ro.predicted)
    throw error("--degrade " + std::to_string(a.degrade) +
                " degrades the predicted reads' rankings; expected --residency all or a list with predicted");
  if (a.predictor.rfind("oracle:", 0) == 0) {
    if (!ro.predicted)
      throw error("--predictor " + a.predictor +
                  " plans predicted reads; expected --residency all or a list with predicted");
    std::string p = a.predictor.substr(7), profile_file;
    if (const auto comma = p.find(','); comma != std::string::npos) {
      profile_file = p.substr(comma + 1);
      p = p.substr(0, comma);
    }
    const double acc = moe_residency::detail::parse_real(p, "--predictor oracle:P: P",
                                                         moe_residency::detail::real_domain::closed(0, 1));
    std::vector<double> profile;
    if (!profile_file.empty()) {
      std::ifstream in(profile_file);
      if (!in) throw error("--predictor " + a.predictor + ": cannot read the profile '" + profile_file + "'");
      std::stringstream text;
      text << in.rdbuf();
      profile = parse_oracle_profile(text.str(), "--predictor: " + profile_file, routes->shape().n_layers());
    }
    oracle = std::make_unique<mrl::trace_oracle>(*routes, acc, profile, a.oracle_seed);
  }
  if (managed) {
    // Acts at each layer's routing, then hands every event on to the session.
    res = mrl::make_residency_manager(a.policy, obs, gguf_path, ro, nullptr, &sink);
    // --degrade: the predictor's rankings with a seeded share of wrong slots (a lab instrument).
    if (ro.predicted && a.degrade > 0) {
      if (!oracle) stale.init(obs, shape, ro.horizon);
      degraded = std::make_unique<mre::degraded_ranking>(oracle ? static_cast<mrl::routing_predictor&>(*oracle) : stale,
                                                         shape.top_k(), shape.n_experts(), a.degrade, a.seed);
      res->set_predictor(degraded.get());
    } else if (oracle) {
      res->set_predictor(oracle.get());
    }
    res->activate();  // now, so a refusal (locking limit, budget) stops the run with its figures
    obs.set_sink(res.get());
  } else {
    obs.set_sink(&sink);
  }

  const run_result observed = run(ctx.get(), model.get(), prompt, sized.decode, a.seed, true, res.get(), engine);
  const double observed_s = observed.decode_s;

  std::size_t first_moe = 0;
  while (!shape.is_moe(layer_id(static_cast<std::uint16_t>(first_moe)))) ++first_moe;
  std::printf("model: %s (%s), %zu layers (%zu MoE), %zu experts, top-%zu, router %s\n", desc, obs.arch().c_str(),
              shape.n_layers(), shape.n_moe_layers(), shape.n_experts(), shape.top_k(),
              to_string(obs.layers()[first_moe].router.type));
  std::printf("run: %zu prompt tokens, %zu decoded; %zu routers configured\n\n", prompt.size(), sized.decode,
              n_routers);
  if (routes)
    std::printf(
        "%s\nnote: the routing is the trace's, not the model's: the fresh-gate control and the predictors are "
        "scored against the trace's routing, which the random model's routers do not compute\n\n",
        routes->note().c_str());
  std::fputs(format_text(s.report()).c_str(), stdout);
  std::printf("\n%s\n", rec.cache_line().c_str());
  if (!rec.warning().empty()) std::printf("note: %s\n", rec.warning().c_str());
  if (reader)
    std::printf("warm (%s): %llu expert reads, %.1f MiB from %s in %.3f s, %llu failed\n", a.warm.c_str(),
                static_cast<unsigned long long>(reader->reads()), to_mib(reader->bytes_read()), gguf_path.c_str(),
                read_s, static_cast<unsigned long long>(failed_reads));
  const auto& st = obs.stats();
  std::printf(
      "observer: %llu graphs, %llu layer batches, %llu partial (output rows only, sent), "
      "%llu not sent, %llu unreadable, %llu unsupported, %llu exceptions%s%s\n",
      static_cast<unsigned long long>(st.graphs), static_cast<unsigned long long>(st.layer_batches),
      static_cast<unsigned long long>(sink.partial_layers()), static_cast<unsigned long long>(sink.bad_layers()),
      static_cast<unsigned long long>(st.unreadable), static_cast<unsigned long long>(st.unsupported),
      static_cast<unsigned long long>(st.exceptions), st.exceptions ? "; last: " : "",
      st.exceptions ? obs.last_error() : "");
  if (st.metadata_mismatches)
    std::printf("note: %llu layers' GGUF keys disagree with the graph (the graph is used); first: %s\n",
                static_cast<unsigned long long>(st.metadata_mismatches), obs.metadata_note().c_str());

  if (res) {
    std::printf("%s\n", res->summary().c_str());
    if (!res->budget_note().empty()) std::printf("residency budget: %s\n", res->budget_note().c_str());
  }
  report_run(a, observed);

  if (!a.trace_out.empty()) {
    std::ofstream out(a.trace_out);
    if (!out) throw error("--trace-out: cannot write '" + a.trace_out + "'");
    write_route_trace_csv(rec.trace(), out);
    std::printf("trace: %zu rows written to %s\n", rec.trace().rows.size(), a.trace_out.c_str());
  }

  if (a.cost) {
    // Decode time without any callback, with the callback installed but no
    // sink (structure only), and observed with a fresh session; rounds
    // alternate and the fastest of each is kept (the machine is shared).
    context_ptr plain(llama_init_from_model(model.get(), context_params(a, n_total)));
    if (!plain) throw error("llama_init_from_model failed");
    struct null_sink : mrl::observer_sink {
      void on_layer_loaded(const mrl::layer_batch&) override {}
    } nothing;
    double plain_s = 1e300, idle_s = 1e300, split_s = 1e300, observed_best = 1e300;
    for (int round = 0; round < a.cost_rounds; ++round) {
      llama_memory_clear(llama_get_memory(plain.get()), true);
      plain_s = std::min(plain_s, run(plain.get(), model.get(), prompt, a.decode, a.seed).decode_s);
      llama_memory_clear(llama_get_memory(ctx.get()), true);
      obs.set_position(0);
      obs.set_sink(nullptr);
      idle_s = std::min(idle_s, run(ctx.get(), model.get(), prompt, a.decode, a.seed).decode_s);
      llama_memory_clear(llama_get_memory(ctx.get()), true);
      obs.set_position(0);
      obs.set_sink(&nothing);
      split_s = std::min(split_s, run(ctx.get(), model.get(), prompt, a.decode, a.seed).decode_s);
      llama_memory_clear(llama_get_memory(ctx.get()), true);
      obs.set_position(0);
      probe_session s2(shape, so);
      mrl::configure_routers(s2, obs);
      mrl::session_sink<probe_session> sink2(s2);
      obs.set_sink(&sink2);
      observed_best = std::min(observed_best, run(ctx.get(), model.get(), prompt, a.decode, a.seed).decode_s);
      obs.set_sink(nullptr);
    }
    const double n = static_cast<double>(a.decode);
    std::printf(
        "cost (fastest of %d rounds, decode only, ms/token): plain %.3f; callback asking "
        "nothing %.3f (x%.3f); one split per MoE layer, empty sink %.3f (x%.3f); "
        "observed with the session %.3f (x%.3f)\n",
        a.cost_rounds, 1e3 * plain_s / n, 1e3 * idle_s / n, idle_s / plain_s, 1e3 * split_s / n, split_s / plain_s,
        1e3 * observed_best / n, observed_best / plain_s);
    std::printf("      the first observed run, with trace, cache%s: %.3f ms/token\n", reader ? " and reads" : "",
                1e3 * observed_s / n);
  }
  obs.set_sink(nullptr);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  namespace opt = moe_residency_cli;  // checked_options.hpp: the numbers every option takes
  using moe_residency::detail::real_domain;
  probe_args a;
  CLI::App app{"moe-llama-probe: observe llama.cpp's MoE routing, score predictors, replay a cache"};
  app.add_option("--model", a.model_path, "A GGUF model file (loaded with mmap)");
  app.add_option("--random", a.random_arch,
                 "A random-weight model of this architecture: qwen3moe, deepseek2, gpt-oss; qwen3 (dense, no experts: "
                 "for --save-only)");
  app.add_option("--layers", a.spec.n_layer, "Random model: layers")->check(opt::whole(2, 4096))->capture_default_str();
  app.add_option("--experts", a.spec.n_expert, "Random model: experts per layer")
      ->check(opt::whole(1, 65536))
      ->capture_default_str();
  app.add_option("--k", a.spec.n_expert_used, "Random model: experts used per token")
      ->check(opt::whole(1, 32))
      ->capture_default_str();
  app.add_option("--embd", a.spec.n_embd, "Random model: embedding length (multiple of 64)")
      ->check(opt::whole(64, 1 << 20))
      ->capture_default_str();
  app.add_option("--expert-ff", a.spec.n_ff_exp, "Random model: width of one expert")
      ->check(opt::whole(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--router", a.router, "Random model: router type f32, f16 or bf16")->capture_default_str();
  app.add_option("--prompt", a.prompt, "Prompt text (needs a model with a vocabulary)");
  app.add_option("--tokens", a.tokens, "Prompt length in random tokens when no --prompt")
      ->check(opt::whole(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--decode", a.decode, "Tokens to decode after the prompt")
      ->check(opt::whole(0, 1 << 20))
      ->capture_default_str();
  app.add_option("--budget-mib", a.budget_mib, "LRU cache budget in MiB (default: half of all experts)")
      ->check(opt::real(real_domain::open_closed(0, 1e12)));
  app.add_option("--trace-out", a.trace_out, "Write the route trace (route_trace v1 CSV)");
  app.add_option("--warm", a.warm, "Read every missed expert from the GGUF file: pread or fadvise")
      ->check(opt::one_of({"pread", "fadvise"}));
  app.add_option("--save-model", a.save_model,
                 "Random model: stream it to this GGUF file (never held in memory) and run it from the file (mmap)");
  app.add_flag("--save-only", a.save_only, "Random model: write --save-model and exit");
  app.add_option("--splits", a.splits,
                 "Random model: write --save-model as N splits, as llama.cpp's gguf-split names them "
                 "(--save-model must end in -00001-of-0000N.gguf)")
      ->check(opt::whole(1, 99))
      ->capture_default_str();
  app.add_flag("--text-vocab", a.spec.text_vocab,
               "Random model: a text vocabulary (SentencePiece, byte tokens), so --prompt text tokenizes (needs "
               "--vocab >= 512)");
  app.add_option("--expert-type", a.expert_type,
                 "Random model: expert weights f32, f16, bf16, q8_0 or q4_K (quantised ones from a pool; see "
                 "random_model.hpp); "
                 "or a comma list, one type per layer")
      ->capture_default_str();
  app.add_option("--dense-type", a.dense_type,
                 "Random model: 2-D dense weights (attention, embedding, output) f32, or quantised (rows from a pool)")
      ->capture_default_str();
  app.add_option("--heads", a.spec.n_head, "Random model: attention query heads (0: embedding / 64)")
      ->check(opt::whole(0, 1 << 16))
      ->capture_default_str();
  app.add_option("--heads-kv", a.spec.n_head_kv, "Random model: attention key/value heads")
      ->check(opt::whole(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--head-dim", a.spec.head_dim, "Random model: width of one attention head")
      ->check(opt::whole(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--vocab", a.spec.n_vocab, "Random model: vocabulary size")
      ->check(opt::whole(1, 1 << 24))
      ->capture_default_str();
  app.add_option(
         "--shape", a.shape,
         "Random model: a real model's shape, every size above taken from it: qwen3-30b-a3b, qwen3-30b-a3b-half")
      ->excludes("--layers")
      ->excludes("--experts")
      ->excludes("--k")
      ->excludes("--embd")
      ->excludes("--expert-ff")
      ->excludes("--dense-type")
      ->excludes("--expert-type")
      ->excludes("--heads")
      ->excludes("--heads-kv")
      ->excludes("--head-dim")
      ->excludes("--vocab")
      ->excludes("--router");
  app.add_option("--shape-from", a.shape_from,
                 "Random model: a recorded route trace's shape (its layers, experts, top-k, every layer's expert "
                 "bytes; dense bytes as near as types allow; trace_shape.hpp); implies --random of its architecture")
      ->excludes("--shape")
      ->excludes("--layers")
      ->excludes("--experts")
      ->excludes("--k")
      ->excludes("--embd")
      ->excludes("--expert-ff")
      ->excludes("--dense-type")
      ->excludes("--expert-type")
      ->excludes("--heads")
      ->excludes("--heads-kv")
      ->excludes("--head-dim")
      ->excludes("--vocab")
      ->excludes("--router");
  app.add_option("--route-from", a.route_from,
                 "Route every MoE layer as this recorded trace did (forced_routing.hpp): prompt tokens take its "
                 "prompt routings, decode tokens its decode routings in order (cycling past its end); the model must "
                 "have its MoE shape. Prompt and decode lengths default to the trace's");
  app.add_option("--trace-layers", a.trace_layers,
                 "Only the first N layers of --route-from's and --shape-from's trace (a model cut to fit a disk)")
      ->check(opt::whole(1, 65535));
  app.add_option("--predictor", a.predictor,
                 "Residency: what predicted reads are planned from: stale-gate, or oracle:P[,PROFILE] (needs "
                 "--route-from: the trace's next layer, each slot kept with probability P, or per layer from "
                 "PROFILE; the replay's --speculate oracle:P draws)")
      ->capture_default_str();
  app.add_option("--oracle-seed", a.oracle_seed, "Residency: seed of --predictor oracle's draws (the replay's --seed)")
      ->check(opt::whole())
      ->capture_default_str();
  app.add_option("--expert-pool", a.spec.expert_pool, "Random model: distinct quantised experts per kind")
      ->check(opt::whole(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--load-mode", a.load_mode,
                 "How llama.cpp loads --model: mmap (default), or a stock baseline: no-mmap (read into memory), "
                 "mlock (mmap and lock it all), direct-io (O_DIRECT reads into memory)")
      ->check(CLI::IsMember({"mmap", "no-mmap", "mlock", "direct-io"}))
      ->capture_default_str();
  app.add_flag("--no-observer", a.no_observer,
               "Plain llama.cpp: no observer, no report; only the run's digest, summary and --per-token-csv");
  app.add_option("--residency", a.residency,
                 "Residency manager parts: all, off, or a comma list of dense, exact, predicted, cache")
      ->capture_default_str();
  app.add_option("--policy", a.policy, "Residency: the expert cache's policy: " + mrl::live_cache_policy_names())
      ->capture_default_str();
  app.add_option("--residency-budget", a.residency_budget,
                 "Pinned expert cache budget in MiB, or auto (from the memory limit)")
      ->capture_default_str();
  app.add_option("--lanes", a.lanes, "Residency: read lanes")->check(opt::whole(0, 64))->capture_default_str();
  app.add_flag("--serial", a.serial,
               "Residency: the eval thread waits for every read of a layer before its matmuls (no overlap)");
  app.add_flag("--owned-reads", a.owned_reads,
               "Residency: the lanes read each miss themselves (sendfile into the page cache, exact ranges), "
               "not the eval thread's willneed of every miss and populate_read on the lanes");
  app.add_flag(
      "--pool", a.pool,
      "Residency: the cache's experts in an expert pool the manager owns (read past the page cache with "
      "O_DIRECT into memory allocated once, mapped over the expert's pages), not locked page cache; needs cache");
  app.add_option("--spec-cap", a.spec_cap, "Residency: predicted reads per layer at most")
      ->check(opt::whole(0, 32))
      ->capture_default_str();
  app.add_option("--degrade", a.degrade,
                 "Residency: share of predicted slots replaced by a wrong expert (seeded by --seed)")
      ->check(opt::real(real_domain::closed(0, 1)))
      ->capture_default_str();
  app.add_flag("--no-hit-measure", a.no_hit_measure,
               "Residency: no mincore of the routed experts at each routing (hit_pct stays empty)");
  app.add_option("--residency-when-fits", a.when_fits,
                 "Residency: stand-down (nothing advised when the model fits the memory limit) or act "
                 "(manage it anyway: what the manager costs a token when every routed expert is resident)")
      ->check(opt::one_of({"stand-down", "act"}))
      ->capture_default_str();
  app.add_option(
      "--per-token-csv", a.per_token_csv,
      "Write one row per llama_decode call: token,phase,wall_ms,majflt,minflt,read_bytes,"
      "prefetch_issued,prefetch_useful,prefetch_late,pinned_mib,hit_pct,engine_majflt,proc_cpu_ms,proc_sys_ms,"
      "read_wait_ms,read_waits (proc_*: every thread of the process; read_wait*: the eval thread waiting "
      "for the manager's demanded reads, and the layers it had to)");
  app.add_option("--metrics-csv", a.metrics_csv,
                 "Write one row per decode token in the phone's metrics format for moe-residency calibrate: "
                 "step,steps,wall_ms,compute_ms,read_bytes,cache_hit_pct,stall_ms,majflt,cpu_ms,sys_ms "
                 "(cpu_ms: the eval thread's CPU time; sys_ms: the part of it in the kernel; "
                 "stall_ms = wall_ms - cpu_ms)");
  app.add_option("--threads", a.threads, "llama.cpp threads")->check(opt::whole(1, 1024))->capture_default_str();
  app.add_option("--seed", a.seed, "Seed of the prompt and of the sampler")->check(opt::whole())->capture_default_str();
  app.add_flag("--cost", a.cost, "Also measure decode time without and with the observer (ratio)");
  app.add_option("--cost-rounds", a.cost_rounds, "Rounds of the --cost measurement")
      ->check(opt::whole(1, 1000))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  a.policy_given = app.count("--policy") != 0;
  a.tokens_given = app.count("--tokens") != 0;
  a.decode_given = app.count("--decode") != 0;
  if (!a.shape_from.empty() && a.random_arch.empty()) {
    // --shape-from implies --random of the architecture the trace is built as.
    try {
      a.random_arch = mre::random_arch_for(load_trace(a.shape_from, a.trace_layers).header().arch);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "moe-llama-probe: %s\n", e.what());
      return 1;
    }
  }
  try {
    // An option that acts only with another is an error naming both, not ignored.
    auto needs = [&app](std::initializer_list<const char*> options, bool with, const char* other) {
      for (const char* o : options)
        if (app.count(o) != 0 && !with)
          throw error(std::string(o) + " has no effect without " + other + "; give " + other + ", or drop " + o);
    };
    needs({"--layers", "--experts", "--k", "--embd", "--expert-ff", "--router", "--heads", "--heads-kv", "--head-dim",
           "--vocab", "--shape", "--expert-pool", "--expert-type", "--dense-type", "--text-vocab", "--save-model",
           "--splits"},
          !a.random_arch.empty(), "--random (they shape a random-weight model)");
    needs({"--residency-budget", "--policy", "--lanes", "--serial", "--owned-reads", "--pool", "--spec-cap",
           "--degrade", "--no-hit-measure", "--residency-when-fits"},
          a.residency != "off", "--residency (the manager's parts)");
    if (app.count("--tokens") != 0 && !a.prompt.empty())
      throw error("--tokens and --prompt: --tokens sizes a random prompt, --prompt gives the text; give one of them");
    needs({"--cost-rounds"}, a.cost, "--cost");
    needs({"--trace-layers"}, !a.route_from.empty() || !a.shape_from.empty(), "--route-from or --shape-from");
    needs({"--predictor", "--oracle-seed"}, a.residency != "off", "--residency (the manager's parts)");
    if (a.predictor != "stale-gate" && a.predictor.rfind("oracle:", 0) != 0)
      throw error("--predictor: '" + a.predictor + "'; expected stale-gate or oracle:P[,PROFILE]");
    if (a.predictor.rfind("oracle:", 0) == 0 && a.route_from.empty())
      throw error("--predictor " + a.predictor + " reads the routing to come from the trace; give --route-from TRACE");
    if (app.count("--oracle-seed") != 0 && a.predictor.rfind("oracle:", 0) != 0)
      throw error("--oracle-seed has no effect without --predictor oracle:P; give both, or drop --oracle-seed");
    return probe(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe-llama-probe: %s\n", e.what());
    return 1;
  }
}
