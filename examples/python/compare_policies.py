#!/usr/bin/env python3
"""Five residency policies over a budget sweep on recorded routing, drawn as miss-ratio
curves: the experiment a researcher runs before building a policy into an engine.

    python3 examples/python/compare_policies.py [TRACES_DIR] [--out curves.png]

TRACES_DIR defaults to $MOE_RESIDENCY_TRACES or ../shared/traces; every *.route.csv in it
gets a panel. Needs the moe_residency module (docs/python.md) and matplotlib
(Debian: python3-matplotlib).
"""

import argparse
import glob
import os
import sys

import matplotlib

matplotlib.use("Agg")  # a file, no display
import matplotlib.pyplot as plt  # noqa: E402

import moe_residency as mr  # noqa: E402

POLICIES = ["lru", "layerlfu", "s3fifo", "cycle", "belady"]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default = os.environ.get("MOE_RESIDENCY_TRACES") or os.path.join(here, "..", "..", "..", "shared", "traces")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="?", default=default, help="a folder of *.route.csv, or one trace file")
    ap.add_argument("--out", default="compare_policies.png", help="the PNG to write")
    ap.add_argument("--points", type=int, default=14, help="budgets per curve")
    a = ap.parse_args()

    paths = [a.traces] if os.path.isfile(a.traces) else sorted(glob.glob(os.path.join(a.traces, "*.route.csv")))
    if not paths:
        sys.exit("compare_policies: no *.route.csv in %s; give a folder of traces or a trace" % a.traces)

    fig, axes = plt.subplots(1, len(paths), figsize=(6.5 * len(paths), 4.6), squeeze=False)
    for ax, path in zip(axes[0], paths):
        t = mr.read_trace(path)
        c = mr.curve(t, policies=POLICIES, points=a.points)
        name = os.path.basename(path).replace(".route.csv", "")
        print("%s (%s, %d decode tokens): decode miss ratio per budget" % (name, t.shape.name, t.decode_tokens))
        print("  budget MiB " + "".join("%10s" % p for p in POLICIES))
        for i, b in enumerate(c["budget_mib"]):
            print("  %10.1f " % b + "".join("%10.3f" % c[p]["miss_ratio"][i] for p in POLICIES))
        for p in POLICIES:
            ax.plot(c["budget_mib"], c[p]["miss_ratio"], marker="o", ms=3, label=p,
                    linestyle="--" if p == "belady" else "-")
        ax.axvline(c["token_cycle_mib"], color="#aa0000", linestyle=":", label="token cycle")
        ax.set_xscale("log")
        ax.set_ylim(0, 1)
        ax.set_xlabel("cache budget (MiB)")
        ax.set_ylabel("decode miss ratio")
        ax.set_title("%s: %d layers x %d experts, top-%d" % (name, t.shape.n_moe_layers, t.shape.n_experts,
                                                            t.shape.top_k))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print("wrote %s" % a.out)


if __name__ == "__main__":
    main()
