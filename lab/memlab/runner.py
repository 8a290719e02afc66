"""The lab's runs: the tools and the model, then every cell of the schedule in rounds —
the disk measured and the walks made before each round, every configuration run at
every ratio in the memory cgroup, the page cache dropped before each run — then the
rounds pooled, the table and the plots (docs/memlab.md, "What it does")."""

import glob
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from . import configs as cfg
from . import disk, options, plots, replay_check, rundir, tools
from .log import LabError, die, log, say
from .root import RootSteps, cgroup_version
from .table import TableSpec, make_table


def lab_cache():
    """The lab's cache: $MOE_RESIDENCY_CACHE (or ~/.cache/moe-residency)/memlab."""
    base = os.environ.get("MOE_RESIDENCY_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "moe-residency")
    return os.path.join(base, "memlab")


def hypervisor():
    """'KVM', 'PVM', ...: what the kernel detected at boot (dmesg: "Hypervisor detected: X"),
    else /sys/hypervisor/type, else 'none detected'. Machines of one kind differ underneath
    (a PVM guest pays ~1.4 us at the first touch of a newly mapped page, a KVM guest does
    not): every table names it."""
    try:
        out = subprocess.run(["dmesg"], check=False, text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL).stdout
        for line in out.splitlines():
            if "Hypervisor detected:" in line:
                return line.split("Hypervisor detected:", 1)[1].strip()
    except OSError:
        pass
    try:
        with open("/sys/hypervisor/type") as f:
            return f.read().strip() or "none detected"
    except OSError:
        return "none detected"


def machine(version):
    """'2 cores, 24 GiB, Linux 6.1.0, cgroup v1, hypervisor KVM': the table's title names the machine."""
    with open("/proc/meminfo") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("MemTotal"))
    return (f"{options.cores()} cores, {'%.0f' % (kib / 1048576)} GiB, {platform.system()} {platform.release()}, "
            f"cgroup v{version}, hypervisor {hypervisor()}")


def openmp_environment(environ):
    """The OpenMP wait every run gets, and its name for the table's title.

    ggml's OpenMP workers spin for ~300k iterations between graphs by default (libgomp), on the
    cores the lanes and the kernel's reads need; told to sleep at once (OMP_WAIT_POLICY=PASSIVE)
    they wake late and every token pays (docs/llama-cpp-residency.md, "Threads"). A short spin
    keeps both: GOMP_SPINCOUNT=1000 (libgomp), KMP_BLOCKTIME=1 (LLVM's libomp) — what moe-run sets.
    Any of the three set in the environment is kept, and named instead."""
    names = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
    given = [f"{n}={environ[n]}" for n in names if environ.get(n)]
    if given:
        return {}, " ".join(given)
    return {"GOMP_SPINCOUNT": "1000", "KMP_BLOCKTIME": "1"}, "GOMP_SPINCOUNT=1000"


class BackgroundLoad:
    """N busy processes beside a run (--background-load): other work competing for the cores."""

    def __init__(self, n):
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]

    def stop(self):
        for p in self.procs:
            p.kill()
            p.wait()
        self.procs = []


