"""What the OpenAI-compatible HTTP API costs next to the gRPC API it wraps: the same
streaming requests (greedy, fixed lengths) through both paths of one router and one
--role=both worker on the SmolLM2 model, alternating rounds of `--concurrency` requests.

Both ask for logprobs 0 (each token's logprob, no alternatives), which is how the HTTP
client counts tokens per event. Reported per path: median time to first token and inter-token gap seen by the client, and
the router's CPU time per generated token (from /proc: the HTTP path's parsing, JSON and
event framing are extra work of the router, the rest is the same). The peer is the gRPC
path measured in the same run; clients are Python (grpcio, and http.client reading the
server-sent events), so client costs are alike on both sides.

Run (after a build): /usr/bin/python3 bench/http_api.py [--concurrency C] [--rounds R]
"""
import argparse
import concurrent.futures
import http.client
import json
import os
import statistics
import time

from harness import MODEL, ct

parser = argparse.ArgumentParser()
parser.add_argument("--concurrency", type=int, default=8)
parser.add_argument("--rounds", type=int, default=5)
parser.add_argument("--tokens", type=int, default=64, help="generated tokens per request")
parser.add_argument("--threads", type=int, default=2, help="CPU threads of the worker")
args = parser.parse_args()

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def via_grpc(stub, pb, i):
    start = time.perf_counter()
    stamps = []
    request = pb.GenerateRequest(
        text=PROMPT, add_special_tokens=True, parse_special_tokens=True, logprobs=0,
        sampling=pb.SamplingParams(temperature=0),
        stopping=pb.StoppingCriteria(max_new_tokens=args.tokens, ignore_eos=True))
    for message in stub.Generate(request, timeout=300):
        stamps += [time.perf_counter()] * len(message.token_ids)
    return start, stamps


def via_http(port, i):
    start = time.perf_counter()
    stamps = []
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    connection.request("POST", "/v1/completions", body=json.dumps(
        {"prompt": PROMPT, "max_tokens": args.tokens, "temperature": 0, "ignore_eos": True,
         "stream": True, "logprobs": 0}), headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200, response.read()
    for line in response:
        if line.startswith(b"data: {"):
            chunk = json.loads(line[6:])
            # One logprob entry per token the event carries.
            stamps += [time.perf_counter()] * len(chunk["choices"][0]["logprobs"]["tokens"])
    connection.close()
    return start, stamps


def round_of(call):
    with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
        results = list(pool.map(call, range(args.concurrency)))
    ttft = [stamps[0] - start for start, stamps in results]
    gaps = [b - a for _, stamps in results for a, b in zip(stamps, stamps[1:])]
    tokens = sum(len(stamps) for _, stamps in results)
    assert tokens == args.concurrency * args.tokens, tokens
    return ttft, gaps, tokens


def main():
    pb = ct.stubs()["generation_pb2"]
    router = ct.Process([ct.binary("cleave-router"), "--listen=127.0.0.1:0", "--metrics-port=0",
                         f"--model={MODEL}", "--http-listen=127.0.0.1:0"])
    address = f"127.0.0.1:{router.ready['grpc_port']}"
    worker = ct.Process([ct.binary("cleave-worker"), f"--model={MODEL}", f"--router={address}",
                         "--listen=127.0.0.1:0", "--metrics-port=0",
                         f"--target-concurrency={args.concurrency}", "--planned-seq-len=256",
                         f"--threads={args.threads}"])
    import grpc
    channel = grpc.insecure_channel(address)
    stub = ct.stubs()["generation_grpc"].GenerationStub(channel)
    ct.wait_for_workers(stub, 1)
    paths = {"gRPC": lambda i: via_grpc(stub, pb, i),
             "HTTP": lambda i: via_http(router.ready["http_port"], i)}
    results = {name: {"ttft": [], "gaps": [], "cpu": 0.0, "tokens": 0} for name in paths}
    try:
        for name, call in paths.items():  # warm both paths
            round_of(call)
        for r in range(args.rounds):
            for name, call in (paths.items() if r % 2 == 0 else reversed(paths.items())):
                before = cpu_seconds(router.proc.pid)
                ttft, gaps, tokens = round_of(call)
                results[name]["cpu"] += cpu_seconds(router.proc.pid) - before
                results[name]["ttft"] += ttft
                results[name]["gaps"] += gaps
                results[name]["tokens"] += tokens
    finally:
        channel.close()
        worker.stop()
        router.stop()
    print(f"{args.rounds} rounds x {args.concurrency} concurrent streams x {args.tokens} tokens, "
          f"SmolLM2-135M Q4_1, worker --threads {args.threads}")
    print(f"{'path':6} {'TTFT p50 ms':>12} {'ITL p50 ms':>11} {'router CPU us/token':>20}")
    for name, r in results.items():
        print(f"{name:6} {1e3 * statistics.median(r['ttft']):12.1f} "
              f"{1e3 * statistics.median(r['gaps']):11.2f} "
              f"{1e6 * r['cpu'] / r['tokens']:20.1f}")
    g, h = results["gRPC"], results["HTTP"]
    print(f"HTTP / gRPC: TTFT {statistics.median(h['ttft']) / statistics.median(g['ttft']):.2f}, "
          f"ITL {statistics.median(h['gaps']) / statistics.median(g['gaps']):.2f}, "
          f"router CPU per token {(h['cpu'] / h['tokens']) / (g['cpu'] / g['tokens']):.2f}")


if __name__ == "__main__":
    main()
