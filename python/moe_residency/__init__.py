"""moe-residency for policy experiments: read routing traces into numpy, replay
policy x budget grids, score predictors and run the wall-clock model, all in the
library's C++ (the same code the ``moe-residency`` tool runs), and try a
residency policy written in Python.

    import moe_residency as mr
    t = mr.read_trace("../shared/traces/qwen.route.csv")
    r = mr.replay(t, budgets=[1000, 2000, 4000], policies=["lru", "belady"])
    print(r.to_csv())            # the CLI's `replay --format csv`, digit for digit

See docs/python.md.
"""

import numbers as _numbers
import os as _os

import numpy as _np

from . import _core
from ._core import (  # noqa: F401  (re-exported)
    CacheView,
    ModelShape,
    Trace,
    __version__,
    policy_names,
)

__all__ = [
    "CacheView", "ModelShape", "Trace", "ReplayResult", "DynamicReplayResult", "ScoreResult", "WhatIf",
    "Calibration", "read_trace", "write_trace", "replay", "curve", "score", "whatif", "calibrate", "verdict",
    "timing_params", "policy_names", "history_predictors", "adaptive_rule_names", "__version__",
]

#: The predictors ``score`` knows: they need only the routing history a trace holds.
history_predictors = ("prev-token", "frequency", "static-hottest")

#: The rules the adaptive policy follows (``adaptive_first`` names one of them).
adaptive_rule_names = _core.adaptive_rule_names


# ---- parameters: the tool's rules, with the parameter's name in every message ----

def _a(value):
    """'a str', 'an int': the type of `value` as a message names it."""
    name = type(value).__name__
    return ("an " if name[:1].lower() in "aeiou" else "a ") + name


def _is_bool(value):
    return isinstance(value, (bool, _np.bool_))


def _real(name, value, lo=float("-inf"), hi=float("inf"), lo_open=False, hi_open=False, as_float=False):
    """A real number (not a str, not a bool) checked by the library's rule for the tool's options:
    finite and in the domain, as the float it is stored in when `as_float`."""
    if _is_bool(value) or not isinstance(value, _numbers.Real):
        raise TypeError("%s: %r is %s; expected a number" % (name, value, _a(value)))
    try:
        v = float(value)
    except OverflowError:
        raise ValueError("%s: %r is beyond a double; expected a finite number" % (name, value)) from None
    return _core._check_real(name, v, lo, hi, lo_open, hi_open, as_float)


def _whole(name, value, lo, hi):
    """A whole number (an int or numpy integer, not a bool or a float) from lo to hi."""
    if _is_bool(value) or not isinstance(value, _numbers.Integral):
        raise TypeError("%s: %r is %s; expected a whole number" % (name, value, _a(value)))
    return _core._check_whole(name, str(int(value)), lo, hi)


def _bool(name, value):
    """True or False (numpy's bool too); a str such as "no" is not a truth value."""
    if not _is_bool(value):
        raise TypeError("%s: %r is %s; expected True or False" % (name, value, _a(value)))
    return bool(value)


def _text(name, value, expected):
    """A non-empty str: an empty one is an error, never "not given"."""
    if not isinstance(value, str):
        raise TypeError("%s: %r is %s; expected a str: %s" % (name, value, _a(value), expected))
    if not value:
        raise ValueError("%s: empty; expected %s" % (name, expected))
    return value


def _config(config):
    """A device: None (the defaults), a timing config file's path, or a dict of its keys."""
    if config is None or isinstance(config, (dict, str, bytes, _os.PathLike)):
        return config
    raise TypeError("config: %r is %s; expected a timing config file (a path) or a dict of its keys"
                    % (config, _a(config)))


def read_trace(path):
    """Reads a route trace, CSV or binary (told apart by the first byte). Raises OSError when the
    file cannot be read, ValueError naming the line and column when it is malformed, TypeError
    for a path that is not a str, bytes or os.PathLike."""
    return _core.read_trace(path)


