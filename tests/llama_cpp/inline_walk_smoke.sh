#!/usr/bin/env bash
# CTest llama_cpp_inline_walk_smoke: `moe-disk-lanes --inline-walk` walks the
# residency manager's inline `cache` path over a GGUF (WILLNEED on a layer's
# pinned-cache misses, then mlock on each) and counts what it pinned and read.
# On a small random qwen3moe GGUF of its own (moe-lab-model,
# synced so that POSIX_FADV_DONTNEED can drop its pages), outside any memory
# limit:
#   - a budget below one expert's slices is refused, naming the flag and the
#     expert's size; --fault-walk with it is refused too;
#   - one token, none skipped, a budget that holds every expert: every layer's
#     top-k are misses (pins = layers x k), and each pinned slice came from the
#     device (the walk drops the file's pages first): it read at least the
#     pinned bytes;
#   - three tokens, the first skipped: the file fits in the page cache, so the
#     counted tokens read nothing, and with the pinned cache holding every
#     expert, a token pins fewer than layers x k (the first token's stay);
#   - a budget of one expert: every routed expert but a repeat is a miss again.
#
#   inline_walk_smoke.sh MOE_LAB_MODEL MOE_DISK_LANES WORKDIR
set -euo pipefail
lab_model="${1:?usage: inline_walk_smoke.sh MOE_LAB_MODEL MOE_DISK_LANES WORKDIR}"
tool="${2:?usage: inline_walk_smoke.sh MOE_LAB_MODEL MOE_DISK_LANES WORKDIR}"
work="${3:?usage: inline_walk_smoke.sh MOE_LAB_MODEL MOE_DISK_LANES WORKDIR}"
fail() { echo "llama_cpp_inline_walk_smoke FAILED: $*"; exit 1; }
mkdir -p "$work"
model="$work/walk.gguf"
layers=2 k=2
"$lab_model" --arch qwen3moe --layers $layers --experts 8 --k $k --embd 256 --expert-ff 256 --expert-type q4_K \
  --out "$model" > "$work/model.log" 2>&1 || { cat "$work/model.log"; fail "moe-lab-model exited with $?"; }
sync "$model"
# Refused: a budget below one expert (the message gives the expert's MiB), and both walks at once.
if "$tool" --file "$model" --inline-walk --walk-budget-mib 0.001 > /dev/null 2> "$work/err.txt"; then
  fail "--walk-budget-mib 0.001 was accepted; expected a budget below one expert refused"
fi
grep -q -- "--walk-budget-mib: " "$work/err.txt" || fail "the refusal does not name --walk-budget-mib: $(cat "$work/err.txt")"
expert_mib="$(sed -n "s/.*one expert's slices, \([0-9.]*\) MiB.*/\1/p" "$work/err.txt")"
awk -v e="$expert_mib" 'BEGIN { exit !(e > 0) }' || fail "no expert size in the refusal: $(cat "$work/err.txt")"
if "$tool" --file "$model" --inline-walk --fault-walk --walk-budget-mib 64 > /dev/null 2>&1; then
  fail "--inline-walk with --fault-walk was accepted; expected one of them"
fi
header="budget_mib,tokens,pins_per_token,read_mib_per_token,wall_ms,cpu_ms,sys_ms,off_cpu_ms_per_mib,sys_ms_per_mib"
walk() {  # ARGS...: the walk's one data row; checks the header
  local out
  out="$("$tool" --file "$model" --inline-walk --walk-gap-us 0 "$@")" || fail "moe-disk-lanes --inline-walk $* exited with $?"
  echo "$out" >&2
  [[ "$(head -1 <<< "$out")" == "$header" ]] || fail "header '$(head -1 <<< "$out")'; expected '$header'"
  tail -1 <<< "$out"
}
IFS=, read -r _ n pins rd _ <<< "$(walk --walk-budget-mib 64 --walk-tokens 1 --walk-skip 0)"
[[ $n == 1 ]] || fail "tokens $n; expected 1"
awk -v p="$pins" -v w=$((layers * k)) 'BEGIN { exit !(p == w) }' || fail "pinned $pins a token cold; expected $((layers * k)) (layers x k)"
awk -v r="$rd" -v p="$pins" -v e="$expert_mib" 'BEGIN { exit !(r >= p * e - 0.05) }' ||
  fail "read $rd MiB for $pins pins of $expert_mib MiB; expected at least the pinned bytes (are the file's pages dropped?)"
IFS=, read -r _ n pins rd _ <<< "$(walk --walk-budget-mib 64 --walk-tokens 3 --walk-skip 1)"
[[ $n == 2 ]] || fail "tokens $n; expected 2 (3 walked, 1 skipped)"
awk -v r="$rd" 'BEGIN { exit !(r == 0) }' || fail "the cached tokens read $rd MiB; expected 0 (the file fits in memory)"
awk -v p="$pins" -v w=$((layers * k)) 'BEGIN { exit !(p < w) }' ||
  fail "pinned $pins a token with every expert's room; expected fewer than $((layers * k)) (the first token's stay pinned)"
one_budget=$(awk -v e="$expert_mib" 'BEGIN { printf "%.6f", e + 0.00001 }')  # above the printed figure's rounding
IFS=, read -r _ n one _ <<< "$(walk --walk-budget-mib "$one_budget" --walk-tokens 3 --walk-skip 1)"
awk -v p="$one" -v q="$pins" 'BEGIN { exit !(p > q) }' ||
  fail "pinned $one a token with room for one expert, $pins with room for all; expected more misses with less room"
rm -f "$model"
echo "llama_cpp_inline_walk_smoke: $((layers * k)) pins a token cold, at least their $expert_mib MiB each read; warm nothing read, $pins pins a token with room for all, $one with room for one"
