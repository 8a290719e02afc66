#pragma once
/// timing/pairing.hpp: which replayed decode token stands for each recorded
/// metrics row. A run recorded with the trace (the same prompt, as
/// qwen.metrics.csv with qwen.route.csv) pairs row s with decode token s (by
/// step). A run of another prompt or length — the phone's A/B files have 256
/// decode tokens, the gpt-oss trace 64 — cannot be paired token for token; it
/// is **matched by distribution of read volume**: each recorded row is paired
/// with the replayed token (of the run's own configuration) whose demanded
/// bytes are nearest the row's `read_bytes`; among replayed tokens equally
/// near, the rows take them in turn, so a run whose tokens all read alike
/// (a cache below the token cycle: every routing a miss) spreads evenly over
/// the trace. The pairing re-weights the trace's tokens to the run's mix of
/// light and heavy tokens, and the weights carry over to predictions of other
/// configurations of the same campaign (token_weights). Standard library only.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "moe_residency/core.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/replay/dynamic.hpp"

namespace moe_residency {

/// How recorded rows were paired with replayed tokens.
enum class token_pairing { step, volume };

inline const char* to_string(token_pairing p) noexcept { return p == token_pairing::step ? "step" : "volume"; }

struct paired_tokens {
  token_pairing how = token_pairing::step;
  std::vector<std::size_t> replay_token;  ///< per recorded row: the replayed decode token it stands for
  double recorded_mib_per_token = 0;      ///< the rows' mean read_bytes, MiB (NaN without the column)
  double paired_mib_per_token = 0;        ///< the paired tokens' mean demanded MiB
  double mean_abs_diff_mib = 0;           ///< mean |recorded − paired| MiB per row (NaN without the column)
};

/// Each decode token's demanded bytes in `loads` (token index → bytes), `tokens` long.
inline std::vector<std::uint64_t> demanded_bytes_per_token(const std::vector<load_event>& loads, std::size_t tokens) {
  std::vector<std::uint64_t> v(tokens, 0);
  for (const load_event& e : loads)
    if (e.token < tokens) v[e.token] += e.demanded_bytes;
  return v;
}

/// Decode tokens in `loads`: one more than the largest token index (0 when empty).
inline std::size_t decode_tokens_of(const std::vector<load_event>& loads) {
  std::size_t n = 0;
  for (const load_event& e : loads) n = std::max<std::size_t>(n, e.token + 1u);
  return n;
}

/// Row s with token s. Throws `error` naming `source` when the counts differ.
inline paired_tokens pair_tokens_by_step(const std::vector<std::uint64_t>& replay_bytes,
                                         const std::vector<double>& recorded_bytes, std::size_t rows,
                                         const std::string& source) {
  if (rows != replay_bytes.size())
    throw error(source + ": " + std::to_string(rows) + " metrics rows, but the replay has " +
                std::to_string(replay_bytes.size()) +
                " decode tokens; pairing by step needs one row per decode token of the trace's own run (pair a "
                "run of another prompt or length by read volume)");
  paired_tokens p;
  p.how = token_pairing::step;
  p.replay_token.resize(rows);
  double rec = 0, pr = 0, diff = 0;
  const bool have = recorded_bytes.size() == rows;
  for (std::size_t i = 0; i < rows; ++i) {
    p.replay_token[i] = i;
    pr += to_mib(replay_bytes[i]);
    if (have)
      rec += recorded_bytes[i] / 1048576.0, diff += std::abs(recorded_bytes[i] / 1048576.0 - to_mib(replay_bytes[i]));
  }
  const double n = static_cast<double>(rows);
  p.paired_mib_per_token = rows ? pr / n : 0.0;
  p.recorded_mib_per_token = have && rows ? rec / n : std::nan("");
  p.mean_abs_diff_mib = have && rows ? diff / n : std::nan("");
  return p;
}

/// Matched by distribution of read volume (see the header comment). Throws
/// `error` naming `source` and the row when the replay has no decode token or
/// a row's read_bytes is missing or not a finite number >= 0.
inline paired_tokens pair_tokens_by_volume(const std::vector<std::uint64_t>& replay_bytes,
                                           const std::vector<double>& recorded_bytes, const std::string& source) {
  if (replay_bytes.empty()) throw error(source + ": the replay has no decode token to pair the rows with");
  // The replayed tokens by bytes (then index), for a binary search per row.
  std::vector<std::size_t> order(replay_bytes.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return replay_bytes[a] < replay_bytes[b]; });
  std::map<std::size_t, std::size_t>
      turn;  // per group of equally near tokens (its first place in `order`): rows so far
  paired_tokens p;
  p.how = token_pairing::volume;
  p.replay_token.resize(recorded_bytes.size());
  double rec = 0, pr = 0, diff = 0;
  std::vector<std::size_t> near;
  for (std::size_t i = 0; i < recorded_bytes.size(); ++i) {
    const double b = recorded_bytes[i];
    if (!(b >= 0) || !std::isfinite(b))
      throw error(source + ": row " + std::to_string(i + 1) + ": read_bytes " + std::to_string(b) +
                  "; expected every row's read_bytes (a finite number >= 0) to pair it by read volume");
    const auto it = std::lower_bound(order.begin(), order.end(), b,
                                     [&](std::size_t k, double v) { return static_cast<double>(replay_bytes[k]) < v; });
    const std::size_t at = static_cast<std::size_t>(it - order.begin());
    double best = HUGE_VAL;
    for (std::size_t k : {at, at - 1})  // the nearest is one of the two neighbours (at - 1 wraps when at = 0)
      if (k < order.size()) best = std::min(best, std::abs(static_cast<double>(replay_bytes[order[k]]) - b));
    // Every token at that distance (below and above: a run of equal bytes on each side).
    std::size_t lo = at, hi = at;
    while (lo > 0 && std::abs(static_cast<double>(replay_bytes[order[lo - 1]]) - b) <= best) --lo;
    while (hi < order.size() && std::abs(static_cast<double>(replay_bytes[order[hi]]) - b) <= best) ++hi;
    near.assign(order.begin() + static_cast<std::ptrdiff_t>(lo), order.begin() + static_cast<std::ptrdiff_t>(hi));
    std::sort(near.begin(), near.end());
    const std::size_t pick = near[turn[lo]++ % near.size()];
    p.replay_token[i] = pick;
    rec += b / 1048576.0;
    pr += to_mib(replay_bytes[pick]);
    diff += std::abs(b / 1048576.0 - to_mib(replay_bytes[pick]));
  }
  const double n = static_cast<double>(recorded_bytes.size());
  if (n > 0) p.recorded_mib_per_token = rec / n, p.paired_mib_per_token = pr / n, p.mean_abs_diff_mib = diff / n;
  return p;
}

