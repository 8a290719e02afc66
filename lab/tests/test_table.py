"""The table and the rounds' pooling against what the former bash lab printed for the
same run directories (data/: two fixture runs, data/expected: scripts/memlab.sh's make_table
and pooling at commit 5181162, byte for byte, but for one.txt's configuration column, since widened
to its longest name), and the pooled files against their twins."""

import dataclasses

import os
import shutil
import tempfile
import unittest

from memlab import rundir, stats
from memlab.table import TableSpec, make_table

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
SIZE = 1476526080  # the quick model's bytes


def spec(ratios, configs, unlimited=()):
    return TableSpec("quick", "qwen3moe-L12-E128-k8-d1024-ff512-q4_K.gguf", SIZE // 1048576, 8, 16, "2", "OMP_WAIT_POLICY=PASSIVE", 0,
                     "2 cores, 24 GiB, Linux 6.1.0, cgroup v1", ratios, configs,
                     {r: int("%.0f" % (SIZE / float(r) / 1048576)) for r in ratios}, set(unlimited), 294912, 2,
                     extended=True)


def read(path):
    with open(path) as f:
        return f.read()


class Table(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="memlab-test-")

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def copy(self, name):
        d = os.path.join(self.tmp, name)
        shutil.copytree(os.path.join(DATA, name), d)
        return d

    def test_one_round(self):
        """Finished, killed and timed-out cells, a digest that differs and one missing, runs without a
        limit repeated under each ratio, the roofline from the expert curve and the resident run."""
        d = self.copy("run-one")
        ratios, configs = ["1.5", "2.5"], ["mmap", "observer", "all", "cache", "degraded", "resident", "manager-exact"]
        rundir.copy_unlimited(d, ratios, ["resident", "manager-exact"], only_missing=True)
        csv = os.path.join(self.tmp, "one.csv")
        text = make_table(d, spec(ratios, configs, ("resident", "manager-exact")), csv)
        self.assertEqual(text, read(os.path.join(DATA, "expected", "one.txt")))
        # Every row's columns under their names, a configuration longer than 12 (manager-exact)
        # too (the bash lab's column was 12 wide and shifted such a row by one).
        header = text.splitlines()[1]
        tok_s_end = header.index("tok/s") + len("tok/s")
        for line in text.splitlines()[3:]:
            self.assertEqual(line.split()[3], line[:tok_s_end].split()[-1], line)
            self.assertEqual(line[tok_s_end:tok_s_end + 1], " ", line)
        self.assertEqual(read(os.path.join(d, "table.txt")), text)
        self.assertEqual(read(csv), read(os.path.join(DATA, "expected", "one.csv")))

    def test_rounds_pooled(self):
        """Two rounds: tokens pooled, a cell that failed in round 2, digests that differ between rounds,
        the largest peak, the mean of the rounds' hit rates."""
        d = self.copy("run-rounds")
        ratios, configs = ["2"], ["mmap", "all", "all-serial", "all-pool"]
        rundir.pool_rounds(d, 2, ratios, configs)
        expected = os.path.join(DATA, "expected", "rounds-pooled")
        for name in sorted(os.listdir(expected)):
            self.assertEqual(read(os.path.join(d, name)), read(os.path.join(expected, name)), name)
        # The pooled per-token CSV: round 1's, then round 2's rows (their twin: the files joined).
        for config in ("mmap", "all", "all-pool"):
            r1 = read(os.path.join(d, "round-1", f"r2-{config}.csv"))
            r2 = read(os.path.join(d, "round-2", f"r2-{config}.csv"))
            self.assertEqual(read(os.path.join(d, f"r2-{config}.csv")), r1 + r2.split("\n", 1)[1])
        self.assertFalse(os.path.exists(os.path.join(d, "r2-all-serial.csv")))  # round 2 failed
        csv = os.path.join(self.tmp, "rounds.csv")
        text = make_table(d, spec(ratios, configs), csv, "; pooled over 2 rounds (round-1 ... round-2)")
        self.assertEqual(text, read(os.path.join(DATA, "expected", "rounds.txt")))
        self.assertEqual(read(csv), read(os.path.join(DATA, "expected", "rounds.csv")))
        # The table's tok/s of a pooled cell is over every round's decode tokens.
        n, total = 0, 0.0
        for k in (1, 2):
            for line in read(os.path.join(d, f"round-{k}", "r2-all.csv")).strip().split("\n")[1:]:
                f = line.split(",")
                if f[1] == "decode":
                    n += 1
                    total += float(f[2])
        row = [r for r in read(csv).split("\n") if r.startswith("2,all,")][0]
        self.assertEqual(row.split(",")[2], "%.3f" % (n / (total / 1000)))

    def test_warm_from(self):
        """--warm-from W: a pooled cell's figures over each round's decode tokens W and later (the
        token column restarts every round), against the rows summed by hand; the title says so."""
        d = self.copy("run-rounds")
        ratios, configs = ["2"], ["mmap", "all", "all-serial", "all-pool"]
        rundir.pool_rounds(d, 2, ratios, configs)
        warm = dataclasses.replace(spec(ratios, configs), warm_from=9)
        csv = os.path.join(self.tmp, "warm.csv")
        text = make_table(d, warm, csv)
        self.assertIn("; figures over decode tokens 9-16 of every run (hit% the run's own)", text.split("\n")[0])
        for config in ("mmap", "all", "all-pool"):
            ms, read_bytes = [], 0.0
            for k in (1, 2):
                for line in read(os.path.join(d, f"round-{k}", f"r2-{config}.csv")).strip().split("\n")[1:]:
                    f = line.split(",")
                    if f[1] == "decode" and int(f[0]) >= 9:
                        ms.append(float(f[2]))
                        read_bytes += float(f[5])
            self.assertEqual(len(ms), 8, config)  # the fixture runs decode 12 tokens: 9-12 in each round
            row = [r for r in read(csv).split("\n") if r.startswith(f"2,{config},")][0].split(",")
            self.assertEqual(row[2], "%.3f" % (len(ms) / (sum(ms) / 1000)), config)
            self.assertEqual(row[5], "%.2f" % (read_bytes / len(ms) / 1048576), config)
            self.assertNotEqual(row[2], [r for r in read(os.path.join(DATA, "expected", "rounds.csv")).split("\n")
                                         if r.startswith(f"2,{config},")][0].split(",")[2], config)

    def test_text_and_csv_say_the_same(self):
        d = self.copy("run-one")
        ratios, configs = ["1.5", "2.5"], ["mmap", "all", "cache", "resident"]
        rundir.copy_unlimited(d, ratios, ["resident"], only_missing=True)
        csv = os.path.join(self.tmp, "t.csv")
        text = make_table(d, spec(ratios, configs, ("resident",)), csv).split("\n")
        for row in read(csv).strip().split("\n")[1:]:
            f = row.split(",")
            line = next(t.split() for t in text[3:] if t.split()[:3] == [f[0], t.split()[1], f[1]])
            if f[13] != "ok":
                continue
            self.assertEqual(line[3:9], f[2:7] + [f[12]])  # tok/s .. majflt, engine faults
            self.assertEqual(line[13], f[10])  # roof_ms
            self.assertEqual(stats.value(line[15]), stats.value(f[11]))  # bw_frac

    def test_the_title_names_the_openmp_wait_and_the_load(self):
        d = self.copy("run-one")
        s = spec(["1.5"], ["mmap"])
        s.openmp, s.load = "GOMP_SPINCOUNT=1000", 2
        title = make_table(d, s).split("\n")[0]
        self.assertIn("2 threads (GOMP_SPINCOUNT=1000), 2 busy processes beside every run;", title)


if __name__ == "__main__":
    unittest.main()
