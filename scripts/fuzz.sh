#!/usr/bin/env bash
# Runs one libFuzzer target for a bounded time:
#   scripts/fuzz.sh TARGET SECONDS      TARGET: fuzz_trace_csv, fuzz_trace_binary, fuzz_session,
#                                       fuzz_timing_config, fuzz_token_metrics, fuzz_storage_curve,
#                                       fuzz_oracle_profile, fuzz_lab_cells, fuzz_cli_specs,
#                                       fuzz_gguf_expert_map (needs llama.cpp, below), or all
# MOE_RESIDENCY_FUZZ_JOBS=N runs N targets at once (default 1; CI runs 2, one per core).
# MOE_RESIDENCY_FUZZ_SMALL_SECONDS=S gives the small configuration parsers (the targets
# from fuzz_timing_config to fuzz_cli_specs above) S seconds each in `all` instead of SECONDS.
# Builds the targets with clang (-fsanitize=fuzzer,address,undefined) in build/fuzz,
# writes the seed corpora there (from $MOE_RESIDENCY_TRACES or ../shared/traces and
# the unit tests' small trace), keeps the growing corpus in build/fuzz/corpus/TARGET,
# and leaves any crashing input in build/fuzz/findings/TARGET. Exits non-zero on a
# finding. Appends the time spent to build/fuzz/fuzz-time.log.
# With MOE_RESIDENCY_LLAMA_CPP_PREFIX set to an installed llama.cpp (the prefix
# `scripts/fetch-llama-cpp.sh --install` prints), fuzz_gguf_expert_map is built
# against its ggml and is part of `all`; without it that target is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

targets_small=(fuzz_timing_config fuzz_token_metrics fuzz_storage_curve fuzz_oracle_profile fuzz_lab_cells
               fuzz_fault_walk fuzz_cli_specs)
targets_all=(fuzz_trace_csv fuzz_trace_binary fuzz_session)
llama_prefix="${MOE_RESIDENCY_LLAMA_CPP_PREFIX:-}"
llama_flags=(-DMOE_RESIDENCY_BUILD_LLAMA_CPP=OFF)
if [[ -n "$llama_prefix" ]]; then
  targets_all+=(fuzz_gguf_expert_map)
  llama_flags=(-DMOE_RESIDENCY_BUILD_LLAMA_CPP=ON -DCMAKE_PREFIX_PATH="$llama_prefix")
fi
# The long targets first, so that with two jobs the short ones pair up at the end.
targets_all+=("${targets_small[@]}")
target="${1:-}"
seconds="${2:-60}"
jobs="${MOE_RESIDENCY_FUZZ_JOBS:-1}"
small_seconds="${MOE_RESIDENCY_FUZZ_SMALL_SECONDS:-$seconds}"
if [[ ! "$jobs" =~ ^[1-9][0-9]*$ || ! "$small_seconds" =~ ^[0-9]+$ ]]; then
  echo "scripts/fuzz.sh: MOE_RESIDENCY_FUZZ_JOBS '$jobs' (expected >= 1) or MOE_RESIDENCY_FUZZ_SMALL_SECONDS" \
       "'$small_seconds' (expected seconds) is not a whole number" >&2
  exit 2
fi
if [[ -z "$target" || ! "$seconds" =~ ^[0-9]+$ ]]; then
  echo "usage: scripts/fuzz.sh TARGET SECONDS   (TARGET: ${targets_all[*]} | all)" >&2
  exit 2
fi
if [[ "$target" == all ]]; then
  targets=("${targets_all[@]}")
else
  if [[ "$target" == fuzz_gguf_expert_map && -z "$llama_prefix" ]]; then
    echo "scripts/fuzz.sh: fuzz_gguf_expert_map needs ggml's gguf.h; set MOE_RESIDENCY_LLAMA_CPP_PREFIX to an" \
         "installed llama.cpp (the prefix scripts/fetch-llama-cpp.sh --install prints)" >&2
    exit 2
  fi
  case " ${targets_all[*]} " in *" $target "*) targets=("$target") ;; *)
    echo "scripts/fuzz.sh: unknown target '$target'; expected one of: ${targets_all[*]} all" >&2
    exit 2 ;;
  esac
fi

build=build/fuzz
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
      -DMOE_RESIDENCY_BUILD_FUZZERS=ON -DMOE_RESIDENCY_BUILD_TESTS=OFF -DMOE_RESIDENCY_BUILD_EXAMPLES=OFF \
      -DMOE_RESIDENCY_INSTALL=OFF -DMOE_RESIDENCY_WARNINGS_AS_ERRORS=ON "${llama_flags[@]}" >/dev/null
seed_makers=(moe_residency_fuzz_seeds)
[[ -n "$llama_prefix" ]] && seed_makers+=(moe_residency_fuzz_gguf_seeds)
cmake --build "$build" --target "${targets[@]}" "${seed_makers[@]}"

traces="${MOE_RESIDENCY_TRACES:-$(cd .. && pwd)/shared/traces}"
"$build/fuzz/moe_residency_fuzz_seeds" "$traces" "$build/seeds" >/dev/null
if [[ -n "$llama_prefix" ]]; then "$build/fuzz/moe_residency_fuzz_gguf_seeds" "$build/seeds" >/dev/null; fi

# One target: its log in $build/TARGET.log, its time in fuzz-time.log; non-zero on a finding.
run_target() {
  local t="$1" secs="$2"
  local corpus="$build/corpus/$t" findings="$build/findings/$t" start end rc=0
  mkdir -p "$corpus" "$findings"
  echo "== fuzz: $t for ${secs}s (corpus $corpus)"
  # A target with fuzz/dict/TARGET.dict gets it and fuzz/dict/numbers.dict (the
  # spellings strtod takes: inf, nan, hex, ...) as its libFuzzer dictionary.
  local dict=()
  if [[ -f "fuzz/dict/$t.dict" ]]; then
    cat fuzz/dict/numbers.dict "fuzz/dict/$t.dict" >"$build/$t.dict"
    dict=(-dict="$build/$t.dict")
  fi
  start=$(date +%s)
  # -max_len: the real-trace seeds are whole decode tokens, up to 20 KiB (two
  # of Qwen's 288-row tokens as CSV); leave room to grow them.
  "$build/fuzz/$t" "$corpus" "$build/seeds/$t" "${dict[@]}" -max_total_time="$secs" -max_len=32768 \
      -timeout=30 -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$findings/" \
      >"$build/$t.log" 2>&1 || rc=1
  end=$(date +%s)
  if ((rc)); then
    echo "scripts/fuzz.sh: $t found a failure; inputs in $findings, log $build/$t.log" >&2
    grep -E "ERROR|FUZZ CHECK FAILED|runtime error|uncaught|SUMMARY" "$build/$t.log" | head -20 >&2 || true
  fi
  grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb" "$build/$t.log" | sed "s/^/  $t /" || true
  echo "$(date -u +%FT%TZ) $t $((end - start))s status=$rc" >>"$build/fuzz-time.log"
  return "$rc"
}

status=0 running=0
for t in "${targets[@]}"; do
  secs="$seconds"
  [[ "$target" == all && " ${targets_small[*]} " == *" $t "* ]] && secs="$small_seconds"
  if ((running >= jobs)); then
    wait -n || status=1
    running=$((running - 1))
  fi
  run_target "$t" "$secs" &
  running=$((running + 1))
done
while ((running > 0)); do
  wait -n || status=1
  running=$((running - 1))
done
exit "$status"
