# Copies include/ and plants four violations the check must report:
# score.hpp (core) including router.hpp (simd), plan.hpp (core) including <thread>,
# timing.hpp including a memory-lab header (lab/, never installed), and a header
# of 502 lines (that says why it is long: no reason is an exception).
file(REMOVE_RECURSE "${WORK}")
file(COPY "${SOURCE_DIR}/include" DESTINATION "${WORK}")
file(APPEND "${WORK}/include/moe_residency/score.hpp" "\n#include \"moe_residency/router.hpp\"\n")
file(APPEND "${WORK}/include/moe_residency/plan.hpp" "\n#include <thread>\n")
file(APPEND "${WORK}/include/moe_residency/timing.hpp" "\n#include \"moe_residency_lab/cells.hpp\"\n")
# And a 502-line header (#pragma once, a reason, 500 filler lines): over 500 is a violation whatever it says.
string(REPEAT "// filler\n" 500 _filler)
set(_filler "/// Why this header is long: a reason the check no longer takes.\n${_filler}")
file(WRITE "${WORK}/include/moe_residency/detail/trace_text.hpp" "#pragma once\n${_filler}")
foreach(expect IN ITEMS "score.hpp \\(layer core\\): includes moe_residency/router.hpp \\(layer simd\\)"
                        "plan.hpp \\(layer core\\): includes <thread>"
                        "timing.hpp: includes moe_residency_lab/cells.hpp, the memory lab's"
                        "trace_text.hpp: 502 lines, expected at most 500")
  execute_process(COMMAND "${CMAKE_COMMAND}" "-DMOE_RESIDENCY_INCLUDE_DIR=${WORK}/include"
                          "-DEXPECT_VIOLATION=${expect}" -P "${SOURCE_DIR}/tests/layers/check.cmake"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc)
    message(FATAL_ERROR "layers self-test: the check missed a planted violation:\n${out}${err}")
  endif()
  message(STATUS "${out}")
endforeach()
