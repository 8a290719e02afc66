#!/usr/bin/env bash
# Checks the README's offline `pip install`: copies the files a source install
# uses (setup.py, pyproject.toml, include/, python/) to WORK, makes a venv there
# that sees Debian's packages (numpy, pybind11, setuptools; no network, no index),
# installs with one pip command, and checks the installed module is the one
# imported and that it replays a trace. Usage: scripts/python-pip-check.sh WORK [PYTHON]
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:?usage: python-pip-check.sh WORK [PYTHON]}"
python="${2:-python3}"
rm -rf "$work"
mkdir -p "$work/tree"
cp -r "$src/setup.py" "$src/pyproject.toml" "$src/LICENSE" "$src/include" "$src/python" "$work/tree/"
# --without-pip: Debian's venv without python3-venv; the venv's python runs Debian's pip.
"$python" -m venv --system-site-packages --without-pip "$work/venv"
cd "$work/tree"
"$work/venv/bin/python" -m pip install --no-build-isolation --no-index --no-deps -q .
cd "$work"
"$work/venv/bin/python" - "$work/venv" <<'PY'
import sys, moe_residency as mr, os, tempfile
venv = sys.argv[1]
assert mr._core.__file__.startswith(venv), "imported %s, not the venv's install" % mr._core.__file__
path = os.path.join(tempfile.mkdtemp(), "t.csv")
with open(path, "w") as f:
    f.write("# route_trace v1\n# model=m arch=qwen3moe n_layer=1 n_expert=4 n_expert_used=1\n"
            "# layer=0 expert_bytes=1048576 dense_bytes=0\n"
            "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes\n")
    for step, e in enumerate([0, 1, 0, 2, 0, 1]):
        f.write("0,1,%d,0,0,%d,1,0,1048576\n" % (step, e))
r = mr.replay(path, budgets=[2], policies=["lru", "belady"])
# lru at 2 MiB: 0 1 0(hit) 2(evict 1) 0(hit) 1(miss) -> 2 hits of 6; belady the same here
assert list(r.hits) == [2, 2], r.records()
print("pip install: moe_residency %s from %s replays" % (mr.__version__, os.path.dirname(mr._core.__file__)))
PY
