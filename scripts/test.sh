#!/usr/bin/env bash
# The README's test command: install what is missing, build everything in
# Debug with warnings as errors (the Python module included), check every
# public header compiles alone, and run the whole test suite with CTest
# (pytest among it).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
# The Python module and its pytest suite too, with the interpreter install-deps.sh
# installed numpy, pytest and pybind11 for (not whichever python3 is first on PATH).
python=/usr/bin/python3
[[ -x "$python" ]] || python="$(command -v python3)"
cmake --preset debug -DMOE_RESIDENCY_BUILD_PYTHON=ON -DPython3_EXECUTABLE="$python" >/dev/null
cmake --build --preset debug
cmake --build --preset debug --target all_verify_interface_header_sets
ctest --preset debug -j2
