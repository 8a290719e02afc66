#!/usr/bin/env bash
# Checks that every C and C++ file git tracks is formatted as .clang-format
# says, with the clang-format the style was fixed with (Debian 12's, 14: other
# versions lay some lines out differently). Lists each file that is not, and
# how to fix it; changes nothing.
#
#   scripts/check-format.sh           # check
#   scripts/check-format.sh --fix     # format the files in place
set -euo pipefail
cd "$(dirname "$0")/.."
tool="${CLANG_FORMAT:-}"
if [[ -z "$tool" ]]; then
  if command -v clang-format-14 >/dev/null; then tool=clang-format-14
  elif command -v clang-format >/dev/null; then tool=clang-format
  else
    echo "check-format: clang-format not found; expected Debian's clang-format package (scripts/install-deps.sh installs it)" >&2
    exit 2
  fi
fi
version="$("$tool" --version)"
if [[ "$version" != *" version 14."* ]]; then
  echo "check-format: $tool is '$version'; the style was fixed with clang-format 14, so a difference below may be the version's" >&2
fi
mapfile -t files < <(git ls-files '*.hpp' '*.cpp' '*.h' '*.c')
if [[ "${1:-}" == "--fix" ]]; then
  "$tool" -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  "$tool" --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  printf 'check-format: %s is not formatted as .clang-format says\n' "${bad[@]}" >&2
  echo "check-format: ${#bad[@]} of ${#files[@]} files; run scripts/check-format.sh --fix (or $tool -i FILE) and commit the result" >&2
  exit 1
fi
echo "check-format: ${#files[@]} files formatted as .clang-format says ($tool)"
