#!/usr/bin/env bash
# scripts/memlab-predict.sh — the timing model against the memory lab.
#
#   scripts/memlab-predict.sh RUNS_DIR [--fit CONFIG@RATIO] [--tool PATH] [--format table|csv]
#                             [--overhead-mib N] [--readaround-mib N] [--trace FILE]
#
# RUNS_DIR is one run of scripts/memlab.sh (~/.cache/moe-residency/memlab/runs/<time>-<preset>)
# made with a moe-llama-probe that writes --metrics-csv and --trace-out. A run made with
# --rounds N is its N rounds pooled (as --pool would pool them), its disk curve the mean of the
# rounds' and of the one measured after the last round. It calibrates the
# timing model on ONE configuration at ONE ratio (--fit, default exact@2.5: all its decode
# tokens), then predicts every other configuration x ratio from what is known before that run:
# the route trace (of the fit run, or of the observer run at the fit ratio: routing is the same
# in every lab run), the memory limit, the budget, the configuration's levers, the stale-gate
# accuracy an observer run measured, and the disk's lanes curve that memlab measured
# (disk-lanes.csv). The other runs' metrics are read only for the "measured" column.
# The mapping of each configuration is in docs/lab-predict.md.
#
#   --fit C@R          the calibration cell (default exact@2.5)
#   --tool PATH        moe-residency (default: build/llama-cpp/bin, build/release/bin, build/debug/bin)
#   --format F         table (default) or csv
#   --overhead-mib N   memory of the cgroup besides the model's pages (default 64; assumed)
#   --readaround-mib N a fault's read-around window (default: read_ahead_kb x 2 of the model's disk / 1024)
#   --trace FILE       the route trace to use
#   --budget B         the cache budget of the runs: MiB or a share like 25% (default: 25% for quick
#                      and smoke runs, else 25% as well; the model does not use it, see the docs)
#   --free LIST        the parameters fitted (default compute,bandwidth,kernel; kernel only when
#                      the metrics record sys_ms; see lab-predict --help)
#   --fit-run DIR[,DIR...]
#                      calibrate on the --fit cell of OTHER runs of the same preset (their metrics and
#                      manager runs, the mean of their disk curves; the first one's route trace) and
#                      predict RUNS_DIR's cells (with --pool's): a prediction across runs, as a user
#                      would make one for a run not yet made
#   --sweep            calibrate on every finished cell in turn (the --fit cell's trace is used
#                      for all) and print, per calibration cell, how many of the other cells are
#                      predicted within 15% and their median |error|: which cell to calibrate on
#   --repeats LIST     comma list of other runs of the same preset (the same cells measured again):
#                      after the prediction, a table of every cell's measured tok/s in RUNS_DIR and
#                      in each of them (1000 x tokens / sum of wall_ms of its metrics), their mean
#                      and spread ((max - min) / mean), and the prediction's error against the mean;
#                      then how many cells are within 15% of their mean, and how many within their
#                      own spread: a prediction cannot be judged closer than the lab repeats
#   --pool LIST        comma list of other runs of the same preset, pooled with RUNS_DIR: every cell's
#                      metrics are all the runs' (lab-predict --cells FILE;FILE;...), so the calibration
#                      cell is fitted on its tokens of every run and each other cell's measured tok/s is
#                      over all its runs (1000 x tokens / sum of wall_ms); the disk curve is the mean of
#                      the runs' curves (disk-lanes.csv, measured before each run) and the manager's cost
#                      the mean of their resident-all/manager-* runs (unless --fit-run gives the
#                      calibration runs). One configuration at one ratio still calibrates; what
#                      pooling removes is a single run's drift
#   --fault-bandwidth-scale X
#                      untie the fault-driven cells' bandwidth scale β_f from the manager's β: a
#                      manager's calibration cell fits β and the fault cells get X (1: the disk
#                      curve's top as measured); a fault calibration cell fits β_f and the
#                      manager's cells get β = 1. Default: tied, one β fitted on the --fit cell
#   --fault-walk LIST  comma list of fault-walk.csv files (moe-disk-lanes --fault-walk in each ratio's
#                      limit) for the fault cells' reads, their rows averaged per shape; default: the
#                      fault-walk.csv of every calibration run that has one (memlab measures it before
#                      each round) and, for runs in rounds, their fault-walk-after.csv (after the last)
#   --no-fault-walk    leave the fault walk out: the fault cells' reads at the curve's top x β_f and κ
#   --inline-walk LIST comma list of inline-walk.csv files (moe-disk-lanes --inline-walk in each ratio's
#                      limit at its budget) for the cache cells' inline reads and pins, the median of
#                      each limit's rows; default, as for the fault walk: every calibration run's
#                      inline-walk.csv and, for runs in rounds, inline-walk-after.csv
#   --no-inline-walk   leave it out: the cache cells' reads on the curve x β, hidden behind κ and the
#                      pins' cost (ψ = 1)
#   --no-manager-cost  leave the manager's own cost out. By default, when the calibration run has
#                      memlab's resident-all, manager-exact and manager-cache runs (no limit, every
#                      expert resident), lab-predict gets them (--manager-runs): the manager's cost
#                      per requested expert and per pin, measured before any limited cell, as the
#                      disk curve is
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
die() { echo "memlab-predict: $*" >&2; exit 2; }

