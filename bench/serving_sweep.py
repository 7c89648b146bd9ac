"""Serving on this machine, colocated against disaggregated: the same `cleave bench`
sweep over concurrency through `cleave up --both 1` (one worker that prefills and decodes,
two threads) and `cleave up --prefill 1 --decode 1` (one thread each, KV over UCX), both
with target concurrency 16. Writes each run's JSON and one HTML report overlaying them.

Run (after a build): /usr/bin/python3 bench/serving_sweep.py [--out DIR] [--sweep 1,2,4,8,16]
    [--requests N] [--prompt-len 64:512] [--output-len 128]
"""
import argparse
import os
import subprocess

from harness import MODEL, ROOT, ct

parser = argparse.ArgumentParser()
parser.add_argument("--out", default=os.path.join(ROOT, "build", "serving-sweep"))
parser.add_argument("--sweep", default="1,2,4,8,16")
parser.add_argument("--requests", type=int, default=24)
parser.add_argument("--prompt-len", default="64:512")
parser.add_argument("--output-len", default="128")
parser.add_argument("--slo-ttft-ms", default="2000")
parser.add_argument("--slo-itl-ms", default="100")
args = parser.parse_args()
os.makedirs(args.out, exist_ok=True)

DEPLOYMENTS = {
    "colocated": ["--both=1", "--threads=2"],
    "disaggregated": ["--prefill=1", "--decode=1", "--threads=1"],
}
results = []
for label, flags in DEPLOYMENTS.items():
    up = ct.Process([ct.binary("cleave"), "up", f"--model={MODEL}", "--listen=127.0.0.1:0",
                     "--target-concurrency=16", "--planned-seq-len=1024", *flags],
                    ready_timeout=120)
    result = os.path.join(args.out, f"{label}.json")
    command = ["cleave", "bench", f"--router=127.0.0.1:{up.ready['grpc_port']}",
               f"--sweep={args.sweep}", f"--requests={args.requests}", "--warmup=2",
               f"--prompt-len={args.prompt_len}", f"--output-len={args.output_len}",
               f"--slo-ttft-ms={args.slo_ttft_ms}", f"--slo-itl-ms={args.slo_itl_ms}",
               f"--label={label}", f"--json={result}"]
    print(f"== {label}: cleave up {' '.join(flags)}", flush=True)
    try:
        subprocess.run([ct.binary("cleave")] + command[1:], check=True, timeout=3600)
    finally:
        up.proc.send_signal(2)
        up.proc.wait(60)
    results.append(result)
report = os.path.join(args.out, "serving-sweep.html")
subprocess.run([ct.binary("cleave"), "bench-report", f"--html={report}",
                "--title=Colocated vs disaggregated, SmolLM2-135M Q4_1 on 2 CPU cores",
                *results], check=True)
print(f"report: {report}")
