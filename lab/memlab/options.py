"""The lab's command line: one row an option (OPTIONS), each value checked before
anything runs, a refusal naming the option, the value and what was expected. An option
whose value every run (or the model writer) receives as given names the tool's option
in `to_runs` (`to_model`): adding such a pass-through option is one row here."""

import os
import re
from dataclasses import dataclass, field

from . import configs as cfg
from . import presets
from . import trace
from .log import die


def _whole(lo, hi, what):
    def check(v):
        if not re.fullmatch(r"[1-9][0-9]*", v) or not lo <= int(v) <= hi:
            return f"'{v}'; expected {what}"
        return None
    return check


def _share(v):
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)?", v) or not 0 < float(v) < 100:
        return f"'{v}'; expected the percentage of slots a real model's stale-gate predicts, above 0, below 100"
    return None


@dataclass(frozen=True)
class Option:
    flag: str
    dest: str
    metavar: str = ""  # '': a flag without a value
    help: str = ""
    check: object = None  # value -> the refusal's text after '--flag: ', or None
    to_runs: str = ""  # moe-lab-run's option that gets the value on every run
    to_model: str = ""  # moe-lab-model's option that gets it (it changes the model: name its file after it)


OPTIONS = (
    Option("--quick", "quick", help="the quick preset (a ~1.4 GiB model, 8 prompt + 16 decode tokens)"),
    Option("--smoke", "smoke", help="the CTest preset (a ~1 GiB model, ratio 2, mmap, all, all-serial, all-pool)"),
    Option("--shape", "shape", "NAME",
           help="a real model's shape at scale: qwen3-30b-a3b (a 16.0 GiB q4_K model; ratios 2.0 (an 8 GiB limit), "
                "1.5 and 3; 8 prompt + 16 decode tokens) or qwen3-30b-a3b-half (its first 24 layers)"),
    Option("--shape-from", "shape_from", "TRACE",
           help="a recorded route trace's shape (any route_trace v1 CSV): a random model whose every layer's expert "
                "bytes are the trace's (moe-lab-model --shape-from), run with the trace's routing (--route-from the "
                f"same trace, unless --own-routing); ratios {presets.TRACE_RATIOS}, the trace's prompt and decode "
                "tokens"),
    Option("--route-from", "route_from", "TRACE", to_runs="--route-from",
           help="every run routes as this recorded trace did (moe-lab-run --route-from): llama.cpp's own routing "
                "replaced at each MoE layer, the stock runs too; the model must have the trace's MoE shape"),
    Option("--own-routing", "own_routing",
           help="with --shape-from: the random model's own routing (near-uniform, no reuse: the worst case), "
                "not the trace's"),
    Option("--trace-layers", "trace_layers", "N", to_runs="--trace-layers",
           check=_whole(1, 65535, "a whole number of layers from 1 to 65535"),
           help="only the first N layers of the trace (a model cut to fit a disk): the model and every run"),
    Option("--csv", "csv", "FILE", help="also write the table as CSV (docs/memlab.md, \"The columns\")"),
    Option("--csv-extended", "extended",
           help="append engine_majflt_per_token, status, x_roofline, cpu_use, read_wait_ms_per_token and "
                "read_waits_per_token to every CSV row"),
    Option("--configs", "configs", "LIST", help="comma list of configurations (below)"),
    Option("--ratios", "ratios", "LIST", help="model size / memory limit ratios (default 1.5,2.5)"),
    Option("--tools", "tools", "DIR",
           help="use the lab's tools in DIR (moe-lab-run, moe-lab-model, moe-disk-lanes); no build"),
    Option("--threads", "threads", "N", to_runs="--threads", check=_whole(1, 1024, "a whole number from 1 to 1024"),
           help="llama.cpp threads (default: every core, nproc); every run gets GOMP_SPINCOUNT=1000 and "
                "KMP_BLOCKTIME=1 (a short OpenMP spin, as moe-run) unless the environment sets one of them or "
                "OMP_WAIT_POLICY"),
    Option("--background-load", "background_load", "N",
           check=_whole(0, 64, "a whole number of busy processes from 0 to 64"),
           help="run N busy processes beside every run (other work competing for the cores; default 0)"),
    Option("--budget", "budget", "MIB|auto|P%",
           help="the pinned expert cache's budget: MiB, auto (the manager sizes it from the cgroup limit), or a "
                "share of the limit (default: auto; quick and smoke: 25%%, their limits being too small for the "
                "auto margin)"),
    Option("--run-timeout", "run_timeout", "S", check=_whole(1, 10**9, "a whole number of seconds, at least 1"),
           help="give up on one run after S seconds (default 1800; quick and smoke 600)"),
    Option("--decode", "decode", "N", check=_whole(1, 10**9, "a whole number of decode tokens, at least 1"),
           help="decode N tokens instead of the preset's (full 64, quick 16, smoke 12)"),
    Option("--rounds", "rounds", "N", check=_whole(1, 10**6, "a whole number of rounds, at least 1"),
           help="run every cell N times, in rounds (round-1 ... round-N, each a whole run with its own disk curve), "
                "every even round in the reverse order; the table is pooled over the rounds"),
    Option("--degrade-to", "degrade_to", "PCT", check=_share,
           help=f"the stale-gate slot accuracy the degraded cells fall to, percent (default {cfg.REAL_STALE_GATE_PCT}: "
                "the seed engine's on a real Qwen3-30B-A3B)"),
    Option("--warm-from", "warm_from", "N", check=_whole(1, 10**9, "a whole number of a decode token, at least 1"),
           help="the table's figures (tok/s, percentiles, reads, faults, CPU, the roofline's resident) over each "
                "run's decode tokens N and later: the first N-1 left out, a cache filling from empty (default 1: "
                "every decode token); hit%% stays the run's own; with --table-only, an earlier run's table again"),
    Option("--table-only", "table_only", "DIR",
           help="no runs: the table (and --csv) again from the run directory DIR of an earlier invocation with the "
                "same preset, ratios and configs (needs no root)"),
    Option("--no-plot", "no_plot", help="no gnuplot"),
    Option("--no-disk", "no_disk",
           help="skip the disk bandwidth measurements (before the runs, and again after them) and the walks"),
)
BY_FLAG = {o.flag: o for o in OPTIONS}


