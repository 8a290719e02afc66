#pragma once
/// Predictors behind one small static contract (see predict/contract.hpp):
/// prev-token, frequency, static hot list (routing history) and stale-gate,
/// stale-gate l+2, fresh-gate control (gate input × router). See
/// docs/prediction.md.

#include "moe_residency/predict/contract.hpp"
#include "moe_residency/predict/gate.hpp"
#include "moe_residency/predict/history.hpp"
