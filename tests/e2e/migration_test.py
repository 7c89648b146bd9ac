"""A decode worker dies (SIGKILL) while it streams: every request it held moves to the
other decode worker and the clients never notice. A decode worker told to stop (SIGTERM)
drains: the router sends it nothing new at once, it finishes what it holds and exits 0.

cleave-router (short leases, so a dead worker is noticed within a second), one prefill
worker and two decode workers on loopback; eight greedy requests stream at once, four on
each decode worker. Once every stream has tokens, one decode worker is killed.

  * every request completes, and its tokens equal the offline engine's (cleave generate)
    for the same prompt, token for token: nothing lost, nothing repeated, the same usage;
  * the router counts the migrations, and no KV block stays reserved anywhere;
  * with --max-migrations=0 the same loss is a clear UNAVAILABLE naming the limit;
  * SIGTERM instead: requests sent after it all go to the other worker, the stopping
    worker's requests finish on it (no migration), every output equals the offline engine's.
"""
import concurrent.futures
import os
import random
import re
import signal
import sys
import threading
import time
import unittest

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import cleave_testing as ct  # noqa: E402
from serving_test import MODEL, WORDS, metric  # noqa: E402

MAX_NEW = 160
_REFERENCE = {}


def offline(prompt):
    """Greedy token ids of the offline engine, computed once per prompt."""
    if prompt not in _REFERENCE:
        code, out, err = ct.run([ct.binary("cleave"), "generate", f"--model={MODEL}", "--no-chat",
                                 "--print-ids", "--ignore-eos", f"--max-tokens={MAX_NEW}",
                                 "--threads=2", prompt], timeout=120)
        assert code == 0, err
        _REFERENCE[prompt] = [int(t) for t in out.split()]
    return _REFERENCE[prompt]


