# Runs the moe-residency tool once and checks its output. Invoked by CTest:
#   cmake -DEXE=… -DARGS="a|b|c" -DEXPECT="regex1@@regex2" [-DNEEDS=file] [-DEMULATOR="qemu|-L|…"] -P run_cli.cmake
# Every EXPECT regex must match the combined stdout+stderr (CTest's own
# PASS_REGULAR_EXPRESSION passes on any one). When NEEDS names a missing file
# the test prints SKIPPED (CTest marks it skipped), unless CI=true: then it fails.
if(DEFINED NEEDS AND NOT NEEDS STREQUAL "" AND NOT EXISTS "${NEEDS}")
  if("$ENV{CI}" STREQUAL "true")
    message(FATAL_ERROR "real trace ${NEEDS} is missing and CI=true; set MOE_RESIDENCY_TRACES_DIR")
  endif()
  message("SKIPPED: ${NEEDS} not found (point MOE_RESIDENCY_TRACES_DIR at the shared/traces folder)")
  return()
endif()
string(REPLACE "|" ";" _args "${ARGS}")
string(REPLACE "|" ";" _emulator "${EMULATOR}")  # empty unless cross-compiled (qemu)
execute_process(COMMAND ${_emulator} "${EXE}" ${_args} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(all "${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "moe-residency ${ARGS} exited ${rc}\n${all}")
endif()
string(REPLACE "@@" ";" _expect "${EXPECT}")
foreach(re IN LISTS _expect)
  if(NOT all MATCHES "${re}")
    message(FATAL_ERROR "moe-residency ${ARGS}: output does not match '${re}'\n${all}")
  endif()
endforeach()
message("${out}")
