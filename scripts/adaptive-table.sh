#!/usr/bin/env bash
# The adaptive policy against every online policy, on both shared traces, at
# every budget of the reference curves above the token cycle (decode hit %),
# as the markdown table docs/cache.md carries. Builds the tool in Release.
#
#   scripts/adaptive-table.sh            # traces from ../shared/traces or $MOE_RESIDENCY_TRACES
set -euo pipefail
cd "$(dirname "$0")/.."
script=adaptive-table
# shellcheck source=scripts/adaptive-common.sh
. scripts/adaptive-common.sh
echo "Commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- include || echo ' (include/ modified)'), $(uname -m), $(date -u +%F)."
echo "Decode hit %; \"best\" is the best of $online at that budget; \"gap\" is the share of the"
echo "LRU→Belady gap the policy recovers. Qwen tuned the defaults; gpt-oss is unseen."
echo
echo "| trace | budget MiB | best online | adaptive | adaptive − best | gap: best | gap: adaptive | MiB read, whole run: best → adaptive |"
echo "|---|---|---|---|---|---|---|---|"
for t in qwen gptoss; do
  "$bin" replay --trace "$traces/$t.route.csv" --budgets "$budgets" --policies "$online,adaptive,belady" \
    --format csv --threads 0 |
    awk -F, -v trace="$t" -v online="$online" '
      BEGIN { n = split(online, names, ","); for (i = 1; i <= n; ++i) is_online[names[i]] = 1 }
      NR == 1 { next }
      {
        b = $1; hit[b, $2] = $4; mib[b, $2] = $5; if (!(b in seen)) { seen[b] = 1; order[++nb] = b }
      }
      END {
        for (i = 1; i <= nb; ++i) {
          b = order[i]; best = ""
          for (j = 1; j <= n; ++j) if (best == "" || hit[b, names[j]] > hit[b, best]) best = names[j]
          span = hit[b, "belady"] - hit[b, "lru"]
          printf "| %s | %s | %s %.2f | %.2f | %+.2f | %.0f%% | %.0f%% | %.0f → %.0f |\n", trace, b, best, hit[b, best],
            hit[b, "adaptive"], hit[b, "adaptive"] - hit[b, best], 100 * (hit[b, best] - hit[b, "lru"]) / span,
            100 * (hit[b, "adaptive"] - hit[b, "lru"]) / span, mib[b, best], mib[b, "adaptive"]
        }
      }'
done
