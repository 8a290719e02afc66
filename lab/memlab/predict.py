"""The timing model against the memory lab (docs/lab-predict.md):

  lab/memlab.sh predict RUNS_DIR [--fit CONFIG@RATIO] [--tool PATH] [--format table|csv] ...

RUNS_DIR is one run of the lab (<lab>/runs/<time>-<preset>). It calibrates the timing model
(`moe-residency lab-predict`) on ONE configuration at ONE ratio (--fit, default exact@2.5: all
its decode tokens), then predicts every other configuration x ratio from what is known before
that run: the route trace (of the fit run, or of the observer run at the fit ratio: routing is
the same in every lab run), the memory limit, the budget, the configuration's levers, the
stale-gate accuracy an observer run measured, and the disk's lanes curve the lab measured. The
other runs' metrics are read only for the "measured" column. A run made in rounds is its rounds
pooled (as --pool pools runs), its curve the mean of the rounds' and of the one after the last."""

import glob
import os
import re
import subprocess
import sys
import tempfile

from . import configs as cfg
from . import rundir, stats
from .log import die, log
from .tools import REPO

# The configurations lab-predict models (docs/lab-predict.md, "The mapping"), and the lab's
# configurations that are one of them at other read lanes (the cells file's lanes and label).
MODELLED = ("mmap", "observer", "dense", "exact", "predicted", "cache", "all", "degraded", "resident", "mmap-128k",
            "exact-cache", "all-oracle", "all-oracle-pool")
AT_LANES = {"exact-cache-l1": ("exact-cache", "1"), "exact-cache-l4": ("exact-cache", "4")}
# The trace oracle's cells: their predicted reads' accuracy is the oracle's, not an observer's stale-gate.
ORACLE_CONFIGS = ("all-oracle", "all-oracle-pool")
_RESIDENCY_CACHE = re.compile(r"^residency: .*cache [a-z]* ([0-9.]*) MiB")
_MODEL = re.compile(r"^memlab \([a-z]*\): ([^,;]*)[,;]")  # the model file; a forced routing follows after ";"
_PRESET = re.compile(r"^memlab \(([a-z]*)\): ")
_DENSE = re.compile(r"^residency budget: .* - dense ([0-9.]+) MiB - ")  # what the manager locks as dense

OPTIONS = {  # flag -> (dest, what a value is; None: a flag)
    "--fit": ("fit", "CONFIG@RATIO"), "--tool": ("tool", "a path"), "--format": ("format", "table or csv"),
    "--overhead-mib": ("overhead", "MiB"), "--readaround-mib": ("readaround", "MiB"), "--trace": ("trace", "a file"),
    "--budget": ("budget", "MiB or a share"), "--free": ("free", "a list"), "--sweep": ("sweep", None),
    "--fit-run": ("fit_run", "a run directory"), "--repeats": ("repeats", "a comma list of run directories"),
    "--pool": ("pool", "a comma list of run directories"), "--no-manager-cost": ("no_manager", None),
    "--fault-walk": ("walk", "a comma list of files"), "--no-fault-walk": ("no_walk", None),
    "--inline-walk": ("iwalk", "a comma list of files"), "--no-inline-walk": ("no_inline", None),
    "--fault-bandwidth-scale": ("fault_scale", "a factor"),
    "--pairs": ("pairs", "ab or a comma list of A:B cell pairs"), "--noise": ("noise", "a percentage"),
}

