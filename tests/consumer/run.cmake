# Builds and runs tests/consumer one way. Invoked by CTest:
#   cmake -DMODE=find_package|add_subdirectory [-DCOMPONENT=all|core] -DSOURCE_DIR=… -DBUILD_ROOT=…
#         -DGENERATOR=… [-DPREFIX=…] -P run.cmake
# For find_package it first installs this build tree's project into a fresh prefix,
# unless PREFIX names an existing install (scripts/check-core-only.sh).
if(NOT COMPONENT)
  set(COMPONENT all)
endif()
set(work "${BUILD_ROOT}/consumer-${MODE}-${COMPONENT}")
file(REMOVE_RECURSE "${work}")
set(args -S "${SOURCE_DIR}/tests/consumer" -B "${work}/build" -G "${GENERATOR}"
         -DMOE_RESIDENCY_CONSUME=${MODE} -DMOE_RESIDENCY_COMPONENT=${COMPONENT} ${EXTRA_ARGS})
if(MODE STREQUAL "find_package" AND PREFIX)
  list(APPEND args "-DCMAKE_PREFIX_PATH=${PREFIX}")
elseif(MODE STREQUAL "find_package")
  execute_process(COMMAND "${CMAKE_COMMAND}" --install "${BUILD_ROOT}" --prefix "${work}/prefix"
                  RESULT_VARIABLE rc OUTPUT_QUIET)
  if(rc)
    message(FATAL_ERROR "consumer: cmake --install failed (${rc})")
  endif()
  list(APPEND args "-DCMAKE_PREFIX_PATH=${work}/prefix")
else()
  list(APPEND args "-DMOE_RESIDENCY_SOURCE_DIR=${SOURCE_DIR}")
endif()
foreach(step IN ITEMS configure build run)
  if(step STREQUAL "configure")
    set(cmd "${CMAKE_COMMAND}" ${args})
  elseif(step STREQUAL "build")
    set(cmd "${CMAKE_COMMAND}" --build "${work}/build")
  else()
    set(cmd "${work}/build/consumer")
  endif()
  execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc)
    message(FATAL_ERROR "consumer (${MODE}): ${step} failed (${rc})\n${out}\n${err}")
  endif()
endforeach()
message(STATUS "${out}")
