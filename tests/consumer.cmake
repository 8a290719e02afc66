# The consumer tests: a tiny project that uses the library through find_package
# against a fresh install of this build, and through add_subdirectory.
option(MOE_RESIDENCY_TEST_CONSUMER "Build a tiny consumer project via find_package and add_subdirectory" ON)
if(MOE_RESIDENCY_TEST_CONSUMER AND MOE_RESIDENCY_INSTALL)
  foreach(_mode IN ITEMS find_package add_subdirectory)
    add_test(NAME consumer_${_mode}
      COMMAND "${CMAKE_COMMAND}" -DMODE=${_mode} "-DSOURCE_DIR=${PROJECT_SOURCE_DIR}"
              "-DBUILD_ROOT=${PROJECT_BINARY_DIR}" "-DGENERATOR=${CMAKE_GENERATOR}"
              -P "${CMAKE_CURRENT_SOURCE_DIR}/consumer/run.cmake")
  endforeach()
  # Both configure the checkout's CMakeLists; keep them from running at once.
  set_tests_properties(consumer_find_package consumer_add_subdirectory PROPERTIES RESOURCE_LOCK consumer)
endif()
