# The README's benchmark rows are copied from docs/benchmarks.md's generated table
# (scripts/readme_bench.py, which scripts/bench.sh runs after rewriting the table):
# this fails when the two disagree, so no README figure can go stale on its own.
find_program(MOE_RESIDENCY_PYTHON3 python3)
if(MOE_RESIDENCY_PYTHON3)
  add_test(NAME readme_benchmarks_from_table
           COMMAND "${MOE_RESIDENCY_PYTHON3}" "${PROJECT_SOURCE_DIR}/scripts/readme_bench.py" --check)
else()
  message(STATUS "moe_residency: no python3; the test readme_benchmarks_from_table is not defined")
endif()
