#pragma once
/// The session's own lines in its report (session.hpp's `report()`, which
/// adds them to the scorer's report before the extensions' notes): the
/// anomalies it counted and ignored, and the decode routings it accepted
/// without scoring because they came in multi-token batches.

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "moe_residency/session_types.hpp"

namespace moe_residency {
namespace detail {

/// Appends to `notes` one line for the anomalies (how many, by kind, and the
/// first one's message) and one for `unscored_batched` routings, each only
/// when its count is not 0.
inline void append_session_notes(std::vector<std::string>& notes, const anomaly_counts& anomalies,
                                 std::uint64_t unscored_batched) {
  if (anomalies.total()) {
    std::string s = std::to_string(anomalies.total()) + " anomalies ignored (";
    bool first = true;
    for (std::size_t k = 0; k < anomaly_kind_count; ++k) {
      if (!anomalies.by_kind[k]) continue;
      s += (first ? "" : ", ") + std::to_string(anomalies.by_kind[k]) + " " + to_string(static_cast<anomaly_kind>(k));
      first = false;
    }
    s += "); first: " + anomalies.first_message;
    notes.push_back(std::move(s));
  }
  if (unscored_batched)
    notes.push_back(std::to_string(unscored_batched) +
                    " decode routings came in multi-token batches and were not scored");
}

}  // namespace detail
}  // namespace moe_residency
