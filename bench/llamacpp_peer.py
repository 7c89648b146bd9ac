"""The peer for bench_engine: llama.cpp (through llama-cpp-python, in the oracle venv made by
tests/golden/setup_oracles.sh) on the same GGUF with the same threads: prefill tokens/s at
128 and 512 tokens and single-sequence decode tokens/s with 128 tokens of context.

Run both sides interleaved (this machine's speed drifts), e.g.:
  for i in 1 2; do build/default/bin/bench_engine --threads 2; \
    .cache/oracle-venv/bin/python bench/llamacpp_peer.py --threads 2; done
"""
import argparse
import os
import random
import statistics
import time

import llama_cpp

parser = argparse.ArgumentParser()
parser.add_argument("model", nargs="?", default=os.path.join(
    os.path.dirname(__file__), "..", "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
parser.add_argument("--threads", type=int, default=os.cpu_count())
parser.add_argument("--reps", type=int, default=5)
args = parser.parse_args()

llm = llama_cpp.Llama(model_path=args.model, n_ctx=1024, n_batch=512, n_threads=args.threads,
                      n_threads_batch=args.threads, verbose=False)
rng = random.Random(1)


def tokens(n):
    return [1000 + rng.randrange(20000) for _ in range(n)]


print(f"llama.cpp {llama_cpp.__version__}: {args.threads} threads")
print(f"{'case':22} {'time (ms)':>12} {'tokens/s':>12}")
for length in (128, 512):
    times = []
    for r in range(args.reps + 1):
        prompt = tokens(length)
        llm.reset()
        start = time.perf_counter()
        llm.eval(prompt)
        if r:
            times.append(time.perf_counter() - start)
    t = statistics.median(times)
    print(f"prefill {length:<14} {t * 1e3:12.2f} {length / t:12.1f}")

steps = 8
times = []
for r in range(args.reps + 1):
    llm.reset()
    llm.eval(tokens(128))
    start = time.perf_counter()
    for _ in range(steps):
        llm.eval([1234])
    if r:
        times.append((time.perf_counter() - start) / steps)
t = statistics.median(times)
print(f"{'decode batch 1':22} {t * 1e3:12.2f} {1 / t:12.1f}")
