#!/usr/bin/env bash
# clang-tidy (.clang-tidy) on the C++ files changed since BASE (default: HEAD~1), using the
# compile database of the default build. Usage: scripts/tidy.sh [BASE]
set -euo pipefail
cd "$(dirname "$0")/.."
base="${1:-HEAD~1}"
db=build/default
[ -f "$db/compile_commands.json" ] || { echo "tidy: build first (scripts/build.sh)" >&2; exit 1; }
mapfile -t files < <(git diff --name-only "$base" -- '*.cc' | while read -r f; do [ -f "$f" ] && echo "$f"; done)
[ "${#files[@]}" -gt 0 ] || { echo "tidy: no changed .cc files"; exit 0; }
clang-tidy -p "$db" --quiet "${files[@]}"