def write_trace(trace, path, format="csv"):
    """Writes a trace as "csv" or "binary" to a new temporary file beside `path`, renamed over it
    only once whole. Refuses a link, a FIFO, a device, a directory, the file the trace was read
    from, and "-" (the tool's standard output: the module writes files)."""
    _core.write_trace(trace, path, format)


def timing_params(config=None):
    """The wall-clock model's parameters of a config (a path or a dict), defaults filled in, as a dict."""
    return _core.timing_params(_config(config))


def _trace(trace):
    """A Trace, or a path read into one."""
    if isinstance(trace, Trace):
        return trace
    if isinstance(trace, (str, bytes, _os.PathLike)):
        return read_trace(trace)
    raise TypeError("trace: %r is %s; expected a moe_residency.Trace or a path to a route trace"
                    % (trace, _a(trace)))


def _decode_trace(trace):
    """_trace, refusing a trace without decode tokens for the calls whose figures are per
    decode token (a 0.0 there would read as a measurement), as the tool does."""
    t = _trace(trace)
    if t.decode_tokens == 0:
        raise ValueError("%s: no decode tokens (the trace holds only prefill rows); expected decode rows, "
                         "since this call reports figures per decode token" % (t.source or "trace"))
    return t


def _list(value, name):
    if isinstance(value, (str, bytes)) or callable(value) or not hasattr(value, "__iter__"):
        return [value]
    out = list(value)
    if not out:
        raise ValueError("%s: empty; expected at least one value" % name)
    return out


def _budgets(value):
    """MiB values: a number or an iterable of numbers (not strings, not bools)."""
    out = []
    for b in _list(value, "budgets"):
        if _is_bool(b) or isinstance(b, (str, bytes)) or not isinstance(b, _numbers.Real):
            raise TypeError("budgets: %r is %s; expected numbers of MiB" % (b, _a(b)))
        out.append(float(b))
    return out


def _mib(name, value):
    """One number of MiB."""
    if _is_bool(value) or isinstance(value, (str, bytes)) or not isinstance(value, _numbers.Real):
        raise TypeError("%s: %r is %s; expected a number of MiB" % (name, value, _a(value)))
    return float(value)


def _int(name, value, lo, hi=None, none=None):
    """A whole number in [lo, hi] (hi None: up to 2**64 - 1); None gives `none` when that is allowed."""
    if value is None and none is not None:
        return none
    return _whole(name, value, lo, 2 ** 64 - 1 if hi is None else hi)


class _Columns:
    """Results as named numpy columns, one row per cell, budget-major."""

    _csv_header = ""

    def __init__(self, columns):
        self.columns = {k: v for k, v in columns.items() if isinstance(v, (_np.ndarray, list))}
        for k, v in self.columns.items():
            setattr(self, k, v)

    def __len__(self):
        return len(self.columns["budget_mib"])

    def records(self):
        """One dict per cell."""
        keys = list(self.columns)
        return [{k: (self.columns[k][i].item() if isinstance(self.columns[k], _np.ndarray)
                     else self.columns[k][i]) for k in keys} for i in range(len(self))]

    def cell(self, policy, budget_mib):
        """The record of one (policy, budget) cell."""
        for rec in self.records():
            if rec["policy"] == policy and rec["budget_mib"] == budget_mib:
                return rec
        raise KeyError("no cell (%r, %g MiB); policies %s, budgets %s"
                       % (policy, budget_mib, sorted(set(self.policy)), sorted(set(self.budget_mib.tolist()))))

    def __repr__(self):
        return "<%s: %d cells>" % (type(self).__name__, len(self))


