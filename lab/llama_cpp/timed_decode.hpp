#pragma once
/// One memory-lab run's decode, timed and counted: the prompt as one batch,
/// then `n_decode` tokens sampled from softmax(logits) with a seeded
/// generator, every llama_decode call timed with the process's counters
/// (proc_counters.hpp) and the residency manager's statistics sampled around
/// it, and every decode token's logits digested (the lab's check that a
/// configuration changed no result). The memory lab's instrument; not part of
/// the library.

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "llama.h"
#include "moe_residency/adapters/llama_cpp/residency.hpp"
#include "moe_residency/error.hpp"
#include "proc_counters.hpp"
#include "token_records.hpp"

namespace moe_residency::llama_cpp::lab {

/// Decodes `prompt` and `n_decode` sampled tokens in `ctx`; `res` (may be null)
/// is the manager acting on it, whose last reads each call settles; `engine`
/// the engine's threads (current_threads() before the manager started).
inline run_result timed_decode(llama_context* ctx, const llama_model* m, const std::vector<llama_token>& prompt,
                               std::size_t n_decode, std::uint64_t seed, residency_manager* res,
                               const std::vector<std::string>& engine) {
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(m));
  const std::string cg_file = cgroup_io_file();
  run_result r;
  auto timed = [&](llama_batch batch, std::size_t token, bool is_prompt) {
    const counters c0 = sample_counters(cg_file, engine);
    const residency_stats r0 = res ? res->stats() : residency_stats{};
    const double cpu0 = thread_cpu_ms();
    const rusage_split sys0 = thread_rusage();
    const rusage_split proc0 = thread_rusage(RUSAGE_SELF);
    const auto t0 = std::chrono::steady_clock::now();
    const int rc = llama_decode(ctx, batch);
    // The manager accounts the last layer's reads (still open with overlap) in
    // the token that made them; waiting for any still on the lanes is its time.
    if (res != nullptr) res->settle();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double cpu1 = thread_cpu_ms();
    const rusage_split sys1 = thread_rusage();
    const rusage_split proc1 = thread_rusage(RUSAGE_SELF);
    if (rc != 0) throw error(is_prompt ? "llama_decode failed on the prompt batch" : "llama_decode failed");
    const counters c1 = sample_counters(cg_file, engine);
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
      const residency_stats r1 = res->stats();
      t.prefetch_issued = (r1.exact_reads - r0.exact_reads) + (r1.predicted_issued - r0.predicted_issued);
      t.prefetch_useful = r1.predicted_useful - r0.predicted_useful;
      t.prefetch_late = r1.predicted_late - r0.predicted_late;
      t.pinned_mib = to_mib(r1.pinned_bytes + r1.dense_bytes);
      t.read_wait_ms = 1e-6 * static_cast<double>(r1.read_wait_ns - r0.read_wait_ns);
      t.read_waits = r1.read_waits - r0.read_waits;
      t.manage_ms = 1e-6 * static_cast<double>(r1.manage_ns - r0.manage_ns);
      const std::uint64_t routed = r1.routed_experts - r0.routed_experts;
      if (routed)
        t.hit_pct = 100.0 * static_cast<double>(r1.routed_resident - r0.routed_resident) / static_cast<double>(routed);
    }
    r.rows.push_back(t);
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

}  // namespace moe_residency::llama_cpp::lab
