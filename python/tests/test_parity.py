"""The module refuses what the moe-residency tool refuses, in the same words: every option of
`replay` has its keyword and its refusals; types are strict (a str or a bool where a number goes
is a TypeError naming the parameter); a path holding a NUL byte is refused; no message is
pybind11's generic one; a cell that held more than its budget says so. Each test asserts the
whole message."""

import os
import re
import subprocess

import numpy as np
import pytest

import moe_residency as mr

HEADER = ("# route_trace v1\n# model=m.gguf arch=qwen3moe n_layer=2 n_expert=4 n_expert_used=2\n"
          "# layer=0 expert_bytes=1000 dense_bytes=0\n# layer=1 expert_bytes=1000 dense_bytes=0\n"
          "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes\n")
ROWS = ("0,1,5,0,0,1,0.6,0,1000\n0,1,5,0,1,2,0.4,0,1000\n"
        "0,1,5,1,0,3,0.7,0,1000\n0,1,5,1,1,0,0.3,0,1000\n")


@pytest.fixture
def small(tmp_path):
    p = tmp_path / "small.csv"
    p.write_text(HEADER + ROWS)
    return p


@pytest.fixture(scope="module")
def gptoss(traces_dir):
    return os.path.join(traces_dir, "gptoss.route.csv")


def refusal(*args):
    """The tool's message for a refused command line, without its "moe-residency: " prefix."""
    exe = os.environ.get("MOE_RESIDENCY_CLI")
    if not exe or not os.access(exe, os.X_OK):
        pytest.skip("the moe-residency tool ($MOE_RESIDENCY_CLI) is missing")
    p = subprocess.run([exe, *map(str, args)], capture_output=True, text=True)
    assert p.returncode == 2, "moe-residency %s: exit %d, expected 2: %s" % (args, p.returncode, p.stderr)
    first = p.stderr.splitlines()[0]
    assert first.startswith("moe-residency: ")
    return first[len("moe-residency: "):]


def whole(message):
    """A pytest `match` for exactly `message`."""
    return "^" + re.escape(message) + "$"


# ---- every replay option has its keyword, with the tool's refusals ----------------------------

def test_every_replay_option_has_a_keyword(cli):
    """Each `moe-residency replay --OPTION` is a keyword of mr.replay (--format and --plot are
    the result's to_csv() and the caller's own plotting)."""
    import inspect
    text = cli("replay", "--help")
    options = sorted(set(re.findall(r"^\s+--([a-z][a-z-]+)", text, re.M)) - {"help", "format", "plot"})
    assert "decode-only" in options and "adaptive-scope" in options
    keywords = set(inspect.signature(mr.replay).parameters)
    missing = [o for o in options if o.replace("-", "_") not in keywords and o != "budgets"]
    assert missing == []


@pytest.mark.parametrize("cli_args, cli_message, kwargs, message", [
    (["--policies", "lru", "--decay", "0.5"],
     "--decay: has no effect without the cycle or adaptive policy; --policies is 'lru'",
     {"policies": ["lru"], "decay": 0.5},
     "decay: has no effect without the cycle or adaptive policy; policies are ['lru']"),
    (["--policies", "lru", "--seed", "7"],
     "--seed: has no effect without the random policy or --speculate oracle:P; --policies is 'lru'",
     {"policies": ["lru"], "seed": 7},
     "seed: has no effect without the random policy or speculate='oracle:P'; policies are ['lru']"),
    (["--policies", "lru", "--spec-cap", "3"],
     "--spec-cap: has no effect without --speculate; expected --speculate prev-token, frequency or oracle:P with it",
     {"policies": ["lru"], "spec_cap": 3},
     "spec_cap: has no effect without speculate; expected speculate='prev-token', 'frequency' or 'oracle:P' "
     "with it"),
    (["--policies", "lru", "--horizon", "2"],
     "--horizon: has no effect without --speculate; expected --speculate prev-token, frequency or oracle:P with it",
     {"policies": ["lru"], "horizon": 2},
     "horizon: has no effect without speculate; expected speculate='prev-token', 'frequency' or 'oracle:P' "
     "with it"),
    (["--policies", "lru", "--speculate", "none", "--spec-cap", "3"],
     "--spec-cap: has no effect without --speculate; expected --speculate prev-token, frequency or oracle:P with it",
     {"policies": ["lru"], "speculate": "none", "spec_cap": 3},
     "spec_cap: has no effect without speculate; expected speculate='prev-token', 'frequency' or 'oracle:P' "
     "with it"),
    (["--policies", "lru", "--adaptive-window", "4"],
     "--adaptive-window: has no effect without the adaptive policy; --policies is 'lru'",
     {"policies": ["lru"], "adaptive_window": 4},
     "adaptive_window: has no effect without the adaptive policy; policies are ['lru']"),
    (["--policies", "lru", "--adaptive-scope", "layer"],
     "--adaptive-scope: has no effect without the adaptive policy; --policies is 'lru'",
     {"policies": ["lru"], "adaptive_scope": "layer"},
     "adaptive_scope: has no effect without the adaptive policy; policies are ['lru']"),
    (["--policies", "lru", "--decode-only", "--threads", "2"],
     "--threads: has no effect with --drop, --speculate or --decode-only (those cells run one after the other)",
     {"policies": ["lru"], "decode_only": True, "threads": 2},
     "threads: has no effect with drop, speculate or decode_only (those cells run one after the other)"),
])
def test_options_without_effect_are_refused_as_the_tool_refuses_them(gptoss, cli_args, cli_message, kwargs, message):
    # The same refusal; the tool names its options, the module its keywords.
    assert refusal("replay", "--trace", gptoss, "--budgets", "1000", *cli_args) == cli_message
    with pytest.raises(ValueError, match=whole(message)):
        mr.replay(gptoss, budgets=[1000], **kwargs)


