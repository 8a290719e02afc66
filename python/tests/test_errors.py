"""Bad input raises the Python exception its kind calls for, carrying the library's
message: OSError (with the path) for files, ValueError for values, TypeError for types."""

import errno
import os
import stat

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


def test_files(tmp_path, small):
    with pytest.raises(FileNotFoundError) as e:
        mr.read_trace(tmp_path / "absent.csv")
    assert e.value.filename == str(tmp_path / "absent.csv") and e.value.errno == errno.ENOENT
    with pytest.raises(IsADirectoryError) as e:
        mr.read_trace(tmp_path)
    assert e.value.filename == str(tmp_path)
    t = mr.read_trace(small)
    with pytest.raises(FileNotFoundError) as e:
        mr.write_trace(t, tmp_path / "no" / "such" / "dir.csv")
    assert e.value.filename == str(tmp_path / "no" / "such" / "dir.csv")
    with pytest.raises(ValueError, match="format 'parquet'; expected 'csv' or 'binary'"):
        mr.write_trace(t, tmp_path / "x", format="parquet")
    with pytest.raises(FileNotFoundError):
        mr.whatif(t, tmp_path / "no.cfg", 1)
    with pytest.raises(FileNotFoundError):
        mr.calibrate(t, tmp_path / "no.metrics.csv", 1)


