"""Soak (label `slow`, not in the default suite): a router, a prefill worker and a decode
worker serve streaming greedy requests at the decode worker's target concurrency for
CLEAVE_SOAK_SECONDS (1800 by default):

  * no request fails, and every one has exactly the offline engine's tokens;
  * no KV block stays reserved afterwards;
  * resident memory of every process grows less than 1% from the end of the warm-up (a
    tenth of the run) to the end.

Run: cmake --preset default -DCLEAVE_SLOW_TESTS=ON && ctest --preset default -L slow
  or CLEAVE_SOAK_SECONDS=600 /usr/bin/python3 tests/e2e/soak_test.py   (after a build)
"""
import concurrent.futures
import os
import random
import sys
import threading
import time
import unittest

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
os.environ.setdefault("CLEAVE_BIN_DIR", os.path.join(HERE, "..", "..", "build", "default", "bin"))
os.environ.setdefault("CLEAVE_SOURCE_DIR", os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import cleave_testing as ct  # noqa: E402
from migration_test import offline  # noqa: E402
from overload_test import rss_kib  # noqa: E402
from serving_test import MODEL, WORDS, metric  # noqa: E402

SECONDS = float(os.environ.get("CLEAVE_SOAK_SECONDS", "1800"))
TARGET = 8


@unittest.skipUnless(os.path.exists(MODEL), f"{MODEL} missing; run scripts/install-deps.sh")
class SoakTest(unittest.TestCase):
    def test_hours_of_steady_load_leave_no_trace(self):
        pb = ct.stubs()["generation_pb2"]
        router = ct.Process([ct.binary("cleave-router"), "--listen=127.0.0.1:0",
                             "--metrics-port=0", f"--model={MODEL}"])
        address = f"127.0.0.1:{router.ready['grpc_port']}"
        workers = [ct.Process([ct.binary("cleave-worker"), f"--role={role}", f"--model={MODEL}",
                               f"--router={address}", "--listen=127.0.0.1:0",
                               "--metrics-port=0", f"--target-concurrency={TARGET}",
                               "--planned-seq-len=256", "--threads=1"])
                   for role in ("prefill", "decode")]
        rng = random.Random(21)
        prompts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 40)))
                   for _ in range(8)]
        want = {p: offline(p) for p in prompts}
        channel = grpc.insecure_channel(address)
        stub = ct.stubs()["generation_grpc"].GenerationStub(channel)
        processes = [router] + workers
        try:
            ct.wait_for_workers(stub, 2)
            stop = threading.Event()
            lock = threading.Lock()
            counts = {"requests": 0, "tokens": 0}
            problems = []

            def client(seed):
                local = random.Random(seed)
                while not stop.is_set():
                    prompt = local.choice(prompts)
                    n = local.randint(8, 160)
                    request = pb.GenerateRequest(
                        text=prompt, add_special_tokens=True,
                        sampling=pb.SamplingParams(temperature=0),
                        stopping=pb.StoppingCriteria(max_new_tokens=n, ignore_eos=True))
                    try:
                        ids = [t for m in stub.Generate(request, timeout=120) for t in m.token_ids]
                    except grpc.RpcError as e:
                        with lock:
                            problems.append(f"{e.code()}: {e.details()}")
                        continue
                    with lock:
                        counts["requests"] += 1
                        counts["tokens"] += len(ids)
                        if ids != want[prompt][:n]:
                            problems.append(f"wrong tokens for {prompt!r}")

            start = time.monotonic()
            warm, samples = None, []
            with concurrent.futures.ThreadPoolExecutor(TARGET) as pool:
                futures = [pool.submit(client, i) for i in range(TARGET)]
                while time.monotonic() - start < SECONDS:
                    time.sleep(min(30.0, max(0.0, SECONDS - (time.monotonic() - start))))
                    rss = [rss_kib(p.proc.pid) for p in processes]
                    samples.append(rss)
                    if warm is None and time.monotonic() - start >= SECONDS / 10:
                        warm = rss
                stop.set()
                for f in futures:
                    f.result()
            end = [rss_kib(p.proc.pid) for p in processes]
            warm = warm or samples[0]
            growth = [e / w - 1 for w, e in zip(warm, end)]
            print(f"\n{SECONDS:.0f} s at concurrency {TARGET}: {counts['requests']} requests, "
                  f"{counts['tokens']} tokens, {len(problems)} problems; RSS MiB "
                  f"router/prefill/decode after warm-up "
                  f"{', '.join(f'{k / 1024:.1f}' for k in warm)}, at the end "
                  f"{', '.join(f'{k / 1024:.1f}' for k in end)} "
                  f"({', '.join(f'{100 * g:+.2f}%' for g in growth)})")
            for name, column in (("router", 0), ("prefill", 1), ("decode", 2)):
                print(f"{name} RSS KiB every 30 s: {' '.join(str(s[column]) for s in samples)}")
            self.assertEqual(problems[:5], [])
            self.assertGreater(counts["requests"], 0)
            for g in growth:
                self.assertLess(g, 0.01)
            ct.wait_until_nothing_reserved(router, workers)
        finally:
            channel.close()
            codes = [w.stop() for w in workers] + [router.stop()]
            self.assertEqual(codes, [0] * len(codes))


if __name__ == "__main__":
    unittest.main()
