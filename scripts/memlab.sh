#!/usr/bin/env bash
# The memory lab is lab/memlab.sh (docs/memlab.md); this name forwards to it.
exec "$(dirname "${BASH_SOURCE[0]}")/../lab/memlab.sh" "$@"
