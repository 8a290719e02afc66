# A trace whose header was crafted to break out of every quoting context
# gnuplot has, given to `replay --plot` and `whatif --plot` with the real
# gnuplot: nothing may run, and nothing but the SVG may appear beside it.
# Invoked by CTest:
#   cmake -DEXE=… -DDIR=<fresh folder> -DCONFIG=<timing config> [-DEMULATOR="qemu|-L|…"] -P plot_injection.cmake
# The arch (the plot's title) holds, in one word (an arch has no blanks):
#   a";system"touch${IFS}P1";print"    leaves a double-quoted string, runs a shell command
#   ';system'touch${IFS}P2';print'     the same from a single-quoted string
#   `touch${IFS}P3`                    gnuplot's backquote command substitution
#   @P4 \" \                           a macro, a backslash escape, a lone backslash
#   <script>&amp;                      markup, which the SVG must carry as text
# Before the fix, replay's title was written into the script between double
# quotes, and the first payload created P1 (gnuplot 5.4 ran it).
file(REMOVE_RECURSE "${DIR}")
file(MAKE_DIRECTORY "${DIR}")
set(_arch [==[a";system"touch${IFS}P1";print"';system'touch${IFS}P2';print'`touch${IFS}P3`@P4\"\<script>&amp;]==])
file(WRITE "${DIR}/crafted.csv" "# route_trace v1
# model=m.gguf arch=${_arch} n_layer=1 n_expert=4 n_expert_used=1
# layer=0 expert_bytes=1048576 dense_bytes=0
turn,phase,step,layer,slot,expert,weight,residency,expert_bytes
0,1,0,0,0,1,1,0,1048576
0,1,1,0,0,2,1,0,1048576
0,1,2,0,0,1,1,0,1048576
")
string(REPLACE "|" ";" _emulator "${EMULATOR}")
foreach(_run
    "replay|--trace|crafted.csv|--budgets|1,2,3|--policies|lru,belady|--plot|replay.svg"
    "whatif|--trace|crafted.csv|--config|${CONFIG}|--budgets|1,2,3|--plot|whatif.svg")
  string(REPLACE "|" ";" _args "${_run}")
  list(GET _args 0 _cmd)
  execute_process(COMMAND ${_emulator} "${EXE}" ${_args} WORKING_DIRECTORY "${DIR}" RESULT_VARIABLE _rc
                  OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
  # First what the run left: a payload that ran shows here, whatever the exit status.
  file(GLOB _left RELATIVE "${DIR}" "${DIR}/P*" "${DIR}/*.XXXXXX" "${DIR}/*.svg.*")
  if(_left)
    message(FATAL_ERROR "moe-residency ${_run} left '${_left}' in ${DIR}: a payload ran, or a temporary file "
                        "stayed\n${_out}${_err}")
  endif()
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "moe-residency ${_run} exited ${_rc}; expected 0\n${_out}${_err}")
  endif()
  if(NOT _err MATCHES "moe-residency ${_cmd}: wrote ${_cmd}\\.svg")
    message(FATAL_ERROR "moe-residency ${_run} did not report the SVG written\n${_out}${_err}")
  endif()
  file(READ "${DIR}/${_cmd}.svg" _svg)
  # The title is there, as text: the payload's quotes and commands verbatim, its markup escaped.
  string(FIND "${_svg}" [==[a";system"touch${IFS}P1";print"';system'touch${IFS}P2';print'`touch${IFS}P3`@P4\"\&lt;script>&amp;amp;]==] _at)
  if(_at EQUAL -1)
    message(FATAL_ERROR "${_cmd}.svg does not hold the crafted title as text:\n${_svg}")
  endif()
  if(_svg MATCHES "<script")
    message(FATAL_ERROR "${_cmd}.svg holds markup from the trace's header")
  endif()
endforeach()
# Nothing but the input and the two SVGs: no P1..P4, no temporary file left.
file(GLOB _left RELATIVE "${DIR}" "${DIR}/*" "${DIR}/.*")
list(SORT _left)
if(NOT _left STREQUAL "crafted.csv;replay.svg;whatif.svg")
  message(FATAL_ERROR "after the runs ${DIR} holds '${_left}'; expected only crafted.csv;replay.svg;whatif.svg")
endif()
message("no injection: ${DIR} holds only ${_left}")
