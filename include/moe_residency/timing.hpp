#pragma once
/// timing: the wall-clock model over a replay. Given what a dynamic replay did
/// per decode load (demanded misses, drops, speculative reads, evictions) and a
/// device/model description, it predicts each decode token's wall time.
/// Standard library only; the least-squares calibration is in
/// timing/calibrate.hpp (the one header that includes Eigen).
///
/// Units: milliseconds (ms), MiB = 1048576 bytes, MiB/s.
///
/// The model, per decode token, per MoE layer l in execution order (every
/// symbol is a `timing_params` field or a `load_event` count):
///
///   (1) compute      c_l   = C / L × ((1 − σ) + σ × e_l / k_c) + ρ × M_l  + φ × f_l
///                    C = compute_ms_per_token, L = MoE layers, σ = expert_compute_share,
///                    r_l = routed experts, e_l = r_l − dropped (experts executed),
///                    k_c = compute_top_k (the top-k C was measured at; 0: r_l, so the
///                    top-k does not change compute); the matmuls' part is the first two
///                    terms. Contention: ρ = compute_ms_per_read_mib, M_l = the MiB read at
///                    this load (D_l + I_l, see 6): the lanes and their DMA compete with the
///                    matmuls for cores and memory bandwidth. Faults: φ = compute_ms_per_fault,
///                    f_l = F_0 / L + χ × V_l (F_0 = faults_per_token, the device's memory
///                    pressure; χ = faults_per_evicted_mib, churn; V_l = MiB evicted at this
///                    load), or a recorded token's measured majflt / L in a calibration.
///   (2) one wave     w(m)  = λ + 1000 × m × (b / q) / (β × B(m))
///                    m ≤ n concurrent requests, each 1/q of an expert of b MiB (b = the
///                    layer's expert bytes; q = requests_per_read: an expert read as q
///                    requests, its tensors),
///                    λ = read_latency_ms (paid once per wave), B(m) = curve bandwidth at m
///                    lanes (MiB/s, piecewise linear in m between measured points),
///                    β = bandwidth_scale (what the device delivers while the model computes,
///                    against the cold curve; the memory lab's page faults may have their
///                    own, β_f = fault_bandwidth_scale, or a measured time per MiB in
///                    place of the curve, κ and λ: lab_setup's fault walk, moe_residency_lab/lab.hpp).
///                    Its I/O time (the engine's io_ms: read durations summed over lanes)
///                    is m × w(m).
///   (3) demanded     T_l   = (⌈R/n⌉ − 1) × w(n) + w(R − (⌈R/n⌉ − 1) × n),   0 when d = 0
///                    d = the layer's demanded misses, R = q × d requests, n = lanes.
///   (4) wait         q_l   = max(0, S_prev − t_l)
///                    t_l = the layer's start; S_prev = when the speculative reads issued
///                    after the previous load finish (a started read is waited for; see 7).
///   (5) stall        s_l   = max(0, q_l + T_l − ω × c_l − ψ × (κ × D_l + ν_p × p_l))
///                    ω = overlap: the share of the layer's compute the demanded reads hide
///                    behind (the engine computes resident experts while misses load);
///                    ψ = kernel_overlap: the share of the engine thread's own work for
///                    these reads (6's κ and ν_p terms) that their device time hides behind
///                    — 0 when another thread reads them (the lanes) and the engine only
///                    waits; in the memory lab, 1 where the engine thread locks the misses
///                    itself (the kernel's readahead is in flight while it allocates and
///                    inserts the pages: moe_residency_lab/lab.hpp). Default 0. Only the
///                    matmuls' compute hides reads: a fault waits in the kernel.
///   (5') pipelined   with pipelined_mgmt, the engine thread, after its ω × matmul + ψ × own
///                    work, makes each demanded read resident (μ_r + κ × b) as soon as the wave
///                    holding its last request ends, behind the later waves; s_l is its idle
///                    time (timing_simulator::pipelined_stall). With one wave it is (5).
///   (6) management   g_l   = μ_r × (d + i_l) + μ_e × v_l + κ × (D_l + I_l) + ν_q × a_l + ν_p × p_l
///                    μ_r = mgmt_ms_per_read, i_l = speculative reads made resident at this
///                    load, μ_e = mgmt_ms_per_eviction, v_l = evictions at this load,
///                    κ = read_cpu_ms_per_mib (the engine thread's CPU per MiB read: the
///                    kernel's page-cache work when reads go through it; 0 on the phone),
///                    D_l = the demanded reads' MiB, I_l = the MiB the i_l reads read
///                    (i_l × b in a replay; the pages a read found missing in the lab's
///                    fault model);
///                    ν_q = mgmt_ms_per_request, a_l = experts the engine's manager requests
///                    at this load whether resident or not (the lab's `exact` requests
///                    every routed expert, and each speculative read is one request);
///                    ν_p = mgmt_ms_per_pin, p_l = misses of a pinned cache the manager keeps
///                    inside the page cache (a lock, and its eviction's unlock) — both 0 in a
///                    replay, set by moe_residency_lab/lab.hpp, and measured with every expert resident;
///                    + ν_l × (h_l + d): ν_l = mgmt_ms_per_lookup, the cache's own lookup of
///                    each unique expert, hit or miss.
///   (7) speculation  reads planned after layer l's demanded load start at
///                    t_l + q_l + T_l (the device is then free) and run in waves of up
///                    to n reads, each wave per (2), back to back, competing for the same
///                    bandwidth; a wave starts only before the layer ends (t_l + layer
///                    time): the reads that would start later are cancelled at the next
///                    demanded load (they never enter the cache); a started wave finishes,
///                    and what it runs past the layer's end is the next layer's wait (4).
///   (8) layer time   c_l + g_l + s_l;   token wall = Σ_l layer time.
///
/// Per token it reports wall, compute, stall (the wait included), management,
/// and the demanded and speculative bytes. docs/wall-clock.md has the
/// derivation, the calibration and what the model cannot see.
///
/// Its parts, one job each: timing/storage_curve.hpp (B), timing/params.hpp
/// (the parameters, equations 2 and 3), timing/config.hpp (the parameters
/// file), timing/model.hpp (the per-token model, equations 1–8) and
/// timing/metrics.hpp (recorded per-token metrics), timing/fault_line.hpp (F_0
/// and χ from recorded faults), timing/run_config.hpp (a
/// recorded run's configuration), timing/pairing.hpp (recorded rows to replayed
/// tokens), timing/top_k.hpp (top-k as a lever), timing/verdict.hpp (ratio and
/// verdict against a baseline). The calibration (Eigen) is timing/calibrate.hpp,
/// and several recorded runs calibrated and predicted, timing/recorded_runs.hpp. The memory lab's mapping onto this model is the lab's
/// own code (lab/include/moe_residency_lab/lab.hpp), not part of the library.

#include "moe_residency/core.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/replay.hpp"
#include "moe_residency/timing/config.hpp"
#include "moe_residency/timing/fault_line.hpp"
#include "moe_residency/timing/metrics.hpp"
#include "moe_residency/timing/model.hpp"
#include "moe_residency/timing/pairing.hpp"
#include "moe_residency/timing/params.hpp"
#include "moe_residency/timing/run_config.hpp"
#include "moe_residency/timing/storage_curve.hpp"
#include "moe_residency/timing/top_k.hpp"
#include "moe_residency/timing/verdict.hpp"
