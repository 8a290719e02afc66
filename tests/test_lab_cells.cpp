// moe_residency_lab/cells.hpp: the memory lab's cells file that `lab-predict --cells`
// reads, and the fault walk's file (`lab-predict --fault-walk`): what each
// accepts, and an error naming the file, the line, the value and what was
// expected for each malformed line.

#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "moe_residency_lab/cells.hpp"

using namespace moe_residency;
using namespace moe_residency::lab;

namespace {

// As lab/memlab.sh predict writes it (a run that did not finish has no metrics).
const char* const memlab =
    "ratio,config,limit_mib,budget_mib,stale_gate_pct,metrics\n"
    "2.5,exact,563,141,87.1,/runs/r2.5-exact.metrics.csv\n"
    "2.5,mmap,563,141,87.1,\n"
    "2.5,resident,0,141,87.1,/runs/r2.5-resident.metrics.csv\n";

std::string cells_with(const std::string& line) {
  return std::string("ratio,config,limit_mib,budget_mib,stale_gate_pct,metrics\n2.5,exact,563,141,87.1,m.csv\n") +
         line + "\n";
}

}  // namespace

TEST_CASE("lab cells: the file memlab-predict writes, and what is skipped") {
  const std::vector<lab_cell> c = parse_lab_cells(memlab, "cells.csv");
  REQUIRE(c.size() == 3);
  CHECK(c[0].ratio == "2.5");
  CHECK(c[0].config == lab_config::exact);
  CHECK(c[0].limit_mib == 563.0);
  CHECK(c[0].budget_mib == 141.0);
  CHECK(c[0].stale_gate_pct == 87.1);
  CHECK(c[0].metrics == "/runs/r2.5-exact.metrics.csv");
  CHECK(c[1].config == lab_config::mmap);
  CHECK(c[1].metrics.empty());
  CHECK(c[2].config == lab_config::resident);
  CHECK(c[2].limit_mib == 0.0);

  SUBCASE("five fields: no metrics; comments, empty lines and CRLF are skipped") {
    const auto d = parse_lab_cells("# lab\r\n\r\n1.5,cache,939,234,100\r\n", "c.csv");
    REQUIRE(d.size() == 1);
    CHECK(d[0].config == lab_config::cache);
    CHECK(d[0].stale_gate_pct == 100.0);
    CHECK(d[0].metrics.empty());
  }
  SUBCASE("format_lab_cells writes what parse_lab_cells reads back exactly") {
    std::vector<lab_cell> e = c;
    e[0].limit_mib = 0.1;  // not exact in binary: 17 digits keep it
    e[1].stale_gate_pct = 100.0 / 3;
    const std::vector<lab_cell> back = parse_lab_cells(format_lab_cells(e), "w.csv");
    REQUIRE(back.size() == e.size());
    for (std::size_t i = 0; i < e.size(); ++i) {
      CHECK(back[i].ratio == e[i].ratio);
      CHECK(back[i].config == e[i].config);
      CHECK(back[i].limit_mib == e[i].limit_mib);
      CHECK(back[i].budget_mib == e[i].budget_mib);
      CHECK(back[i].stale_gate_pct == e[i].stale_gate_pct);
      CHECK(back[i].metrics == e[i].metrics);
    }
  }
}