/// `loads` rearranged as the recorded rows: row i's loads are those of
/// replayed token pairing.replay_token[i], with token index i.
inline std::vector<load_event> paired_loads(const std::vector<load_event>& loads, const paired_tokens& pairing) {
  const std::size_t tokens = decode_tokens_of(loads);
  std::vector<std::vector<const load_event*>> by_token(tokens);
  for (const load_event& e : loads) by_token[e.token].push_back(&e);
  std::vector<load_event> out;
  for (std::size_t i = 0; i < pairing.replay_token.size(); ++i) {
    const std::size_t src = pairing.replay_token[i];
    if (src >= tokens) continue;
    for (const load_event* e : by_token[src]) {
      out.push_back(*e);
      out.back().token = static_cast<std::uint32_t>(i);
    }
  }
  return out;
}

/// Per replayed decode token: how many recorded rows of the pairings stand
/// for it (every pairing's rows counted), `tokens` long. All zero: no rows.
inline std::vector<double> token_weights(const std::vector<paired_tokens>& pairings, std::size_t tokens) {
  std::vector<double> w(tokens, 0.0);
  for (const paired_tokens& p : pairings)
    for (std::size_t t : p.replay_token)
      if (t < tokens) w[t] += 1.0;
  return w;
}

}  // namespace moe_residency
