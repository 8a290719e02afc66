#pragma once
/// replay/oracle_profile.hpp: the per-layer oracle profile of a dynamic replay
/// (`replay --speculate oracle:P,FILE` or `--oracle-profile FILE`): the
/// probability P in [0, 1] that the oracle keeps a true slot, one per layer of
/// the shape, for `replay_speculation::oracle_profile`. Two forms:
///
///   0.9            one P per line, layer 0 first, every layer listed
///   0.8 ...
///
///   layer,P        `layer,P` lines in any order, every layer exactly once
///   0,0.9          (a first line that starts with a letter is a header)
///
/// '#' comments and empty lines are skipped; spaces around a field and
/// carriage returns are ignored, and so is a UTF-8 byte-order mark;
/// compressed or UTF-16 data is refused naming it. Standard library only.

#include <cctype>
#include <cstddef>
#include <cstdlib>
#include <string>
#include <vector>

#include "moe_residency/detail/numbers.hpp"
#include "moe_residency/detail/text_encoding.hpp"
#include "moe_residency/error.hpp"

namespace moe_residency {

/// Parses a profile for a shape of `n_layers` layers. Throws `error` starting
/// with `source` and naming the line and the value on a P that is not a number
/// in [0, 1], a layer that is not a whole number below `n_layers` or is listed
/// twice, a file that mixes the two forms, and a layer with no P.
inline std::vector<double> parse_oracle_profile(const std::string& whole_text, const std::string& source,
                                                std::size_t n_layers) {
  detail::check_text_encoding(whole_text, source, "an oracle profile (one P per line, or layer,P lines)");
  const std::string text(detail::strip_utf8_bom(whole_text));
  auto trim = [](const std::string& s) {
    const auto a = s.find_first_not_of(" \t\r"), b = s.find_last_not_of(" \t\r");
    return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
  };
  std::vector<double> by_line, by_layer(n_layers, -1.0);
  std::vector<std::size_t> layer_line(n_layers, 0);
  std::size_t n = 0, pos = 0, content = 0, keyed_line = 0, plain_line = 0;
  while (pos < text.size()) {
    std::size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    const std::string line = trim(text.substr(pos, eol - pos));
    pos = eol + 1;
    ++n;
    if (line.empty() || line[0] == '#') continue;
    if (++content == 1 && std::isalpha(static_cast<unsigned char>(line[0]))) continue;  // a header
    const std::string where = source + ": line " + std::to_string(n) + ": ";
    const auto comma = line.find(',');
    const std::string pv = trim(comma == std::string::npos ? line : line.substr(comma + 1));
    const double p = detail::parse_real(pv, where + "P (a probability)", detail::real_domain::closed(0, 1));
    if (comma == std::string::npos) {
      if (keyed_line)
        throw error(where + "'" + line + "' without a layer; expected layer,P like line " + std::to_string(keyed_line) +
                    " (one form per file)");
      plain_line = n;
      by_line.push_back(p);
      continue;
    }
    if (plain_line)
      throw error(where + "'" + line + "' with a layer; expected one P per line like line " +
                  std::to_string(plain_line) + " (one form per file)");
    keyed_line = n;
    const std::string lv = trim(line.substr(0, comma));
    if (n_layers == 0) throw error(where + "a layer, but the model has no layers");
    const std::size_t l = detail::parse_whole<std::size_t>(lv, where + "layer", 0, n_layers - 1);
    if (layer_line[l])
      throw error(where + "layer " + lv + " again (first on line " + std::to_string(layer_line[l]) +
                  "); expected every layer once");
    layer_line[l] = n;
    by_layer[l] = p;
  }
  if (keyed_line) {
    for (std::size_t l = 0; l < n_layers; ++l)
      if (!layer_line[l]) throw error(source + ": layer " + std::to_string(l) + " has no P");
    return by_layer;
  }
  if (by_line.size() != n_layers)
    throw error(source + ": " + std::to_string(by_line.size()) + " values; expected " + std::to_string(n_layers) +
                " (one P per layer)");
  return by_line;
}

}  // namespace moe_residency