@dataclass
class Lab:
    """One invocation: its settings, tools, model and where its runs go."""
    settings: options.Settings
    tools: tools.Tools
    model: str
    out: str
    root: RootSteps = None
    child: subprocess.Popen = None

    def __post_init__(self):
        s = self.settings
        self.preset, self.ratios, self.configs, self.budget = s.preset, s.ratios, s.configs, s.budget
        self.rounds = s.rounds
        self.size = os.stat(self.model).st_size
        self.size_mib = self.size // 1048576
        self.limits = {r: int("%.0f" % (self.size / float(r) / 1048576)) for r in self.ratios}
        self.unlimited = {c for c in self.configs if not cfg.BY_NAME[c].limited}
        self.disk = (not s.flag("no_disk") and self.preset.disk_reads > 0 and self.tools is not None
                     and bool(self.tools.lanes))
        self.openmp_env, self.openmp = openmp_environment(os.environ)
        self.load = int(s.given.get("background_load") or 0)
        self.rdir = self.out

    def table_spec(self, extended):
        s = self.settings
        routing = ""
        if s.route is not None:
            routing = f"; routing forced from {os.path.basename(s.route.path)}"
        elif s.trace is not None:
            routing = "; the random model's own routing (near-uniform: the worst case)"
        return TableSpec(self.preset.name, os.path.basename(self.model) + routing, self.size_mib, self.preset.tokens,
                         self.settings.decode, self.settings.threads, self.openmp, self.load,
                         machine(self.root.version if self.root else cgroup_version()), self.ratios, self.configs,
                         self.limits, self.unlimited, self.preset.slice_bytes, options.cores(), extended,
                         int(s.given.get("warm_from") or 1))

    # ---- one run -------------------------------------------------------------
    def run(self, name, limit_mib, args):
        """One moe-lab-run in the cgroup (`limit_mib` None: no limit); its log, per-token
        CSV, metrics, route trace (with the observer), peak and status in the round's
        directory."""
        r = self.rdir
        self.root.limit(None if limit_mib is None else limit_mib * 1048576)
        # For the timing model (lab/memlab.sh predict): the phone-format metrics of every
        # run, and the route trace of every run that has the observer.
        extra = ["--metrics-csv", os.path.join(r, f"{name}.metrics.csv")]
        if "--no-observer" not in args:
            extra += ["--trace-out", os.path.join(r, f"{name}.route.csv")]
        argv = [self.tools.run, "--model", self.model, "--tokens", str(self.preset.tokens), "--decode",
                str(self.settings.decode), "--per-token-csv", os.path.join(r, f"{name}.csv"), *extra,
                *self.settings.forwarded("to_runs"), *args]
        # The same OpenMP wait for every configuration (openmp_environment), and the same
        # background load, if asked for, started before the run and stopped after it.
        env = dict(os.environ, **self.openmp_env)
        load = BackgroundLoad(self.load)
        try:
            with open(os.path.join(r, f"{name}.log"), "wb") as logf:
                self.child = subprocess.Popen(self.root.in_cgroup(argv), stdout=logf, stderr=subprocess.STDOUT,
                                              env=env)
                try:
                    rc = self.child.wait(timeout=self.settings.run_timeout)
                except subprocess.TimeoutExpired:
                    self.child.send_signal(signal.SIGTERM)
                    self.child.wait()
                    rc = 124
                self.child = None
        finally:
            load.stop()  # also when the run or the lab is interrupted
        rc = 128 - rc if rc < 0 else rc  # killed by a signal: as a shell reports it
        rundir.write(os.path.join(r, f"{name}.peak"), self.root.peak_mib() + "\n")
        if rc == 0:
            rundir.write(os.path.join(r, f"{name}.status"), "ok\n")
            return
        status = {124: "timeout", 137: "killed"}.get(rc, "failed")  # killed: the cgroup's OOM killer (see dmesg)
        rundir.write(os.path.join(r, f"{name}.status"), status + "\n")
        log(f"{name}: exited with {rc} ({status}) — see {r}/{name}.log")
        with open(os.path.join(r, f"{name}.log"), errors="replace") as f:
            for line in f.read().splitlines()[-3:]:
                say(line)
        if os.path.isfile(os.path.join(r, f"{name}.csv")):
            os.remove(os.path.join(r, f"{name}.csv"))

    def stale_gate(self, ratio):
        """The stale-gate accuracy an observer (or all) run measured, this round or an earlier one."""
        candidates = ([os.path.join(self.rdir, f"r{ratio}-observer.log")]
                      + sorted(glob.glob(os.path.join(self.out, "round-*", f"r{ratio}-observer.log")))
                      + sorted(glob.glob(os.path.join(self.rdir, "r*-all.log")))
                      + sorted(glob.glob(os.path.join(self.out, "round-*", "r*-all.log"))))
        for path in candidates:
            acc = rundir.stale_gate_pct(path)
            if acc:
                return acc
        return ""

    def run_entry(self, ratio, name):
        """One entry of the schedule: a cell at `ratio`, or (ratio None) a run without a limit."""
        config = cfg.BY_NAME[name]
        if ratio is None:
            log(f"{name}: no limit, page cache warm")
            with open(self.model, "rb") as f:
                while f.read(1 << 24):
                    pass
            # manager-*: the manager acting with every expert resident, its own cost a token, at
            # the first ratio's budget.
            limit = self.limits[self.ratios[0]]
            self.run(name, None, cfg.run_args(config, self.budget, limit))
            return
        limit = self.limits[ratio]
        degrade = "0"
        if config.degraded:
            # Replace a share P of predicted slots so that acc x (1 - P) ~ the real model's
            # accuracy, acc being the stale-gate's slot accuracy the observer run measured.
            acc = self.stale_gate(ratio)
            if not acc:
                log(f"r{ratio}-{name}: skipped — no stale-gate accuracy measured (run observer first)")
                return
            degrade = cfg.degrade_share(float(acc), self.settings.degrade_to)
            log(f"r{ratio}-{name}: stale-gate measured {acc}% of slots; --degrade {degrade}")
        log(f"r{ratio}-{name}: limit {limit} MiB (model {self.size_mib} MiB / {ratio}), page cache dropped")
        self.root.drop_caches()
        if config.read_ahead_kb:
            # Plain mmap at another read-ahead (the kernel's default: what most NVMe drives have),
            # the device's own setting restored right after the run (and by the exit trap).
            changed = self.root.read_ahead(self.model, config.read_ahead_kb)
            if not changed:
                log(f"r{ratio}-{name}: skipped — no read_ahead_kb found for the device of {self.model}")
                return
            ra_file, saved = changed.split(" ", 1)
            log(f"r{ratio}-{name}: {ra_file} {saved} -> {config.read_ahead_kb} for this run")
        try:
            self.run(rundir.cell(ratio, name), limit, cfg.run_args(config, self.budget, limit, degrade))
        finally:
            if config.read_ahead_kb:
                self.root.restore_read_ahead()

    # ---- the whole lab ---------------------------------------------------------
    def schedule(self):
        """Every run of a round once, in round 1's order: the limited cells ratio by ratio;
        the runs without a limit once each, where the first ratio's list names them."""
        out = []
        for ratio in self.ratios:
            for name in self.configs:
                entry = (None, name) if name in self.unlimited else (ratio, name)
                if entry not in out:
                    out.append(entry)
        return out

    def rounds_run(self):
        # One round: the disk curve, the walks, then every run of the schedule. With --rounds N,
        # each round is a whole run in out/round-K (its own disk-lanes.csv and table.txt), round 1
        # in the schedule's order and every even round in the reverse order, so that a drift of
        # the machine over the rounds falls on every cell alike.
        schedule = self.schedule()
        for k in range(1, self.rounds + 1):
            if self.rounds > 1:
                self.rdir = os.path.join(self.out, f"round-{k}")
                os.makedirs(self.rdir, exist_ok=True)
                log(f"round {k} of {self.rounds}{', in reverse order' if k % 2 == 0 else ''}")
            disk.curves(self, self.rdir)
            disk.fault_walk(self, self.rdir)
            disk.inline_walk(self, self.rdir)
            for ratio, name in (reversed(schedule) if k % 2 == 0 else schedule):
                self.run_entry(ratio, name)
            rundir.copy_unlimited(self.rdir, self.ratios, [c for c in self.configs if c in self.unlimited])
            if self.rounds > 1:
                make_table(self.rdir, self.table_spec(False), title_suffix=f"; round {k} of {self.rounds}")
                self.plots(self.rdir)
                self.replay_check(self.rdir)  # each round's runs recorded their own routing
        # The disk and the walks again after the runs (a long fault-driven run reads tens of GiB):
        # whether the device still reads as it did before them; with rounds, the model centres
        # its curve and walks on the middle of the run with these.
        disk.curve_after(self, self.out)
        disk.fault_walk(self, self.out, "fault-walk-after.csv")
        disk.inline_walk(self, self.out, "inline-walk-after.csv")
        if self.rounds > 1:
            rundir.pool_rounds(self.out, self.rounds, self.ratios, self.configs)
        suffix = f"; pooled over {self.rounds} rounds (round-1 ... round-{self.rounds})" if self.rounds > 1 else ""
        self.finish(suffix, plot=self.rounds == 1)

    def finish(self, suffix="", plot=True):
        s = self.settings
        sys.stdout.write(make_table(self.out, self.table_spec(s.flag("extended")), s.csv, suffix))
        sys.stdout.flush()
        if self.rounds == 1:
            self.replay_check(self.out)
        if s.csv:
            shutil.copyfile(s.csv, os.path.join(self.out, "table.csv"))
        if plot:
            self.plots(self.out)
        log(f"done: {self.out}/table.txt")

    def replay_check(self, d):
        """replay-check.txt in run directory `d` (one round), and on the standard output."""
        if self.tools is None or not self.tools.cli:
            return
        check = replay_check.make(d, self.ratios, self.configs, self.tools.cli, self.settings.decode)
        if check:
            sys.stdout.write(f"live against the replay of each run's own routing (decode-only, the cell's policy, "
                             f"budget and oracle), {os.path.basename(d)}:\n" + check)

    def plots(self, d):
        if not self.settings.flag("no_plot"):
            plots.make_plots(d, self.preset.name, self.size_mib, self.ratios, self.configs, self.limits)


