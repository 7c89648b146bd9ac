#!/usr/bin/env bash
# The whole test suite from nothing: installs what is missing, builds, runs every ctest
# test (unit, integration, e2e; cuda tests skip without a GPU) and exits non-zero on any
# failure, with ctest's summary last.
# Usage: scripts/test.sh [extra ctest arguments, e.g. -L unit]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
start=$(date +%s)
scripts/install-deps.sh
scripts/build.sh default
echo "build finished in $(( $(date +%s) - start ))s"
ctest --preset default "$@"