class ReplayResult(_Columns):
    """A static replay grid. Columns: budget_mib, policy, hit_pct_cum, hit_pct_decode,
    read_mib, lookups, hits, decode_lookups, decode_hits, evictions, peak_resident_mib,
    token_cycle_bytes, below_token_cycle, seconds, warning.

    peak_resident_mib is the most the cache held after a batch. A cell whose peak is above its
    budget carries a warning saying so (the per-layer policies keep top-k experts a layer below
    the token cycle, a batch's own experts are never evicted, a Python policy may decline to
    evict): its hit rate is for that memory, not the budget."""

    def to_csv(self):
        """``moe-residency replay --format csv``: the reference curves' columns."""
        lines = ["budget_mib,policy,hit_pct_cum,hit_pct_decode,read_mib"]
        for i in range(len(self)):
            lines.append("%g,%s,%.3f,%.3f,%.1f" % (self.budget_mib[i], self.policy[i], self.hit_pct_cum[i],
                                                    self.hit_pct_decode[i], self.read_mib[i]))
        return "\n".join(lines) + "\n"


class DynamicReplayResult(_Columns):
    """A replay with dropping, speculative reads and/or the prompt skipping the cache
    (decode_only). Columns: budget_mib, policy, hit_pct_decode, demanded_mib_per_token,
    speculative_mib_per_token, spec_issued, spec_useful, experts_dropped, io_saved_pct,
    mass_lost_pct, evictions, peak_resident_mib, warning (as ReplayResult's: a cell above its
    budget, Belady off the sequence its future was computed from, the drop policy's notes)."""

    def __init__(self, columns):
        super().__init__(columns)
        self.decode_tokens = columns["decode_tokens"]
        self.speculate = columns["speculate"]

    def to_csv(self):
        """``moe-residency replay --drop/--speculate ... --format csv``."""
        lines = ["budget_mib,policy,hit_pct_decode,demanded_mib_per_token,speculative_mib_per_token,"
                 "spec_issued,spec_useful,experts_dropped,io_saved_pct,mass_lost_pct"]
        for i in range(len(self)):
            lines.append("%g,%s,%.3f,%.3f,%.3f,%d,%d,%d,%.3f,%.3f" % (
                self.budget_mib[i], self.policy[i], self.hit_pct_decode[i], self.demanded_mib_per_token[i],
                self.speculative_mib_per_token[i], self.spec_issued[i], self.spec_useful[i],
                self.experts_dropped[i], self.io_saved_pct[i], self.mass_lost_pct[i]))
        return "\n".join(lines) + "\n"


_DEFAULT_POLICIES = ("lru", "lfu", "layer", "layerlfu", "belady", "cycle")


