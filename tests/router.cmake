# A second build of the router suite with -march=native, so the F16C / AVX2 /
# AVX-512 (or NEON) conversion and FMA paths are exercised next to the default
# build's SSE2 / portable fallback. Only on GCC/Clang; never on the library.
#
# test_router_native also links test_router.cpp a second time as an object
# compiled with the default flags (MOE_RESIDENCY_TEST_SECOND_TU): two TUs built
# for different targets in one program, as in the xsimd::dispatch pattern, so
# the kernels' per-architecture instantiation is checked at link and run time.
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  include(CheckCXXCompilerFlag)
  check_cxx_compiler_flag(-march=native _mr_has_march_native)
  if(_mr_has_march_native)
    add_library(test_router_second_tu OBJECT "${CMAKE_CURRENT_SOURCE_DIR}/test_router.cpp")
    target_link_libraries(test_router_second_tu PRIVATE moe_residency::moe_residency
                          moe_residency_warnings)
    target_compile_definitions(test_router_second_tu PRIVATE MOE_RESIDENCY_TEST_SECOND_TU=1)

    add_executable(test_router_native "${CMAKE_CURRENT_SOURCE_DIR}/test_router.cpp"
                   $<TARGET_OBJECTS:test_router_second_tu>)
    target_link_libraries(test_router_native PRIVATE moe_residency_test_main
                          moe_residency::moe_residency moe_residency_warnings)
    target_compile_options(test_router_native PRIVATE -march=native)
    target_compile_definitions(test_router_native PRIVATE MOE_RESIDENCY_TEST_NATIVE=1
      MOE_RESIDENCY_TEST_HAS_SECOND_TU=1
      MOE_RESIDENCY_DEFAULT_TRACES="${MOE_RESIDENCY_TRACES_DIR}"
      MOE_RESIDENCY_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
    add_test(NAME test_router_native COMMAND test_router_native)
  endif()
endif()
