# Compile-time contracts: each tests/contracts/*.cpp is compiled alone (syntax
# only) and must fail with the message on its "// expect: <regex>" line, or, for
# "^$", compile cleanly (the controls, which show the failures are the contract's
# and not a broken include path). Covers the session's extension hooks (a
# misspelt, mistyped or undeclared hook) and the cache-policy contract.
file(GLOB _mr_contract_sources CONFIGURE_DEPENDS "${CMAKE_CURRENT_SOURCE_DIR}/contracts/*.cpp")
foreach(_src IN LISTS _mr_contract_sources)
  get_filename_component(_name "${_src}" NAME_WE)
  file(STRINGS "${_src}" _expect LIMIT_COUNT 1 REGEX "^// expect: ")
  string(REGEX REPLACE "^// expect: " "" _expect "${_expect}")
  add_test(NAME test_contract_${_name}
    COMMAND "${CMAKE_CXX_COMPILER}" -std=c++17 -fsyntax-only
            "-I$<JOIN:$<TARGET_PROPERTY:moe_residency::moe_residency,INTERFACE_INCLUDE_DIRECTORIES>,;-I>"
            "-I$<JOIN:$<TARGET_PROPERTY:moe_residency::xsimd,INTERFACE_INCLUDE_DIRECTORIES>,;-I>"
            "${_src}"
    COMMAND_EXPAND_LISTS)
  if(_expect STREQUAL "^$")
    # A control must compile: exit code 0 (no regex, so the code counts).
  else()
    set_tests_properties(test_contract_${_name} PROPERTIES PASS_REGULAR_EXPRESSION "${_expect}")
  endif()
endforeach()
