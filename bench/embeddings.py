"""What an embedding costs next to the engine computing the same prompt: /v1/embeddings
(HTTP, token-id inputs of random ids, so no prefix cache helps) through a router and one
--role=both worker on the SmolLM2 model, against `bench_engine --prefill L` (the engine
alone, with its roofline floor) in the same run.

Reported per input length and batch (inputs per request): the median over rounds of the
request's wall time and its prompt tokens per second, and that rate over the engine's
prefill rate (1.0: the router, HTTP, gRPC and the worker's bookkeeping cost nothing). The
engine's floor/time says how far the compute itself is from the machine's peak.

Run (after a build): /usr/bin/python3 bench/embeddings.py [--lengths 64,256] [--batches 1,8]
"""
import argparse
import http.client
import json
import os
import random
import re
import statistics
import subprocess
import time

from harness import MODEL, ct

parser = argparse.ArgumentParser()
parser.add_argument("--lengths", default="64,256", help="input lengths, tokens")
parser.add_argument("--batches", default="1,8", help="inputs per request")
parser.add_argument("--rounds", type=int, default=5)
parser.add_argument("--threads", type=int, default=2, help="CPU threads of the worker")
args = parser.parse_args()
lengths = [int(x) for x in args.lengths.split(",")]
batches = [int(x) for x in args.batches.split(",")]


def engine_prefill(length):
    """(ms, tokens/s, floor/time) of bench_engine's prefill of `length` tokens."""
    out = subprocess.run([ct.binary("bench_engine"), MODEL, "--threads", str(args.threads),
                          "--prefill", str(length), "--batch", "1"],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    row = re.search(rf"^prefill {length}\s+([0-9.]+)\s+([0-9.]+).*\s([0-9.]+)$", out, re.M)
    return float(row.group(1)), float(row.group(2)), float(row.group(3))


router = ct.Process([ct.binary("cleave-router"), "--listen=127.0.0.1:0", "--metrics-port=0",
                     f"--model={MODEL}", "--http-listen=127.0.0.1:0"])
worker = ct.Process([ct.binary("cleave-worker"), "--role=both", f"--model={MODEL}",
                     f"--router=127.0.0.1:{router.ready['grpc_port']}", "--listen=127.0.0.1:0",
                     "--metrics-port=0", f"--threads={args.threads}", "--target-concurrency=8",
                     "--planned-seq-len=512"])
rng = random.Random(5)
try:
    import grpc
    with grpc.insecure_channel(f"127.0.0.1:{router.ready['grpc_port']}") as channel:
        ct.wait_for_workers(ct.stubs()["generation_grpc"].GenerationStub(channel), 1)

    def embed(inputs):
        connection = http.client.HTTPConnection("127.0.0.1", router.ready["http_port"],
                                                timeout=600)
        started = time.perf_counter()
        connection.request("POST", "/v1/embeddings", json.dumps({"input": inputs}),
                           {"Content-Type": "application/json"})
        answer = connection.getresponse()
        body = answer.read()
        seconds = time.perf_counter() - started
        connection.close()
        assert answer.status == 200, body[:300]
        return seconds

    print(f"{'length':>6} {'batch':>5} {'embed ms':>9} {'embed tok/s':>11} "
          f"{'engine ms':>9} {'engine tok/s':>12} {'ratio':>6} {'engine floor/t':>14}")
    for length in lengths:
        for batch in batches:
            embed([[rng.randrange(100, 49000) for _ in range(length)]])  # Warm up.
            times, engine = [], []
            for _ in range(args.rounds):  # Interleaved: this machine's speed drifts.
                inputs = [[rng.randrange(100, 49000) for _ in range(length)]
                          for _ in range(batch)]
                times.append(embed(inputs))
                engine.append(engine_prefill(length))
            embed_s = statistics.median(times)
            engine_ms = statistics.median(e[0] for e in engine)
            engine_rate = statistics.median(e[1] for e in engine)
            rate = length * batch / embed_s
            print(f"{length:>6} {batch:>5} {embed_s * 1e3:>9.1f} {rate:>11.1f} "
                  f"{engine_ms:>9.1f} {engine_rate:>12.1f} {rate / engine_rate:>6.2f} "
                  f"{statistics.median(e[2] for e in engine):>14.2f}")
finally:
    worker.stop()
    router.stop()
