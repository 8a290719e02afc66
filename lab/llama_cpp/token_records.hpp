#pragma once
/// What one memory-lab run records of each llama_decode call, and how it
/// writes it: the per-token CSV (moe-lab-run --per-token-csv: docs/memlab.md,
/// "The columns"), the phone's metrics format (--metrics-csv, for
/// moe-residency calibrate and lab-predict: docs/lab-predict.md, "What each
/// run records"), the digest of the logits and the decode summary line.
/// The memory lab's instrument; not part of the library.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "moe_residency/core.hpp"
#include "moe_residency/error.hpp"
#include "proc_counters.hpp"

namespace moe_residency::llama_cpp::lab {

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
  double hit_pct = -1;                      ///< < 0: not measured (no residency manager)
  double proc_cpu_ms = 0, proc_sys_ms = 0;  ///< every thread of the process (RUSAGE_SELF): compute, lanes, kernel
  double read_wait_ms = 0;                  ///< the eval thread waiting for the manager's demanded reads
  std::uint64_t read_waits = 0;             ///< layers whose reads it had to wait for
  double manage_ms = 0;                     ///< the eval thread in the manager's routing events (its own cost)
};

/// One run: its rows, the decode's wall time and the digest of its logits.
struct run_result {
  double decode_s = 0;
  std::vector<token_record> rows;
  std::uint64_t digest = 1469598103934665603ull;  ///< FNV-1a 64 of every decode token's logits
  std::size_t digested = 0;
  mapping_kib mapping;  ///< at the end of the decode
};

inline void fnv1a_bytes(std::uint64_t& h, const void* p, std::size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
}

/// The q-quantile of `v` by linear interpolation between the two nearest
/// ranks (the lab's tables compute theirs the same way); 0 for none.
inline double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(pos);
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

/// Whether the rows' bytes read are the cgroup's: the process's own counter
/// unless it read 0 over the whole run while the cgroup's did not (task I/O
/// accounting off).
inline bool reads_from_cgroup(const run_result& r) {
  std::uint64_t proc = 0, cg = 0;
  for (const auto& t : r.rows) {
    proc += t.read_bytes;
    cg += t.cgroup_read_bytes;
  }
  return proc == 0 && cg != 0;
}

/// Replaces `path` with `text` whole: written to `path`.part, checked, renamed;
/// throws naming `option` and the file.
inline void write_whole_file(const std::string& path, const std::string& text, const char* option) {
  const std::string part = path + ".part";
  {
    std::ofstream out(part, std::ios::binary | std::ios::trunc);
    if (!out) throw error(std::string(option) + ": cannot write '" + part + "'");
    out << text;
    out.flush();
    if (!out) {
      std::remove(part.c_str());
      throw error(std::string(option) + ": writing '" + part + "' failed");
    }
  }
  if (std::rename(part.c_str(), path.c_str()) != 0) {
    std::remove(part.c_str());
    throw error(std::string(option) + ": cannot replace '" + path + "' with '" + part + "'");
  }
}

/// The digest line, the mapping line and the decode summary, on stdout.
inline void print_run_summary(const run_result& r) {
  std::printf("logits: fnv1a64 %016llx over %zu tokens\n", static_cast<unsigned long long>(r.digest), r.digested);
  if (r.mapping.rss != 0)
    std::printf(
        "mapping: %.1f MiB of the process's %.1f MiB resident mapped by 2 MiB pages (FilePmdMapped), "
        "at the end of the decode\n",
        static_cast<double>(r.mapping.file_pmd_mapped) / 1024.0, static_cast<double>(r.mapping.rss) / 1024.0);
  if (r.rows.empty()) return;
  const bool use_cgroup = reads_from_cgroup(r);
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
}

/// --metrics-csv: the phone's metrics format, the columns this machine can measure
/// (docs/wall-clock.md, "Against this machine"): one row per decode token;
/// compute_ms = cpu_ms = the eval thread's CPU time in the call (it includes the
/// observer's and the manager's work on that thread and the kernel's fault
/// handling); stall_ms = wall_ms - cpu_ms, the eval thread off the CPU (waiting for
/// faults or the manager's reads, or descheduled); io_ms and mgmt_ms are not
/// measured here.
inline void write_metrics_csv(const run_result& r, const std::string& path) {
  const bool use_cgroup = reads_from_cgroup(r);
  std::size_t steps = 0;
  for (const auto& t : r.rows) steps += t.prompt ? 0 : 1;
  std::string text = "step,steps,wall_ms,compute_ms,read_bytes,cache_hit_pct,stall_ms,majflt,cpu_ms,sys_ms\n";
  std::size_t step = 0;
  char line[512];
  for (const auto& t : r.rows) {
    if (t.prompt) continue;
    char hit[32] = "";
    if (t.hit_pct >= 0) std::snprintf(hit, sizeof hit, "%.2f", t.hit_pct);
    std::snprintf(line, sizeof line, "%zu,%zu,%.3f,%.3f,%llu,%s,%.3f,%llu,%.3f,%.3f\n", ++step, steps, t.wall_ms,
                  t.cpu_ms, static_cast<unsigned long long>(use_cgroup ? t.cgroup_read_bytes : t.read_bytes), hit,
                  std::max(0.0, t.wall_ms - t.cpu_ms), static_cast<unsigned long long>(t.majflt), t.cpu_ms, t.sys_ms);
    text += line;
  }
  write_whole_file(path, text, "--metrics-csv");
}

/// --per-token-csv: one row per llama_decode call (docs/memlab.md, "The columns").
inline void write_per_token_csv(const run_result& r, const std::string& path) {
  const bool use_cgroup = reads_from_cgroup(r);
  std::string text =
      "token,phase,wall_ms,majflt,minflt,read_bytes,prefetch_issued,prefetch_useful,prefetch_late,"
      "pinned_mib,hit_pct,engine_majflt,proc_cpu_ms,proc_sys_ms,read_wait_ms,read_waits,manage_ms\n";
  char line[512];
  for (const auto& t : r.rows) {
    char hit[32] = "";
    if (t.hit_pct >= 0) std::snprintf(hit, sizeof hit, "%.2f", t.hit_pct);
    std::snprintf(line, sizeof line,
                  "%zu,%s,%.3f,%llu,%llu,%llu,%llu,%llu,%llu,%.1f,%s,%llu,%.3f,%.3f,%.3f,%llu,%.3f\n", t.token,
                  t.prompt ? "prompt" : "decode", t.wall_ms, static_cast<unsigned long long>(t.majflt),
                  static_cast<unsigned long long>(t.minflt),
                  static_cast<unsigned long long>(use_cgroup ? t.cgroup_read_bytes : t.read_bytes),
                  static_cast<unsigned long long>(t.prefetch_issued),
                  static_cast<unsigned long long>(t.prefetch_useful), static_cast<unsigned long long>(t.prefetch_late),
                  t.pinned_mib, hit, static_cast<unsigned long long>(t.engine_majflt), t.proc_cpu_ms, t.proc_sys_ms,
                  t.read_wait_ms, static_cast<unsigned long long>(t.read_waits), t.manage_ms);
    text += line;
  }
  write_whole_file(path, text, "--per-token-csv");
}

}  // namespace moe_residency::llama_cpp::lab