TEST_CASE("lab cells: an A/B campaign's cells, one configuration at several lanes, each by its label") {
  const std::string text =
      "ratio,config,limit_mib,budget_mib,stale_gate_pct,metrics,lanes,label\n"
      "2.5,exact,563,141,87.1,a.csv,1,exact-l1\n"
      "2.5,exact,563,141,87.1,b.csv,4,exact-l4\n"
      "2.5,all,563,141,87.1,c.csv\n";
  const std::vector<lab_cell> c = parse_lab_cells(text, "ab.csv");
  REQUIRE(c.size() == 3);
  CHECK(c[0].lanes == 1);
  CHECK(c[1].lanes == 4);
  CHECK(c[1].id() == "exact-l4");
  CHECK(c[2].lanes == 0);
  CHECK(c[2].label.empty());
  CHECK(c[2].id() == "all@2.5");
  // Written and read back, lanes and labels kept; a file without either stays six fields.
  const std::vector<lab_cell> back = parse_lab_cells(format_lab_cells(c), "w.csv");
  REQUIRE(back.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(back[i].lanes == c[i].lanes);
    CHECK(back[i].label == c[i].label);
    CHECK(back[i].metrics == c[i].metrics);
  }
  CHECK(format_lab_cells({c[2]}).rfind("ratio,config,limit_mib,budget_mib,stale_gate_pct,metrics\n", 0) == 0);
  // The same label twice is the same cell twice.
  CHECK_THROWS_WITH_AS(parse_lab_cells(text + "1.5,cache,939,234,87.1,d.csv,,exact-l4\n", "ab.csv"),
                       doctest::Contains("ab.csv: line 5: cell exact-l4 again (first on line 3)"), error);
}

TEST_CASE("lab cells: a malformed line is an error naming the file, the line, the value and what was expected") {
  SUBCASE("the number of fields") {
    CHECK_THROWS_WITH_AS(
        parse_lab_cells(cells_with("2.5,exact,563"), "cells.csv"),
        "cells.csv: line 3: 3 fields; expected ratio,config,limit_mib,budget_mib,stale_gate_pct,metrics (and "
        "optionally lanes,label)",
        error);
    CHECK_THROWS_WITH_AS(parse_lab_cells(cells_with("2.5,cache,563,141,87.1,m.csv,4,l,extra"), "cells.csv"),
                         doctest::Contains("cells.csv: line 3: 9 fields; expected"), error);
    CHECK_THROWS_WITH_AS(parse_lab_cells(cells_with("2.5,cache,563,141,87.1,m.csv,extra"), "cells.csv"),
                         "cells.csv: line 3, lanes: 'extra' is not a whole number in decimal digits; expected a whole "
                         "number from 1 to 64",
                         error);
    CHECK_THROWS_WITH_AS(parse_lab_cells(cells_with("2.5,cache,563,141,87.1,m.csv,0,"), "cells.csv"),
                         doctest::Contains("cells.csv: line 3, lanes: '0'"), error);
    CHECK_THROWS_WITH_AS(parse_lab_cells(cells_with("2.5,cache,563,141,87.1,m.csv,2,a b"), "cells.csv"),
                         "cells.csv: line 3, label: 'a b'; expected letters, digits and ._@+- only", error);
    CHECK_THROWS_WITH_AS(
        parse_lab_cells(cells_with("2.5,cache,563,141,87.1,m.csv,2," + std::string(65, 'x')), "cells.csv"),
        "cells.csv: line 3, label: 65 characters; expected at most 64", error);
    CHECK_THROWS_WITH_AS(
        parse_lab_cells(cells_with(std::string(17, '2') + ",cache,563,141,87.1,m.csv"), "cells.csv"),
        "cells.csv: line 3: ratio of 17 characters; expected the run's memory ratio, e.g. 2.5 (at most 16 "
        "characters)",
        error);
    CHECK(parse_lab_cells(cells_with("2.5,cache,563,141,87.1,m.csv,2," + std::string(64, 'x')), "cells.csv")[1].label ==
          std::string(64, 'x'));
  }
  SUBCASE("an unknown configuration") {
    CHECK_THROWS_WITH_AS(parse_lab_cells(cells_with("2.5,turbo,563,141,87.1,m.csv"), "cells.csv"),
                         "cells.csv: line 3, config: lab configuration 'turbo'; expected mmap, observer, dense, exact, "
                         "predicted, cache, all, degraded, resident, mmap-128k, exact-cache, all-oracle or "
                         "all-oracle-pool",
                         error);
  }
  SUBCASE("a number that is not one, negative, not finite, or a percentage above 100") {
    CHECK_THROWS_WITH_AS(parse_lab_cells(cells_with("2.5,cache,563MiB,141,87.1,m.csv"), "cells.csv"),
                         "cells.csv: line 3, limit_mib: '563MiB' is not a number; expected a finite number >= 0",
                         error);
    CHECK_THROWS_WITH_AS(parse_lab_cells(cells_with("2.5,cache,563,-1,87.1,m.csv"), "cells.csv"),
                         "cells.csv: line 3, budget_mib: '-1' is out of range; expected a finite number >= 0", error);
    CHECK_THROWS_WITH_AS(parse_lab_cells(cells_with("2.5,cache,inf,141,87.1,m.csv"), "cells.csv"),
                         "cells.csv: line 3, limit_mib: 'inf' is not finite; expected a finite number >= 0", error);
    CHECK_THROWS_WITH_AS(parse_lab_cells(cells_with("2.5,cache,563,,87.1,m.csv"), "cells.csv"),
                         "cells.csv: line 3, budget_mib: empty; expected a finite number >= 0", error);
    CHECK_THROWS_WITH_AS(parse_lab_cells(cells_with("2.5,cache,563,141,871,m.csv"), "cells.csv"),
                         "cells.csv: line 3, stale_gate_pct: '871' is out of range; expected a number from 0 to 100",
                         error);
  }
  SUBCASE("a control character in the ratio or the metrics path (a carriage return would not survive a write)") {
    CHECK_THROWS_WITH_AS(parse_lab_cells(cells_with("2.5,cache,563,141,87.1,m.csv\r,,"), "cells.csv"),
                         "cells.csv: line 3, metrics: a control character (byte 13); expected the path of the run's "
                         "metrics CSV",
                         error);
    CHECK_THROWS_WITH_AS(parse_lab_cells(cells_with("2\t5,cache,563,141,87.1,m.csv"), "cells.csv"),
                         "cells.csv: line 3, ratio: a control character (byte 9); expected the run's memory ratio, "
                         "e.g. 2.5",
                         error);
  }
  SUBCASE("an empty ratio, a cell listed twice, no cells") {
    CHECK_THROWS_WITH_AS(parse_lab_cells(cells_with(",cache,563,141,87.1,m.csv"), "cells.csv"),
                         "cells.csv: line 3: ratio ''; expected the run's memory ratio, e.g. 2.5", error);
    CHECK_THROWS_WITH_AS(parse_lab_cells(cells_with("2.5,exact,600,141,87.1,n.csv"), "cells.csv"),
                         "cells.csv: line 3: cell exact@2.5 again (first on line 2); expected each configuration once "
                         "per ratio, or a label for each",
                         error);
    CHECK_THROWS_WITH_AS(
        parse_lab_cells("ratio,config,limit_mib,budget_mib,stale_gate_pct,metrics\n# none\n", "cells.csv"),
        "cells.csv: no cells; expected lines ratio,config,limit_mib,budget_mib,stale_gate_pct,metrics", error);
  }
}

