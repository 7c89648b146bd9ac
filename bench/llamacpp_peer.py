"""The peer for bench_engine: llama.cpp (through llama-cpp-python, in the oracle venv made by
tests/golden/setup_oracles.sh) on the same GGUF with the same threads: prefill tokens/s at
128 and 512 tokens, and decode tokens/s at 1, 4, 16 and 64 parallel sequences with 128
tokens of context each (one llama_decode per step holding a token of every sequence, as
llama.cpp's own batched-bench and server do; aggregate tokens/s).

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


def decode_batched(batch):
    """Median seconds per decode step of `batch` sequences, each with 128 tokens of context."""
    params = llama_cpp.llama_context_default_params()
    per_sequence = 256  # A power of two, so llama.cpp splits the context evenly.
    assert 128 + steps * (args.reps + 1) + 1 <= per_sequence, "too many --reps"
    params.n_ctx = batch * per_sequence
    params.n_batch = params.n_ubatch = 512
    params.n_seq_max = batch
    params.n_threads = params.n_threads_batch = args.threads
    ctx = llama_cpp.llama_init_from_model(llm.model, params)
    assert ctx, "llama.cpp could not create a context"
    tokens_batch = llama_cpp.llama_batch_init(512, 0, 1)

    def submit(entries):  # (token, position, sequence, wants logits)
        tokens_batch.n_tokens = len(entries)
        for i, (token, pos, seq, logits) in enumerate(entries):
            tokens_batch.token[i] = token
            tokens_batch.pos[i] = pos
            tokens_batch.n_seq_id[i] = 1
            tokens_batch.seq_id[i][0] = seq
            tokens_batch.logits[i] = logits
        if llama_cpp.llama_decode(ctx, tokens_batch) != 0:
            raise RuntimeError("llama_decode failed")

    for seq in range(batch):
        submit([(t, i, seq, i == 127) for i, t in enumerate(tokens(128))])
    position, times = 128, []
    for r in range(args.reps + 1):
        start = time.perf_counter()
        for _ in range(steps):
            submit([(1234, position, seq, True) for seq in range(batch)])
            position += 1
        if r:
            times.append((time.perf_counter() - start) / steps)
    llama_cpp.llama_batch_free(tokens_batch)
    llama_cpp.llama_free(ctx)
    return statistics.median(times)


for batch in (1, 4, 16, 64):
    t = decode_batched(batch)
    print(f"{'decode batch ' + str(batch):22} {t * 1e3:12.2f} {batch / t:12.1f}")
