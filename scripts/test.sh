#!/usr/bin/env bash
# The README's test command: install what is missing, build everything in
# Debug with warnings as errors, check every public header compiles alone,
# and run the whole test suite with CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake --preset debug >/dev/null
cmake --build --preset debug
cmake --build --preset debug --target all_verify_interface_header_sets
ctest --preset debug -j2
