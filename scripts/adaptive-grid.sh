#!/usr/bin/env bash
# How the adaptive policy's defaults were chosen, as a command: every setting
# of a grid (window, margin, objective, first leader, scope) replayed on both
# shared traces at every budget of the reference curves above the token cycle,
# scored on ONE trace (the tuning trace) by the number of budgets at which its
# decode hit % is within 0.1 point of the best of the eight online rules, ties
# to the smaller worst loss. The other trace is reported beside it, unseen by
# the choice. Builds the tool in Release; about two minutes on two cores.
#
#   scripts/adaptive-grid.sh                 # tune on qwen, gptoss unseen; the best 15 settings
#   scripts/adaptive-grid.sh --tune gptoss   # the other way round
#   scripts/adaptive-grid.sh --all           # every setting, not the best 15
set -euo pipefail
cd "$(dirname "$0")/.."
tune=qwen
top=15
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tune)
      [[ $# -ge 2 && ( "$2" == qwen || "$2" == gptoss ) ]] || { echo "adaptive-grid: --tune takes qwen or gptoss" >&2; exit 2; }
      tune=$2; shift 2 ;;
    --all) top=0; shift ;;
    *) echo "adaptive-grid: unknown argument '$1'; expected --tune qwen|gptoss or --all" >&2; exit 2 ;;
  esac
done
unseen=$([[ $tune == qwen ]] && echo gptoss || echo qwen)
script=adaptive-grid
# shellcheck source=scripts/adaptive-common.sh
. scripts/adaptive-common.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The best online rule's decode hit % per budget, per trace.
for t in qwen gptoss; do
  "$bin" replay --trace "$traces/$t.route.csv" --budgets "$budgets" --policies "$online" --format csv --threads 0 |
    awk -F, -v t="$t" 'NR > 1 { if (!(($1) in best) || $4 > best[$1]) best[$1] = $4 }
      END { for (b in best) print t "," b "," best[b] }' >> "$work/best.csv"
done

# Every setting on both traces: one line per (setting, trace, budget).
n=0
for scope in global layer; do
  for objective in bytes misses; do
    for first in cycle layerlfu lfu; do
      for window in 0 1 2 4 8 16 32 64 128; do
        for margin in 0 0.02 0.05 0.1 0.2; do
          setting="$scope $objective $first $window $margin"
          for t in qwen gptoss; do
            "$bin" replay --trace "$traces/$t.route.csv" --budgets "$budgets" --policies adaptive --format csv \
              --adaptive-scope "$scope" --adaptive-objective "$objective" --adaptive-first "$first" \
              --adaptive-window "$window" --adaptive-margin "$margin" |
              awk -F, -v s="$setting" -v t="$t" 'NR > 1 { print s "," t "," $1 "," $4 }' >> "$work/cells.csv"
          done
          n=$((n + 1))
        done
      done
    done
  done
done

echo "Commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- include examples || echo ' (modified)'), $(uname -m), $(date -u +%F)."
echo "$n settings; budgets $budgets MiB; decode hit %. Chosen on $tune; $unseen is unseen."
echo "\"within\": budgets at which adaptive is within 0.1 point of the best of $online;"
echo "\"worst\": its largest loss against that best (points). Defaults: global bytes cycle 8 0.1."
echo
echo "| rank | scope | objective | first | window | margin | $tune within | $tune worst | $unseen within | $unseen worst |"
echo "|---|---|---|---|---|---|---|---|---|---|"
awk -F, -v tune="$tune" -v unseen="$unseen" '
  FNR == NR { best[$1, $2] = $3; next }
  {
    d = $4 - best[$2, $3]; key = $1
    if (!(key in seen)) { seen[key] = 1; order[++n] = key }
    within[key, $2] += (d >= -0.1); if (!((key, $2) in worst) || d < worst[key, $2]) worst[key, $2] = d
  }
  END {
    for (i = 1; i <= n; ++i) {
      k = order[i]
      printf "%d\t%.4f\t%s\t%d\t%+.2f\t%d\t%+.2f\n", within[k, tune], worst[k, tune], k, within[k, tune], worst[k, tune],
        within[k, unseen], worst[k, unseen]
    }
  }' "$work/best.csv" "$work/cells.csv" |
  sort -t$'\t' -k1,1nr -k2,2gr -s |
  awk -F'\t' -v top="$top" '
    { split($3, s, " "); r = NR
      if (top == 0 || r <= top || $3 == "global bytes cycle 8 0.1")
        printf "| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r, s[1], s[2], s[3], s[4], s[5], $4, $5, $6, $7 }'