def replay(trace, budgets, policies=_DEFAULT_POLICIES, drop=None, speculate=None, spec_cap=None, horizon=None,
           oracle_profile=None, threads=None, seed=None, decay=None, decode_only=False, adaptive_window=None,
           adaptive_margin=None, adaptive_objective=None, adaptive_first=None, adaptive_scope=None):
    """Replays a route trace through every (budget, policy) cell, as ``moe-residency replay`` does,
    with a keyword for each of its options and the same refusals.

    trace: a Trace or a path. budgets: MiB (1 MiB = 1048576 bytes), one or many.
    policies: built-in names (``policy_names()``, ``+prev``/``+oracle`` retention) and/or
    Python policies: a class (or any callable) returning a fresh policy object per cell.
    drop: F in (0, 1] arms cache-aware dropping (--drop); speculate: "prev-token", "frequency",
    "oracle:P" or "none" (--speculate), with spec_cap (0-32 per layer), horizon (1 or 2) and
    oracle_profile (a per-layer sequence of P, or a file of one); decode_only=True: prompt
    batches skip the cache, as the live residency manager does (--decode-only). With drop,
    speculation or decode_only the result is a DynamicReplayResult (built-in policies only),
    else a ReplayResult. seed: the random policy's and the oracle's (--seed); decay: the cycle
    policy's usage decay per token, in (0, 1) (--decay); adaptive_window (>= 0 tokens, 0 = the
    whole run), adaptive_margin ([0, 1)), adaptive_objective ("bytes" or "misses"),
    adaptive_first (one of ``adaptive_rule_names``) and adaptive_scope ("global" or "layer"):
    the adaptive policy's tuning (--adaptive-*). An option that has no effect in the run asked
    for (decay without the cycle or adaptive policy, seed without the random policy or an
    oracle, spec_cap or horizon without speculation, threads with a dynamic replay) is a
    ValueError naming it, as the tool refuses it.
    threads: worker threads for the static grid's built-in cells (0 = all cores); the GIL is
    released while they run. Python policies run on the calling thread; dynamic cells run one
    after the other (GIL released), as the tool runs them.
    """
    t = _decode_trace(trace)
    budgets = _budgets(budgets)
    policies = _list(policies, "policies")
    names = []
    for i, p in enumerate(policies):
        if isinstance(p, str):
            if not p:
                raise ValueError("policies: item %d is empty; expected a policy name (%s)"
                                 % (i + 1, ", ".join(policy_names())))
            names.append(p)
        elif not callable(p):
            raise TypeError("policies[%d]: %r is %s; expected a policy name (str) or a class/factory that "
                            "returns a policy object" % (i, p, _a(p)))
    decode_only = _bool("decode_only", decode_only)
    if drop is not None:
        drop = _real("drop", drop, 0.0, 1.0, lo_open=True)
    if speculate is not None:
        speculate = _text("speculate", speculate, "none, prev-token, frequency or oracle:P")
    speculating = speculate not in (None, "none")
    oracle = speculating and speculate.startswith("oracle")

    def any_policy(prefix):
        return any(n.startswith(prefix) for n in names)

    # An option that only matters with another, given without it, is an error naming both (the tool's rule).
    for name, value in (("spec_cap", spec_cap), ("horizon", horizon)):
        if value is not None and not speculating:
            raise ValueError("%s: has no effect without speculate; expected speculate='prev-token', 'frequency' "
                             "or 'oracle:P' with it" % name)
    if oracle_profile is not None and not oracle:
        raise ValueError("oracle_profile: has no effect without speculate='oracle:P'; expected them together")
    if decay is not None and not (any_policy("cycle") or any_policy("adaptive")):
        raise ValueError("decay: has no effect without the cycle or adaptive policy; policies are %r" % (policies,))
    for name, value in (("adaptive_window", adaptive_window), ("adaptive_margin", adaptive_margin),
                        ("adaptive_objective", adaptive_objective), ("adaptive_first", adaptive_first),
                        ("adaptive_scope", adaptive_scope)):
        if value is not None and not any_policy("adaptive"):
            raise ValueError("%s: has no effect without the adaptive policy; policies are %r" % (name, policies))
    if seed is not None and not any_policy("random") and not oracle:
        raise ValueError("seed: has no effect without the random policy or speculate='oracle:P'; policies are %r"
                         % (policies,))
    dynamic = drop is not None or speculating or decode_only
    if threads is not None and dynamic:
        raise ValueError("threads: has no effect with drop, speculate or decode_only (those cells run one after "
                         "the other)")

    seed = _core.default_seed if seed is None else _whole("seed", seed, 0, 2 ** 64 - 1)
    decay = _core.default_cycle_decay if decay is None else _real("decay", decay, 0.0, 1.0, True, True)
    threads = 0 if threads is None else _whole("threads", threads, 0, 4096)
    tuning = (
        _core.default_adaptive_window if adaptive_window is None
        else _real("adaptive_window", adaptive_window, 0.0),
        _core.default_adaptive_margin if adaptive_margin is None
        else _real("adaptive_margin", adaptive_margin, 0.0, 1.0, hi_open=True),
        "bytes" if adaptive_objective is None else _text("adaptive_objective", adaptive_objective, "bytes or misses"),
        _core.default_adaptive_first if adaptive_first is None
        else _text("adaptive_first", adaptive_first, ", ".join(adaptive_rule_names)),
        "global" if adaptive_scope is None else _text("adaptive_scope", adaptive_scope, "global or layer"),
    )
    if not dynamic:
        return ReplayResult(_core._replay_static(t, budgets, policies, threads, seed, decay, *tuning))
    for p in policies:
        if not isinstance(p, str):
            raise TypeError("replay: drop, speculate and decode_only run built-in policies only; %r is not a policy "
                            "name" % (p,))
    cap = _core.default_spec_cap if spec_cap is None else _whole("spec_cap", spec_cap, 0, 32)
    horizon = 1 if horizon is None else _whole("horizon", horizon, 1, 2)
    return DynamicReplayResult(_core._replay_dynamic(t, budgets, names, drop, speculate or "none", cap, horizon,
                                                     seed, decay, oracle_profile, decode_only, *tuning))