HELP = __doc__ + """
Options:
  --fit C@R          the calibration cell (default exact@2.5; a real-routing run's, --shape-from:
                     exact-cache@2)
  --tool PATH        moe-residency (default: build/llama-cpp/bin, build/release/bin, build/debug/bin)
  --format F         table (default) or csv
  --overhead-mib N   memory of the cgroup besides the model's pages (default 64; assumed)
  --readaround-mib N a fault's read-around window (default: read_ahead_kb x 2 of the model's disk / 1024)
  --trace FILE       the route trace to use
  --budget B         the cache budget of the runs: MiB, a share like 25%, or auto: each cell's own, from
                     its log's residency line (default 25%; a real-routing run's: auto)
  --free LIST        the parameters fitted (default compute,bandwidth,kernel; see lab-predict --help)
  --fit-run DIR[,DIR...]
                     calibrate on the --fit cell of OTHER runs of the same preset (their metrics and
                     manager runs, the mean of their disk curves; the first one's route trace) and
                     predict RUNS_DIR's cells (with --pool's)
  --sweep            calibrate on every finished cell in turn; per calibration cell, how many of the
                     other cells are predicted within 15% and their median |error|
  --repeats LIST     other runs of the same preset: every cell's measured tok/s in RUNS_DIR and in each,
                     their mean and spread, and the prediction's error against the mean
  --pool LIST        other runs of the same preset, pooled with RUNS_DIR: every cell's metrics are all
                     the runs', the disk curve their mean, the manager's cost the mean of their runs
  --fault-bandwidth-scale X
                     untie the fault-driven cells' bandwidth scale from the manager's (lab-predict)
  --fault-walk LIST  fault-walk.csv files for the fault cells' reads (default: every calibration run's,
                     and for runs in rounds their fault-walk-after.csv)
  --no-fault-walk    leave the fault walk out
  --inline-walk LIST inline-walk.csv files for the cache cells (default: as for the fault walk)
  --no-inline-walk   leave it out
  --no-manager-cost  leave the manager's own cost (resident-all, manager-exact, manager-cache) out
  --pairs LIST       A/B pairs of cells, A:B,... (CONFIG@RATIO, or NAME@RATIO for exact-cache-l1 and -l4):
                     each pair's measured and predicted time ratio, verdicts, sign and 10% (lab-predict
                     --pairs); `ab`: the real-routing lab's pairs at every ratio the run has (prediction
                     off against on, lanes 1 against 2 against 4, each budget against the next ratio's,
                     the pool against the page cache, stock mmap-128k against exact-cache)
  --noise PCT        the pairs' noise band (default: each pair's larger measured band)
"""


def parse(argv):
    a = {"format": "table", "overhead": "64"}
    d = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):
            sys.stdout.write(HELP)
            sys.exit(0)
        if arg in OPTIONS:
            dest, what = OPTIONS[arg]
            if what is None:
                a[dest] = True
                i += 1
                continue
            if i + 1 >= len(argv) or argv[i + 1] == "":
                die(f"{arg} needs {what}")
            a[dest] = argv[i + 1]
            i += 2
            continue
        if arg.startswith("-"):
            die(f"unknown argument '{arg}' (see --help)")
        if d is not None:
            die(f"one RUNS_DIR only ('{d}', '{arg}')")
        d = arg
        i += 1
    if d is None or not os.path.isdir(d):
        die(f"RUNS_DIR: '{d or ''}' is not a directory (a run of the memory lab)")
    if a["format"] not in ("table", "csv"):
        die(f"--format: '{a['format']}'; expected table or csv")
    if "noise" in a and not re.fullmatch(r"[0-9]+(\.[0-9]+)?", a["noise"]):
        die(f"--noise: '{a['noise']}'; expected a percentage like 5")
    return d, a


def cell_rows(cells):
    """(id, metrics) of every cell of a cells file: the id its label, else CONFIG@RATIO."""
    out = []
    for line in cells.strip().split("\n")[1:]:
        f = line.split(",")
        label = f[7] if len(f) > 7 else ""
        out.append((label or f"{f[1]}@{f[0]}", f[5]))
    return out


def ab_pairs(cells):
    """The real-routing lab's A/B pairs (issue 51) among the cells of a cells file, in the
    order of the ratios: prediction off against on, lanes 1 against 2 and 2 against 4, the
    pool against the page cache, stock against the manager, then each ratio's budget against
    the next ratio's (exact-cache). Only pairs whose cells are both listed."""
    ids = [i for i, _ in cell_rows(cells)]
    ratios = sorted({i.rpartition("@")[2] for i in ids}, key=float)
    out = []
    for r in ratios:
        for x, y in (("exact-cache", "all-oracle"), ("exact-cache-l1", "exact-cache"),
                     ("exact-cache", "exact-cache-l4"), ("all-oracle", "all-oracle-pool"),
                     ("mmap-128k", "exact-cache")):
            out.append((f"{x}@{r}", f"{y}@{r}"))
    out += [(f"exact-cache@{r}", f"exact-cache@{n}") for r, n in zip(ratios, ratios[1:])]
    return ",".join(f"{x}:{y}" for x, y in out if x in ids and y in ids)


