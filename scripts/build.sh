#!/usr/bin/env bash
# Configures and builds Cleave with a CMake preset (default: "default").
# Usage: scripts/build.sh [PRESET]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
preset="${1:-default}"
# Fresh clones in other folders share the compiler cache.
export CCACHE_BASEDIR="$root"
export CCACHE_NOHASHDIR=1
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset"
