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
/// - dense: the pages of the non-expert tensors the graph reads from the
///   mapping locked once (mlock), so reclaim never takes the weights every
///   token needs;
/// - exact: at layer l's routing, every routed miss's slices of every expert
///   tensor of the layer are requested at once, in the order the matmuls
///   read them (MADV_WILLNEED from the eval thread: every miss queued at the
///   device in large requests), then waited for on the read scheduler's
///   lanes (MADV_POPULATE_READ, or mlock for the cache) while the layer's
///   matmuls already run (overlap; its pages in flight are waited for by
///   their faults), settled at the next routing; not fault by fault. With
///   it, the expert ranges are advised MADV_RANDOM so a stray fault reads
///   one page, not a read-around window;
/// - predicted: the stale-gate's ranking of the next MoE layer through the
///   speculation planner (cap, residents free) onto the same lanes, behind
///   the demanded reads; never waited for (but with the pool): at the next
///   layer's routing the completed ones are made resident in the cache and
///   pinned, the others disowned; counted as useful, late or wasted;
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
/// Tensors llama.cpp did not leave in the file's mapping (repacked copies,
/// layers offloaded to a device) are left to it, and named (unmanaged_note).
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
///
/// The cache, the planner and the read scheduler are a `speculation` object
/// (speculation.hpp), the one the session and the replay run, so the replay
/// of a recorded routing makes the live cache's decisions (tested token by
/// token); the mapping is its storage: a lane's read populates a range (or
/// places it in the pool), an admission pins, an eviction unpins and releases.
///
/// The manager's parts each have a header: residency_options.hpp (options and
/// counters), memory_limit.hpp (what it reads about the process and its
/// cgroups), expert_pages.hpp (where each expert sits in the mapping, and the
/// per-page lock counts), gate_ranking.hpp (the stale-gate's ranking),
/// pinned_cache.hpp (the cache as speculation sees it), residency_manager.hpp
/// (the interface without the policy), and the class itself:
/// mmap_residency.hpp, its members by job in
/// mmap_residency_{activation,reads,layer}.hpp. Include this header.
///
/// The order of its steps is the contract: everything that can refuse runs
/// before any advice; at a routing, the completed predictions are settled
/// and what the cache evicted is released before the layer's reads start.

#include "moe_residency/adapters/llama_cpp/mmap_residency.hpp"
#include "moe_residency/adapters/llama_cpp/mmap_residency_activation.hpp"
#include "moe_residency/adapters/llama_cpp/mmap_residency_layer.hpp"
#include "moe_residency/adapters/llama_cpp/mmap_residency_reads.hpp"
#include "moe_residency/adapters/llama_cpp/residency_manager.hpp"
