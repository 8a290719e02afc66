# test_gemv_abi links a second TU, tests/gemv_abi/other_tu.cpp, which sets
# MOE_RESIDENCY_FUSED_MADD opposite to the target's default: two GEMV settings in
# one program, to check the kernels' ABI tag (detail/gemv.hpp).
if(TARGET test_gemv_abi)
  target_sources(test_gemv_abi PRIVATE "${CMAKE_CURRENT_SOURCE_DIR}/gemv_abi/other_tu.cpp")
endif()
