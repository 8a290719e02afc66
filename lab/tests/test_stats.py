"""The lab's statistics against slow obvious twins: percentiles, the decode summary of a
per-token CSV, the rounds' pooled tok/s, the roofline's columns, the mean disk curve and
the spread of repeated cells."""

import os
import random
import tempfile
import unittest

import numpy as np

from memlab import stats

HDR = ("token,phase,wall_ms,majflt,minflt,read_bytes,prefetch_issued,prefetch_useful,prefetch_late,pinned_mib,"
       "hit_pct,engine_majflt,proc_cpu_ms,proc_sys_ms,read_wait_ms,read_waits")


def twin_percentile(values, q):
    """Insertion sort, then the rank q x (n - 1) counted from 1, as the table's awk did."""
    t = []
    for v in values:
        i = len(t)
        t.append(v)
        while i > 0 and t[i - 1] > v:
            t[i] = t[i - 1]
            i -= 1
        t[i] = v
    n = len(t)
    pos = q * (n - 1)
    lo = int(pos) + 1
    hi = lo + 1 if lo < n else n
    return t[lo - 1] + (t[hi - 1] - t[lo - 1]) * (pos - int(pos))


def twin_summary(text):
    """The decode summary by hand: one pass over the lines, plain additions."""
    lines = text.strip().split("\n")[1:]
    ms, rb, mf, emf, pc, rw, rn, pin, hit = [], 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, None
    for line in lines:
        f = line.split(",")
        if f[1] != "decode":
            continue
        ms.append(float(f[2]))
        mf += float(f[3])
        rb += float(f[5])
        emf += float(f[11])
        pc += float(f[12])
        rw += float(f[14])
        rn += float(f[15])
        if f[10] != "":
            hit = f[10]
        pin = max(pin, float(f[9]))
    n = len(ms)
    total = 0.0
    for m in ms:
        total += m
    return ("%.3f" % (n / (total / 1000)), "%.1f" % twin_percentile(ms, 0.5), "%.1f" % twin_percentile(ms, 0.9),
            "%.2f" % (rb / n / 1048576), "%.2f" % (mf / n), hit or "-", "%.1f" % pin, "%.2f" % (emf / n),
            "%.1f" % (pc / n), "%.2f" % (rw / n), "%.2f" % (rn / n))


def random_run(rng, n, managed=True):
    rows = [HDR]
    for t in range(n + 1):
        ms = rng.uniform(5, 1500)
        hit = "%.2f" % rng.uniform(0, 100) if managed and rng.random() < 0.8 else ""
        rows.append("%d,%s,%.3f,%d,%d,%d,0,0,0,%.1f,%s,%d,%.3f,%.3f,%.3f,%d" % (
            t, "prompt" if t == 0 else "decode", ms, rng.randint(0, 500), rng.randint(0, 9999),
            rng.randint(0, 2 << 30), rng.uniform(0, 300), hit, rng.randint(0, 500), ms * rng.uniform(0, 2),
            ms * rng.uniform(0, 1), rng.uniform(0, 5), rng.randint(0, 40)))
    return "\n".join(rows) + "\n"


class Percentile(unittest.TestCase):
    def test_against_the_twin_and_numpy(self):
        rng = random.Random(7)
        for n in (1, 2, 3, 10, 16, 17, 64, 333):
            for _ in range(20):
                v = [round(rng.uniform(0, 2000), 3) for _ in range(n)]
                for q in (0.0, 0.1, 0.5, 0.9, 1.0):
                    self.assertEqual(stats.percentile(v, q), twin_percentile(v, q), (n, q))
                    # numpy interpolates the same ranks, rounding its own way.
                    self.assertAlmostEqual(stats.percentile(v, q), float(np.percentile(v, 100 * q)), places=9)

    def test_by_hand(self):
        self.assertEqual(stats.percentile([4.0, 1.0, 3.0, 2.0], 0.5), 2.5)
        self.assertAlmostEqual(stats.percentile([10.0, 20.0, 30.0, 40.0, 50.0], 0.9), 46.0)
        self.assertEqual(stats.percentile([7.0], 0.9), 7.0)
        self.assertEqual(stats.percentile([], 0.5), 0.0)


