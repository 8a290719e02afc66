# CTest script: moe-llama-probe end to end on a random-weight model of each
# architecture (written by the lab's moe-lab-model). Checks the exit code, the
# control's 100.0%, the cache line, the warm reads, the trace file (route_trace
# v1), and — given TOOL — that `moe-residency replay` of the trace prints the
# probe's own cache line (decode and cumulative hit %, MiB read). The same
# model built in memory (--random) records the same trace: the same routing,
# the same per-layer expert and dense bytes in its header. Run as
#   cmake -DPROBE=<moe-llama-probe> -DLAB_MODEL=<moe-lab-model> -DWORK=<dir> [-DTOOL=<moe-residency>]
#         -P probe_smoke.cmake
# (moe-lab-run's records, metrics and residency options: lab_run_smoke.cmake.)
file(MAKE_DIRECTORY "${WORK}")
foreach(arch qwen3moe deepseek2 gpt-oss)
  foreach(router f32 f16 bf16)
    set(gguf "${WORK}/${arch}-${router}.gguf")
    set(trace "${WORK}/${arch}-${router}.route.csv")
    set(memory_trace "${WORK}/${arch}-${router}.memory.route.csv")
    file(REMOVE "${trace}" "${memory_trace}")
    execute_process(COMMAND "${LAB_MODEL}" --arch ${arch} --router ${router} --experts 32 --k 4 --out "${gguf}"
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "${arch} ${router}: moe-lab-model exited with ${rc}\n${out}\n${err}")
    endif()
    execute_process(
      COMMAND "${PROBE}" --model "${gguf}" --tokens 16 --decode 64 --budget-mib 3 --threads 1 --trace-out "${trace}"
              --warm pread
      WORKING_DIRECTORY "${WORK}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "${arch} ${router}: moe-llama-probe exited with ${rc}\n${out}\n${err}")
    endif()
    if(NOT out MATCHES "fresh-gate control 100\\.0% of routed slots|fresh-gate control 100\\.0%")
      message(FATAL_ERROR "${arch} ${router}: the control is not 100.0%\n${out}")
    endif()
    if(NOT out MATCHES "cache lru 3 MiB: decode hit [0-9.]+%")
      message(FATAL_ERROR "${arch} ${router}: no cache line\n${out}")
    endif()
    if(NOT out MATCHES ", 0 failed")
      message(FATAL_ERROR "${arch} ${router}: a warm read failed\n${out}")
    endif()
    if(NOT out MATCHES "0 unreadable, 0 unsupported, 0 exceptions")
      message(FATAL_ERROR "${arch} ${router}: observer counters\n${out}")
    endif()
    file(STRINGS "${trace}" first LIMIT_COUNT 1)
    if(NOT first STREQUAL "# route_trace v1")
      message(FATAL_ERROR "${arch} ${router}: ${trace} does not start with '# route_trace v1'")
    endif()
    # The same model in memory: the same trace but for the header's model name (a
    # file's path, or the model's general.name), its dense bytes from the tensor list.
    execute_process(
      COMMAND "${PROBE}" --random ${arch} --router ${router} --experts 32 --k 4 --tokens 16 --decode 64
              --budget-mib 3 --threads 1 --trace-out "${memory_trace}"
      WORKING_DIRECTORY "${WORK}" RESULT_VARIABLE rc OUTPUT_VARIABLE memory_out ERROR_VARIABLE err)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "${arch} ${router}: moe-llama-probe --random exited with ${rc}\n${memory_out}\n${err}")
    endif()
    file(STRINGS "${trace}" from_file)
    file(STRINGS "${memory_trace}" from_memory)
    list(FILTER from_file EXCLUDE REGEX "^# model=")
    list(FILTER from_memory EXCLUDE REGEX "^# model=")
    if(NOT from_file STREQUAL from_memory)
      message(FATAL_ERROR "${arch} ${router}: the trace of the model in memory (${memory_trace}) is not the file's "
                          "(${trace}) but for the model's name")
    endif()
    set(expected "")
    if(TOOL)
      # The trace replays through `moe-residency replay` to the probe's own cache line.
      string(REGEX MATCH "decode hit ([0-9.]+)% \\(cumulative ([0-9.]+)%\\), ([0-9.]+) MiB read" line "${out}")
      set(probe_decode "${CMAKE_MATCH_1}")
      set(probe_cum "${CMAKE_MATCH_2}")
      set(probe_mib "${CMAKE_MATCH_3}")
      execute_process(COMMAND "${TOOL}" replay --trace "${trace}" --budgets 3 --policies lru
                              --format csv --threads 1
                      RESULT_VARIABLE rc OUTPUT_VARIABLE replay ERROR_VARIABLE err)
      if(NOT rc EQUAL 0)
        message(FATAL_ERROR "${arch} ${router}: moe-residency replay failed on ${trace}\n${replay}\n${err}")
      endif()
      set(expected "3,lru,${probe_cum},${probe_decode},${probe_mib}")
      string(FIND "${replay}" "${expected}" at)
      if(at EQUAL -1)
        message(FATAL_ERROR "${arch} ${router}: replay of ${trace} gives\n${replay}but the probe printed\n"
                            "  ${line}\n(expected the row ${expected})")
      endif()
    endif()
    message(STATUS "${arch} ${router}: ok ${expected}")
  endforeach()
endforeach()

# An option that acts only with another is refused naming both.
set(gguf "${WORK}/qwen3moe-f32.gguf")
foreach(_case
    "--model;${gguf};--layers;8|--layers has no effect without --random"
    "--random;qwen3moe;--warm;pread|--warm reads the missed experts from the model's file; give --model"
    "--model;${gguf};--cost-rounds;3|--cost-rounds has no effect without --cost")
  string(FIND "${_case}" "|" _bar)
  string(SUBSTRING "${_case}" 0 ${_bar} _args)  # a list: the probe's arguments
  math(EXPR _bar "${_bar} + 1")
  string(SUBSTRING "${_case}" ${_bar} -1 _want)
  execute_process(COMMAND "${PROBE}" ${_args} --decode 1 RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(FIND "${err}" "${_want}" _at)
  if(rc EQUAL 0 OR _at EQUAL -1)
    message(FATAL_ERROR "moe-llama-probe ${_args}: expected a refusal with '${_want}' (exit ${rc})\n${out}\n${err}")
  endif()
endforeach()
message(STATUS "refusals: an option without the one it needs")
