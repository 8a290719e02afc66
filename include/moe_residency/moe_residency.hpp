#pragma once
/// moe-residency umbrella header: every component except engine adapters
/// (include those, e.g. moe_residency/adapters/llama_cpp.hpp, yourself).

#include "moe_residency/version.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/core.hpp"
#include "moe_residency/events.hpp"
#include "moe_residency/router.hpp"
#include "moe_residency/trace.hpp"
#include "moe_residency/cache.hpp"
#include "moe_residency/replay.hpp"
#include "moe_residency/predict.hpp"
#include "moe_residency/score.hpp"
#include "moe_residency/session.hpp"
#include "moe_residency/synthetic.hpp"
#include "moe_residency/plan.hpp"
#include "moe_residency/io.hpp"
#include "moe_residency/speculation.hpp"
#include "moe_residency/simulated_flash.hpp"
