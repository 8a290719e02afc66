#!/usr/bin/env bash
# CTest llama_cpp_path_cost_smoke: `moe-disk-lanes --path-cost` measures the two
# read paths it names. On a 64 MiB file of its own (written and synced, so that
# POSIX_FADV_DONTNEED can drop its pages), 64 KiB slices, 8 MiB per path:
#   - manager (MADV_RANDOM, WILLNEED + POPULATE_READ of the slice) reads no more
#     than its slices: read_mib <= requests x 64 KiB + 1 MiB (the process's own
#     pages read meanwhile, if any), and at least half of that (random slices
#     rarely overlap); a read-around window per request (16 MiB on this machine
#     kind: read_ahead_kb 8192, doubled) would read far more;
#   - faults (FADV_SEQUENTIAL, pages touched) reads around each fault: more
#     than 2 slices per request;
#   - both report a CPU cost per MiB > 0, a wall time no shorter than the CPU
#     time, and the time off the CPU per MiB as (wall - cpu) / MiB.
#
#   path_cost_smoke.sh MOE_DISK_LANES WORKDIR
set -euo pipefail
tool="${1:?usage: path_cost_smoke.sh MOE_DISK_LANES WORKDIR}"
work="${2:?usage: path_cost_smoke.sh MOE_DISK_LANES WORKDIR}"
fail() { echo "llama_cpp_path_cost_smoke FAILED: $*"; exit 1; }
mkdir -p "$work"
file="$work/path-cost.bin"
head -c $((64 << 20)) /dev/urandom > "$file"
sync "$file"
out="$("$tool" --file "$file" --path-cost 64 --path-read-mib 8)" || fail "moe-disk-lanes exited with $?"
echo "$out"
[[ "$(head -1 <<< "$out")" == "path,slice_kib,requests,read_mib,cpu_ms,cpu_ms_per_mib,wall_ms,off_cpu_ms_per_mib" ]] || fail "header '$(head -1 <<< "$out")'"
row() { awk -F, -v p="$1" 'NR > 1 && $1 == p' <<< "$out"; }
m="$(row manager)"; f="$(row faults)"
[[ -n "$m" && -n "$f" ]] || fail "expected a manager row and a faults row"
IFS=, read -r _ kib mreq mmib mcpu mcost mwall moff <<< "$m"
IFS=, read -r _ _ freq fmib fcpu fcost fwall foff <<< "$f"
awk -v r="$mmib" 'BEGIN { exit !(r >= 8) }' || fail "manager read $mmib MiB; expected >= 8 (are the file's pages dropped?)"
awk -v r="$fmib" 'BEGIN { exit !(r >= 8) }' || fail "faults read $fmib MiB; expected >= 8"
awk -v r="$mmib" -v n="$mreq" -v k="$kib" 'BEGIN { s = n * k / 1024; exit !(r <= s + 1 && r >= s / 2) }' ||
  fail "manager read $mmib MiB in $mreq requests of $kib KiB; expected its slices' bytes (no read-around)"
awk -v r="$fmib" -v n="$freq" -v k="$kib" 'BEGIN { exit !(r / n > 2 * k / 1024) }' ||
  fail "faults read $fmib MiB in $freq requests of $kib KiB; expected a read-around window per fault (> 2 slices)"
awk -v a="$mcost" -v b="$fcost" 'BEGIN { exit !(a > 0 && b > 0) }' || fail "CPU per MiB $mcost, $fcost; expected > 0"
# The wall holds the CPU; the time off it per MiB is (wall - cpu) / MiB, to the printed digits.
for p in "$mcpu $mwall $moff $mmib" "$fcpu $fwall $foff $fmib"; do
  read -r c w o r <<< "$p"
  awk -v c="$c" -v w="$w" -v o="$o" -v r="$r" 'BEGIN { e = (w > c ? w - c : 0) / r; exit !(w >= c - 0.2 && o >= 0 && (o - e) ^ 2 < (0.001 + 0.2 / r) ^ 2) }' ||
    fail "cpu $c ms, wall $w ms, off the CPU $o ms/MiB over $r MiB; expected wall >= cpu and (wall - cpu) / MiB"
done
rm -f "$file"
echo "llama_cpp_path_cost_smoke: manager $mcost ms/MiB ($mreq requests), faults $fcost ms/MiB ($freq requests)"
