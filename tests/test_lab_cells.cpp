// timing/lab_cells.hpp: the memory lab's cells file that `lab-predict --cells`
// reads: what it accepts, and an error naming the file, the line, the value and
// what was expected for each malformed line.

#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "moe_residency/timing/lab_cells.hpp"

using namespace moe_residency;

namespace {

// As scripts/memlab-predict.sh writes it (a run that did not finish has no metrics).
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

TEST_CASE("lab cells: a malformed line is an error naming the file, the line, the value and what was expected") {
  SUBCASE("the number of fields") {
    CHECK_THROWS_WITH_AS(parse_lab_cells(cells_with("2.5,exact,563"), "cells.csv"),
                         "cells.csv: line 3: 3 fields; expected ratio,config,limit_mib,budget_mib,stale_gate_pct,metrics",
                         error);
    CHECK_THROWS_WITH_AS(parse_lab_cells(cells_with("2.5,cache,563,141,87.1,m.csv,extra"), "cells.csv"),
                         doctest::Contains("cells.csv: line 3: 7 fields; expected"), error);
  }
  SUBCASE("an unknown configuration") {
    CHECK_THROWS_WITH_AS(parse_lab_cells(cells_with("2.5,turbo,563,141,87.1,m.csv"), "cells.csv"),
                         "cells.csv: line 3, config: lab configuration 'turbo'; expected mmap, observer, dense, exact, "
                         "predicted, cache, all, degraded or resident",
                         error);
  }
  SUBCASE("a number that is not one, negative, not finite, or a percentage above 100") {
    CHECK_THROWS_WITH_AS(parse_lab_cells(cells_with("2.5,cache,563MiB,141,87.1,m.csv"), "cells.csv"),
                         "cells.csv: line 3, limit_mib '563MiB'; expected a finite number >= 0", error);
    CHECK_THROWS_WITH_AS(parse_lab_cells(cells_with("2.5,cache,563,-1,87.1,m.csv"), "cells.csv"),
                         "cells.csv: line 3, budget_mib '-1'; expected a finite number >= 0", error);
    CHECK_THROWS_WITH_AS(parse_lab_cells(cells_with("2.5,cache,inf,141,87.1,m.csv"), "cells.csv"),
                         "cells.csv: line 3, limit_mib 'inf'; expected a finite number >= 0", error);
    CHECK_THROWS_WITH_AS(parse_lab_cells(cells_with("2.5,cache,563,,87.1,m.csv"), "cells.csv"),
                         "cells.csv: line 3, budget_mib ''; expected a finite number >= 0", error);
    CHECK_THROWS_WITH_AS(parse_lab_cells(cells_with("2.5,cache,563,141,871,m.csv"), "cells.csv"),
                         "cells.csv: line 3, stale_gate_pct '871'; expected a finite number >= 0 and <= 100", error);
  }
  SUBCASE("an empty ratio, a cell listed twice, no cells") {
    CHECK_THROWS_WITH_AS(parse_lab_cells(cells_with(",cache,563,141,87.1,m.csv"), "cells.csv"),
                         "cells.csv: line 3: ratio ''; expected the run's memory ratio, e.g. 2.5", error);
    CHECK_THROWS_WITH_AS(parse_lab_cells(cells_with("2.5,exact,600,141,87.1,n.csv"), "cells.csv"),
                         "cells.csv: line 3: cell exact@2.5 again (first on line 2); expected each configuration once "
                         "per ratio",
                         error);
    CHECK_THROWS_WITH_AS(parse_lab_cells("ratio,config,limit_mib,budget_mib,stale_gate_pct,metrics\n# none\n", "cells.csv"),
                         "cells.csv: no cells; expected lines ratio,config,limit_mib,budget_mib,stale_gate_pct,metrics",
                         error);
  }
}