@unittest.skipUnless(os.path.exists(MODEL), f"{MODEL} missing; run scripts/install-deps.sh")
class MigrationTest(unittest.TestCase):
    def run_with_a_kill(self, max_migrations, stop_signal=signal.SIGKILL, lease_ms=1000):
        """Streams 8 requests and stops decode worker 0 with `stop_signal` once all have
        tokens; with SIGTERM, sends 4 more requests while it drains and checks the router
        never gives it one. Returns (prompts, results: (ids, final) or grpc.RpcError per
        prompt, migrations)."""
        pb = ct.stubs()["generation_pb2"]
        router = ct.Process([ct.binary("cleave-router"), "--listen=127.0.0.1:0",
                             "--metrics-port=0", f"--model={MODEL}",
                             "--heartbeat-interval-ms=200", f"--lease-timeout-ms={lease_ms}",
                             f"--max-migrations={max_migrations}"])
        address = f"127.0.0.1:{router.ready['grpc_port']}"
        common = [f"--model={MODEL}", f"--router={address}", "--listen=127.0.0.1:0",
                  "--metrics-port=0", "--target-concurrency=4", "--planned-seq-len=256",
                  "--threads=1",
                  # A drain that outlasts a slow, busy machine: what moves is the drain's fault.
                  "--drain-timeout-ms=120000"]
        workers = [ct.Process([ct.binary("cleave-worker"), f"--role={role}", *common])
                   for role in ("prefill", "decode", "decode")]
        victim = workers[1]
        channel = grpc.insecure_channel(address)
        rng = random.Random(max_migrations)
        draining = stop_signal == signal.SIGTERM
        prompts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 30)))
                   for _ in range(12 if draining else 8)]
        try:
            stub = ct.stubs()["generation_grpc"].GenerationStub(channel)
            ct.wait_for_workers(stub, 3)
            # A worker's id is its address and an incarnation.
            victim_id = next(w.worker_id for w in stub.GetServerInfo(
                pb.GetServerInfoRequest(), timeout=5).workers
                if w.address == f"127.0.0.1:{victim.ready['grpc_port']}")
            self.assertTrue(victim_id.startswith(f"127.0.0.1:{victim.ready['grpc_port']}~"))
            streaming = threading.Semaphore(0)

            def generate(prompt):
                request = pb.GenerateRequest(
                    text=prompt, add_special_tokens=True,
                    sampling=pb.SamplingParams(temperature=0),
                    stopping=pb.StoppingCriteria(max_new_tokens=MAX_NEW, ignore_eos=True))
                ids, final = [], None
                try:
                    for message in stub.Generate(request, timeout=120):
                        if len(ids) < 8 <= len(ids) + len(message.token_ids):
                            streaming.release()
                        ids += list(message.token_ids)
                        if message.HasField("final"):
                            final = message.final
                except grpc.RpcError as e:
                    return e
                return ids, final

            port = router.ready["metrics_port"]
            with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
                futures = [pool.submit(generate, p) for p in prompts[:8]]
                for _ in range(8):
                    self.assertTrue(streaming.acquire(timeout=60), "streams did not start")
                victim.proc.send_signal(stop_signal)
                if draining:
                    # The draining heartbeat is sent as the signal arrives.
                    deadline = time.monotonic() + 30
                    while f"worker {victim_id} is draining" not in router.log():
                        self.assertLess(time.monotonic(), deadline, "the router never heard")
                        time.sleep(0.02)
                    held = []  # Requests the router has admitted to the draining worker.

                    def admitted_to_victim():
                        _, body = ct.http_get(port)
                        found = re.findall(r'^cleave_router_worker_admitted_requests\{worker="'
                                           + re.escape(victim_id) + r'"\} ([0-9.]+)$', body, re.M)
                        return float(found[0]) if found else 0.0

                    held.append(admitted_to_victim())
                    futures += [pool.submit(generate, p) for p in prompts[8:]]
                    while victim.proc.poll() is None:
                        held.append(admitted_to_victim())
                        time.sleep(0.02)
                    print(f"\nthe draining worker held {held[0]:.0f} requests; "
                          f"{len(held)} samples of it while it drained")
                    self.assertGreater(held[0], 0)
                    self.assertEqual(held, sorted(held, reverse=True),
                                     "the draining worker was given a new request")
                    self.assertEqual(victim.proc.wait(30), 0, victim.log())
                else:
                    victim.proc.wait()
                    # How long the router keeps the dead worker registered.
                    killed = time.monotonic()
                    while victim_id in [w.worker_id for w in stub.GetServerInfo(
                            pb.GetServerInfoRequest(), timeout=5).workers]:
                        self.assertLess(time.monotonic() - killed, 120, "never dropped")
                        time.sleep(0.05)
                    self.dropped_after_s = time.monotonic() - killed
                results = [f.result() for f in futures]
            ct.wait_until_nothing_reserved(router, workers)
            return prompts, results, metric(port, "cleave_router_migrations_total")
        finally:
            channel.close()
            codes = [w.stop() for w in workers if w is not victim] + [router.stop()]
            self.assertEqual(codes, [0] * len(codes))

    def test_requests_of_a_killed_decode_worker_continue_on_another(self):
        prompts, results, migrations = self.run_with_a_kill(max_migrations=3)
        print(f"\n{len(prompts)} requests, 1 decode worker killed, {migrations:.0f} migrated")
        self.assertGreater(migrations, 0)
        for prompt, result in zip(prompts, results):
            self.assertNotIsInstance(result, grpc.RpcError, prompt)
            ids, final = result
            self.assertEqual(ids, offline(prompt), prompt)
            self.assertEqual(final.usage.completion_tokens, MAX_NEW)

    def test_a_dead_worker_is_noticed_by_its_token_stream_before_its_lease_ends(self):
        # A 60 s lease: the worker is dropped well within it only if the broken token stream
        # (its reopening refused) gets it dropped.
        prompts, results, migrations = self.run_with_a_kill(max_migrations=3, lease_ms=60000)
        print(f"\nthe dead worker was dropped {self.dropped_after_s:.2f} s after its death "
              f"(lease 60 s)")
        self.assertGreater(migrations, 0)
        self.assertLess(self.dropped_after_s, 30)
        for prompt, result in zip(prompts, results):
            self.assertNotIsInstance(result, grpc.RpcError, prompt)
            self.assertEqual(result[0], offline(prompt), prompt)

    def test_past_the_migration_limit_the_request_fails_clearly(self):
        prompts, results, migrations = self.run_with_a_kill(max_migrations=0)
        self.assertEqual(migrations, 0)
        failed = [r for r in results if isinstance(r, grpc.RpcError)]
        self.assertGreater(len(failed), 0)
        for error in failed:
            self.assertEqual(error.code(), grpc.StatusCode.UNAVAILABLE)
            self.assertIn("--max-migrations", error.details())
        for prompt, result in zip(prompts, results):
            if not isinstance(result, grpc.RpcError):
                self.assertEqual(result[0], offline(prompt))

    def test_a_stopping_decode_worker_drains_and_gets_no_new_work(self):
        # A lease long enough that no worker is dropped for a late heartbeat on a busy
        # machine: every move here would be the drain's fault.
        prompts, results, migrations = self.run_with_a_kill(max_migrations=3,
                                                            stop_signal=signal.SIGTERM,
                                                            lease_ms=10000)
        self.assertEqual(migrations, 0)
        for prompt, result in zip(prompts, results):
            self.assertNotIsInstance(result, grpc.RpcError, prompt)
            self.assertEqual(result[0], offline(prompt), prompt)


if __name__ == "__main__":
    unittest.main()
