#pragma once
/// timing/run_config.hpp: a recorded run's configuration — the levers the
/// timing model replays it with (cache budget, read lanes, top-k) and the
/// engine's switches it must know (its own prefetch, compute/read overlap).
/// The phone's engine writes them in its metrics file's header
/// (`bmoe_metrics v1`):
///
///   # model=gpt-oss-120b-Q4_K_M.gguf arch=gpt-oss n_layer=36 n_expert=128 n_expert_used=2 threads=4 n_ctx=2048
///   # moe_stream=1 cache_mb=2000 cache_auto=0 ... io_threads=4 o_direct=1 overlap=1 prefetch=0 dense_weights=anon
///
/// and a file without them (the older `*.metrics.csv`) gets them on the
/// command line as a `key=value,key=value` list of the same keys. Standard
/// library only.

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "moe_residency/detail/numbers.hpp"
#include "moe_residency/error.hpp"

namespace moe_residency {

/// What a run's configuration says; an unset field is not known.
struct run_config {
  std::optional<double> cache_mib;   ///< `cache_mb`: the cache budget, MiB
  std::optional<std::size_t> lanes;  ///< `io_threads`: read lanes
  std::optional<std::size_t> top_k;  ///< `n_expert_used`: experts routed per layer
  std::optional<bool> prefetch;      ///< `prefetch`: the engine's own speculative reads
  std::optional<bool> overlap;       ///< `overlap`: the engine computes resident experts while misses load
  std::optional<bool> cache_auto;    ///< `cache_auto`: the engine sized its cache itself
  std::vector<std::pair<std::string, std::string>> given;  ///< every key=value it was read from, in order

  /// "cache 2000 MiB, 4 lanes, top-2, prefetch off, overlap on" (the fields set).
  std::string describe() const {
    std::string s;
    auto add = [&s](const std::string& x) { s += (s.empty() ? "" : ", ") + x; };
    if (cache_mib) add("cache " + detail::show_number(*cache_mib) + " MiB");
    if (lanes) add(std::to_string(*lanes) + " lanes");
    if (top_k) add("top-" + std::to_string(*top_k));
    if (prefetch) add(std::string("prefetch ") + (*prefetch ? "on" : "off"));
    if (overlap) add(std::string("overlap ") + (*overlap ? "on" : "off"));
    return s.empty() ? "no configuration" : s;
  }
};

namespace detail {

/// Sets the field `key` names from `value`; false for a key the model does not
/// use (kept in `given` all the same). Throws naming `where`, the key, the
/// value and what was expected; and on a key given twice with two values.
inline bool set_run_config_key(run_config& c, const std::string& key, const std::string& value,
                               const std::string& where) {
  for (const auto& kv : c.given)
    if (kv.first == key && kv.second != value)
      throw error(where + ": " + key + "=" + value + ", but " + key + "=" + kv.second +
                  " before it; expected each key once, or the same value");
  c.given.emplace_back(key, value);
  const std::string what = where + ": " + key;
  auto flag = [&]() { return parse_whole<unsigned>(value, what + " (0 or 1)", 0, 1) == 1; };
  if (key == "cache_mb") c.cache_mib = parse_real(value, what + " (MiB)", real_domain::positive());
  else if (key == "io_threads") c.lanes = parse_whole<std::size_t>(value, what + " (read lanes)", 1, 64);
  else if (key == "n_expert_used") c.top_k = parse_whole<std::size_t>(value, what + " (top-k)", 1, 256);
  else if (key == "prefetch") c.prefetch = flag();
  else if (key == "overlap") c.overlap = flag();
  else if (key == "cache_auto") c.cache_auto = flag();
  else return false;
  return true;
}

}  // namespace detail

/// The configuration a metrics file's '#' lines before its column header
/// hold: their `key=value` words (a `model=` value runs to ` arch=`, as in a
/// route trace). Keys the model does not use are kept in `given` only.
/// Throws `error` naming `source`, the line, the key and the value on a value
/// that is not what the key takes, and on a key given twice with two values.
inline run_config parse_run_config(const std::string& metrics_text, const std::string& source) {
  run_config c;
  std::size_t pos = 0, n = 0;
  while (pos < metrics_text.size()) {
    std::size_t eol = metrics_text.find('\n', pos);
    if (eol == std::string::npos) eol = metrics_text.size();
    std::string line = metrics_text.substr(pos, eol - pos);
    pos = eol + 1;
    ++n;
    while (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    if (line[0] != '#') break;  // the column header: the configuration is above it
    line.erase(0, 1);
    const std::string where = source + ": line " + std::to_string(n);
    std::size_t i = 0;
    while (i < line.size()) {
      while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
      if (i >= line.size()) break;
      std::size_t end = line.find_first_of(" \t", i);
      if (line.compare(i, 6, "model=") == 0) {  // a path may hold spaces: up to " arch="
        const std::size_t arch = line.find(" arch=", i);
        end = arch == std::string::npos ? line.size() : arch;
      }
      if (end == std::string::npos) end = line.size();
      const std::string word = line.substr(i, end - i);
      i = end;
      const std::size_t eq = word.find('=');
      if (eq == std::string::npos || eq == 0) continue;  // "bmoe_metrics v1" and the like
      detail::set_run_config_key(c, word.substr(0, eq), word.substr(eq + 1), where);
    }
  }
  return c;
}

/// A configuration given on the command line: `key=value` pairs separated by
/// ',' (cache_mb, io_threads, n_expert_used, prefetch, overlap, cache_auto).
/// Throws `error` naming `source` on an empty item, an item without '=', an
/// unknown key (a typo here would be silently ignored) or a bad value.
inline run_config parse_run_config_list(const std::string& text, const std::string& source) {
  run_config c;
  std::size_t start = 0;
  for (std::size_t i = 1;; ++i) {
    const std::size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const std::string where = source + ": item " + std::to_string(i) + " of '" + text + "'";
    const std::size_t eq = item.find('=');
    if (item.empty() || eq == std::string::npos || eq == 0)
      throw error(where + ": '" + item + "'; expected key=value like cache_mb=2000,io_threads=4,n_expert_used=2");
    if (!detail::set_run_config_key(c, item.substr(0, eq), item.substr(eq + 1), where))
      throw error(where + ": unknown key '" + item.substr(0, eq) +
                  "'; expected cache_mb, io_threads, n_expert_used, prefetch, overlap or cache_auto");
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return c;
}

/// `header` completed by `given` (the command line's): a field either sets is
/// kept; both setting one to different values is an error naming `source`, the
/// key and both values (the file says what ran; the command line may not
/// contradict it).
inline run_config merge_run_config(run_config header, const run_config& given, const std::string& source) {
  auto merge = [&source](auto& into, const auto& from, const char* key) {
    if (!from) return;
    if (into && *into != *from)
      throw error(source + ": " + key + " is " + detail::show_number(static_cast<double>(*into)) +
                  " in the file's header but " + detail::show_number(static_cast<double>(*from)) +
                  " on the command line; expected the same value, or the key in one place");
    into = from;
  };
  merge(header.cache_mib, given.cache_mib, "cache_mb");
  merge(header.lanes, given.lanes, "io_threads");
  merge(header.top_k, given.top_k, "n_expert_used");
  merge(header.prefetch, given.prefetch, "prefetch");
  merge(header.overlap, given.overlap, "overlap");
  merge(header.cache_auto, given.cache_auto, "cache_auto");
  for (const auto& kv : given.given) header.given.push_back(kv);
  return header;
}

}  // namespace moe_residency
