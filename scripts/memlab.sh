#!/usr/bin/env bash
# The memory lab: stock llama.cpp decoding a Mixture-of-Experts GGUF larger
# than its memory limit, through plain mmap and with moe_residency's parts
# switched on one at a time, side by side (docs/memlab.md).
#
#   sudo scripts/memlab.sh                    the full lab (tens of minutes)
#   sudo scripts/memlab.sh --quick --csv FILE a smaller model, fewer tokens (minutes)
#
# Options:
#   --shape NAME       a real model's shape at scale: qwen3-30b-a3b (a 16.0 GiB q4_K model;
#                      ratios 2.0 (an 8 GiB limit), 1.5 and 3; 8 prompt + 16 decode tokens)
#                      or qwen3-30b-a3b-half (its first 24 layers, about half the file)
#   --quick            the quick preset (a ~1.4 GiB model, 8 prompt + 16 decode tokens)
#   --smoke            the CTest preset (a ~1 GiB model, ratio 2, mmap and all only)
#   --csv FILE         also write the table as CSV (ratio,config,tok_s,p50_ms,p90_ms,
#                      read_mib_per_token,majflt_per_token,hit_pct,pinned_mib,logits_identical,
#                      roofline_ms,bw_fraction: docs/memlab.md, "The columns")
#   --configs LIST     comma list of mmap,mmap-128k,no-mmap,mlock,observer,dense,exact,
#                      predicted,cache,all,all-adaptive,all-serial,all-pool,cache-pool,degraded,degraded-pool,
#                      resident,resident-all,
#                      manager-exact,manager-cache
#   --ratios LIST      model size / memory limit ratios (default 1.5,2.5)
#   --probe PATH       use this moe-llama-probe (and moe-disk-lanes next to it); no build
#   --threads N        llama.cpp threads (default: every core, nproc); every run gets
#                      OMP_WAIT_POLICY=PASSIVE unless the environment sets it
#   --budget MIB|auto|P%  the pinned expert cache's budget: MiB, auto (the manager
#                      sizes it from the cgroup limit), or a share of the limit
#                      (default: auto; quick and smoke: 25%, their limits being
#                      too small for the auto margin)
#   --run-timeout S    give up on one run after S seconds (default 1800; quick 600)
#   --decode N         decode N tokens instead of the preset's (full 64, quick 16,
#                      smoke 12): longer runs, to see whether a cell repeats better
#   --csv-extended     append engine_majflt_per_token (major faults of llama.cpp's own
#                      threads: getrusage also counts the manager's lanes populating
#                      pages on purpose), status, x_roofline, cpu_use (the process's CPU
#                      time / cores x wall), read_wait_ms_per_token and read_waits_per_token
#                      (the eval thread waiting for the manager's reads) to every CSV row
#   --table-only DIR   no runs: the table (and --csv) again from the run directory DIR
#                      of an earlier invocation with the same preset, ratios and configs
#   --no-plot          no gnuplot
#   --no-disk          skip the disk bandwidth measurements (before the runs, and
#                      again after them: disk-lanes-after.csv) and the walks
#                      (fault-walk.csv and inline-walk.csv, before each round)
#   --rounds N         run every cell N times, in rounds (round-1 ... round-N, each a whole run
#                      with its own disk curve), every even round in the reverse order, so that
#                      the machine's drift over the run falls on every cell alike; the table is
#                      pooled over the rounds, and scripts/memlab-predict.sh pools them
#
# What it does: builds the tools once (build/memlab, Release, against the
# llama.cpp of scripts/fetch-llama-cpp.sh --install); builds once and caches a
# random-weight qwen3moe GGUF with q4_K experts under
# ${MOE_RESIDENCY_CACHE:-~/.cache/moe-residency}/memlab/; measures the disk's
# cold random-read bandwidth against 1/2/4/8 readers (moe-disk-lanes, O_DIRECT);
# creates one memory cgroup moe-residency-memlab-<pid> (v1 or v2, detected) and
# removes it on exit, error or Ctrl-C; then for every ratio sets the cgroup's
# limit to model size / ratio and runs each configuration in it, the page cache
# dropped before each run (sync; echo 3 > /proc/sys/vm/drop_caches — this
# drops the whole machine's clean page cache). Each run's per-token CSV, log,
# the table and the plots go to .../memlab/runs/<time>-<preset>/.
#
# Configurations (one moe-llama-probe run each, all on the same model file
# through mmap, same prompt, seed and threads, so the logits must be identical):
#   mmap      plain llama.cpp: no observer (--no-observer), the device's read-ahead
#   mmap-128k plain llama.cpp with the device's read_ahead_kb at 128 (the kernel's default)
#             for the run, restored after it
#   no-mmap   plain llama.cpp reading the model into memory (--load-mode no-mmap)
#   mlock     plain llama.cpp, mmap locked whole (--load-mode mlock)
#   observer  the observer and its session only (predictions scored, nothing acted on)
#   dense     + dense weights pinned           (--residency dense)
#   exact     + exact prefetch of the routed experts (--residency exact)
#   predicted + predicted prefetch of the next layers (--residency predicted)
#   cache     + the budgeted, pinned expert cache (--residency cache)
#   all       every part (--residency all)
#   all-adaptive every part, the cache following the adaptive policy (--policy adaptive;
#             the others' cache is lru)
#   all-serial every part, the eval thread waiting for each layer's reads (--serial)
#   all-pool  every part, the cache's experts in the expert pool (--pool: read past the page
#             cache into memory allocated once, mapped over the experts' pages), the next
#             layer's predicted top-8 placed ahead by the lanes (--spec-cap 8)
#   cache-pool the cache alone, in the expert pool (--residency cache --pool)
#   degraded-pool  all-pool with degraded's share of wrong predictions
#   degraded  all, with a seeded share of predicted slots replaced so the
#             stale-gate's slot accuracy falls to ~88.6% (the seed engine's on a
#             real Qwen3-30B; random weights flatter it)
#   resident  plain llama.cpp, no limit, page cache warm: the upper bound
#   resident-all  all parts on (auto budget), no limit, page cache warm: when the
#             model fits, the manager must cost no more than noise against `resident`
#   manager-exact  exact acting although the model fits (--residency-when-fits act), no
#             limit, page cache warm: what the manager costs a token when every expert it
#             requests is resident (scripts/memlab-predict.sh gives it to the timing model)
#   manager-cache  the same for the pinned cache alone (the budget of the first ratio)
# Each of dense..cache is that part alone on top of the observer; `all` is them together.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${MOE_RESIDENCY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/moe-residency}"
lab="$cache/memlab"

