"""End to end: cleave-router and a cleave-worker (--role=both) on the SmolLM2 model as real
processes on loopback, driven by a grpcio client generated from the .proto files (a
client Cleave did not write).

  * greedy outputs through the router equal the offline engine's (cleave generate), token
    for token, for 32 mixed-length prompts sent at once (more than the worker's target
    concurrency, so some wait in the router's queue);
  * 64 concurrent requests against --target-concurrency 16: the worker's decode batch
    reaches 16, never exceeds it, and stays there while requests wait;
  * chat prompts are the model file's template rendered, and decode as offline;
  * bad input gets the documented status codes with messages that say what to fix;
  * client cancellation and deadline expiry leave no KV block reserved, in the router or
    in the worker.
"""
import concurrent.futures
import json
import os
import random
import statistics
import re
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import cleave_testing as ct  # noqa: E402

MODEL = os.path.join(ct.SOURCE_DIR, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
TARGET = 16
WORDS = ("river mountain light quiet engine paper window garden number silver morning "
         "question stone market winter letter travel music forest ocean").split()


metric = ct.metric


@unittest.skipUnless(os.path.exists(MODEL), f"{MODEL} missing; run scripts/install-deps.sh")
class ServingTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.pb = ct.stubs()["generation_pb2"]
        cls.router = ct.Process([ct.binary("cleave-router"), "--listen=127.0.0.1:0",
                                 "--metrics-port=0", f"--model={MODEL}", "--log-requests"])
        cls.address = f"127.0.0.1:{cls.router.ready['grpc_port']}"
        cls.worker = ct.Process([ct.binary("cleave-worker"), f"--model={MODEL}",
                                 f"--router={cls.address}", "--listen=127.0.0.1:0",
                                 "--metrics-port=0", f"--target-concurrency={TARGET}",
                                 "--planned-seq-len=256", "--threads=2"])
        cls.channel = grpc.insecure_channel(cls.address)
        cls.stub = ct.stubs()["generation_grpc"].GenerationStub(cls.channel)
        deadline = time.monotonic() + 60
        while not cls.stub.ListModels(cls.pb.ListModelsRequest(), timeout=5).models:
            if time.monotonic() > deadline:
                raise RuntimeError("the worker did not register:\n" + cls.worker.log())
            time.sleep(0.05)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        worker_code = cls.worker.stop()
        router_code = cls.router.stop()
        assert worker_code == 0 and router_code == 0, (worker_code, router_code)

    def request(self, text, max_new_tokens=12, ignore_eos=False, **kwargs):
        pb = self.pb
        return pb.GenerateRequest(text=text, add_special_tokens=True,
                                  sampling=pb.SamplingParams(temperature=0),
                                  stopping=pb.StoppingCriteria(max_new_tokens=max_new_tokens,
                                                               ignore_eos=ignore_eos),
                                  **kwargs)

    def generate(self, request, timeout=120):
        ids, text, final = [], "", None
        for message in self.stub.Generate(request, timeout=timeout):
            ids += list(message.token_ids)
            text += message.text
            if message.HasField("final"):
                final = message.final
        self.assertIsNotNone(final)
        return ids, text, final

    def wait_for_no_reservations(self):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            router = metric(self.router.ready["metrics_port"], "cleave_router_reserved_blocks")
            worker = metric(self.worker.ready["metrics_port"], "cleave_worker_kv_blocks_reserved")
            if router == 0 and worker == 0:
                return
            time.sleep(0.05)
        self.fail(f"blocks still reserved: router {router}, worker {worker}")

    def test_each_request_is_logged_without_its_text(self):
        # --log-requests: one line per call when it ends, with sizes, times, the worker and
        # the outcome; never the prompt or the reply.
        ids, text, final = self.generate(self.request("zebra quartz", max_new_tokens=7,
                                                      ignore_eos=True, request_id="logged-1"))
        embedded = self.stub.Embed(self.pb.EmbedRequest(text="zebra quartz",
                                                        request_id="logged-3"), timeout=60)
        with self.assertRaises(grpc.RpcError):
            self.generate(self.request("zebra quartz", model="nope", request_id="logged-2"))
        deadline = time.monotonic() + 5
        while "request logged-2 " not in self.router.log():
            self.assertLess(time.monotonic(), deadline, self.router.log()[-2000:])
            time.sleep(0.05)
        log = self.router.log()
        served = re.search(r"request logged-1 key=- model=- prompt=(\d+) cached=(\d+) "
                           r"completion=7 ttft_ms=[\d.]+ total_ms=[\d.]+ workers=\S+ "
                           r"-> OK FINISH_REASON_LENGTH", log)
        self.assertIsNotNone(served, log[-2000:])
        self.assertEqual(int(served.group(1)), final.usage.prompt_tokens)
        self.assertIn("request logged-2 key=- model=nope total_ms=", log)
        self.assertRegex(log, r"request logged-2 .* -> NOT_FOUND: unknown model 'nope'")
        self.assertIn(f"embed logged-3 key=- model=- prompt={embedded.prompt_tokens} "
                      f"cached={embedded.cached_prompt_tokens} total_ms=", log)
        self.assertNotIn("zebra", log)
        self.assertNotIn(text.strip(), log)

    def test_the_models_recommended_sampling_fills_what_a_request_leaves_unset(self):
        """A model folder whose generation_config.json recommends top_k 1
        (--generation-config FOLDER, as auto takes it from --model): a request that sets no
        top_k samples from the one most likely token, so its seeded draws are the greedy
        tokens; with --generation-config none they are not."""
        tiny = os.path.join(ct.SOURCE_DIR, "tests", "golden", "data", "engine", "hf", "llama_f32")
        with tempfile.TemporaryDirectory() as folder:
            for name in ("config.json", "model.safetensors"):
                os.symlink(os.path.join(tiny, name), os.path.join(folder, name))
            with open(os.path.join(folder, "generation_config.json"), "w") as f:
                json.dump({"do_sample": True, "temperature": 1.0, "top_k": 1}, f)
            pb = self.pb
            prompt = pb.TokenIds(ids=[5, 17, 101, 33, 250])
            replies = {}
            # The folder has no tokenizer: the router takes token ids, and names the folder
            # whose recommendation it follows.
            for config in (folder, "none"):
                router = ct.Process([ct.binary("cleave-router"), "--listen=127.0.0.1:0",
                                     "--metrics-port=0", f"--generation-config={config}"])
                address = f"127.0.0.1:{router.ready['grpc_port']}"
                worker = ct.Process([ct.binary("cleave-worker"), f"--model={folder}",
                                     f"--router={address}", "--listen=127.0.0.1:0",
                                     "--metrics-port=0", "--target-concurrency=2",
                                     "--planned-seq-len=128", "--threads=1"])
                try:
                    with grpc.insecure_channel(address) as channel:
                        stub = ct.stubs()["generation_grpc"].GenerationStub(channel)
                        ct.wait_for_workers(stub, 1)
                        for name, sampling in (("sampled", pb.SamplingParams(seed=7)),
                                               ("greedy", pb.SamplingParams(temperature=0))):
                            request = pb.GenerateRequest(
                                token_ids=prompt, sampling=sampling,
                                stopping=pb.StoppingCriteria(max_new_tokens=24, ignore_eos=True))
                            replies[config, name] = [t for m in stub.Generate(request, timeout=60)
                                                     for t in m.token_ids]
                    if config != "none":
                        self.assertIn("temperature 1, top_k 1", router.log())
                finally:
                    worker.stop()
                    router.stop()
        self.assertEqual(replies[folder, "greedy"], replies["none", "greedy"])
        self.assertEqual(replies[folder, "sampled"], replies[folder, "greedy"])
        self.assertNotEqual(replies["none", "sampled"], replies["none", "greedy"])

    def test_a_response_echoes_the_sampling_its_reply_was_drawn_with(self):
        """The Responses API echoes temperature and top_p: the request's, else the model's
        recommendation (--generation-config FOLDER), else OpenAI's 1.0."""
        import http.client
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "generation_config.json"), "w") as f:
                json.dump({"temperature": 0.6, "top_p": 0.9}, f)
            router = ct.Process([ct.binary("cleave-router"), "--listen=127.0.0.1:0",
                                 "--metrics-port=0", f"--model={MODEL}",
                                 "--http-listen=127.0.0.1:0", f"--generation-config={folder}"])
            worker = ct.Process([ct.binary("cleave-worker"), f"--model={MODEL}",
                                 f"--router=127.0.0.1:{router.ready['grpc_port']}",
                                 "--listen=127.0.0.1:0", "--metrics-port=0",
                                 "--target-concurrency=2", "--planned-seq-len=128",
                                 "--threads=1"])
            try:
                with grpc.insecure_channel(f"127.0.0.1:{router.ready['grpc_port']}") as channel:
                    ct.wait_for_workers(ct.stubs()["generation_grpc"].GenerationStub(channel), 1)
                echoed = []
                for extra in ({}, {"temperature": 0.2}):
                    connection = http.client.HTTPConnection(
                        "127.0.0.1", router.ready["http_port"], timeout=60)
                    connection.request("POST", "/v1/responses", json.dumps(
                        {"input": "Hello", "max_output_tokens": 2, **extra}),
                        {"Content-Type": "application/json"})
                    answer = connection.getresponse()
                    body = json.loads(answer.read())
                    connection.close()
                    self.assertEqual(answer.status, 200, body)
                    echoed.append((body["temperature"], body["top_p"]))
                self.assertEqual(echoed, [(0.6, 0.9), (0.2, 0.9)])
            finally:
                worker.stop()
                router.stop()

    def test_greedy_tokens_match_the_offline_engine(self):
        rng = random.Random(4)
        prompts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 60)))
                   for _ in range(32)]
        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            served = list(pool.map(lambda p: self.generate(self.request(p))[0], prompts))
        for prompt, got in zip(prompts, served):
            code, out, err = ct.run([ct.binary("cleave"), "generate", f"--model={MODEL}",
                                     "--no-chat", "--print-ids", "--max-tokens=12", "--threads=2",
                                     prompt], timeout=120)
            self.assertEqual(code, 0, err)
            self.assertEqual(got, [int(t) for t in out.split()], prompt)
        self.wait_for_no_reservations()

    def test_the_batch_reaches_the_target_concurrency_and_never_exceeds_it(self):
        samples, done = [], threading.Event()

        def watch():
            while not done.is_set():
                samples.append((metric(self.router.ready["metrics_port"], "cleave_router_queue_depth"),
                                metric(self.worker.ready["metrics_port"],
                                       "cleave_worker_decode_sequences")))
                time.sleep(0.01)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            prompts = [f"Count slowly from one to fifty, request {i}:" for i in range(64)]
            # A deadline far beyond the work: this test is about the batch, and the router
            # refuses what its recent pace says cannot finish in time (overload_test), a pace
            # that a busy shared machine may have slowed while the previous test ran.
            with concurrent.futures.ThreadPoolExecutor(64) as pool:
                results = list(pool.map(
                    lambda p: self.generate(self.request(p, max_new_tokens=40,
                                                         ignore_eos=True), timeout=600)[2],
                    prompts))
        finally:
            done.set()
            watcher.join()
        self.assertEqual(len(results), 64)
        batches = [b for _, b in samples]
        self.assertEqual(max(batches), TARGET)
        # Once the first batch is up, every sample taken while requests waited in the
        # router's queue must see the full batch.
        full = batches.index(TARGET)
        waiting = [b for q, b in samples[full:] if q > 0]
        print(f"\nreached {TARGET} after {full} samples; then {len(waiting)} samples while "
              f"requests waited, sizes {sorted(set(waiting))}")
        self.assertGreater(len(waiting), 10, "too few requests waited to test anything")
        self.assertEqual(set(waiting), {TARGET})
        # Both processes' metrics after the load: valid for Prometheus, and moved as the
        # load says (every request counted, latencies observed, the floor accounted).
        promtool = os.environ.get("CLEAVE_PROMTOOL") or "promtool"
        sys.path.insert(0, os.path.join(ct.SOURCE_DIR, "tests", "integration"))
        from deploy_files_test import documented_metrics
        documented = documented_metrics()
        for port, section in ((self.router.ready["metrics_port"], "cleave-router"),
                              (self.worker.ready["metrics_port"], "cleave-worker")):
            _, body = ct.http_get(port)
            check = subprocess.run([promtool, "check", "metrics"], input=body, text=True,
                                   capture_output=True, timeout=60)
            self.assertEqual(check.returncode, 0, check.stdout + check.stderr)
            # docs/metrics.md describes what the processes export, no more and no less.
            exported = {m for m in re.findall(r"^# TYPE (cleave_[a-z0-9_]+)", body, re.M)}
            self.assertEqual(exported - documented["Every process"], documented[section])
        self.assertGreaterEqual(metric(self.router.ready["metrics_port"],
                                       "cleave_router_time_to_first_token_seconds_count"), 64)
        self.assertGreater(metric(self.router.ready["metrics_port"],
                                  "cleave_router_inter_token_latency_seconds_count"), 64 * 30)
        floor = metric(self.worker.ready["metrics_port"], "cleave_worker_step_floor_seconds_total")
        spent = metric(self.worker.ready["metrics_port"], "cleave_worker_step_seconds_total")
        self.assertGreater(floor, 0)
        self.assertLess(floor, spent)  # No step beats its floor.
        print(f"decode worker efficiency over the load: {floor / spent:.2f}")
        self.wait_for_no_reservations()

    def test_higher_priority_requests_pass_the_queue(self):
        """96 requests of priority 0 fill the worker (twice its target admitted) and the
        router's queue, 48 or more waiting; 4 of priority -1 sent then go in as soon as places
        free, ahead of those waiting since before them: their queue wait is under one
        request's service time, where 48 ahead of them would take about three."""
        timings = {}  # name -> the final Timings

        def run(name, priority):
            _, _, final = self.generate(self.request(f"Count slowly, request {name}:",
                                                     max_new_tokens=24, ignore_eos=True,
                                                     priority=priority), timeout=600)
            timings[name] = final.timings

        with concurrent.futures.ThreadPoolExecutor(100) as pool:
            futures = [pool.submit(run, f"batch-{i}", 0) for i in range(96)]
            deadline = time.monotonic() + 60
            while metric(self.router.ready["metrics_port"], "cleave_router_queue_depth") < 48:
                self.assertLess(time.monotonic(), deadline, "the queue never filled")
                time.sleep(0.01)
            futures += [pool.submit(run, f"urgent-{i}", -1) for i in range(4)]
            for f in futures:
                f.result()
        # A request's time once admitted: the worker's (its decode batch wait included).
        service = statistics.median(t.total_ms - t.queue_wait_ms for n, t in timings.items()
                                    if n.startswith("batch"))
        urgent = max(t.queue_wait_ms for n, t in timings.items() if n.startswith("urgent"))
        print(f"\npriority -1 waited at most {urgent:.0f} ms in the queue; a request's "
              f"service takes {service:.0f} ms (median)")
        self.assertLess(urgent, 1.5 * service)
        self.wait_for_no_reservations()

    def test_prompt_logprobs_score_the_prompt_as_generation_scored_it(self):
        """A greedy reply's tokens, appended to its prompt and sent back with
        prompt_logprobs, get the log-probabilities they had when generated (each the most
        likely there), and every prompt token from the second on is scored."""
        pb = self.pb
        first = self.request("The capital of France is", max_new_tokens=8, ignore_eos=True,
                             logprobs=0, echo_prompt_token_ids=True)
        prompt_ids, reply, logprobs = [], [], []
        for message in self.stub.Generate(first, timeout=120):
            prompt_ids += list(message.prompt_token_ids)
            reply += list(message.token_ids)
            logprobs += [lp.logprob for lp in message.logprobs]
        ids = prompt_ids + reply
        scored = pb.GenerateRequest(token_ids=pb.TokenIds(ids=ids), prompt_logprobs=2,
                                    sampling=pb.SamplingParams(temperature=0),
                                    stopping=pb.StoppingCriteria(max_new_tokens=1))
        messages = list(self.stub.Generate(scored, timeout=120))
        entries = list(messages[0].prompt_logprobs)
        self.assertEqual([e.token_id for e in entries], ids[1:])
        self.assertTrue(all(e.text for e in entries))
        self.assertTrue(all(len(e.top) == 2 for e in entries))
        for j, token in enumerate(reply):
            e = entries[len(prompt_ids) + j - 1]
            self.assertEqual(e.top[0].token_id, token, j)
            self.assertAlmostEqual(e.logprob, logprobs[j], delta=0.05)
        self.assertTrue(all(len(m.prompt_logprobs) == 0 for m in messages[1:]))
        with self.assertRaises(grpc.RpcError) as caught:
            list(self.stub.Generate(pb.GenerateRequest(text="x", prompt_logprobs=21), timeout=30))
        self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        # Too many scores for one message: refused before anything runs.
        with self.assertRaises(grpc.RpcError) as caught:
            list(self.stub.Generate(pb.GenerateRequest(
                token_ids=pb.TokenIds(ids=[1000 + i for i in range(1600)]), prompt_logprobs=20,
                stopping=pb.StoppingCriteria(max_new_tokens=1)), timeout=30))
        self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("prompt_logprobs", caught.exception.details())
        self.wait_for_no_reservations()

    def test_chat_prompts_go_through_the_models_template(self):
        """A chat request is the model file's template rendered (SmolLM2's ChatML, its default
        system turn when none is given), tokenized with special tokens parsed; its greedy
        tokens equal the offline engine's for the same conversation."""
        pb = self.pb
        question = "Name three rivers in Europe."

        def chat_request(messages, **chat):
            return pb.GenerateRequest(
                chat=pb.Chat(messages=[pb.ChatMessage(role=r, content=c) for r, c in messages],
                             **chat),
                echo_prompt_token_ids=True, sampling=pb.SamplingParams(temperature=0),
                stopping=pb.StoppingCriteria(max_new_tokens=12, ignore_eos=True))

        def tokenize(text):
            return list(self.stub.Tokenize(pb.TokenizeRequest(text=text, parse_special_tokens=True),
                                           timeout=30).ids)

        def echoed(request):
            for message in self.stub.Generate(request, timeout=120):
                if message.prompt_token_ids:
                    return list(message.prompt_token_ids)
            self.fail("no prompt ids echoed")

        turn = "<|im_start|>{}\n{}<|im_end|>\n"
        default_system = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
        expected = (turn.format("system", default_system) + turn.format("user", question) +
                    "<|im_start|>assistant\n")
        self.assertEqual(echoed(chat_request([("user", question)])), tokenize(expected))
        # Tokenize takes the same conversation and shows the text it renders to.
        counted = self.stub.Tokenize(pb.TokenizeRequest(chat=chat_request([("user", question)]).chat),
                                     timeout=30)
        self.assertEqual((counted.chat_text, list(counted.ids)), (expected, tokenize(expected)))
        # Continuing an assistant turn: the prompt ends inside it.
        self.assertEqual(
            echoed(chat_request([("system", "Be brief."), ("user", question),
                                 ("assistant", "The Danube,")], continue_final_message=True)),
            tokenize(turn.format("system", "Be brief.") + turn.format("user", question) +
                     "<|im_start|>assistant\nThe Danube,"))
        ids, _, _ = self.generate(chat_request([("system", "Answer in one sentence."),
                                                ("user", question)]))
        code, out, err = ct.run([ct.binary("cleave"), "generate", f"--model={MODEL}",
                                 "--system=Answer in one sentence.", "--print-ids", "--ignore-eos",
                                 "--max-tokens=12", "--threads=2", question], timeout=120)
        self.assertEqual(code, 0, err)
        self.assertEqual(ids, [int(t) for t in out.split()])
        self.wait_for_no_reservations()

    def test_bench_sends_conversations(self):
        """`cleave bench --chat` sends a lengths file's prompts as user turns: every request
        succeeds and each prompt grows by the template's turn markers and system turn."""
        work = tempfile.mkdtemp(prefix="cleave-bench-chat-")
        lengths = os.path.join(work, "lengths.jsonl")
        with open(lengths, "w") as f:
            for words in (3, 7, 11, 5):
                f.write(json.dumps({"prompt": " ".join(WORDS[:words]), "output_tokens": 4}) + "\n")

        def bench(*extra):
            report = os.path.join(work, f"bench{len(extra)}.json")
            code, out, err = ct.run([ct.binary("cleave"), "bench", f"--router={self.address}",
                                     f"--lengths-file={lengths}", "--requests=4", "--warmup=0",
                                     "--concurrency=2", f"--json={report}", *extra], timeout=120)
            self.assertEqual(code, 0, out + err)
            with open(report) as f:
                summary = json.load(f)["points"][0]["summary"]
            self.assertEqual((summary["requests"], summary["failed"]), (4, 0), summary)
            return summary["prompt_tokens"]

        plain, chat = bench(), bench("--chat")
        self.assertGreater(chat, plain + 4 * 20)  # SmolLM2's default system turn alone is ~20
        code, _, err = ct.run([ct.binary("cleave"), "bench", f"--router={self.address}", "--chat"])
        self.assertEqual(code, 2)
        self.assertIn("--lengths-file", err)

    def test_bad_input_gets_a_status_that_says_what_to_fix(self):
        pb, C = self.pb, grpc.StatusCode

        def expect(request, code, words):
            with self.assertRaises(grpc.RpcError) as caught:
                self.generate(request, timeout=30)
            self.assertEqual(caught.exception.code(), code, caught.exception.details())
            self.assertIn(words, caught.exception.details())

        expect(pb.GenerateRequest(text=""), C.INVALID_ARGUMENT, "text")
        expect(self.request("hi", model="no-such-model"), C.NOT_FOUND, "no-such-model")
        expect(pb.GenerateRequest(token_ids=pb.TokenIds(ids=[1, 49152])), C.INVALID_ARGUMENT,
               "vocabulary")
        # Worded as OpenAI's and vLLM's (clients match it to trim a conversation).
        expect(pb.GenerateRequest(token_ids=pb.TokenIds(ids=[1] * 9000)), C.INVALID_ARGUMENT,
               "This model's maximum context length is 8192 tokens. However, your prompt has "
               "9000 tokens")
        expect(self.request("hi", max_new_tokens=0), C.INVALID_ARGUMENT, "max_new_tokens")
        expect(self.request("hi", max_new_tokens=8190), C.INVALID_ARGUMENT, "KV blocks")
        expect(pb.GenerateRequest(text="hi", sampling=pb.SamplingParams(top_p=1.5)),
               C.INVALID_ARGUMENT, "top_p")
        expect(pb.GenerateRequest(text="hi", sampling=pb.SamplingParams(temperature=-1)),
               C.INVALID_ARGUMENT, "temperature")
        expect(pb.GenerateRequest(chat=pb.Chat()), C.INVALID_ARGUMENT, "chat.messages")
        with self.assertRaises(grpc.RpcError) as caught:
            self.stub.Tokenize(pb.TokenizeRequest(text="hi", chat=pb.Chat(
                messages=[pb.ChatMessage(role="user", content="hi")])), timeout=30)
        self.assertEqual(caught.exception.code(), C.INVALID_ARGUMENT)
        expect(pb.GenerateRequest(chat=pb.Chat(messages=[pb.ChatMessage(content="hi")])),
               C.INVALID_ARGUMENT, "chat.messages[0].role")
        expect(pb.GenerateRequest(chat=pb.Chat(messages=[
            pb.ChatMessage(role="user", content="hi", fields_json="{oops")])),
               C.INVALID_ARGUMENT, "messages[0].fields_json")
        expect(pb.GenerateRequest(chat=pb.Chat(messages=[pb.ChatMessage(
            role="user", fields_json='{"content": [{"type": "image"}]}')],
                                               continue_final_message=True)),
               C.INVALID_ARGUMENT, "continue_final_message")
        self.wait_for_no_reservations()

    def test_cancel_and_deadline_free_every_block(self):
        call = self.stub.Generate(self.request("Tell me a long story.", max_new_tokens=400,
                                               ignore_eos=True), timeout=120)
        next(call)
        next(call)
        call.cancel()
        with self.assertRaises(grpc.RpcError) as caught:
            for _ in call:
                pass
        self.assertEqual(caught.exception.code(), grpc.StatusCode.CANCELLED)
        with self.assertRaises(grpc.RpcError) as caught:
            self.generate(self.request("Tell me a long story.", max_new_tokens=400,
                                       ignore_eos=True), timeout=0.5)
        self.assertEqual(caught.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
        self.wait_for_no_reservations()
        # The worker still serves.
        ids, _, final = self.generate(self.request("One more:", max_new_tokens=3))
        self.assertEqual(len(ids), final.usage.completion_tokens)


if __name__ == "__main__":
    unittest.main()
