#!/usr/bin/env bash
# The README's run command: install what is missing, build the tool in
# Release, run the main demo. Extra arguments go to `moe-residency demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --minimal
cmake --preset release -DMOE_RESIDENCY_BUILD_TESTS=OFF >/dev/null
cmake --build --preset release --target moe_residency_cli
exec build/release/bin/moe-residency demo "$@"
