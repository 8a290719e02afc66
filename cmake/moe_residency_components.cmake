# Which public header belongs to which component target, by what it depends on.
# Read by the top-level CMakeLists.txt (one INTERFACE target per component) and
# by tests/layers.cmake (the include-layering test), so there is one list.
#
#   core     the standard library only
#   simd     + xsimd (and <immintrin.h>/<arm_neon.h> behind it)
#   threads  + Threads (<thread>, <mutex>, <condition_variable>)
#   timing   + Eigen3: every header under timing/ and timing.hpp, globbed, so
#            headers added there later join it without an edit here
#   umbrella moe_residency.hpp, which includes every component
#   adapter  adapters/**, which need their engine's headers
#
# A header may include headers of its own component and of the components it
# depends on (core <- simd, threads <- timing <- umbrella); tests/layers.cmake
# fails otherwise. A new header must be added to one list below: configuring
# fails on a header that is in none.

set(_mr_inc "${CMAKE_CURRENT_LIST_DIR}/../include")
get_filename_component(_mr_inc "${_mr_inc}" ABSOLUTE)
if(MOE_RESIDENCY_INCLUDE_DIR)  # tests/layers/check.cmake checks a modified copy of the tree
  set(_mr_inc "${MOE_RESIDENCY_INCLUDE_DIR}")
endif()
set(_mr_glob_flags CONFIGURE_DEPENDS)
if(CMAKE_SCRIPT_MODE_FILE)  # read by a cmake -P script: no build system to re-run
  set(_mr_glob_flags)
endif()

set(MOE_RESIDENCY_CORE_HEADERS
  moe_residency/version.hpp
  moe_residency/error.hpp
  moe_residency/core.hpp
  moe_residency/element_type.hpp
  moe_residency/trace.hpp
  moe_residency/cache.hpp
  moe_residency/score.hpp
  moe_residency/plan.hpp
  moe_residency/replay/cells.hpp
  moe_residency/replay/oracle_profile.hpp
  moe_residency/replay/static_drop.hpp
  moe_residency/router/spec.hpp
  moe_residency/router/select.hpp
  moe_residency/session_hook.hpp
  moe_residency/events.hpp
  moe_residency/session_types.hpp
  moe_residency/predict/contract.hpp
  moe_residency/predict/history.hpp
  moe_residency/detail/format.hpp
  moe_residency/detail/half.hpp
  moe_residency/detail/topk.hpp
  moe_residency/detail/cache_buckets.hpp
  moe_residency/detail/cache_heap.hpp
  moe_residency/detail/cache_list.hpp
  moe_residency/detail/cache_tournament.hpp
  moe_residency/detail/cycle_keys.hpp
  moe_residency/detail/trace_binary.hpp
  moe_residency/detail/xxhash64.hpp
  moe_residency/detail/files.hpp
  moe_residency/detail/numbers.hpp
  moe_residency/detail/text_encoding.hpp
  moe_residency/detail/trace_text.hpp)
# Whole folders of core headers.
file(GLOB _mr_core_globbed ${_mr_glob_flags} RELATIVE "${_mr_inc}"
     "${_mr_inc}/moe_residency/cache/*.hpp" "${_mr_inc}/moe_residency/trace/*.hpp")
list(APPEND MOE_RESIDENCY_CORE_HEADERS ${_mr_core_globbed})

set(MOE_RESIDENCY_SIMD_HEADERS
  moe_residency/router.hpp
  moe_residency/detail/gemv.hpp
  moe_residency/detail/gemv/config.hpp
  moe_residency/detail/gemv/intrinsics.hpp
  moe_residency/detail/gemv/scalar.hpp
  moe_residency/detail/gemv/simd.hpp
  moe_residency/detail/gemv/x86.hpp
  moe_residency/detail/gemv/x86_avx2.hpp
  moe_residency/detail/gemv/x86_avx512.hpp
  moe_residency/detail/gemv/x86_tune.hpp
  moe_residency/predict.hpp
  moe_residency/predict/gate.hpp
  moe_residency/predict/router_bank.hpp
  moe_residency/session.hpp
  moe_residency/session/checks.hpp
  moe_residency/session/extension_hooks.hpp
  moe_residency/session/predictions.hpp
  moe_residency/session/report.hpp
  moe_residency/session/routing_layouts.hpp
  moe_residency/synthetic.hpp)

# replay.hpp is here, not in core, because replay_grid runs its cells on std::threads
# (one cell, its reports and the static drop replay are core: replay/cells.hpp and
# replay/static_drop.hpp); the dynamic replay runs the speculation glue.
set(MOE_RESIDENCY_THREADS_HEADERS
  moe_residency/io.hpp
  moe_residency/detail/io_ring.hpp
  moe_residency/simulated_flash.hpp
  moe_residency/speculation.hpp
  moe_residency/replay.hpp
  moe_residency/replay/dynamic.hpp)

# The timing headers (timing.hpp and timing/*.hpp) are globbed: Eigen is used by
# timing/calibrate.hpp only, and no header outside this list may include Eigen.
file(GLOB MOE_RESIDENCY_TIMING_HEADERS ${_mr_glob_flags} RELATIVE "${_mr_inc}"
     "${_mr_inc}/moe_residency/timing.hpp" "${_mr_inc}/moe_residency/timing/*.hpp")

set(MOE_RESIDENCY_UMBRELLA_HEADERS moe_residency/moe_residency.hpp)
file(GLOB_RECURSE MOE_RESIDENCY_ADAPTER_HEADERS ${_mr_glob_flags} RELATIVE "${_mr_inc}"
     "${_mr_inc}/moe_residency/adapters/*.hpp")

# Listed headers that do not exist (e.g. a header renamed) and existing headers
# that are listed nowhere are both configuration errors.
set(MOE_RESIDENCY_COMPONENTS core simd threads timing umbrella adapter)
set(_mr_listed)
foreach(_c IN LISTS MOE_RESIDENCY_COMPONENTS)
  string(TOUPPER "${_c}" _C)
  foreach(_h IN LISTS MOE_RESIDENCY_${_C}_HEADERS)
    if(NOT EXISTS "${_mr_inc}/${_h}")
      message(FATAL_ERROR "cmake/moe_residency_components.cmake lists include/${_h} in ${_c}, but there is no such file")
    endif()
    list(APPEND _mr_listed "${_h}")
  endforeach()
endforeach()
file(GLOB_RECURSE _mr_all_headers ${_mr_glob_flags} RELATIVE "${_mr_inc}" "${_mr_inc}/moe_residency/*.hpp")
foreach(_h IN LISTS _mr_all_headers)
  if(NOT _h IN_LIST _mr_listed)
    message(FATAL_ERROR "include/${_h} belongs to no component; add it to one list in "
                        "cmake/moe_residency_components.cmake (by what it includes)")
  endif()
endforeach()
