#pragma once
/// cache: the byte-budgeted expert cache and every eviction policy.
/// Include a single policy header (e.g. moe_residency/cache/lru.hpp) to pay
/// for one policy only.

#include "moe_residency/cache/expert_cache.hpp"
#include "moe_residency/cache/adaptive.hpp"
#include "moe_residency/cache/arc.hpp"
#include "moe_residency/cache/belady.hpp"
#include "moe_residency/cache/cycle.hpp"
#include "moe_residency/cache/layer.hpp"
#include "moe_residency/cache/lfu.hpp"
#include "moe_residency/cache/lru.hpp"
#include "moe_residency/cache/random.hpp"
#include "moe_residency/cache/retention.hpp"
#include "moe_residency/cache/s3fifo.hpp"
#include "moe_residency/cache/sieve.hpp"