class Summary(unittest.TestCase):
    def summarize(self, text):
        with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
            f.write(text)
        try:
            return stats.summarize_tokens(f.name)
        finally:
            os.unlink(f.name)

    def test_against_the_twin(self):
        rng = random.Random(11)
        for n in (1, 2, 12, 16, 64):
            for managed in (True, False):
                text = random_run(rng, n, managed)
                self.assertEqual(self.summarize(text).fields(), twin_summary(text), (n, managed))

    def test_the_prompt_is_left_out_and_no_decode_is_dashes(self):
        text = HDR + "\n0,prompt,500.000,9,9,1048576,0,0,0,1.0,50.00,9,1.0,1.0,0.0,0\n"
        self.assertEqual(self.summarize(text).fields(), ("-",) * 11)
        text += "1,decode,100.000,2,0,2097152,0,0,0,3.0,,1,50.0,1.0,0.5,1\n"
        s = self.summarize(text)
        self.assertEqual((s.tok_s, s.p50_ms, s.read_mib, s.majflt, s.hit_pct, s.pinned_mib),
                         ("10.000", "100.0", "2.00", "2.00", "-", "3.0"))

    def test_a_column_a_run_did_not_record_counts_as_0(self):
        text = "token,phase,wall_ms,majflt,minflt,read_bytes\n0,prompt,9,1,1,1\n1,decode,250.000,4,0,1048576\n"
        s = self.summarize(text)
        self.assertEqual((s.tok_s, s.read_mib, s.engine_majflt, s.read_waits, s.hit_pct), ("4.000", "1.00", "0.00",
                                                                                            "0.00", "-"))

    def test_a_value_that_is_not_a_number_is_named(self):
        text = HDR + "\n1,decode,fast,2,0,2097152,0,0,0,3.0,,1,50.0,1.0,0.5,1\n"
        with self.assertRaisesRegex(Exception, r"line 2: wall_ms 'fast' is not a number"):
            self.summarize(text)


class Pooling(unittest.TestCase):
    def test_pooled_tok_s_is_every_rounds_tokens(self):
        """Rounds pooled: their per-token rows one after another; the twin sums each round's."""
        rng = random.Random(3)
        rounds = [random_run(rng, 12) for _ in range(3)]
        pooled = rounds[0] + "".join(r.split("\n", 1)[1] for r in rounds[1:])
        with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
            f.write(pooled)
        try:
            s = stats.summarize_tokens(f.name)
        finally:
            os.unlink(f.name)
        n, total = 0, 0.0
        for r in rounds:
            for line in r.strip().split("\n")[1:]:
                f = line.split(",")
                if f[1] == "decode":
                    n += 1
                    total += float(f[2])
        self.assertEqual(s.tok_s, "%.3f" % (n / (total / 1000)))

    def test_mean_hit(self):
        self.assertEqual(stats.mean_hit([stats.TokenSummary(hit_pct="10.00"), stats.TokenSummary(hit_pct="-"),
                                         stats.TokenSummary(hit_pct="20.01")]), "15.01")
        self.assertEqual(stats.mean_hit([stats.TokenSummary()]), "")


