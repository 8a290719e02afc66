# Debian 12's xsimd 8.1 package exports a target whose INTERFACE_LINK_LIBRARIES
# names "xtl" without finding it, so consumers link a non-existent -lxtl.
# xsimd needs xtl only for xtl::xcomplex support, which we do not use: find a
# real xtl if one is installed, otherwise stand in an empty interface target.
if(TARGET xsimd AND NOT TARGET xtl)
  get_target_property(_mr_xsimd_links xsimd INTERFACE_LINK_LIBRARIES)
  if(_mr_xsimd_links MATCHES "(^|;)xtl(;|$)")
    find_package(xtl QUIET)
    if(NOT TARGET xtl)
      add_library(xtl INTERFACE IMPORTED GLOBAL)
    endif()
  endif()
endif()
