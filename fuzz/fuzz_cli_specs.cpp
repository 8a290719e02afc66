// libFuzzer target: the short specifications the CLI parses from a user's
// string. The first byte picks the parser, the rest is the text:
//   0  parse_replay_speculation (`replay --speculate`, `whatif --speculate`)
//   1  detail::parse_replay_policy (`replay --policies`, `whatif --policies`)
//   2  parse_lab_config (`lab-predict --fit CONFIG@RATIO`, the cells' config)
// Any input ends in moe_residency::error quoting the text (the part it is
// about), or in a value whose own name parses back to the same value.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_check.hpp"
#include "moe_residency/replay.hpp"
#include "moe_residency/timing/lab.hpp"

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
  if (size == 0) return 0;
  const std::string text = moe_residency_fuzz::text_of(data + 1, size - 1);
  switch (data[0] % 3) {
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