TEST_CASE("fault walk: the file memlab writes, a cell's rows averaged, and a malformed line named") {
  // As the lab (lab/memlab.sh) writes it: the cell's limit, then moe-disk-lanes --fault-walk's row
  // (two rounds of the same shapes appended, as lab/memlab.sh predict passes them).
  const std::string header =
      "limit_mib,pinned_dense_mib,tokens,walked_mib_per_token,read_mib_per_token,wall_ms,cpu_ms,sys_ms,majflt,"
      "off_cpu_ms_per_mib,sys_ms_per_mib,mib_per_fault\n";
  const std::string text = header +
                           "939,0.0,22,310.1,1100.0,1067.14,521.62,513.76,101.0,0.5000,0.4600,10.89\n"
                           "939,110.2,22,310.1,1101.9,1090.27,534.16,528.21,101.0,0.5100,0.4800,10.91\n"
                           "# round 2\n" +
                           header +
                           "563,0,22,310.1,1377.1,1408.25,569.83,560.78,83.1,0.6000,0.4000,16.58\r\n"
                           "563,110.2,22,310.1,1245.1,1572.10,607.11,603.54,104.5,0.7700,0.4800,11.91\n"
                           "563.4,0,22,310.1,1377.1,1240.12,509.47,504.29,83.1,0.5000,0.3600,16.58\n";
  const std::vector<fault_walk_row> rows = parse_fault_walk(text, "fault-walk.csv");
  REQUIRE(rows.size() == 5);
  CHECK(rows[1].limit_mib == 939);
  CHECK(rows[1].pinned_dense_mib == doctest::Approx(110.2));
  CHECK(rows[1].off_cpu_ms_per_mib == doctest::Approx(0.51));
  CHECK(rows[1].sys_ms_per_mib == doctest::Approx(0.48));
  // A cell's shape: its limit (within 0.5 MiB) and whether its dense pages are locked;
  // the mean of every matching row.
  lab_setup s;
  CHECK(apply_fault_walk(rows, 563, false, s));
  CHECK(s.fault_walk_off_cpu_ms_per_mib == doctest::Approx(0.55));
  CHECK(s.fault_walk_sys_ms_per_mib == doctest::Approx(0.38));
  CHECK(apply_fault_walk(rows, 563, true, s));
  CHECK(s.fault_walk_off_cpu_ms_per_mib == doctest::Approx(0.77));
  CHECK(apply_fault_walk(rows, 939, false, s));
  CHECK(s.fault_walk_off_cpu_ms_per_mib == doctest::Approx(0.50));
  // No row for the shape: false, the setup unchanged.
  lab_setup none;
  CHECK_FALSE(apply_fault_walk(rows, 700, false, none));
  CHECK(none.fault_walk_off_cpu_ms_per_mib == 0);
  CHECK(none.fault_walk_sys_ms_per_mib == 0);

  CHECK_THROWS_WITH_AS(
      parse_fault_walk(header + "563,0,22,310.1,1377.1,1408.25\n", "w.csv"),
      "w.csv: line 2: 6 fields; expected 12: limit_mib,pinned_dense_mib,tokens,walked_mib_per_token,"
      "read_mib_per_token,wall_ms,cpu_ms,sys_ms,majflt,off_cpu_ms_per_mib,sys_ms_per_mib,mib_per_fault",
      error);
  CHECK_THROWS_WITH_AS(parse_fault_walk(header + "563,0,22,310.1,1377.1,1408.25,1,1,1,0.6,0.4,16.58,9\n", "w.csv"),
                       doctest::Contains("w.csv: line 2: 13 fields; expected 12"), error);
  CHECK_THROWS_WITH_AS(parse_fault_walk(header + "563,0,22,310.1,1377.1,1408.25,1,1,1,nan,0.4,16.58\n", "w.csv"),
                       "w.csv: line 2, off_cpu_ms_per_mib: 'nan' is not finite; expected a finite number >= 0", error);
  CHECK_THROWS_WITH_AS(parse_fault_walk(header + "563,0,22,310.1,1377.1,1408.25,1,1,1,0.6,-0.4,16.58\n", "w.csv"),
                       "w.csv: line 2, sys_ms_per_mib: '-0.4' is out of range; expected a finite number >= 0", error);
  CHECK_THROWS_WITH_AS(parse_fault_walk(header + "563MiB,0,22,310.1,1377.1,1408.25,1,1,1,0.6,0.4,16.58\n", "w.csv"),
                       "w.csv: line 2, limit_mib: '563MiB' is not a number; expected a finite number >= 0", error);
  CHECK_THROWS_WITH_AS(parse_fault_walk(header, "w.csv"),
                       "w.csv: no rows; expected lines of moe-disk-lanes --fault-walk, the limit first", error);
}

