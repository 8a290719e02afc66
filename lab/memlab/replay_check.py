"""Live = replay, at scale: for every cell whose manager kept a cache and whose run
recorded its routing (NAME.route.csv), the offline replay of that routing at the cell's
policy and budget, decode-only as the manager caches (and with the cell's trace oracle,
same P, seed and cap), next to what the manager counted live: replay-check.txt in the
run directory (docs/memlab.md, "Live against the replay").

The two can differ only where the live run's speculative reads were not complete at their
layer's routing (counted 'late': the replay's complete by then), or, with the pool, where
a placement found no slot; the table prints both counts beside the difference."""

import os
import re
import subprocess

from . import configs as cfg
from . import rundir, stats

_CACHE = re.compile(r" cache (\S+) ([0-9.]+) MiB ([0-9.]+)% hit \(([0-9.]+) MiB missed\)")
_PREDICTED = re.compile(r" predicted \(([^)]*)\) issued ([0-9]+) useful ([0-9]+) late ([0-9]+) wasted ([0-9]+)")
COLUMNS = ("cell", "live_hit%", "replay_hit%", "diff_pt", "live_miss_MiB/tok", "replay_MiB/tok", "diff%",
           "read_MiB/tok", "late/tok")


def _summary(log):
    try:
        with open(log, errors="replace") as f:
            for line in f:
                if line.startswith("residency:"):
                    return line
    except OSError:
        pass
    return ""


def _spec_cap(config):
    args = list(cfg.BY_NAME[config].args)
    return args[args.index("--spec-cap") + 1] if "--spec-cap" in args else "2"


def replay(cli, route, policy, budget_mib, predictor, spec_cap):
    """(decode hit %, demanded MiB a token) of `moe-residency replay --decode-only` on `route`."""
    argv = [cli, "replay", "--trace", route, "--budgets", budget_mib, "--policies", policy, "--decode-only",
            "--format", "csv"]
    if predictor.startswith("oracle:"):
        argv += ["--speculate", predictor, "--spec-cap", spec_cap]
    out = subprocess.run(argv, check=True, text=True, stdout=subprocess.PIPE).stdout.splitlines()
    head, row = out[0].split(","), out[1].split(",")
    return float(row[head.index("hit_pct_decode")]), float(row[head.index("demanded_mib_per_token")])


def make(d, ratios, configs, cli, decode_tokens):
    """d/replay-check.txt; returns its text ('' when no cell has a cache and a route trace)."""
    rows = []
    for ratio in ratios:
        for config in configs:
            name = rundir.cell(ratio, config)
            route, log = os.path.join(d, f"{name}.route.csv"), os.path.join(d, f"{name}.log")
            line = _summary(log)
            m = _CACHE.search(line)
            if not (m and os.path.isfile(route) and rundir.read_text(os.path.join(d, f"{name}.status")) == "ok"):
                continue
            policy, budget, live_hit, missed = m.group(1), m.group(2), float(m.group(3)), float(m.group(4))
            p = _PREDICTED.search(line)
            predictor, late = (p.group(1), int(p.group(4))) if p else ("", 0)
            if predictor and not predictor.startswith("oracle:"):
                continue  # the stale gate's rankings are not in the trace: nothing to replay them from
            hit, mib = replay(cli, route, policy, budget, predictor, _spec_cap(config))
            live_mib = missed / decode_tokens
            per_token = os.path.join(d, f"{name}.csv")
            read = stats.summarize_tokens(per_token).read_mib if os.path.isfile(per_token) else "-"
            rows.append((name, "%.2f" % live_hit, "%.2f" % hit, "%+.2f" % (live_hit - hit), "%.2f" % live_mib,
                         "%.2f" % mib, "%+.2f" % (100 * (live_mib - mib) / mib if mib else 0.0), read,
                         "%.2f" % (late / decode_tokens)))
    if not rows:
        return ""
    widths = [max(len(str(r[i])) for r in rows + [COLUMNS]) for i in range(len(COLUMNS))]
    text = "\n".join(" ".join(str(c).rjust(w) for c, w in zip(r, widths)) for r in [COLUMNS] + rows) + "\n"
    rundir.write(os.path.join(d, "replay-check.txt"), text)
    return text
