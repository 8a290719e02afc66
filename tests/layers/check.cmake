# The include-layering test (docs/overview.md draws the layers), and the
# one-concept rule (at the end: a class stays in the file that declares it):
#   cmake [-DMOE_RESIDENCY_INCLUDE_DIR=<include dir>] [-DEXPECT_VIOLATION=<text>] -P check.cmake
# Every public header belongs to a layer (its component in
# cmake/moe_residency_components.cmake; core is split into three). A header may
# include only headers of its own layer and of the layers below it, and only the
# third-party and system headers its component's dependencies allow:
#
#   base        version, error, element_type, the dependency-free detail/ helpers
#   core_types  core.hpp (shape, ids, routing, ranking)
#   core        traces, caches and policies, scorer, planner, history predictors
#   simd        + xsimd: router, GEMV, gate predictors, session, synthetic
#   threads     + <thread>/<mutex>: read scheduler, speculation, simulated flash, replay
#   timing      + Eigen: timing.hpp, timing/*
#   umbrella    moe_residency.hpp
#   adapter     adapters/** (engine headers)
#
# simd and threads are siblings: neither may include the other. No header of the
# library may include the memory lab's (lab/include/moe_residency_lab/), which is
# not installed.
# Without EXPECT_VIOLATION the check fails on any violation; with it, it fails
# unless a violation containing that text is found (the self-test, which checks a
# copy of the tree with one bad include added).
cmake_minimum_required(VERSION 3.25)
include("${CMAKE_CURRENT_LIST_DIR}/../../cmake/moe_residency_components.cmake")

set(_base_headers
  moe_residency/version.hpp moe_residency/error.hpp moe_residency/element_type.hpp
  moe_residency/detail/format.hpp moe_residency/detail/half.hpp moe_residency/detail/topk.hpp
  moe_residency/detail/cache_buckets.hpp moe_residency/detail/cache_heap.hpp
  moe_residency/detail/cache_list.hpp moe_residency/detail/cache_tournament.hpp
  moe_residency/detail/cycle_keys.hpp moe_residency/detail/trace_binary.hpp
  moe_residency/detail/trace_text.hpp)

function(_layer_of header out)
  if(header IN_LIST _base_headers)
    set(${out} base PARENT_SCOPE)
  elseif(header STREQUAL "moe_residency/core.hpp")
    set(${out} core_types PARENT_SCOPE)
  else()
    foreach(_c IN ITEMS core simd threads timing umbrella adapter)
      string(TOUPPER "${_c}" _C)
      if(header IN_LIST MOE_RESIDENCY_${_C}_HEADERS)
        set(${out} ${_c} PARENT_SCOPE)
        return()
      endif()
    endforeach()
    set(${out} "" PARENT_SCOPE)
  endif()
endfunction()

# Layers each layer may include.
set(_may_base base)
set(_may_core_types base core_types)
set(_may_core base core_types core)
set(_may_simd base core_types core simd)
set(_may_threads base core_types core threads)
set(_may_timing base core_types core simd threads timing)
set(_may_umbrella base core_types core simd threads timing umbrella)
set(_may_adapter base core_types core simd threads timing umbrella adapter)
# System or third-party headers a layer must not include (regexes on the name).
set(_threads_re "^(thread|mutex|shared_mutex|condition_variable|future|pthread\\.h)$")
set(_simd_re "^(xsimd/.*|immintrin\\.h|arm_neon\\.h|x86intrin\\.h)$")
set(_eigen_re "^(Eigen/.*|eigen3/.*|unsupported/Eigen/.*)$")
set(_bad_base "${_threads_re}|${_simd_re}|${_eigen_re}")
set(_bad_core_types "${_bad_base}")
set(_bad_core "${_bad_base}")
set(_bad_simd "${_threads_re}|${_eigen_re}")
set(_bad_threads "${_simd_re}|${_eigen_re}")
set(_bad_timing "^$")
set(_bad_umbrella "^$")
set(_bad_adapter "^$")

set(_violations)
set(_edges 0)
foreach(_h IN LISTS _mr_all_headers)
  _layer_of("${_h}" _layer)
  if(NOT _layer)
    list(APPEND _violations "include/${_h}: in no layer")
    continue()
  endif()
  file(STRINGS "${_mr_inc}/${_h}" _lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]")
  foreach(_line IN LISTS _lines)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*[<\"]([^>\"]+)[>\"].*$" "\\1" _inc "${_line}")
    if(_inc MATCHES "^moe_residency/")
      math(EXPR _edges "${_edges} + 1")
      _layer_of("${_inc}" _to)
      if(NOT _to)
        list(APPEND _violations "include/${_h}: includes ${_inc}, which is no header of the library")
      elseif(NOT _to IN_LIST _may_${_layer})
        string(REPLACE ";" ", " _may "${_may_${_layer}}")
        list(APPEND _violations "include/${_h} (layer ${_layer}): includes ${_inc} (layer ${_to}); expected only layers ${_may}")
      endif()
    elseif(_inc MATCHES "^moe_residency_lab/")
      list(APPEND _violations "include/${_h}: includes ${_inc}, the memory lab's (lab/), which is not part of the library")
    elseif(_inc MATCHES "${_bad_${_layer}}")
      list(APPEND _violations "include/${_h} (layer ${_layer}): includes <${_inc}>, a dependency its component does not have")
    endif()
  endforeach()
endforeach()

# One concept a file: a class stays in the file that declares it. A member defined out
# of its class (`R Class<T>::member(...)` at namespace scope) in a header that does not
# declare `class Class` or `struct Class` is a class cut into files by member group,
# which is what a line cap once made of the residency manager (docs/overview.md, "Files").
foreach(_h IN LISTS _mr_all_headers)
  file(READ "${_mr_inc}/${_h}" _text)
  file(STRINGS "${_mr_inc}/${_h}" _defs REGEX "^[A-Za-z_][^(]*::~?[A-Za-z_][A-Za-z0-9_]*[ ]*\\(")
  foreach(_line IN LISTS _defs)
    if(_line MATCHES "^(using|return|namespace|template|typedef) ")
      continue()
    endif()
    if(NOT _line MATCHES "([A-Za-z_][A-Za-z0-9_]*)(<[^<>]*>)?::~?[A-Za-z_][A-Za-z0-9_]*[ ]*\\(")
      continue()
    endif()
    set(_class "${CMAKE_MATCH_1}")
    if(_class STREQUAL "std" OR _text MATCHES "namespace[ \t]+([A-Za-z_:]*::)?${_class}[ \t]*{")
      continue()  # a namespace's function, not a class's member
    endif()
    if(NOT _text MATCHES "(class|struct)[ \t]+${_class}[^;]*{")
      list(APPEND _violations "include/${_h}: defines a member of ${_class}, which it does not declare (a class stays in one file)")
    endif()
  endforeach()
endforeach()

list(LENGTH _mr_all_headers _n)
if(EXPECT_VIOLATION)
  foreach(_v IN LISTS _violations)
    if(_v MATCHES "${EXPECT_VIOLATION}")
      message(STATUS "layers (self-test): found the planted violation: ${_v}")
      return()
    endif()
  endforeach()
  message(FATAL_ERROR "layers (self-test): no violation matching '${EXPECT_VIOLATION}' in ${_mr_inc}; "
                      "found: ${_violations}")
endif()
if(_violations)
  string(REPLACE ";" "\n  " _text "${_violations}")
  message(FATAL_ERROR "layers: ${_n} headers, violations:\n  ${_text}")
endif()
message(STATUS "layers: ${_n} headers, ${_edges} includes between them, all downward; every class in its own file")
