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
pids=()
cleanup() {
  for pid in "${pids[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid"
      wait "$pid" || true
    fi
  done
  rm -rf "$work"
}
trap cleanup EXIT

# start NAME READY_FILE COMMAND...: runs a server in the background, waits for its ready file.
start() {
  local name=$1 ready=$2
  shift 2
  "$@" --ready-file "$ready" >"$work/$name.log" 2>&1 &
  pids=("$!" "${pids[@]}")
  for _ in $(seq 1 600); do
    [ -f "$ready" ] && return 0
    kill -0 "${pids[0]}" 2>/dev/null || { cat "$work/$name.log"; exit 1; }
    sleep 0.1
  done
  echo "$name did not become ready"; cat "$work/$name.log"; exit 1
}
port() { sed -E "s/.*\"$2\": ([0-9]+).*/\1/" "$1"; }

echo "== cleave up: router + a prefill worker + a decode worker, KV over UCX"
start up "$work/up.json" "$bin/cleave" up --model "$model" --listen 127.0.0.1:0 \
  --prefill 1 --decode 1 --threads 1 --target-concurrency 16 --planned-seq-len 1024 \
  --http-listen 127.0.0.1:0
router="127.0.0.1:$(port "$work/up.json" grpc_port)"
router_metrics=$(port "$work/up.json" metrics_port)
worker_metrics=$(port "$work/up.json" decode-0_metrics_port)
grep -A6 -m1 "memory plan" "$work/up.log" | sed 's/^[A-Z][0-9]* [0-9:.]* *[0-9]* [a-z_.]*:[0-9]*\] //'
grep -v "^[IWE][0-9]" "$work/up.log" | grep -A4 "cleave up: serving"

echo
echo "== cleave info --router $router"
"$bin/cleave" info --router "$router"

echo
echo "== streaming through the router (cleave generate --router, greedy)"
for prompt in "What is the capital of France?" "Write one sentence about the sea."; do
  echo "> $prompt"
  "$bin/cleave" generate --router "$router" --max-tokens 48 --system "Answer in one sentence." "$prompt"
done

echo
http_port=$(port "$work/up.json" http_port)
echo "== the OpenAI-compatible API: POST http://127.0.0.1:$http_port/v1/chat/completions, streamed"
/usr/bin/python3 - "$http_port" <<'PY'
import json, sys, urllib.request
body = {"messages": [{"role": "user", "content": "Name three rivers in Europe."}],
        "max_tokens": 48, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True}}
request = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/chat/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
print("> Name three rivers in Europe.")
with urllib.request.urlopen(request, timeout=120) as response:
    for line in response:
        data = line.decode().strip().removeprefix("data: ")
        if not data or data == "[DONE]":
            continue
        chunk = json.loads(data)
        if chunk["choices"]:
            print(chunk["choices"][0]["delta"].get("content", ""), end="", flush=True)
        else:
            usage = chunk["usage"]
            print(f"\n({usage['prompt_tokens']} prompt + {usage['completion_tokens']} "
                  "completion tokens)")
# Structured output: decoding constrained to instances of a JSON schema.
schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
          "color": {"enum": ["black", "white", "orange", "grey"]}},
          "required": ["name", "age", "color"]}
body = {"messages": [{"role": "user", "content": "Describe a cat: its name, age and color."}],
        "max_tokens": 96, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "cat", "schema": schema}}}
request = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/chat/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
print('> Describe a cat: its name, age and color.  (response_format: json_schema '
      '{name: string, age: integer, color: black|white|orange|grey})')
with urllib.request.urlopen(request, timeout=120) as response:
    reply = json.load(response)["choices"][0]["message"]["content"]
print(json.dumps(json.loads(reply)))
PY

echo
report="$root/build/demo"
mkdir -p "$report"
echo "== workload: 64 streaming requests, 16 at a time (cleave bench; report in build/demo/bench.html)"
"$bin/cleave" bench --router "$router" --requests 64 --concurrency 16 --prompt-len 32:160 \
  --output-len 64 --slo-ttft-ms 2000 --slo-itl-ms 100 --label demo --json "$report/bench.json" \
  --html "$report/bench.html"

echo
echo "== metrics"
/usr/bin/python3 - "$router_metrics" "$worker_metrics" "$work/efficiency" <<'PY'
import sys, urllib.request
def show(port, prefixes):
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    for line in body.splitlines():
        if line.startswith(prefixes):
            print("  " + line)
    return body
show(sys.argv[1], ("cleave_router_requests_total", "cleave_router_reserved_blocks",
                   "cleave_router_workers", "cleave_http_requests_total"))
body = show(sys.argv[2], ("cleave_worker_steps_total", "cleave_worker_generated_tokens_total",
                          "cleave_worker_kv_blocks_free", "cleave_worker_kv_blocks_reserved",
                          "cleave_worker_step_seconds_total",
                          "cleave_worker_step_floor_seconds_total"))
values = dict(line.rsplit(" ", 1) for line in body.splitlines() if line and line[0] != "#")
floor = float(values["cleave_worker_step_floor_seconds_total"])
spent = float(values["cleave_worker_step_seconds_total"])
print(f"  decode worker efficiency (roofline floor / measured step time): {floor / spent:.2f}")
with open(sys.argv[3], "w") as f:
    f.write(f"{floor / spent:.2f}")
PY

echo
echo "== summary"
echo "ran: cleave up with cleave-router (Generation API, worker registry, KV-budget admission,"
echo "  token relay), a prefill worker and a decode worker on the CPU engine handing KV caches"
echo "  over UCX, the CLI, the OpenAI-compatible HTTP API, and a streaming load test (cleave"
echo "  bench; report in build/demo/bench.html). Deploy with docker-compose (deploy/,"
echo "  docs/operations.md); watch with the Prometheus alerts and Grafana dashboard in deploy/"
echo "  (docs/metrics.md)."
echo "live efficiency of the decode worker over the run: $(cat "$work/efficiency") (roofline floor /"
echo "  measured step time, cleave_worker_step_*; bench/live_efficiency.py compares it with"
echo "  bench_engine at the same batch: docs/benchmarks.md)."
echo "shutting down"