@pytest.mark.parametrize("cli_args, kwargs, message", [
    (["--policies", "cycle", "--decay", "1"], {"policies": ["cycle"], "decay": 1},
     "decay: '1' is out of range; expected a number in (0, 1)"),
    (["--policies", "adaptive", "--adaptive-margin", "1"], {"policies": ["adaptive"], "adaptive_margin": 1},
     "adaptive_margin: '1' is out of range; expected a number in [0, 1)"),
    (["--policies", "adaptive", "--adaptive-first", "belady"], {"policies": ["adaptive"], "adaptive_first": "belady"},
     "adaptive_first: 'belady' is not a choice; expected lru, lfu, layer, layerlfu, arc, s3fifo, sieve or cycle"),
    (["--policies", "adaptive", "--adaptive-objective", "time"],
     {"policies": ["adaptive"], "adaptive_objective": "time"},
     "adaptive_objective: 'time' is not a choice; expected bytes or misses"),
    (["--policies", "random", "--seed", "-1"], {"policies": ["random"], "seed": -1},
     "seed: '-1' is negative; expected a whole number >= 0"),
    (["--policies", "lru", "--speculate", "prev-token", "--spec-cap", "33"],
     {"policies": ["lru"], "speculate": "prev-token", "spec_cap": 33},
     "spec_cap: '33' is out of range; expected a whole number from 0 to 32"),
    (["--policies", "lru", "--speculate", "prev-token", "--horizon", "3"],
     {"policies": ["lru"], "speculate": "prev-token", "horizon": 3},
     "horizon: '3' is out of range; expected a whole number from 1 to 2"),
])
def test_values_are_refused_in_the_tools_words(gptoss, cli_args, kwargs, message):
    cli_message = refusal("replay", "--trace", gptoss, "--budgets", "1000", *cli_args)
    name = message.split(":")[0]
    assert cli_message == "--" + name.replace("_", "-") + message[len(name):]
    with pytest.raises(ValueError, match=whole(message)):
        mr.replay(gptoss, budgets=[1000], **kwargs)


def test_decode_only_and_adaptive_tuning_give_the_tools_figures(gptoss, cli):
    # --decode-only: the prompt skips the cache; Belady's future is then the decode lookups alone.
    r = mr.replay(gptoss, budgets=[1000, 3000], policies=["lru", "belady"], decode_only=True)
    assert isinstance(r, mr.DynamicReplayResult)
    assert r.to_csv() == cli("replay", "--trace", gptoss, "--budgets", "1000,3000", "--policies", "lru,belady",
                             "--decode-only", "--format", "csv")
    assert np.all(r.hit_pct_decode[1::2] >= r.hit_pct_decode[0::2])  # Belady >= LRU at every budget
    a = mr.replay(gptoss, budgets=[3000], policies=["lru", "adaptive"], adaptive_first="lru", adaptive_margin=0.999,
                  adaptive_window=0)
    assert a.to_csv() == cli("replay", "--trace", gptoss, "--budgets", "3000", "--policies", "lru,adaptive",
                             "--adaptive-first", "lru", "--adaptive-margin", "0.999", "--adaptive-window", "0",
                             "--format", "csv")
    assert a.hits[0] == a.hits[1]  # told to follow lru and never switch, it is lru
    s = mr.replay(gptoss, budgets=[1000], policies=["adaptive"], adaptive_scope="layer", adaptive_objective="misses")
    assert s.to_csv() == cli("replay", "--trace", gptoss, "--budgets", "1000", "--policies", "adaptive",
                             "--adaptive-scope", "layer", "--adaptive-objective", "misses", "--format", "csv")