@dataclass
class Settings:
    """The lab's settings: the options as given, then the preset's defaults."""
    given: dict = field(default_factory=dict)  # dest -> value (True for a flag)
    preset: presets.Preset = None
    ratios: list = field(default_factory=list)
    configs: list = field(default_factory=list)
    threads: str = ""
    budget: str = ""
    run_timeout: int = 0
    decode: int = 0
    rounds: int = 1
    degrade_to: float = cfg.REAL_STALE_GATE_PCT
    csv: str = ""
    trace: object = None  # --shape-from's TraceInfo
    route: object = None  # --route-from's TraceInfo

    def flag(self, dest):
        return bool(self.given.get(dest))

    def forwarded(self, to):
        """[tool option, value, ...] of the options every run (to='to_runs') or the model
        writer (to='to_model') receives."""
        out = []
        for o in OPTIONS:
            target = getattr(o, to)
            if target and o.dest in self.given:
                out += [target, self.value(o.dest)]
        return out

    def value(self, dest):
        return getattr(self, dest) if hasattr(self, dest) else self.given[dest]


def cores():
    """The cores this process may run on (what nproc prints)."""
    return len(os.sched_getaffinity(0))


def help_text():
    lines = ["The memory lab (docs/memlab.md): stock llama.cpp decoding a MoE GGUF larger than its memory limit, "
             "through plain mmap and with the residency manager's parts, side by side.",
             "",
             "  sudo lab/memlab.sh [--quick|--smoke|--shape NAME] [options]   the lab (the full preset by default)",
             "  lab/memlab.sh predict RUNS_DIR [options]                       the timing model against a run "
             "(lab/memlab.sh predict --help)",
             "",
             "Options:"]
    for o in OPTIONS:
        lines.append(f"  {o.flag}{' ' + o.metavar if o.metavar else ''}")
        lines.append(f"      {o.help.replace('%%', '%')}")
    lines += ["", "Presets:"]
    for p in list(presets.PRESETS.values()) + [presets.shape_preset(presets.SHAPES[0])]:
        lines.append(f"  {p.name:<6} ratios {p.ratios}; {p.tokens} + {p.decode} tokens; budget {p.budget}; configs "
                     f"{p.configs}")
    lines += ["", "Configurations (moe-lab-run's options; each of dense..cache is that part alone on top of the "
                  "observer):"]
    for c in cfg.CONFIGS:
        lines.append(f"  {c.name:<14} {' '.join(c.args) or '(the observer)'}")
        lines.append(f"  {'':<14} {c.what}{'' if c.limited else '; no limit'}")
    return "\n".join(lines) + "\n"


