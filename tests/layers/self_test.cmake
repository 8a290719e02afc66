# Copies include/ and plants two violations the layering check must report:
# score.hpp (core) including router.hpp (simd), and plan.hpp (core) including <thread>.
file(REMOVE_RECURSE "${WORK}")
file(COPY "${SOURCE_DIR}/include" DESTINATION "${WORK}")
file(APPEND "${WORK}/include/moe_residency/score.hpp" "\n#include \"moe_residency/router.hpp\"\n")
file(APPEND "${WORK}/include/moe_residency/plan.hpp" "\n#include <thread>\n")
foreach(expect IN ITEMS "score.hpp \\(layer core\\): includes moe_residency/router.hpp \\(layer simd\\)"
                        "plan.hpp \\(layer core\\): includes <thread>")
  execute_process(COMMAND "${CMAKE_COMMAND}" "-DMOE_RESIDENCY_INCLUDE_DIR=${WORK}/include"
                          "-DEXPECT_VIOLATION=${expect}" -P "${SOURCE_DIR}/tests/layers/check.cmake"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc)
    message(FATAL_ERROR "layers self-test: the check missed a planted violation:\n${out}${err}")
  endif()
  message(STATUS "${out}")
endforeach()
