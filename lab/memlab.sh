#!/usr/bin/env bash
# lab/memlab.sh — the memory lab's one command (docs/memlab.md, docs/lab-predict.md).
#
#   sudo lab/memlab.sh [--quick|--smoke|--shape NAME] [options]   the lab's runs
#   lab/memlab.sh --table-only DIR [options]                      a run's table again
#   lab/memlab.sh predict RUNS_DIR [options]                      the timing model against a run
#   lab/memlab.sh --help                                          every option
#
# The lab is a Python program (lab/memlab/: python3 with numpy). This wrapper does only
# what needs root, and undoes it: it creates one memory cgroup, moe-residency-memlab-<pid>
# (v2, or v1, detected), runs the lab in the background, and on exit, error, Ctrl-C or
# TERM stops it, restores a device's read_ahead_kb the lab changed, and removes the
# cgroup. The lab asks it for the other root steps (--root-step, below): the cgroup's
# limit, a command moved into the cgroup, the page cache dropped, read_ahead_kb set.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
die() { echo "memlab: $*" >&2; exit 2; }

# ---- the root steps, for the lab this wrapper runs (its environment names the cgroup) ----
if [[ "${1:-}" == --root-step ]]; then
  cg="${MEMLAB_CGROUP:?--root-step: no MEMLAB_CGROUP (run the lab as sudo lab/memlab.sh)}"
  state="${MEMLAB_STATE:?--root-step: no MEMLAB_STATE}"
  [[ "$cg" =~ ^/sys/fs/cgroup(/memory)?/moe-residency-memlab-[0-9]+$ && -d "$cg" ]] ||
    die "--root-step: MEMLAB_CGROUP '$cg' is not a cgroup this wrapper made"
  step="${2:-}"
  case "$step" in
    limit)  # BYTES|none: the cgroup's memory limit (v1: its peak reset too)
      [[ "${3:-}" =~ ^([0-9]+|none)$ ]] || die "--root-step limit: '${3:-}'; expected bytes or none"
      if [[ -f "$cg/memory.limit_in_bytes" ]]; then
        echo "$([[ $3 == none ]] && echo -1 || echo "$3")" > "$cg/memory.limit_in_bytes"
        echo 0 > "$cg/memory.max_usage_in_bytes" 2>/dev/null || true
      else
        echo "$([[ $3 == none ]] && echo max || echo "$3")" > "$cg/memory.max"
      fi ;;
    drop-caches) sync; echo 3 > /proc/sys/vm/drop_caches ;;
    read-ahead)  # FILE KB: the read_ahead_kb of the block device (the whole disk, for a
      # partition) holding FILE set to KB, its value kept for the exit trap; exit 3: none found
      [[ -f "${3:-}" && "${4:-}" =~ ^[0-9]+$ ]] || die "--root-step read-ahead: expected a file and whole KiB"
      src="$(df --output=source -- "$3" | tail -1)"
      dev="$(basename "$(readlink -f "$src")")"
      parent="$(lsblk -no pkname "/dev/$dev" 2>/dev/null | head -1)"
      [[ -n "$parent" ]] && dev="$parent"
      ra="/sys/block/$dev/queue/read_ahead_kb"
      [[ -w "$ra" ]] || exit 3
      [[ -s "$state/read-ahead" ]] || echo "$ra $(cat "$ra")" > "$state/read-ahead"
      echo "$4" > "$ra"
      cat "$state/read-ahead" ;;
    read-ahead-restore)
      if [[ -s "$state/read-ahead" ]]; then
        read -r ra saved < "$state/read-ahead"
        echo "$saved" > "$ra"
        rm -f "$state/read-ahead"
      fi ;;
    in-cgroup)  # -- COMMAND...: this process moved into the cgroup, then COMMAND
      [[ "${3:-}" == -- && $# -ge 4 ]] || die "--root-step in-cgroup: expected -- COMMAND"
      shift 3
      echo $$ > "$cg/cgroup.procs"
      exec "$@" ;;
    *) die "--root-step: '$step'; expected limit, drop-caches, read-ahead, read-ahead-restore or in-cgroup" ;;
  esac
  exit 0
fi

# ---- the lab: python3 with numpy ---------------------------------------------------
python="${MOE_RESIDENCY_PYTHON:-}"
if [[ -z "$python" ]]; then
  # The first python3 on PATH may be another installation's; Debian's has python3-numpy.
  for p in python3 /usr/bin/python3; do
    if command -v "$p" > /dev/null && "$p" -c 'import numpy' 2> /dev/null; then python="$p"; break; fi
  done
  [[ -n "$python" ]] || die "no python3 with numpy (Debian: apt-get install python3-numpy; or set MOE_RESIDENCY_PYTHON)"
fi
lab() { PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" "$python" -m memlab "$@"; }

# No root for the prediction, the help, or a table again.
case "${1:-}" in predict) lab "$@"; exit ;; esac
for a in "$@"; do
  case "$a" in -h|--help|--table-only) lab "$@"; exit ;; esac
done
lab check "$@"  # every option checked before anything is made

# ---- root and a memory cgroup, or a clear refusal ------------------------------------
[[ "$(id -u)" -eq 0 ]] || die "needs root: it creates a memory cgroup and drops the page cache (run it with sudo)"
if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
  grep -qw memory /sys/fs/cgroup/cgroup.controllers ||
    die "cgroup v2 is mounted at /sys/fs/cgroup but has no memory controller"
  grep -qw memory /sys/fs/cgroup/cgroup.subtree_control ||
    die "cgroup v2: the memory controller is not enabled for child groups of /sys/fs/cgroup (cgroup.subtree_control)"
  version=2; cg_root=/sys/fs/cgroup
elif [[ -f /sys/fs/cgroup/memory/memory.limit_in_bytes ]]; then
  version=1; cg_root=/sys/fs/cgroup/memory
else
  die "no memory cgroup: neither cgroup v2 with the memory controller at /sys/fs/cgroup nor the v1 memory controller at /sys/fs/cgroup/memory"
fi
[[ -w /proc/sys/vm/drop_caches ]] || die "cannot write /proc/sys/vm/drop_caches"

cg="$cg_root/moe-residency-memlab-$$"
state="$(mktemp -d "${TMPDIR:-/tmp}/moe-residency-memlab.XXXXXX")"
child=""
cleanup() {
  local rc=$?
  if [[ -n "$child" ]] && kill -0 "$child" 2>/dev/null; then
    kill -TERM "$child" 2>/dev/null || true
    wait "$child" 2>/dev/null || true
  fi
  # A read_ahead_kb the lab changed and did not restore.
  if [[ -s "$state/read-ahead" ]]; then
    read -r ra saved < "$state/read-ahead"
    [[ -w "$ra" ]] && echo "$saved" > "$ra" || true
  fi
  rm -rf "$state"
  if [[ -d "$cg" ]]; then
    # Only processes the lab started can be in it; hand any left to the parent.
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
mkdir "$cg"

export MEMLAB_CGROUP="$cg" MEMLAB_CGROUP_VERSION="$version" MEMLAB_STATE="$state" MEMLAB_ROOT_STEP="$here/memlab.sh"
PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" "$python" -m memlab "$@" &
child=$!
rc=0
wait "$child" || rc=$?
child=""
exit "$rc"
