# The llama.cpp adapter's build: the examples (moe-llama-probe, moe-run), the
# memory lab's tools (lab/llama_cpp) and the tests that run an unmodified llama.cpp. Included by the top-level CMakeLists.txt after the
# tests and examples; does nothing unless MOE_RESIDENCY_BUILD_LLAMA_CPP is ON.
#
# Where llama.cpp comes from, in order:
#   1. MOE_RESIDENCY_LLAMA_CPP_DIR, a llama.cpp source checkout, built here as a
#      subproject (EXCLUDE_FROM_ALL, CPU and RPC backends, static, SYSTEM includes);
#   2. an installed llama.cpp found with find_package(llama) (CMAKE_PREFIX_PATH).
# scripts/fetch-llama-cpp.sh fetches the pinned release and prints its checkout,
# or with --install builds and installs it once and prints the prefix.
#
# Defines moe_residency::llama_cpp (the library plus llama and ggml) and the
# target moe_residency_llama_cpp_checks (the examples, the lab's tools, the
# llama_cpp tests and the moe-residency tool they use).

option(MOE_RESIDENCY_BUILD_LLAMA_CPP "Build the llama.cpp adapter's probe and tests (needs llama.cpp)" OFF)
option(MOE_RESIDENCY_LLAMA_CPP_NATIVE
  "Build the llama.cpp subproject with -march=native (OFF: the portable AVX2 baseline, same kernels on every machine)" OFF)
set(MOE_RESIDENCY_LLAMA_CPP_DIR "" CACHE PATH
    "A llama.cpp source checkout to build as a subproject; empty: use find_package(llama)")

if(NOT MOE_RESIDENCY_BUILD_LLAMA_CPP)
  return()
endif()

