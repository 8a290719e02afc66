"""The lab's statistics: a run's decode summary from its per-token CSV (tok/s, the
percentiles, bytes and faults a token), the roofline of a row, the disk's best
bandwidth, the mean of disk curves, a metrics file's tok/s and the spread of a cell
measured more than once.

Each figure is computed as docs/memlab.md states it, and printed to the digits the
table has always had; a figure derived from others (the roofline's columns, the
resident ms a token) is computed from the printed ones, as the lab's tables always
were, so that the table of a run reads the same whichever version printed it. Sums
run in row order (numpy's cumulative sum: a pairwise sum rounds differently)."""

import csv
from dataclasses import dataclass

import numpy as np

from .log import die

MIB = 1048576.0

# The per-token CSV (moe-lab-run --per-token-csv; docs/memlab.md, "The columns").
PER_TOKEN_COLUMNS = ("token", "phase", "wall_ms", "majflt", "minflt", "read_bytes", "prefetch_issued",
                     "prefetch_useful", "prefetch_late", "pinned_mib", "hit_pct", "engine_majflt", "proc_cpu_ms",
                     "proc_sys_ms", "read_wait_ms", "read_waits")


def row_sum(values):
    """The sum of `values` added one after another, in order."""
    a = np.asarray(values, dtype=np.float64)
    return float(np.cumsum(a)[-1]) if a.size else 0.0


def percentile(values, q):
    """The q-quantile of `values` by linear interpolation between the two nearest ranks:
    at rank q x (n - 1) of the sorted values (0 for none)."""
    v = np.sort(np.asarray(values, dtype=np.float64))
    n = v.size
    if n == 0:
        return 0.0
    pos = q * (n - 1)
    lo = int(pos)
    hi = min(lo + 1, n - 1)
    return float(v[lo] + (v[hi] - v[lo]) * (pos - lo))


def _number(text, path, line, column):
    if text == "":
        return 0.0
    try:
        return float(text)
    except ValueError:
        die(f"{path}: line {line}: {column} '{text}' is not a number")


@dataclass
class TokenSummary:
    """A run's decode tokens, as the table prints them ('-' where there were none)."""
    tok_s: str = "-"
    p50_ms: str = "-"
    p90_ms: str = "-"
    read_mib: str = "-"  # a token
    majflt: str = "-"  # a token, the process's
    hit_pct: str = "-"  # the manager's, at the last decode token that measured it
    pinned_mib: str = "-"  # the largest
    engine_majflt: str = "-"  # a token, llama.cpp's own threads'
    proc_cpu_ms: str = "-"  # a token, every thread's
    read_wait_ms: str = "-"  # a token
    read_waits: str = "-"  # a token

    def fields(self):
        return (self.tok_s, self.p50_ms, self.p90_ms, self.read_mib, self.majflt, self.hit_pct, self.pinned_mib,
                self.engine_majflt, self.proc_cpu_ms, self.read_wait_ms, self.read_waits)


def summarize_tokens(path, first=1):
    """The decode summary of one run's per-token CSV, over its decode tokens numbered
    `first` and later (the `token` column; 1: all of them, --warm-from). A column the
    file lacks (a run recorded before it existed) counts as 0."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        return TokenSummary()
    col = {name: i for i, name in enumerate(rows[0])}
    if "phase" not in col or "wall_ms" not in col:
        die(f"{path}: line 1: no phase and wall_ms columns; expected a per-token CSV ({','.join(PER_TOKEN_COLUMNS)})")

    def column(row, name, line):
        i = col.get(name)
        return _number(row[i], path, line, name) if i is not None and i < len(row) else 0.0

    ms, read, majflt, engine, cpu, wait, waits = [], [], [], [], [], [], []
    pinned, hit = 0.0, None
    for line, row in enumerate(rows[1:], start=2):
        if len(row) <= col["phase"] or row[col["phase"]] != "decode":
            continue
        if first > 1 and column(row, "token", line) < first:
            continue
        ms.append(column(row, "wall_ms", line))
        read.append(column(row, "read_bytes", line))
        majflt.append(column(row, "majflt", line))
        engine.append(column(row, "engine_majflt", line))
        cpu.append(column(row, "proc_cpu_ms", line))
        wait.append(column(row, "read_wait_ms", line))
        waits.append(column(row, "read_waits", line))
        i = col.get("hit_pct")
        if i is not None and i < len(row) and row[i] != "":
            hit = row[i]
        pinned = max(pinned, column(row, "pinned_mib", line))
    n = len(ms)
    if n == 0:
        return TokenSummary()
    return TokenSummary(
        tok_s="%.3f" % (n / (row_sum(ms) / 1000)),
        p50_ms="%.1f" % percentile(ms, 0.5),
        p90_ms="%.1f" % percentile(ms, 0.9),
        read_mib="%.2f" % (row_sum(read) / n / MIB),
        majflt="%.2f" % (row_sum(majflt) / n),
        hit_pct=hit if hit is not None else "-",
        pinned_mib="%.1f" % pinned,
        engine_majflt="%.2f" % (row_sum(engine) / n),
        proc_cpu_ms="%.1f" % (row_sum(cpu) / n),
        read_wait_ms="%.2f" % (row_sum(wait) / n),
        read_waits="%.2f" % (row_sum(waits) / n),
    )


def value(text):
    """A printed figure as a number: '-' and '' are 0."""
    try:
        return float(text)
    except ValueError:
        return 0.0


def mean_hit(summaries):
    """The mean of the runs' hit rates (those that measured one), '%.2f'; '' if none."""
    hits = [float(s.hit_pct) for s in summaries if s.hit_pct != "-"]
    return "%.2f" % (row_sum(hits) / len(hits)) if hits else ""