def curve(trace, policies=("lru", "belady"), budgets=None, points=16, threads=None):
    """Miss-ratio (and hit-rate) curves ready for matplotlib.

    Returns {"budget_mib": array, "token_cycle_mib": float, policy: {"hit_pct_decode": array,
    "miss_ratio": array (0..1, decode), "read_mib": array}}. Without budgets, `points` budgets
    from a tenth of the token cycle to every expert of the model resident.
    """
    t = _decode_trace(trace)
    shape = t.shape
    cycle_mib = shape.token_cycle_bytes / 1048576.0
    if budgets is None:
        full = float(_np.sum(shape.expert_bytes)) * shape.n_experts / 1048576.0
        points = _int("points", points, 2, 10000)
        budgets = _np.round(_np.geomspace(max(cycle_mib / 10, 1.0), full, points), 1)
    budgets = _np.unique(_np.asarray(_budgets(budgets)))  # ascending, each once: the x axis
    r = replay(t, budgets=budgets, policies=policies, threads=threads)
    out = {"budget_mib": budgets, "token_cycle_mib": cycle_mib}
    for p in dict.fromkeys(r.policy):
        idx = [i for i, q in enumerate(r.policy) if q == p]   # budget-major: in budget order
        hit = r.hit_pct_decode[idx]
        out[p] = {"hit_pct_decode": hit, "miss_ratio": 1.0 - hit / 100.0, "read_mib": r.read_mib[idx]}
    return out


class ScoreResult:
    """Slot overlap of each predictor on a trace. ``predictors``: one dict per predictor
    (predictor, name, slot_pct, whole_pct, routings, slots, slot_hits, whole_hits, unscored,
    tie_forgiven, layer_slot_pct, layer_whole_pct, layer_routings); ``offered`` per layer."""

    def __init__(self, d):
        self.predictors = d["predictors"]
        self.offered = d["offered"]
        self.declined = d["declined"]
        self.ignored_phase = d["ignored_phase"]
        self.text = d["text"]

    def __getitem__(self, name):
        for p in self.predictors:
            if p["predictor"] == name:
                return p
        raise KeyError("no predictor %r; scored %s" % (name, [p["predictor"] for p in self.predictors]))

    def to_csv(self):
        """``moe-residency score --format csv``."""
        lines = ["predictor,slot_pct,whole_pct,routings,slots,unscored"]
        for p in self.predictors:
            slot = "%.4f" % p["slot_pct"] if p["slots"] else ""
            whole = "%.4f" % p["whole_pct"] if p["routings"] else ""
            lines.append("%s,%s,%s,%d,%d,%d" % (p["predictor"], slot, whole, p["routings"], p["slots"],
                                                p["unscored"]))
        return "\n".join(lines) + "\n"

    def __repr__(self):
        return "<ScoreResult %s>" % ", ".join("%s %.1f%%" % (p["predictor"], p["slot_pct"]) for p in self.predictors)


def score(trace, predictors=history_predictors, decay=None, paired=True, include_prefill=False):
    """Scores routing-history predictors on a trace (decode, slot overlap), as
    ``moe-residency score`` does: prev-token, frequency (``decay`` per routing, in (0, 1]; refused
    without frequency, as the tool refuses it),
    static-hottest (an oracle: counted over the whole run). ``paired``: score a routing only
    when every listed predictor could rank it (the published comparison)."""
    t = _trace(trace)
    names = _list(predictors, "predictors")
    for i, p in enumerate(names):
        _text("predictors[%d]" % i, p, ", ".join(history_predictors))
    if decay is not None and "frequency" not in names:  # the tool's rule: an option without effect is an error
        raise ValueError("decay: has no effect without the frequency predictor; predictors are %r" % (names,))
    decay = 1.0 if decay is None else _real("decay", decay, 0.0, 1.0, lo_open=True, as_float=True)
    return ScoreResult(_core._score(t, names, decay, _bool("paired", paired), _bool("include_prefill", include_prefill)))


