#!/usr/bin/env python3
"""The Python module's cost against the moe-residency tool, measured in the same run
(a benchmark, not a test: these machines are shared and noisy).

1. A policy x budget grid: `moe-residency replay --format csv` (the process, the parse, the
   grid) against `moe_residency.replay` from the path (the same parse and the same grid),
   the median of --repeat runs each, interleaved; and the cells alone (each cell's own
   time, summed; the tool's JSON reports it). Aim: Python within 10% of the tool.
2. A Python-defined LRU against the built-in one: seconds per lookup of one cell.

    cmake --preset release -DMOE_RESIDENCY_BUILD_PYTHON=ON -DPython3_EXECUTABLE=/usr/bin/python3
    cmake --build --preset release --target moe_residency_python moe_residency_cli
    PYTHONPATH=build/release/python python3 benchmarks/python/bench_python.py \\
        --cli build/release/bin/moe-residency --traces ../shared/traces
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import OrderedDict

import moe_residency as mr

POLICIES = "lru,lfu,layer,layerlfu,belady,cycle,arc,s3fifo,sieve"
BUDGETS = "250,500,750,1000,1500,2000,2500,3000,4000,6000,8000"


class PyLRU:
    name = "py-lru"

    def __init__(self):
        self.order = OrderedDict()

    def on_hit(self, slot):
        self.order.move_to_end(slot)

    on_repeat = on_hit

    def on_insert(self, slot):
        self.order[slot] = None

    def on_evict(self, slot):
        del self.order[slot]

    def victim(self, view, layer):
        for slot in self.order:
            if view.evictable(slot):
                return slot
        return None


def timed(f):
    t0 = time.perf_counter()
    out = f()
    return time.perf_counter() - t0, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", default="build/release/bin/moe-residency")
    ap.add_argument("--traces", default=os.environ.get("MOE_RESIDENCY_TRACES", "../shared/traces"))
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    print("module %s (%s); tool %s; %d cores" % (mr.__version__, mr._core.__file__, a.cli, os.cpu_count()))
    budgets = [float(b) for b in BUDGETS.split(",")]
    policies = POLICIES.split(",")
    for name in ("qwen", "gptoss"):
        path = os.path.join(a.traces, name + ".route.csv")
        cmd = [a.cli, "replay", "--trace", path, "--budgets", BUDGETS, "--policies", POLICIES, "--format", "csv",
               "--threads", str(a.threads)]
        cli_s, py_s = [], []
        for _ in range(a.repeat):  # interleaved, so drift hits both alike
            s, out = timed(lambda: subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
            cli_s.append(s)
            s, r = timed(lambda: mr.replay(path, budgets=budgets, policies=policies, threads=a.threads))
            py_s.append(s)
        assert r.to_csv() == out, "the module and the tool disagree"
        c, p = statistics.median(cli_s), statistics.median(py_s)
        print("%-7s grid %d cells, end to end: tool %.1f ms, Python %.1f ms (median of %d): Python / tool = %.3f" % (
            name, len(budgets) * len(policies), 1e3 * c, 1e3 * p, a.repeat, p / c))
        # The cells alone (each one's own wall time, summed): the tool's JSON reports them,
        # so process start and parsing are out of both figures.
        cli_cells, py_cells = [], []
        jcmd = cmd[:cmd.index("--format")] + ["--format", "json", "--threads", "1"]
        t = mr.read_trace(path)
        for _ in range(a.repeat):
            j = json.loads(subprocess.run(jcmd, capture_output=True, text=True, check=True).stdout)
            cli_cells.append(sum(cell["seconds"] for cell in j["cells"]))
            py_cells.append(float(mr.replay(t, budgets=budgets, policies=policies, threads=1).seconds.sum()))
        c, p = statistics.median(cli_cells), statistics.median(py_cells)
        print("%-7s grid cells alone, 1 thread: tool %.1f ms, Python %.1f ms: Python / tool = %.3f" % (
            name, 1e3 * c, 1e3 * p, p / c))

        t = mr.read_trace(path)
        builtin, python = [], []
        for _ in range(max(3, a.repeat // 3)):
            s, rb = timed(lambda: mr.replay(t, budgets=[2000], policies=["lru"], threads=1))
            builtin.append(s)
            s, rp = timed(lambda: mr.replay(t, budgets=[2000], policies=[PyLRU]))
            python.append(s)
        assert rb.hits[0] == rp.hits[0] and rb.evictions[0] == rp.evictions[0]
        n = int(rb.lookups[0])
        b, q = statistics.median(builtin), statistics.median(python)
        print("%-7s LRU at 2000 MiB, %d lookups: built-in %.1f ns/lookup, Python policy %.0f ns/lookup (%.0fx)" % (
            name, n, 1e9 * b / n, 1e9 * q / n, q / b))


if __name__ == "__main__":
    sys.exit(main())
