"""Time to first token of the same prompt through a --role=both worker and through a
prefill worker + decode worker (KV moved over UCX), on the SmolLM2 model, both behind a
router on loopback; median of --reps runs each, with the prefill and KV-transfer parts the
router reports.

Run (after a build): /usr/bin/python3 bench/disaggregated_ttft.py [--tokens N] [--reps R]
"""
import argparse
import statistics
import time

import grpc

from harness import MODEL, ct

parser = argparse.ArgumentParser()
parser.add_argument("--tokens", type=int, default=1024)
parser.add_argument("--reps", type=int, default=5)
parser.add_argument("--threads", type=int, default=1, help="CPU threads per worker")
args = parser.parse_args()


def measure(roles):
    pb = ct.stubs()["generation_pb2"]
    router = ct.Process([ct.binary("cleave-router"), "--listen=127.0.0.1:0", "--metrics-port=0"])
    address = f"127.0.0.1:{router.ready['grpc_port']}"
    workers = [ct.Process([ct.binary("cleave-worker"), f"--role={role}", f"--model={MODEL}",
                           f"--router={address}", "--listen=127.0.0.1:0", "--metrics-port=0",
                           "--target-concurrency=4", f"--planned-seq-len={args.tokens + 64}",
                           f"--threads={args.threads}"]) for role in roles]
    stub = ct.stubs()["generation_grpc"].GenerationStub(grpc.insecure_channel(address))
    while len(stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5).workers) < len(roles):
        time.sleep(0.05)
    ttft, prefill, transfer = [], [], []
    try:
        for rep in range(args.reps + 1):
            # A different prompt each time, so no prefix cache helps.
            ids = [1000 + (rep * 7919 + i * 31) % 20000 for i in range(args.tokens)]
            request = pb.GenerateRequest(token_ids=pb.TokenIds(ids=ids),
                                         sampling=pb.SamplingParams(temperature=0),
                                         stopping=pb.StoppingCriteria(max_new_tokens=2,
                                                                      ignore_eos=True))
            final = None
            for message in stub.Generate(request, timeout=300):
                if message.HasField("final"):
                    final = message.final
            if rep:  # The first run warms up.
                ttft.append(final.timings.time_to_first_token_ms)
                prefill.append(final.timings.prefill_ms)
                transfer.append(final.timings.kv_transfer_ms)
    finally:
        for w in workers:
            w.stop()
        router.stop()
    return statistics.median(ttft), statistics.median(prefill), statistics.median(transfer)


print(f"prompt of {args.tokens} tokens, {args.threads} thread(s) per worker, median of {args.reps}")
print(f"{'deployment':32} {'TTFT ms':>10} {'prefill ms':>11} {'KV transfer ms':>15}")
for name, roles in (("--role=both", ["both"]), ("prefill + decode (UCX)", ["prefill", "decode"])):
    t, p, x = measure(roles)
    print(f"{name:32} {t:10.1f} {p:11.1f} {x:15.1f}")
