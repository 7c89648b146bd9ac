"""Injected faults (CLEAVE_FAULTS, common/faults.h), one test each: every request ends
completed — with exactly the offline engine's tokens — or cleanly failed with a status,
never hung, and no KV block stays reserved on the router or on a live worker.

  * a prefill worker's KV send fails (kv_send_fail) or its put is not posted
    (kv_put_fail): the sequence is placed again and completes;
  * a KV send is delayed past the client's deadline (kv_send_delay_ms): DEADLINE_EXCEEDED,
    blocks freed; a patient request completes;
  * both of those through host staging rows (--kv-staging-tokens): every row comes back;
  * a decode worker's heartbeat stalls while it streams (heartbeat_stall): the router
    drops it, its streams move, it registers again;
  * a decode worker's steps take longer than the router's lease (engine_step_delay): its
    heartbeats go on, so the router keeps it (the worker never has to register again);
  * a prefill worker crashes before its KV send (crash_at=prefill_before_kv_send), or a
    decode worker after some steps (decode_crash_after_steps): the requests complete
    elsewhere;
  * a prefill worker frozen with a KV send nothing stops (kv_send_unstoppable) writes its
    prompt long after the router gave up on it: the blocks it writes are fenced, and the
    request decoding next on that worker is exact.
"""
import concurrent.futures
import os
import random
import signal
import sys
import threading
import time
import unittest

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import cleave_testing as ct  # noqa: E402
from migration_test import offline  # noqa: E402
from serving_test import MODEL, WORDS, metric  # noqa: E402

MAX_NEW = 48
PROMPTS = [" ".join(random.Random(seed).choice(WORDS) for _ in range(4 + 5 * seed))
           for seed in range(4)]


def stop_all(channel, procs, router, frozen=None):
    """Ends a test's processes (`frozen`, one of `procs`, stopped with SIGSTOP)."""
    if frozen is not None:
        os.kill(frozen.proc.pid, signal.SIGCONT)
    channel.close()
    for w in procs:
        w.stop()
    router.stop()


