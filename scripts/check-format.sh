#!/usr/bin/env bash
# Fails when a tracked C++/CUDA source is not clang-formatted (.clang-format at the root).
# Usage: scripts/check-format.sh [--fix]
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null; then
  echo "check-format: clang-format is not installed; run scripts/install-deps.sh" >&2
  exit 1
fi
# Tracked files, plus new files not yet added (so --fix formats them before their first commit).
mapfile -t files < <(git ls-files --cached --others --exclude-standard -- '*.h' '*.cc' '*.cu' '*.cuh' 2>/dev/null || true)
if [ "${#files[@]}" -eq 0 ]; then
  mapfile -t files < <(find common kernels services tests bench -name '*.h' -o -name '*.cc' \
                         -o -name '*.cu' -o -name '*.cuh' 2>/dev/null)
fi
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ "${#bad[@]}" -gt 0 ]; then
  echo "Not clang-formatted (fix with scripts/check-format.sh --fix):"
  printf '  %s\n' "${bad[@]}"
  exit 1
fi
echo "check-format: ${#files[@]} files formatted"