# ---- strict types ------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"drop": "0.5"}, "drop: '0.5' is a str; expected a number"),
    ({"drop": True}, "drop: True is a bool; expected a number"),
    ({"decode_only": "yes"}, "decode_only: 'yes' is a str; expected True or False"),
    ({"decode_only": 1}, "decode_only: 1 is an int; expected True or False"),
    ({"policies": ["cycle"], "decay": "0.5"}, "decay: '0.5' is a str; expected a number"),
    ({"speculate": "prev-token", "spec_cap": 2.0}, "spec_cap: 2.0 is a float; expected a whole number"),
    ({"speculate": "prev-token", "horizon": True}, "horizon: True is a bool; expected a whole number"),
    ({"policies": ["random"], "seed": "7"}, "seed: '7' is a str; expected a whole number"),
    ({"threads": 1.0}, "threads: 1.0 is a float; expected a whole number"),
    ({"speculate": 1}, "speculate: 1 is an int; expected a str: none, prev-token, frequency or oracle:P"),
    ({"budgets": [True]}, "budgets: True is a bool; expected numbers of MiB"),
    ({"policies": ["adaptive"], "adaptive_window": "8"}, "adaptive_window: '8' is a str; expected a number"),
    ({"speculate": "oracle:1", "oracle_profile": ["0.5", 1]},
     "oracle_profile[0]: '0.5' is a str; expected a number from 0 to 1"),
    ({"speculate": "oracle:1", "oracle_profile": [False, 1]},
     "oracle_profile[0]: False is a bool; expected a number from 0 to 1"),
])
def test_a_wrong_type_is_a_type_error_naming_the_parameter(small, kwargs, message):
    call = {"budgets": [0.002], "policies": ["lru"]}
    call.update(kwargs)
    with pytest.raises(TypeError, match=whole(message)):
        mr.replay(small, **call)


@pytest.mark.parametrize("kwargs, message", [
    ({"paired": "no"}, "paired: 'no' is a str; expected True or False"),
    ({"include_prefill": 0}, "include_prefill: 0 is an int; expected True or False"),
    ({"decay": "1"}, "decay: '1' is a str; expected a number"),
    ({"predictors": ["prev-token", 3]}, "predictors[1]: 3 is an int; expected a str: prev-token, frequency, "
                                        "static-hottest"),
])
def test_score_types_are_strict(small, kwargs, message):
    with pytest.raises(TypeError, match=whole(message)):
        mr.score(small, **kwargs)


def test_whatif_and_calibrate_types_are_strict(small):
    with pytest.raises(TypeError, match=whole("drop: '0.5' is a str; expected a number")):
        mr.whatif(small, None, 1, drop="0.5")
    with pytest.raises(TypeError, match=whole("policy: 3 is an int; expected a str: a cache policy")):
        mr.whatif(small, None, 1, policy=3)
    with pytest.raises(TypeError, match=whole("fit_io: 'no' is a str; expected True or False")):
        mr.calibrate(small, small, 1, fit_io="no")
    with pytest.raises(TypeError, match=whole("config: 42 is an int; expected a timing config file (a path) or a "
                                              "dict of its keys")):
        mr.timing_params(42)
    with pytest.raises(ValueError, match=whole("spec_cap: has no effect without speculate; expected "
                                               "speculate='prev-token', 'frequency', 'oracle:P' or 'full' with it")):
        mr.whatif(small, None, 1, spec_cap=2)