def after_files(name, dirs):
    """DIR/NAME of each DIR made in rounds (measured after its last round)."""
    return [os.path.join(d, name) for d in dirs
            if os.path.isdir(os.path.join(d, "round-1")) and os.path.isfile(os.path.join(d, name))]


def join_metrics(name, runs):
    """The metrics file of cell `name` of every run that finished it, ';'-separated; '' if none."""
    return ";".join(os.path.join(d, f"{name}.metrics.csv") for d in runs
                    if rundir.read_text(os.path.join(d, f"{name}.status")) == "ok"
                    and os.path.isfile(os.path.join(d, f"{name}.metrics.csv")))


def default_readaround(model):
    """A fault's read-around window, MiB: the model's disk's read_ahead_kb x 2 (llama.cpp's
    FADV_SEQUENTIAL doubles it) / 1024; 128 KiB where it cannot be read."""
    src = subprocess.run(["df", "--output=source", model], check=False, text=True,
                         stdout=subprocess.PIPE).stdout.strip().split("\n")[-1]
    base = src[5:] if src.startswith("/dev/") else src
    while base and not os.path.exists(f"/sys/block/{base}"):
        base = base[:-1]
    ra = rundir.read_text(f"/sys/block/{base}/queue/read_ahead_kb", "128") if base else "128"
    return "%g" % (2 * float(ra) / 1024)


def comma_list(value):
    return value.split(",") if value else []


