"""Traces in Python: numpy views of the rows (no copy) against a plain csv-module parse,
and round trips through write_trace."""

import csv
import os

import numpy as np
import pytest

import moe_residency as mr


def slow_parse(path):
    """The obvious reading of a route_trace v1 CSV: header lines, then rows by column name."""
    meta, layers, rows = {}, {}, []
    with open(path) as f:
        lines = f.read().splitlines()
    body = []
    for ln in lines:
        if ln.startswith("# model="):
            meta = dict(kv.split("=", 1) for kv in ln[2:].split())
        elif ln.startswith("# layer="):
            kv = dict(x.split("=", 1) for x in ln[2:].split())
            layers[int(kv["layer"])] = int(kv["expert_bytes"])
        elif not ln.startswith("#"):
            body.append(ln)
    for rec in csv.DictReader(body):
        rows.append(rec)
    return meta, layers, rows


def test_views_equal_a_slow_parse(trace_path):
    t = mr.read_trace(trace_path)
    meta, layers, rows = slow_parse(trace_path)
    assert len(t) == len(rows)
    assert t.arch == meta["arch"] and t.n_layer == int(meta["n_layer"])
    assert t.n_expert == int(meta["n_expert"]) and t.n_expert_used == int(meta["n_expert_used"])
    for col, attr, conv in [("turn", "turn", int), ("phase", "phase", int), ("step", "step", int),
                            ("layer", "layer", int), ("slot", "slot", int), ("expert", "expert", int),
                            ("residency", "residency", int), ("expert_bytes", "row_expert_bytes", int)]:
        assert np.array_equal(getattr(t, attr), np.array([conv(r[col]) for r in rows])), col
    w = np.array([float(r["weight"]) for r in rows], dtype=np.float32)
    assert np.array_equal(t.weight, w, equal_nan=True)
    assert np.all(t.dropped == -1) != t.has_dropped_column
    for l, b in layers.items():
        assert t.expert_bytes[l] == b and t.shape.expert_bytes[l] == b


def test_views_are_read_only_and_share_the_trace_memory(trace_path):
    t = mr.read_trace(trace_path)
    layer, expert, step = t.layer, t.expert, t.step
    assert not layer.flags.writeable
    with pytest.raises(ValueError):
        layer[0] = 7
    # one 32-byte record per row: every view strides over the same records, no copy
    assert layer.strides == expert.strides == step.strides == (32,)
    base = step.__array_interface__["data"][0]
    assert layer.__array_interface__["data"][0] - base == 8
    assert expert.__array_interface__["data"][0] - base == 10
    # a view keeps the trace alive after the trace object is gone: its base is the trace
    assert type(layer.base).__name__ == "Trace" and layer.base is t
    copy = np.array(layer)
    del t
    import gc
    gc.collect()
    assert type(layer.base).__name__ == "Trace" and np.array_equal(layer, copy)


def test_odd_paths_and_indices(tmp_path, trace_path):
    # a file name that is not UTF-8 (bytes, or a str with surrogate escapes as os.listdir gives)
    raw = os.path.join(os.fsencode(tmp_path), b"\xff.csv")
    with open(trace_path, "rb") as f, open(raw, "wb") as g:
        g.write(f.read())
    assert len(mr.read_trace(raw)) == len(mr.read_trace(os.fsdecode(raw))) > 0
    t = mr.read_trace(tmp_path / os.fsdecode(b"\xff.csv"))   # pathlib
    assert not t.shape.is_moe(65536) and not t.shape.is_moe(t.shape.n_layers) and t.shape.is_moe(0)


def test_write_replaces_only_through_its_own_temporary(tmp_path, trace_path):
    t = mr.read_trace(trace_path)
    out = tmp_path / "out.csv"
    out.write_text("old")
    (tmp_path / "out.csv.tmp").write_text("a file of the user's")
    mr.write_trace(t, out)
    assert out.read_bytes() == open(trace_path, "rb").read() or t.noncanonical_weights
    assert (tmp_path / "out.csv.tmp").read_text() == "a file of the user's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.csv", "out.csv.tmp"]
    mask = os.umask(0)
    os.umask(mask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~mask


def test_decode_tokens_and_shape(traces_dir):
    q = mr.read_trace(os.path.join(traces_dir, "qwen.route.csv"))
    assert q.decode_tokens == 128 and q.shape.top_k == 6 and q.shape.n_moe_layers == 48
    assert round(q.shape.token_cycle_bytes / 1048576) == 785
    assert np.count_nonzero(q.phase == 1) == 128 * 48 * 6
    g = mr.read_trace(os.path.join(traces_dir, "gptoss.route.csv"))
    assert g.decode_tokens == 64 and g.shape.top_k == 2


@pytest.mark.parametrize("form", ["csv", "binary"])
def test_round_trip(trace_path, tmp_path, form):
    t = mr.read_trace(trace_path)
    out = tmp_path / ("t." + form)
    mr.write_trace(t, out, format=form)
    assert [p.name for p in tmp_path.iterdir()] == ["t." + form]
    u = mr.read_trace(out)
    for attr in ("turn", "step", "layer", "expert", "slot", "phase", "residency", "dropped", "row_expert_bytes"):
        assert np.array_equal(getattr(t, attr), getattr(u, attr)), attr
    assert np.array_equal(t.weight, u.weight, equal_nan=True)
    assert np.array_equal(t.expert_bytes, u.expert_bytes) and np.array_equal(t.dense_bytes, u.dense_bytes)
    assert (t.model, t.arch) == (u.model, u.arch)
    if form == "csv" and t.noncanonical_weights == 0:
        assert out.read_bytes() == open(trace_path, "rb").read()
    if form == "binary":
        assert out.read_bytes()[:1] == b"\x89" and out.stat().st_size < os.path.getsize(trace_path)
