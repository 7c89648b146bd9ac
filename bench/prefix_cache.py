"""What prefix caching buys a disaggregated deployment: prompts that share a long prefix (a
system prompt or document per group) through a router, two prefill workers and one decode
worker on the SmolLM2 model, measured with `cleave bench` three ways in one run:

  * no cache       -- prefill workers with --no-prefix-caching compute every prompt whole
                      (the peer: what the deployment did before);
  * least_loaded   -- cached prefixes reused, but the router picks the prefill worker with
                      the fewest outstanding tokens (--prefill-policy=least_loaded), so a
                      group's prompts land on either worker;
  * cache_aware    -- the router's default: a prompt goes where it would finish first,
                      counting its prefix cached there as done.

Reported per setup: time to first token (p50, p99), output tokens/s, and the share of prompt
tokens served from a cache. The floor next to them: the share of prompt tokens that must be
computed at best (each group's prefix once, then every request's own tokens and the partial
block before them), and the TTFT p50 ratio against the no-cache run measured in the same
run.

Each worker's pool is sized by --target-concurrency and --planned-seq-len, as in a
deployment; by default the groups' prefixes do not all fit in one worker's pool, so where
each group's prompts go decides what stays cached.

Run (after a build): /usr/bin/python3 bench/prefix_cache.py [--prefix 512] [--groups 8] [--model M]
  [--own 64] [--requests 48] [--concurrency 4]
"""
import argparse
import json
import os
import tempfile

from harness import MODEL, ct

parser = argparse.ArgumentParser()
parser.add_argument("--prefix", type=int, default=512, help="shared prefix tokens")
parser.add_argument("--groups", type=int, default=8, help="distinct shared prefixes")
parser.add_argument("--own", type=int, default=64, help="each request's own prompt tokens")
parser.add_argument("--output", type=int, default=8, help="generated tokens per request")
parser.add_argument("--requests", type=int, default=48)
parser.add_argument("--concurrency", type=int, default=4)
parser.add_argument("--threads", type=int, default=1, help="CPU threads per worker")
parser.add_argument("--model", default=MODEL,
                    help="GGUF file or model folder (a linear-attention model's prefixes are "
                         "reused from its state checkpoints)")
args = parser.parse_args()

BLOCK = 16


def measure(policy, caching):
    router = ct.Process([ct.binary("cleave-router"), "--listen=127.0.0.1:0", "--metrics-port=0",
                         f"--prefill-policy={policy}"])
    address = f"127.0.0.1:{router.ready['grpc_port']}"
    common = [f"--model={args.model}", f"--router={address}", "--listen=127.0.0.1:0",
              "--metrics-port=0", f"--target-concurrency={args.concurrency}",
              f"--planned-seq-len={args.prefix + args.own + args.output}",
              f"--threads={args.threads}"]
    cache = [] if caching else ["--no-prefix-caching"]
    workers = [ct.Process([ct.binary("cleave-worker"), "--role=prefill", *common, *cache],
                          ready_timeout=300) for _ in range(2)]
    workers.append(ct.Process([ct.binary("cleave-worker"), "--role=decode", *common],
                              ready_timeout=300))
    try:
        out = os.path.join(tempfile.mkdtemp(prefix="cleave-prefix-"), "bench.json")
        code, stdout, stderr = ct.run(
            [ct.binary("cleave"), "bench", f"--router={address}",
             f"--shared-prefix-len={args.prefix}", f"--prefix-groups={args.groups}",
             f"--prompt-len={args.own}", f"--output-len={args.output}",
             f"--concurrency={args.concurrency}", f"--requests={args.requests}",
             f"--warmup={args.groups}", f"--json={out}"], timeout=3600)
        assert code == 0, stderr
        with open(out) as f:
            report = json.load(f)
        return report["points"][0]["summary"]
    finally:
        for w in workers:
            w.stop()
        router.stop()


# At best each group's prefix is computed once (warm-up requests do it) and every measured
# request computes its own tokens and the partial block its prefix leaves before them.
length = args.prefix + args.own
reusable = min(args.prefix, (length - 1) // BLOCK * BLOCK) // BLOCK * BLOCK
best_cached = reusable / length
print(f"{args.requests} requests of {args.prefix} shared ({args.groups} groups) + {args.own} own "
      f"tokens, {args.output} out, concurrency {args.concurrency}, {args.threads} thread(s) per "
      f"worker; at best {100 * best_cached:.0f}% of prompt tokens cached")
print(f"{'setup':14} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12} {'tok/s':>8} {'cached':>7} "
      f"{'TTFT vs no cache':>17}")
baseline = None
for name, policy, caching in (("no cache", "cache_aware", False),
                              ("least_loaded", "least_loaded", True),
                              ("cache_aware", "cache_aware", True)):
    s = measure(policy, caching)
    cached = s.get("cached_prompt_tokens", 0) / max(s["prompt_tokens"], 1)
    baseline = baseline or s["ttft_ms"]["p50"]
    print(f"{name:14} {s['ttft_ms']['p50']:12.1f} {s['ttft_ms']['p99']:12.1f} "
          f"{s['output_token_rate']:8.1f} {100 * cached:6.0f}% "
          f"{s['ttft_ms']['p50'] / baseline:16.2f}x")
