// libFuzzer target: the short specifications the CLI parses from a user's
// string. The first byte picks the parser, the rest is the text:
//   0  parse_replay_speculation (`replay --speculate`, `whatif --speculate`)
//   1  detail::parse_replay_policy (`replay --policies`, `whatif --policies`)
//   2  parse_lab_config (`lab-predict --fit CONFIG@RATIO`, the cells' config)
//   3  the checked number parsers (detail/numbers.hpp) behind every numeric
//      option and file field; the next byte picks the domain or the range
// Any input ends in moe_residency::error quoting the text (the part it is
// about), or in a value whose own name parses back to the same value.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>

#include "fuzz_check.hpp"
#include "moe_residency/detail/numbers.hpp"
#include "moe_residency/replay.hpp"
#include "moe_residency_lab/lab.hpp"

namespace {

using moe_residency_fuzz::check;

void check_error(const moe_residency::error& e, const std::string& text) {
  const std::string m = e.what();
  check(!m.empty() && m.size() < 4096 + 2 * text.size(), "empty or overlong message");
  // what() is a C string: a NUL in the text ends the message there.
  check(m.find(text.substr(0, text.find('\0'))) != std::string::npos, "the message does not quote the text", m);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace moe_residency;
  using namespace moe_residency::lab;
  if (size == 0) return 0;
  const std::string text = moe_residency_fuzz::text_of(data + 1, size - 1);
  switch (data[0] % 4) {
    case 0: {
      replay_speculation s;
      try {
        s = parse_replay_speculation(text);
      } catch (const error& e) {
        check_error(e, text);
        return 0;
      }
      check(s.source != speculation_source::oracle || (s.oracle_p >= 0 && s.oracle_p <= 1), "oracle P outside [0, 1]");
      const std::string name = s.name();
      replay_speculation t;
      try {
        t = parse_replay_speculation(name);
      } catch (const error& e) {
        moe_residency_fuzz::fail("a speculation's name does not parse", name + ": " + e.what());
      }
      check(t.source == s.source, "name() -> parse changed the source", name);
      check(t.name() == name, "name() is not a fixed point", name);
      if (s.source == speculation_source::oracle)
        check(std::fabs(t.oracle_p - s.oracle_p) <= 5e-6, "name() moved P by more than its printed digits", name);
      break;
    }
    case 1: {
      detail::replay_policy_name p;
      try {
        p = detail::parse_replay_policy(text);
      } catch (const error& e) {
        check_error(e, text);
        return 0;
      }
      check(!p.base.empty(), "an accepted policy with no name");
      bool listed = false;
      for (const std::string& n : replay_policy_names()) listed = listed || n == p.base;
      check(listed, "the canonical base is not a registered policy", p.base);
      const std::string c = p.canonical();
      try {
        const detail::replay_policy_name q = detail::parse_replay_policy(c);
        check(q.base == p.base && q.pred == p.pred, "canonical() -> parse changed the policy", c);
      } catch (const error& e) {
        moe_residency_fuzz::fail("a canonical policy name does not parse", c + ": " + e.what());
      }
      break;
    }
    case 3: {
      if (text.empty()) return 0;
      const unsigned pick = static_cast<unsigned char>(text[0]);
      const std::string t = text.substr(1);
      const detail::real_domain domains[] = {
          detail::real_domain::any(),          detail::real_domain::positive(),
          detail::real_domain::non_negative(), detail::real_domain::closed(0, 1),
          detail::real_domain::open(0, 1),     detail::real_domain::open_closed(0, max_budget_mib)};
      const detail::real_domain& d = domains[pick % 6];
      double v = std::numeric_limits<double>::quiet_NaN();
      const std::string p = detail::real_problem(t, d, &v);
      if (p.empty()) {
        check(std::isfinite(v) && d.contains(v), "an accepted real outside its domain", t);
        check(std::strtod(t.c_str(), nullptr) == v, "an accepted real is not the text's value", t);
        double w = 0;
        check(detail::real_problem(detail::show_number(v), d, &w).empty() && w == v,
              "show_number of an accepted real does not read back", t);
        check(t.find_first_of("xX") == std::string::npos, "an accepted real is hexadecimal", t);
        // As a float: accepted exactly when the float it becomes is finite and in the domain.
        float f = 0;
        const float as_float = static_cast<float>(v);
        const bool float_ok = detail::float_problem(t, d, &f).empty();
        check(float_ok == (std::isfinite(as_float) && d.contains(static_cast<double>(as_float))),
              "float_problem disagrees with the float the value becomes", t);
        check(!float_ok || f == as_float, "an accepted float is not the value's float", t);
      } else {
        check(!detail::float_problem(t, d).empty(), "float_problem accepted what real_problem refused", t);
        check(p.find("expected " + d.describe()) != std::string::npos, "a refusal without the domain", p);
        check(t.empty() || p.find("'" + t + "'") != std::string::npos, "a refusal that does not quote the text", p);
      }
      const std::uint64_t his[] = {std::numeric_limits<std::uint64_t>::max(), 64, 1024, 4294967295u};
      const std::uint64_t lo = pick & 1u, hi = his[(pick >> 1) & 3u];
      std::uint64_t u = 12345;
      const std::string q = detail::whole_problem(t, lo, hi, &u);
      if (q.empty()) {
        check(!t.empty() && t.find_first_not_of("0123456789") == std::string::npos,
              "an accepted whole number "
              "that is not all digits",
              t);
        check(u >= lo && u <= hi, "an accepted whole number outside its range", t);
        const std::size_t nz = t.find_first_not_of('0');
        check(std::to_string(u) == (nz == std::string::npos ? "0" : t.substr(nz)),
              "an accepted whole number "
              "is not the text's value (wrapped?)",
              t);
      } else {
        check(u == 12345, "a refused whole number stored a value", t);
        check(q.find("expected a whole number") != std::string::npos, "a refusal without the range", q);
        check(t.empty() || q.find("'" + t + "'") != std::string::npos, "a refusal that does not quote the text", q);
      }
      break;
    }
    default: {
      lab_config c = lab_config::mmap;
      try {
        c = parse_lab_config(text);
      } catch (const error& e) {
        check_error(e, text);
        return 0;
      }
      check(to_string(c) == text, "a configuration accepted under another name", text);
      break;
    }
  }
  return 0;
}