class WhatIf:
    """One configuration's predicted decode timing. ``tokens``: per-token numpy arrays
    (wall_ms, compute_ms, stall_ms, mgmt_ms, wait_ms, io_ms, fault_ms, contention_ms, faults,
    demanded_bytes, speculative_bytes, demanded_reads, speculative_reads, speculative_cancelled,
    hits, lookups); ``summary``: the means ``moe-residency whatif`` prints; ``params``: the
    device; ``top_k`` and ``top_k_modelled`` (True when wider than the trace: the added experts
    are modelled, not replayed)."""

    def __init__(self, d):
        self.tokens = d["tokens"]
        self.summary = d["summary"]
        self.params = d["params"]
        self.policy = d["policy"]
        self.budget_mib = d["budget_mib"]
        self.speculate = d["speculate"]
        self.spec_cap = d["spec_cap"]
        self.warning = d["warning"]
        self.top_k = d["top_k"]
        self.top_k_modelled = d["top_k_modelled"]
        for k, v in self.tokens.items():
            setattr(self, k, v)

    def __repr__(self):
        s = self.summary
        return "<WhatIf %s at %g MiB: %.3f s/token, %.2f tok/s, hit %.1f%%>" % (
            self.policy, self.budget_mib, s["s_per_token"], s["tok_per_s"], s["hit_pct"])


def whatif(trace, config, budget_mib, policy="lru", drop=None, speculate="none", spec_cap=None, horizon=1,
           lanes=None, seed=None, k=None):
    """Predicted per-token decode times of one configuration on a device, as one row of
    ``moe-residency whatif``. config: a timing config file (``calibrate(...).config_text``,
    ``moe-residency calibrate --write-config``) or a dict of its keys. speculate: "none",
    "prev-token", "frequency", "oracle:P" or "full" (oracle:1 at cap top-k). k: experts per
    routing (default the trace's): narrower replays each routing's first k slots, wider adds
    experts drawn from each layer's routing frequency with ``seed`` (modelled, not replayed)."""
    t = _decode_trace(trace)
    speculate = _text("speculate", speculate, "none, prev-token, frequency, oracle:P or full")
    policy = _text("policy", policy, "a cache policy")
    if spec_cap is not None and speculate == "none":  # the tool's rule: an option without effect is an error
        raise ValueError("spec_cap: has no effect without speculate; expected speculate='prev-token', 'frequency', "
                         "'oracle:P' or 'full' with it")
    if seed is not None and not policy.startswith("random") and not speculate.startswith("oracle") and k is None:
        raise ValueError("seed: has no effect without the random policy, speculate='oracle:P' or k; policy is %r, "
                         "speculate %r" % (policy, speculate))
    seed = _int("seed", seed, 0, 2 ** 64 - 1, none=_core.default_seed)
    spec_cap = None if spec_cap is None else _int("spec_cap", spec_cap, 0, 32)
    lanes = None if lanes is None else _int("lanes", lanes, 1, 64)
    drop = None if drop is None else _real("drop", drop, 0.0, 1.0, lo_open=True)
    return WhatIf(_core._whatif(t, _config(config), _mib("budget_mib", budget_mib), policy, drop, speculate,
                                spec_cap, _int("horizon", horizon, 1, 2), lanes, seed,
                                None if k is None else _int("k", k, 1, 32)))