def test_a_float_parameter_is_checked_as_the_float_it_becomes(small, gptoss):
    # 1e-46 is in (0, 1] as a double and 0 as the float the frequency predictor keeps.
    message = "decay: '1e-46' is 0 as a float (the value is stored as one); expected a number in (0, 1]"
    with pytest.raises(ValueError, match=whole(message)):
        mr.score(small, predictors=["frequency"], decay=1e-46)
    assert refusal("score", "--trace", gptoss, "--decay", "1e-46") == "--" + message


# ---- empty values and decimal numbers -----------------------------------------------------------

@pytest.mark.parametrize("call, error, message", [
    (lambda t: mr.replay(t, [0.002], speculate=""), ValueError,
     "speculate: empty; expected none, prev-token, frequency or oracle:P"),
    (lambda t: mr.replay(t, [0.002], policies=["lru", ""]), ValueError,
     "policies: item 2 is empty; expected a policy name (" + ", ".join(mr.policy_names()) + ")"),
    (lambda t: mr.score(t, predictors=["prev-token", ""]), ValueError,
     "predictors[1]: empty; expected prev-token, frequency, static-hottest"),
    (lambda t: mr.whatif(t, {"lanes": ""}, 1), ValueError, "config: line 1: lanes: empty value; expected key = value"),
    (lambda t: mr.whatif(t, None, 1, policy=""), ValueError, "policy: empty; expected a cache policy"),
    (lambda t: mr.calibrate(t, t.source, 1, split=""), ValueError, "split: empty; expected halves, interleaved or all"),
])
def test_an_empty_value_is_an_error_not_a_default(small, call, error, message):
    with pytest.raises(error, match=whole(message)):
        call(mr.read_trace(small))


def test_a_real_is_decimal(small, tmp_path):
    cfg = tmp_path / "hex.cfg"
    cfg.write_text("compute_ms_per_token = 0x10\n")
    with pytest.raises(ValueError, match=whole("%s: line 1: compute_ms_per_token: '0x10' is not a decimal number; "
                                               "expected a finite number" % cfg)):
        mr.timing_params(cfg)


# ---- paths ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("call, message", [
    (lambda d, t: mr.read_trace(os.path.join(d, "a\0b.csv")), "read_trace: path: '%s' holds a NUL byte at offset %d; "
                                                              "expected a path (the system would cut it at the NUL)"),
    (lambda d, t: mr.write_trace(t, os.path.join(d, "a\0b.csv")), "write_trace: path: '%s' holds a NUL byte at "
                                                                  "offset %d; expected a path (the system would cut "
                                                                  "it at the NUL)"),
    (lambda d, t: mr.timing_params(os.path.join(d, "a\0b.cfg")), "config: '%s' holds a NUL byte at offset %d; "
                                                                 "expected a path (the system would cut it at the "
                                                                 "NUL)"),
    (lambda d, t: mr.calibrate(t, os.path.join(d, "a\0b.csv"), 1), "metrics: '%s' holds a NUL byte at offset %d; "
                                                                   "expected a path (the system would cut it at "
                                                                   "the NUL)"),
    (lambda d, t: mr.replay(t, [1], speculate="oracle:1", oracle_profile=os.path.join(d, "a\0b.csv")),
     "oracle_profile: '%s' holds a NUL byte at offset %d; expected a path (the system would cut it at the NUL)"),
])
def test_a_nul_byte_in_a_path_is_refused_not_cut(tmp_path, small, call, message):
    # "a" exists: a path cut at the NUL would open it.
    (tmp_path / "a").write_text(HEADER + ROWS)
    t = mr.read_trace(small)
    d = str(tmp_path)
    path = d + "/a\0b" + (".cfg" if "config" in message else ".csv")
    with pytest.raises(ValueError, match=whole(message % (path.replace("\0", "\\x00"), len(d) + 2))):
        call(d, t)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "small.csv"]


def test_bytes_and_pathlike_paths_with_a_nul_are_refused_too(tmp_path):
    with pytest.raises(ValueError, match=r"^read_trace: path: b'x\\x00y' holds a NUL byte at offset 1; "):
        mr.read_trace(b"x\0y")
    import pathlib
    with pytest.raises(ValueError, match=r"holds a NUL byte at offset"):
        mr.read_trace(pathlib.PurePosixPath("x\0y"))
    with pytest.raises(ValueError, match=whole("read_trace: path: empty path; expected a file")):
        mr.read_trace("")


