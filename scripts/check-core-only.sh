#!/usr/bin/env bash
# Proves that moe_residency::core needs no third-party package: builds, with
# Eigen, xsimd and Threads hidden,
#   1. every core header on its own (the project configured with only what it
#      finds, target moe_residency_core_verify_interface_header_sets),
#   2. the core-only consumer (tests/consumer/core.cpp) through
#      find_package(moe_residency COMPONENTS core) on an install of this checkout,
#   3. the same consumer through add_subdirectory.
# Hiding: in a private mount namespace (unshare; root, or an unprivileged user
# namespace), an empty directory is bind-mounted over every xsimd and Eigen
# header and CMake package directory, so neither the compiler nor CMake can see
# them; the system packages stay installed. Threads cannot be hidden that way
# (std::thread lives in libstdc++ and libc), so find_package(Threads) is
# disabled (CMAKE_DISABLE_FIND_PACKAGE_Threads) and tests/layers.cmake checks
# that no core header includes <thread>, <mutex> or <condition_variable>.
# Before building, a control compile of <xsimd/xsimd.hpp> and <Eigen/Core>
# must FAIL, or the hiding did not work and the check means nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
src="$PWD"
work="${MOE_RESIDENCY_CORE_ONLY_DIR:-$src/build/core-only}"
gen=(-G Ninja)
command -v ninja >/dev/null || gen=()

if [[ "${1:-}" != "--inside" ]]; then
  rm -rf "$work"
  mkdir -p "$work/empty"
  echo "== check-core-only: install this checkout (headers and package config) into $work/prefix"
  cmake -S . -B "$work/full" "${gen[@]}" -DMOE_RESIDENCY_BUILD_TESTS=OFF -DMOE_RESIDENCY_BUILD_EXAMPLES=OFF \
        -DMOE_RESIDENCY_INSTALL=ON >/dev/null
  cmake --install "$work/full" --prefix "$work/prefix" >/dev/null
  # Every directory that holds xsimd or Eigen headers or CMake package files.
  mapfile -t hide < <(find /usr /usr/local /opt -maxdepth 6 -type d \
      \( -name xsimd -o -name eigen3 -o -name Eigen3 -o -name xtl \) 2>/dev/null | sort -u)
  if [[ ${#hide[@]} -eq 0 ]]; then
    echo "check-core-only: no xsimd or Eigen directories found to hide" >&2
    exit 1
  fi
  printf '   hiding %s\n' "${hide[@]}"
  if [[ $(id -u) -eq 0 ]]; then ns=(unshare --mount --propagation private)
  else ns=(unshare --mount --map-root-user --propagation private); fi
  exec "${ns[@]}" bash "$0" --inside "$work" "${hide[@]}"
fi

# --- inside the private mount namespace -------------------------------------
shift
work="$1"; shift
for d in "$@"; do mount --bind "$work/empty" "$d"; done

echo "== check-core-only: control: xsimd and Eigen must be invisible now"
for h in xsimd/xsimd.hpp Eigen/Core eigen3/Eigen/Core; do
  if printf '#include <%s>\nint main() { return 0; }\n' "$h" | c++ -std=c++17 -x c++ - -fsyntax-only 2>/dev/null; then
    echo "check-core-only: <$h> still compiles; the hiding failed" >&2
    exit 1
  fi
done
no_deps=(-DCMAKE_DISABLE_FIND_PACKAGE_xsimd=ON -DCMAKE_DISABLE_FIND_PACKAGE_Eigen3=ON
         -DCMAKE_DISABLE_FIND_PACKAGE_Threads=ON -DCMAKE_DISABLE_FIND_PACKAGE_xtl=ON)

echo "== check-core-only: every core header compiles alone (VERIFY_INTERFACE_HEADER_SETS)"
cmake -S . -B "$work/core" "${gen[@]}" -DMOE_RESIDENCY_BUILD_TESTS=OFF -DMOE_RESIDENCY_BUILD_EXAMPLES=OFF \
      "${no_deps[@]}" >/dev/null
cmake --build "$work/core" --target moe_residency_core_verify_interface_header_sets

extra=$(IFS=';'; echo "${no_deps[*]}")
for mode in find_package add_subdirectory; do
  echo "== check-core-only: core consumer via $mode"
  cmake -DMODE="$mode" -DCOMPONENT=core -DSOURCE_DIR="$PWD" -DBUILD_ROOT="$work" \
        -DGENERATOR="${gen[1]:-Unix Makefiles}" -DPREFIX="$work/prefix" "-DEXTRA_ARGS=$extra" \
        -P tests/consumer/run.cmake
done
echo "== check-core-only passed"