dir="" fit="exact@2.5" tool="" format=table overhead=64 readaround="" trace="" budget="25%" free="" sweep=0 fit_run="" repeats=""
manager=1 fault_scale="" pool="" walk="" walk_on=1 iwalk="" inline_on=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --fit) fit="${2:?--fit needs CONFIG@RATIO}"; shift ;;
    --tool) tool="${2:?--tool needs a path}"; shift ;;
    --format) format="${2:?--format needs table or csv}"; shift ;;
    --overhead-mib) overhead="${2:?--overhead-mib needs MiB}"; shift ;;
    --readaround-mib) readaround="${2:?--readaround-mib needs MiB}"; shift ;;
    --trace) trace="${2:?--trace needs a file}"; shift ;;
    --budget) budget="${2:?--budget needs MiB or a share}"; shift ;;
    --free) free="${2:?--free needs a list}"; shift ;;
    --sweep) sweep=1 ;;
    --fit-run) fit_run="${2:?--fit-run needs a run directory}"; shift ;;
    --repeats) repeats="${2:?--repeats needs a comma list of run directories}"; shift ;;
    --pool) pool="${2:?--pool needs a comma list of run directories}"; shift ;;
    --no-manager-cost) manager=0 ;;
    --fault-walk) walk="${2:?--fault-walk needs a comma list of files}"; shift ;;
    --no-fault-walk) walk_on=0 ;;
    --inline-walk) iwalk="${2:?--inline-walk needs a comma list of files}"; shift ;;
    --no-inline-walk) inline_on=0 ;;
    --fault-bandwidth-scale) fault_scale="${2:?--fault-bandwidth-scale needs a factor}"; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown argument '$1' (see --help)" ;;
    *) [[ -z "$dir" ]] || die "one RUNS_DIR only ('$dir', '$1')"; dir="$1" ;;
  esac
  shift
done
[[ -n "$dir" && -d "$dir" ]] || die "RUNS_DIR: '${dir}' is not a directory (a run of scripts/memlab.sh)"
# A run made with memlab --rounds N is its rounds pooled: round-1, round-2, ... each a whole run.
# rounds_of DIR: those directories in order, or DIR itself; after_curves collects the curve
# measured after the last round (disk-lanes-after.csv), which with the rounds' own curves
# centres the mean curve on the middle of the run, as the rounds centre every cell.
rounds_of() {
  local k=1
  if [[ ! -d "$1/round-1" ]]; then echo "$1"; return 0; fi
  while [[ -d "$1/round-$k" ]]; do echo "$1/round-$k"; k=$((k + 1)); done
}
after_curves() { local d; for d in "$@"; do [[ -d "$d/round-1" && -f "$d/disk-lanes-after.csv" ]] && echo "$d/disk-lanes-after.csv"; done; return 0; }
after_walks() {  # NAME DIR...: DIR/NAME-after.csv of each DIR made in rounds (NAME: fault-walk, inline-walk)
  local n="$1" d; shift
  for d in "$@"; do [[ -d "$d/round-1" && -f "$d/$n-after.csv" ]] && echo "$d/$n-after.csv"; done; return 0
}
reps=()
[[ -z "$repeats" ]] || IFS=, read -r -a reps <<< "$repeats"
for d in "${reps[@]}"; do
  [[ -d "$d" ]] || die "--repeats: '$d' is not a directory (a run of scripts/memlab.sh)"
  [[ ! -d "$d/round-1" ]] || die "--repeats: '$d' was made in rounds; give its round-K directories"