def test_malformed_traces(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text(HEADER + ROWS.replace("0,1,5,1,0,3,", "0,1,5,1,0,9,"))
    with pytest.raises(ValueError, match=r"bad\.csv: line 8.*expert 9 out of range \[0, 4\)"):
        mr.read_trace(bad)
    bad.write_text(HEADER + ROWS.replace("0.7", "zero"))
    with pytest.raises(ValueError, match="bad.csv: line 8"):
        mr.read_trace(bad)
    cut = tmp_path / "cut.bin"
    mr.write_trace(mr.read_trace(_write(tmp_path / "ok.csv", HEADER + ROWS)), cut, format="binary")
    data = cut.read_bytes()
    cut.write_bytes(data[:-5])
    with pytest.raises(ValueError, match="cut.bin: truncated"):
        mr.read_trace(cut)


def _write(p, text):
    p.write_text(text)
    return p


def test_values(small):
    t = mr.read_trace(small)
    with pytest.raises(ValueError, match="unknown policy 'lruu'"):
        mr.replay(t, budgets=[1], policies=["lruu"])
    with pytest.raises(ValueError, match=r"budget -5 MiB; expected a number in \(0, 1e\+12\] \(MiB\)"):
        mr.replay(t, budgets=[-5], policies=["lru"])
    with pytest.raises(ValueError, match="budget nan"):
        mr.replay(t, budgets=[float("nan")], policies=["lru"])
    with pytest.raises(ValueError, match="budgets: empty"):
        mr.replay(t, budgets=[], policies=["lru"])
    with pytest.raises(ValueError, match="oracle:1.5.*expected a number from 0 to 1"):
        mr.replay(t, budgets=[1], policies=["lru"], speculate="oracle:1.5")
    with pytest.raises(ValueError, match=r"^spec_cap: has no effect without speculate; expected speculate='prev-token', "
                                         r"'frequency' or 'oracle:P' with it$"):
        mr.replay(t, budgets=[1], policies=["lru"], spec_cap=3)
    with pytest.raises(ValueError, match=r"^oracle_profile: has no effect without speculate='oracle:P'; expected them together$"):
        mr.replay(t, budgets=[1], policies=["lru"], speculate="prev-token", oracle_profile=[1, 1])
    with pytest.raises(ValueError, match=r"^threads: '-1' is negative; expected a whole number from 0 to 4096$"):
        mr.replay(t, budgets=[1], policies=["lru"], threads=-1)
    with pytest.raises(ValueError, match="unknown predictor 'oracle'; expected prev-token, frequency, static-hottest"):
        mr.score(t, predictors=["oracle"])
    with pytest.raises(ValueError, match="'frequency' listed twice"):
        mr.score(t, predictors=["frequency", "frequency"])
    with pytest.raises(ValueError, match="decay"):
        mr.score(t, predictors=["frequency"], decay=0)
    with pytest.raises(ValueError, match="config: line 1: unknown key 'lane'"):
        mr.whatif(t, {"lane": 2}, 1)
    with pytest.raises(TypeError, match="config\\['lanes'\\]: '2\\nlanes = 3' holds a line break"):
        mr.whatif(t, {"lanes": "2\nlanes = 3"}, 1)
    with pytest.raises(TypeError, match="config\\['overlap'\\]: a bool"):
        mr.whatif(t, {"overlap": True}, 1)
    with pytest.raises(ValueError, match="overlap = 2; expected a share in \\[0, 1\\]"):
        mr.whatif(t, {"overlap": 2}, 1)
    with pytest.raises(ValueError, match=r"^lanes: '0' is out of range; expected a whole number from 1 to 64$"):
        mr.whatif(t, None, 1, lanes=0)
    with pytest.raises(ValueError, match="split 'odd'"):
        mr.calibrate(t, small, 1, split="odd")
    with pytest.raises(TypeError, match="expected a moe_residency.Trace or a path"):
        mr.replay(42, budgets=[1])
    with pytest.raises(TypeError, match="budgets: '1000' is a str; expected numbers of MiB"):
        mr.replay(t, budgets="1000")
    with pytest.raises(TypeError, match="threads: 1.5 is a float; expected a whole number"):
        mr.replay(t, budgets=[1], threads=1.5)
    with pytest.raises(ValueError, match=r"^seed: '-1' is negative; expected a whole number >= 0$"):
        mr.replay(t, budgets=[1], policies=["random"], seed=-1)
    with pytest.raises(ValueError, match=r"^lanes: '-1' is negative; expected a whole number from 1 to 64$"):
        mr.whatif(t, None, 1, lanes=-1)
    with pytest.raises(TypeError, match="budget_mib: \\[1, 2\\] is a list; expected a number of MiB"):
        mr.whatif(t, None, [1, 2])


def test_numbers_of_other_types(small):
    import numpy as np
    t = mr.read_trace(small)
    a = mr.replay(t, budgets=np.array([0.002, 0.003]), policies="lru", threads=np.int64(1))
    b = mr.replay(t, budgets=[0.002, 0.003], policies=["lru"], threads=1)
    assert a.to_csv() == b.to_csv()
    d = mr.timing_params({"overlap": np.float64(0.25), "lanes": np.int32(4), "curve": {np.int64(1): np.float32(512)}})
    assert d["overlap"] == 0.25 and d["lanes"] == 4 and d["curve"] == {1.0: 512.0}


def test_a_failed_call_loses_nothing(small):
    # The trace and its cached replay inputs are untouched by a call that raised.
    t = mr.read_trace(small)
    before = mr.replay(t, budgets=[0.003], policies=["lru", "belady"]).to_csv()
    with pytest.raises(ValueError):
        mr.replay(t, budgets=[0.003], policies=["lru", "nope"])
    assert mr.replay(t, budgets=[0.003], policies=["lru", "belady"]).to_csv() == before
    assert len(t) == 4 and list(t.expert) == [1, 2, 3, 0]


def test_cut_and_prefill_only_traces(tmp_path, small):
    """A trace cut inside a token is refused by the reader; a prompt without decode reads,
    but the calls that report figures per decode token refuse it rather than return 0.0."""
    cut = tmp_path / "cut.csv"
    cut.write_text(HEADER + ROWS.rsplit("\n", 2)[0] + "\n")
    with pytest.raises(ValueError, match=r"cut\.csv: end of file after line 8: the last routing \(turn 0, decode "
                                         r"step 5, layer 1\) has 1 of 2 experts; expected 2 \(n_expert_used\)"):
        mr.read_trace(cut)
    prefill = tmp_path / "prefill.csv"
    prefill.write_text(HEADER + ROWS.replace("0,1,5,", "0,0,5,"))
    t = mr.read_trace(prefill)
    assert t.decode_tokens == 0
    message = r"prefill\.csv: no decode tokens \(the trace holds only prefill rows\)"
    with pytest.raises(ValueError, match=message):
        mr.replay(t, 1)
    with pytest.raises(ValueError, match=message):
        mr.curve(t)
    with pytest.raises(ValueError, match=message):
        mr.whatif(t, {"compute_ms_per_token": 1}, 1)
    assert mr.read_trace(small).decode_tokens == 1


def test_binary_checksums_and_version_1(tmp_path, small):
    """Binary traces are written as version 2 (checksummed): a flipped byte is refused, naming
    the block. A version 1 file (no checksums) still reads, with a UserWarning."""
    t = mr.read_trace(small)
    v2 = tmp_path / "t.bin"
    mr.write_trace(t, v2, format="binary")
    data = bytearray(v2.read_bytes())
    assert data[8] == 2
    n = len(t)
    records_end = len(data) - 8 - 8  # the header's checksum and one block's
    damaged = bytearray(data)
    damaged[records_end - 20 + 8] ^= 0x01  # the last record's weight
    (tmp_path / "damaged.bin").write_bytes(damaged)
    with pytest.raises(ValueError, match=r"damaged\.bin: records 0 to %d \(block 0 of 1\): checksum \(XXH64\)" % (n - 1)):
        mr.read_trace(tmp_path / "damaged.bin")
    v1 = bytearray(data[:records_end])
    v1[8] = 1
    (tmp_path / "old.bin").write_bytes(v1)
    with pytest.warns(UserWarning, match=r"old\.bin: binary trace version 1 has no checksums"):
        old = mr.read_trace(tmp_path / "old.bin")
    assert len(old) == n


def test_fifo_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match=r"pipe\.csv: is a FIFO \(named pipe\); expected a regular file"):
        mr.read_trace(fifo)