TEST_CASE("inline walk: the file memlab writes, a cache cell's rows averaged, and a malformed line named") {
  // As the lab (lab/memlab.sh) writes it: the cell's limit, then moe-disk-lanes --inline-walk's row
  // (a round's file and the walk after the run, appended).
  const std::string header =
      "limit_mib,budget_mib,tokens,pins_per_token,read_mib_per_token,wall_ms,cpu_ms,sys_ms,off_cpu_ms_per_mib,"
      "sys_ms_per_mib\n";
  const std::string text = header +
                           "939,235.0,22,79.0,36.4,64.18,51.82,33.07,0.3400,0.9097\n"
                           "563,141.0,22,89.7,58.4,90.71,80.89,64.80,0.1681,1.1097\r\n"
                           "# after the run\n" +
                           header + "563.3,141.0,22,89.7,58.1,92.00,81.00,66.10,0.2319,1.1503\n";
  const std::vector<inline_walk_row> rows = parse_inline_walk(text, "inline-walk.csv");
  REQUIRE(rows.size() == 3);
  CHECK(rows[0].limit_mib == 939);
  CHECK(rows[0].budget_mib == doctest::Approx(235));
  CHECK(rows[1].off_cpu_ms_per_mib == doctest::Approx(0.1681));
  CHECK(rows[1].sys_ms_per_mib == doctest::Approx(1.1097));
  lab_setup s;
  CHECK(apply_inline_walk(rows, 563, s));  // the median of both 563 rows (within 0.5 MiB): their mean
  CHECK(s.inline_walk_off_cpu_ms_per_mib == doctest::Approx(0.2));
  CHECK(s.inline_walk_sys_ms_per_mib == doctest::Approx(1.13));
  // Three walks, one of them caught in a device stall (run L's, the run history docs/lab-predict.md links): the median of
  // each column, which the stalled walk does not move, where the mean would be 0.54 off the CPU.
  const std::vector<inline_walk_row> three =
      parse_inline_walk(header +
                            "563,141.0,22,89.7,58.4,91.59,80.77,62.70,0.1853,1.0738\n"
                            "563,141.0,22,89.7,58.4,169.05,104.46,89.36,1.1060,1.5304\n"
                            "563,141.0,22,89.7,58.4,107.22,88.56,71.47,0.3192,1.2230\n",
                        "three.csv");
  lab_setup m;
  CHECK(apply_inline_walk(three, 563, m));
  CHECK(m.inline_walk_off_cpu_ms_per_mib == doctest::Approx(0.3192));
  CHECK(m.inline_walk_sys_ms_per_mib == doctest::Approx(1.2230));
  CHECK(s.fault_walk_off_cpu_ms_per_mib == 0);  // the fault cells' walk is another file
  CHECK(apply_inline_walk(rows, 939, s));
  CHECK(s.inline_walk_off_cpu_ms_per_mib == doctest::Approx(0.34));
  lab_setup none;
  CHECK_FALSE(apply_inline_walk(rows, 700, none));
  CHECK(none.inline_walk_off_cpu_ms_per_mib == 0);
  CHECK(none.inline_walk_sys_ms_per_mib == 0);

  // A fault walk's file given for it: the field count says which tool's lines were expected.
  CHECK_THROWS_WITH_AS(parse_inline_walk(header + "563,0,22,310.1,1377.1,1408.25,1,1,1,0.6,0.4,16.58\n", "w.csv"),
                       "w.csv: line 2: 12 fields; expected 10: limit_mib,budget_mib,tokens,pins_per_token,"
                       "read_mib_per_token,wall_ms,cpu_ms,sys_ms,off_cpu_ms_per_mib,sys_ms_per_mib",
                       error);
  CHECK_THROWS_WITH_AS(parse_inline_walk(header + "563,141,22,89.7,58.4,90.71,80.89,64.80,inf,1.1\n", "w.csv"),
                       "w.csv: line 2, off_cpu_ms_per_mib: 'inf' is not finite; expected a finite number >= 0", error);
  CHECK_THROWS_WITH_AS(parse_inline_walk(header + "563,141,22,89.7,58.4,90.71,80.89,64.80,0.2,-1\n", "w.csv"),
                       "w.csv: line 2, sys_ms_per_mib: '-1' is out of range; expected a finite number >= 0", error);
  CHECK_THROWS_WITH_AS(parse_inline_walk("# nothing\n" + header, "w.csv"),
                       "w.csv: no rows; expected lines of moe-disk-lanes --inline-walk, the limit first", error);
}
