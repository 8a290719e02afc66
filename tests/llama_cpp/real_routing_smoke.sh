#!/usr/bin/env bash
# CTest llama_cpp_real_routing_smoke: stock llama.cpp driven by a recorded trace's routing,
# end to end, on a small trace-shaped model.
#
#   real_routing_smoke.sh TOOLS_DIR WORKDIR
#
# The trace is the phone's Qwen3-30B-A3B trace (../shared/traces/qwen.route.csv, or
# $MOE_RESIDENCY_TRACES): its real routing (128 experts, top-6, 28 prompt and 128 decode
# tokens) of its first 8 layers, with each layer's expert bytes scaled to a 256-wide model's
# and the Q4_K_M mix kept (2 654 208 -> 110 592, q4_K; 3 059 712 -> 127 488, q6_K down). Checks:
# - moe-lab-model --shape-from writes a model whose layers have exactly those expert bytes;
# - forced routing recorded back (--trace-out) equals the source trace's expert columns;
# - the logits are identical across configurations under the same forced routing (stock through
#   the forcing observer, the observer, exact+cache, the pool, the trace oracle's reads);
# - live = replay: the manager's decode hit % and MiB missed equal `moe-residency replay
#   --decode-only` on the run's own recorded trace, for lru and the adaptive policy, and in the
#   pool (no predicted reads: every read is demanded, so nothing is late);
# - a model of another MoE shape is refused with both shapes named.
# Without the traces it skips loudly (exit 77), and fails under CI=true.
set -uo pipefail
tools="${1:?usage: real_routing_smoke.sh TOOLS_DIR WORKDIR}"
work="${2:?usage: real_routing_smoke.sh TOOLS_DIR WORKDIR}"
fail() { echo "llama_cpp_real_routing_smoke FAILED: $*"; exit 1; }
traces="${MOE_RESIDENCY_TRACES:-$(cd "$(dirname "$0")/../../.." && pwd)/shared/traces}"
src="$traces/qwen.route.csv"
if [[ ! -f "$src" ]]; then
  [[ "${CI:-}" == true ]] && fail "the real trace $src is missing and CI=true; set MOE_RESIDENCY_TRACES"
  echo "####### llama_cpp_real_routing_smoke: SKIPPED: no real trace at $src (set MOE_RESIDENCY_TRACES) #######"
  exit 77
fi
run="$tools/moe-lab-run" model="$tools/moe-lab-model" cli="$tools/moe-residency"
mkdir -p "$work" && cd "$work" || fail "cannot use $work"
rm -f ./*.gguf ./*.csv ./*.out ./*.err

# The small trace: the first 8 layers (0-5 with q6_K down, 6-7 q4_K), bytes scaled, the routing rows as recorded.
# A model of 8 layers computes its last layer of the prompt for the output row only, as the
# whole model did its layer 47: layer 7 keeps the prompt rows of the steps layer 47 routed
# (what moe_residency::first_layers does).
awk -F, -v OFS=, '
  FNR == NR { if ($2 == 0 && $4 == 47) out[$3] = 1; next }
  function scaled(b) { return b == 2654208 ? 110592 : b == 3059712 ? 127488 : b }
  /^# route_trace/ { print; next }
  /^# model=/ { sub(/n_layer=[0-9]+/, "n_layer=8"); print; next }
  /^# layer=/ { split($0, f, /[ =]/); if (f[3] + 0 >= 8) next
                sub(/expert_bytes=[0-9]+/, "expert_bytes=" scaled(f[5])); sub(/dense_bytes=[0-9]+/, "dense_bytes=0")
                print; next }
  /^turn,/ { print; next }
  $4 < 8 && !($2 == 0 && $4 == 7 && !($3 in out)) { $9 = scaled($9); print }' "$src" "$src" > small.route.csv || fail "writing small.route.csv"
grep -q '^# layer=5 expert_bytes=127488 ' small.route.csv && grep -q '^# layer=6 expert_bytes=110592 ' small.route.csv ||
  fail "small.route.csv: the layers' bytes were not scaled as expected"

"$model" --shape-from small.route.csv --out small.gguf > model.out 2> model.err || { cat model.err; fail "moe-lab-model exited $?"; }
cat model.out
grep -q '^shape from small.route.csv: qwen3moe, 8 layers x 128 experts, top-6, embedding 256, expert width 256' model.out ||
  fail "moe-lab-model did not build the trace's shape"

# A run: NAME then moe-lab-run's options; its stdout in NAME.out, its recorded trace in NAME.route.csv.
lab() {
  local name="$1"; shift
  "$run" --model small.gguf --route-from small.route.csv --threads 1 "$@" > "$name.out" 2> "$name.err" ||
    { cat "$name.err"; fail "$name: moe-lab-run exited $?"; }
}
digest() { sed -n 's/^logits: fnv1a64 \([0-9a-f]*\) over .*/\1/p' "$1.out"; }
experts() { grep -v '^#' "$1" | cut -d, -f2-6; }  # phase,step,layer,slot,expert