def verdict(time, baseline, noise_pct=None):
    """A configuration against a baseline, as ``moe-residency whatif`` judges it: ``ratio`` =
    time / baseline (> 1: slower), ``verdict`` "slower" above 1 + noise_pct/100, "faster" below
    1 - noise_pct/100, else "within noise". time and baseline: WhatIf results or mean ms per
    token; noise_pct: default the baseline's device's noise_pct (calibrate measures it), else 5."""
    def ms(x, name):
        if isinstance(x, WhatIf):
            return x.summary["s_per_token"] * 1000.0
        if isinstance(x, _numbers.Real) and not isinstance(x, bool):
            return float(x)
        raise TypeError("%s: a %s; expected a WhatIf or a mean token time in ms" % (name, type(x).__name__))
    if noise_pct is None:
        noise_pct = baseline.params.get("noise_pct", 0) if isinstance(baseline, WhatIf) else 0
        noise_pct = noise_pct if noise_pct > 0 else 5.0
    return _core._verdict(ms(time, "time"), ms(baseline, "baseline"), float(noise_pct))


class Calibration:
    """The wall-clock model fitted to recorded per-token metrics. ``params``: the fitted
    device (pass it to ``whatif`` as config); ``config_text``: the same as a config file;
    ``fit``/``held_out``: the scores over every fitted run's tokens;
    ``predicted_ms``/``recorded_ms``/``in_fit``: per metrics row, run after run; ``runs``: per
    run (the fitted ones, then the ``predict`` ones) its configuration, measured and predicted
    mean ms per token, ratio against the first run measured and predicted, and verdicts with the
    band ``noise_pct``."""

    def __init__(self, d):
        for k, v in d.items():
            setattr(self, k, v)

    def to_csv(self):
        """``moe-residency calibrate --format csv``."""
        lines = ["set,tokens,mean_recorded_ms,mean_predicted_ms,median_abs_err_pct"]
        for s in (self.fit, self.held_out):
            lines.append("%s,%d,%.3f,%.3f,%.2f" % (s["set"], s["tokens"], s["mean_recorded_ms"],
                                                   s["mean_predicted_ms"], s["median_abs_err_pct"]))
        return "\n".join(lines) + "\n"

    def __repr__(self):
        return "<Calibration held-out median |err| %.1f%%, fitted %s>" % (
            self.held_out["median_abs_err_pct"], ", ".join(self.free))


def calibrate(trace, metrics, budget_mib=None, policy="lru", config=None, split="halves", fit_io=False,
              run_configs=None, predict=None, predict_configs=None, pair="auto", free=None,
              requests_per_read=None, pipelined_mgmt=False, expert_share=None, noise_pct=None, seed=None):
    """Fits the wall-clock model to recorded per-token metrics (``*.metrics.csv``) over the
    replay of the same trace, as ``moe-residency calibrate`` does: split "halves" fits the first
    half of each run's decode tokens and scores the second, "interleaved" even/odd, "all" every
    token. metrics: a path, or a list of paths of runs of one device and model fitted together,
    each replayed at the configuration its header gives (``# cache_mb=... io_threads=...``) or
    ``run_configs`` (one "key=value,..." per path); budget_mib: the budget of a run that says
    none. predict: runs not fitted, predicted (``predict_configs`` as run_configs). pair: "auto",
    "step" or "volume" (rows matched to the trace's tokens by read volume). free: the fitted
    parameters' names (as ``--free``). config: fixed parameters, a path or a dict."""
    t = _decode_trace(trace)
    metrics = list(metrics) if isinstance(metrics, (list, tuple)) else [metrics]
    predict = [] if predict is None else list(predict) if isinstance(predict, (list, tuple)) else [predict]
    seed = _int("seed", seed, 0, 2 ** 64 - 1, none=_core.default_seed)
    return Calibration(_core._calibrate(
        t, metrics, None if budget_mib is None else _mib("budget_mib", budget_mib),
        _text("policy", policy, "a cache policy"), _config(config), _text("split", split, "halves, interleaved or all"),
        _bool("fit_io", fit_io), list(run_configs or []), predict, list(predict_configs or []), pair,
        None if free is None else _list(free, "free"),
        None if requests_per_read is None else _int("requests_per_read", requests_per_read, 1, 16),
        _bool("pipelined_mgmt", pipelined_mgmt), expert_share, None if noise_pct is None else float(noise_pct), seed))