def test_write_trace_refuses_standard_output(small, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=whole("write_trace: path '-' is standard output to the tool; expected a "
                                               "file path (the module writes files: open sys.stdout.buffer and write "
                                               "the file's bytes there)")):
        mr.write_trace(mr.read_trace(small), "-")
    assert not (tmp_path / "-").exists()


# ---- no generic pybind11 message ---------------------------------------------------------------

def test_every_message_names_the_parameter_not_pybind11(small):
    t = mr.read_trace(small)
    cases = [
        (lambda: mr.read_trace(42), TypeError,
         "read_trace: path: 42 is an int; expected a path (str, bytes or os.PathLike)"),
        (lambda: mr.write_trace("t", "out.csv"), TypeError, "write_trace: trace: a str; expected a moe_residency.Trace"),
        (lambda: mr.write_trace(t, "out.csv", format=1), TypeError,
         "write_trace: format: 1 is an int; expected 'csv' or 'binary'"),
        (lambda: t.shape.is_moe("0"), TypeError, "is_moe: layer: '0' is a str; expected a layer number (int)"),
        (lambda: t.shape.is_moe(1.0), TypeError, "is_moe: layer: 1.0 is a float; expected a layer number (int)"),
        (lambda: mr.replay(t, [0.002], policies=[3]), TypeError,
         "policies[0]: 3 is an int; expected a policy name (str) or a class/factory that returns a policy object"),
        (lambda: mr.curve(t, points="16"), TypeError, "points: '16' is a str; expected a whole number"),
    ]
    for call, error, message in cases:
        with pytest.raises(error) as e:
            call()
        assert str(e.value) == message
        assert "incompatible function arguments" not in str(e.value) and "Unable to cast" not in str(e.value)
    assert t.shape.is_moe(np.int64(0)) and not t.shape.is_moe(2 ** 80)


def test_a_python_policys_view_names_its_method(small):
    seen = []

    class Picky:
        def victim(self, view, layer):
            for bad, method in (("1", "evictable"), (True, "resident"), (1.5, "bytes_of")):
                try:
                    getattr(view, method)(bad)
                except TypeError as e:
                    seen.append(str(e))
            try:
                view.layer_count("0")
            except TypeError as e:
                seen.append(str(e))
            return None

    mr.replay(small, budgets=[0.001], policies=[Picky])
    assert seen[:4] == [
        "CacheView.evictable: slot '1' is a str; expected a slot (int): layer * n_experts + expert",
        "CacheView.resident: slot True is a bool; expected a slot (int): layer * n_experts + expert",
        "CacheView.bytes_of: slot 1.5 is a float; expected a slot (int): layer * n_experts + expert",
        "CacheView.layer_count: layer '0' is a str; expected a layer number (int)",
    ]


# ---- a cell that held more than its budget says so -----------------------------------------------

def test_a_cell_above_its_budget_carries_a_warning(traces_dir):
    qwen = mr.read_trace(os.path.join(traces_dir, "qwen.route.csv"))
    r = mr.replay(qwen, budgets=[500, 4000], policies=["lru", "layer"])
    layer_500 = r.cell("layer", 500)
    assert layer_500["peak_resident_mib"] > 500
    assert layer_500["warning"] == (
        "held %.1f MiB at its peak, above its budget of 500.0 MiB (a batch's own experts are never evicted, the "
        "per-layer policies evict only inside the layer being loaded and keep top-k experts a layer, and a policy "
        "may decline to evict): its hit rate is for that memory, not the budget" % layer_500["peak_resident_mib"])
    assert r.cell("lru", 4000)["warning"] == "" and r.cell("lru", 4000)["peak_resident_mib"] <= 4000

    class Hoarder:
        """Never evicts: holds every expert it was given."""
        name = "hoarder"

        def victim(self, view, layer):
            return None

    h = mr.replay(qwen, budgets=[1000], policies=[Hoarder]).records()[0]
    assert h["peak_resident_mib"] > 9 * 1000
    assert h["warning"].startswith("held %.1f MiB at its peak, above its budget of 1000.0 MiB" % h["peak_resident_mib"])
    d = mr.replay(qwen, budgets=[500], policies=["layer"], decode_only=True)
    assert d.peak_resident_mib[0] > 500 and "above its budget of 500.0 MiB" in d.warning[0]


# ---- files: encodings and declared sizes -------------------------------------------------------

