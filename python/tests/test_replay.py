"""Replay and score in Python against the moe-residency tool's own output, digit for
digit, on both shared traces."""

import os

import numpy as np
import pytest

import moe_residency as mr

BUDGETS = [500, 2000, 4000]  # one below both traces' token cycle (785 and 908 MiB)


@pytest.fixture(scope="module")
def traces(traces_dir):
    return {n: mr.read_trace(os.path.join(traces_dir, n + ".route.csv")) for n in ("qwen", "gptoss")}


def test_every_builtin_policy_equals_the_cli(traces, trace_path, trace_name, cli):
    policies = mr.policy_names()
    assert {"lru", "lfu", "belady", "cycle", "arc", "s3fifo", "sieve"} <= set(policies)
    r = mr.replay(traces[trace_name], budgets=BUDGETS, policies=policies)
    expected = cli("replay", "--trace", trace_path, "--budgets", ",".join(map(str, BUDGETS)),
                   "--policies", ",".join(policies), "--format", "csv")
    assert r.to_csv() == expected
    assert len(r) == len(BUDGETS) * len(policies)
    # budget-major, policies in the order given
    assert list(r.policy[:len(policies)]) == policies
    assert np.all(r.budget_mib[:len(policies)] == BUDGETS[0])


def test_retention_decorators_equal_the_cli(traces, trace_path, trace_name, cli):
    policies = ["lru+prev", "layerlfu+oracle", "cycle+prev"]
    r = mr.replay(traces[trace_name], budgets=[2000], policies=policies, threads=1)
    assert r.to_csv() == cli("replay", "--trace", trace_path, "--budgets", "2000", "--policies",
                             ",".join(policies), "--format", "csv")


def test_recorded_figures(traces):
    # The engine's own figures (../shared/traces/README.md): decode-only LRU hit % at the
    # engine's budget, to the published decimal, and LRU's collapse below the token cycle.
    q = mr.replay(traces["qwen"], budgets=[4000, 500], policies=["lru"])
    assert round(q.cell("lru", 4000)["hit_pct_decode"], 1) == 80.3
    assert round(q.cell("lru", 4000)["hit_pct_cum"], 1) == 74.9
    assert q.cell("lru", 500)["hit_pct_decode"] == 0.0
    assert q.cell("lru", 500)["below_token_cycle"] and q.cell("lru", 500)["warning"]
    g = mr.replay(traces["gptoss"], budgets=[3000], policies=["lru"])
    assert round(g.hit_pct_decode[0], 1) == 44.8
    assert round(g.hit_pct_cum[0], 1) == 32.4


def test_columns_agree_with_each_other(traces):
    r = mr.replay(traces["qwen"], budgets=BUDGETS, policies=["lru", "belady"])
    assert np.allclose(r.hit_pct_cum, 100.0 * r.hits / r.lookups)
    assert np.allclose(r.hit_pct_decode, 100.0 * r.decode_hits / r.decode_lookups)
    above = ~r.below_token_cycle
    assert np.any(above) and np.all(r.peak_resident_mib[above] <= r.budget_mib[above] + 1e-9)
    assert np.all(r.token_cycle_bytes == traces["qwen"].shape.token_cycle_bytes)
    recs = r.records()
    assert recs[0]["policy"] == "lru" and recs[0]["budget_mib"] == 500.0


def test_threads_do_not_change_results(traces):
    a = mr.replay(traces["gptoss"], budgets=BUDGETS, policies=["lru", "cycle", "random"], threads=1)
    b = mr.replay(traces["gptoss"], budgets=BUDGETS, policies=["lru", "cycle", "random"], threads=4)
    assert a.to_csv() == b.to_csv()


@pytest.mark.parametrize("args", [
    dict(speculate="prev-token"),
    dict(speculate="oracle:0.886", spec_cap=4),
    dict(drop=0.75),
    dict(drop=1.0, speculate="frequency", horizon=2),
])
def test_dynamic_replay_equals_the_cli(traces, trace_path, trace_name, cli, args):
    r = mr.replay(traces[trace_name], budgets=[2000, 4000], policies=["lru", "cycle"], **args)
    cmd = ["replay", "--trace", trace_path, "--budgets", "2000,4000", "--policies", "lru,cycle", "--format", "csv"]
    if "speculate" in args:
        cmd += ["--speculate", args["speculate"]]
    if "spec_cap" in args:
        cmd += ["--spec-cap", args["spec_cap"]]
    if "horizon" in args:
        cmd += ["--horizon", args["horizon"]]
    if "drop" in args:
        cmd += ["--drop", args["drop"]]
    assert r.to_csv() == cli(*cmd)
    assert r.decode_tokens == traces[trace_name].decode_tokens