def resident_ms(summary):
    """ms a token of the printed tok/s, '%.3f'; '' without one."""
    tok = value(summary.tok_s)
    return "%.3f" % (1000 / tok) if tok > 0 else ""


def roofline(tok_s, read_mib, bandwidth, resident, proc_cpu_ms, cores):
    """The roofline's columns of one row: roof_ms (max of the MiB read a token at the
    disk's best bandwidth and the resident ms a token; either term left out when
    unmeasured), x_roof (ms a token / roof_ms), bw_frac (the share of the bandwidth the
    row's reads reached) and cpu_use (the process's CPU time / cores x wall). Inputs are
    the printed figures ('' or '-': unmeasured); outputs '-' where they cannot be had."""
    tok = value(tok_s)
    rd = value(read_mib)
    bw = value(bandwidth)
    ms = 1000 / tok if tok > 0 else 0.0
    roof = rd / bw * 1000 if bw > 0 else -1.0
    if resident != "" and value(resident) > roof:
        roof = value(resident)
    return ("%.1f" % roof if roof > 0 else "-",
            "%.2f" % (ms / roof) if roof > 0 and ms > 0 else "-",
            "%.2f" % (rd / (ms / 1000) / bw) if bw > 0 and ms > 0 else "-",
            "%.2f" % (value(proc_cpu_ms) / (cores * ms)) if ms > 0 else "-")


def _csv_rows(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))[1:]


def best_bandwidth(paths):
    """The best MiB/s (column 5) of the disk curves `paths`, '%.1f'; '' if none above 0."""
    best = 0.0
    for p in paths:
        for row in _csv_rows(p):
            if len(row) > 4 and value(row[4]) > best:
                best = value(row[4])
    return "%.1f" % best if best > 0 else ""


def curve_of(path):
    """One curve's MiB/s at each reader count, as the log prints it: '897 / 1279 / ...'."""
    return " / ".join("%.0f" % value(row[4]) for row in _csv_rows(path) if len(row) > 4)


def mean_curve(paths):
    """The disk curves `paths` (readers,reads,mib,seconds,mib_per_s) as one lanes curve
    for lab-predict: each reader count's mean MiB/s over the curves that have it, in the
    order the counts first appear: 'readers:mib_per_s,...'."""
    order, sums, counts = [], {}, {}
    for p in paths:
        for row in _csv_rows(p):
            if not row or row[0] == "":
                continue
            r = row[0]
            if r not in sums:
                order.append(r)
                sums[r] = []
            sums[r].append(value(row[4]) if len(row) > 4 else 0.0)
    return ",".join("%s:%.1f" % (r, row_sum(sums[r]) / len(sums[r])) for r in order)


def metrics_tok_s(path):
    """tok/s of one metrics CSV as lab-predict counts it: 1000 x the rows with a wall_ms /
    their sum; '' if none."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows or "wall_ms" not in rows[0]:
        return ""
    w = rows[0].index("wall_ms")
    walls = [value(r[w]) for r in rows[1:] if len(r) > w and r[w] != ""]
    s = row_sum(walls)
    return "%.3f" % (1000 * len(walls) / s) if walls and s > 0 else ""


@dataclass
class Repeats:
    """One cell measured in more than one run, against its prediction."""
    measured: str  # each run's tok/s, '/'-separated
    mean: str
    spread_pct: str  # (max - min) / mean
    err_pct: str  # (predicted - mean) / mean
    within_15: str  # yes or no
    within_spread: str


def repeats(values, predicted):
    """The spread of `values` (printed tok/s) and the prediction's error against their mean."""
    v = [float(x) for x in values]
    m = row_sum(v) / len(v)
    spread = 100 * (max(v) - min(v)) / m
    err = 100 * (value(predicted) - m) / m
    return Repeats("/".join(values), "%.3f" % m, "%.1f" % spread, "%.1f" % err,
                   "yes" if abs(err) <= 15 else "no", "yes" if abs(err) <= spread else "no")


def median(values):
    """The median of `values`, '%.1f'; '' for none."""
    v = sorted(values)
    n = len(v)
    if n == 0:
        return ""
    return "%.1f" % (v[(n - 1) // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2)
