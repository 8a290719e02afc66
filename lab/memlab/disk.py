"""The disk, measured around the cells with moe-disk-lanes: its cold random-read curve
against concurrent readers (disk-lanes.csv, and disk-expert.csv at one expert slice, the
roofline's bandwidth), and the two paths the curve cannot price, walked in each ratio's
limit: the fault path (fault-walk.csv) and the pinned cache's inline path
(inline-walk.csv). docs/memlab.md, step 3; docs/lab-predict.md, "The walks"."""

import os
import subprocess

from . import configs as cfg
from . import rundir, stats
from .log import die, log, say

# The timing model's assumed overhead (lab-predict --overhead-mib): llama.cpp's buffers,
# which the walks do not have; they walk at each limit less it, so that their pages have
# the room a cell's have.
WALK_OVERHEAD_MIB = 64
WALK_TOKENS = "24"


def _lanes(lab, *args):
    """moe-disk-lanes on the model, outside the cgroup: its CSV, shown on stderr too."""
    r = subprocess.run([lab.tools.lanes, "--file", lab.model, *args], check=False, text=True, stdout=subprocess.PIPE)
    if r.returncode != 0:
        die(f"moe-disk-lanes {' '.join(args)} exited with {r.returncode}")
    say(r.stdout.rstrip("\n"))
    return r.stdout


def curves(lab, d):
    """d/disk-lanes.csv (4 MiB reads) and d/disk-expert.csv (one expert slice, the
    manager's request), against 1, 2, 4 and 8 readers; at the start of every round."""
    if not lab.disk:
        return
    log("disk: cold random 4 MiB O_DIRECT reads of the model file against concurrent readers")
    rundir.write(os.path.join(d, "disk-lanes.csv"),
                 _lanes(lab, "--readers", "1,2,4,8", "--block-mib", "4", "--reads", str(lab.preset.disk_reads)))
    # The roofline's bandwidth: the manager's own request shape (one expert slice), the
    # best of 1 to 8 concurrent readers (its lanes and the willneed queue between them).
    slice_bytes = lab.preset.slice_bytes
    log(f"disk: cold random {slice_bytes // 1024} KiB O_DIRECT reads (one expert slice, the manager's request) "
        "against concurrent readers")
    rundir.write(os.path.join(d, "disk-expert.csv"),
                 _lanes(lab, "--readers", "1,2,4,8", "--block-mib", "%.10g" % (slice_bytes / 1048576), "--reads",
                        str(lab.preset.disk_reads * 4)))


def curve_after(lab, out):
    """The same measurement after the runs, other blocks (--seed 2, so that no cache
    below the VM answers from the first): whether the device still reads as it did."""
    first = os.path.join(out, "round-1" if lab.rounds > 1 else "", "disk-lanes.csv")
    if not lab.disk or not os.path.isfile(first):
        return
    after = os.path.join(out, "disk-lanes-after.csv")
    r = subprocess.run([lab.tools.lanes, "--file", lab.model, "--readers", "1,2,4,8", "--block-mib", "4", "--reads",
                        str(lab.preset.disk_reads), "--seed", "2"], check=False, text=True, stdout=subprocess.PIPE)
    if r.returncode != 0:
        die(f"moe-disk-lanes --seed 2 exited with {r.returncode}")
    rundir.write(after, r.stdout)
    log(f"disk, MiB/s at 1 / 2 / 4 / 8 readers: before the runs {stats.curve_of(first)}, after "
        f"{stats.curve_of(after)} (disk-lanes-after.csv)")


def _walk(lab, limit, args):
    """One walk in the cgroup at `limit` less the overhead, page cache dropped: its
    CSV's header and row, or None if it failed."""
    lab.root.limit((limit - WALK_OVERHEAD_MIB) * 1048576)
    lab.root.drop_caches()
    r = subprocess.run(lab.root.in_cgroup([lab.tools.lanes, "--file", lab.model, *args]), check=False, text=True,
                       stdout=subprocess.PIPE)
    lines = r.stdout.splitlines()
    if r.returncode != 0 or len(lines) < 2:
        return None
    return lines[0], lines[-1]