preset=full
csv=""
configs=""
ratios=""
probe=""
threads="$(nproc)"
omp_wait="${OMP_WAIT_POLICY:-PASSIVE}"
shape=""
run_timeout=""
budget=""
extended=0
decode_override=""
plot=1
disk=1
rounds=1
table_only=""
die() { echo "memlab: $*" >&2; exit 2; }
log() { echo "memlab: $*" >&2; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) preset=quick ;;
    --smoke) preset=smoke ;;
    --shape) preset=shape; shape="${2:?--shape needs a name}"; shift ;;
    --csv) csv="${2:?--csv needs a file}"; shift ;;
    --configs) configs="${2:?--configs needs a list}"; shift ;;
    --ratios) ratios="${2:?--ratios needs a list}"; shift ;;
    --probe) probe="${2:?--probe needs a path}"; shift ;;
    --threads) threads="${2:?--threads needs a number}"; shift ;;
    --budget) budget="${2:?--budget needs MiB, auto or a share like 40%}"; shift ;;
    --run-timeout) run_timeout="${2:?--run-timeout needs seconds}"; shift ;;
    --decode) decode_override="${2:?--decode needs a number of tokens}"; shift ;;
    --csv-extended) extended=1 ;;
    --no-plot) plot=0 ;;
    --no-disk) disk=0 ;;
    --rounds) rounds="${2:?--rounds needs a number}"; shift ;;
    --table-only) table_only="${2:?--table-only needs a run directory}"; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
  shift
