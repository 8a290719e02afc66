#!/usr/bin/env bash
# The timing model against the memory lab is lab/memlab.sh predict (docs/lab-predict.md); this name forwards to it.
exec "$(dirname "${BASH_SOURCE[0]}")/../lab/memlab.sh" predict "$@"
