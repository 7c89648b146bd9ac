"""What a disaggregated deployment costs a conversation's later turns, and what computing a
short rest on the decode worker (--local-prefill-tokens) saves: conversations of several
turns through a router, a prefill worker and a decode worker (--role decode, or both), on the
SmolLM2 model. Each turn's prompt is the previous prompt, its reply and a new user message
(token ids, so nothing is re-tokenized), as a chat or agent loop sends them.

Two setups in one run, alternating conversations (A B A B ...):

  * remote  -- --local-prefill-tokens 0: every turn is prefilled by the prefill worker, which
               holds the previous prompt but not the reply (only the decode worker decoded
               it), and its KV is sent to the decode worker (its cached blocks skipped);
  * local   -- --local-prefill-tokens N: a turn whose missing tokens on the decode worker are
               at most N is computed there (reply + new message), nothing sent.

With --peer no-checkpoints the first setup is instead 'local' on workers that keep no state
checkpoints (--state-checkpoints 0), for a model with linear-attention layers (Qwen3.5,
Qwen3-Next, --model): each turn is then computed whole, which is what the checkpoints save.
Elsewhere every worker keeps two (--state-checkpoints 2: a decode worker keeps none unless
told, and computes a turn's rest from the one its decoding left).

Reported per setup and turn: time to first token (median over conversations), prompt tokens
computed per turn (both workers' counters), KV bytes sent. The first turn is alike in both
(nothing cached anywhere): it is the peer measured in the same run.

Run (after a build): /usr/bin/python3 bench/multi_turn.py [--conversations 6] [--turns 4]
  [--first 400] [--message 24] [--reply 48] [--local 256] [--role decode|both]
  [--model PATH] [--peer remote|no-checkpoints] [--vocab N]
"""
import argparse
import os
import random
import statistics
import time

import grpc

from harness import MODEL, ct

parser = argparse.ArgumentParser()
parser.add_argument("--conversations", type=int, default=6, help="per setup")
parser.add_argument("--turns", type=int, default=4)
parser.add_argument("--first", type=int, default=400, help="tokens of the first prompt")
parser.add_argument("--message", type=int, default=24, help="tokens of each new user message")
parser.add_argument("--reply", type=int, default=48, help="tokens generated per turn")
parser.add_argument("--local", type=int, default=256, help="--local-prefill-tokens of 'local'")
parser.add_argument("--threads", type=int, default=1, help="CPU threads per worker")
parser.add_argument("--role", choices=("decode", "both"), default="decode",
                    help="the decode worker's --role")
parser.add_argument("--model", default=MODEL, help="GGUF file or model folder")
parser.add_argument("--peer", choices=("remote", "no-checkpoints"), default="remote",
                    help="what 'local' is compared with")
parser.add_argument("--vocab", type=int, default=40000, help="prompt token ids are below this")
args = parser.parse_args()

pb = ct.stubs()["generation_pb2"]
COUNTERS = ("cleave_worker_prefill_tokens_total", "cleave_worker_kv_sent_bytes_total")


class Deployment:
    def __init__(self, local, checkpoints=2):
        self.router = ct.Process([ct.binary("cleave-router"), "--listen=127.0.0.1:0",
                                  "--metrics-port=0", f"--local-prefill-tokens={local}"])
        address = f"127.0.0.1:{self.router.ready['grpc_port']}"
        length = args.first + args.turns * (args.message + args.reply)
        common = [f"--model={args.model}", f"--router={address}", "--listen=127.0.0.1:0",
                  "--metrics-port=0", "--target-concurrency=2", f"--planned-seq-len={length}",
                  f"--threads={args.threads}", f"--state-checkpoints={checkpoints}"]
        self.workers = [ct.Process([ct.binary("cleave-worker"), "--role=prefill", *common],
                                   ready_timeout=300),
                        ct.Process([ct.binary("cleave-worker"), f"--role={args.role}", *common],
                                   ready_timeout=300)]
        self.channel = grpc.insecure_channel(address)
        self.stub = ct.stubs()["generation_grpc"].GenerationStub(self.channel)
        ct.wait_for_workers(self.stub, 2)

    def counters(self):
        return [sum(ct.metric(w.ready["metrics_port"], name) for w in self.workers)
                for name in COUNTERS]

    def turn(self, ids):
        """(TTFT s, reply ids, prompt tokens computed, KV bytes sent) of one greedy turn."""
        before = self.counters()
        request = pb.GenerateRequest(sampling=pb.SamplingParams(temperature=0),
                                     stopping=pb.StoppingCriteria(max_new_tokens=args.reply,
                                                                  ignore_eos=True))
        request.token_ids.ids.extend(ids)
        start = time.perf_counter()
        first, reply = None, []
        for message in self.stub.Generate(request, timeout=600):
            if first is None and message.token_ids:
                first = time.perf_counter() - start
            reply += list(message.token_ids)
        after = self.counters()
        return first, reply, after[0] - before[0], after[1] - before[1]

    def stop(self):
        self.channel.close()
        for w in self.workers:
            w.stop()
        self.router.stop()


peer = "remote" if args.peer == "remote" else "no ckpt"
setups = {peer: Deployment(0) if args.peer == "remote" else Deployment(args.local, checkpoints=0),
          "local": Deployment(args.local)}
results = {name: [[] for _ in range(args.turns)] for name in setups}
try:
    for c in range(args.conversations):
        rng = random.Random(c)
        first = [rng.randrange(1000, args.vocab) for _ in range(args.first)]
        messages = [[rng.randrange(1000, args.vocab) for _ in range(args.message)]
                    for _ in range(args.turns)]
        for name, deployment in setups.items():  # the same conversation through both
            ids = list(first)
            for t in range(args.turns):
                ttft, reply, computed, sent = deployment.turn(ids)
                results[name][t].append((ttft, computed, sent))
                ids += reply + messages[t]
finally:
    for deployment in setups.values():
        deployment.stop()

print(f"{args.conversations} conversations x {args.turns} turns: first prompt {args.first} "
      f"tokens, +{args.reply} reply and +{args.message} message tokens a turn, "
      f"--local-prefill-tokens {args.local} for 'local', a --role={args.role} decode worker, "
      f"{os.path.basename(args.model.rstrip('/'))}")
print(f"turn  setup    TTFT p50 ms  computed tokens  KV sent MiB   TTFT local/{peer}")
for t in range(args.turns):
    p50 = {name: statistics.median(r[0] for r in results[name][t]) for name in setups}
    for name in setups:
        rows = results[name][t]
        computed = statistics.median(r[1] for r in rows)
        sent = statistics.median(r[2] for r in rows) / 2**20
        ratio = f"{p50['local'] / p50[peer]:.2f}" if name == "local" else ""
        print(f"{t + 1:>4}  {name:<7} {p50[name] * 1e3:>12.1f} {computed:>16.0f} "
              f"{sent:>12.2f}   {ratio}")