def parse(argv):
    """The settings of a lab invocation; refuses a bad option or value naming it."""
    s = Settings()
    i = 0
    while i < len(argv):
        a = argv[i]
        o = BY_FLAG.get(a)
        if o is None:
            die(f"unknown argument '{a}' (see --help)")
        if o.metavar:
            if i + 1 >= len(argv) or argv[i + 1] == "":
                die(f"{a} needs {o.metavar}")
            s.given[o.dest] = argv[i + 1]
            i += 2
        else:
            s.given[o.dest] = True
            i += 1
    # The preset: the last of --quick, --smoke and --shape given wins, as each replaces the other.
    name = "full"
    for a in argv:
        if a in ("--quick", "--smoke", "--shape", "--shape-from"):
            name = a[2:]
    for o in OPTIONS:
        if o.check and o.dest in s.given:
            problem = o.check(s.given[o.dest])
            if problem:
                die(f"{o.flag}: {problem}")
    layers = int(s.given.get("trace_layers", 0))
    if name == "shape-from":
        s.trace = trace.read(s.given["shape_from"], "--shape-from")
        if layers > s.trace.n_layer:
            die(f"--trace-layers: {layers}; expected at most the trace's {s.trace.n_layer} layers")
        s.preset = presets.trace_preset(s.trace, layers)
        if "route_from" not in s.given and not s.flag("own_routing"):
            s.given["route_from"] = s.given["shape_from"]
    elif s.flag("own_routing"):
        die("--own-routing: only with --shape-from (the routing of a model in a trace's shape)")
    if s.flag("own_routing") and "route_from" in s.given:
        die("--own-routing and --route-from: give one (the model's own routing, or a trace's)")
    if "trace_layers" in s.given and "shape_from" not in s.given and "route_from" not in s.given:
        die("--trace-layers has no effect without --shape-from or --route-from; give one, or drop --trace-layers")
    if "route_from" in s.given:
        s.route = trace.read(s.given["route_from"], "--route-from")
    elif "trace_layers" in s.given:
        del s.given["trace_layers"]  # --own-routing: the cut is the model's (its preset), not the runs
    if name == "shape-from":
        pass
    elif name == "shape":
        shape = s.given["shape"]
        if shape not in presets.SHAPES:
            die(f"--shape: '{shape}'; expected {' or '.join(presets.SHAPES)}")
        s.preset = presets.shape_preset(shape)
    else:
        s.preset = presets.PRESETS[name]
    p = s.preset
    s.threads = s.given.get("threads", str(cores()))
    s.run_timeout = int(s.given.get("run_timeout", p.run_timeout))
    s.decode = int(s.given.get("decode", p.decode))
    s.rounds = int(s.given.get("rounds", 1))
    s.degrade_to = float(s.given.get("degrade_to", cfg.REAL_STALE_GATE_PCT))
    ratios = s.given.get("ratios", p.ratios)
    for r in (x for x in ratios.split(",") if x):
        if not re.fullmatch(r"[0-9]+(\.[0-9]+)?", r) or not 1 <= float(r) <= 100:
            die(f"--ratios: '{r}' in '{ratios}'; expected ratios of the model's size to the memory limit, from 1 to 100")
    if not ratios.replace(",", "").strip() or ",," in ratios or ratios.startswith(",") or ratios.endswith(","):
        die(f"--ratios: '{ratios}'; expected a comma list of ratios like 1.5,2.5")
    s.ratios = ratios.split(",")
    s.budget = s.given.get("budget", p.budget)
    if s.budget != "auto":
        m = re.fullmatch(r"([0-9]+(\.[0-9]+)?)(%?)", s.budget)
        if not m or not float(m.group(1)) > 0 or (m.group(3) and not float(m.group(1)) < 100):
            die(f"--budget: '{s.budget}'; expected MiB > 0, auto, or a share of the limit like 40% (above 0, below 100)")
    configs = s.given.get("configs", p.configs)
    s.configs = [c for c in configs.split(",") if c]
    for c in s.configs:
        if c not in cfg.BY_NAME:
            die(f"--configs: '{c}'; expected {cfg.names_expected()}")
    if not s.configs:
        die(f"--configs: '{configs}'; expected a comma list of configurations like mmap,all")
    for c in s.configs:
        if cfg.BY_NAME[c].needs_route and "route_from" not in s.given:
            die(f"--configs: '{c}' predicts from the trace's routing; expected --route-from TRACE (or --shape-from "
                "without --own-routing)")
    csv_path = s.given.get("csv", "")
    s.csv = os.path.abspath(csv_path) if csv_path else ""
    if int(s.given.get("warm_from") or 1) > s.decode:
        die(f"--warm-from: '{s.given['warm_from']}'; expected a decode token from 1 to {s.decode} (--decode)")
    if "table_only" in s.given and s.rounds != 1:
        die("--table-only: one round only (the rounds' pooling is not redone)")
    return s
