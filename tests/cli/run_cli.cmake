# Runs the moe-residency tool once and checks its output. Invoked by CTest:
#   cmake -DEXE=… -DARGS="a|b|c" -DEXPECT="regex1@@regex2" [-DNEEDS=file] [-DEMULATOR="qemu|-L|…"]
#         [-DEXPECT_RC=2] [-DHEAD="src|lines|dst"] -P run_cli.cmake
# EXPECT_RC is the exit status the tool must end with (default 0). HEAD first
# writes the first `lines` lines of `src` to `dst` (a real trace cut short,
# made at test time: the traces are never copied into the repository).
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
if(DEFINED HEAD AND NOT HEAD STREQUAL "")
  string(REPLACE "|" ";" _head "${HEAD}")
  list(GET _head 0 _src)
  list(GET _head 1 _lines)
  list(GET _head 2 _dst)
  file(STRINGS "${_src}" _kept LIMIT_COUNT ${_lines})
  list(LENGTH _kept _got)
  if(NOT _got EQUAL _lines)
    message(FATAL_ERROR "HEAD: ${_src} has ${_got} lines; expected at least ${_lines}")
  endif()
  list(JOIN _kept "\n" _text)
  file(WRITE "${_dst}" "${_text}\n")
endif()
if(NOT DEFINED EXPECT_RC OR EXPECT_RC STREQUAL "")
  set(EXPECT_RC 0)
endif()
string(REPLACE "|" ";" _args "${ARGS}")
string(REPLACE "|" ";" _emulator "${EMULATOR}")  # empty unless cross-compiled (qemu)
execute_process(COMMAND ${_emulator} "${EXE}" ${_args} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(all "${out}${err}")
if(NOT rc EQUAL EXPECT_RC)
  message(FATAL_ERROR "moe-residency ${ARGS} exited ${rc}; expected ${EXPECT_RC}\n${all}")
endif()
string(REPLACE "@@" ";" _expect "${EXPECT}")
foreach(re IN LISTS _expect)
  if(NOT all MATCHES "${re}")
    message(FATAL_ERROR "moe-residency ${ARGS}: output does not match '${re}'\n${all}")
  endif()
endforeach()
message("${out}")
