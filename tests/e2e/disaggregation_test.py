"""End to end, disaggregated: cleave-router, a --role=prefill worker and a --role=decode
worker as real processes on loopback, the prompt's KV cache moving from the prefill worker
to the decode worker over UCX; the final message reports the transfer and no block stays
reserved afterwards.

  * SmolLM2 (Q4_1), prefill TP1 -> decode TP1: greedy outputs equal the offline engine's
    token for token.
  * A float32 Llama (transformers' tiny random model, 2 KV heads) for prefill TP x decode TP
    in (2, 1) and (1, 2): the same tokens as TP1 -> TP1. Float weights, because a model
    with int8-quantized activations cut across ranks sums in another order and may move a
    near-tie greedy choice (docs/engine.md); SmolLM2 runs those pairings too and reports
    its agreement.
  * Transfers staged through host rows apart from the cache (--kv-staging-tokens, what GPU
    workers do): the same tokens as direct ones, prompts waiting for each other's rows.
  * --kv-dtype fp8 and bf16 caches: what the prefill worker wrote decodes to the offline
    engine's tokens with the same cache type; workers whose cache types differ are refused
    by the router, with a message naming both layouts.
  * Requests sharing a prompt prefix cached on the decode worker count its blocks once
    there: four are admitted together where whole copies would fit one at a time.
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
from serving_test import MODEL, WORDS, metric  # noqa: E402

TINY = os.path.join(ct.SOURCE_DIR, "tests", "golden", "data", "engine", "hf", "llama_f32")
GOLDEN_QWEN35 = os.path.join(ct.SOURCE_DIR, "tests", "golden", "data", "engine", "hf",
                             "qwen3_5_f32")
DEEPSEEK = os.path.join(ct.SOURCE_DIR, "tests", "golden", "data", "engine", "hf",
                        "deepseek_v3_moe_f32")
_REFERENCE = {}
BACKGROUND = 40  # tokens of the long request beside the shared-prefix prompts


def offline(prompt, max_tokens, kv_dtype="f32"):
    """Greedy token ids of the offline engine (cleave generate), computed once per prompt."""
    key = (prompt, max_tokens, kv_dtype)
    if key not in _REFERENCE:
        code, out, err = ct.run([ct.binary("cleave"), "generate", f"--model={MODEL}", "--no-chat",
                                 "--print-ids", f"--max-tokens={max_tokens}", "--threads=2",
                                 f"--kv-dtype={kv_dtype}", prompt], timeout=120)
        assert code == 0, err
        _REFERENCE[key] = [int(t) for t in out.split()]
    return _REFERENCE[key]


def offline_ids(model, ids, max_tokens):
    """Greedy continuation of the token ids `ids` by the offline engine, past end-of-sequence."""
    code, out, err = ct.run([ct.binary("cleave"), "generate", f"--model={model}",
                             "--prompt-ids=" + " ".join(map(str, ids)), "--print-ids",
                             "--ignore-eos", f"--max-tokens={max_tokens}", "--threads=2"],
                            timeout=120)
    assert code == 0, err
    return [int(t) for t in out.split()]


def greedy(stub, pb, prompt, max_new_tokens=10, cache_salt=""):
    """A greedy generation of the text `prompt` through the router: its token ids, its final
    message, and how many tokens each streamed message carried."""
    request = pb.GenerateRequest(text=prompt, add_special_tokens=True,
                                 sampling=pb.SamplingParams(temperature=0),
                                 stopping=pb.StoppingCriteria(max_new_tokens=max_new_tokens),
                                 cache_salt=cache_salt)
    ids, final, sizes = [], None, []
    for message in stub.Generate(request, timeout=120):
        ids += list(message.token_ids)
        sizes.append(len(message.token_ids))
        if message.HasField("final"):
            final = message.final
    return ids, final, sizes


def drain(call):
    """Reads a streaming call to its end or its cancellation."""
    try:
        for _ in call:
            pass
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.CANCELLED:
            raise


@unittest.skipUnless(os.path.exists(MODEL), f"{MODEL} missing; run scripts/install-deps.sh")
class DisaggregationTest(unittest.TestCase):
    def serve(self, model, prefill_tp, decode_tp, prompts, text, prefill_workers=1,
              decode_workers=1, kill=None, kv_dtype="f32", extra=(), prefill_extra=(),
              after=None, decode_extra=()):
        """Token ids of greedy generations of `prompts` through router + prefill + decode;
        with kill="prefill" or "decode", the first worker of that role is killed (SIGKILL)
        after registering and before any request: the router must route around it. `extra`
        goes to every worker (and `prefill_extra` to prefill workers after it, `decode_extra`
        to decode workers); `after(stub, pb,
        workers)` runs once the generations are done."""
        pb = ct.stubs()["generation_pb2"]
        router_args = [ct.binary("cleave-router"), "--listen=127.0.0.1:0", "--metrics-port=0"]
        router = ct.Process(router_args + ([f"--model={model}"] if text else []))
        self.router_metrics_port = router.ready["metrics_port"]
        address = f"127.0.0.1:{router.ready['grpc_port']}"
        common = [f"--model={model}", f"--router={address}", "--listen=127.0.0.1:0",
                  "--metrics-port=0", "--target-concurrency=8", "--planned-seq-len=128",
                  "--threads=1", f"--kv-dtype={kv_dtype}", *extra]
        workers = [ct.Process([ct.binary("cleave-worker"), "--role=prefill", f"--tp={prefill_tp}",
                               *common, *prefill_extra]) for _ in range(prefill_workers)]
        workers += [ct.Process([ct.binary("cleave-worker"), "--role=decode", f"--tp={decode_tp}",
                                *common, *decode_extra]) for _ in range(decode_workers)]
        victim = {"prefill": 0, "decode": prefill_workers}.get(kill)
        channel = grpc.insecure_channel(address)
        try:
            stub = ct.stubs()["generation_grpc"].GenerationStub(channel)
            ct.wait_for_workers(stub, len(workers))
            if victim is not None:
                workers[victim].proc.kill()
                workers[victim].proc.wait()

            def generate(prompt):
                request = pb.GenerateRequest(sampling=pb.SamplingParams(temperature=0),
                                             stopping=pb.StoppingCriteria(max_new_tokens=10,
                                                                          ignore_eos=not text))
                if text:
                    request.text, request.add_special_tokens = prompt, True
                else:
                    request.token_ids.ids.extend(prompt)
                ids, final = [], None
                for message in stub.Generate(request, timeout=120):
                    ids += list(message.token_ids)
                    if message.HasField("final"):
                        final = message.final
                if final.finish_reason == pb.FINISH_REASON_LENGTH:
                    self.assertGreater(final.timings.kv_transfer_ms, 0)
                return ids

            with concurrent.futures.ThreadPoolExecutor(max(1, len(prompts))) as pool:
                results = list(pool.map(generate, prompts))
            if after is not None:
                after(stub, pb, workers)
            # (A killed prefill worker's prompts were placed again: the blocks it had been
            # given stay fenced, for all the router knows of it.)
            ct.wait_until_nothing_reserved(router, workers, 10)
            return results
        finally:
            channel.close()
            codes = [w.stop() for i, w in enumerate(workers) if i != victim] + [router.stop()]
            self.assertEqual(codes, [0] * len(codes))

    def test_a_client_leaving_during_prefill_stops_the_prefill(self):
        """A client that cancels while its long prompt is being computed stops the prefill
        worker's work on it (the router's calls are cancelled with the client's), instead
        of the whole prompt being computed and sent for nobody."""
        found = {}

        def after(stub, pb, workers):
            port = workers[0].ready["metrics_port"]  # The prefill worker's.
            rng = random.Random(31)
            request = pb.GenerateRequest(sampling=pb.SamplingParams(temperature=0),
                                         stopping=pb.StoppingCriteria(max_new_tokens=4))
            request.token_ids.ids.extend(rng.randrange(1000, 40000) for _ in range(1500))
            before = metric(port, "cleave_worker_prefill_tokens_total")
            call = stub.Generate(request, timeout=60)
            threading.Timer(0.3, call.cancel).start()
            with self.assertRaises(grpc.RpcError) as caught:
                list(call)
            self.assertEqual(caught.exception.code(), grpc.StatusCode.CANCELLED)
            time.sleep(4)  # Longer than the whole prompt takes on one thread.
            found["computed"] = metric(port, "cleave_worker_prefill_tokens_total") - before
            found["sent"] = metric(port, "cleave_worker_kv_sent_bytes_total")

        self.serve(MODEL, 1, 1, [], text=False, after=after, extra=["--planned-seq-len=2048"])
        print(f"\n{found}")
        self.assertLess(found["computed"], 1500)
        self.assertEqual(found["sent"], 0)

    def test_smollm2_greedy_matches_the_offline_engine(self):
        rng = random.Random(9)
        prompts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40)))
                   for _ in range(8)]
        for (prefill_tp, decode_tp) in ((1, 1), (2, 1), (1, 2)):
            served = self.serve(MODEL, prefill_tp, decode_tp, prompts, text=True)
            same = sum(got == offline(p, 10) for p, got in zip(prompts, served))
            print(f"\nSmolLM2 prefill TP{prefill_tp} -> decode TP{decode_tp}: {same} of "
                  f"{len(prompts)} prompts equal the offline engine")
            if (prefill_tp, decode_tp) == (1, 1):
                for prompt, got in zip(prompts, served):
                    self.assertEqual(got, offline(prompt, 10), prompt)

    def test_speculative_decoding_gives_the_offline_engines_tokens(self):
        # Prompts that repeat a phrase: the replies go on repeating it, so drafts land.
        rng = random.Random(12)
        prompts = [" ".join([" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8)))] * 3)
                   for _ in range(6)]
        counts = {}

        def after(stub, pb, workers):
            # A step's accepted tokens of a sequence reach the client together.
            counts["widest"] = max(greedy(stub, pb, prompts[0])[2])
            port = workers[-1].ready["metrics_port"]  # The decode worker's.
            for name in ("draft", "accepted"):
                counts[name] = metric(port, f"cleave_worker_speculative_{name}_tokens_total")

        served = self.serve(MODEL, 1, 1, prompts, text=True, after=after,
                            extra=("--speculative-tokens=4",))
        print(f"\nspeculative decode worker: {counts['accepted']:.0f} of {counts['draft']:.0f} "
              "drafted tokens accepted")
        self.assertGreater(counts["accepted"], 0)
        self.assertLess(counts["accepted"], counts["draft"])
        self.assertGreater(counts["widest"], 1)
        for prompt, got in zip(prompts, served):
            self.assertEqual(got, offline(prompt, 10), prompt)

    def test_drafts_of_a_linear_attention_model_give_one_token_a_steps_output(self):
        """Qwen3.5 (Gated DeltaNet layers) decoded with drafts, on one rank and on two: each
        decode rank keeps its state after every draft's row, and a sequence whose drafts are
        rejected goes on from the state after the last row it keeps. Token ids and
        log-probabilities are those of a decode worker without drafts. The requests may draw
        only three tokens (allowed_token_ids): this random model's output does not repeat
        otherwise, and drafts by prompt lookup need output that repeats."""
        rng = random.Random(14)
        allowed = [rng.randrange(256) for _ in range(3)]
        prompts = [[rng.randrange(256) for _ in range(rng.randint(2, 9))] + allowed * 3
                   for _ in range(4)]

        def collect(into):
            def after(stub, pb, workers):
                for ids in prompts:
                    request = pb.GenerateRequest(
                        sampling=pb.SamplingParams(temperature=0, allowed_token_ids=allowed),
                        stopping=pb.StoppingCriteria(max_new_tokens=16, ignore_eos=True),
                        logprobs=0)
                    request.token_ids.ids.extend(ids)
                    messages = list(stub.Generate(request, timeout=120))
                    into.append(([t for m in messages for t in m.token_ids],
                                 [p.logprob for m in messages for p in m.logprobs]))
                port = workers[-1].ready["metrics_port"]  # The decode worker's.
                for name in ("draft", "accepted"):
                    into.append(metric(port, f"cleave_worker_speculative_{name}_tokens_total"))
            return after

        plain = []
        self.serve(GOLDEN_QWEN35, 1, 1, [], text=False, after=collect(plain))
        for decode_tp in (1, 2):
            with self.subTest(decode_tp=decode_tp):
                drafted = []
                self.serve(GOLDEN_QWEN35, 1, decode_tp, [], text=False,
                           after=collect(drafted), decode_extra=("--speculative-tokens=3",))
                print(f"\nQwen3.5 decode TP{decode_tp}: {drafted[-1]:.0f} of {drafted[-2]:.0f} "
                      "drafted tokens accepted")
                self.assertGreater(drafted[-1], 0)
                self.assertLess(drafted[-1], drafted[-2])
                for (want_ids, want_lp), (got_ids, got_lp) in zip(plain[:-2], drafted[:-2]):
                    self.assertEqual(got_ids, want_ids)
                    self.assertEqual(len(got_lp), len(want_lp))
                    for a, b in zip(got_lp, want_lp):
                        self.assertAlmostEqual(a, b, delta=1e-3)

    def test_fp8_and_bf16_caches_move_and_decode_like_the_offline_engine(self):
        rng = random.Random(10)
        prompts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40)))
                   for _ in range(6)]
        for kv_dtype in ("fp8", "bf16"):
            served = self.serve(MODEL, 1, 1, prompts, text=True, kv_dtype=kv_dtype)
            for prompt, got in zip(prompts, served):
                self.assertEqual(got, offline(prompt, 10, kv_dtype), (kv_dtype, prompt))
        # The narrower cache is a different computation: it agrees with f32 on most prompts.
        same = sum(offline(p, 10, "fp8") == offline(p, 10) for p in prompts)
        print(f"\nSmolLM2 fp8 KV cache: {same} of {len(prompts)} prompts give the f32 cache's "
              "10 greedy tokens")

    def test_workers_with_different_cache_types_or_block_sizes_are_not_paired(self):
        router = ct.Process([ct.binary("cleave-router"), "--listen=127.0.0.1:0",
                             "--metrics-port=0"])
        address = f"127.0.0.1:{router.ready['grpc_port']}"
        common = [f"--model={TINY}", f"--router={address}", "--listen=127.0.0.1:0",
                  "--metrics-port=0", "--target-concurrency=2", "--planned-seq-len=64",
                  "--threads=1"]
        prefill = ct.Process([ct.binary("cleave-worker"), "--role=prefill", *common])
        decodes = []
        try:
            stub = ct.stubs()["generation_grpc"].GenerationStub(
                grpc.insecure_channel(address))
            ct.wait_for_workers(stub, 1)
            # Refused, each keeps asking (the other may leave); the router never pairs them.
            for flag, shown in (("--kv-dtype=fp8", "KV_DTYPE_FP8_E4M3"),
                                ("--block-size=64", "block_size: 64")):
                decode = ct.Process([ct.binary("cleave-worker"), "--role=decode", flag, *common])
                decodes.append(decode)
                deadline = time.monotonic() + 60
                while "the router refused this worker" not in decode.log():
                    self.assertLess(time.monotonic(), deadline, decode.log())
                    time.sleep(0.1)
                self.assertIn("KV layout", decode.log())
                self.assertIn(shown, decode.log())  # This worker's layout, and the others':
                self.assertIn("block_size: 16", decode.log())
            info = stub.GetServerInfo(ct.stubs()["generation_pb2"].GetServerInfoRequest(),
                                      timeout=5)
            self.assertEqual(len(info.workers), 1)
        finally:
            codes = [w.stop() for w in (*decodes, prefill)] + [router.stop()]
            self.assertEqual(codes, [0] * len(codes))

    def test_every_tp_pairing_gives_the_tokens_of_tp1_to_tp1(self):
        rng = random.Random(5)
        prompts = [[rng.randrange(701) for _ in range(rng.randint(1, 40))] for _ in range(6)]
        want = self.serve(TINY, 1, 1, prompts, text=False)
        for pairing in ((2, 1), (1, 2)):
            self.assertEqual(self.serve(TINY, *pairing, prompts, text=False), want, pairing)

    def test_transfers_staged_through_host_rows_decode_like_direct_ones(self):
        """--kv-staging-tokens (the GPU workers' path, here on the CPU): the prefill worker
        copies a prompt out of its cache into send rows, a chunk at a time, the decode worker
        is written only in its receive rows and copies them into its cache at StartDecode.
        64 tokens of receive rows hold one prompt of up to 4 blocks, so the concurrent prompts
        wait for each other's rows; send rows of 64 tokens, or of 16 (every prompt in chunks
        of one block); every pairing decodes as direct transfers do, every row comes back (a
        prompt needing all of them goes through afterwards), and a longer prompt is refused
        with a message naming the flag."""
        rng = random.Random(12)
        prompts = [[rng.randrange(701) for _ in range(rng.randint(1, 64))] for _ in range(8)]
        want = self.serve(TINY, 1, 1, prompts, text=False)

        def every_row_came_back(send_rows):
            def check(stub, pb, workers):
                for w, direction, rows in ((workers[0], "send", send_rows),
                                           (workers[1], "receive", 4)):
                    port = w.ready["metrics_port"]
                    self.assertEqual(metric(port, "cleave_worker_kv_staging_blocks_capacity",
                                            direction=direction), rows)
                    deadline = time.monotonic() + 10
                    while metric(port, "cleave_worker_kv_staging_blocks_free",
                                 direction=direction) != rows:
                        self.assertLess(time.monotonic(), deadline, f"{direction} rows held")
                        time.sleep(0.05)
                # A prompt that needs every receive row goes through only if no earlier
                # request kept one; one row longer is refused.
                for length in (64, 65):
                    request = pb.GenerateRequest(stopping=pb.StoppingCriteria(max_new_tokens=4,
                                                                              ignore_eos=True))
                    request.token_ids.ids.extend(range(1, length + 1))
                    if length == 64:
                        self.assertEqual(sum(len(m.token_ids)
                                             for m in stub.Generate(request, timeout=20)), 4)
                        continue
                    with self.assertRaises(grpc.RpcError) as refused:
                        list(stub.Generate(request, timeout=60))
                    self.assertEqual(refused.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
                    self.assertIn("--kv-staging-tokens", refused.exception.details())
            return check

        for pairing, send in (((1, 1), 64), ((2, 1), 64), ((1, 2), 64), ((1, 1), 16),
                              ((2, 1), 16)):
            got = self.serve(TINY, *pairing, prompts, text=False,
                             extra=["--kv-staging-tokens=64"],
                             prefill_extra=[f"--kv-staging-tokens={send}"],
                             after=every_row_came_back(send // 16))
            self.assertEqual(got, want, (pairing, send))

    def test_a_latent_attention_model_moves_its_latent_rows(self):
        """DeepSeek-V3's MLA caches one latent row per position, which every rank holds
        whole: each decode rank gets it once, and every pairing decodes like the offline
        engine."""
        rng = random.Random(7)
        prompts = [[rng.randrange(509) for _ in range(rng.randint(1, 40))] for _ in range(4)]
        want = [offline_ids(DEEPSEEK, p, 10) for p in prompts]
        for pairing in ((1, 1), (2, 1), (1, 2), (2, 3)):
            self.assertEqual(self.serve(DEEPSEEK, *pairing, prompts, text=False), want, pairing)

    def test_a_shared_prefix_is_computed_once_where_it_is_cached(self):
        """Prompts sharing a long prefix, one after another, through two prefill workers and
        a decode worker, then through two --role=both workers: the router sends each to the
        worker that computed the prefix, which takes the prefix's KV from its cache and
        computes only the rest; the final message counts the cached tokens (what that
        worker's metrics count too), and the tokens are the offline engine's."""
        for roles in (("prefill", "prefill", "decode"), ("both", "both")):
            with self.subTest(roles=roles):
                self.shared_prefix(roles)

    def shared_prefix(self, roles):
        pb = ct.stubs()["generation_pb2"]
        rng = random.Random(21)
        prefix = " ".join(rng.choice(WORDS) for _ in range(200))
        prompts = [prefix, prefix + " river and quiet light", prefix + " a silver morning",
                   prefix]
        router = ct.Process([ct.binary("cleave-router"), "--listen=127.0.0.1:0",
                             "--metrics-port=0", f"--model={MODEL}"])
        address = f"127.0.0.1:{router.ready['grpc_port']}"
        common = [f"--model={MODEL}", f"--router={address}", "--listen=127.0.0.1:0",
                  "--metrics-port=0", "--target-concurrency=4", "--planned-seq-len=512",
                  "--threads=1", "--kv-dtype=f32"]
        workers = [ct.Process([ct.binary("cleave-worker"), f"--role={role}", *common])
                   for role in roles]
        channel = grpc.insecure_channel(address)
        try:
            stub = ct.stubs()["generation_grpc"].GenerationStub(channel)
            ct.wait_for_workers(stub, len(workers))
            usage = []
            background, streaming = None, None
            for prompt in prompts:
                ids, final, _ = greedy(stub, pb, prompt)
                self.assertEqual(ids, offline(prompt, 10), prompt)
                usage.append(final.usage)
                if background is None:
                    # A long request beside the rest, placed like the first prompt (both idle,
                    # nothing cached): that worker is now the busier one, and only its cache
                    # draws the next prompts there.
                    long = pb.GenerateRequest(stopping=pb.StoppingCriteria(max_new_tokens=600,
                                                                          ignore_eos=True))
                    long.token_ids.ids.extend(range(1000, 1000 + BACKGROUND))
                    background = stub.Generate(long, timeout=300)
                    streaming = threading.Thread(target=drain, args=(background,))
                    streaming.start()
                    time.sleep(1)  # admitted and prefilled
            background.cancel()
            streaming.join()
            lengths = [u.prompt_tokens for u in usage]
            cached = [u.cached_prompt_tokens for u in usage]
            print(f"\nshared prefix through {'+'.join(roles)}: prompt tokens {lengths}, "
                  f"cached {cached}")
            self.assertGreater(lengths[0], 150)
            self.assertEqual(cached[0], 0)
            self.assertEqual(cached[3], (lengths[0] - 1) // 16 * 16)  # all it may reuse
            for c, n in zip(cached[1:3], lengths[1:3]):
                self.assertGreaterEqual(c, (lengths[0] - 16) // 16 * 16)
                self.assertLess(c, n)
            # One of the two workers that prefill saw every prompt and supplied those tokens;
            # the other none.
            looked_up = [metric(w.ready["metrics_port"],
                                "cleave_worker_prefix_cache_lookup_tokens_total")
                         for w in workers[:2]]
            hits = [metric(w.ready["metrics_port"], "cleave_worker_prefix_cache_hit_tokens_total")
                    for w in workers[:2]]
            self.assertEqual(sum(looked_up), sum(lengths) + BACKGROUND)
            self.assertGreaterEqual(max(looked_up), sum(lengths))
            self.assertEqual(sorted(hits), [0, sum(cached)])
            ct.wait_until_nothing_reserved(router, workers)
        finally:
            channel.close()
            codes = [w.stop() for w in workers] + [router.stop()]
            self.assertEqual(codes, [0] * len(codes))

    def test_a_decode_worker_is_not_sent_the_prefix_it_holds(self):
        """Prompts sharing a long prefix, one after another, through a prefill and a decode
        worker (writing the decode worker's cache directly, then through its staging rows):
        the decode worker's reservation starts with the prefix's cached blocks, the prefill
        worker writes only the rest, and the tokens are the offline engine's. A request with
        a cache salt reuses no block of the others' on either worker, only its salt's."""
        rng = random.Random(22)
        prefix = " ".join(rng.choice(WORDS) for _ in range(150))
        # Between them a prompt of its own, whose transfer reuses the staging rows: were the
        # cached blocks' rows copied in, they would bring its KV into the shared prefix.
        other = " ".join(rng.choice(WORDS) for _ in range(150))
        prompts = [prefix + " the river", other, prefix + " a quiet silver morning", prefix]
        for staging in ((), ("--kv-staging-tokens=1024",)):
            with self.subTest(staging=staging):
                sent, lengths, salted = [], [], []

                def after(stub, pb, workers):
                    port = workers[0].ready["metrics_port"]  # The prefill worker's.
                    for prompt in prompts:
                        before = metric(port, "cleave_worker_kv_sent_bytes_total")
                        ids, final, _ = greedy(stub, pb, prompt)
                        self.assertEqual(ids, offline(prompt, 10), prompt)
                        sent.append(metric(port, "cleave_worker_kv_sent_bytes_total") - before)
                        lengths.append(final.usage.prompt_tokens)
                    # A scored prompt is computed and sent whole, cached or not.
                    before = metric(port, "cleave_worker_kv_sent_bytes_total")
                    request = pb.GenerateRequest(text=prefix, add_special_tokens=True,
                                                 prompt_logprobs=0,
                                                 sampling=pb.SamplingParams(temperature=0),
                                                 stopping=pb.StoppingCriteria(max_new_tokens=2))
                    messages = list(stub.Generate(request, timeout=120))
                    self.assertEqual(len(messages[0].prompt_logprobs),
                                     messages[-1].final.usage.prompt_tokens - 1)
                    self.assertEqual(messages[-1].final.usage.cached_prompt_tokens, 0)
                    sent.append(metric(port, "cleave_worker_kv_sent_bytes_total") - before)
                    # An embedding is computed on the prefill worker, which sends nothing,
                    # and the decode worker computes nothing of it.
                    decode_port = workers[1].ready["metrics_port"]
                    before = [metric(p, n) for p in (port, decode_port) for n in (
                        "cleave_worker_prefill_tokens_total", "cleave_worker_kv_sent_bytes_total")]
                    embedded = stub.Embed(pb.EmbedRequest(text=other), timeout=60)
                    after_embed = [metric(p, n) for p in (port, decode_port) for n in (
                        "cleave_worker_prefill_tokens_total", "cleave_worker_kv_sent_bytes_total")]
                    self.assertEqual(len(embedded.embedding), 576)
                    self.assertGreater(after_embed[0], before[0])
                    self.assertEqual(after_embed[1:], before[1:])
                    for _ in range(2):
                        before = metric(port, "cleave_worker_kv_sent_bytes_total")
                        ids, final, _ = greedy(stub, pb, prefix, cache_salt="tenant-a")
                        self.assertEqual(ids, offline(prefix, 10))
                        salted.append((final.usage.cached_prompt_tokens,
                                       metric(port, "cleave_worker_kv_sent_bytes_total") - before))

                self.serve(MODEL, 1, 1, [], text=True, after=after, decode_extra=staging)
                blocks = [(n + 15) // 16 for n in lengths]
                per_block = sent[0] / blocks[0]  # Nothing cached yet: every block sent.
                self.assertEqual(per_block, 2 * 30 * 3 * 64 * 4 * 16)  # f32 K and V, SmolLM2
                written = [b / per_block for b in sent]
                print(f"\nprompt blocks {blocks}, blocks sent {written} (staging: {staging})")
                # The prefix's full blocks are not sent again; the last block always is.
                self.assertEqual(written[1], blocks[1])
                self.assertLessEqual(written[2], blocks[2] - (lengths[0] - 16) // 16)
                self.assertEqual(written[3], 1)
                self.assertEqual(written[4], blocks[3])
                # Salted: the first computes and sends every block, the second only the last.
                self.assertEqual(salted, [(0, blocks[3] * per_block),
                                          ((blocks[3] - 1) * 16, per_block)])

    def test_a_prompt_goes_to_the_decode_worker_holding_its_prefix(self):
        """Two decode workers and a prefill worker: while a request decodes on one of them, a
        prompt sharing its prefix goes to that one (busier, but with room in its batch)
        rather than the idle other, which is sent only the blocks after the prefix, and
        decodes the offline engine's tokens."""
        rng = random.Random(24)
        prefix = " ".join(rng.choice(WORDS) for _ in range(150))
        first, second = prefix + " the river", prefix + " a quiet silver morning"
        found = {}

        def after(stub, pb, workers):
            ids_of = {p: list(stub.Tokenize(pb.TokenizeRequest(text=p, add_special_tokens=True),
                                            timeout=5).ids) for p in (first, second)}
            a, b = ids_of[first], ids_of[second]
            common = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
            # What the first's decode worker holds of the second: full blocks of the common
            # tokens, of the first's prompt, and short of the second's last token.
            found["shared"] = min(common // 16, len(a) // 16, (len(b) - 1) // 16)
            found["blocks"] = (len(b) + 15) // 16
            port = workers[0].ready["metrics_port"]  # The prefill worker's.
            running = stub.Generate(pb.GenerateRequest(
                text=first, add_special_tokens=True, sampling=pb.SamplingParams(temperature=0),
                stopping=pb.StoppingCriteria(max_new_tokens=400, ignore_eos=True)), timeout=120)
            next(running)  # Decoding.
            before = metric(port, "cleave_worker_kv_sent_bytes_total")
            ids, _, _ = greedy(stub, pb, second)
            per_block = 2 * 30 * 3 * 64 * 4 * 16  # f32 K and V of one SmolLM2 block
            found["sent"] = (metric(port, "cleave_worker_kv_sent_bytes_total") - before) / per_block
            running.cancel()
            drain(running)
            self.assertEqual(ids, offline(second, 10))
            found["hits"] = sorted(
                metric(w.ready["metrics_port"], "cleave_worker_kv_reserve_cached_blocks_total")
                for w in workers[1:])

        self.serve(MODEL, 1, 1, [], text=True, after=after, decode_workers=2)
        print(f"\n{found}")
        self.assertGreater(found["shared"], 5)
        self.assertEqual(found["sent"], found["blocks"] - found["shared"])
        self.assertEqual(found["hits"], [0, found["shared"]])

    def test_a_next_turn_is_prefilled_where_it_decodes(self):
        """--local-prefill-tokens: a conversation's first turn is prefilled by the prefill
        worker and decoded by a decode worker (--role=decode, then --role=both); its next turn
        (the prompt, the reply, a few new tokens) is computed by the decode worker itself,
        which holds all but those few in its cache: the prefill worker computes and sends
        nothing, and the tokens are the offline engine's."""
        for role in ("decode", "both"):
            with self.subTest(role=role):
                self.next_turn_where_it_decodes(role)

    def next_turn_where_it_decodes(self, role):
        pb = ct.stubs()["generation_pb2"]
        router = ct.Process([ct.binary("cleave-router"), "--listen=127.0.0.1:0",
                             "--metrics-port=0", f"--model={MODEL}",
                             "--local-prefill-tokens=64"])
        address = f"127.0.0.1:{router.ready['grpc_port']}"
        common = [f"--model={MODEL}", f"--router={address}", "--listen=127.0.0.1:0",
                  "--metrics-port=0", "--target-concurrency=4", "--planned-seq-len=512",
                  "--threads=1"]
        prefill = ct.Process([ct.binary("cleave-worker"), "--role=prefill", *common])
        decode = ct.Process([ct.binary("cleave-worker"), f"--role={role}", *common])
        channel = grpc.insecure_channel(address)
        try:
            stub = ct.stubs()["generation_grpc"].GenerationStub(channel)
            ct.wait_for_workers(stub, 2)
            rng = random.Random(25)
            text = " ".join(rng.choice(WORDS) for _ in range(150))
            first = list(stub.Tokenize(pb.TokenizeRequest(text=text, add_special_tokens=True),
                                       timeout=5).ids)

            def greedy_ids(ids):
                request = pb.GenerateRequest(sampling=pb.SamplingParams(temperature=0),
                                             stopping=pb.StoppingCriteria(max_new_tokens=10,
                                                                          ignore_eos=True))
                request.token_ids.ids.extend(ids)
                return [t for m in stub.Generate(request, timeout=120) for t in m.token_ids]

            def counters():
                return [metric(w.ready["metrics_port"], name) for w in (prefill, decode)
                        for name in ("cleave_worker_prefill_tokens_total",
                                     "cleave_worker_kv_sent_bytes_total")]

            reply = greedy_ids(first)
            before = counters()
            self.assertGreater(before[0], 0)  # the first turn was the prefill worker's
            second = first + reply + [t + 1 for t in first[:5]]
            ids = greedy_ids(second)
            after = counters()
            computed = after[2] - before[2]
            print(f"\nnext turn of {len(second)} tokens: {computed:.0f} computed where it "
                  f"decodes; the prefill worker computed {after[0] - before[0]:.0f}")
            self.assertEqual(after[0] - before[0], 0)  # nothing for the prefill worker
            self.assertEqual(after[1] - before[1], 0)  # nothing sent
            self.assertGreater(computed, 0)
            self.assertLessEqual(computed, 64)
            self.assertEqual(ids, offline_ids(MODEL, second, 10))
            self.assertEqual(reply, offline_ids(MODEL, first, 10))
        finally:
            channel.close()
            codes = [w.stop() for w in (prefill, decode)] + [router.stop()]
            self.assertEqual(codes, [0, 0, 0])

    def test_requests_sharing_a_cached_prefix_decode_together_where_copies_would_not_fit(self):
        """A decode worker whose KV holds one whole request of a long prompt but the prompt's
        cached prefix once and the rest of four: once the prefix is cached there, four such
        requests at once are admitted together (the router counts the shared blocks once,
        as the worker holds them), none is refused, the tokens are the offline engine's,
        and nothing stays reserved."""
        pb = ct.stubs()["generation_pb2"]
        rng = random.Random(23)
        prompt = " ".join(rng.choice(WORDS) for _ in range(225))
        new_tokens = 40
        concurrent_ids, peak = [], []

        def after(stub, pb, workers):
            ids, final, _ = greedy(stub, pb, prompt, new_tokens)  # Caches the prefix.
            blocks = (final.usage.prompt_tokens + new_tokens + 15) // 16
            info = stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5)
            total = next(w.kv_blocks_total for w in info.workers
                         if w.role == pb.WORKER_ROLE_DECODE)
            self.assertLess(total, 2 * blocks)  # Two whole copies do not fit.
            done = threading.Event()

            def watch():
                port = self.router_metrics_port
                while not done.is_set():
                    peak.append(metric(port, "cleave_router_admitted_requests"))
                    time.sleep(0.01)

            watcher = threading.Thread(target=watch)
            watcher.start()
            start = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                results = list(pool.map(lambda _: greedy(stub, pb, prompt, new_tokens)[0],
                                        range(4)))
            elapsed = time.monotonic() - start
            done.set()
            watcher.join()
            concurrent_ids.extend(results)
            print(f"\nshared prefix: {blocks} blocks a request, {total} on the decode worker, "
                  f"at most {max(peak):.0f} requests admitted at once, four in {elapsed:.2f} s")
            self.assertEqual(ids, offline(prompt, new_tokens))

        self.serve(MODEL, 1, 1, [], text=True, after=after,
                   extra=("--target-concurrency=4", "--planned-seq-len=128"))
        self.assertEqual(max(peak), 4)
        for ids in concurrent_ids:
            self.assertEqual(ids, offline(prompt, new_tokens))

    def test_a_lost_prefill_worker_is_routed_around(self):
        rng = random.Random(6)
        prompts = [[rng.randrange(701) for _ in range(rng.randint(1, 40))] for _ in range(4)]
        want = self.serve(TINY, 1, 1, prompts, text=False)
        got = self.serve(TINY, 1, 1, prompts, text=False, prefill_workers=2, kill="prefill")
        self.assertEqual(got, want)

    def test_a_lost_decode_worker_is_routed_around(self):
        rng = random.Random(7)
        prompts = [[rng.randrange(701) for _ in range(rng.randint(1, 40))] for _ in range(4)]
        want = self.serve(TINY, 1, 1, prompts, text=False)
        got = self.serve(TINY, 1, 1, prompts, text=False, decode_workers=2, kill="decode")
        self.assertEqual(got, want)


if __name__ == "__main__":
    unittest.main()
