# gnuplot's failure is not taken for success: with a gnuplot that exits 0 and
# writes nothing (a full disk: gnuplot 5.4 exits 0 when its write fails), one
# that writes half an SVG, one that exits 1, and none on PATH, `replay --plot`
# exits 2 with a message naming the file and the fault, and the SVG already
# there is left exactly as it was, with no temporary file beside it.
# Invoked by CTest:
#   cmake -DEXE=… -DDIR=<fresh folder> [-DEMULATOR="qemu|-L|…"] -P plot_checked.cmake
cmake_policy(VERSION 3.25)  # an empty list item (no fake gnuplot) is kept
file(REMOVE_RECURSE "${DIR}")
file(MAKE_DIRECTORY "${DIR}")
file(WRITE "${DIR}/t.csv" "# route_trace v1
# model=m.gguf arch=tiny n_layer=1 n_expert=4 n_expert_used=1
# layer=0 expert_bytes=1048576 dense_bytes=0
turn,phase,step,layer,slot,expert,weight,residency,expert_bytes
0,1,0,0,0,1,1,0,1048576
0,1,1,0,0,2,1,0,1048576
")
set(_sh "#!/bin/sh\n/bin/cat >/dev/null\n")
# name ^ the fake gnuplot's script (none: no gnuplot on PATH) ^ the message, a regex whose
# own ';' are written @semi@ (a ';' would split the list item).
set(_cases
    "empty^${_sh}exit 0\n^--plot: 'out\\.svg': gnuplot exited 0 but wrote nothing \\(a full disk\\?\\)@semi@ the file is left as it was"
    "half^${_sh}printf '<?xml version=\"1.0\"?>\\n<svg>\\n'\nexit 0\n^--plot: 'out\\.svg': gnuplot exited 0 but wrote 28 bytes that are not a whole SVG \\(no '<\\?xml' \\.\\.\\. '</svg>'@semi@ a full disk\\?\\)@semi@ the file is left as it was"
    "fails^${_sh}echo 'gnuplot: cannot write' >&2\nexit 1\n^--plot: 'out\\.svg': gnuplot failed \\(exit 1\\)@semi@ the file is left as it was"
    "none^^--plot: needs gnuplot, which is not installed \\(no gnuplot on PATH\\)@semi@ install it with 'apt-get install gnuplot-nox' \\(Debian/Ubuntu\\) or 'brew install gnuplot' \\(macOS\\), or leave --plot out \\(moe-residency replay --format csv gives the same figures as data\\)")
string(REPLACE "|" ";" _emulator "${EMULATOR}")
foreach(_case IN LISTS _cases)
  string(REPLACE "^" ";" _case "${_case}")
  list(GET _case 0 _name)
  list(GET _case 1 _script)
  list(GET _case 2 _expect)
  string(REPLACE "@semi@" ";" _expect "${_expect}")
  set(_bin "${DIR}/bin-${_name}")
  file(MAKE_DIRECTORY "${_bin}")
  if(NOT _script STREQUAL "")
    file(WRITE "${_bin}/gnuplot" "${_script}")
    file(CHMOD "${_bin}/gnuplot" PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE)
  endif()
  set(_work "${DIR}/${_name}")
  file(MAKE_DIRECTORY "${_work}")
  file(WRITE "${_work}/out.svg" "the old picture\n")
  execute_process(COMMAND "${CMAKE_COMMAND}" -E env "PATH=${_bin}" ${_emulator} "${EXE}" replay --trace ../t.csv
                          --budgets 1,2 --policies lru --plot out.svg
                  WORKING_DIRECTORY "${_work}" RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
  if(NOT _rc EQUAL 2)
    message(FATAL_ERROR "${_name}: moe-residency replay --plot exited ${_rc}; expected 2\n${_out}${_err}")
  endif()
  if(NOT _err MATCHES "(^|\n)moe-residency: ${_expect}\n")  # after what gnuplot itself said
    message(FATAL_ERROR "${_name}: the message does not match '^moe-residency: ${_expect}'\n${_err}")
  endif()
  file(READ "${_work}/out.svg" _kept)
  if(NOT _kept STREQUAL "the old picture\n")
    message(FATAL_ERROR "${_name}: out.svg holds '${_kept}'; expected the old picture, untouched")
  endif()
  file(GLOB _left RELATIVE "${_work}" "${_work}/*")
  if(NOT _left STREQUAL "out.svg")
    message(FATAL_ERROR "${_name}: ${_work} holds '${_left}'; expected out.svg alone (no temporary file left)")
  endif()
endforeach()
message("gnuplot's failures refused, the old SVG kept, nothing left beside it")