done
[[ -z "$repeats" || $sweep == 0 ]] || die "--repeats and --sweep together are not supported; give one"
[[ ! -d "$dir/round-1" || -z "$repeats" ]] || die "--repeats: RUNS_DIR '$dir' was made in rounds; give its round-1 directory and the others to --repeats"
pools=()
[[ -z "$pool" ]] || IFS=, read -r -a pools <<< "$pool"
for d in "${pools[@]}"; do [[ -d "$d" ]] || die "--pool: '$d' is not a directory (a run of scripts/memlab.sh)"; done
mapfile -t after_pred < <(after_curves "$dir" "${pools[@]}")
mapfile -t after_walk_pred < <(after_walks fault-walk "$dir" "${pools[@]}")
mapfile -t after_inline_pred < <(after_walks inline-walk "$dir" "${pools[@]}")
mapfile -t expanded < <(for d in "$dir" "${pools[@]}"; do rounds_of "$d"; done)
[[ "${expanded[0]}" == "$dir" ]] || echo "memlab-predict: $dir was made in rounds: pooling ${expanded[*]}" >&2
run_dir="$dir"
dir="${expanded[0]}"
pools=("${expanded[@]:1}")
[[ -z "$pool" || -z "$repeats" ]] || die "--pool with --repeats is not supported: --pool already measures every cell over all the runs"
if [[ -z "$tool" ]]; then
  for t in "$repo"/build/{llama-cpp,release,debug}/bin/moe-residency; do [[ -x "$t" ]] && { tool="$t"; break; }; done
fi
[[ -x "$tool" ]] || die "no moe-residency tool; build one or give --tool PATH"

# The model (named in table.txt), its size and the limits memlab set: round(size / ratio) MiB.
name="$(sed -n '1s/^memlab ([a-z]*): \([^,]*\),.*/\1/p' "$dir/table.txt" 2>/dev/null)"
[[ -n "$name" ]] || die "$dir/table.txt: no model name on its first line (did memlab finish?)"
run_top="$run_dir"
[[ "$(basename "$run_top")" != round-[0-9]* ]] || run_top="$(dirname "$run_top")"  # a round given itself
lab="$(dirname "$(dirname "$run_top")")"  # <lab>/runs/<time>-<preset>
model="$lab/$name"
[[ -f "$model" ]] || die "the lab's model $model is missing"
size=$(stat -c %s "$model")

# The calibration runs: RUNS_DIR and the --pool runs, or --fit-run's list. The first of them
# (src) gives the route trace and the stale-gate accuracy (routing is the same in every run);
# the disk curve is the mean of theirs, the manager's cost and the calibration cell are
# measured over all of them. The predicted cells are measured over RUNS_DIR and the --pool runs.
preds=("$dir" "${pools[@]}")
fits=("${preds[@]}")
after=("${after_pred[@]}")
after_walk=("${after_walk_pred[@]}")
after_inline=("${after_inline_pred[@]}")
if [[ -n "$fit_run" ]]; then
  [[ $sweep == 0 ]] || die "--fit-run and --sweep together are not supported; give one"
  IFS=, read -r -a fits <<< "$fit_run"
  for d in "${fits[@]}"; do [[ -d "$d" ]] || die "--fit-run: '$d' is not a directory (a run of scripts/memlab.sh)"; done
  mapfile -t after < <(after_curves "${fits[@]}")
  mapfile -t after_walk < <(after_walks fault-walk "${fits[@]}")
  mapfile -t after_inline < <(after_walks inline-walk "${fits[@]}")
  mapfile -t fits < <(for d in "${fits[@]}"; do rounds_of "$d"; done)
