# Defines moe_residency::xsimd, the xsimd that moe_residency::simd links, in the
# directory that includes this file (an IMPORTED target, not GLOBAL: nothing
# leaks into the rest of the consumer's project). Expects the `xsimd` target
# from find_package(xsimd).
#
# Debian 12's xsimd 8.1 package exports `xsimd` with INTERFACE_LINK_LIBRARIES
# "xtl" without finding xtl, so linking `xsimd` puts a non-existent -lxtl on the
# link line. xsimd needs xtl only for xtl::xcomplex support, which we do not use.
# When xsimd names an xtl that is not a target (and no installed xtl is found),
# moe_residency::xsimd carries xsimd's usage requirements without its link
# libraries, instead of creating a stand-in `xtl` target in the user's project.
if(NOT TARGET moe_residency::xsimd)
  add_library(moe_residency::xsimd INTERFACE IMPORTED)
  get_target_property(_mr_xsimd_links xsimd INTERFACE_LINK_LIBRARIES)
  if(_mr_xsimd_links MATCHES "(^|;)xtl(;|$)" AND NOT TARGET xtl)
    find_package(xtl QUIET)
  endif()
  if(_mr_xsimd_links MATCHES "(^|;)xtl(;|$)" AND NOT TARGET xtl)
    foreach(_mr_prop IN ITEMS INTERFACE_INCLUDE_DIRECTORIES INTERFACE_SYSTEM_INCLUDE_DIRECTORIES
                              INTERFACE_COMPILE_DEFINITIONS INTERFACE_COMPILE_OPTIONS
                              INTERFACE_COMPILE_FEATURES)
      get_target_property(_mr_value xsimd ${_mr_prop})
      if(_mr_value)
        set_property(TARGET moe_residency::xsimd PROPERTY ${_mr_prop} "${_mr_value}")
      endif()
    endforeach()
    list(REMOVE_ITEM _mr_xsimd_links xtl)
    if(_mr_xsimd_links)
      set_property(TARGET moe_residency::xsimd PROPERTY INTERFACE_LINK_LIBRARIES "${_mr_xsimd_links}")
    endif()
    unset(_mr_prop)
    unset(_mr_value)
  else()
    set_property(TARGET moe_residency::xsimd PROPERTY INTERFACE_LINK_LIBRARIES xsimd)
  endif()
  unset(_mr_xsimd_links)
endif()
