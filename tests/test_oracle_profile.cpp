// replay/oracle_profile.hpp: the per-layer oracle profile of `replay --speculate
// oracle:P,FILE`. Its two forms, and an error naming the file, the line and the
// value for each defect — including the ones the CLI's own reader let through
// before it moved here (trailing text after P or the layer, a layer listed twice,
// the two forms mixed: each silently gave a profile nobody wrote).

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "moe_residency/replay/oracle_profile.hpp"

using namespace moe_residency;

TEST_CASE("oracle profile: one P per line, or layer,P lines in any order") {
  CHECK(parse_oracle_profile("0.9\n0.8\n0.5\n", "p.csv", 3) == std::vector<double>{0.9, 0.8, 0.5});
  CHECK(parse_oracle_profile("# comment\nlayer,P\n2,0.5\r\n0, 0.9\n1,0.8\n", "p.csv", 3) ==
        std::vector<double>{0.9, 0.8, 0.5});
  CHECK(parse_oracle_profile("P\n1\n0\n", "p.csv", 2) == std::vector<double>{1.0, 0.0});
}

TEST_CASE("oracle profile: each defect is an error naming the file, the line and the value") {
  CHECK_THROWS_WITH_AS(parse_oracle_profile("0.9\n1.5\n", "p.csv", 2),
                       "p.csv: line 2: P (a probability): '1.5' is out of range; expected a number from 0 to 1", error);
  CHECK_THROWS_WITH_AS(parse_oracle_profile("0.9\n0.5x\n", "p.csv", 2),
                       "p.csv: line 2: P (a probability): '0.5x' is not a number; expected a number from 0 to 1",
                       error);
  CHECK_THROWS_WITH_AS(
      parse_oracle_profile("0,0.9\n1x,0.5\n", "p.csv", 2),
      "p.csv: line 2: layer: '1x' is not a whole number in decimal digits; expected a whole number from 0 to 1", error);
  CHECK_THROWS_WITH_AS(parse_oracle_profile("0,0.9\n2,0.5\n", "p.csv", 2),
                       "p.csv: line 2: layer: '2' is out of range; expected a whole number from 0 to 1", error);
  CHECK_THROWS_WITH_AS(parse_oracle_profile("0,0.9\n0,0.5\n1,0.5\n", "p.csv", 2),
                       "p.csv: line 2: layer 0 again (first on line 1); expected every layer once", error);
  CHECK_THROWS_WITH_AS(parse_oracle_profile("0,0.9\n0.5\n", "p.csv", 2),
                       "p.csv: line 2: '0.5' without a layer; expected layer,P like line 1 (one form per file)", error);
  CHECK_THROWS_WITH_AS(parse_oracle_profile("0.9\n1,0.5\n", "p.csv", 2),
                       "p.csv: line 2: '1,0.5' with a layer; expected one P per line like line 1 (one form per file)",
                       error);
  CHECK_THROWS_WITH_AS(parse_oracle_profile("0,0.9\n", "p.csv", 2), "p.csv: layer 1 has no P", error);
  CHECK_THROWS_WITH_AS(parse_oracle_profile("0.9\n", "p.csv", 2), "p.csv: 1 values; expected 2 (one P per layer)",
                       error);
}

TEST_CASE("oracle profile: a byte-order mark is skipped; compressed data, UTF-16 and empty values are refused") {
  CHECK(parse_oracle_profile("\xef\xbb\xbf"
                             "0.9\n0.8\n",
                             "p.csv", 2) == std::vector<double>{0.9, 0.8});
  CHECK(parse_oracle_profile("\xef\xbb\xbflayer,P\n1,0.8\n0,0.9\n", "p.csv", 2) == std::vector<double>{0.9, 0.8});
  CHECK_THROWS_WITH_AS(parse_oracle_profile(std::string("\x1f\x8b\x08\x00", 4), "p.csv.gz", 2),
                       "p.csv.gz: is gzip-compressed data (magic bytes 1f 8b); expected an oracle profile (one P per "
                       "line, or layer,P lines): decompress it first (gunzip -k FILE)",
                       error);
  CHECK_THROWS_WITH_AS(parse_oracle_profile(std::string("\xff\xfe"
                                                        "0\0.\0"
                                                        "9\0",
                                                        8),
                                            "p.csv", 1),
                       "p.csv: is UTF-16 text (byte-order mark ff fe); expected an oracle profile (one P per line, or "
                       "layer,P lines): convert it to UTF-8 first (iconv -f UTF-16 -t UTF-8 FILE)",
                       error);
  CHECK_THROWS_WITH_AS(parse_oracle_profile("0,0.9\n1,\n", "p.csv", 2),
                       "p.csv: line 2: P (a probability): empty; expected a number from 0 to 1", error);
  CHECK_THROWS_WITH_AS(parse_oracle_profile("0,0.9\n,0.5\n", "p.csv", 2),
                       "p.csv: line 2: layer: empty; expected a whole number from 0 to 1", error);
  CHECK_THROWS_WITH_AS(parse_oracle_profile("0.9\n0x1\n", "p.csv", 2),
                       "p.csv: line 2: P (a probability): '0x1' is not a decimal number; expected a number from 0 to 1",
                       error);
}
