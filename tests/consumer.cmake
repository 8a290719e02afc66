# The consumer tests: a tiny project that uses the library through find_package
# against a fresh install of this build, and through add_subdirectory.
option(MOE_RESIDENCY_TEST_CONSUMER "Build a tiny consumer project via find_package and add_subdirectory" ON)
if(MOE_RESIDENCY_TEST_CONSUMER AND MOE_RESIDENCY_INSTALL)
  # Each mode for the umbrella target and for a core-only consumer (moe_residency::core).
  # scripts/check-core-only.sh builds the core ones again with Eigen, xsimd and Threads hidden.
  foreach(_mode IN ITEMS find_package add_subdirectory)
    foreach(_component IN ITEMS all core)
      set(_name consumer_${_mode})
      if(_component STREQUAL "core")
        set(_name consumer_${_mode}_core)
      endif()
      add_test(NAME ${_name}
        COMMAND "${CMAKE_COMMAND}" -DMODE=${_mode} -DCOMPONENT=${_component}
                "-DSOURCE_DIR=${PROJECT_SOURCE_DIR}" "-DBUILD_ROOT=${PROJECT_BINARY_DIR}"
                "-DGENERATOR=${CMAKE_GENERATOR}" -P "${CMAKE_CURRENT_SOURCE_DIR}/consumer/run.cmake")
      # They configure the checkout's CMakeLists and install this tree; one at a time.
      set_tests_properties(${_name} PROPERTIES RESOURCE_LOCK consumer)
    endforeach()
  endforeach()
endif()