def main(argv):
    d, a = parse(argv)
    reps = comma_list(a.get("repeats", ""))
    for r in reps:
        if not os.path.isdir(r):
            die(f"--repeats: '{r}' is not a directory (a run of the memory lab)")
        if os.path.isdir(os.path.join(r, "round-1")):
            die(f"--repeats: '{r}' was made in rounds; give its round-K directories")
    if reps and a.get("sweep"):
        die("--repeats and --sweep together are not supported; give one")
    if os.path.isdir(os.path.join(d, "round-1")) and reps:
        die(f"--repeats: RUNS_DIR '{d}' was made in rounds; give its round-1 directory and the others to --repeats")
    pools = comma_list(a.get("pool", ""))
    for p in pools:
        if not os.path.isdir(p):
            die(f"--pool: '{p}' is not a directory (a run of the memory lab)")
    after_pred = after_files("disk-lanes-after.csv", [d] + pools)
    after_walk_pred = after_files("fault-walk-after.csv", [d] + pools)
    after_inline_pred = after_files("inline-walk-after.csv", [d] + pools)
    expanded = [x for y in [d] + pools for x in rundir.rounds_of(y)]
    if expanded[0] != d:
        log(f"{d} was made in rounds: pooling {' '.join(expanded)}")
    run_dir, d, pools = d, expanded[0], expanded[1:]
    if a.get("pool") and reps:
        die("--pool with --repeats is not supported: --pool already measures every cell over all the runs")
    tool = a.get("tool", "")
    if not tool:
        for b in ("llama-cpp", "release", "debug"):
            t = os.path.join(REPO, "build", b, "bin", "moe-residency")
            if os.access(t, os.X_OK):
                tool = t
                break
    if not (tool and os.access(tool, os.X_OK)):
        die("no moe-residency tool; build one or give --tool PATH")

    # The model (named in table.txt), its size and the limits the lab set: round(size / ratio) MiB.
    name = rundir.first_match(os.path.join(d, "table.txt"), _MODEL)
    if not name:
        die(f"{d}/table.txt: no model name on its first line (did the lab finish?)")
    run_top = os.path.dirname(run_dir) if re.fullmatch(r"round-[0-9].*", os.path.basename(run_dir)) else run_dir
    model = os.path.join(os.path.dirname(os.path.dirname(run_top)), name)  # <lab>/runs/<time>-<preset>
    if not os.path.isfile(model):
        die(f"the lab's model {model} is missing")
    size = os.stat(model).st_size
    # A real-routing run (--shape-from): its cells' auto budgets, calibrated on exact-cache at ratio 2.
    trace_run = rundir.first_match(os.path.join(d, "table.txt"), _PRESET) == "trace"
    a.setdefault("fit", "exact-cache@2" if trace_run else "exact@2.5")
    a.setdefault("budget", "auto" if trace_run else "25%")

    # The calibration runs: RUNS_DIR and the --pool runs, or --fit-run's list. The first of them
    # (src) gives the route trace and the stale-gate accuracy; the disk curve is the mean of theirs.
    preds = [d] + pools
    fits, after, after_walk, after_inline = preds, after_pred, after_walk_pred, after_inline_pred
    fit_run = a.get("fit_run", "")
    if fit_run:
        if a.get("sweep"):
            die("--fit-run and --sweep together are not supported; give one")
        fits = comma_list(fit_run)
        for f in fits:
            if not os.path.isdir(f):
                die(f"--fit-run: '{f}' is not a directory (a run of the memory lab)")
        after = after_files("disk-lanes-after.csv", fits)
        after_walk = after_files("fault-walk-after.csv", fits)
        after_inline = after_files("inline-walk-after.csv", fits)
        fits = [x for y in fits for x in rundir.rounds_of(y)]
    src = fits[0]
    curves = []
    for f in fits:
        if not os.path.isfile(os.path.join(f, "disk-lanes.csv")):
            die(f"{f}/disk-lanes.csv missing (the lab ran with --no-disk?)")
        curves.append(os.path.join(f, "disk-lanes.csv"))
    curve = stats.mean_curve(curves + after)
    readaround = a.get("readaround") or default_readaround(model)

    # The manager's own cost (runs without a limit, every expert resident), from the calibration run.
    mgr = []
    if not a.get("no_manager"):
        if all(rundir.read_text(os.path.join(src, f"{n}.status")) == "ok"
               and os.path.isfile(os.path.join(src, f"{n}.metrics.csv"))
               for n in ("resident-all", "manager-exact", "manager-cache")):
            mb = rundir.first_match(os.path.join(src, "manager-cache.log"), _RESIDENCY_CACHE)
            if not mb:
                die(f"{src}/manager-cache.log: no 'cache <policy> N MiB' in its residency line (did it act?)")
            mgr = ["--manager-runs", ",".join(join_metrics(n, fits) for n in ("resident-all", "manager-exact",
                                                                              "manager-cache")),
                   "--manager-budget", mb]

    # The fault path and cache's inline path measured before the runs (each calibration run's
    # fault-walk.csv and inline-walk.csv, as the disk curve is), or the files given.
    walks_args = []
    for on, given, own, extra, flag in ((not a.get("no_walk"), a.get("walk", ""), "fault-walk.csv", after_walk,
                                         "--fault-walk"),
                                        (not a.get("no_inline"), a.get("iwalk", ""), "inline-walk.csv", after_inline,
                                         "--inline-walk")):
        if not on:
            continue
        if given:
            files = comma_list(given)
            for f in files:
                if not os.path.isfile(f):
                    die(f"{flag}: '{f}' is not a file (the lab's {own})")
        else:
            files = [os.path.join(f, own) for f in fits if os.path.isfile(os.path.join(f, own))] + extra
        if files:
            walks_args += [flag, ";".join(files)]

    fit_config, _, fit_ratio = a["fit"].partition("@")
    trace = a.get("trace", "")
    if not trace:
        for t in ([os.path.join(src, f"r{fit_ratio}-{fit_config}.route.csv"),
                   os.path.join(src, f"r{fit_ratio}-observer.route.csv")]
                  + sorted(glob.glob(os.path.join(src, "r*-observer.route.csv")))
                  # routing is the same in every run: any cell's recorded trace (no observer in a real-routing run)
                  + sorted(glob.glob(os.path.join(src, "r*.route.csv")))):
            if os.path.isfile(t):
                trace = t
                break
    if not (trace and os.path.isfile(trace)):
        die(f"no route trace in {d} (a lab run whose moe-lab-run wrote --trace-out)")

    cells = cells_csv(d, src, preds, fits, size, a["budget"], a["fit"] if fit_run else "", fit_run)
    with tempfile.NamedTemporaryFile("w", prefix="memlab-cells-", suffix=".csv", delete=False) as f:
        f.write(cells)
        cells_path = f.name
    try:
        pairs = ab_pairs(cells) if a.get("pairs") == "ab" else a.get("pairs", "")
        if a.get("pairs") == "ab" and not pairs:
            die("--pairs ab: the run has none of the real-routing lab's pairs "
                "(exact-cache, all-oracle, ... at a ratio)")
        base = [tool, "lab-predict", "--trace", trace, "--curve", curve, "--cells", cells_path]
        # The model file's dense bytes as a manager run sized them (the trace's layers and the
        # embedding and output), where one says them.
        dense = ""
        for log_file in sorted(glob.glob(os.path.join(src, "*.log"))):
            dense = rundir.first_match(log_file, _DENSE)
            if dense:
                break
        common = (["--overhead-mib", a["overhead"], "--readaround-mib", readaround]
                  + (["--dense-mib", dense] if dense else []))
        tail = ((["--free", a["free"]] if a.get("free") else [])
                + (["--pairs", pairs] if pairs else []) + (["--noise", a["noise"]] if a.get("noise") else [])
                + (["--fault-bandwidth-scale", a["fault_scale"]] if a.get("fault_scale") else []) + mgr + walks_args)
        if a.get("sweep"):
            return sweep(cells, base, common, tail)
        log(f"{tool} lab-predict --trace {trace} --curve {curve} --fit {a['fit']} --overhead-mib {a['overhead']} "
            f"--readaround-mib {readaround} {' '.join(mgr)} {' '.join(walks_args)}"
            + (f" (calibrated on {fit_run}, predicting {d})" if fit_run else "")
            + (f" (pooled with {a['pool']}: every cell over all the runs)" if a.get("pool") else ""))

        def predict(fmt):
            return lab_predict(base + ["--fit", a["fit"]] + common + ["--format", fmt] + tail)

        if not reps:
            sys.stdout.write(predict(a["format"]))
            return 0
        predicted = predict("csv")
        sys.stdout.write(predicted if a["format"] == "csv" else predict("table"))
        sys.stdout.write(repeats_table(predicted, d, reps, a["format"]))
        return 0
    finally:
        os.unlink(cells_path)


