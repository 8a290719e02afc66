"""Runs examples/python/compare_policies.py on the shared traces and checks what it wrote:
a PNG, and a miss ratio per budget and policy that equals the module's own replay.
Exit 77 (CTest: skipped) without matplotlib or without the traces, unless CI=true."""

import os
import subprocess
import sys

example, png = sys.argv[1], sys.argv[2]
ci = os.environ.get("CI") == "true"
src = os.environ["MOE_RESIDENCY_SOURCE_DIR"]
traces = (os.environ.get("MOE_RESIDENCY_TRACES") or os.environ.get("MOE_RESIDENCY_DEFAULT_TRACES")
          or os.path.join(src, "..", "shared", "traces"))
for what, ok in [("matplotlib (python3-matplotlib)", __import__("importlib").util.find_spec("matplotlib")),
                 ("the shared traces at " + traces, os.path.isfile(os.path.join(traces, "qwen.route.csv")))]:
    if not ok:
        print("*** %s missing: %s ***" % (what, "FAILING under CI=true" if ci else "SKIPPING"), file=sys.stderr)
        sys.exit(1 if ci else 77)

if os.path.exists(png):
    os.remove(png)
out = subprocess.run([sys.executable, example, traces, "--out", png, "--points", "6"], capture_output=True,
                     text=True)
assert out.returncode == 0, out.stderr
with open(png, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n", "not a PNG"

import moe_residency as mr  # noqa: E402

# Every printed miss ratio is the replay's, for both traces.
lines = out.stdout.splitlines()
checked = 0
for i, ln in enumerate(lines):
    if "decode miss ratio per budget" not in ln:
        continue
    name = ln.split()[0]
    policies = lines[i + 1].split()[2:]
    t = mr.read_trace(os.path.join(traces, name + ".route.csv"))
    for row in lines[i + 2:]:
        if not row.startswith("  "):
            break
        cells = row.split()
        budget = float(cells[0])
        r = mr.replay(t, budgets=[budget], policies=policies)
        for p, shown in zip(policies, cells[1:]):
            assert shown == "%.3f" % (1 - r.cell(p, budget)["hit_pct_decode"] / 100), (name, p, budget)
            checked += 1
assert checked >= 2 * 5 * 2, out.stdout
print(out.stdout + "checked %d printed miss ratios against the replay" % checked)