done
[[ -z "$csv" || "$csv" = /* ]] || csv="$PWD/$csv"

# The model and the run of each preset. q4_K needs --embd and --expert-ff to be
# multiples of 256.
case "$preset" in
  full)  spec=(--layers 16 --experts 128 --k 8 --embd 2048 --expert-ff 768); tokens=32; decode=64
         : "${ratios:=1.5,2.5}"; : "${configs:=mmap,observer,dense,exact,predicted,cache,all,degraded,resident,resident-all,manager-exact,manager-cache}"
         : "${run_timeout:=1800}"; : "${budget:=auto}"; disk_reads=256 ;;
  quick) spec=(--layers 12 --experts 128 --k 8 --embd 1024 --expert-ff 512); tokens=8; decode=16
         : "${ratios:=1.5,2.5}"; : "${configs:=mmap,observer,dense,exact,predicted,cache,all,all-adaptive,degraded,resident,resident-all,manager-exact,manager-cache}"
         : "${run_timeout:=600}"; : "${budget:=25%}"; disk_reads=64 ;;
  shape) case "$shape" in qwen3-30b-a3b|qwen3-30b-a3b-half) ;; *) die "--shape: '$shape'; expected qwen3-30b-a3b or qwen3-30b-a3b-half" ;; esac
         spec=(--shape "$shape"); tokens=8; decode=16
         : "${ratios:=2.0,1.5,3}"; : "${configs:=mmap,mmap-128k,observer,dense,exact,predicted,cache,all,all-adaptive,all-pool,degraded,degraded-pool,resident}"
         : "${run_timeout:=1800}"; : "${budget:=auto}"; disk_reads=256 ;;
  smoke) spec=(--layers 8 --experts 128 --k 8 --embd 1024 --expert-ff 512); tokens=8; decode=12
         : "${ratios:=2}"; : "${configs:=mmap,all,all-serial,all-pool}"; : "${run_timeout:=600}"; : "${budget:=25%}"; disk=0 ;;
esac
# One expert slice of one expert tensor, bytes (q4_K: 144 bytes per 256 weights): the
# manager's request shape, at which the roofline's bandwidth is measured.
if [[ $preset == shape ]]; then slice_bytes=$((2048 * 768 * 144 / 256)); else slice_bytes=$((spec[7] * spec[9] * 144 / 256)); fi
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || die "--rounds: '$rounds'; expected a whole number of rounds, at least 1"
if [[ -n "$decode_override" ]]; then
  [[ "$decode_override" =~ ^[1-9][0-9]*$ ]] || die "--decode: '$decode_override'; expected a whole number of decode tokens, at least 1"
  decode=$decode_override
fi
# Numbers: whole, positive, in range, or refused naming the option (no wrap, no 0 limit).
[[ "$threads" =~ ^[1-9][0-9]{0,3}$ && "$threads" -le 1024 ]] || die "--threads: '$threads'; expected a whole number from 1 to 1024"
[[ "$run_timeout" =~ ^[1-9][0-9]*$ ]] || die "--run-timeout: '$run_timeout'; expected a whole number of seconds, at least 1"
for r in ${ratios//,/ }; do
  [[ "$r" =~ ^[0-9]+(\.[0-9]+)?$ ]] && awk -v r="$r" 'BEGIN{exit !(r >= 1 && r <= 100)}' ||
    die "--ratios: '$r' in '$ratios'; expected ratios of the model's size to the memory limit, from 1 to 100"
done
[[ -n "${ratios//[ ,]/}" && "$ratios" != *,,* && "$ratios" != ,* && "$ratios" != *, ]] ||
  die "--ratios: '$ratios'; expected a comma list of ratios like 1.5,2.5"
if [[ "$budget" != auto ]]; then
  [[ "$budget" =~ ^[0-9]+(\.[0-9]+)?%?$ ]] && awk -v b="${budget%\%}" 'BEGIN{exit !(b > 0)}' &&
    { [[ "$budget" != *% ]] || awk -v b="${budget%\%}" 'BEGIN{exit !(b < 100)}'; } ||
    die "--budget: '$budget'; expected MiB > 0, auto, or a share of the limit like 40% (above 0, below 100)"
fi
for c in ${configs//,/ }; do
  case "$c" in mmap|mmap-128k|no-mmap|mlock|observer|dense|exact|predicted|cache|all|all-adaptive|all-serial|all-pool|cache-pool|degraded|degraded-pool|resident|resident-all|manager-exact|manager-cache) ;;
    *) die "--configs: '$c'; expected mmap, mmap-128k, no-mmap, mlock, observer, dense, exact, predicted, cache, all, all-adaptive, all-serial, all-pool, cache-pool, degraded, degraded-pool, resident, resident-all, manager-exact or manager-cache" ;;
  esac
done

# ---- root and a memory cgroup, or a clear refusal --------------------------
[[ "$(id -u)" -eq 0 ]] || die "needs root: it creates a memory cgroup and drops the page cache (run it with sudo)"
cg_version=""
if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
  grep -qw memory /sys/fs/cgroup/cgroup.controllers ||
    die "cgroup v2 is mounted at /sys/fs/cgroup but has no memory controller"
  grep -qw memory /sys/fs/cgroup/cgroup.subtree_control ||
    die "cgroup v2: the memory controller is not enabled for child groups of /sys/fs/cgroup (cgroup.subtree_control)"
  cg_version=2; cg_root=/sys/fs/cgroup
elif [[ -f /sys/fs/cgroup/memory/memory.limit_in_bytes ]]; then
  cg_version=1; cg_root=/sys/fs/cgroup/memory
else
  die "no memory cgroup: neither cgroup v2 with the memory controller at /sys/fs/cgroup nor the v1 memory controller at /sys/fs/cgroup/memory"
fi
[[ -w /proc/sys/vm/drop_caches ]] || die "cannot write /proc/sys/vm/drop_caches"

cg="$cg_root/moe-residency-memlab-$$"
child=""
ra_file=""      # the model's block device's read_ahead_kb, while mmap-128k changed it
ra_saved=""
cleanup() {
  local rc=$?
  if [[ -n "$ra_saved" && -w "$ra_file" ]]; then echo "$ra_saved" > "$ra_file" || true; fi
  if [[ -n "$child" ]] && kill -0 "$child" 2>/dev/null; then
    kill -TERM "$child" 2>/dev/null || true
    wait "$child" 2>/dev/null || true
  fi
  if [[ -d "$cg" ]]; then
    # Only processes this script started can be in it; hand any left to the parent.
    if [[ -f "$cg/cgroup.procs" ]]; then
      while read -r p; do echo "$p" > "$cg_root/cgroup.procs" 2>/dev/null || true; done < "$cg/cgroup.procs"
    fi
    for _ in 1 2 3 4 5; do rmdir "$cg" 2>/dev/null && break; sleep 1; done
    [[ -d "$cg" ]] && echo "memlab: could not remove the cgroup $cg; remove it with: rmdir $cg" >&2
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

cg_limit() {  # bytes, or "none"
  if [[ $cg_version == 1 ]]; then
    echo "$([[ $1 == none ]] && echo -1 || echo "$1")" > "$cg/memory.limit_in_bytes"
    echo 0 > "$cg/memory.max_usage_in_bytes" 2>/dev/null || true
  else
    echo "$([[ $1 == none ]] && echo max || echo "$1")" > "$cg/memory.max"
  fi
}
cg_peak_mib() {
  local f="$cg/memory.max_usage_in_bytes"; [[ $cg_version == 2 ]] && f="$cg/memory.peak"
  [[ -r "$f" ]] && awk '{printf "%.0f", $1/1048576}' "$f" || echo "-"
}

# ---- tools ----------------------------------------------------------------
if [[ -z "$probe" ]]; then
  log "building moe-llama-probe and moe-disk-lanes (build/memlab, Release)"
  prefix="$("$repo/scripts/fetch-llama-cpp.sh" --install)"
  cmake -S "$repo" -B "$repo/build/memlab" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DMOE_RESIDENCY_BUILD_LLAMA_CPP=ON -DMOE_RESIDENCY_TEST_CONSUMER=OFF \
        -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
  cmake --build "$repo/build/memlab" -j2 --target moe_llama_probe moe_disk_lanes >&2
  probe="$repo/build/memlab/bin/moe-llama-probe"
fi
[[ -x "$probe" ]] || die "--probe: '$probe' is not an executable"
lanes_tool="$(dirname "$probe")/moe-disk-lanes"
# Each tool's --help is read once into a variable and searched there: with
# pipefail, `tool --help | grep -q` fails whenever grep exits at its match
# before the tool has written the rest (SIGPIPE, exit 141): a race that made
# CI call a probe with the manager built in one "without --residency".
probe_help="$("$probe" --help 2>/dev/null || true)"
lanes_help=""
[[ -x "$lanes_tool" ]] && lanes_help="$("$lanes_tool" --help 2>/dev/null || true)"
has_option() { grep -q -e "$2" <<<"$1"; }
has_residency=0
has_option "$probe_help" '--residency' && has_residency=1
has_when_fits=0
has_option "$probe_help" '--residency-when-fits' && has_when_fits=1
has_metrics=0
has_option "$probe_help" '--metrics-csv' && has_metrics=1
has_walk=0
has_option "$lanes_help" '--fault-walk' && has_walk=1
has_inline_walk=0
has_option "$lanes_help" '--inline-walk' && has_inline_walk=1

# ---- the model --------------------------------------------------------------
mkdir -p "$lab"
if [[ $preset == shape ]]; then
  model="$lab/$shape-q4_K.gguf"
  if [[ ! -f "$model" ]]; then
    log "writing the lab model $model (random weights in $shape's shape, q4_K experts from a pool of 32 per kind, q4_K dense rows from a pool)"
    "$probe" --random qwen3moe "${spec[@]}" --save-model "$model" --save-only >&2
  fi
else
  model="$lab/qwen3moe-L${spec[1]}-E${spec[3]}-k${spec[5]}-d${spec[7]}-ff${spec[9]}-q4_K.gguf"
  if [[ ! -f "$model" ]]; then
    log "writing the lab model $model (random weights, q4_K experts from a pool of 32 per kind)"
    "$probe" --random qwen3moe "${spec[@]}" --expert-type q4_K --save-model "$model" --save-only >&2
  fi
fi
size=$(stat -c %s "$model")
size_mib=$(( size / 1048576 ))

stamp="$(date +%Y%m%d-%H%M%S)"
out="$lab/runs/$stamp-$preset"
if [[ -n "$table_only" ]]; then
  [[ -d "$table_only" ]] || die "--table-only: '$table_only' is not a directory"
  out="$(cd "$table_only" && pwd)"
  [[ $rounds == 1 ]] || die "--table-only: one round only (the rounds' pooling is not redone)"
fi
mkdir -p "$out"
machine="$(nproc) cores, $(awk '/MemTotal/{printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -sr), cgroup v$cg_version"
log "model $model ($size_mib MiB); results in $out"
log "machine: $machine"

# ---- the disk ---------------------------------------------------------------
disk_probe() {  # DIR: the lanes curve, measured at the start of every round
  if [[ $disk == 1 && -x "$lanes_tool" ]]; then
    log "disk: cold random 4 MiB O_DIRECT reads of the model file against concurrent readers"
    "$lanes_tool" --file "$model" --readers 1,2,4,8 --block-mib 4 --reads "$disk_reads" | tee "$1/disk-lanes.csv" >&2
    # The roofline's bandwidth: the manager's own request shape (one expert slice), the
    # best of 1 to 8 concurrent readers (its lanes and the willneed queue between them).
    local slice_mib
    slice_mib=$(awk -v b="$slice_bytes" 'BEGIN { printf "%.6f", b / 1048576 }')
    log "disk: cold random $((slice_bytes / 1024)) KiB O_DIRECT reads (one expert slice, the manager's request) against concurrent readers"
    "$lanes_tool" --file "$model" --readers 1,2,4,8 --block-mib "$slice_mib" --reads $((disk_reads * 4)) | tee "$1/disk-expert.csv" >&2
  fi
}

# ---- runs -------------------------------------------------------------------
mkdir "$cg"
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }

# The fault path in each ratio's limit, before the cells (moe-disk-lanes --fault-walk: the
# model's pages faulted in as llama.cpp's decode faults them, no llama.cpp), with the dense
# pages locked too when `dense` runs: DIR/fault-walk.csv, one row per ratio and shape, the
# cell's limit first. Walked at the limit less the timing model's assumed overhead
# (lab-predict --overhead-mib, 64 MiB: llama.cpp's buffers, which the walk does not have),
# so that its pages have the room a cell's have. scripts/memlab-predict.sh uses it for the
# fault cells (docs/lab-predict.md, "The walks").
walk_overhead_mib=64
fault_walk_probe() {  # DIR [FILE]: DIR/FILE, default fault-walk.csv
  [[ $disk == 1 && $has_walk == 1 ]] || return 0
  local d="$1" name="${2:-fault-walk.csv}" ratio limit pin header=1
  [[ ",$configs," == *,mmap,* || ",$configs," == *,observer,* || ",$configs," == *,dense,* || ",$configs," == *,predicted,* ]] || return 0
  for ratio in ${ratios//,/ }; do
    limit=$(limit_of "$ratio")
    for pin in "" --walk-pin-dense; do
      [[ -z "$pin" || ",$configs," == *,dense,* ]] || continue
      log "fault walk: limit $((limit - walk_overhead_mib)) MiB (r$ratio less $walk_overhead_mib)${pin:+, dense pages locked}, page cache dropped"
      cg_limit $(( (limit - walk_overhead_mib) * 1048576 ))
      drop_caches
      local row
      row="$(sh -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' sh "$cg" \
               "$lanes_tool" --file "$model" --fault-walk --walk-tokens 24 $pin)" ||
        { log "fault walk: moe-disk-lanes --fault-walk failed; no $name"; rm -f "$d/$name"; return 0; }
      if [[ $header == 1 ]]; then echo "limit_mib,$(head -1 <<< "$row")" > "$d/$name"; header=0; fi
      echo "$limit,$(tail -1 <<< "$row")" >> "$d/$name"
    done
  done
  cg_limit none
  awk -F, 'NR > 1 { printf "memlab: fault walk, limit %s MiB%s: %.3f ms off the CPU and %.3f in the kernel per MiB read, %.1f MiB a fault\n", $1, ($2 > 0 ? " (dense locked)" : ""), $10, $11, $12 }' "$d/$name" >&2
}

# The `cache` configuration's inline path in each ratio's limit, at that ratio's budget
# (moe-disk-lanes --inline-walk: the pinned cache's misses read and locked by the calling
# thread as the manager's eval thread does, no llama.cpp): DIR/inline-walk.csv, one row per
# ratio, the cell's limit first, walked at the limit less the same overhead as the fault walk.
# scripts/memlab-predict.sh uses it for the cache cells (docs/lab-predict.md, "The walks").
inline_walk_probe() {  # DIR [FILE]: DIR/FILE, default inline-walk.csv
  [[ $disk == 1 && $has_inline_walk == 1 && ",$configs," == *,cache,* ]] || return 0
  local d="$1" name="${2:-inline-walk.csv}" ratio limit b header=1 row
  for ratio in ${ratios//,/ }; do
    limit=$(limit_of "$ratio")
    b="$(config_args cache "" "$limit")"; b="${b##* }"  # --residency-budget's value
    [[ $b =~ ^[0-9]+([.][0-9]+)?$ ]] || { log "inline walk: budget '$b' is not MiB (--budget auto); no $name"; cg_limit none; rm -f "$d/$name"; return 0; }
    log "inline walk: limit $((limit - walk_overhead_mib)) MiB (r$ratio less $walk_overhead_mib), budget $b MiB, page cache dropped"
    cg_limit $(( (limit - walk_overhead_mib) * 1048576 ))
    drop_caches
    row="$(sh -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' sh "$cg" \
             "$lanes_tool" --file "$model" --inline-walk --walk-budget-mib "$b" --walk-tokens 24)" ||
      { log "inline walk: moe-disk-lanes --inline-walk failed; no $name"; rm -f "$d/$name"; return 0; }
    if [[ $header == 1 ]]; then echo "limit_mib,$(head -1 <<< "$row")" > "$d/$name"; header=0; fi
    echo "$limit,$(tail -1 <<< "$row")" >> "$d/$name"
  done
  cg_limit none
  awk -F, 'NR > 1 { printf "memlab: inline walk, limit %s MiB, budget %s MiB: %.3f ms off the CPU and %.3f in the kernel per MiB read, %.1f pins and %.1f MiB read a token\n", $1, $2, $9, $10, $4, $5 }' "$d/$name" >&2
}

# run NAME LIMIT ARGS... : one probe run in the cgroup; its log and per-token CSV in $rdir
# (the round's directory: $out itself when there is one round).
rdir="$out"
run() {
  local name="$1" limit="$2"; shift 2
  cg_limit "$limit"
  local rc=0
  # For the timing model (scripts/memlab-predict.sh): the phone-format metrics of
  # every run, and the route trace of every run that has the observer.
  local extra=()
  if [[ $has_metrics == 1 ]]; then
    extra+=(--metrics-csv "$rdir/$name.metrics.csv")
    [[ " $* " == *" --no-observer "* ]] || extra+=(--trace-out "$rdir/$name.route.csv")
  fi
  # OMP_WAIT_POLICY=PASSIVE for every configuration alike: ggml's OpenMP workers otherwise
  # spin between graphs, here while the eval thread is in the observer's callback, taking a
  # core from the lanes and the kernel's reads (docs/memlab.md, "Notes on this machine").
  timeout -s TERM "$run_timeout" env OMP_WAIT_POLICY="$omp_wait" \
    sh -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' sh "$cg" \
    "$probe" --model "$model" --tokens "$tokens" --decode "$decode" --threads "$threads" \
    --per-token-csv "$rdir/$name.csv" "${extra[@]}" "$@" > "$rdir/$name.log" 2>&1 &
  child=$!
  wait "$child" || rc=$?
  child=""
  echo "$(cg_peak_mib)" > "$rdir/$name.peak"
  if [[ $rc -ne 0 ]]; then
    local status=failed
    [[ $rc == 124 ]] && status=timeout
    [[ $rc == 137 ]] && status=killed  # SIGKILL: the cgroup's OOM killer (see dmesg)
    echo "$status" > "$rdir/$name.status"
    log "$name: exited with $rc ($status) — see $rdir/$name.log"
    tail -n 3 "$rdir/$name.log" >&2 || true
    rm -f "$rdir/$name.csv"
  else
    echo ok > "$rdir/$name.status"
  fi
  return 0
}

config_args() {  # CONFIG DEGRADE LIMIT_MIB: the probe options of a configuration
  local b="$budget"
  [[ $b == *% ]] && b=$(awk -v l="$3" -v p="${b%\%}" 'BEGIN{printf "%.0f", l * p / 100}')
  case "$1" in
    mmap|mmap-128k|resident) echo "--no-observer" ;;
    no-mmap) echo "--no-observer --load-mode no-mmap" ;;
    mlock) echo "--no-observer --load-mode mlock" ;;
    observer) echo "" ;;
    dense|exact|predicted|cache) echo "--residency $1 --residency-budget $b" ;;
    all) echo "--residency all --residency-budget $b" ;;
    all-adaptive) echo "--residency all --residency-budget $b --policy adaptive" ;;
    all-serial) echo "--residency all --residency-budget $b --serial" ;;
    all-pool) echo "--residency all --residency-budget $b --pool --spec-cap 8" ;;
    degraded-pool) echo "--residency all --residency-budget $b --pool --spec-cap 8 --degrade $2" ;;
    cache-pool) echo "--residency cache --residency-budget $b --pool" ;;
    degraded) echo "--residency all --residency-budget $b --degrade $2" ;;
  esac
}
limit_of() { awk -v s="$size" -v r="$1" 'BEGIN{printf "%.0f", s / r / 1048576}'; }  # RATIO -> MiB
no_limit() { [[ $1 == resident || $1 == resident-all || $1 == manager-* ]]; }

# The schedule: every run of a round once, in round 1's order. The limited cells ratio by
# ratio; the runs without a limit once each (not per ratio), where the first ratio's list
# names them; their rows repeat under each ratio.
schedule=()
for ratio in ${ratios//,/ }; do
  for config in ${configs//,/ }; do
    case "$config" in
      dense|exact|predicted|cache|all|all-adaptive|all-serial|all-pool|cache-pool|degraded|degraded-pool)
        if [[ $has_residency == 0 ]]; then
          log "r$ratio-$config: skipped — this moe-llama-probe has no --residency (the residency manager is not built in)"
          continue
        fi ;;
    esac
    if [[ $config == manager-* && $has_when_fits == 0 ]]; then
      log "r$ratio-$config: skipped — this moe-llama-probe has no --residency-when-fits (a manager that acts on a model that fits)"
      continue
    fi
    if no_limit "$config"; then
      [[ " ${schedule[*]} " == *" -:$config "* ]] || schedule+=("-:$config")
    else
      schedule+=("$ratio:$config")
    fi
  done
done
first_ratio="${ratios%%,*}"

stale_gate_of() {  # RATIO: the stale-gate accuracy an observer (or all) run measured, this round or an earlier one
  local f
  for f in "$rdir/r$1-observer.log" "$out"/round-*/"r$1-observer.log" "$rdir"/r*-all.log "$out"/round-*/r*-all.log; do
    [[ -f "$f" ]] || continue
    sed -n 's/^moe-predict: stale-gate \([0-9.]*\)% of routed slots.*/\1/p' "$f" | head -1 | grep . && return 0
  done
  return 0
}

run_entry() {  # RATIO:CONFIG of the schedule, in $rdir
  local ratio="${1%%:*}" config="${1#*:}" limit degrade=0 acc
  if [[ $ratio == - ]]; then
    log "$config: no limit, page cache warm"
    cat "$model" > /dev/null
    # manager-*: the manager acting with every expert resident, its own cost per token, at
    # the first ratio's budget.
    # shellcheck disable=SC2046
    case "$config" in
      resident) run "$config" none --no-observer ;;
      resident-all) run "$config" none --residency all --residency-budget auto ;;
      manager-*) run "$config" none $(config_args "${config#manager-}" 0 "$(limit_of "$first_ratio")") --residency-when-fits act ;;
    esac
    return 0
  fi
  limit=$(limit_of "$ratio")
  if [[ $config == degraded || $config == degraded-pool ]]; then
    # Replace a share P of predicted slots so that acc * (1 - P) ~ 88.6%,
    # acc being the stale-gate's slot accuracy the observer run measured.
    acc="$(stale_gate_of "$ratio")"
    [[ -n "$acc" ]] || { log "r$ratio-$config: skipped — no stale-gate accuracy measured (run observer or all first)"; return 0; }
    degrade=$(awk -v a="$acc" 'BEGIN{p = 1 - 88.6 / a; if (p < 0) p = 0; printf "%.4f", p}')
    log "r$ratio-$config: stale-gate measured $acc% of slots; --degrade $degrade"
  fi
  log "r$ratio-$config: limit $limit MiB (model $size_mib MiB / $ratio), page cache dropped"
  drop_caches
  if [[ $config == mmap-128k ]]; then
    # Plain mmap at the kernel's default read-ahead (what most NVMe drives have), the
    # device's own setting restored right after the run (and by the exit trap).
    ra_file="$(ra_file_of "$model")"
    [[ -n "$ra_file" ]] || { log "r$ratio-$config: skipped — no read_ahead_kb found for the device of $model"; return 0; }
    ra_saved="$(cat "$ra_file")"
    echo 128 > "$ra_file"
    log "r$ratio-$config: $ra_file $ra_saved -> 128 for this run"
  fi
  # shellcheck disable=SC2046
  run "r$ratio-$config" $(( limit * 1048576 )) $(config_args "$config" "$degrade" "$limit")
  if [[ $config == mmap-128k ]]; then echo "$ra_saved" > "$ra_file"; ra_saved=""; fi
}
# The read_ahead_kb of the block device (the whole disk, for a partition) holding FILE.
ra_file_of() {
  local src dev parent
  src="$(df --output=source "$1" | tail -1)"
  dev="$(basename "$(readlink -f "$src")")"
  parent="$(lsblk -no pkname "/dev/$dev" 2>/dev/null | head -1)"
  [[ -n "$parent" ]] && dev="$parent"
  [[ -w "/sys/block/$dev/queue/read_ahead_kb" ]] && echo "/sys/block/$dev/queue/read_ahead_kb"
}

