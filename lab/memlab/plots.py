"""The lab's plots: each ratio's decode token times, one line a configuration, drawn by
gnuplot from a data file (tokens-r<RATIO>.dat beside the plots: the decode token, then
one column of ms a token per configuration, named in the header). The gnuplot script is
fixed text and numbers this module formats; no name, path or other string from the
run reaches it (the data file's names are read by gnuplot as data)."""

import csv
import math
import os
import shutil
import subprocess
import tempfile

from . import rundir
from .log import log

SCRIPT = """set datafile separator ","
set datafile missing "NaN"
set key autotitle columnheader
set terminal {terminal} size 1000,600
set output "tokens.{ext}"
set title "memlab ({preset}): decode token time, model {size_mib} MiB at ratio {ratio:g} (limit {limit} MiB)"
set xlabel "decode token"
set ylabel "ms per token"
set logscale y
set key outside right
set grid
plot for [i=2:{last}] "tokens.dat" using 1:i with linespoints
"""
TERMINALS = (("pngcairo", "png"), ("svg", "svg"))
PRESETS = ("full", "quick", "smoke", "shape")  # the only words of a title


def decode_times(path):
    """{token: ms} of a per-token CSV's decode rows."""
    out = {}
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    for row in rows[1:]:
        if len(row) > 2 and row[1] == "decode":
            try:
                out[int(row[0])] = float(row[2])
            except ValueError:
                continue
    return out


def data_file(series):
    """The data file's text: token, then each series' ms (NaN where it has none)."""
    tokens = sorted({t for _, times in series for t in times})
    lines = [",".join(["token"] + [name for name, _ in series])]
    for t in tokens:
        lines.append(",".join([str(t)] + [repr(times[t]) if t in times else "NaN" for _, times in series]))
    return "\n".join(lines) + "\n"


def make_plots(d, preset, size_mib, ratios, configs, limits):
    """tokens-r<RATIO>.png and .svg (and .dat) in run directory `d`; nothing without gnuplot."""
    gnuplot = shutil.which("gnuplot")
    if gnuplot is None or preset not in PRESETS:
        return
    for ratio in ratios:
        series = []
        for config in configs:
            path = os.path.join(d, f"{rundir.cell(ratio, config)}.csv")
            if os.path.isfile(path):
                series.append((config, decode_times(path)))
        if not series:
            continue
        dat = data_file(series)
        rundir.write(os.path.join(d, f"tokens-r{ratio}.dat"), dat)
        value = float(ratio)
        if not math.isfinite(value):
            continue
        with tempfile.TemporaryDirectory(prefix="memlab-plot-") as tmp:
            with open(os.path.join(tmp, "tokens.dat"), "w") as f:
                f.write(dat)
            for terminal, ext in TERMINALS:
                script = SCRIPT.format(terminal=terminal, ext=ext, preset=preset, size_mib=int(size_mib), ratio=value,
                                       limit=int(limits[ratio]), last=len(series) + 1)
                subprocess.run([gnuplot], input=script, text=True, cwd=tmp, check=False,
                               stdout=subprocess.DEVNULL)
                made = os.path.join(tmp, f"tokens.{ext}")
                if os.path.isfile(made):
                    shutil.move(made, os.path.join(d, f"tokens-r{ratio}.{ext}"))
        log(f"plot: {d}/tokens-r{ratio}.png, .svg")
