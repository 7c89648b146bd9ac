#!/usr/bin/env bash
# The demo from nothing: installs what is missing, builds, starts a local deployment on the
# CPU with the SmolLM2-135M-Instruct model, runs what exists, prints a summary, and shuts
# everything down. It runs only what is built and says plainly what is not.
# Usage: scripts/demo.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
scripts/install-deps.sh
scripts/build.sh default >/dev/null
bin="$root/build/default/bin"
model="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf"

work="$(mktemp -d)"
router_pid=""
cleanup() {
  if [ -n "$router_pid" ] && kill -0 "$router_pid" 2>/dev/null; then
    kill -TERM "$router_pid"
    wait "$router_pid" || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

echo "== starting cleave-router"
"$bin/cleave-router" --listen 127.0.0.1:0 --metrics-port 0 --ready-file "$work/router.json" \
  2>"$work/router.log" &
router_pid=$!
for _ in $(seq 1 300); do
  [ -f "$work/router.json" ] && break
  kill -0 "$router_pid" 2>/dev/null || { cat "$work/router.log"; exit 1; }
  sleep 0.1
done
[ -f "$work/router.json" ] || { echo "router did not become ready"; cat "$work/router.log"; exit 1; }
grpc_port=$(sed -E 's/.*"grpc_port": ([0-9]+).*/\1/' "$work/router.json")
metrics_port=$(sed -E 's/.*"metrics_port": ([0-9]+).*/\1/' "$work/router.json")
echo "router: gRPC 127.0.0.1:$grpc_port, metrics http://127.0.0.1:$metrics_port/metrics"

echo
echo "== cleave info --router 127.0.0.1:$grpc_port"
"$bin/cleave" info --router "127.0.0.1:$grpc_port"

echo
echo "== starting a decode worker with $(basename "$model")"
worker_status=0
"$bin/cleave-worker" --role=decode --model "$model" --router "127.0.0.1:$grpc_port" \
  --target-concurrency 16 || worker_status=$?

echo
echo "== offline generation on the CPU (cleave generate, greedy)"
for prompt in "What is the capital of France?" "Write one sentence about the sea."; do
  echo "> $prompt"
  "$bin/cleave" generate --model "$model" --max-tokens 48 "$prompt"
done

echo
echo "== router metrics"
/usr/bin/python3 - "$metrics_port" <<'PY'
import sys, urllib.request
body = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read().decode()
for line in body.splitlines():
    if line.startswith(("cleave_build_info", "cleave_router_requests_total")):
        print("  " + line)
PY

echo
echo "== summary"
echo "built and running: cleave-router (Generation API with request validation, health,"
echo "  reflection, /metrics); the CPU engine offline (cleave generate: one sequence, greedy);"
echo "  the cleave CLI (info, inspect, tokenize, detokenize, generate); cleave-worker flag checks."
if [ "$worker_status" -ne 0 ]; then
  echo "not built yet: workers that serve the engine, KV transfer and admission, so there is no"
  echo "  streaming workload at concurrency 16, no TTFT or inter-token latency percentiles,"
  echo "  decode batch size or roofline efficiency to report."
fi
echo "shutting down"
