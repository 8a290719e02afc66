"""The lab's configurations: what each cell runs (moe-lab-run's options) and how the
driver treats it. One row a configuration; a new configuration is a new row, and an
option the lab passes to every run is a row of options.FORWARDED."""

from dataclasses import dataclass

# The seed engine's stale-gate slot accuracy on a real Qwen3-30B-A3B, percent: the
# `degraded` cells replace a share of predicted slots so that the random model's (more
# flattering) accuracy falls to it. --degrade-to changes it.
REAL_STALE_GATE_PCT = 88.6

# The trace oracle's slot accuracy, as moe-lab-run's --predictor oracle:P takes it: the same
# real-model figure (the oracle keeps each true slot with probability P; replay
# --speculate oracle:P draws the same).
ORACLE = "oracle:%g" % (REAL_STALE_GATE_PCT / 100)

BUDGET = "{budget}"  # the cell's cache budget: MiB, or the share of its limit, or auto
DEGRADE = "{degrade}"  # the share of predicted slots replaced (degraded cells)


@dataclass(frozen=True)
class Config:
    name: str
    args: tuple  # moe-lab-run's options; BUDGET and DEGRADE are filled per cell
    what: str  # one line: what runs (--help, docs/memlab.md)
    limited: bool = True  # False: no memory limit, page cache warm, once a round
    degraded: bool = False  # needs the stale-gate accuracy an observer (or all) run measured
    read_ahead_kb: int = 0  # > 0: the model's device's read_ahead_kb for the run, restored after
    first_ratio_budget: bool = False  # the budget of the first ratio's limit (runs without a limit)
    needs_route: bool = False  # predicts from the trace: needs --route-from


def _manager(*parts):
    return ("--residency", ",".join(parts), "--residency-budget", BUDGET)


CONFIGS = (
    Config("mmap", ("--no-observer",), "stock llama.cpp: no observer, the device's read-ahead"),
    Config("mmap-128k", ("--no-observer",),
           "stock llama.cpp at the kernel's default read-ahead (the device's read_ahead_kb at 128 for the run)",
           read_ahead_kb=128),
    Config("no-mmap", ("--no-observer", "--load-mode", "no-mmap"), "llama.cpp reading the model into memory"),
    Config("mlock", ("--no-observer", "--load-mode", "mlock"), "llama.cpp, mmap locked whole"),
    Config("observer", (), "the observer and its session only (predictions scored, nothing acted on)"),
    Config("dense", _manager("dense"), "+ dense weights pinned"),
    Config("exact", _manager("exact"), "+ exact prefetch of the routed experts"),
    Config("predicted", _manager("predicted"), "+ predicted prefetch of the next layers"),
    Config("cache", _manager("cache"), "+ the budgeted, pinned expert cache"),
    Config("all", _manager("all"), "every part"),
    Config("all-adaptive", _manager("all") + ("--policy", "adaptive"),
           "every part, the cache following the adaptive policy (the others' cache is lru)"),
    Config("all-serial", _manager("all") + ("--serial",), "every part, the eval thread waiting for each layer's reads"),
    Config("all-pool", _manager("all") + ("--pool", "--spec-cap", "8"),
           "every part, the cache's experts in the expert pool, the next layer's predicted top-8 placed ahead"),
    Config("cache-pool", _manager("cache") + ("--pool",), "the cache alone, in the expert pool"),
    Config("degraded", _manager("all") + ("--degrade", DEGRADE),
           "all, a seeded share of predicted slots replaced so the stale-gate's accuracy falls to "
           f"~{REAL_STALE_GATE_PCT}% (--degrade-to)", degraded=True),
    Config("degraded-pool", _manager("all") + ("--pool", "--spec-cap", "8", "--degrade", DEGRADE),
           "all-pool with degraded's share of wrong predictions", degraded=True),
    Config("exact-cache", _manager("dense,exact,cache"),
           "dense, exact and the cache, no predicted reads: what the manager does without a predictor"),
    Config("exact-cache-l1", _manager("dense,exact,cache") + ("--lanes", "1"),
           "exact-cache on one read lane (the others have 2): lanes as a lever"),
    Config("exact-cache-l4", _manager("dense,exact,cache") + ("--lanes", "4"),
           "exact-cache on four read lanes"),
    Config("all-oracle", _manager("all") + ("--predictor", ORACLE),
           f"every part, the predicted reads from the trace's next layer at {REAL_STALE_GATE_PCT}% of slots "
           "(the trace oracle; --route-from)", needs_route=True),
    Config("all-oracle-pool", _manager("all") + ("--pool", "--spec-cap", "8", "--predictor", ORACLE),
           "all-oracle with the cache's experts in the expert pool, the oracle's top-k placed ahead",
           needs_route=True),
    Config("all-perfect", _manager("all") + ("--predictor", "oracle:1"),
           "every part, the predicted reads from the trace's next layer, every slot right (the bound of prediction)",
           needs_route=True),
    Config("resident", ("--no-observer",), "stock llama.cpp, no limit, page cache warm: the upper bound", limited=False),
    Config("resident-all", ("--residency", "all", "--residency-budget", "auto"),
           "every part (auto budget), no limit, page cache warm: the manager's cost when the model fits",
           limited=False),
    Config("manager-exact", _manager("exact") + ("--residency-when-fits", "act"),
           "exact acting although the model fits, no limit, page cache warm: the manager's own cost a token",
           limited=False, first_ratio_budget=True),
    Config("manager-cache", _manager("cache") + ("--residency-when-fits", "act"),
           "the same for the pinned cache alone (the budget of the first ratio)", limited=False,
           first_ratio_budget=True),
)

BY_NAME = {c.name: c for c in CONFIGS}


def names_expected():
    """'mmap, mmap-128k, ... or manager-cache': the names, for a refusal."""
    names = [c.name for c in CONFIGS]
    return ", ".join(names[:-1]) + " or " + names[-1]


def cell_budget(budget, limit_mib):
    """The cache budget of a cell whose limit is `limit_mib`: a share of the limit (N%)
    in whole MiB, or the budget as given (MiB or auto)."""
    if budget.endswith("%"):
        return "%.0f" % (limit_mib * float(budget[:-1]) / 100)
    return budget


def degrade_share(stale_gate_pct, target_pct=REAL_STALE_GATE_PCT):
    """The share P of predicted slots to replace so that acc x (1 - P) ~ target: the
    degraded cells' --degrade, 4 decimals, never below 0."""
    p = 1 - target_pct / stale_gate_pct
    return "%.4f" % max(p, 0.0)


def run_args(config, budget, limit_mib, degrade="0"):
    """moe-lab-run's options of `config` in a cell whose limit is `limit_mib` (for runs
    without a limit, first_ratio_budget configurations: the first ratio's)."""
    b = cell_budget(budget, limit_mib)
    return [b if a == BUDGET else degrade if a == DEGRADE else a for a in config.args]
