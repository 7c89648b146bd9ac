"""Chaos: two prefill and two decode workers serve a steady streaming load while, every
few seconds, a worker of a random role is killed with SIGKILL and a replacement started.

  * every request completes, with exactly the tokens the offline engine (cleave generate)
    produces for its prompt (greedy): no request is lost to a worker's death;
  * after the load no KV block is reserved on the router or on any live worker.

The duration is CLEAVE_CHAOS_SECONDS (30 by default; the documented long run is 180). The
figures (requests, kills, migrations) are printed.
"""
import concurrent.futures
import os
import random
import sys
import threading
import time
import unittest

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import cleave_testing as ct  # noqa: E402
from migration_test import offline  # noqa: E402
from serving_test import MODEL, WORDS, metric  # noqa: E402

SECONDS = float(os.environ.get("CLEAVE_CHAOS_SECONDS", "30"))
CLIENTS = 32  # Streaming clients: each decode worker runs 16 of them at once.
MAX_NEW = 160  # As in migration_test, whose offline references this test shares.


@unittest.skipUnless(os.path.exists(MODEL), f"{MODEL} missing; run scripts/install-deps.sh")
class ChaosTest(unittest.TestCase):
    def test_no_request_is_lost_while_workers_die(self):
        pb = ct.stubs()["generation_pb2"]
        router = ct.Process([ct.binary("cleave-router"), "--listen=127.0.0.1:0",
                             "--metrics-port=0", f"--model={MODEL}",
                             "--heartbeat-interval-ms=200", "--lease-timeout-ms=1000",
                             "--max-migrations=10"])
        address = f"127.0.0.1:{router.ready['grpc_port']}"

        def start(role):
            return ct.Process([ct.binary("cleave-worker"), f"--role={role}", f"--model={MODEL}",
                               f"--router={address}", "--listen=127.0.0.1:0", "--metrics-port=0",
                               "--target-concurrency=16", "--planned-seq-len=256", "--threads=1"])

        workers = {"prefill": [start("prefill"), start("prefill")],
                   "decode": [start("decode"), start("decode")]}
        rng = random.Random(11)
        prompts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 30)))
                   for _ in range(6)]
        want = {p: offline(p) for p in prompts}
        channel = grpc.insecure_channel(address)
        stub = ct.stubs()["generation_grpc"].GenerationStub(channel)
        ct.wait_for_workers(stub, 4)

        stop = threading.Event()
        wrong, failed, done = [], [], []
        lock = threading.Lock()

        def client(seed):
            local = random.Random(seed)
            while not stop.is_set():
                prompt = local.choice(prompts)
                request = pb.GenerateRequest(
                    text=prompt, add_special_tokens=True,
                    sampling=pb.SamplingParams(temperature=0),
                    stopping=pb.StoppingCriteria(max_new_tokens=local.randint(16, MAX_NEW),
                                                 ignore_eos=True))
                ids = []
                try:
                    for message in stub.Generate(request, timeout=120):
                        ids += list(message.token_ids)
                except grpc.RpcError as e:
                    with lock:
                        failed.append(f"{e.code()}: {e.details()}")
                    continue
                with lock:
                    done.append(1)
                    if ids != want[prompt][:len(ids)] or len(ids) != request.stopping.max_new_tokens:
                        wrong.append(prompt)

        kills = []
        try:
            with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
                futures = [pool.submit(client, i) for i in range(CLIENTS)]
                end = time.monotonic() + SECONDS
                chaos = random.Random(3)
                while time.monotonic() < end:
                    time.sleep(min(chaos.uniform(4, 8), max(0, end - time.monotonic())))
                    if time.monotonic() >= end:
                        break
                    role = chaos.choice(("prefill", "decode"))
                    victim = workers[role].pop(chaos.randrange(2))
                    victim.proc.kill()
                    victim.stop()  # Reaps it and closes its log.
                    kills.append(role)
                    workers[role].append(start(role))
                stop.set()
                for f in futures:
                    f.result()
            migrations = metric(router.ready["metrics_port"], "cleave_router_migrations_total")
            print(f"\n{SECONDS:.0f} s, {CLIENTS} clients: {len(done)} requests completed, "
                  f"{len(failed)} failed, {len(kills)} workers killed ({', '.join(kills)}), "
                  f"{migrations:.0f} migrations")
            self.assertEqual(failed, [])
            self.assertEqual(wrong, [])
            self.assertGreater(len(kills), 0)
            self.assertGreater(len(done), 0)
            ct.wait_until_nothing_reserved(router, workers["prefill"] + workers["decode"])
        finally:
            stop.set()
            channel.close()
            codes = [w.stop() for w in workers["prefill"] + workers["decode"]] + [router.stop()]
            self.assertEqual(codes, [0] * len(codes))


if __name__ == "__main__":
    unittest.main()
