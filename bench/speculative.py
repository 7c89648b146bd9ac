"""Speculative decoding by prompt lookup against decoding one token a step, through the
router and a --role=both worker on the SmolLM2 model, measured in the same run: the same
worker flags but --speculative-tokens (the peer: 0).

Three kinds of chat request, each a reply that the prompt lookup can or cannot guess:
`copy` (repeat a passage), `edit` (rewrite a function: much of the reply quotes it), `free`
(an open question: nothing to look up). Per kind and client concurrency: output tokens/s
of the run (greedy, so both sides generate the same tokens), their ratio, and the share of
drafts accepted (the worker's cleave_worker_speculative_*_tokens_total). Runs interleave
(plain, speculative, plain, ...) and the median of --reps is reported.

Run (after a build): /usr/bin/python3 bench/speculative.py [--tokens 4] [--reps 3]
"""
import argparse
import concurrent.futures
import statistics
import time

import grpc

from harness import MODEL, ct

PASSAGE = ("The lighthouse keeper climbed the stairs every evening at six. He wound the clock, "
           "trimmed the wick and wrote the weather in a book with a green cover. Ships passed "
           "far out at sea, and on clear nights he counted their lights until midnight.")
FUNCTION = '''def moving_average(values, window):
    result = []
    total = 0.0
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        if index >= window - 1:
            result.append(total / window)
    return result'''
KINDS = {
    "copy": f"Repeat this text exactly, word for word:\n\n{PASSAGE}",
    "edit": f"Add a docstring to this Python function and return the whole function:\n\n"
            f"{FUNCTION}",
    "free": "Describe a walk through a forest in autumn.",
}

parser = argparse.ArgumentParser()
parser.add_argument("--tokens", type=int, default=4, help="--speculative-tokens of the worker")
parser.add_argument("--concurrency", default="1,4", help="clients at once, comma-separated")
parser.add_argument("--max-tokens", type=int, default=160)
parser.add_argument("--reps", type=int, default=3)
parser.add_argument("--threads", type=int, default=2, help="CPU threads of the worker")
args = parser.parse_args()


class Deployment:
    def __init__(self, tokens):
        self.router = ct.Process([ct.binary("cleave-router"), "--listen=127.0.0.1:0",
                                  "--metrics-port=0", f"--model={MODEL}"])
        address = f"127.0.0.1:{self.router.ready['grpc_port']}"
        self.worker = ct.Process([ct.binary("cleave-worker"), "--role=both", f"--model={MODEL}",
                                  f"--router={address}", "--listen=127.0.0.1:0",
                                  "--metrics-port=0", "--target-concurrency=8",
                                  "--planned-seq-len=512", f"--threads={args.threads}",
                                  f"--speculative-tokens={tokens}"])
        self.channel = grpc.insecure_channel(address)
        self.stub = ct.stubs()["generation_grpc"].GenerationStub(self.channel)
        ct.wait_for_workers(self.stub, 1)

    def counts(self):
        port = self.worker.ready["metrics_port"]
        return [ct.metric(port, f"cleave_worker_speculative_{n}_tokens_total")
                for n in ("draft", "accepted")]

    def run(self, prompt, clients):
        """Output tokens/s of `clients` copies of `prompt` at once, the tokens of each, and
        the drafts (drafted, accepted) they caused."""
        pb = ct.stubs()["generation_pb2"]
        # The prefix cache makes every copy's prompt free after the first: only decoding
        # differs between the two sides.
        request = pb.GenerateRequest(
            chat=pb.Chat(messages=[pb.ChatMessage(role="user", content=prompt)]),
            sampling=pb.SamplingParams(temperature=0),
            stopping=pb.StoppingCriteria(max_new_tokens=args.max_tokens))

        def one(_):
            ids = []
            for message in self.stub.Generate(request, timeout=600):
                ids += list(message.token_ids)
            return ids

        before = self.counts()
        start = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(clients) as pool:
            outputs = list(pool.map(one, range(clients)))
        seconds = time.monotonic() - start
        after = self.counts()
        return (sum(map(len, outputs)) / seconds, outputs,
                [a - b for a, b in zip(after, before)])

    def stop(self):
        self.channel.close()
        self.worker.stop()
        self.router.stop()


plain, speculative = Deployment(0), Deployment(args.tokens)
try:
    print(f"SmolLM2-135M Q4_1, a --role=both worker of {args.threads} threads, greedy, "
          f"at most {args.max_tokens} tokens; --speculative-tokens {args.tokens} against 0; "
          f"median of {args.reps}")
    print(f"{'kind':<6} {'clients':>7} {'tokens':>7} {'plain tok/s':>12} {'spec tok/s':>11} "
          f"{'ratio':>6} {'accepted':>9}")
    for kind, prompt in KINDS.items():
        for clients in map(int, args.concurrency.split(",")):
            for side in (plain, speculative):
                side.run(prompt, clients)  # Warm-up: caches the prompt.
            rates = {id(plain): [], id(speculative): []}
            drafts = [0.0, 0.0]
            tokens = None
            for _ in range(args.reps):
                for side in (plain, speculative):
                    rate, outputs, counted = side.run(prompt, clients)
                    rates[id(side)].append(rate)
                    if side is speculative:
                        drafts = [d + c for d, c in zip(drafts, counted)]
                    if tokens is None:
                        tokens = outputs
                    elif outputs != tokens:
                        raise SystemExit(f"{kind}: the two sides generated different tokens")
            a, b = statistics.median(rates[id(plain)]), statistics.median(rates[id(speculative)])
            accepted = drafts[1] / drafts[0] if drafts[0] else 0.0
            print(f"{kind:<6} {clients:>7} {len(tokens[0]):>7} {a:>12.1f} {b:>11.1f} "
                  f"{b / a:>5.2f}x {accepted:>8.0%}", flush=True)
finally:
    plain.stop()
    speculative.stop()