fi
src="${fits[0]}"

# The storage model: the lanes curve memlab measured at the start of each calibration run,
# their mean reader count by reader count (one run: its curve).
curves=()
for d in "${fits[@]}"; do
  [[ -f "$d/disk-lanes.csv" ]] || die "$d/disk-lanes.csv missing (memlab ran with --no-disk?)"
  curves+=("$d/disk-lanes.csv")
done
curves+=("${after[@]}")
curve="$(awk -F, 'FNR > 1 && $1 != "" { if (!($1 in n)) o[k++] = $1; s[$1] += $5; n[$1]++ }
                  END { for (i = 0; i < k; ++i) printf "%s%s:%.1f", (i ? "," : ""), o[i], s[o[i]] / n[o[i]] }' "${curves[@]}")"
# join NAME RUN...: the metrics file NAME of every RUN that finished it, ';'-separated in order;
# empty when none did.
join() {
  local name="$1" out="" d
  shift
  for d in "$@"; do
    [[ "$(cat "$d/$name.status" 2>/dev/null)" == ok && -f "$d/$name.metrics.csv" ]] || continue
    out+="${out:+;}$d/$name.metrics.csv"
  done
  echo "$out"
}

if [[ -z "$readaround" ]]; then
  dev="$(df --output=source "$model" | tail -1)"; dev="${dev#/dev/}"; base="$dev"
  while [[ -n "$base" && ! -e "/sys/block/$base" ]]; do base="${base%?}"; done
  ra=$(cat "/sys/block/$base/queue/read_ahead_kb" 2>/dev/null || echo 128)
  readaround=$(awk -v k="$ra" 'BEGIN{printf "%g", 2 * k / 1024}')  # llama.cpp's FADV_SEQUENTIAL doubles it
fi

# The manager's own cost (runs without a limit, every expert resident), from the calibration run.
mgr=()
if [[ $manager == 1 ]]; then
  ok_run() { [[ "$(cat "$src/$1.status" 2>/dev/null)" == ok && -f "$src/$1.metrics.csv" ]]; }
  if ok_run resident-all && ok_run manager-exact && ok_run manager-cache; then
    mb="$(sed -n 's/^residency: .*cache [a-z]* \([0-9.]*\) MiB.*/\1/p' "$src/manager-cache.log" | head -1)"
    [[ -n "$mb" ]] || die "$src/manager-cache.log: no 'cache <policy> N MiB' in its residency line (did it act?)"
    mgr=(--manager-runs "$(join resident-all "${fits[@]}"),$(join manager-exact "${fits[@]}"),$(join manager-cache "${fits[@]}")"
         --manager-budget "$mb")
  fi
fi

# The fault path measured before the runs (memlab's fault-walk.csv of each calibration run,
# as the disk curve is), or --fault-walk's files.
walks=() fw=()
if [[ $walk_on == 1 ]]; then
  if [[ -n "$walk" ]]; then
    IFS=, read -r -a walks <<< "$walk"
    for f in "${walks[@]}"; do [[ -f "$f" ]] || die "--fault-walk: '$f' is not a file (memlab's fault-walk.csv)"; done
  else
    for d in "${fits[@]}"; do [[ -f "$d/fault-walk.csv" ]] && walks+=("$d/fault-walk.csv"); done
    walks+=("${after_walk[@]}")  # a run in rounds: its walk after the last round too, as its curve
  fi