budget=24  # MiB: about 200 of the 1024 experts; a token routes 8 layers x 6 slots (5.6 MiB)
lab observer --trace-out observer.route.csv
lab stock --no-observer
lab cache --residency exact,cache --residency-budget $budget --residency-when-fits act --trace-out cache.route.csv
lab adaptive --residency exact,cache --policy adaptive --residency-budget $budget --residency-when-fits act \
  --trace-out adaptive.route.csv
lab pool --residency exact,cache --pool --residency-budget $budget --residency-when-fits act --trace-out pool.route.csv
lab oracle --residency all --predictor oracle:0.886 --residency-budget $budget --residency-when-fits act \
  --trace-out oracle.route.csv

grep -q '^routing forced from small.route.csv: .* (28 prompt, 128 decode tokens; the trace has 28 and 128)$' observer.out ||
  fail "the observer run did not say the routing was forced over the trace's tokens"

# Recorded back, the source's experts, row by row.
[[ "$(experts observer.route.csv)" == "$(experts small.route.csv)" ]] ||
  fail "the routing recorded back differs from the source trace's expert columns"

# The same logits in every configuration (the routing forced the same).
ref="$(digest observer)"
[[ -n "$ref" ]] || fail "no logits digest in observer.out"
for name in stock cache adaptive pool oracle; do
  [[ "$(digest "$name")" == "$ref" ]] || fail "$name's logits differ from the observer run's ($(digest "$name") vs $ref)"
done

# Live = replay, decode-only, on the run's own recorded trace.
for name in cache adaptive pool; do
  [[ "$(experts "$name.route.csv")" == "$(experts small.route.csv)" ]] || fail "$name: recorded routing differs"
  line="$(grep '^residency:' "$name.out")"
  re=' cache ([a-z0-9]+) ([0-9.]+) MiB ([0-9.]+)% hit \(([0-9.]+) MiB missed\)'
  [[ "$line" =~ $re ]] || fail "$name: no cache figures in '$line'"
  policy="${BASH_REMATCH[1]}" live_hit="${BASH_REMATCH[3]}" live_mib="${BASH_REMATCH[4]}"
  "$cli" replay --trace "$name.route.csv" --budgets $budget --policies "$policy" --decode-only --format csv \
    > "$name.replay.csv" || fail "$name: moe-residency replay exited $?"
  replay="$(sed -n 2p "$name.replay.csv")"
  IFS=, read -r _ _ rhit rmib _ <<< "$replay"
  echo "$name ($policy): live $live_hit% hit, $live_mib MiB missed; replay $rhit%, $rmib MiB a token over 128 tokens"
  awk -v a="$live_hit" -v b="$rhit" 'BEGIN { d = a - b; exit !(d < 0.01 && d > -0.01) }' ||
    fail "$name: live decode hit $live_hit% but the replay's $rhit%"
  awk -v a="$live_mib" -v b="$rmib" 'BEGIN { r = b * 128; d = a - r; exit !(r > 0 && d < 0.1 && d > -0.1) }' ||
    fail "$name: live $live_mib MiB missed but the replay's $rmib MiB a token x 128"
done
[[ "$(sed -n 2p cache.replay.csv | cut -d, -f3)" != "$(sed -n 2p adaptive.replay.csv | cut -d, -f3)" ]] ||
  echo "note: lru and adaptive hit the same here"

# The oracle's predictions: named in the summary, and planned reads.
grep -q '^residency: .* predicted (oracle:0.886) issued [1-9]' oracle.out || fail "the oracle run issued no predicted read"

# Another MoE shape: refused with both shapes named, before any run.
"$model" --arch qwen3moe --layers 8 --experts 64 --k 4 --out other.gguf > /dev/null 2>&1 || fail "writing other.gguf"
"$run" --model other.gguf --route-from small.route.csv --threads 1 > other.out 2> other.err && fail "another shape ran"
grep -qF "forced routing from small.route.csv: the trace is 8 layers x 128 experts, top-6 but the model is 8 layers x 64 experts, top-4; expected the same MoE shape" other.err ||
  { cat other.err; fail "the shape mismatch was not refused naming both shapes"; }
echo "llama_cpp_real_routing_smoke: passed"
