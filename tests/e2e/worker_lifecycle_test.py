"""A decode worker frees what no router will come back for: a reservation nobody starts
is fenced when its ttl passes, and freed after the quarantine; one past its deadline is
left to its router while that router is there; a decoding sequence whose router's token
stream stays closed past the lease is freed; a Release saying a writer may still write
fences the blocks instead of freeing them. Driven over the worker protocol directly (the
router's side of cleave/v1/worker.proto), with no router running.
"""
import os
import re
import sys
import time
import unittest

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import cleave_testing as ct  # noqa: E402
from serving_test import MODEL, metric  # noqa: E402


# Long enough that no lease or quarantine ends between two statements of a test, however
# slowly it runs.
QUARANTINE_MS = 4000
LEASE_MS = 2000


@unittest.skipUnless(os.path.exists(MODEL), f"{MODEL} missing; run scripts/install-deps.sh")
class WorkerLifecycleTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.pb = ct.stubs()["worker_pb2"]
        cls.gen = ct.stubs()["generation_pb2"]
        cls.worker = ct.Process([ct.binary("cleave-worker"), "--role=both", f"--model={MODEL}",
                                 "--listen=127.0.0.1:0", "--metrics-port=0",
                                 "--target-concurrency=2", "--planned-seq-len=2048",
                                 "--threads=2", f"--lease-timeout-ms={LEASE_MS}",
                                 "--kv-transfer-timeout-ms=1000", f"--kv-quarantine-ms={QUARANTINE_MS}"])
        cls.channel = grpc.insecure_channel(f"127.0.0.1:{cls.worker.ready['grpc_port']}")
        cls.decode = ct.stubs()["worker_grpc"].DecodeControlStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        assert cls.worker.stop() == 0

    def setUp(self):
        # Each test starts from an empty cache: what a failed test left is fenced or freed
        # within the lease and the quarantine.
        deadline = time.monotonic() + (LEASE_MS + QUARANTINE_MS) / 1000 + 5
        while (self.reserved(), self.fenced()) != (0, 0):
            self.assertLess(time.monotonic(), deadline, "an earlier test's blocks stayed held")
            time.sleep(0.05)

    def keep_router_alive(self):
        """The test router's token stream, open until the test ends: its reservations are not
        fenced for the router's silence however slowly the test runs."""
        stream = self.decode.StreamTokens(self.pb.StreamTokensRequest(router_id="test-router"))
        self.addCleanup(stream.cancel)

    def worker_id(self, worker=None):
        """A worker's own id (address and incarnation), from cleave_worker_info."""
        _, text = ct.http_get((worker or self.worker).ready["metrics_port"])
        return re.search(r'^cleave_worker_info\{[^}]*worker_id="([^"]+)"', text, re.M).group(1)

    def reserved(self):
        return metric(self.worker.ready["metrics_port"], "cleave_worker_kv_blocks_reserved")

    def wait_until_freed(self, seconds):
        deadline = time.monotonic() + seconds
        while self.reserved() != 0:
            self.assertLess(time.monotonic(), deadline, "the reservation was never freed")
            time.sleep(0.05)

    def reserve(self, request_id, max_new_tokens=20, prompt_tokens=4, decode=None, **kwargs):
        blocks = (prompt_tokens + max_new_tokens + 15) // 16
        return (decode or self.decode).Reserve(self.pb.ReserveRequest(
            request_id=request_id, router_id="test-router", num_blocks=blocks,
            prompt_tokens=prompt_tokens, max_new_tokens=max_new_tokens, **kwargs), timeout=10)

    def first_token(self, worker, channel, request_id, prompt):
        """The first token of `prompt` prefilled by `worker` for itself."""
        decode = ct.stubs()["worker_grpc"].DecodeControlStub(channel)
        self.reserve(request_id, prompt_tokens=len(prompt), decode=decode)
        try:
            return ct.stubs()["worker_grpc"].PrefillControlStub(channel).Prefill(
                self.pb.PrefillRequest(
                    request_id=request_id, prompt_token_ids=prompt,
                    sampling=self.gen.SamplingParams(temperature=0),
                    stopping=self.gen.StoppingCriteria(max_new_tokens=20, ignore_eos=True),
                    destination=self.pb.KvDestination(
                        decode_worker_id=self.worker_id(worker))), timeout=60).first_token_id
        finally:
            decode.Release(self.pb.ReleaseRequest(request_id=request_id), timeout=10)

    def fenced(self):
        return metric(self.worker.ready["metrics_port"], "cleave_worker_kv_blocks_fenced")

    def test_an_unstarted_reservation_is_fenced_after_its_ttl_then_freed(self):
        self.keep_router_alive()  # Only the ttl fences it.
        self.assertEqual(len(self.reserve("ttl", ttl_ms=1000).block_ids), 2)
        deadline = time.monotonic() + 5
        while self.fenced() != 1:  # A prefill may still write its prompt's block a while.
            self.assertLess(time.monotonic(), deadline, "the reservation was never fenced")
            time.sleep(0.02)
        self.assertEqual(self.reserved(), 1)
        self.wait_until_freed(QUARANTINE_MS / 1000 + 5)
        self.assertEqual(self.fenced(), 0)

    def test_a_reservation_past_its_deadline_is_its_routers_to_release(self):
        # The router's token stream is open: whether a prefill may still write into the
        # reservation is the router's to say, so the worker keeps it past its deadline.
        self.keep_router_alive()
        self.reserve("late", deadline_unix_ms=int(time.time() * 1000) + 300, ttl_ms=60000)
        time.sleep(LEASE_MS / 1000 + 0.7)  # Past the deadline, the lease and a sweep or more.
        self.assertEqual(self.reserved(), 2)
        released = self.decode.Release(self.pb.ReleaseRequest(request_id="late"), timeout=10)
        self.assertEqual((released.blocks_freed, released.blocks_fenced), (2, 0))
        self.assertEqual(self.reserved(), 0)

    def test_a_release_whose_writer_may_still_write_fences_the_blocks(self):
        # 4 blocks: the prompt's first one (all a prefill worker is told to write) is fenced,
        # the rest freed.
        self.keep_router_alive()
        first = self.reserve("fenced", max_new_tokens=60)
        released = self.decode.Release(self.pb.ReleaseRequest(
            request_id="fenced", writer_may_be_active=True), timeout=10)
        self.assertEqual((released.blocks_freed, released.blocks_fenced, released.fenced_ms),
                         (0, 1, QUARANTINE_MS))
        self.assertEqual((self.reserved(), self.fenced()), (1, 1))
        # The request is forgotten: the same id reserves afresh, in other blocks.
        second = self.reserve("fenced", max_new_tokens=60)
        self.assertNotIn(first.block_ids[0], second.block_ids)
        self.assertEqual(self.reserved(), 5)
        released = self.decode.Release(self.pb.ReleaseRequest(request_id="fenced"), timeout=10)
        self.assertEqual((released.blocks_freed, released.blocks_fenced), (4, 0))
        self.wait_until_freed(QUARANTINE_MS / 1000 + 5)
        self.assertEqual(self.fenced(), 0)

    def test_a_reserved_prompt_that_does_not_match_is_refused(self):
        for ids, expected in (([1, 2, 3], "prompt_token_ids has 3 ids; prompt_tokens is 4"),
                              ([1, 2, 3, 10 ** 8], "is outside the vocabulary")):
            with self.assertRaises(grpc.RpcError) as caught:
                self.reserve("bad-prompt", prompt_token_ids=ids)
            self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn(expected, caught.exception.details())
        self.assertEqual(self.reserved(), 0)

    def test_a_reservation_whose_router_went_silent_is_freed(self):
        # Reserved with the router's long ttl, never started, and the router never opens its
        # token stream: fenced once the lease (2 s) is over and freed after the quarantine
        # (4 s), long before the ttl (600 s).
        self.assertEqual(len(self.reserve("unstarted", ttl_ms=600000).block_ids), 2)
        self.wait_until_freed((LEASE_MS + QUARANTINE_MS) / 1000 + 10)

    def test_a_sequence_whose_router_went_silent_is_freed(self):
        # The router's token stream closes once the sequence decodes and is not opened again;
        # with a 2 s lease the worker gives up on a sequence that would decode for many
        # seconds more.
        stream = self.decode.StreamTokens(self.pb.StreamTokensRequest(router_id="test-router"))
        self.addCleanup(stream.cancel)
        self.reserve("orphan", max_new_tokens=2000, ttl_ms=60000)
        prefill = ct.stubs()["worker_grpc"].PrefillControlStub(self.channel)
        done = prefill.Prefill(self.pb.PrefillRequest(
            request_id="orphan", prompt_token_ids=[1, 2, 3, 4],
            sampling=self.gen.SamplingParams(temperature=0),
            stopping=self.gen.StoppingCriteria(max_new_tokens=2000, ignore_eos=True),
            destination=self.pb.KvDestination(decode_worker_id=self.worker_id())), timeout=30)
        self.decode.StartDecode(self.pb.StartDecodeRequest(
            request_id="orphan", prompt_token_ids=[1, 2, 3, 4],
            first_token_id=done.first_token_id,
            sampling=self.gen.SamplingParams(temperature=0),
            stopping=self.gen.StoppingCriteria(max_new_tokens=2000, ignore_eos=True)),
            timeout=10)
        self.assertGreater(self.reserved(), 0)
        stream.cancel()
        self.wait_until_freed(LEASE_MS / 1000 + 8)

    def test_a_second_worker_cannot_share_a_workers_port(self):
        """Two workers started on one port: the second exits naming the address, rather than
        sharing the port (Linux's SO_REUSEPORT) and answering half the calls meant for the
        first."""
        address = f"127.0.0.1:{self.worker.ready['grpc_port']}"
        code, _, err = ct.run([ct.binary("cleave-worker"), f"--model={MODEL}",
                               f"--listen={address}", "--metrics-port=0", "--threads=1"],
                              timeout=60)
        self.assertNotEqual(code, 0)
        self.assertIn(f"cannot serve on {address}", err)

    def test_max_model_len_caps_the_context_served(self):
        """--max-model-len (vLLM's flag): the router reports and enforces the shorter context;
        one longer than the model's is refused at start, naming both."""
        code, _, err = ct.run([ct.binary("cleave-worker"), f"--model={MODEL}",
                               "--listen=127.0.0.1:0", "--metrics-port=0",
                               "--max-model-len=100000"], timeout=60)
        self.assertNotEqual(code, 0)
        self.assertIn("--max-model-len 100000 exceeds the context length", err)
        self.assertIn("8192 tokens", err)
        router = ct.Process([ct.binary("cleave-router"), "--listen=127.0.0.1:0",
                             "--metrics-port=0", f"--model={MODEL}"])
        address = f"127.0.0.1:{router.ready['grpc_port']}"
        worker = ct.Process([ct.binary("cleave-worker"), f"--model={MODEL}",
                             f"--router={address}", "--listen=127.0.0.1:0", "--metrics-port=0",
                             "--target-concurrency=2", "--max-model-len=256", "--threads=1"])
        try:
            with grpc.insecure_channel(address) as channel:
                stub = ct.stubs()["generation_grpc"].GenerationStub(channel)
                ct.wait_for_workers(stub, 1)
                models = stub.ListModels(self.gen.ListModelsRequest(), timeout=5).models
                self.assertEqual(models[0].context_length, 256)
                request = self.gen.GenerateRequest(
                    token_ids=self.gen.TokenIds(ids=[1] * 200),
                    stopping=self.gen.StoppingCriteria(max_new_tokens=100, ignore_eos=True))
                with self.assertRaises(grpc.RpcError) as caught:
                    list(stub.Generate(request, timeout=30))
                self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
                self.assertIn("maximum context length is 256 tokens", caught.exception.details())
                request.stopping.max_new_tokens = 56  # Exactly the context: served.
                ids = [t for m in stub.Generate(request, timeout=60) for t in m.token_ids]
                self.assertEqual(len(ids), 56)
        finally:
            worker.stop()
            router.stop()

    def test_a_decode_worker_prefills_only_for_itself(self):
        """A decode worker computes the prompts of its own reservations (the router's
        --local-prefill-tokens) but refuses one whose KV would go to another worker, and
        holds nothing after the refusal."""
        worker = ct.Process([ct.binary("cleave-worker"), "--role=decode", f"--model={MODEL}",
                             "--listen=127.0.0.1:0", "--metrics-port=0",
                             "--target-concurrency=2", "--planned-seq-len=512", "--threads=1"])
        try:
            with grpc.insecure_channel(f"127.0.0.1:{worker.ready['grpc_port']}") as channel:
                prefill = ct.stubs()["worker_grpc"].PrefillControlStub(channel)
                with self.assertRaises(grpc.RpcError) as caught:
                    prefill.Prefill(self.pb.PrefillRequest(
                        request_id="elsewhere", prompt_token_ids=[1, 2, 3, 4],
                        sampling=self.gen.SamplingParams(temperature=0),
                        stopping=self.gen.StoppingCriteria(max_new_tokens=4),
                        destination=self.pb.KvDestination(decode_worker_id=self.worker_id())),
                        timeout=30)
                self.assertEqual(caught.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
                self.assertIn("--role=prefill", caught.exception.details())
            self.assertEqual(metric(worker.ready["metrics_port"],
                                    "cleave_worker_kv_blocks_reserved"), 0)
        finally:
            self.assertEqual(worker.stop(), 0)

    def test_max_batch_tokens_chunks_a_prompt_over_steps(self):
        """--max-batch-tokens 32: a 100-token prompt is computed in four steps (not one), and
        its first token is the one a worker with 512-token steps computes."""
        worker = ct.Process([ct.binary("cleave-worker"), "--role=both", f"--model={MODEL}",
                             "--listen=127.0.0.1:0", "--metrics-port=0",
                             "--target-concurrency=2", "--planned-seq-len=256", "--threads=1",
                             "--max-batch-tokens=32", "--no-prefix-caching"])
        try:
            prompt = [1000 + (i * 7919) % 30000 for i in range(100)]
            port = worker.ready["metrics_port"]
            with grpc.insecure_channel(f"127.0.0.1:{worker.ready['grpc_port']}") as channel:
                before = metric(port, "cleave_worker_steps_total")
                chunked = self.first_token(worker, channel, "chunked", prompt)
                steps = metric(port, "cleave_worker_steps_total") - before
            self.assertEqual(steps, 4)
            self.assertEqual(chunked, self.first_token(self.worker, self.channel, "whole", prompt))
        finally:
            self.assertEqual(worker.stop(), 0)


if __name__ == "__main__":
    unittest.main()