class Roofline(unittest.TestCase):
    def test_by_hand(self):
        # 10 tok/s (100 ms a token), 50 MiB a token at 1000 MiB/s: 50 ms of reads, resident 20 ms.
        self.assertEqual(stats.roofline("10.000", "50.00", "1000.0", "20.000", "150.0", 2),
                         ("50.0", "2.00", "0.50", "0.75"))
        # The resident time bounds it when the reads are fewer.
        self.assertEqual(stats.roofline("10.000", "5.00", "1000.0", "20.000", "150.0", 2),
                         ("20.0", "5.00", "0.05", "0.75"))
        # No disk curve: the resident term alone, no bandwidth share.
        self.assertEqual(stats.roofline("10.000", "50.00", "", "20.000", "100.0", 1), ("20.0", "5.00", "-", "1.00"))
        # Neither term: no roofline; a run without decode tokens: nothing but the roof.
        self.assertEqual(stats.roofline("10.000", "50.00", "", "", "100.0", 1), ("-", "-", "-", "1.00"))
        self.assertEqual(stats.roofline("-", "-", "1000.0", "20.000", "-", 2), ("20.0", "-", "-", "-"))

    def test_against_the_twin(self):
        rng = random.Random(5)
        for _ in range(500):
            tok, rd, bw, res, pc = (rng.uniform(0.1, 90), rng.uniform(0, 2000), rng.uniform(100, 3000),
                                    rng.uniform(5, 60), rng.uniform(1, 5000))
            ms = 1000 / float("%.3f" % tok)
            io = float("%.2f" % rd) / float("%.1f" % bw) * 1000
            roof = max(io, float("%.3f" % res))
            got = stats.roofline("%.3f" % tok, "%.2f" % rd, "%.1f" % bw, "%.3f" % res, "%.1f" % pc, 2)
            self.assertEqual(got, ("%.1f" % roof, "%.2f" % (ms / roof),
                                   "%.2f" % (float("%.2f" % rd) / (ms / 1000) / float("%.1f" % bw)),
                                   "%.2f" % (float("%.1f" % pc) / (2 * ms))))


class Curves(unittest.TestCase):
    def write(self, d, name, rows):
        path = os.path.join(d, name)
        with open(path, "w") as f:
            f.write("readers,reads,mib,seconds,mib_per_s\n" + "".join(r + "\n" for r in rows))
        return path

    def test_mean_curve_and_best(self):
        with tempfile.TemporaryDirectory() as d:
            a = self.write(d, "a.csv", ["1,64,256.0,0.285,896.9", "2,64,256.0,0.200,1278.6"])
            b = self.write(d, "b.csv", ["2,64,256.0,0.200,1300.0", "1,64,256.0,0.285,800.0", "8,64,256,0.2,1000.1"])
            # Each reader count's mean over the curves that have it, in first-seen order.
            self.assertEqual(stats.mean_curve([a, b]), "1:%.1f,2:%.1f,8:1000.1" % ((896.9 + 800.0) / 2,
                                                                                  (1278.6 + 1300.0) / 2))
            self.assertEqual(stats.best_bandwidth([a, b]), "1300.0")
            self.assertEqual(stats.best_bandwidth([]), "")
            self.assertEqual(stats.curve_of(a), "897 / 1279")

    def test_metrics_tok_s(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "m.csv")
            with open(path, "w") as f:
                f.write("step,steps,wall_ms,compute_ms\n1,3,100.0,1\n2,3,,1\n3,3,300.0,1\n")
            self.assertEqual(stats.metrics_tok_s(path), "%.3f" % (1000 * 2 / 400.0))


class Repeats(unittest.TestCase):
    def test_spread_and_error(self):
        r = stats.repeats(["10.000", "12.000", "11.000"], "13.2")
        self.assertEqual((r.measured, r.mean, r.spread_pct, r.err_pct, r.within_15, r.within_spread),
                         ("10.000/12.000/11.000", "11.000", "18.2", "20.0", "no", "no"))
        r = stats.repeats(["10.000", "12.000"], "10.5")
        self.assertEqual((r.err_pct, r.within_15, r.within_spread), ("-4.5", "yes", "yes"))

    def test_median(self):
        self.assertEqual(stats.median([3.0, 1.0, 2.0]), "2.0")
        self.assertEqual(stats.median([4.0, 1.0, 2.0, 3.0]), "2.5")
        self.assertEqual(stats.median([]), "")


if __name__ == "__main__":
    unittest.main()
