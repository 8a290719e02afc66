#!/usr/bin/env bash
# CTest llama_cpp_moe_run_smoke: moe-run end to end on a small random MoE GGUF
# with a text vocabulary, written as one file and as 3 splits.
#
#   moe_run_smoke.sh MOE_RUN MOE_LAB_MODEL WORKDIR
#
# - --compare: residency off, then on; the texts must be identical (and it says so);
# - the split model's text is the single file's, with residency on;
# - the summary line's fields parse: read MiB/token is 0 when the model is
#   resident (in the page cache, no limit) and > 0 in a memory cgroup smaller
#   than the model (root and the v1 or v2 memory controller; skipped loudly
#   otherwise, a failure with CI=true), with the page cache and with --pool;
# - the refusals: a bad --residency, a bad --budget, --chat without a chat
#   template, --pool without the cache, a layer-partition --policy, --policy without the cache, --no-mmap, a dense (non-MoE) model, a budget that cannot fit the memory limit, a split
#   that is not the first, RLIMIT_MEMLOCK too low (root without CAP_IPC_LOCK,
#   through setpriv);
# - --repack (llama.cpp repacks a model's q4_K layers, not its f16 ones): the repacked experts left
#   to llama.cpp and named, the rest managed (under the limit too), the text stock's; every expert
#   repacked: nothing to manage, said why, stock.
set -uo pipefail
run="${1:?usage: moe_run_smoke.sh MOE_RUN MOE_LAB_MODEL WORKDIR}"
lab_model="${2:?usage: moe_run_smoke.sh MOE_RUN MOE_LAB_MODEL WORKDIR}"
work="${3:?usage: moe_run_smoke.sh MOE_RUN MOE_LAB_MODEL WORKDIR}"
fail() { echo "llama_cpp_moe_run_smoke FAILED: $*"; exit 1; }
mkdir -p "$work" && cd "$work" || fail "cannot use $work"
rm -f ./*.gguf ./*.out ./*.err

shape=(--arch qwen3moe --layers 4 --experts 64 --k 4 --embd 512 --expert-ff 512 --expert-type q4_K --text-vocab)
"$lab_model" "${shape[@]}" --out one.gguf 2>/dev/null || fail "writing one.gguf"
"$lab_model" "${shape[@]}" --out three-00001-of-00003.gguf --splits 3 2>/dev/null ||
  fail "writing three-*-of-00003.gguf"
[[ -f three-00002-of-00003.gguf && -f three-00003-of-00003.gguf ]] || fail "the splits are not all there"
common=(-p "The residency of experts" -n 24 --ignore-eos --threads 2)

# --compare on the single file: both summaries, the ratio, identical texts.
"$run" -m one.gguf "${common[@]}" --compare > compare.out 2> compare.err || { cat compare.err; fail "--compare exited $?"; }
cat compare.err
grep -Eq '^moe-run: residency off, read-ahead [0-9]+ KiB \(the device.s\): prompt ' compare.err ||
  fail "--compare printed no residency-off summary at the device's read-ahead"
grep -q '^moe-run: residency dense,exact,cache.*: prompt ' compare.err || fail "--compare printed no residency-on summary"
grep -Eq '^moe-run: compare: decode [0-9.]+x with residency dense,exact,cache against the best stock run \(read-ahead [0-9]+ KiB \(the (device|kernel)'"'"'s( default)?\)\)(; [0-9.]+x stock at read-ahead [0-9]+ KiB \(the (device|kernel)'"'"'s( default)?\))?; texts identical \(24 tokens\)$' compare.err ||
  fail "--compare did not say the texts are identical against the best stock run"
# Each run streamed its text: one line a run (stock at the device's read-ahead, at the kernel's
# default when root may set it and the device's differs, then managed), all the same.
runs=2
dev_ra="$(cat "/sys/dev/block/$(stat -c '%Hd:%Ld' one.gguf)/queue/read_ahead_kb" 2>/dev/null ||
  cat "/sys/dev/block/$(stat -c '%Hd:%Ld' one.gguf)/../queue/read_ahead_kb" 2>/dev/null)"
if [[ $(id -u) -eq 0 && -n "$dev_ra" && "$dev_ra" != 128 ]]; then
  runs=3
  grep -q '^moe-run: residency off, read-ahead 128 KiB (the kernel.s default): prompt ' compare.err ||
    fail "--compare as root did not run stock at the kernel's default read-ahead"
  now_ra="$(cat "/sys/dev/block/$(stat -c '%Hd:%Ld' one.gguf)/queue/read_ahead_kb" 2>/dev/null ||
    cat "/sys/dev/block/$(stat -c '%Hd:%Ld' one.gguf)/../queue/read_ahead_kb" 2>/dev/null)"
  [[ "$now_ra" == "$dev_ra" ]] || fail "--compare left read_ahead_kb at $now_ra, not the device's $dev_ra"
fi
[[ "$(wc -l < compare.out)" -eq $runs ]] || fail "--compare wrote $(wc -l < compare.out) lines of text, expected $runs"
[[ "$(sort -u compare.out | wc -l)" -eq 1 ]] || fail "the texts differ"
[[ -n "$(sed -n 1p compare.out)" ]] || fail "no text generated"

# The split model, residency on (acting: --budget makes the cache; the model fits, so it stands down
# unless forced, and the text must be the same either way).
"$run" -m three-00001-of-00003.gguf "${common[@]}" > split.out 2> split.err || { cat split.err; fail "split model exited $?"; }
cat split.err
[[ "$(cat split.out)" == "$(sed -n 1p compare.out)" ]] || fail "the split model's text differs from the single file's"
grep -q '^moe-run: managing 4 MoE layers x 64 experts (top-4) of three-00001-of-00003.gguf' split.err ||
  fail "no 'managing' line for the split model"

# The summary line's fields.
line="$(grep '^moe-run: residency dense,exact,cache' split.err)"
re='prompt ([0-9]+) tokens ([0-9.]+) tok/s, decode ([0-9]+) tokens ([0-9.]+) tok/s, p50 ([0-9.]+) ms, p90 ([0-9.]+) ms, ([0-9.]+) MiB read/token, expert hit ([0-9.]+%|n/a), pinned ([0-9]+) MiB, ([0-9.]+) major faults/token'
[[ "$line" =~ $re ]] || fail "summary line does not parse: $line"
[[ "${BASH_REMATCH[3]}" -eq 23 ]] || fail "decode tokens ${BASH_REMATCH[3]}, expected 23 (24 generated, the first from the prompt)"
awk -v a="${BASH_REMATCH[5]}" -v b="${BASH_REMATCH[6]}" 'BEGIN { exit !(a > 0 && b >= a) }' || fail "p50/p90 implausible: $line"
[[ "${BASH_REMATCH[7]}" == "0.0" ]] || fail "read ${BASH_REMATCH[7]} MiB/token with the model resident, expected 0.0"

# A refusal or fall-back: one line naming what and why.
refuse() {  # refuse NAME EXPECTED-SUBSTRING ARGS...
  local name="$1" want="$2"; shift 2
  "$@" > "refuse-$name.out" 2> "refuse-$name.err"
  local rc=$?
  grep -qF -- "$want" "refuse-$name.err" || { cat "refuse-$name.err"; fail "$name: no '$want' (exit $rc)"; }
  echo "refusal $name (exit $rc): $(grep -F -- "$want" "refuse-$name.err" | head -1)"
  return "$rc"
}

# llama.cpp's CPU repacking (--repack): a model whose layers 0-1 have f16 experts (never repacked)
# and layers 2-3 q4_K ones (repacked on AVX2 x86 and on ARM with the dot-product extensions): the
# repacked ones are left to llama.cpp, said which, the rest managed; the text is stock's with the same
# load. Every expert repacked: nothing to manage, said why, and it runs stock.
if grep -qw avx2 /proc/cpuinfo; then
  mixed=(--arch qwen3moe --layers 4 --experts 16 --k 4 --embd 256 --expert-ff 256 --text-vocab)
  "$lab_model" "${mixed[@]}" --expert-type f16,f16,q4_K,q4_K --out mixed.gguf 2>/dev/null ||
    fail "writing mixed.gguf"
  "$run" -m mixed.gguf "${common[@]}" --repack --budget 4 --compare > repack.out 2> repack.err ||
    { cat repack.err; fail "--repack --compare exited $?"; }
  cat repack.err
  grep -Eq '^moe-run: left to llama.cpp, not in the file.s mapping: 6 expert tensors \([0-9.]+ MiB\) of layers 2-3 repacked by the CPU backend \(CPU_REPACK\)$' repack.err ||
    fail "--repack: no line saying which expert tensors are left to llama.cpp"
  grep -q '^moe-run: managing 2 MoE layers x 16 experts (top-4) of mixed.gguf: experts 12 MiB, the rest (dense and left to llama.cpp) ' repack.err ||
    fail "--repack: the 'managing' line does not count the 2 managed layers' 12 MiB of experts"
  grep -Eq '^moe-run: compare: decode [0-9.]+x with residency dense,exact,cache against the best stock run .*; texts identical \(24 tokens\)$' repack.err ||
    fail "--repack: the texts differ"
  refuse repack-all "moe-run: residency off: mmap_residency: no expert tensor is in the model's file mapping: 12 expert tensors" \
    "$run" -m one.gguf "${common[@]}" --repack || fail "--repack with every expert repacked did not run stock"
  grep -q "of layers 0-3 repacked by the CPU backend (CPU_REPACK); nothing to manage" refuse-repack-all.err ||
    fail "--repack with every expert repacked: the refusal does not say where they are"
  "$run" -m one.gguf "${common[@]}" --repack --residency off > repack-stock.out 2>/dev/null || fail "--repack --residency off exited $?"
  [[ "$(cat refuse-repack-all.out)" == "$(cat repack-stock.out)" ]] || fail "--repack's stock fall-back: its text differs"
else
  [[ "${CI:-}" == true ]] && fail "CI=true but this CPU has no AVX2: llama.cpp repacks nothing, the --repack runs cannot be checked"
  echo "####### moe_run_smoke: SKIPPED the --repack runs: no AVX2, llama.cpp would repack nothing #######"
fi

# Refusals, one line each, naming what and why.
refuse residency "--residency: 'bogus' in 'bogus'; expected all, off, or a comma list of dense, exact, predicted, cache" \
  "$run" -m one.gguf "${common[@]}" --residency bogus && fail "a bad --residency exited 0"
refuse budget "--budget (auto, or MiB): '-5' is out of range; expected a number in (0, 1e+09]" "$run" -m one.gguf "${common[@]}" --budget=-5 &&
  fail "a bad --budget exited 0"
refuse threads "--threads: '-1' is negative; expected a whole number from 1 to 1024" \
  "$run" -m one.gguf -p x --threads=-1 && fail "--threads -1 exited 0"
refuse seed-greedy "--seed has no effect without --temp above 0 (greedy decoding)" \
  "$run" -m one.gguf -p x --seed 3 && fail "--seed without --temp exited 0"
refuse budget-no-cache "--budget 8 with --residency exact: the budget is the cache's, and the cache is not on" \
  "$run" -m one.gguf "${common[@]}" --residency exact --budget 8 && fail "--budget without the cache exited 0"
refuse pool-no-cache "--pool with --residency exact: the pool holds the cache's experts, and the cache is not on" \
  "$run" -m one.gguf "${common[@]}" --residency exact --pool && fail "--pool without the cache exited 0"
refuse policy-partition "residency manager: cache policy 'layerlfu': a layer partition keeps top-k experts of every layer even above its budget" \
  "$run" -m one.gguf "${common[@]}" --policy layerlfu && fail "--policy layerlfu exited 0"
refuse policy-no-cache "--policy adaptive with --residency exact: the policy is the cache's, and the cache is not on" \
  "$run" -m one.gguf "${common[@]}" --residency exact --policy adaptive && fail "--policy without the cache exited 0"
refuse chat "--chat: one.gguf has no chat template (tokenizer.chat_template); drop --chat" \
  "$run" -m one.gguf "${common[@]}" --chat && fail "--chat without a template exited 0"
refuse no-mmap "moe-run: --no-mmap: llama.cpp copies the weights into memory, so there are no file pages to manage; running stock" \
  "$run" -m one.gguf "${common[@]}" --no-mmap || fail "--no-mmap did not run stock"
[[ "$(cat refuse-no-mmap.out)" == "$(sed -n 1p compare.out)" ]] || fail "--no-mmap's text differs"
"$lab_model" --arch qwen3 --layers 2 --embd 256 --text-vocab --out dense.gguf 2>/dev/null ||
  fail "writing dense.gguf (a dense qwen3)"
refuse dense "moe-run: residency off: dense.gguf: no MoE routing in the graph (a dense model): nothing to manage; running stock" \
  "$run" -m dense.gguf "${common[@]}" || fail "a dense model did not run stock"
[[ -n "$(cat refuse-dense.out)" ]] || fail "the dense model generated no text"
"$run" -m dense.gguf "${common[@]}" --residency off > dense-stock.out 2>/dev/null || fail "the dense model, residency off, exited $?"
[[ "$(cat refuse-dense.out)" == "$(cat dense-stock.out)" ]] || fail "the dense model's text differs from stock"
refuse split "split 2 of 3; expected the model's first split (its name ends in '-00001-of-00003.gguf')" \
  "$run" -m three-00002-of-00003.gguf "${common[@]}" && fail "a later split exited 0"
refuse budget-fit "MiB do not fit the memory limit of" \
  "$run" -m one.gguf "${common[@]}" --budget 100000000 && fail "a budget past the memory limit exited 0"
# Under a memory limit smaller than the model: the manager reads (bytes > 0), the text is the same.
cg=""
cleanup() { [[ -n "$cg" && -d "$cg" ]] && rmdir "$cg" 2>/dev/null; }
trap cleanup EXIT
if [[ "$(id -u)" -ne 0 ]]; then
  [[ "${CI:-}" == true ]] && fail "CI=true but not root: the memory-limit run cannot be checked"
  echo "####### moe_run_smoke: SKIPPED the memory-limit run: not root #######"; exit 0
fi
limit=$((48 * 1024 * 1024))
if [[ -f /sys/fs/cgroup/memory/memory.limit_in_bytes ]]; then
  cg="/sys/fs/cgroup/memory/moe-residency-run-smoke-$$"
  mkdir "$cg" && echo "$limit" > "$cg/memory.limit_in_bytes" || fail "cannot make the v1 cgroup $cg"
  tasks="$cg/tasks"
elif grep -qw memory /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null; then
  cg="/sys/fs/cgroup/moe-residency-run-smoke-$$"
  mkdir "$cg" && echo "$limit" > "$cg/memory.max" || fail "cannot make the v2 cgroup $cg"
  tasks="$cg/cgroup.procs"
else
  [[ "${CI:-}" == true ]] && fail "CI=true but no memory cgroup: the memory-limit run cannot be checked"
  echo "####### moe_run_smoke: SKIPPED the memory-limit run: no memory cgroup #######"; exit 0
fi
# limited NAME OPTIONS...: the split model in the cgroup, page cache dropped, with these
# options; its text must be the unlimited run's.
limited() {
  local name=$1; shift
  sync; echo 3 > /proc/sys/vm/drop_caches
  bash -c "echo \$\$ > '$tasks'; exec \"$run\" -m three-00001-of-00003.gguf ${common[*]@Q} $*" > "$name.out" 2> "$name.err" ||
    { cat "$name.err"; fail "the limited run $name ($*) exited $?"; }
  cat "$name.err"
  [[ "$(cat "$name.out")" == "$(sed -n 1p compare.out)" ]] || fail "the limited run $name ($*): its text differs"
}
limited limited --budget 8
grep -q "memory limit 48 MiB (cgroup" limited.err || fail "the limited run did not detect the 48 MiB cgroup limit"
line="$(grep '^moe-run: residency dense,exact,cache' limited.err)"
[[ "$line" =~ $re ]] || fail "summary line does not parse: $line"
awk -v r="${BASH_REMATCH[7]}" 'BEGIN { exit !(r > 0) }' || fail "read ${BASH_REMATCH[7]} MiB/token under a limit, expected > 0"
[[ "${BASH_REMATCH[9]}" -gt 0 ]] || fail "pinned ${BASH_REMATCH[9]} MiB under a limit, expected > 0"
# The adaptive policy, in the same limit: the cache pinned under its name.
limited adaptive --budget 8 --policy adaptive
grep -q '^moe-run: managing .* budget 8 MiB, policy adaptive;' adaptive.err || fail "--policy adaptive: not named in the managing line"
line="$(grep '^moe-run: residency dense,exact,cache' adaptive.err)"
[[ "$line" =~ $re ]] || fail "--policy adaptive: summary line does not parse: $line"
[[ "${BASH_REMATCH[9]}" -gt 0 ]] || fail "--policy adaptive: pinned ${BASH_REMATCH[9]} MiB under a limit, expected > 0"
# The expert pool, in the same limit: read past the page cache.
limited pool --budget 8 --pool
line="$(grep '^moe-run: residency dense,exact,cache in the expert pool: ' pool.err)"
[[ "$line" =~ $re ]] || fail "--pool: summary line does not parse: $line"
awk -v r="${BASH_REMATCH[7]}" 'BEGIN { exit !(r > 0) }' || fail "--pool: read ${BASH_REMATCH[7]} MiB/token under a limit, expected > 0"
# --repack in the same limit (the model no longer fits, so the manager acts on layers 0-1): the same
# text as stock with the same load, and experts pinned.
if [[ -f mixed.gguf ]]; then
  sync; echo 3 > /proc/sys/vm/drop_caches
  bash -c "echo \$\$ > '$tasks'; exec \"$run\" -m mixed.gguf ${common[*]@Q} --repack --budget 4" > repack-limited.out 2> repack-limited.err ||
    { cat repack-limited.err; fail "the limited run with --repack exited $?"; }
  cat repack-limited.err
  [[ "$(cat repack-limited.out)" == "$(sed -n 1p repack.out)" ]] || fail "the limited run with --repack: its text differs"
  grep -q '^moe-run: managing 2 MoE layers .* budget 4 MiB' repack-limited.err || fail "--repack under a limit: not managing with the 4 MiB budget"
  line="$(grep '^moe-run: residency dense,exact,cache: ' repack-limited.err)"
  [[ "$line" =~ $re ]] || fail "--repack: summary line does not parse: $line"
  [[ "${BASH_REMATCH[9]}" -gt 0 ]] || fail "--repack: pinned ${BASH_REMATCH[9]} MiB under a limit, expected > 0"
fi
# RLIMIT_MEMLOCK too low (root without CAP_IPC_LOCK, in the same limit): residency off, said how to
# raise it, and the stock text.
refuse memlock "RLIMIT_MEMLOCK is 0.0 MiB; raise it (ulimit -l" \
  setpriv --bounding-set=-ipc_lock --inh-caps=-ipc_lock \
  bash -c "echo \$\$ > '$tasks'; ulimit -l 0; exec \"$run\" -m one.gguf ${common[*]@Q}" ||
  fail "RLIMIT_MEMLOCK too low did not run stock"
[[ "$(cat refuse-memlock.out)" == "$(sed -n 1p compare.out)" ]] || fail "the stock fall-back's text differs"
echo "llama_cpp_moe_run_smoke passed"
