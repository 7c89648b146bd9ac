"""A burst of requests that share a prompt nobody has computed yet (OpenAI's n > 1, or many
clients starting with one system prompt at once) through a --role=both worker on the
SmolLM2 model: with prefix caching the first computes each block and the others wait a
step and take it from the cache; without (--no-prefix-caching, the peer, measured in the
same run) every request computes the whole prompt.

Reported per setup: the prompt tokens the worker computed (cleave_worker_prefill_tokens_
total; the floor is one prompt plus each other request's last token) and the time to first
token of the burst (median and slowest), median over --reps bursts of fresh prompts.

Run (after a build): /usr/bin/python3 bench/prefix_burst.py [--tokens 1024] [--burst 8]
"""
import argparse
import concurrent.futures
import statistics
import time

import grpc

from harness import MODEL, ct

parser = argparse.ArgumentParser()
parser.add_argument("--tokens", type=int, default=1024, help="prompt tokens")
parser.add_argument("--burst", type=int, default=8, help="requests sent at once")
parser.add_argument("--reps", type=int, default=3)
parser.add_argument("--threads", type=int, default=2, help="CPU threads of the worker")
args = parser.parse_args()


def measure(caching):
    pb = ct.stubs()["generation_pb2"]
    router = ct.Process([ct.binary("cleave-router"), "--listen=127.0.0.1:0", "--metrics-port=0"])
    address = f"127.0.0.1:{router.ready['grpc_port']}"
    worker = ct.Process([ct.binary("cleave-worker"), "--role=both", f"--model={MODEL}",
                         f"--router={address}", "--listen=127.0.0.1:0", "--metrics-port=0",
                         f"--target-concurrency={args.burst}",
                         f"--planned-seq-len={args.tokens + 16}", f"--threads={args.threads}"]
                        + ([] if caching else ["--no-prefix-caching"]))
    stub = ct.stubs()["generation_grpc"].GenerationStub(grpc.insecure_channel(address))
    ct.wait_for_workers(stub, 1)
    port = worker.ready["metrics_port"]
    computed, median_ttft, slowest_ttft = [], [], []

    def one(ids):
        request = pb.GenerateRequest(token_ids=pb.TokenIds(ids=ids),
                                     sampling=pb.SamplingParams(temperature=0),
                                     stopping=pb.StoppingCriteria(max_new_tokens=2,
                                                                  ignore_eos=True))
        for message in stub.Generate(request, timeout=600):
            if message.HasField("final"):
                return message.final.timings.time_to_first_token_ms
        return None

    try:
        for rep in range(args.reps + 1):
            # A fresh prompt each burst: nothing of it is cached when it starts.
            ids = [1000 + (rep * 7919 + i * 31) % 20000 for i in range(args.tokens)]
            before = ct.metric(port, "cleave_worker_prefill_tokens_total")
            with concurrent.futures.ThreadPoolExecutor(args.burst) as pool:
                ttfts = list(pool.map(one, [ids] * args.burst))
            time.sleep(0.3)  # the last step's metrics
            if rep:  # the first burst warms up
                computed.append(ct.metric(port, "cleave_worker_prefill_tokens_total") - before)
                median_ttft.append(statistics.median(ttfts))
                slowest_ttft.append(max(ttfts))
    finally:
        worker.stop()
        router.stop()
    return (statistics.median(computed), statistics.median(median_ttft),
            statistics.median(slowest_ttft))


floor = args.tokens + (args.burst - 1) * (args.tokens - (args.tokens - 1) // 16 * 16)
print(f"{args.burst} requests of one {args.tokens}-token prompt at once, {args.threads} threads, "
      f"median of {args.reps} bursts; floor: {floor} prompt tokens computed")
print(f"{'setup':22} {'tokens computed':>16} {'TTFT p50 ms':>12} {'TTFT max ms':>12}")
for name, caching in (("--no-prefix-caching", False), ("prefix caching", True)):
    c, t, m = measure(caching)
    print(f"{name:22} {c:16.0f} {t:12.1f} {m:12.1f}")