def test_oracle_profile_from_a_list_and_a_file(traces, tmp_path, trace_name, trace_path, cli):
    t = traces[trace_name]
    ps = [0.5 + 0.5 * (l % 2) for l in range(t.shape.n_layers)]
    f = tmp_path / "profile.txt"
    f.write_text("".join("%g\n" % p for p in ps))
    a = mr.replay(t, budgets=[2000], policies=["lru"], speculate="oracle:1", oracle_profile=ps)
    b = mr.replay(t, budgets=[2000], policies=["lru"], speculate="oracle:1", oracle_profile=f)
    assert a.to_csv() == b.to_csv()
    assert a.to_csv() == cli("replay", "--trace", trace_path, "--budgets", "2000", "--policies", "lru",
                             "--speculate", "oracle:1", "--oracle-profile", f, "--format", "csv")


def test_curve(traces):
    c = mr.curve(traces["qwen"], policies=["lru", "belady"], budgets=[1000, 2000, 4000])
    assert list(c["budget_mib"]) == [1000, 2000, 4000]
    assert round(c["token_cycle_mib"]) == 785
    assert np.all(np.diff(c["belady"]["miss_ratio"]) <= 0)  # Belady's misses never rise with the budget
    assert np.all(c["belady"]["miss_ratio"] <= c["lru"]["miss_ratio"])
    assert np.allclose(c["lru"]["miss_ratio"], 1 - c["lru"]["hit_pct_decode"] / 100)
    # budgets in any order, repeated: the curve is along ascending budgets, each once
    u = mr.curve(traces["qwen"], policies=["lru", "belady"], budgets=[4000, 1000, 2000, 1000])
    assert list(u["budget_mib"]) == [1000, 2000, 4000]
    for p in ("lru", "belady"):
        assert np.array_equal(u[p]["hit_pct_decode"], c[p]["hit_pct_decode"])
    d = mr.curve(traces["gptoss"], policies=["lru"], points=8)
    assert 2 <= len(d["budget_mib"]) <= 8 and d["budget_mib"][0] < d["token_cycle_mib"]


def test_score_equals_the_cli(traces, trace_path, trace_name, cli):
    s = mr.score(traces[trace_name])
    assert s.to_csv() == cli("score", "--trace", trace_path, "--format", "csv")
    for args, flags in [(dict(predictors=["frequency"], decay=0.9), ["--predictors", "frequency", "--decay", "0.9"]),
                        (dict(predictors=["prev-token", "static-hottest"], paired=False, include_prefill=True),
                         ["--predictors", "prev-token,static-hottest", "--unpaired", "--include-prefill"])]:
        assert mr.score(traces[trace_name], **args).to_csv() == cli("score", "--trace", trace_path, "--format",
                                                                     "csv", *flags)


def test_score_recorded_figures(traces):
    # The engine's previous-token predictor, decode, slot overlap (../shared/traces/README.md).
    assert round(mr.score(traces["qwen"], predictors=["prev-token"])["prev-token"]["slot_pct"], 1) == 38.0
    g = mr.score(traces["gptoss"], predictors=["prev-token"])["prev-token"]
    assert round(g["slot_pct"], 1) == 17.9
    # per-layer figures add up to the total
    assert g["layer_routings"].sum() == g["routings"]
    assert np.nanmax(g["layer_slot_pct"]) >= g["slot_pct"] >= np.nanmin(g["layer_slot_pct"])


def test_the_gil_is_released_while_cells_run(traces):
    # A thread replays a grid; this thread keeps stamping the clock meanwhile. Held, the
    # GIL would stop this thread for the whole grid: no stamp between the replay's start
    # and end, one gap as long as the replay.
    import threading
    import time
    t = traces["qwen"]
    # One call long enough to tell on any machine: sized from a timed cell (which also builds
    # the replay inputs, so the timed call does not).
    t0 = time.perf_counter()
    mr.replay(t, budgets=[4000], policies=mr.policy_names(), threads=1)
    per_budget = time.perf_counter() - t0
    budgets = [1000 + 10 * i for i in range(max(2, min(400, int(0.4 / per_budget) + 1)))]
    started, span = threading.Event(), []

    def work():
        started.set()
        t0 = time.perf_counter()
        mr.replay(t, budgets=budgets, policies=mr.policy_names(), threads=1)
        span.extend([t0, time.perf_counter()])
    w = threading.Thread(target=work)
    w.start()
    started.wait()
    stamps = []
    while w.is_alive():
        stamps.append(time.perf_counter())
    w.join()
    t0, t1 = span
    inside = [t0] + [s for s in stamps if t0 < s < t1] + [t1]
    gap = max(b - a for a, b in zip(inside, inside[1:]))
    assert t1 - t0 > 0.05, "the grid was too quick to tell (%.3f s)" % (t1 - t0)
    assert gap < (t1 - t0) / 2, "this thread stopped for %.3f s of a %.3f s replay" % (gap, t1 - t0)
