"""A run directory (<lab>/runs/<time>-<preset>/, docs/memlab.md): each cell's files
(NAME.csv, .log, .peak, .status, .metrics.csv, .route.csv, and .hit when pooled), read
back; the runs without a limit under every ratio's name; and the rounds pooled into
the run's own files."""

import glob
import os
import re
import shutil

from . import stats

# The files of one cell (NAME.<ext>).
CELL_FILES = ("csv", "log", "peak", "status", "metrics.csv", "route.csv")

_DIGEST = re.compile(r"^logits: fnv1a64 ([0-9a-f]*) over")
_STALE_GATE = re.compile(r"^moe-predict: stale-gate ([0-9.]*)% of routed slots")


def read_text(path, missing=""):
    """A small file's text without its trailing newlines; `missing` if unreadable."""
    try:
        with open(path, errors="replace") as f:
            return f.read().rstrip("\n")
    except OSError:
        return missing


def first_match(path, pattern):
    """The first group of the first line of `path` that `pattern` matches; '' if none."""
    try:
        with open(path, errors="replace") as f:
            for line in f:
                m = pattern.match(line)
                if m:
                    return m.group(1)
    except OSError:
        pass
    return ""


def digest(log):
    """The digest of a run's decode logits ('logits: fnv1a64 <hex> over N tokens'); ''."""
    return first_match(log, _DIGEST)


def stale_gate_pct(log):
    """The stale-gate's slot accuracy a run with the observer printed, percent; ''."""
    return first_match(log, _STALE_GATE)


def cell(ratio, config):
    return f"r{ratio}-{config}"


def copy_unlimited(d, ratios, unlimited, only_missing=False):
    """The runs without a limit (made once, as NAME.*) under every ratio's name
    (rRATIO-NAME.*), so that their rows repeat under each ratio."""
    for ratio in ratios:
        for config in unlimited:
            for ext in CELL_FILES:
                src, dst = os.path.join(d, f"{config}.{ext}"), os.path.join(d, f"{cell(ratio, config)}.{ext}")
                if os.path.isfile(src) and not (only_missing and os.path.isfile(dst)):
                    shutil.copyfile(src, dst)


def rounds_of(d):
    """The round directories of a run made in rounds (round-1, round-2, ...), in order;
    [d] for a run made in one."""
    if not os.path.isdir(os.path.join(d, "round-1")):
        return [d]
    out, k = [], 1
    while os.path.isdir(os.path.join(d, f"round-{k}")):
        out.append(os.path.join(d, f"round-{k}"))
        k += 1
    return out


def expert_curves(d):
    """The expert-shaped disk curves of a run and of its rounds."""
    paths = [os.path.join(d, "disk-expert.csv")] + sorted(glob.glob(os.path.join(d, "round-*", "disk-expert.csv")))
    return [p for p in paths if os.path.isfile(p)]


def pool_rounds(out, n_rounds, ratios, configs):
    """Each cell's files in `out` from its rounds': the per-token CSVs one after another
    (tok/s over every round's tokens), finished only if every round finished it, the
    largest peak, the mean of the rounds' hit rates (NAME.hit), and the logits' digest
    only if every round's was the same (else the table says no)."""
    rounds = [os.path.join(out, f"round-{k}") for k in range(1, n_rounds + 1)]
    for ratio in ratios:
        for config in configs:
            name = cell(ratio, config)
            if not os.path.isfile(os.path.join(rounds[0], f"{name}.status")):
                continue
            status, peak, first, same = "ok", 0, "", True
            lines, header = [], None
            summaries = []
            for k, rdir in enumerate(rounds, start=1):
                s = read_text(os.path.join(rdir, f"{name}.status"), "missing")
                if status == "ok" and s != "ok":
                    status = s  # the first round that did not finish
                p = read_text(os.path.join(rdir, f"{name}.peak"), "0")
                if re.fullmatch(r"[0-9]+", p) and int(p) > peak:
                    peak = int(p)
                d = digest(os.path.join(rdir, f"{name}.log"))
                if k == 1:
                    first = d
                if d == "" or d != first:
                    same = False
                per_token = os.path.join(rdir, f"{name}.csv")
                if os.path.isfile(per_token):
                    with open(per_token) as f:
                        text = f.read().splitlines()
                    if text:
                        header = header or text[0]
                        lines.extend(text[1:])
                    summaries.append(stats.summarize_tokens(per_token))
            write(os.path.join(out, f"{name}.status"), status + "\n")
            write(os.path.join(out, f"{name}.peak"), f"{peak}\n")
            hit = stats.mean_hit(summaries)
            write(os.path.join(out, f"{name}.hit"), hit + "\n" if hit else "")
            log = f"pooled over {n_rounds} rounds: round-*/{name}.log\n"
            if same:
                with open(os.path.join(rounds[0], f"{name}.log"), errors="replace") as f:
                    log += next((line for line in f if line.startswith("logits: fnv1a64 ")), "")
            write(os.path.join(out, f"{name}.log"), log)
            pooled = os.path.join(out, f"{name}.csv")
            if status == "ok" and header is not None:
                write(pooled, "\n".join([header] + lines) + "\n")


def write(path, text):
    """Replaces `path` with `text` whole (written beside it, then renamed)."""
    part = path + ".part"
    with open(part, "w") as f:
        f.write(text)
    os.replace(part, path)
