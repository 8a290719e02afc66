# End-to-end tests of the moe-residency tool: the figures the issues name, read
# from the tool's own output (not from the library functions behind it).
if(TARGET moe_residency_cli)
  set(_mr_t "${MOE_RESIDENCY_TRACES_DIR}")
  # Cross builds run the tool through CMAKE_CROSSCOMPILING_EMULATOR (qemu), '|'-separated.
  string(REPLACE ";" "|" _mr_emulator "${CMAKE_CROSSCOMPILING_EMULATOR}")
  function(moe_residency_cli_test name args expect needs)
    add_test(NAME cli_${name}
      COMMAND "${CMAKE_COMMAND}" "-DEXE=$<TARGET_FILE:moe_residency_cli>" "-DEMULATOR=${_mr_emulator}" "-DARGS=${args}"
              "-DEXPECT=${expect}" "-DNEEDS=${needs}" -P "${CMAKE_CURRENT_SOURCE_DIR}/cli/run_cli.cmake")
    set_tests_properties(cli_${name} PROPERTIES SKIP_REGULAR_EXPRESSION "SKIPPED:")
  endfunction()

  # Issue 3: prev-token decode slot overlap, the engine authors' published figures
  # (shared/traces/README.md): 38.0% on qwen, 17.9% on gpt-oss, as the report prints them;
  # and the CSV has exactly the specified columns.
  moe_residency_cli_test(score_qwen
    "score|--trace|${_mr_t}/qwen.route.csv|--predictors|prev-token"
    "moe-predict: prev-token 38\\.0% of routed slots" "${_mr_t}/qwen.route.csv")
  moe_residency_cli_test(score_gptoss
    "score|--trace|${_mr_t}/gptoss.route.csv|--predictors|prev-token"
    "moe-predict: prev-token 17\\.9% of routed slots" "${_mr_t}/gptoss.route.csv")
  moe_residency_cli_test(score_csv
    "score|--trace|${_mr_t}/gptoss.route.csv|--predictors|prev-token,frequency|--format|csv"
    "^predictor,slot_pct,whole_pct,routings,slots,unscored\n@@\nprev-token,17\\.(8[5-9]|9[0-4])[0-9]*,@@\nfrequency," "${_mr_t}/gptoss.route.csv")
  # Issue 4: LRU cumulative hit equals what the engine recorded on the phone
  # (qwen.summary.txt 74.9% at 4000 MiB; gptoss.summary.txt 32.4% at 3000 MiB), LRU is
  # 0.0% below the token cycle, and the CSV has exactly the reference curves' columns.
  moe_residency_cli_test(replay_qwen
    "replay|--trace|${_mr_t}/qwen.route.csv|--budgets|500,4000|--policies|lru,belady|--format|csv"
    "^budget_mib,policy,hit_pct_cum,hit_pct_decode,read_mib\n@@\n4000,lru,74\\.(8[5-9]|9[0-4])[0-9]*,@@\n500,lru,0\\.000*,0\\.000*,"
    "${_mr_t}/qwen.route.csv")
  moe_residency_cli_test(replay_gptoss
    "replay|--trace|${_mr_t}/gptoss.route.csv|--budgets|3000|--policies|lru"
    "\n3000 +44\\.8 \\( +32\\.4\\)" "${_mr_t}/gptoss.route.csv")
  # Issue 3: the demo's report, with the control at exactly 100.0% and '-' for layer 0 of stale-gate.
  moe_residency_cli_test(demo
    "demo|--tokens|4"
    "moe-predict: stale-gate [0-9.]+% of routed slots \\([0-9.]+% whole routings\\) \\| prev-token [0-9.]+% \\([0-9.]+%\\) \\| fresh-gate control 100\\.0% \\(100\\.0%\\)@@\n  layer   stale    prev   ctrl   routings\n      0       -  " "")
  # Issue 5: the streamed demo prints the cache, drop and prefetch lines.
  moe_residency_cli_test(demo_streamed
    "demo|--streamed|--tokens|4|--lanes|0|--drop|1.0|--flash-mibps|1e9|--lane-mibps|1e9"
    "fresh-gate control 100\\.0%@@\nmoe-cache: decode hit@@\nmoe-drop: F = 1@@\nmoe-prefetch: issued [0-9]+ / useful [0-9]+" "")
endif()
