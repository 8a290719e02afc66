# The trace suite again with the strtof/snprintf float path (for standard
# libraries without std::from_chars/to_chars for float), so CI covers both.
add_executable(test_trace_no_charconv "${CMAKE_CURRENT_SOURCE_DIR}/test_trace.cpp")
target_link_libraries(test_trace_no_charconv PRIVATE moe_residency_test_main
                      moe_residency::moe_residency moe_residency_warnings)
target_compile_definitions(test_trace_no_charconv PRIVATE MOE_RESIDENCY_TRACE_NO_FLOAT_CHARCONV=1
  MOE_RESIDENCY_DEFAULT_TRACES="${MOE_RESIDENCY_TRACES_DIR}"
  MOE_RESIDENCY_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
add_test(NAME test_trace_no_charconv COMMAND test_trace_no_charconv)