def lab_predict(argv):
    r = subprocess.run(argv, check=False, text=True, stdout=subprocess.PIPE)
    if r.returncode != 0:
        die(f"{argv[0]} lab-predict exited with {r.returncode}")
    return r.stdout


def cells_csv(d, src, preds, fits, size, budget, fit, fit_run):
    """The cells file lab-predict --cells reads: one line a configuration x ratio of RUNS_DIR
    (its limit, budget, the observer's stale-gate accuracy, and the runs' metrics files)."""
    lines = ["ratio,config,limit_mib,budget_mib,stale_gate_pct,metrics"]
    ratios = sorted({m.group(1) for m in (re.match(r"^r([0-9.]*)-.*\.status$", n) for n in os.listdir(d)) if m})
    labelled = False
    for r in ratios:
        limit = "%.0f" % (size / float(r) / 1048576)
        b = budget
        if b.endswith("%"):
            b = "%.0f" % (float(limit) * float(b[:-1]) / 100)
        acc = rundir.stale_gate_pct(os.path.join(src, f"r{r}-observer.log")) or "100"
        for name in MODELLED + tuple(AT_LANES):
            if not os.path.isfile(os.path.join(d, f"r{r}-{name}.status")):
                continue
            c, lanes = AT_LANES.get(name, (name, ""))
            m = join_metrics(f"r{r}-{name}", preds)
            if fit_run and f"{name}@{r}" == fit:  # the calibration cell is the other runs'
                m = join_metrics(f"r{r}-{name}", fits)
                if not m:
                    die(f"--fit-run: no finished {fit} in {fit_run}")
            lim = limit
            if c == "resident":  # one run without a limit, listed once
                lim = "0"
                if any(",resident," in line for line in lines):
                    continue
            cb = b
            if b == "auto":  # the budget the manager sized, from the cell's residency line (0: none)
                cb = rundir.first_match(os.path.join(d, f"r{r}-{name}.log"), _RESIDENCY_CACHE) or "0"
            cacc = "%g" % cfg.REAL_STALE_GATE_PCT if c in ORACLE_CONFIGS else acc
            line = f"{r},{c},{lim},{cb},{cacc},{m}"
            if name in AT_LANES:
                line += f",{lanes},{name}@{r}"
                labelled = True
            lines.append(line)
    if labelled:
        lines[0] += ",lanes,label"
    return "\n".join(lines) + "\n"


