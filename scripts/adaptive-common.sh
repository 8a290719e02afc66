# shellcheck shell=bash disable=SC2034,SC2154  # sets variables for its callers; $script is theirs
# Sourced by scripts/adaptive-table.sh and scripts/adaptive-grid.sh: the two
# shared traces (from ../shared/traces or $MOE_RESIDENCY_TRACES), the tool
# built in Release, and the budgets and online rules both compare at.
# Expects $script (the caller's name, for messages) and the repository root
# as the working directory.
traces=${MOE_RESIDENCY_TRACES:-../shared/traces}
for t in qwen gptoss; do
  [[ -f "$traces/$t.route.csv" ]] || { echo "$script: $traces/$t.route.csv not found; set MOE_RESIDENCY_TRACES" >&2; exit 2; }
done
cmake --preset release >/dev/null
cmake --build --preset release --target moe_residency_cli >/dev/null
bin=build/release/bin/moe-residency
budgets=1000,1500,2000,2500,3000,4000,6000,8000
online=lru,lfu,layer,layerlfu,arc,s3fifo,sieve,cycle
