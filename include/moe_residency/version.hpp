#pragma once
/// moe-residency version. CMake parses these three lines; keep them in this form.
#define MOE_RESIDENCY_VERSION_MAJOR 0
#define MOE_RESIDENCY_VERSION_MINOR 1
#define MOE_RESIDENCY_VERSION_PATCH 0

#define MOE_RESIDENCY_VERSION                                                  \
  (MOE_RESIDENCY_VERSION_MAJOR * 10000 + MOE_RESIDENCY_VERSION_MINOR * 100 +   \
   MOE_RESIDENCY_VERSION_PATCH)