fi
[[ ${#walks[@]} -eq 0 ]] || fw=(--fault-walk "$(IFS=';'; echo "${walks[*]}")")
# The same for cache's inline path (memlab's inline-walk.csv), or --inline-walk's files.
iwalks=()
if [[ $inline_on == 1 ]]; then
  if [[ -n "$iwalk" ]]; then
    IFS=, read -r -a iwalks <<< "$iwalk"
    for f in "${iwalks[@]}"; do [[ -f "$f" ]] || die "--inline-walk: '$f' is not a file (memlab's inline-walk.csv)"; done
  else
    for d in "${fits[@]}"; do [[ -f "$d/inline-walk.csv" ]] && iwalks+=("$d/inline-walk.csv"); done
    iwalks+=("${after_inline[@]}")
  fi
fi
[[ ${#iwalks[@]} -eq 0 ]] || fw+=(--inline-walk "$(IFS=';'; echo "${iwalks[*]}")")

fit_ratio="${fit#*@}"
if [[ -z "$trace" ]]; then
  for t in "$src/r${fit_ratio}-${fit%@*}.route.csv" "$src/r${fit_ratio}-observer.route.csv" "$src"/r*-observer.route.csv; do
    [[ -f "$t" ]] && { trace="$t"; break; }
  done
fi
[[ -n "$trace" && -f "$trace" ]] || die "no route trace in $dir (memlab with a probe that has --trace-out)"

cells="$(mktemp)"
trap 'rm -f "$cells"' EXIT
echo "ratio,config,limit_mib,budget_mib,stale_gate_pct,metrics" > "$cells"
ratios="$(ls "$dir" | sed -n 's/^r\([0-9.]*\)-.*\.status$/\1/p' | sort -u)"
for r in $ratios; do
  limit=$(awk -v s="$size" -v r="$r" 'BEGIN{printf "%.0f", s / r / 1048576}')
  b="$budget"; [[ $b == *% ]] && b=$(awk -v l="$limit" -v p="${b%\%}" 'BEGIN{printf "%.0f", l * p / 100}')
  acc="$(sed -n 's/^moe-predict: stale-gate \([0-9.]*\)% of routed slots.*/\1/p' "$src/r$r-observer.log" 2>/dev/null | head -1)"
  [[ -n "$acc" ]] || acc=100
  for c in mmap observer dense exact predicted cache all degraded resident; do
    [[ -f "$dir/r$r-$c.status" ]] || continue
    m="$(join "r$r-$c" "${preds[@]}")"
    if [[ -n "$fit_run" && "$c@$r" == "$fit" ]]; then  # the calibration cell is the other runs'
      m="$(join "r$r-$c" "${fits[@]}")"
      [[ -n "$m" ]] || die "--fit-run: no finished $fit in $fit_run"
    fi
    lim=$limit
    if [[ $c == resident ]]; then  # one run without a limit, listed once
      lim=0
      grep -q ',resident,' "$cells" && continue
    fi
    echo "$r,$c,$lim,$b,$acc,$m" >> "$cells"
  done
done
if [[ $sweep == 1 ]]; then
  echo "fit_cell,within_15,other_cells,median_abs_err_pct"
  tail -n +2 "$cells" | while IFS=, read -r r c _ _ _ m; do
    [[ -n "$m" ]] || continue
    f="$c@$r"
    errs="$("$tool" lab-predict --trace "$trace" --curve "$curve" --cells "$cells" --fit "$f" \
      --overhead-mib "$overhead" --readaround-mib "$readaround" --format csv ${free:+--free "$free"} ${fault_scale:+--fault-bandwidth-scale "$fault_scale"} "${mgr[@]}" "${fw[@]}" |
      awk -F, 'NR > 1 && $10 == "no" && $7 != "-" { print ($6 < 0 ? -$6 : $6) }' | sort -g)"
    n=$(grep -c . <<< "$errs" || true)
    y=$(awk '$1 <= 15' <<< "$errs" | grep -c . || true)
    med=$(awk '{ e[NR] = $1 } END { if (NR) printf "%.1f", NR % 2 ? e[(NR + 1) / 2] : (e[NR / 2] + e[NR / 2 + 1]) / 2 }' <<< "$errs")
    echo "$f,$y,$n,$med"
  done
  exit 0
fi
echo "memlab-predict: $tool lab-predict --trace $trace --curve $curve --fit $fit --overhead-mib $overhead --readaround-mib $readaround ${mgr[*]} ${fw[*]}${fit_run:+ (calibrated on $fit_run, predicting $dir)}${pool:+ (pooled with $pool: every cell over all the runs)}" >&2
predict() {
  "$tool" lab-predict --trace "$trace" --curve "$curve" --cells "$cells" --fit "$fit" \
    --overhead-mib "$overhead" --readaround-mib "$readaround" --format "$1" ${free:+--free "$free"} ${fault_scale:+--fault-bandwidth-scale "$fault_scale"} "${mgr[@]}" "${fw[@]}"
}
if [[ -z "$repeats" ]]; then
  predict "$format"
  exit 0
fi
predicted="$(predict csv)"
if [[ $format == csv ]]; then echo "$predicted"; else predict table; fi

# --repeats: every cell's tok/s in RUNS_DIR and in each repeat, against the prediction.
tok_s() {  # tok/s of one metrics CSV as lab-predict counts it (1000 x rows / sum of wall_ms); empty if none
  [[ -f "$1" ]] || return 0
  awk -F, 'NR == 1 { for (i = 1; i <= NF; ++i) if ($i == "wall_ms") w = i; next }
           w && $w != "" { s += $w; ++n } END { if (n && s > 0) printf "%.3f", 1000 * n / s }' "$1"
}
echo
if [[ $format == csv ]]; then  # a second CSV table after the blank line; `measured` is /-separated
  echo "ratio,config,measured_tok_s,mean_tok_s,spread_pct,predicted_tok_s,err_pct,within_15,within_spread"
else
  echo "measured again (--repeats): tok/s in RUNS_DIR first, then each repeat; error against the mean"
  printf '%-6s %-10s %-32s %9s %7s %9s %8s %5s %7s\n' ratio config measured mean spread% pred_tok/s err% '<=15' '<=spr'
fi
n=0 in15=0 inspread=0
while IFS=, read -r r c _ _ pred _ _ _ _ isfit; do
  [[ "$r" == ratio || "$isfit" == yes ]] && continue
  vals=()
  for d in "$dir" "${reps[@]}"; do
    m="$d/r$r-$c.metrics.csv"
    [[ "$(cat "$d/r$r-$c.status" 2>/dev/null)" == ok ]] || m=""
    v="$(tok_s "$m")"
    [[ -n "$v" ]] && vals+=("$v")
  done
  ((${#vals[@]} >= 2)) || continue  # measured once or not at all: nothing to repeat
  line="$(printf '%s\n' "${vals[@]}" | awk -v p="$pred" '
    { v[NR] = $1; s += $1; if (NR == 1 || $1 < lo) lo = $1; if (NR == 1 || $1 > hi) hi = $1 }
    END { m = s / NR; sp = 100 * (hi - lo) / m; e = 100 * (p - m) / m; ae = e < 0 ? -e : e
          list = v[1]; for (i = 2; i <= NR; ++i) list = list "/" v[i]
          printf "%s %.3f %.1f %.1f %s %s", list, m, sp, e, (ae <= 15 ? "yes" : "no"), (ae <= sp ? "yes" : "no") }')"
  read -r list mean spread err w15 wsp <<< "$line"
  if [[ $format == csv ]]; then
    echo "$r,$c,$list,$mean,$spread,$pred,$err,$w15,$wsp"
  else
    printf '%-6s %-10s %-32s %9s %7s %9s %+8.1f %5s %7s\n' "$r" "$c" "$list" "$mean" "$spread" "$pred" "$err" "$w15" "$wsp"
  fi
  ((n += 1)); [[ $w15 == yes ]] && ((in15 += 1)); [[ $wsp == yes ]] && ((inspread += 1))
done <<< "$predicted"
[[ $format == csv ]] ||
  echo "of $n cells measured more than once (the calibration cell left out): $in15 within 15% of their mean, $inspread within their own spread"

