# test_layers: no public header includes one from a layer above it, and no core
# header includes xsimd, Eigen or <thread> (tests/layers/check.cmake). Its
# self-test plants an upward include in a copy of the tree and expects the
# check to name it, so the check itself cannot silently pass everything.
add_test(NAME test_layers COMMAND "${CMAKE_COMMAND}" -P "${CMAKE_CURRENT_SOURCE_DIR}/layers/check.cmake")
add_test(NAME test_layers_self_test
  COMMAND "${CMAKE_COMMAND}" "-DSOURCE_DIR=${PROJECT_SOURCE_DIR}" "-DWORK=${CMAKE_CURRENT_BINARY_DIR}/layers-self-test"
          -P "${CMAKE_CURRENT_SOURCE_DIR}/layers/self_test.cmake")
