#!/usr/bin/env bash
# Runs a libFuzzer binary for SECONDS on its committed seed corpus without modifying it
# (new inputs go to a temporary folder). Fails when the fuzzer finds a crash, a leak or a
# timeout, printing the finding; otherwise prints the number of executions.
# Usage: tests/fuzz/run_fuzzer.sh FUZZER_BINARY SEED_DIR SECONDS [extra libFuzzer flags]
set -uo pipefail
binary="$(realpath "$1")"; seeds="$(realpath "$2")"; seconds="$3"; shift 3
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
mkdir -p "$work/corpus"
"$binary" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
  "$@" "$work/corpus" "$seeds" >"$work/log" 2>&1
status=$?
grep -E "^Done [0-9]+ runs|stat::number_of_executed_units|stat::new_units_added" "$work/log"
if [ "$status" -ne 0 ]; then
  echo "$(basename "$binary") failed (exit $status):"
  grep -E "ERROR|SUMMARY|==[0-9]+==|Test unit written|crash-|leak-|timeout-" "$work/log" | head -40
  exit 1
fi