@unittest.skipUnless(os.path.exists(MODEL), f"{MODEL} missing; run scripts/install-deps.sh")
class FaultTest(unittest.TestCase):
    def serve(self, workers, timeout=60, prompts=PROMPTS, extra=(), inspect=None):
        """Runs `prompts` at once through a router and `workers` ((role, CLEAVE_FAULTS or
        None) each, with `extra` flags); returns (results, processes): a result is
        (ids, None) or (None, grpc.StatusCode). With staging, every row must come back.
        `inspect(processes)` runs before they stop."""
        pb = ct.stubs()["generation_pb2"]
        router = ct.Process([ct.binary("cleave-router"), "--listen=127.0.0.1:0",
                             "--metrics-port=0", f"--model={MODEL}",
                             "--heartbeat-interval-ms=200", "--lease-timeout-ms=1000"])
        address = f"127.0.0.1:{router.ready['grpc_port']}"
        procs = []
        for role, faults in workers:
            env = dict(os.environ, CLEAVE_FAULTS=faults) if faults else None
            procs.append(ct.Process([ct.binary("cleave-worker"), f"--role={role}",
                                     f"--model={MODEL}", f"--router={address}",
                                     "--listen=127.0.0.1:0", "--metrics-port=0",
                                     "--target-concurrency=4", "--planned-seq-len=128",
                                     "--threads=1", *extra], env=env))
        channel = grpc.insecure_channel(address)
        stub = ct.stubs()["generation_grpc"].GenerationStub(channel)
        try:
            ct.wait_for_workers(stub, len(workers))

            def generate(prompt):
                request = pb.GenerateRequest(
                    text=prompt, add_special_tokens=True,
                    sampling=pb.SamplingParams(temperature=0),
                    stopping=pb.StoppingCriteria(max_new_tokens=MAX_NEW, ignore_eos=True))
                try:
                    return [t for m in stub.Generate(request, timeout=timeout)
                            for t in m.token_ids], None
                except grpc.RpcError as e:
                    return None, e.code()

            with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
                results = list(pool.map(generate, prompts))
            ct.wait_until_nothing_reserved(router, procs)
            if any(flag.startswith("--kv-staging-tokens") for flag in extra):
                self.wait_until_staging_is_free(procs)
            if inspect is not None:
                inspect(procs)
            return results, procs
        finally:
            stop_all(channel, procs, router)

    def wait_until_staging_is_free(self, procs, seconds=10.0):
        for i, w in enumerate(procs):
            if w.proc.poll() is not None:
                continue
            port = w.ready["metrics_port"]
            for direction in ("send", "receive"):
                capacity = metric(port, "cleave_worker_kv_staging_blocks_capacity",
                                  direction=direction)
                deadline = time.monotonic() + seconds
                while metric(port, "cleave_worker_kv_staging_blocks_free",
                             direction=direction) != capacity:
                    self.assertLess(time.monotonic(), deadline,
                                    f"worker {i} kept {direction} staging rows")
                    time.sleep(0.05)

    def assertExact(self, results, prompts=PROMPTS):
        for prompt, (ids, code) in zip(prompts, results):
            self.assertIsNone(code, prompt)
            self.assertEqual(ids, offline(prompt)[:MAX_NEW], prompt)

    def test_a_failed_kv_send_is_placed_again(self):
        for fault in ("kv_send_fail=1", "kv_put_fail=1"):
            results, procs = self.serve([("prefill", fault), ("decode", None),
                                         ("decode", None)])
            self.assertExact(results)
            self.assertIn("injected fault", procs[0].log(), fault)

    def test_a_kv_send_slower_than_the_deadline_fails_cleanly(self):
        # Past the deadline the router releases the reservation, whose blocks may go to
        # another request: it first stops the prefill (CancelPrefill), and nothing is
        # written once the delay is over.
        sent = []

        def after_the_delay(procs):
            time.sleep(3.5)
            sent.append(metric(procs[0].ready["metrics_port"], "cleave_worker_kv_sent_bytes_total"))

        results, _ = self.serve([("prefill", "kv_send_delay_ms=3000"), ("decode", None)],
                                timeout=1.5, prompts=PROMPTS[:2], inspect=after_the_delay)
        self.assertEqual([code for _, code in results], [grpc.StatusCode.DEADLINE_EXCEEDED] * 2)
        self.assertEqual(sent, [0])
        results, _ = self.serve([("prefill", "kv_send_delay_ms=1000"), ("decode", None)],
                                timeout=60, prompts=PROMPTS[:2])
        self.assertExact(results, PROMPTS[:2])

    def test_failed_and_late_transfers_give_their_staging_rows_back(self):
        """Through staging rows (--kv-staging-tokens, a GPU worker's path; 4 blocks, so the
        prompts also wait for each other's rows): a failed send is placed again, a send past
        the deadline fails cleanly, a Reserve waiting for rows past the deadline too, and every
        send and receive row comes back."""
        staged = ["--kv-staging-tokens=64"]
        results, procs = self.serve([("prefill", "kv_send_fail=1"), ("decode", None),
                                     ("decode", None)], extra=staged)
        self.assertExact(results)
        self.assertIn("injected fault", procs[0].log())
        results, _ = self.serve([("prefill", "kv_send_delay_ms=3000"), ("decode", None)],
                                timeout=1.5, prompts=PROMPTS[:2], extra=staged)
        self.assertEqual([code for _, code in results], [grpc.StatusCode.DEADLINE_EXCEEDED] * 2)
        # One row each way: the second Reserve waits for the row the first holds, past the
        # deadline; neither keeps a row.
        results, _ = self.serve([("prefill", "kv_send_delay_ms=3000"), ("decode", None)],
                                timeout=1.5, prompts=PROMPTS[:2],
                                extra=["--kv-staging-tokens=16"])
        for _, code in results:
            self.assertIn(code, (grpc.StatusCode.DEADLINE_EXCEEDED,
                                 grpc.StatusCode.RESOURCE_EXHAUSTED))

    def test_a_stalled_heartbeat_moves_the_streams(self):
        results, procs = self.serve([("prefill", None),
                                     ("decode", "heartbeat_stall=1,heartbeat_stall_ms=2500"),
                                     ("decode", None)])
        self.assertExact(results)
        self.assertIn("injected fault: heartbeat_stall", procs[1].log())

    def test_steps_longer_than_the_lease_keep_the_worker(self):
        results, procs = self.serve([("prefill", None),
                                     ("decode", "engine_step_delay=2,engine_step_delay_ms=2500")])
        self.assertExact(results)
        self.assertIn("injected fault: engine_step_delay", procs[1].log())
        self.assertNotIn("the router lost this worker", procs[1].log())

    def test_crashing_workers_lose_no_request(self):
        results, procs = self.serve([("prefill", "crash_at=prefill_before_kv_send"),
                                     ("prefill", None), ("decode", None)])
        self.assertExact(results)
        self.assertEqual(procs[0].proc.returncode, 86)
        results, procs = self.serve([("prefill", None), ("decode", "decode_crash_after_steps=10"),
                                     ("decode", None)])
        self.assertExact(results)
        self.assertEqual(procs[1].proc.returncode, 86)

    def test_a_worker_whose_steps_keep_failing_exits_and_loses_no_request(self):
        results, procs = self.serve([("prefill", None), ("decode", "engine_step_fail=3"),
                                     ("decode", None)])
        self.assertExact(results)
        self.assertEqual(procs[1].proc.returncode, 1)
        self.assertIn("engine steps failed 3 times in a row", procs[1].log())

    def test_a_prefill_worker_that_stops_answering_is_passed_over(self):
        """A prefill worker stopped (SIGSTOP: its connections stay open, nothing answers)
        while it computes a prompt: the router's call to it fails by keepalive within about
        15 s, the prompt goes to another prefill worker, and the request completes as the
        offline engine generates it, long before its 90 s deadline."""
        pb = ct.stubs()["generation_pb2"]
        router = ct.Process([ct.binary("cleave-router"), "--listen=127.0.0.1:0",
                             "--metrics-port=0", f"--model={MODEL}"])
        address = f"127.0.0.1:{router.ready['grpc_port']}"
        common = [f"--model={MODEL}", f"--router={address}", "--listen=127.0.0.1:0",
                  "--metrics-port=0", "--target-concurrency=2", "--planned-seq-len=2048",
                  "--threads=1"]
        stopped = ct.Process([ct.binary("cleave-worker"), "--role=prefill", *common])
        procs = [stopped, ct.Process([ct.binary("cleave-worker"), "--role=decode", *common])]
        channel = grpc.insecure_channel(address)
        prompt = " ".join(random.Random(41).choice(WORDS) for _ in range(700))
        try:
            stub = ct.stubs()["generation_grpc"].GenerationStub(channel)
            ct.wait_for_workers(stub, 2)
            result = {}

            def generate():
                started = time.monotonic()
                request = pb.GenerateRequest(
                    text=prompt, add_special_tokens=True,
                    sampling=pb.SamplingParams(temperature=0),
                    stopping=pb.StoppingCriteria(max_new_tokens=MAX_NEW, ignore_eos=True))
                try:
                    result["ids"] = [t for m in stub.Generate(request, timeout=90)
                                     for t in m.token_ids]
                except grpc.RpcError as e:
                    result["error"] = e.code()
                result["seconds"] = time.monotonic() - started

            caller = threading.Thread(target=generate)
            caller.start()
            time.sleep(0.5)  # Computing the prompt.
            os.kill(stopped.proc.pid, signal.SIGSTOP)
            procs.append(ct.Process([ct.binary("cleave-worker"), "--role=prefill", *common]))
            caller.join()
            print(f"\nserved in {result['seconds']:.1f} s with its prefill worker stopped")
            self.assertNotIn("error", result)
            self.assertEqual(result["ids"], offline(prompt)[:MAX_NEW])
            self.assertLess(result["seconds"], 80)  # Keepalive (15 s), then the prompt again.
        finally:
            stop_all(channel, procs, router, stopped)

    def late_write(self, quarantine_ms):
        """A prefill worker frozen (SIGSTOP) while its KV send waits, with a send nothing
        stops: the request's deadline passes, its CancelPrefill goes unanswered, and the
        router releases the decode worker's reservation saying a writer may still write.
        Another prefill worker then serves a second request, decoding on the same decode
        worker, and the frozen one resumes meanwhile and writes the first prompt's KV into
        the blocks it was given. Returns (the second request's tokens, the offline engine's,
        bytes the frozen worker wrote after resuming, blocks fenced then)."""
        pb = ct.stubs()["generation_pb2"]
        router = ct.Process([ct.binary("cleave-router"), "--listen=127.0.0.1:0",
                             "--metrics-port=0", f"--model={MODEL}",
                             "--heartbeat-interval-ms=200", "--lease-timeout-ms=1000"])
        address = f"127.0.0.1:{router.ready['grpc_port']}"
        common = [f"--model={MODEL}", f"--router={address}", "--listen=127.0.0.1:0",
                  "--metrics-port=0", "--target-concurrency=2", "--planned-seq-len=1024",
                  "--threads=1"]
        decode = ct.Process([ct.binary("cleave-worker"), "--role=decode", *common,
                             f"--kv-quarantine-ms={quarantine_ms}"])
        frozen = ct.Process(
            [ct.binary("cleave-worker"), "--role=prefill", *common],
            env=dict(os.environ, CLEAVE_FAULTS="kv_send_delay_ms=3000,kv_send_unstoppable=1"))
        procs = [decode, frozen]
        channel = grpc.insecure_channel(address)
        first = " ".join(random.Random(51).choice(WORDS) for _ in range(350))
        second = " ".join(random.Random(52).choice(WORDS) for _ in range(150))
        expected = offline(second)
        # The first request's deadline: its prompt is computed well before it, however slowly.
        give_up_s = 10

        def request(prompt, new_tokens):
            return pb.GenerateRequest(
                text=prompt, add_special_tokens=True, sampling=pb.SamplingParams(temperature=0),
                stopping=pb.StoppingCriteria(max_new_tokens=new_tokens, ignore_eos=True))

        try:
            stub = ct.stubs()["generation_grpc"].GenerationStub(channel)
            ct.wait_for_workers(stub, 2)
            failed = {}

            def give_up():
                try:
                    list(stub.Generate(request(first, 8), timeout=give_up_s))
                except grpc.RpcError as e:
                    failed["code"] = e.code()

            caller = threading.Thread(target=give_up)
            caller.start()
            port = frozen.ready["metrics_port"]
            deadline = time.monotonic() + give_up_s
            while metric(port, "cleave_worker_prefill_tokens_total") == 0:  # Computing.
                self.assertLess(time.monotonic(), deadline, "the prompt was never computed")
                time.sleep(0.01)
            os.kill(frozen.proc.pid, signal.SIGSTOP)  # In its 3 s wait before sending.
            procs.append(ct.Process([ct.binary("cleave-worker"), "--role=prefill", *common]))
            caller.join()
            self.assertEqual(failed.get("code"), grpc.StatusCode.DEADLINE_EXCEEDED)
            # The router's CancelPrefill times out (5 s), then its Release fences.
            fences = 0
            deadline = time.monotonic() + 20
            while fences == 0:
                self.assertLess(time.monotonic(), deadline, "the reservation was never fenced")
                time.sleep(0.1)
                fences = metric(decode.ready["metrics_port"], "cleave_worker_kv_fences_total")
            fenced = metric(decode.ready["metrics_port"], "cleave_worker_kv_blocks_fenced")
            time.sleep(0.3)  # A quarantine of 1 ms is over and swept.
            ct.wait_for_workers(stub, 2)  # The decode worker and the new prefill worker.
            ids = []
            for message in stub.Generate(request(second, len(expected)), timeout=120):
                resume = len(ids) < 8 <= len(ids) + len(message.token_ids)
                ids.extend(message.token_ids)
                if resume:  # Its prompt is in its blocks: the late write lands now.
                    os.kill(frozen.proc.pid, signal.SIGCONT)
                    deadline = time.monotonic() + 10
                    while metric(port, "cleave_worker_kv_sent_bytes_total") == 0:
                        self.assertLess(time.monotonic(), deadline, "the late write never came")
                        time.sleep(0.01)
            return ids, expected, metric(port, "cleave_worker_kv_sent_bytes_total"), fenced
        finally:
            stop_all(channel, procs, router, frozen)

    def test_a_restarted_router_admits_around_what_the_old_one_left(self):
        """A router killed while its requests decode, and started again at its address: the
        worker still holds the old router's sequences until its lease for that router's
        stream ends, and says so in its heartbeats; the new router's requests, which would
        not fit beside them, wait for room instead of failing, and complete exactly."""
        pb = ct.stubs()["generation_pb2"]
        with ct.listening_socket() as s:
            port = s.getsockname()[1]
        router_args = [ct.binary("cleave-router"), f"--listen=127.0.0.1:{port}",
                       "--metrics-port=0", f"--model={MODEL}", "--heartbeat-interval-ms=200",
                       "--lease-timeout-ms=1000"]
        router = ct.Process(router_args)
        # 128 blocks: three sequences of about 40 blocks leave less than a later request's 11.
        # The worker's lease (6 s) outlasts the new router's start and the worker's joining
        # it, and ends before the old sequences would.
        blocks = 128
        worker = ct.Process([ct.binary("cleave-worker"), "--role=both", f"--model={MODEL}",
                             f"--router=127.0.0.1:{port}", "--listen=127.0.0.1:0",
                             "--metrics-port=0", "--target-concurrency=4",
                             "--planned-seq-len=512", "--threads=1", "--lease-timeout-ms=6000"])
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        later = PROMPTS[:2]
        try:
            stub = ct.stubs()["generation_grpc"].GenerationStub(channel)
            ct.wait_for_workers(stub, 1)
            calls = [stub.Generate(pb.GenerateRequest(
                text=p, add_special_tokens=True, sampling=pb.SamplingParams(temperature=0),
                stopping=pb.StoppingCriteria(max_new_tokens=620, ignore_eos=True)), timeout=120)
                for p in PROMPTS[:3]]
            for call in calls:
                next(call)  # Decoding.
            self.assertGreater(metric(worker.ready["metrics_port"],
                                      "cleave_worker_kv_blocks_reserved"), blocks - 11)
            router.proc.kill()
            router.stop()
            channel.close()
            router = ct.Process(router_args)
            channel = grpc.insecure_channel(f"127.0.0.1:{port}")
            stub = ct.stubs()["generation_grpc"].GenerationStub(channel)
            ct.wait_for_workers(stub, 1)
            started = time.monotonic()
            # The worker's heartbeats say what it holds for the old router (cleave info shows it).
            foreign = 0
            while foreign == 0 and time.monotonic() - started < 10:
                info = stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5)
                foreign = info.workers[0].kv_blocks_foreign
                time.sleep(0.05)
            self.assertGreater(foreign, blocks - 11)

            def generate(prompt):
                request = pb.GenerateRequest(
                    text=prompt, add_special_tokens=True, sampling=pb.SamplingParams(temperature=0),
                    stopping=pb.StoppingCriteria(max_new_tokens=160, ignore_eos=True))
                return [t for m in stub.Generate(request, timeout=60) for t in m.token_ids]

            with concurrent.futures.ThreadPoolExecutor(len(later)) as pool:
                results = list(pool.map(generate, later))
            print(f"\nserved {time.monotonic() - started:.1f} s after the new router started")
            self.assertEqual(results, [offline(p) for p in later])
            ct.wait_until_nothing_reserved(router, [worker])
        finally:
            stop_all(channel, [worker], router)

    def test_a_late_kv_write_lands_in_fenced_blocks(self):
        ids, expected, late_bytes, fenced = self.late_write(quarantine_ms=60000)
        print(f"\n{late_bytes / 2**20:.1f} MiB written late into {fenced:.0f} fenced blocks")
        self.assertGreater(late_bytes, 0)
        self.assertGreater(fenced, 0)
        self.assertEqual(ids, expected)


if __name__ == "__main__":
    unittest.main()
