# Copies include/ and plants four violations the check must report:
# score.hpp (core) including router.hpp (simd), plan.hpp (core) including <thread>,
# timing.hpp including a memory-lab header (lab/, never installed), and a member of
# a class defined in a header that does not declare it (a class cut into files).
file(REMOVE_RECURSE "${WORK}")
file(COPY "${SOURCE_DIR}/include" DESTINATION "${WORK}")
file(APPEND "${WORK}/include/moe_residency/score.hpp" "\n#include \"moe_residency/router.hpp\"\n")
file(APPEND "${WORK}/include/moe_residency/plan.hpp" "\n#include <thread>\n")
file(APPEND "${WORK}/include/moe_residency/timing.hpp" "\n#include \"moe_residency_lab/cells.hpp\"\n")
# And a member of speculation<> defined outside speculation.hpp, as a class cut into files by
# member group would be.
file(APPEND "${WORK}/include/moe_residency/replay.hpp"
     "\ntemplate <class Engine>\nvoid speculation<Engine>::finish_elsewhere() {}\n")
foreach(expect IN ITEMS "score.hpp \\(layer core\\): includes moe_residency/router.hpp \\(layer simd\\)"
                        "plan.hpp \\(layer core\\): includes <thread>"
                        "timing.hpp: includes moe_residency_lab/cells.hpp, the memory lab's"
                        "replay.hpp: defines a member of speculation, which it does not declare")
  execute_process(COMMAND "${CMAKE_COMMAND}" "-DMOE_RESIDENCY_INCLUDE_DIR=${WORK}/include"
                          "-DEXPECT_VIOLATION=${expect}" -P "${SOURCE_DIR}/tests/layers/check.cmake"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc)
    message(FATAL_ERROR "layers self-test: the check missed a planted violation:\n${out}${err}")
  endif()
  message(STATUS "${out}")
endforeach()