# ---- the table ----------------------------------------------------------------
summarize() {  # CSV of one run -> tok_s p50 p90 read_mib majflt hit pinned engine_majflt proc_cpu_ms read_wait_ms read_waits
  awk -F, 'NR > 1 && $2 == "decode" { n++; ms += $3; rb += $6; mf += $4; emf += $12; pc += $13; rw += $15; rn += $16; t[n] = $3;
             if ($11 != "") { hit = $11; has = 1 } if ($10 + 0 > pin) pin = $10 + 0 }
           function pct(q,   pos, lo, hi) { pos = q * (n - 1); lo = int(pos) + 1; hi = lo < n ? lo + 1 : n;
             return t[lo] + (t[hi] - t[lo]) * (pos - int(pos)) }
           END { if (n == 0) { print "- - - - - - - - - - -"; exit }
             for (i = 2; i <= n; i++) { v = t[i]; j = i - 1; while (j > 0 && t[j] > v) { t[j + 1] = t[j]; j-- } t[j + 1] = v }
             printf "%.3f %.1f %.1f %.2f %.2f %s %.1f %.2f %.1f %.2f %.2f\n", n / (ms / 1000), pct(0.5), pct(0.9), rb / n / 1048576,
                    mf / n, has ? hit : "-", pin, emf / n, pc / n, rw / n, rn / n }' "$1"
}
# The best MiB/s of the expert-shaped disk curves under DIR (its rounds' too); "" if none.
expert_bw() {
  local f files=()
  for f in "$1/disk-expert.csv" "$1"/round-*/disk-expert.csv; do [[ -f "$f" ]] && files+=("$f"); done
  [[ ${#files[@]} -gt 0 ]] || return 0
  awk -F, 'FNR > 1 && $5 + 0 > b { b = $5 + 0 } END { if (b > 0) printf "%.1f", b }' "${files[@]}"
}
digest() { sed -n 's/^logits: fnv1a64 \([0-9a-f]*\) over.*/\1/p' "$1" 2>/dev/null | head -1; }

make_table() {  # DIR CSV|"" TITLE_SUFFIX: DIR/table.txt (and the CSV) from DIR's runs; prints it
  local d="$1" csvf="$2" reference="" table="$1/table.txt" ratio config f status lim peak same dg limit
  for ratio in ${ratios//,/ }; do
    for config in ${configs//,/ }; do
      [[ -f "$d/r$ratio-$config.csv" ]] || continue
      reference="$(digest "$d/r$ratio-$config.log")"
      [[ -n "$reference" ]] && break 2
    done
  done
  {
    echo "memlab ($preset): $(basename "$model"), $size_mib MiB; $tokens prompt + $decode decode tokens, $threads threads (OMP_WAIT_POLICY=$omp_wait); $machine$3"
    printf '%-6s %-6s %-12s %9s %8s %8s %10s %10s %10s %6s %8s %7s %8s %9s %7s %7s %7s %8s\n' ratio limit config tok/s p50_ms p90_ms \
           MiB_rd/tok majflt/tok eng_mf/tok hit% pin_MiB peakMiB logits roof_ms x_roof bw_frac cpu_use wait_ms
  } > "$table"
  if [[ -n "$csvf" ]]; then
    echo "ratio,config,tok_s,p50_ms,p90_ms,read_mib_per_token,majflt_per_token,hit_pct,pinned_mib,logits_identical,roofline_ms,bw_fraction$([[ $extended == 1 ]] && echo ",engine_majflt_per_token,status,x_roofline,cpu_use,read_wait_ms_per_token,read_waits_per_token")" > "$csvf"
  fi
  # The roofline of each row: max(its MiB read a token / the expert-shaped bandwidth, the
  # resident ms a token), both measured in this run; cpu_use: the process's CPU time (every
  # thread) over cores x wall time.
  local bw resident_ms cores
  bw="$(expert_bw "$d")"
  resident_ms=""
  for ratio in ${ratios//,/ }; do
    if [[ -f "$d/r$ratio-resident.csv" ]]; then read -r resident_ms _ <<< "$(summarize "$d/r$ratio-resident.csv" | awk '{ if ($1 > 0) printf "%.3f", 1000 / $1 }')"; break; fi
  done
  cores="$(nproc)"
  if [[ -n "$bw" || -n "$resident_ms" ]]; then
    echo "roofline: the disk's best cold bandwidth at the expert slice ($((slice_bytes / 1024)) KiB) ${bw:-unmeasured} MiB/s; resident ${resident_ms:-unmeasured} ms a token" >> "$table"
  fi
  for ratio in ${ratios//,/ }; do
    limit=$(limit_of "$ratio")
    for config in ${configs//,/ }; do
      f="$d/r$ratio-$config.csv"
      status="$(cat "$d/r$ratio-$config.status" 2>/dev/null || true)"
      [[ -n "$status" ]] || continue  # not run (skipped)
      lim=$(no_limit "$config" && echo none || echo "$limit")
      peak="$(cat "$d/r$ratio-$config.peak" 2>/dev/null || echo -)"
      if [[ "$status" != ok || ! -f "$f" ]]; then
        # A run that did not finish: a row saying so, no figures.
        printf '%-6s %-6s %-12s %9s   (%s: see r%s-%s.log)\n' "$ratio" "$lim" "$config" "-" "$status" "$ratio" "$config" >> "$table"
        [[ -n "$csvf" ]] && echo "$ratio,$config,,,,,,,,no,,$([[ $extended == 1 ]] && echo ",,$status,,,,")" >> "$csvf"
        continue
      fi
      read -r tok p50 p90 rd mf hit pin emf pcpu rwait rwaits <<< "$(summarize "$f")"
      if [[ -s "$d/r$ratio-$config.hit" ]]; then hit="$(cat "$d/r$ratio-$config.hit")"; fi  # pooled rounds
      dg="$(digest "$d/r$ratio-$config.log")"
      same=$([[ -n "$dg" && "$dg" == "$reference" ]] && echo yes || echo no)
      local roof="" xroof="" bwf="" use=""
      read -r roof xroof bwf use <<< "$(awk -v tok="$tok" -v rd="$rd" -v bw="$bw" -v res="$resident_ms" -v pc="$pcpu" -v c="$cores" 'BEGIN {
          ms = tok > 0 ? 1000 / tok : 0; io = bw > 0 ? rd / bw * 1000 : -1
          roof = io; if (res != "" && res + 0 > roof) roof = res + 0
          printf "%s %s %s %s\n", (roof > 0 ? sprintf("%.1f", roof) : "-"), (roof > 0 && ms > 0 ? sprintf("%.2f", ms / roof) : "-"),
                 (bw > 0 && ms > 0 ? sprintf("%.2f", rd / (ms / 1000) / bw) : "-"), (ms > 0 ? sprintf("%.2f", pc / (c * ms)) : "-") }')"
      printf '%-6s %-6s %-12s %9s %8s %8s %10s %10s %10s %6s %8s %7s %8s %9s %7s %7s %7s %8s\n' "$ratio" "$lim" "$config" "$tok" "$p50" "$p90" \
             "$rd" "$mf" "$emf" "$hit" "$pin" "$peak" "$same" "$roof" "$xroof" "$bwf" "$use" "$rwait" >> "$table"
      [[ -n "$csvf" ]] && echo "$ratio,$config,$tok,$p50,$p90,$rd,$mf,$([[ $hit == - ]] || echo "$hit"),$pin,$same,${roof/-/},${bwf/-/}$([[ $extended == 1 ]] && echo ",$emf,ok,${xroof/-/},${use/-/},$rwait,$rwaits")" >> "$csvf"
    done
  done
  cat "$table"
}

# ---- plots --------------------------------------------------------------------
make_plots() {  # DIR: decode token time per configuration, one plot per ratio
  local d="$1" ratio config f series term ext
  [[ $plot == 1 ]] && command -v gnuplot > /dev/null || return 0
  for ratio in ${ratios//,/ }; do
    series=""
    for config in ${configs//,/ }; do
      f="$d/r$ratio-$config.csv"
      [[ -f "$f" ]] || continue
      series+="${series:+, }'$f' using 1:(strcol(2) eq \"decode\" ? \$3 : 1/0) with linespoints title '$config'"
    done
    [[ -n "$series" ]] || continue
    for term in "pngcairo size 1000,600" "svg size 1000,600"; do
      ext=${term%% *}; ext=${ext#png}; ext=${ext:-png}; [[ $term == pngcairo* ]] && ext=png
      gnuplot <<GNUPLOT
set datafile separator ","
set terminal $term
set output "$d/tokens-r$ratio.$ext"
set title "memlab ($preset): decode token time, model $size_mib MiB at ratio $ratio (limit $(limit_of "$ratio") MiB)"
set xlabel "decode token"
set ylabel "ms per token"
set logscale y
set key outside right
set grid
plot $series
GNUPLOT
    done
    log "plot: $d/tokens-r$ratio.png, .svg"
  done
}

if [[ -n "$table_only" ]]; then
  for ratio in ${ratios//,/ }; do
    for config in ${configs//,/ }; do
      no_limit "$config" || continue
      for ext in csv log peak status metrics.csv route.csv; do
        if [[ -f "$out/$config.$ext" && ! -f "$out/r$ratio-$config.$ext" ]]; then cp "$out/$config.$ext" "$out/r$ratio-$config.$ext"; fi
      done
    done
  done
  make_table "$out" "$csv" ""
  [[ -n "$csv" ]] && cp "$csv" "$out/table.csv" 2>/dev/null || true
  log "done: $out/table.txt"
  exit 0
fi

# ---- the rounds ---------------------------------------------------------------
# One round: the disk curve, then every run of the schedule. With --rounds N, each round is a
# whole run in $out/round-K (its own disk-lanes.csv and table.txt), round 1 in the schedule's
# order and every even round in the reverse order, so that a drift of the machine over the
# rounds falls on every cell alike: pooled over rounds 1 and 2, each cell's mean time is the
# middle of the run (scripts/memlab-predict.sh pools the rounds).
for ((k = 1; k <= rounds; ++k)); do
  if [[ $rounds -gt 1 ]]; then
    rdir="$out/round-$k"
    mkdir -p "$rdir"
    log "round $k of $rounds$( ((k % 2 == 0)) && echo ", in reverse order")"
  fi
  disk_probe "$rdir"
  fault_walk_probe "$rdir"
  inline_walk_probe "$rdir"
  order=("${schedule[@]}")
  if ((k % 2 == 0)); then
    order=()
    for ((i = ${#schedule[@]} - 1; i >= 0; --i)); do order+=("${schedule[i]}"); done
  fi
  for e in "${order[@]}"; do run_entry "$e"; done
  # The runs without a limit under every ratio's name.
  for ratio in ${ratios//,/ }; do
    for config in ${configs//,/ }; do
      no_limit "$config" || continue
      for ext in csv log peak status metrics.csv route.csv; do
        if [[ -f "$rdir/$config.$ext" ]]; then cp "$rdir/$config.$ext" "$rdir/r$ratio-$config.$ext"; fi
      done
    done
  done
  if [[ $rounds -gt 1 ]]; then
    make_table "$rdir" "" "; round $k of $rounds" > /dev/null
    make_plots "$rdir"
  fi
done

# ---- the disk again -------------------------------------------------------------
# The same measurement after the runs: whether the device still reads as it did
# before them (a long fault-driven run reads tens of GiB; "Longer runs" in
# docs/results/2026-12-03-memlab-predict-runs.md saw it slow down within a cell).
# The model uses the curves measured before each round (disk-lanes.csv) and, with
# rounds, this one too; for one round it is for the reader. Other blocks (--seed 2), so that no cache below the VM
# answers from the first measurement.
first_curve="$out/disk-lanes.csv"
[[ $rounds -gt 1 ]] && first_curve="$out/round-1/disk-lanes.csv"
if [[ $disk == 1 && -x "$lanes_tool" && -f "$first_curve" ]]; then
  "$lanes_tool" --file "$model" --readers 1,2,4,8 --block-mib 4 --reads "$disk_reads" --seed 2 > "$out/disk-lanes-after.csv"
  curve_of() { awk -F, 'NR > 1 { printf "%s%.0f", (n++ ? " / " : ""), $5 }' "$1"; }
  log "disk, MiB/s at 1 / 2 / 4 / 8 readers: before the runs $(curve_of "$first_curve"), after $(curve_of "$out/disk-lanes-after.csv") (disk-lanes-after.csv)"
fi
# The fault walk again, for the same reason: with it, the rounds' walks centre on the middle
# of the run, as the curves do (scripts/memlab-predict.sh pools them).
fault_walk_probe "$out" fault-walk-after.csv
inline_walk_probe "$out" inline-walk-after.csv

# ---- pooled over the rounds -----------------------------------------------------
# Each cell's files in $out: the rounds' per-token CSVs one after another (tok/s over every
# round's tokens), finished only if every round finished it, the largest peak, and the logits'
# digest only if every round's was the same (else the table says no).
if [[ $rounds -gt 1 ]]; then
  for ratio in ${ratios//,/ }; do
    for config in ${configs//,/ }; do
      name="r$ratio-$config"
      [[ -f "$out/round-1/$name.status" ]] || continue
      status=ok peak=0 dg="" dgs_same=1
      : > "$out/$name.csv.tmp"
      for ((k = 1; k <= rounds; ++k)); do
        s="$(cat "$out/round-$k/$name.status" 2>/dev/null || echo missing)"
        if [[ $status == ok && $s != ok ]]; then status="$s"; fi  # the first round that did not finish
        p="$(cat "$out/round-$k/$name.peak" 2>/dev/null || echo 0)"
        if [[ $p =~ ^[0-9]+$ ]] && ((p > peak)); then peak=$p; fi
        d="$(digest "$out/round-$k/$name.log")"
        if [[ $k == 1 ]]; then dg="$d"; fi
        if [[ -z "$d" || "$d" != "$dg" ]]; then dgs_same=0; fi
        if [[ -f "$out/round-$k/$name.csv" ]]; then
          awk -v k="$k" 'NR > 1 || k == 1' "$out/round-$k/$name.csv" >> "$out/$name.csv.tmp"
        fi
      done
      echo "$status" > "$out/$name.status"
      echo "$peak" > "$out/$name.peak"
      # The hit rate: the mean of the rounds' (each the run's own at its last token).
      for ((k = 1; k <= rounds; ++k)); do
        if [[ -f "$out/round-$k/$name.csv" ]]; then summarize "$out/round-$k/$name.csv"; fi
      done | awk '$6 != "-" { s += $6; n++ } END { if (n) printf "%.2f\n", s / n }' > "$out/$name.hit"
      echo "pooled over $rounds rounds: round-*/$name.log" > "$out/$name.log"
      if [[ $dgs_same == 1 ]]; then grep -m1 '^logits: fnv1a64 ' "$out/round-1/$name.log" >> "$out/$name.log" || true; fi
      if [[ $status == ok ]]; then mv "$out/$name.csv.tmp" "$out/$name.csv"; else rm -f "$out/$name.csv.tmp"; fi
    done
  done
fi

make_table "$out" "$csv" "$([[ $rounds -gt 1 ]] && echo "; pooled over $rounds rounds (round-1 ... round-$rounds)")"
[[ -n "$csv" ]] && cp "$csv" "$out/table.csv" 2>/dev/null || true
[[ $rounds -gt 1 ]] || make_plots "$out"
log "done: $out/table.txt"