get_filename_component(_mr_llama_repo "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)

# In a function so the settings below stay out of the including scope; llama.cpp's
# option()s honour them as normal variables (policy CMP0077).
function(_mr_add_llama_cpp_subproject dir)
  if(NOT EXISTS "${dir}/CMakeLists.txt" OR NOT EXISTS "${dir}/include/llama.h")
    message(FATAL_ERROR "MOE_RESIDENCY_LLAMA_CPP_DIR='${dir}' is not a llama.cpp checkout "
                        "(no CMakeLists.txt and include/llama.h); run scripts/fetch-llama-cpp.sh")
  endif()
  set(BUILD_SHARED_LIBS OFF)
  set(CMAKE_POSITION_INDEPENDENT_CODE ON)
  set(LLAMA_BUILD_COMMON OFF)
  set(LLAMA_BUILD_TESTS OFF)
  set(LLAMA_BUILD_EXAMPLES OFF)
  set(LLAMA_BUILD_SERVER OFF)
  set(LLAMA_BUILD_TOOLS OFF)
  set(LLAMA_BUILD_APP OFF)
  set(LLAMA_OPENSSL OFF)
  set(GGML_CCACHE OFF)
  set(GGML_RPC ON)  # a device that is not the host, for the offload test
  # Portable by default: with -march=native on a CPU with AVX512-FP16, ggml
  # accumulates single-token f16 dot products in f16 (docs/llama-cpp.md).
  set(GGML_NATIVE ${MOE_RESIDENCY_LLAMA_CPP_NATIVE})
  # llama.cpp's own warnings are not ours.
  set(LLAMA_ALL_WARNINGS OFF)
  set(LLAMA_FATAL_WARNINGS OFF)
  add_subdirectory("${dir}" "${CMAKE_BINARY_DIR}/_deps/llama.cpp" EXCLUDE_FROM_ALL SYSTEM)
endfunction()

if(MOE_RESIDENCY_LLAMA_CPP_DIR)
  if(NOT TARGET llama)
    _mr_add_llama_cpp_subproject("${MOE_RESIDENCY_LLAMA_CPP_DIR}")
  endif()
  message(STATUS "moe_residency: llama.cpp from the checkout ${MOE_RESIDENCY_LLAMA_CPP_DIR}")
else()
  find_package(llama CONFIG QUIET)
  if(NOT llama_FOUND)
    message(FATAL_ERROR
      "MOE_RESIDENCY_BUILD_LLAMA_CPP is ON but no llama.cpp was found. Either\n"
      "  -DMOE_RESIDENCY_LLAMA_CPP_DIR=$(scripts/fetch-llama-cpp.sh)   (build it here), or\n"
      "  -DCMAKE_PREFIX_PATH=$(scripts/fetch-llama-cpp.sh --install)   (use an installed one).")
  endif()
  message(STATUS "moe_residency: llama.cpp ${LLAMA_VERSION} (commit ${LLAMA_BUILD_COMMIT}) from ${llama_DIR}")
endif()

# llama.cpp's RPC backend: the offload test's device (a subproject builds it;
# an installed llama.cpp says in its ggml config).
if(MOE_RESIDENCY_LLAMA_CPP_DIR)
  set(MOE_RESIDENCY_LLAMA_RPC ON)
else()
  set(MOE_RESIDENCY_LLAMA_RPC "${GGML_RPC}")
endif()

if(NOT TARGET moe_residency_llama_cpp)
  add_library(moe_residency_llama_cpp INTERFACE)
  add_library(moe_residency::llama_cpp ALIAS moe_residency_llama_cpp)
  target_link_libraries(moe_residency_llama_cpp INTERFACE moe_residency::moe_residency llama)
endif()

# Everything the llama_cpp-labelled tests need, so CI can build only that:
#   cmake --build <dir> --target moe_residency_llama_cpp_checks
if(NOT TARGET moe_residency_llama_cpp_checks)
  add_custom_target(moe_residency_llama_cpp_checks)
  if(TARGET moe_residency_cli)  # the smoke test replays the probe's trace with it
    add_dependencies(moe_residency_llama_cpp_checks moe_residency_cli)
  endif()
endif()

# Every adapter header compiles on its own (the main header-set check cannot:
# these need llama.h). One generated translation unit per header.
if(MOE_RESIDENCY_BUILD_TESTS AND NOT TARGET moe_residency_llama_cpp_headers)
  file(GLOB _mr_adapter_hpp CONFIGURE_DEPENDS RELATIVE "${_mr_llama_repo}/include"
       "${_mr_llama_repo}/include/moe_residency/adapters/llama_cpp.hpp"
       "${_mr_llama_repo}/include/moe_residency/adapters/llama_cpp/*.hpp")
  set(_mr_adapter_tus "")
  foreach(_h IN LISTS _mr_adapter_hpp)
    string(MAKE_C_IDENTIFIER "${_h}" _id)
    set(_tu "${CMAKE_BINARY_DIR}/adapter_headers/${_id}.cpp")
    file(CONFIGURE OUTPUT "${_tu}" CONTENT "#include \"${_h}\"\n")
    list(APPEND _mr_adapter_tus "${_tu}")
  endforeach()
  add_library(moe_residency_llama_cpp_headers OBJECT ${_mr_adapter_tus})
  target_link_libraries(moe_residency_llama_cpp_headers PRIVATE moe_residency::llama_cpp moe_residency_warnings)
  add_dependencies(moe_residency_llama_cpp_checks moe_residency_llama_cpp_headers)
endif()

# The C ABI (include/moe_residency/c/moe_residency.h): the residency manager for
# engines that embed llama.cpp from C, Go, Rust, Swift. Static by default
# (BUILD_SHARED_LIBS=ON: shared); links llama.
if(NOT TARGET moe_residency_c)
  enable_language(C)  # the C ABI's test is a .c file
  add_library(moe_residency_c "${_mr_llama_repo}/src/c/moe_residency_c.cpp")
  add_library(moe_residency::c ALIAS moe_residency_c)
  target_include_directories(moe_residency_c PUBLIC "$<BUILD_INTERFACE:${_mr_llama_repo}/include>"
                                                    "$<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>")
  target_link_libraries(moe_residency_c PUBLIC llama PRIVATE moe_residency::llama_cpp)
  if(TARGET moe_residency_warnings)
    target_link_libraries(moe_residency_c PRIVATE moe_residency_warnings)
  endif()
  set_target_properties(moe_residency_c PROPERTIES POSITION_INDEPENDENT_CODE ON)
  add_dependencies(moe_residency_llama_cpp_checks moe_residency_c)
  if(MOE_RESIDENCY_INSTALL)
    install(TARGETS moe_residency_c ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
            LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
    install(FILES "${_mr_llama_repo}/include/moe_residency/c/moe_residency.h"
            DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/moe_residency/c)
  endif()
endif()

if(MOE_RESIDENCY_BUILD_EXAMPLES)
  add_subdirectory("${_mr_llama_repo}/examples/llama_cpp" "${CMAKE_BINARY_DIR}/examples/llama_cpp")
endif()
# The memory lab's tools: the tests run them (the lab's smoke test, the walks, the
# C ABI's model), so they build with the examples or the tests; never installed.
if(MOE_RESIDENCY_BUILD_EXAMPLES OR MOE_RESIDENCY_BUILD_TESTS)
  add_subdirectory("${_mr_llama_repo}/lab/llama_cpp" "${CMAKE_BINARY_DIR}/lab/llama_cpp")
endif()
if(MOE_RESIDENCY_BUILD_TESTS)
  add_subdirectory("${_mr_llama_repo}/tests/llama_cpp" "${CMAKE_BINARY_DIR}/tests/llama_cpp")
endif()
