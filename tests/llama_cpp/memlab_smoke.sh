#!/usr/bin/env bash
# CTest llama_cpp_memlab_smoke: the memory lab's claim in small. A random
# qwen3moe with q4_K experts (~1 GiB) runs in a memory cgroup limited to half
# its size, through plain mmap and with the residency manager on; major faults
# per decode token must fall at least 5x with the serial manager (`all-serial`)
# and 2x with the overlapped one (`all`, whose matmuls wait in faults for pages
# still in flight), bytes read 5x (counts, not times), and the logits must be
# identical (lab/memlab.sh --smoke does the runs). And the
# overlap: `all` lets each layer's matmuls start while its reads are on the
# lanes, `all-serial` makes the eval thread wait for them first; the layers a
# decode token's eval thread had to block on the manager's reads must fall at
# least 2x with the overlap (counts, not times). And the expert pool
# (`all-pool`: the cache's experts read past the page cache into memory the
# manager owns, the next layer's placed ahead): bytes read and the engine's
# major faults 5x below plain mmap, logits identical.
#
# The faults counted are those of llama.cpp's own threads (the eval thread and
# ggml's workers), the faults decoding stalls on. getrusage(RUSAGE_SELF) also
# counts the manager's read lanes populating expert pages on purpose
# (MADV_POPULATE_READ and mlock fault pages in, and the kernel counts those as
# major faults of the lane); the process-wide figures are printed too.
#
#   memlab_smoke.sh TOOLS_DIR WORKDIR   (the lab's tools: moe-lab-run, moe-lab-model, moe-disk-lanes)
#
# It runs in two rounds (--rounds 2), the second in the reverse order: each
# round's directory must hold both runs, and the table's row must be the
# rounds pooled (tok/s over both rounds' decode tokens, recomputed here).
#
# Needs root and a memory cgroup. Without them it is SKIPPED (exit 77) with a
# loud message. Where they are available it must run: with CI=true, a
# moe-lab-run without the residency manager is a failure, not a skip.
set -uo pipefail
tools="${1:?usage: memlab_smoke.sh TOOLS_DIR WORKDIR}"
work="${2:?usage: memlab_smoke.sh TOOLS_DIR WORKDIR}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
memlab="$here/../../lab/memlab.sh"
run_tool="$tools/moe-lab-run"

skip() {
  echo "########################################################################"
  echo "# llama_cpp_memlab_smoke SKIPPED: $*"
  echo "# (it needs root and a memory cgroup; CI has both and runs it)"
  echo "########################################################################"
  exit 77
}
fail() { echo "llama_cpp_memlab_smoke FAILED: $*"; exit 1; }

[[ "$(id -u)" -eq 0 ]] || skip "not root"
if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
  grep -qw memory /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null ||
    skip "cgroup v2 without the memory controller enabled for child groups"
elif [[ ! -f /sys/fs/cgroup/memory/memory.limit_in_bytes ]]; then
  skip "no memory cgroup (neither v2 nor the v1 memory controller)"
fi
# The help is read whole first: `tool --help | grep -q` under pipefail fails
# when grep exits at its match while the tool still writes (SIGPIPE), which
# made CI report a tool with the manager as one without it.
run_help="$("$run_tool" --help 2>/dev/null || true)"
if ! grep -q -e '--residency' <<<"$run_help"; then
  [[ "${CI:-}" == true ]] && fail "root and a memory cgroup are available but $run_tool has no --residency"
  skip "$run_tool has no --residency (the residency manager is not built in)"
fi

mkdir -p "$work"
# A number out of its domain is refused before anything runs, naming the option.
for bad in "--ratios 0.5|--ratios: '0.5' in '0.5'; expected ratios" "--threads 0|--threads: '0'; expected a whole number from 1 to 1024" \
           "--budget 100%|--budget: '100%'; expected MiB > 0, auto, or a share"; do
  args="${bad%%|*}" want="${bad#*|}"
  # shellcheck disable=SC2086 # the option and its value, split on purpose
  out="$(bash "$memlab" --smoke $args --tools "$tools" 2>&1)" && fail "memlab.sh $args exited 0"
  grep -qF -- "$want" <<<"$out" || fail "memlab.sh $args: no '$want' in: $out"
done
csv="$work/memlab-smoke.csv"
rm -f "$csv"
bash "$memlab" --smoke --rounds 2 --tools "$tools" --csv "$csv" --csv-extended --no-plot 2> "$work/memlab.err" ||
  { cat "$work/memlab.err"; fail "lab/memlab.sh --smoke --rounds 2 exited with $?"; }
cat "$work/memlab.err"
[[ -f "$csv" ]] || fail "no CSV written"
cat "$csv"
# The rounds: where they are, their order, and the pooled row.
run="$(sed -n 's/^memlab: done: \(.*\)\/table.txt$/\1/p' "$work/memlab.err")"
[[ -d "$run/round-1" && -d "$run/round-2" && ! -e "$run/round-3" ]] || fail "no round-1 and round-2 (only) under '$run'"
order="$(sed -n '/^memlab: round 2 of 2, in reverse order$/,$ s/^memlab: r2-\([a-z-]*\): limit.*/\1/p' "$work/memlab.err" | tr '\n' ' ')"
[[ "$order" == "all-pool all-serial all mmap " ]] ||
  fail "round 2 ran '$order', expected 'all-pool all-serial all mmap ' (round 1's order reversed)"
