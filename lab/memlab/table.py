"""The lab's table: one row a cell (ratio x configuration) of a run directory, as text
(table.txt) and as CSV (--csv, with --csv-extended's columns): docs/memlab.md, "The
columns"."""

import os
from dataclasses import dataclass

from . import rundir, stats

CSV_COLUMNS = ("ratio", "config", "tok_s", "p50_ms", "p90_ms", "read_mib_per_token", "majflt_per_token", "hit_pct",
               "pinned_mib", "logits_identical", "roofline_ms", "bw_fraction")
CSV_EXTENDED = ("engine_majflt_per_token", "status", "x_roofline", "cpu_use", "read_wait_ms_per_token",
                "read_waits_per_token")
TEXT_COLUMNS = ("ratio", "limit", "config", "tok/s", "p50_ms", "p90_ms", "MiB_rd/tok", "majflt/tok", "eng_mf/tok",
                "hit%", "pin_MiB", "peakMiB", "logits", "roof_ms", "x_roof", "bw_frac", "cpu_use", "wait_ms")
# printf widths of the text columns (negative: left-aligned).
TEXT_WIDTHS = (-6, -6, -12, 9, 8, 8, 10, 10, 10, 6, 8, 7, 8, 9, 7, 7, 7, 8)


def text_row(fields, widths=TEXT_WIDTHS):
    return " ".join(f"{f:<{-w}}" if w < 0 else f"{f:>{w}}" for f, w in zip(fields, widths))


@dataclass
class TableSpec:
    """What a table is of: the run's settings, named in its title."""
    preset: str
    model: str  # the model file's name
    size_mib: int
    tokens: int
    decode: int
    threads: str
    openmp: str  # the OpenMP wait every run got (runner.openmp_environment)
    load: int  # busy processes beside every run (--background-load)
    machine: str
    ratios: list
    configs: list
    limits: dict  # ratio -> limit MiB
    unlimited: set  # configurations run without a limit
    slice_bytes: int
    cores: int
    extended: bool = False
    warm_from: int = 1  # the figures over decode tokens numbered this and later (--warm-from)


def make_table(d, spec, csv_path="", title_suffix=""):
    """d/table.txt (and `csv_path`) from the cells of run directory `d`; returns the text."""
    reference = ""
    for ratio in spec.ratios:
        for config in spec.configs:
            name = rundir.cell(ratio, config)
            if not os.path.isfile(os.path.join(d, f"{name}.csv")):
                continue
            reference = rundir.digest(os.path.join(d, f"{name}.log"))
            if reference:
                break
        if reference:
            break
    load = f", {spec.load} busy processes beside every run" if spec.load else ""
    warm = (f"; figures over decode tokens {spec.warm_from}-{spec.decode} of every run (hit% the run's own)"
            if spec.warm_from > 1 else "")
    # The configuration column as wide as its longest name (all-oracle-pool is 15).
    config_width = max([12] + [len(c) for c in spec.configs])
    widths = TEXT_WIDTHS[:2] + (-config_width,) + TEXT_WIDTHS[3:]
    lines = [f"memlab ({spec.preset}): {spec.model}, {spec.size_mib} MiB; {spec.tokens} prompt + {spec.decode} decode "
             f"tokens, {spec.threads} threads ({spec.openmp}){load}; {spec.machine}{title_suffix}{warm}",
             text_row(TEXT_COLUMNS, widths)]
    columns = CSV_COLUMNS + (CSV_EXTENDED if spec.extended else ())
    csv_lines = [",".join(columns)]
    # The roofline of each row: max(its MiB read a token / the expert-shaped bandwidth, the
    # resident ms a token), both measured in this run.
    bw = stats.best_bandwidth(rundir.expert_curves(d))
    resident = ""
    for ratio in spec.ratios:
        path = os.path.join(d, f"{rundir.cell(ratio, 'resident')}.csv")
        if os.path.isfile(path):
            resident = stats.resident_ms(stats.summarize_tokens(path, spec.warm_from))
            break
    if bw or resident:
        lines.append(f"roofline: the disk's best cold bandwidth at the expert slice ({spec.slice_bytes // 1024} KiB) "
                     f"{bw or 'unmeasured'} MiB/s; resident {resident or 'unmeasured'} ms a token")
    for ratio in spec.ratios:
        limit = spec.limits[ratio]
        for config in spec.configs:
            name = rundir.cell(ratio, config)
            status = rundir.read_text(os.path.join(d, f"{name}.status"))
            if not status:
                continue  # not run (skipped)
            lim = "none" if config in spec.unlimited else str(limit)
            per_token = os.path.join(d, f"{name}.csv")
            if status != "ok" or not os.path.isfile(per_token):
                # A run that did not finish: a row saying so, no figures.
                lines.append(f"{ratio:<6} {lim:<6} {config:<{config_width}} {'-':>9}   ({status}: see {name}.log)")
                csv_lines.append(f"{ratio},{config},,,,,,,,no,," + (f",,{status},,,," if spec.extended else ""))
                continue
            s = stats.summarize_tokens(per_token, spec.warm_from)
            hit = rundir.read_text(os.path.join(d, f"{name}.hit")) or s.hit_pct  # pooled rounds: their mean
            peak = rundir.read_text(os.path.join(d, f"{name}.peak"), "-")
            dg = rundir.digest(os.path.join(d, f"{name}.log"))
            same = "yes" if dg and dg == reference else "no"
            roof, xroof, bwf, use = stats.roofline(s.tok_s, s.read_mib, bw, resident, s.proc_cpu_ms, spec.cores)
            lines.append(text_row((ratio, lim, config, s.tok_s, s.p50_ms, s.p90_ms, s.read_mib, s.majflt,
                                   s.engine_majflt, hit, s.pinned_mib, peak, same, roof, xroof, bwf, use,
                                   s.read_wait_ms), widths))
            blank = lambda x: "" if x == "-" else x  # noqa: E731
            row = [ratio, config, s.tok_s, s.p50_ms, s.p90_ms, s.read_mib, s.majflt, blank(hit), s.pinned_mib, same,
                   blank(roof), blank(bwf)]
            if spec.extended:
                row += [s.engine_majflt, "ok", blank(xroof), blank(use), s.read_wait_ms, s.read_waits]
            csv_lines.append(",".join(row))
    text = "\n".join(lines) + "\n"
    rundir.write(os.path.join(d, "table.txt"), text)
    if csv_path:
        rundir.write(csv_path, "\n".join(csv_lines) + "\n")
    return text