def test_a_byte_order_mark_is_skipped_and_compressed_data_named(tmp_path):
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + (HEADER + ROWS).encode())
    assert len(mr.read_trace(bom)) == 4
    gz = tmp_path / "t.csv.gz"
    import gzip
    gz.write_bytes(gzip.compress((HEADER + ROWS).encode()))
    with pytest.raises(ValueError, match=whole("%s: is gzip-compressed data (magic bytes 1f 8b); expected a route "
                                               "trace (CSV or binary): decompress it first (gunzip -k FILE)" % gz)):
        mr.read_trace(gz)
    m = tmp_path / "m.csv"
    m.write_bytes(b"\xef\xbb\xbfstep,wall_ms,wall_ms\n1,2,3\n")
    with pytest.raises(ValueError, match=whole("%s: line 1: column 'wall_ms' named twice (columns 2 and 3); expected "
                                               "each column once" % m)):
        mr.calibrate(bom, m, 1)


def test_a_declared_shape_is_bounded_before_anything_is_sized(tmp_path):
    wide = tmp_path / "wide.csv"
    wide.write_text(HEADER.replace("n_layer=2 n_expert=4", "n_layer=65535 n_expert=65535") + ROWS)
    with pytest.raises(ValueError, match=whole(
            "%s: line 2, column 4: n_layer 65535 x n_expert 65535 = 4294836225 expert slots; expected at most "
            "1048576 (MOE_RESIDENCY_MAX_EXPERT_SLOTS: a replay sizes its tables by layer x expert)" % wide)):
        mr.read_trace(wide)


def test_a_shape_the_replay_cannot_take_names_the_file(tmp_path):
    k40 = tmp_path / "k40.csv"
    rows = "".join("0,1,0,0,%d,%d,0.1,0,1000\n" % (i, i) for i in range(40))
    k40.write_text("# route_trace v1\n# model=m arch=x n_layer=1 n_expert=64 n_expert_used=40\n"
                   "# layer=0 expert_bytes=1000 dense_bytes=0\n"
                   "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes\n" + rows)
    with pytest.raises(ValueError, match=whole("%s: model_shape 'x': top-k 40 out of range; expected [1, 32]" % k40)):
        mr.read_trace(k40)


def test_out_of_memory_says_what_was_being_sized(tmp_path):
    """A MemoryError names what was being sized, not "std::bad_alloc": a trace at the slot
    limit (16 layers x 65535 experts) replayed in a child process whose address space is held
    to what it already uses plus 40 MiB (three cells need about 90)."""
    import sys
    if not os.path.exists("/proc/self/status"):
        pytest.skip("needs /proc to size the address-space limit")
    big = tmp_path / "big.csv"
    big.write_text("# route_trace v1\n# model=m arch=big n_layer=16 n_expert=65535 n_expert_used=1\n"
                   "# layer=0 expert_bytes=1048576 dense_bytes=0\n"
                   "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes\n0,1,0,0,0,1,1,0,1048576\n")
    child = (
        "import resource, sys\n"
        "import moe_residency as mr\n"
        "t = mr.read_trace(sys.argv[1])\n"
        "vm = int([l.split()[1] for l in open('/proc/self/status') if l.startswith('VmSize:')][0]) * 1024\n"
        "resource.setrlimit(resource.RLIMIT_AS, (vm + (40 << 20), resource.RLIM_INFINITY))\n"
        "try:\n"
        "    mr.replay(t, budgets=[1], policies=['lru', 'belady', 'lfu'], threads=1)\n"
        "except MemoryError as e:\n"
        "    print('MemoryError:', e)\n")
    p = subprocess.run([sys.executable, "-c", child, str(big)], capture_output=True, text=True,
                       env=dict(os.environ))
    if "AddressSanitizer" in p.stderr:
        pytest.skip("an address-space limit and a sanitizer's reservations do not mix")
    assert p.stdout == ("MemoryError: out of memory while replaying 3 cells of big (tables of 16 layers x 65535 "
                        "experts a cell)\n"), p.stderr


def test_score_decay_without_frequency_is_refused_as_the_tool_refuses_it(gptoss):
    assert refusal("score", "--trace", gptoss, "--predictors", "prev-token", "--decay", "0.5") == (
        "--decay: has no effect without the frequency predictor; --predictors is 'prev-token'")
    with pytest.raises(ValueError, match=whole("decay: has no effect without the frequency predictor; predictors are "
                                               "['prev-token']")):
        mr.score(gptoss, predictors=["prev-token"], decay=0.5)