def _walks(lab, d, name, kind, cells):
    """Each (limit, args, message) of `cells` walked, d/name written: 'limit_mib,' and the
    walk's columns, one row a walk; False (and no file) if a walk failed."""
    rows = []
    for limit, args, message in cells:
        log(message)
        got = _walk(lab, limit, args)
        if got is None:
            log(f"{kind} walk: moe-disk-lanes --{kind}-walk failed; no {name}")
            lab.root.limit(None)
            if os.path.isfile(os.path.join(d, name)):
                os.remove(os.path.join(d, name))
            return None
        if not rows:
            rows.append(f"limit_mib,{got[0]}")
        rows.append(f"{limit},{got[1]}")
    lab.root.limit(None)
    rundir.write(os.path.join(d, name), "\n".join(rows) + "\n")
    return [r.split(",") for r in rows[1:]]


def fault_walk(lab, d, name="fault-walk.csv"):
    """The fault path in each ratio's limit, before the cells (the model's pages faulted
    in as llama.cpp's decode faults them, no llama.cpp), with the dense pages locked too
    when `dense` runs: for the fault cells of the timing model."""
    if not lab.disk or not {"mmap", "observer", "dense", "predicted"} & set(lab.configs):
        return
    cells = []
    for ratio in lab.ratios:
        limit = lab.limits[ratio]
        for pin in ([], ["--walk-pin-dense"]):
            if pin and "dense" not in lab.configs:
                continue
            cells.append((limit, ["--fault-walk", "--walk-tokens", WALK_TOKENS, *pin],
                          f"fault walk: limit {limit - WALK_OVERHEAD_MIB} MiB (r{ratio} less {WALK_OVERHEAD_MIB})"
                          f"{', dense pages locked' if pin else ''}, page cache dropped"))
    rows = _walks(lab, d, name, "fault", cells)
    for f in rows or []:
        say("memlab: fault walk, limit %s MiB%s: %.3f ms off the CPU and %.3f in the kernel per MiB read, %.1f MiB a "
            "fault" % (f[0], " (dense locked)" if stats.value(f[1]) > 0 else "", stats.value(f[9]),
                       stats.value(f[10]), stats.value(f[11])))


def inline_walk(lab, d, name="inline-walk.csv"):
    """The `cache` configuration's inline path in each ratio's limit, at that ratio's
    budget (the pinned cache's misses read and locked by the calling thread, as the
    manager's eval thread does, no llama.cpp): for the cache cells of the timing model."""
    if not lab.disk or "cache" not in lab.configs:
        return
    cells = []
    for ratio in lab.ratios:
        limit = lab.limits[ratio]
        b = cfg.cell_budget(lab.budget, limit)
        try:
            float(b)
        except ValueError:
            log(f"inline walk: budget '{b}' is not MiB (--budget auto); no {name}")
            lab.root.limit(None)
            if os.path.isfile(os.path.join(d, name)):
                os.remove(os.path.join(d, name))
            return
        cells.append((limit, ["--inline-walk", "--walk-budget-mib", b, "--walk-tokens", WALK_TOKENS],
                      f"inline walk: limit {limit - WALK_OVERHEAD_MIB} MiB (r{ratio} less {WALK_OVERHEAD_MIB}), "
                      f"budget {b} MiB, page cache dropped"))
    rows = _walks(lab, d, name, "inline", cells)
    for f in rows or []:
        say("memlab: inline walk, limit %s MiB, budget %s MiB: %.3f ms off the CPU and %.3f in the kernel per MiB "
            "read, %.1f pins and %.1f MiB read a token" % (f[0], f[1], stats.value(f[8]), stats.value(f[9]),
                                                           stats.value(f[3]), stats.value(f[4])))
