#!/usr/bin/env bash
# CTest llama_cpp_fault_walk_smoke: `moe-disk-lanes --fault-walk` walks a GGUF's
# pages as llama.cpp's decode faults them and counts what it read. On a small
# random qwen3moe GGUF of its own (moe-lab-model, synced so that
# POSIX_FADV_DONTNEED can drop its pages), outside any memory limit:
#   - one token, none skipped: every page it touched came from the device (the
#     walk drops the file's pages first), so it read at least the MiB it walked;
#     it walked something, and no more than the file;
#   - three tokens, the first skipped: the file now fits in the page cache, so
#     the counted tokens read nothing and fault nothing (what --walk-skip leaves
#     out is what fills the cache);
#   - --walk-pin-dense locks the non-expert tensors: pinned_dense_mib > 0, below
#     the file's size.
#
#   fault_walk_smoke.sh MOE_LAB_MODEL MOE_DISK_LANES WORKDIR
set -euo pipefail
lab_model="${1:?usage: fault_walk_smoke.sh MOE_LAB_MODEL MOE_DISK_LANES WORKDIR}"
tool="${2:?usage: fault_walk_smoke.sh MOE_LAB_MODEL MOE_DISK_LANES WORKDIR}"
work="${3:?usage: fault_walk_smoke.sh MOE_LAB_MODEL MOE_DISK_LANES WORKDIR}"
fail() { echo "llama_cpp_fault_walk_smoke FAILED: $*"; exit 1; }
mkdir -p "$work"
model="$work/walk.gguf"
"$lab_model" --arch qwen3moe --layers 2 --experts 8 --k 2 --embd 256 --expert-ff 256 --expert-type q4_K \
  --out "$model" > "$work/model.log" 2>&1 || { cat "$work/model.log"; fail "moe-lab-model exited with $?"; }
sync "$model"
size_mib=$(awk -v b="$(stat -c %s "$model")" 'BEGIN { printf "%.3f", b / 1048576 }')
header="pinned_dense_mib,tokens,walked_mib_per_token,read_mib_per_token,wall_ms,cpu_ms,sys_ms,majflt,off_cpu_ms_per_mib,sys_ms_per_mib,mib_per_fault"
walk() {  # ARGS...: the walk's one data row; checks the header
  local out
  out="$("$tool" --file "$model" --fault-walk --walk-gap-us 0 "$@")" || fail "moe-disk-lanes --fault-walk $* exited with $?"
  echo "$out" >&2
  [[ "$(head -1 <<< "$out")" == "$header" ]] || fail "header '$(head -1 <<< "$out")'; expected '$header'"
  tail -1 <<< "$out"
}
IFS=, read -r pin n walked rd _ _ _ flt _ _ _ <<< "$(walk --walk-tokens 1 --walk-skip 0)"
[[ $n == 1 && $pin == 0.0 ]] || fail "tokens $n, pinned $pin; expected 1 token and nothing pinned"
awk -v w="$walked" -v s="$size_mib" 'BEGIN { exit !(w > 0 && w <= s) }' || fail "walked $walked MiB of a $size_mib MiB file; expected > 0 and <= the file"
awk -v w="$walked" -v r="$rd" 'BEGIN { exit !(r >= w - 0.05) }' ||
  fail "read $rd MiB for $walked MiB walked; expected at least the pages touched (are the file's pages dropped?)"
IFS=, read -r _ n _ rd _ _ _ flt _ _ _ <<< "$(walk --walk-tokens 3 --walk-skip 1)"
[[ $n == 2 ]] || fail "tokens $n; expected 2 (3 walked, 1 skipped)"
awk -v r="$rd" -v f="$flt" 'BEGIN { exit !(r == 0 && f == 0) }' ||
  fail "the cached tokens read $rd MiB with $flt faults; expected 0 and 0 (the file fits in memory)"
IFS=, read -r pin _ <<< "$(walk --walk-tokens 1 --walk-skip 0 --walk-pin-dense)"
awk -v p="$pin" -v s="$size_mib" 'BEGIN { exit !(p > 0 && p < s) }' || fail "pinned $pin MiB of $size_mib; expected > 0 and < the file"
rm -f "$model"
echo "llama_cpp_fault_walk_smoke: walked $walked MiB a token of a $size_mib MiB GGUF, read at least that cold, nothing warm; dense $pin MiB locked"