for c in mmap all all-serial all-pool; do
  for k in 1 2; do [[ -f "$run/round-$k/r2-$c.csv" ]] || fail "round $k has no r2-$c.csv"; done
  pooled="$(awk -F, 'FNR > 1 && $2 == "decode" { n++; ms += $3 } END { printf "%.3f", n / (ms / 1000) }' \
            "$run/round-1/r2-$c.csv" "$run/round-2/r2-$c.csv")"
  [[ "$(awk -F, -v c="$c" 'NR > 1 && $2 == c { print $3 }' "$csv")" == "$pooled" ]] ||
    fail "$c: the table's tok/s is not the rounds pooled ($pooled from round-1 and round-2)"
done
header="ratio,config,tok_s,p50_ms,p90_ms,read_mib_per_token,majflt_per_token,hit_pct,pinned_mib,logits_identical,roofline_ms,bw_fraction,engine_majflt_per_token,status,x_roofline,cpu_use,read_wait_ms_per_token,read_waits_per_token"
[[ "$(head -1 "$csv")" == "$header" ]] || fail "CSV header is '$(head -1 "$csv")', expected '$header'"
row() { awk -F, -v c="$1" 'NR > 1 && $2 == c' "$csv"; }
mmap="$(row mmap)"; all="$(row all)"; serial="$(row all-serial)"; pool="$(row all-pool)"
[[ -n "$mmap" ]] || fail "no mmap row (the plain mmap run failed; see its log under the memlab cache)"
[[ -n "$all" ]] || fail "no all row (the residency run failed; see its log under the memlab cache)"
[[ -n "$serial" ]] || fail "no all-serial row (the serial residency run failed; see its log under the memlab cache)"
[[ -n "$pool" ]] || fail "no all-pool row (the expert pool's run failed; see its log under the memlab cache)"
for r in "$mmap" "$all" "$serial" "$pool"; do
  [[ "$(cut -d, -f14 <<< "$r")" == ok ]] || fail "a run did not finish: $r"
  [[ "$(cut -d, -f10 <<< "$r")" == yes ]] || fail "logits differ from the first run: $r"
done
w_all="$(cut -d, -f18 <<< "$all")"; w_serial="$(cut -d, -f18 <<< "$serial")"
echo "layers a decode token's eval thread blocked on the manager's reads: all-serial $w_serial, all $w_all" \
     "(ms waiting: $(cut -d, -f17 <<< "$serial") -> $(cut -d, -f17 <<< "$all"))"
awk -v s="$w_serial" 'BEGIN { exit !(s >= 1) }' ||
  fail "the serial run blocked on reads in $w_serial layers a token: it read nothing, the test proves nothing"
awk -v s="$w_serial" -v a="$w_all" 'BEGIN { exit !(a * 2 <= s) }' ||
  fail "layers blocked on reads per decode token: all-serial $w_serial, all $w_all — less than the 2x fall required"
mf_mmap="$(cut -d, -f13 <<< "$mmap")"; mf_all="$(cut -d, -f13 <<< "$all")"; mf_serial="$(cut -d, -f13 <<< "$serial")"
rd_mmap="$(cut -d, -f6 <<< "$mmap")"; rd_all="$(cut -d, -f6 <<< "$all")"
# With the overlap, the matmuls run into pages still in flight, and the kernel counts a fault
# that waits for a page under I/O as major: `all`'s engine faults are the matmul catching up
# with the lanes, not reads of its own. The 5x fall is asserted on the serial run (every read
# done before the matmuls); `all` must read 5x fewer bytes than plain mmap and fault 2x less.
awk -v m="$rd_mmap" -v a="$rd_all" 'BEGIN { exit !(a * 5 <= m) }' ||
  fail "MiB read per decode token: mmap $rd_mmap, all $rd_all — less than the 5x fall required"
awk -v m="$mf_mmap" -v a="$mf_all" 'BEGIN { exit !(a * 2 <= m) }' ||
  fail "major faults per decode token (engine threads): mmap $mf_mmap, all $mf_all — less than the 2x fall required"
echo "process-wide major faults per decode token: mmap $(cut -d, -f7 <<< "$mmap"), all $(cut -d, -f7 <<< "$all")"
awk -v m="$mf_mmap" 'BEGIN { exit !(m >= 1) }' ||
  fail "plain mmap took $mf_mmap major faults per decode token: the limit does not bind, the test proves nothing"
awk -v m="$mf_mmap" -v a="$mf_serial" 'BEGIN { exit !(a * 5 <= m) }' ||
  fail "major faults per decode token (engine threads): mmap $mf_mmap, all-serial $mf_serial — less than the 5x fall required"
# The expert pool: the cache's experts read past the page cache into the pool, so the
# engine's threads find them mapped (no faults of theirs read them), and the bytes read
# fall as with the page cache.
mf_pool="$(cut -d, -f13 <<< "$pool")"; rd_pool="$(cut -d, -f6 <<< "$pool")"
awk -v m="$rd_mmap" -v a="$rd_pool" 'BEGIN { exit !(a * 5 <= m) }' ||
  fail "MiB read per decode token: mmap $rd_mmap, all-pool $rd_pool — less than the 5x fall required"
awk -v m="$mf_mmap" -v a="$mf_pool" 'BEGIN { exit !(a * 5 <= m) }' ||
  fail "major faults per decode token (engine threads): mmap $mf_mmap, all-pool $mf_pool — less than the 5x fall required"
echo "llama_cpp_memlab_smoke: engine major faults per decode token mmap $mf_mmap -> all-serial $mf_serial, all $mf_all;" \
     "MiB read per token $rd_mmap -> $rd_all; all-pool: $mf_pool faults, $rd_pool MiB a token; logits identical"
