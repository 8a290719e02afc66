#pragma once
/// Residency of a memory-mapped GGUF's experts in an unmodified llama.cpp:
/// include this header. The manager is one class in one file; its parts are
/// one concept a file, under residency/:
///
///   residency/manager.hpp       mmap_residency<Policy>, the observer_sink that acts (and its interface)
///   residency/options.hpp       which parts are on, how they are sized; the counters
///   residency/policies.hpp      a manager whose cache policy is named at run time
///   residency/predictor.hpp     what predicted reads are planned from (the stale gate, or the host's)
///   residency/start.hpp         the warm-up and activation every caller runs: start()
///   residency/advice.hpp        the kernel's memory advice (madvise, mlock, the expert pool), replaceable
///   residency/memory_limit.hpp  the memory limit and locking limit the process runs under
///   residency/expert_pages.hpp  where each expert lies in the mapping, and the per-page lock counts
///
/// See docs/llama-cpp-residency.md.

#include "moe_residency/adapters/llama_cpp/residency/manager.hpp"
#include "moe_residency/adapters/llama_cpp/residency/options.hpp"
#include "moe_residency/adapters/llama_cpp/residency/policies.hpp"
#include "moe_residency/adapters/llama_cpp/residency/predictor.hpp"
#include "moe_residency/adapters/llama_cpp/residency/start.hpp"
