# CTest script: the memory lab's run instrument, moe-lab-run, end to end on a
# random-weight model of each architecture (written by moe-lab-model). Checks
# that the phone-format metrics file (--metrics-csv) has one row per decode
# token, each sys_ms a time no larger than cpu_ms, and — given TOOL — that with
# the run's route trace (--trace-out) it calibrates (`moe-residency calibrate`
# refuses a metrics file whose rows are not the trace's decode tokens); that
# the manager stands down on a model that fits unless told to act
# (--residency-when-fits, memlab's manager-exact and manager-cache runs); the
# refusals of an option without the one it needs and of a number out of its
# domain; and that --policy names the cache's policy in the summary. Run as
#   cmake -DLAB_RUN=<moe-lab-run> -DLAB_MODEL=<moe-lab-model> -DWORK=<dir> [-DTOOL=<moe-residency>]
#         -P lab_run_smoke.cmake
file(MAKE_DIRECTORY "${WORK}")
foreach(arch qwen3moe deepseek2 gpt-oss)
  foreach(router f32 f16 bf16)
    set(gguf "${WORK}/${arch}-${router}.gguf")
    set(trace "${WORK}/${arch}-${router}.route.csv")
    set(metrics "${WORK}/${arch}-${router}.metrics.csv")
    file(REMOVE "${trace}" "${metrics}")
    execute_process(COMMAND "${LAB_MODEL}" --arch ${arch} --router ${router} --experts 32 --k 4 --out "${gguf}"
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "${arch} ${router}: moe-lab-model exited with ${rc}\n${out}\n${err}")
    endif()
    execute_process(
      COMMAND "${LAB_RUN}" --model "${gguf}" --tokens 16 --decode 64 --budget-mib 3 --threads 1 --trace-out "${trace}"
              --metrics-csv "${metrics}"
      WORKING_DIRECTORY "${WORK}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "${arch} ${router}: moe-lab-run exited with ${rc}\n${out}\n${err}")
    endif()
    if(NOT out MATCHES "logits: fnv1a64 [0-9a-f]+ over 64 tokens")
      message(FATAL_ERROR "${arch} ${router}: no digest of the logits\n${out}")
    endif()
    file(STRINGS "${metrics}" mlines)
    list(LENGTH mlines mcount)
    list(GET mlines 0 mheader)
    if(NOT mheader STREQUAL "step,steps,wall_ms,compute_ms,read_bytes,cache_hit_pct,stall_ms,majflt,cpu_ms,sys_ms")
      message(FATAL_ERROR "${arch} ${router}: ${metrics} header '${mheader}'")
    endif()
    if(NOT mcount EQUAL 65)
      message(FATAL_ERROR "${arch} ${router}: ${metrics} has ${mcount} lines; expected a header and 64 decode rows")
    endif()
    list(GET mlines 64 mlast)
    if(NOT mlast MATCHES "^64,64,")
      message(FATAL_ERROR "${arch} ${router}: ${metrics} last row '${mlast}'; expected step 64 of 64")
    endif()
    # sys_ms is the part of cpu_ms spent in the kernel: getrusage's split of the interval (tick
    # samples) applied to the thread's exact CPU time, so a time >= 0 and never more than cpu_ms
    # (the probe once subtracted getrusage's system time from the CPU clock's interval, and a row
    # came out 53 us over: the two clocks' runtimes differ).
    foreach(i RANGE 1 64)
      list(GET mlines ${i} row)
      # The last two columns (cache_hit_pct may be empty, and a split list would drop it).
      if(NOT row MATCHES ",([^,]*),([^,]*)$")
        message(FATAL_ERROR "${arch} ${router}: ${metrics} row ${i} '${row}'; expected ...,cpu_ms,sys_ms")
      endif()
      set(cpu "${CMAKE_MATCH_1}")
      set(sys "${CMAKE_MATCH_2}")
      # Whole microseconds: "12.034" -> 12 * 1000 + 1034 - 1000 (the leading 1 keeps the
      # fraction's zeros from being read as part of another number).
      foreach(col cpu sys)
        if(NOT "${${col}}" MATCHES "^([0-9]+)\\.([0-9][0-9][0-9])$")
          message(FATAL_ERROR "${arch} ${router}: ${metrics} row ${i} ${col}_ms '${${col}}'; expected a time >= 0")
        endif()
        math(EXPR ${col}_us "${CMAKE_MATCH_1} * 1000 + 1${CMAKE_MATCH_2} - 1000")
      endforeach()
      if(sys_us GREATER cpu_us)
        message(FATAL_ERROR "${arch} ${router}: ${metrics} row ${i}: sys_ms ${sys} > cpu_ms ${cpu}")
      endif()
    endforeach()
    if(TOOL)
      execute_process(COMMAND "${TOOL}" calibrate --trace "${trace}" --metrics "${metrics}" --budget 3 --format csv
                      RESULT_VARIABLE rc OUTPUT_VARIABLE cal ERROR_VARIABLE err)
      if(NOT rc EQUAL 0 OR NOT cal MATCHES "held_out,32,")
        message(FATAL_ERROR "${arch} ${router}: calibrate of ${trace} with ${metrics} failed\n${cal}\n${err}")
      endif()
    endif()
    message(STATUS "${arch} ${router}: ok")
  endforeach()
endforeach()

# --residency-when-fits: the manager stands down on a model that fits, unless
# told to act (memlab's manager-exact and manager-cache runs); a bad value is
# refused naming it.
set(gguf "${WORK}/qwen3moe-f32.gguf")
foreach(mode stand-down act)
  execute_process(
    COMMAND "${LAB_RUN}" --model "${gguf}" --tokens 8 --decode 4 --threads 1 --residency exact
            --residency-when-fits ${mode}
    WORKING_DIRECTORY "${WORK}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "--residency-when-fits ${mode}: moe-lab-run exited with ${rc}\n${out}\n${err}")
  endif()
  if(mode STREQUAL "act")
    if(NOT "${out}${err}" MATCHES "residency: exact [1-9][0-9]* reads")
      message(FATAL_ERROR "--residency-when-fits act: the manager did not read\n${out}\n${err}")
    endif()
  elseif(NOT "${out}${err}" MATCHES "residency: standing down")
    message(FATAL_ERROR "--residency-when-fits stand-down: the manager did not stand down\n${out}\n${err}")
  endif()
endforeach()
execute_process(COMMAND "${LAB_RUN}" --model "${gguf}" --decode 1 --residency exact --residency-when-fits sometimes
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT "${err}" MATCHES "--residency-when-fits: 'sometimes' is not a choice; expected stand-down or act")
  message(FATAL_ERROR "--residency-when-fits sometimes: not refused as expected (exit ${rc})\n${out}\n${err}")
endif()
message(STATUS "--residency-when-fits: stands down by default, acts when told, refuses 'sometimes'")

# An option that acts only with another is refused naming both, and a
# number out of its domain is refused naming the option, the text and the limits.
foreach(_case
    "--model;${gguf};--lanes;4|--lanes has no effect without --residency"
    "--model;${gguf};--no-observer;--trace-out;t.csv|--trace-out has no effect without the observer"
    "--model;${gguf};--residency;exact;--spec-cap;33|--spec-cap: '33' is out of range; expected a whole number from 0 to 32"
    "--model;${gguf};--policy;adaptive|--policy has no effect without --residency"
    "--model;${gguf};--residency;exact;--policy;cycle|--policy cycle with --residency exact: the policy is the cache's"
    "--model;${gguf};--residency;all;--policy;layer|cache policy 'layer': a layer partition keeps top-k experts"
    "--model;${gguf};--residency;exact;--load-mode;mlock|--load-mode mlock is a stock baseline")
  string(FIND "${_case}" "|" _bar)
  string(SUBSTRING "${_case}" 0 ${_bar} _args)  # a list: the run's arguments
  math(EXPR _bar "${_bar} + 1")
  string(SUBSTRING "${_case}" ${_bar} -1 _want)
  execute_process(COMMAND "${LAB_RUN}" ${_args} --decode 1 RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(FIND "${err}" "${_want}" _at)
  if(rc EQUAL 0 OR _at EQUAL -1)
    message(FATAL_ERROR "moe-lab-run ${_args}: expected a refusal with '${_want}' (exit ${rc})\n${out}\n${err}")
  endif()
endforeach()
message(STATUS "refusals: an option without the one it needs, a number out of its domain")

# --policy: the manager's cache follows the named policy, and says which.
execute_process(
  COMMAND "${LAB_RUN}" --model "${gguf}" --tokens 8 --decode 4 --threads 1 --residency all --residency-when-fits act
          --policy adaptive
  WORKING_DIRECTORY "${WORK}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT "${out}" MATCHES "cache adaptive [0-9]")
  message(FATAL_ERROR "--policy adaptive: exit ${rc}, or the summary does not name the policy\n${out}\n${err}")
endif()
message(STATUS "--policy adaptive: the cache named in the summary")