def test_a_file_is_refused_from_its_head_not_read_whole(tmp_path):
    # A 1 TiB sparse file: read whole it would fail for memory, not with the
    # trace's own message.
    big = tmp_path / "sparse.csv"
    with open(big, "wb") as f:
        try:
            f.truncate(1 << 40)
        except OSError as e:
            pytest.skip(f"this file system cannot hold a 1 TiB sparse file: {e}")
    with pytest.raises(ValueError, match=r"sparse\.csv: line 1, column 1: missing magic line"):
        mr.read_trace(big)
    cfg = tmp_path / "nul.cfg"
    cfg.write_bytes(b"lanes = 2\n\0")
    with pytest.raises(ValueError, match=r"nul\.cfg: holds binary data \(a NUL byte at offset 10\); expected a text file"):
        mr.timing_params(cfg)


def test_write_never_goes_through_a_link_a_fifo_or_over_its_input(tmp_path, small):
    """write_trace refuses, before writing anything, a symbolic link (renaming over it
    would replace the link), a FIFO, a directory and the file the trace was read from;
    each is left exactly as it was."""
    t = mr.read_trace(small)
    target = tmp_path / "target.txt"
    target.write_text("the user's file")
    link = tmp_path / "link.csv"
    link.symlink_to(target)
    with pytest.raises(ValueError, match=r"link\.csv' is a symbolic link; expected a regular file or a new path"):
        mr.write_trace(t, link)
    assert link.is_symlink() and target.read_text() == "the user's file"
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match=r"pipe\.csv' is a FIFO \(named pipe\); expected a regular file"):
        mr.write_trace(t, fifo)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    with pytest.raises(ValueError, match=r"' is a directory; expected a regular file or a new path"):
        mr.write_trace(t, tmp_path)
    before = open(small, "rb").read()
    with pytest.raises(ValueError, match=r"is the file this trace was read from"):
        mr.write_trace(t, small, format="binary")
    assert open(small, "rb").read() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.csv", "pipe.csv", "small.csv", "target.txt"]