def main(argv):
    s = options.parse(argv)
    lab_dir = lab_cache()
    model = os.path.join(lab_dir, s.preset.model_file)
    if "table_only" in s.given:
        # No runs: the run directory's cells, the model's name and size (the limits).
        d = s.given["table_only"]
        if not os.path.isdir(d):
            die(f"--table-only: '{d}' is not a directory")
        if not os.path.isfile(model):
            die(f"--table-only: the lab's model {model} is missing (the table's limits are its size / the ratios)")
        lab = Lab(s, None, model, os.path.abspath(d))
        rundir.copy_unlimited(lab.out, lab.ratios, [c for c in lab.configs if c in lab.unlimited], only_missing=True)
        lab.finish(plot=False)
        return 0
    root = RootSteps()
    t = tools.in_directory(s.given["tools"]) if "tools" in s.given else tools.build()
    os.makedirs(lab_dir, exist_ok=True)
    tools.ensure_model(t, s.preset, model)
    out = os.path.join(lab_dir, "runs", time.strftime("%Y%m%d-%H%M%S") + "-" + s.preset.name)
    os.makedirs(out, exist_ok=True)
    lab = Lab(s, t, model, out, root)
    log(f"model {model} ({lab.size_mib} MiB); results in {out}")
    log(f"machine: {machine(root.version)}")

    def stop(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        lab.rounds_run()
    except BaseException:
        if lab.child is not None and lab.child.poll() is None:
            lab.child.terminate()
            lab.child.wait()
        raise
    return 0