def sweep(cells, base, common, tail):
    """Calibrated on every finished cell in turn: how many other cells are within 15%, and
    their median |error|."""
    print("fit_cell,within_15,other_cells,median_abs_err_pct")
    for f, m in cell_rows(cells):
        if not m:
            continue
        out = lab_predict(base + ["--fit", f] + common + ["--format", "csv"] + tail)
        errs = []
        for row in out.split("\n\n")[0].strip().split("\n")[1:]:  # the cells' table, not --pairs'
            x = row.split(",")
            if len(x) > 9 and x[9] == "no" and x[6] != "-":
                errs.append(abs(stats.value(x[5])))
        print(f"{f},{sum(1 for e in errs if e <= 15)},{len(errs)},{stats.median(errs)}")
    return 0


def repeats_table(predicted, d, reps, fmt):
    """--repeats: every cell's tok/s in RUNS_DIR and in each repeat, against the prediction."""
    out = ["", ]
    if fmt == "csv":  # a second CSV table after the blank line; `measured` is /-separated
        out.append("ratio,config,measured_tok_s,mean_tok_s,spread_pct,predicted_tok_s,err_pct,within_15,within_spread")
    else:
        out.append("measured again (--repeats): tok/s in RUNS_DIR first, then each repeat; error against the mean")
        out.append("%-6s %-10s %-32s %9s %7s %9s %8s %5s %7s" % ("ratio", "config", "measured", "mean", "spread%",
                                                               "pred_tok/s", "err%", "<=15", "<=spr"))
    n = in15 = inspread = 0
    for row in predicted.split("\n\n")[0].strip().split("\n")[1:]:  # the cells' table, not --pairs'
        f = row.split(",")
        if len(f) < 10 or f[9] == "yes":
            continue
        r, c, pred = f[0], f[1], f[4]
        vals = []
        for run in [d] + reps:
            if rundir.read_text(os.path.join(run, f"r{r}-{c}.status")) != "ok":
                continue
            path = os.path.join(run, f"r{r}-{c}.metrics.csv")
            v = stats.metrics_tok_s(path) if os.path.isfile(path) else ""
            if v:
                vals.append(v)
        if len(vals) < 2:
            continue  # measured once or not at all: nothing to repeat
        x = stats.repeats(vals, pred)
        if fmt == "csv":
            out.append(f"{r},{c},{x.measured},{x.mean},{x.spread_pct},{pred},{x.err_pct},{x.within_15},"
                       f"{x.within_spread}")
        else:
            out.append("%-6s %-10s %-32s %9s %7s %9s %+8.1f %5s %7s" % (r, c, x.measured, x.mean, x.spread_pct, pred,
                                                                      float(x.err_pct), x.within_15, x.within_spread))
        n += 1
        in15 += x.within_15 == "yes"
        inspread += x.within_spread == "yes"
    if fmt != "csv":
        out.append(f"of {n} cells measured more than once (the calibration cell left out): {in15} within 15% of their "
                   f"mean, {inspread} within their own spread")
    return "\n".join(out) + "\n"
