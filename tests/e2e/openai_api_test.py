"""End to end: the router's OpenAI-compatible HTTP API (--http-listen) in front of a
cleave-worker on the SmolLM2 model, real processes on loopback, driven by OpenAI's own
Python SDK (pinned in tests/integration/client_requirements.txt, installed into
.tools/python by scripts/install-deps.sh) and by raw HTTP for what the SDK hides.

  * completions and chat completions equal what the gRPC API returns for the same request
    (greedy: text, token counts, logprobs); token-id prompts equal text prompts; streamed
    deltas add up to the whole response, with the role first, the finish reason last, the
    usage chunk and [DONE];
  * stop strings, echo, logprobs (the requested number of alternatives, each token's text);
  * refusals are OpenAI error objects with the HTTP status and the parameter at fault;
  * a client that hangs up mid-stream leaves no KV block reserved;
  * many streams at once all finish; API keys travel in the Authorization header;
  * the Responses API answers as chat does, whole and as its typed events.
"""
import concurrent.futures
import enum
import http.client
import json
import os
import re
import socket
import sys
import tempfile
import time
import typing
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import cleave_testing as ct  # noqa: E402

sys.path.insert(0, os.path.join(ct.SOURCE_DIR, ".tools", "python"))
try:
    import openai  # noqa: E402
except ImportError as e:  # The suite installs it; a missing SDK is a setup error, not a skip.
    raise SystemExit(f"the openai SDK is missing ({e}); run scripts/install-deps.sh")

MODEL = os.path.join(ct.SOURCE_DIR, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


def sdk_client(base_url):
    """The SDK's client for the router at `base_url`, without retries (a failure shows), that
    keeps an idle connection 0.2 s only: the router's HTTP server closes one idle for 0.5 s
    (civetweb's keep-alive timeout), and a request sent on it as it closes fails, where the
    SDK's default (5 s, and two retries) would reuse it and retry."""
    import httpx2
    limits = httpx2.Limits(max_connections=1000, max_keepalive_connections=100,
                           keepalive_expiry=0.2)
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120,
                         http_client=openai.DefaultHttpxClient(limits=limits))
TARGET = 8


def events(body):
    """The JSON of each server-sent event ("[DONE]" as a string)."""
    out = []
    for block in body.split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


@unittest.skipUnless(os.path.exists(MODEL), f"{MODEL} missing; run scripts/install-deps.sh")
class OpenAiApiTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import grpc
        cls.grpc = grpc
        cls.pb = ct.stubs()["generation_pb2"]
        cls.router = ct.Process([ct.binary("cleave-router"), "--listen=127.0.0.1:0",
                                 "--metrics-port=0", f"--model={MODEL}",
                                 "--http-listen=127.0.0.1:0", "--http-threads=32",
                                 "--tool-call-parser=hermes",
                                 "--served-model-name=cleave-smol, smol"])
        cls.http_port = cls.router.ready["http_port"]
        cls.address = f"127.0.0.1:{cls.router.ready['grpc_port']}"
        cls.worker = ct.Process([ct.binary("cleave-worker"), f"--model={MODEL}",
                                 f"--router={cls.address}", "--listen=127.0.0.1:0",
                                 "--metrics-port=0", f"--target-concurrency={TARGET}",
                                 "--planned-seq-len=256", "--threads=2"])
        cls.channel = grpc.insecure_channel(cls.address)
        cls.stub = ct.stubs()["generation_grpc"].GenerationStub(cls.channel)
        ct.wait_for_workers(cls.stub, 1)
        cls.model = cls.stub.ListModels(cls.pb.ListModelsRequest(), timeout=5).models[0].id
        cls.client = sdk_client(f"http://127.0.0.1:{cls.http_port}/v1")

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        worker_code = cls.worker.stop()
        router_code = cls.router.stop()
        assert worker_code == 0 and router_code == 0, (worker_code, router_code)

    # --- helpers ---

    def grpc_generate(self, request):
        text, ids, logprobs, final = "", [], [], None
        for message in self.stub.Generate(request, timeout=120):
            text += message.text
            ids += list(message.token_ids)
            logprobs += list(message.logprobs)
            if message.HasField("final"):
                final = message.final
        return text, ids, logprobs, final

    def raw(self, method, path, body=None, headers=None):
        """(status, headers, body text) of one HTTP request."""
        connection = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=120)
        payload = body if isinstance(body, (str, bytes)) or body is None else json.dumps(body)
        connection.request(method, path, body=payload,
                           headers={"Content-Type": "application/json", **(headers or {})})
        response = connection.getresponse()
        text = response.read().decode()
        connection.close()
        return response.status, dict(response.getheaders()), text

    def ended_schema_replies(self, messages, schema, max_tokens, n, seed, at_least):
        """The replies that ended, of a greedy one and n sampled ones constrained to `schema`
        (at least `at_least` of them must end)."""
        fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
        greedy = self.client.chat.completions.create(
            model=self.model, messages=messages, max_tokens=max_tokens, temperature=0,
            response_format=fmt)
        sampled = self.client.chat.completions.create(
            model=self.model, messages=messages, max_tokens=max_tokens, temperature=1.0,
            seed=seed, n=n, response_format=fmt)
        choices = [greedy.choices[0]] + list(sampled.choices)
        ended = [c.message.content for c in choices if c.finish_reason == "stop"]
        print(f"\njson_schema: {len(ended)} of {len(choices)} replies ended; greedy: "
              f"{greedy.choices[0].message.content}")
        self.assertGreaterEqual(len(ended), at_least, [c.message.content for c in choices])
        return ended

    def assertApiError(self, status, body, http_status, param=None):
        self.assertEqual(status, http_status, body)
        error = json.loads(body)["error"]
        self.assertEqual(error["code"], http_status)
        self.assertTrue(error["message"])
        if param is not None:
            self.assertEqual(error["param"], param, error)

    # --- tests ---

    def test_models_lists_the_served_model(self):
        # --served-model-name: the model goes by its names (the first reported), not by the
        # id its worker registers.
        self.assertEqual(self.model, "cleave-smol")
        models = self.client.models.list().data
        self.assertEqual([m.id for m in models], ["cleave-smol", "smol"])
        self.assertEqual(self.client.models.retrieve(self.model).id, self.model)
        with self.assertRaises(openai.NotFoundError):
            self.client.models.retrieve("nope")
        registered = self.stub.GetServerInfo(self.pb.GetServerInfoRequest(),
                                             timeout=5).workers[0].model
        with self.assertRaises(openai.NotFoundError) as caught:
            self.client.completions.create(model=registered, prompt="hi", max_tokens=1)
        self.assertIn("this router serves 'cleave-smol', 'smol'", str(caught.exception))
        reply = self.client.completions.create(model="smol", prompt="hi", max_tokens=2)
        self.assertEqual(reply.model, "smol")
        self.assertEqual(reply.usage.completion_tokens, 2)
        self.assertEqual(models[0].model_extra["max_model_len"],
                         self.stub.ListModels(self.pb.ListModelsRequest(), timeout=5)
                         .models[0].context_length)

    def test_completion_equals_the_grpc_api(self):
        prompt = "The three primary colors are"
        response = self.client.completions.create(model=self.model, prompt=prompt, max_tokens=12,
                                                  temperature=0, logprobs=3,
                                                  extra_body={"ignore_eos": True})
        text, ids, logprobs, final = self.grpc_generate(self.pb.GenerateRequest(
            text=prompt, add_special_tokens=True, parse_special_tokens=True,
            sampling=self.pb.SamplingParams(temperature=0), logprobs=3,
            stopping=self.pb.StoppingCriteria(max_new_tokens=12, ignore_eos=True)))
        choice = response.choices[0]
        self.assertEqual(choice.text, text)
        self.assertEqual(choice.finish_reason, "length")
        self.assertEqual(response.usage.completion_tokens, 12)
        self.assertEqual(response.usage.prompt_tokens, final.usage.prompt_tokens)
        self.assertEqual(response.usage.total_tokens, final.usage.prompt_tokens + 12)
        self.assertTrue(response.id.startswith("cmpl-"))
        self.assertEqual(response.object, "text_completion")
        # Logprobs: one per token, each token's text, three alternatives, the greedy token
        # the most likely; the same numbers as the gRPC API's.
        lp = choice.logprobs
        self.assertEqual(len(lp.tokens), 12)
        self.assertEqual("".join(lp.tokens), text)
        self.assertEqual(lp.text_offset[0], 0)
        for i in range(12):
            self.assertEqual(len(lp.top_logprobs[i]), 3, lp.top_logprobs[i])
            self.assertAlmostEqual(max(lp.top_logprobs[i].values()), lp.token_logprobs[i],
                                   places=5)
            self.assertAlmostEqual(lp.token_logprobs[i], logprobs[i].logprob, delta=1e-3)
            self.assertEqual(lp.text_offset[i], len("".join(lp.tokens[:i])))

    def test_token_id_prompts_equal_text_prompts(self):
        prompt = "Rivers of Europe include"
        ids = list(self.stub.Tokenize(self.pb.TokenizeRequest(text=prompt, add_special_tokens=True,
                                                              parse_special_tokens=True),
                                      timeout=5).ids)
        by_text = self.client.completions.create(model=self.model, prompt=prompt, max_tokens=8,
                                                 temperature=0)
        by_ids = self.client.completions.create(model=self.model, prompt=ids, max_tokens=8,
                                                temperature=0)
        self.assertEqual(by_ids.choices[0].text, by_text.choices[0].text)
        self.assertEqual(by_ids.usage.prompt_tokens, len(ids))
        echoed = self.client.completions.create(model=self.model, prompt=[ids], max_tokens=8,
                                                temperature=0, echo=True)
        self.assertEqual(echoed.choices[0].text, prompt + by_text.choices[0].text)

    def test_token_ids_come_back_when_asked(self):
        # vLLM's return_token_ids: the reply's token ids (the gRPC API's) and the prompt's
        # (the tokenizer's), whole or streamed, completions and chat; and
        # return_tokens_as_token_ids names logprobs' tokens "token_id:ID".
        prompt = "Rivers of Europe include"
        prompt_ids = list(self.stub.Tokenize(self.pb.TokenizeRequest(
            text=prompt, add_special_tokens=True), timeout=5).ids)
        _, ids, _, _ = self.grpc_generate(self.pb.GenerateRequest(
            text=prompt, add_special_tokens=True, sampling=self.pb.SamplingParams(temperature=0),
            stopping=self.pb.StoppingCriteria(max_new_tokens=12, ignore_eos=True)))
        ask = {"prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True,
               "return_token_ids": True}
        status, _, text = self.raw("POST", "/v1/completions", ask)
        self.assertEqual(status, 200, text)
        choice = json.loads(text)["choices"][0]
        self.assertEqual((choice["token_ids"], choice["prompt_token_ids"]), (ids, prompt_ids))
        stream = self.client.completions.create(model=self.model, stream=True, **{
            k: v for k, v in ask.items() if k in ("prompt", "max_tokens", "temperature")},
            extra_body={"ignore_eos": True, "return_token_ids": True})
        chunks = [c.model_dump() for c in stream]
        self.assertEqual(sum((c["choices"][0]["token_ids"] for c in chunks), []), ids)
        self.assertEqual(chunks[0]["choices"][0]["prompt_token_ids"], prompt_ids)

        messages = [{"role": "user", "content": "Name a river."}]
        chat_ids = list(self.stub.Tokenize(self.pb.TokenizeRequest(chat=self.pb.Chat(
            messages=[self.pb.ChatMessage(**m) for m in messages])), timeout=5).ids)
        whole = self.client.chat.completions.create(
            model=self.model, messages=messages, max_tokens=12, temperature=0, logprobs=True,
            top_logprobs=2, extra_body={"return_token_ids": True,
                                        "return_tokens_as_token_ids": True}).model_dump()
        self.assertEqual(whole["prompt_token_ids"], chat_ids)
        reply_ids = whole["choices"][0]["token_ids"]
        self.assertEqual(len(reply_ids), whole["usage"]["completion_tokens"])
        entries = whole["choices"][0]["logprobs"]["content"]
        self.assertEqual([e["token"] for e in entries], [f"token_id:{i}" for i in reply_ids])
        self.assertEqual(entries[0]["bytes"], list(f"token_id:{reply_ids[0]}".encode()))
        self.assertTrue(all(t["token"].startswith("token_id:") for e in entries
                            for t in e["top_logprobs"]))
        streamed = [c.model_dump() for c in self.client.chat.completions.create(
            model=self.model, messages=messages, max_tokens=12, temperature=0, stream=True,
            extra_body={"return_token_ids": True})]
        self.assertEqual(streamed[0]["prompt_token_ids"], chat_ids)
        self.assertEqual(sum((c["choices"][0].get("token_ids") or [] for c in streamed
                              if c["choices"]), []), reply_ids)

    def test_continuous_usage_stats_count_as_the_stream_goes(self):
        # vLLM's stream_options.continuous_usage_stats: every chunk carries the usage so far
        # (the prompt's tokens, those generated up to it); the last ones the final usage.
        messages = [{"role": "user", "content": "Name three rivers."}]
        chunks = [c.model_dump() for c in self.client.chat.completions.create(
            model=self.model, messages=messages, max_tokens=16, temperature=0, stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
            extra_body={"ignore_eos": True})]
        final = chunks[-1]["usage"]
        self.assertEqual((final["completion_tokens"], chunks[-1]["choices"]), (16, []))
        counts = [c["usage"]["completion_tokens"] for c in chunks]
        self.assertEqual(counts, sorted(counts))
        self.assertEqual(counts[0], 0)  # the role chunk
        for c in chunks:
            self.assertEqual(c["usage"]["prompt_tokens"], final["prompt_tokens"])
            self.assertEqual(c["usage"]["total_tokens"],
                             c["usage"]["prompt_tokens"] + c["usage"]["completion_tokens"])
        self.assertEqual(chunks[-2]["usage"], final)  # the finishing chunk

    def test_truncate_prompt_tokens_keeps_the_last_ones(self):
        # vLLM's truncate_prompt_tokens: the prompt's last N tokens are what the model sees
        # (and what usage counts); -1 keeps what the context allows; the gRPC API refuses
        # other negative values.
        prompt = "Rivers of Europe include the Danube, the Rhine and the"
        ids = list(self.stub.Tokenize(self.pb.TokenizeRequest(text=prompt, add_special_tokens=True),
                                      timeout=5).ids)
        ask = dict(model=self.model, max_tokens=8, temperature=0)
        cut = self.client.completions.create(prompt=prompt, extra_body={
            "truncate_prompt_tokens": 6}, **ask)
        tail = self.client.completions.create(prompt=ids[-6:], **ask)
        self.assertEqual(cut.usage.prompt_tokens, 6)
        self.assertEqual(cut.choices[0].text, tail.choices[0].text)
        whole = self.client.completions.create(prompt=prompt, **ask)
        kept = self.client.completions.create(prompt=prompt, extra_body={
            "truncate_prompt_tokens": -1}, **ask)
        self.assertEqual((kept.usage.prompt_tokens, kept.choices[0].text),
                         (len(ids), whole.choices[0].text))
        with self.assertRaises(self.grpc.RpcError) as caught:
            list(self.stub.Generate(self.pb.GenerateRequest(
                text=prompt, truncate_prompt_tokens=-2,
                stopping=self.pb.StoppingCriteria(max_new_tokens=2)), timeout=30))
        self.assertEqual(caught.exception.code(), self.grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("truncate_prompt_tokens", caught.exception.details())

    def test_bad_words_are_never_written(self):
        # vLLM's bad_words: the words' token sequences (as they are and after a space) never
        # appear in the output, which changes where the unconstrained reply had them.
        prompt = "The capital of France is"
        ask = dict(model=self.model, prompt=prompt, max_tokens=12, temperature=0)
        free = self.client.completions.create(**ask, extra_body={"return_token_ids": True})
        words = free.choices[0].text.split()[:2]  # what the model would write first
        banned = self.client.completions.create(**ask, extra_body={
            "bad_words": words, "return_token_ids": True})
        ids = banned.model_dump()["choices"][0]["token_ids"]
        self.assertNotEqual(banned.choices[0].text, free.choices[0].text)
        for word in words:
            for text in (word, " " + word):
                seq = list(self.stub.Tokenize(self.pb.TokenizeRequest(text=text), timeout=5).ids)
                hits = [i for i in range(len(ids) - len(seq) + 1) if ids[i:i + len(seq)] == seq]
                self.assertEqual(hits, [], (text, seq, ids))
        print(f"\nbad_words {words}: {free.choices[0].text!r} -> {banned.choices[0].text!r}")
        status, _, text = self.raw("POST", "/v1/completions", {
            "prompt": prompt, "max_tokens": 2, "bad_words": ["x" * 300]})
        self.assertApiError(status, text, 400)
        self.assertIn("bad_words", json.loads(text)["error"]["message"])

    def test_chat_equals_the_grpc_api_streamed_or_not(self):
        messages = [{"role": "system", "content": "Answer in one sentence."},
                    {"role": "user", "content": "What is the capital of France?"}]
        whole = self.client.chat.completions.create(model=self.model, messages=messages,
                                                    max_tokens=24, temperature=0)
        chat = self.pb.Chat(messages=[self.pb.ChatMessage(**m) for m in messages])
        text, ids, _, final = self.grpc_generate(self.pb.GenerateRequest(
            chat=chat, sampling=self.pb.SamplingParams(temperature=0),
            stopping=self.pb.StoppingCriteria(max_new_tokens=24)))
        self.assertTrue(text)
        self.assertEqual(whole.choices[0].message.content, text)
        self.assertEqual(whole.choices[0].message.role, "assistant")
        self.assertEqual(whole.usage.completion_tokens, len(ids))
        prompt_ids = self.stub.Tokenize(self.pb.TokenizeRequest(chat=chat), timeout=5).ids
        self.assertEqual(whole.usage.prompt_tokens, len(prompt_ids))
        self.assertEqual(whole.choices[0].finish_reason,
                         "length" if final.finish_reason == self.pb.FINISH_REASON_LENGTH
                         else "stop")

        stream = self.client.chat.completions.create(
            model=self.model, messages=messages, max_tokens=24, temperature=0, stream=True,
            stream_options={"include_usage": True}, logprobs=True, top_logprobs=2)
        chunks = list(stream)
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        content = [c.choices[0].delta.content or "" for c in chunks if c.choices]
        self.assertEqual("".join(content), text)
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
        self.assertEqual(finishes[-1], whole.choices[0].finish_reason)
        self.assertTrue(all(f is None for f in finishes[:-1]))
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.total_tokens, whole.usage.total_tokens)
        self.assertEqual(len({c.id for c in chunks}), 1)
        tokens = [t for c in chunks if c.choices and c.choices[0].logprobs
                  for t in c.choices[0].logprobs.content]
        self.assertEqual(len(tokens), len(ids))
        for t in tokens:
            self.assertEqual(len(t.top_logprobs), 2)
            self.assertEqual(bytes(t.bytes).decode(errors="replace"), t.token)
            self.assertLessEqual(t.logprob, 0)

    def test_chat_template_arguments_reach_the_template(self):
        messages = [{"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello! How"}]
        status, _, body = self.raw("POST", "/tokenize", {"messages": messages,
                                                         "continue_final_message": True,
                                                         "add_generation_prompt": False})
        self.assertEqual(status, 200, body)
        rendered = json.loads(body)
        self.assertTrue(rendered["prompt"].endswith("Hello! How"), rendered["prompt"])
        self.assertEqual(rendered["count"], len(rendered["tokens"]))
        status, _, body = self.raw("POST", "/tokenize", {"messages": messages[:1],
                                                         "add_generation_prompt": False})
        self.assertFalse(json.loads(body)["prompt"].endswith("<|im_start|>assistant\n"))
        status, _, body = self.raw("POST", "/tokenize", {"messages": messages[:1]})
        self.assertTrue(json.loads(body)["prompt"].endswith("<|im_start|>assistant\n"))
        status, _, body = self.raw("POST", "/detokenize", {"tokens": rendered["tokens"]})
        self.assertEqual(status, 200, body)
        self.assertIn("Hello! How", json.loads(body)["prompt"])

    def test_replies_to_requests_with_tools_are_looked_through_for_calls(self):
        tools = [{"type": "function", "function": {
            "name": "get_weather", "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}}]
        messages = [{"role": "user", "content": "What is the weather in Paris?"}]
        reply = self.client.chat.completions.create(model=self.model, messages=messages,
                                                    tools=tools, max_tokens=48, temperature=0)
        chat = self.pb.Chat(messages=[self.pb.ChatMessage(**m) for m in messages],
                            tools_json=json.dumps(tools))
        text, _, _, _ = self.grpc_generate(self.pb.GenerateRequest(
            chat=chat, sampling=self.pb.SamplingParams(temperature=0),
            stopping=self.pb.StoppingCriteria(max_new_tokens=48)))
        message = reply.choices[0].message
        if message.tool_calls:  # what the model chose: each call named, its arguments JSON
            self.assertEqual(reply.choices[0].finish_reason, "tool_calls")
            for call in message.tool_calls:
                self.assertTrue(call.function.name)
                json.loads(call.function.arguments)
            self.assertIn("<tool_call>", text)
            self.assertEqual(message.content or "", text[:text.index("<tool_call>")])
        else:  # nothing parsed as a call: the reply is the text, whole
            self.assertEqual(message.content, text)
        # tool_choice "none": the template still shows the tools (as vLLM's) and no call is
        # looked for: the reply is the text, whole.
        none = self.client.chat.completions.create(model=self.model, messages=messages,
                                                   tools=tools, tool_choice="none", max_tokens=8,
                                                   temperature=0)
        self.assertIsNone(none.choices[0].message.tool_calls)
        text, _, _, _ = self.grpc_generate(self.pb.GenerateRequest(
            chat=chat, sampling=self.pb.SamplingParams(temperature=0),
            stopping=self.pb.StoppingCriteria(max_new_tokens=8)))
        self.assertEqual(none.choices[0].message.content, text)
        # A named function is called, whatever the model would say: its arguments are an
        # instance of its parameters (also streamed, whole at the end).
        import jsonschema
        forced = self.client.chat.completions.create(
            model=self.model, messages=messages, tools=tools, max_tokens=48, temperature=0,
            tool_choice={"type": "function", "function": {"name": "get_weather"}})
        self.assertEqual(forced.choices[0].finish_reason, "stop")
        [call] = forced.choices[0].message.tool_calls
        self.assertEqual(call.function.name, "get_weather")
        jsonschema.validate(json.loads(call.function.arguments),
                            tools[0]["function"]["parameters"])
        chunks = list(self.client.chat.completions.create(
            model=self.model, messages=messages, tools=tools, max_tokens=48, temperature=0,
            tool_choice="required", stream=True))
        calls = [c for chunk in chunks for c in (chunk.choices[0].delta.tool_calls or [])
                 if chunk.choices]
        self.assertEqual([(c.function.name, c.function.arguments) for c in calls],
                         [("get_weather", call.function.arguments)])
        # "required" with several tools: one call of one of them, its arguments an instance.
        more = tools + [{"type": "function", "function": {
            "name": "get_time", "parameters": {"type": "object", "properties": {
                "zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}}}]
        anyone = self.client.chat.completions.create(
            model=self.model, messages=messages, tools=more, max_tokens=160, temperature=0,
            tool_choice="required")
        self.assertEqual(anyone.choices[0].finish_reason, "tool_calls")  # as vLLM's
        [picked] = anyone.choices[0].message.tool_calls
        schema = {t["function"]["name"]: t["function"]["parameters"] for t in more}
        jsonschema.validate(json.loads(picked.function.arguments), schema[picked.function.name])

    def test_responses_api_answers_as_chat_does(self):
        # OpenAI's Responses API through the SDK's client.responses: greedy text, whole or
        # streamed as typed events, equals the chat completion of the same conversation; a
        # named function is called (its arguments an instance) and its output, fed back as
        # input items, is answered as chat answers it; text.format follows a JSON schema;
        # what is not supported is refused, named.
        import jsonschema
        system, question = "Answer in one sentence.", "What is the capital of France?"
        chat = self.client.chat.completions.create(
            model=self.model, max_tokens=24, temperature=0,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": question}])
        reply = self.client.responses.create(model=self.model, instructions=system, input=question,
                                             max_output_tokens=24, temperature=0)
        self.assertEqual(reply.object, "response")
        self.assertEqual(reply.output_text, chat.choices[0].message.content)
        self.assertEqual(reply.status,
                         "completed" if chat.choices[0].finish_reason == "stop" else "incomplete")
        self.assertEqual((reply.usage.input_tokens, reply.usage.output_tokens),
                         (chat.usage.prompt_tokens, chat.usage.completion_tokens))
        types, deltas, final = [], [], None
        for event in self.client.responses.create(model=self.model, instructions=system,
                                                  input=question, max_output_tokens=24,
                                                  temperature=0, stream=True):
            types.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
            if event.type in ("response.completed", "response.incomplete"):
                final = event.response
        self.assertEqual(types[:4], ["response.created", "response.in_progress",
                                     "response.output_item.added", "response.content_part.added"])
        self.assertEqual("".join(deltas), reply.output_text)
        self.assertEqual(final.output_text, reply.output_text)
        self.assertEqual(final.usage.output_tokens, reply.usage.output_tokens)
        # The SDK's stream helper reads every event into its types and gathers the text.
        with self.client.responses.stream(model=self.model, instructions=system, input=question,
                                          max_output_tokens=24, temperature=0) as stream:
            for _ in stream:
                pass
            self.assertEqual(stream.get_final_response().output_text, reply.output_text)

        parameters = {"type": "object", "properties": {"city": {"type": "string"}},
                      "required": ["city"]}
        tools = [{"type": "function", "name": "get_weather", "description": "The weather in a city",
                  "parameters": parameters}]
        ask = {"role": "user", "content": "What is the weather in Paris?"}
        called = self.client.responses.create(
            model=self.model, input=[ask], tools=tools, max_output_tokens=48, temperature=0,
            tool_choice={"type": "function", "name": "get_weather"})
        [call] = [item for item in called.output if item.type == "function_call"]
        self.assertEqual(call.name, "get_weather")
        jsonschema.validate(json.loads(call.arguments), parameters)
        answered = self.client.responses.create(
            model=self.model, tools=tools, max_output_tokens=32, temperature=0, input=[
                ask, {"type": "function_call", "call_id": call.call_id, "name": call.name,
                      "arguments": call.arguments},
                {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 C"}])
        as_chat = self.client.chat.completions.create(
            model=self.model, max_tokens=32, temperature=0,
            tools=[{"type": "function", "function": {k: v for k, v in tools[0].items()
                                                     if k != "type"}}],
            messages=[ask, {"role": "assistant", "content": "", "tool_calls": [
                {"id": call.call_id, "type": "function",
                 "function": {"name": call.name, "arguments": call.arguments}}]},
                {"role": "tool", "tool_call_id": call.call_id, "content": "Sunny, 24 C"}])
        self.assertEqual(answered.output_text, as_chat.choices[0].message.content or "")
        print(f"\nresponses: {reply.output_text!r}; called {call.arguments}; "
              f"then {answered.output_text!r}")

        schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                                   "age": {"type": "integer", "minimum": 0}},
                  "required": ["name", "age"], "additionalProperties": False}
        shaped = self.client.responses.create(
            model=self.model, input="Describe a cat as JSON.", max_output_tokens=60, temperature=0,
            text={"format": {"type": "json_schema", "name": "cat", "schema": schema}})
        self.assertEqual(shaped.status, "completed", shaped.output_text)
        jsonschema.validate(json.loads(shaped.output_text), schema)

        for body, param in (({"input": "x", "conversation": "conv_1"}, "conversation"),
                            ({"input": "x", "tools": [{"type": "web_search_preview"}]},
                             "tools[0].type"),
                            ({"input": [{"role": "user", "content": [
                                {"type": "input_image", "image_url": "http://x/y.png"}]}]},
                             "input[0].content[0].type")):
            status, _, text = self.raw("POST", "/v1/responses", body)
            self.assertApiError(status, text, 400, param)
        ct.wait_until_nothing_reserved(self.router, [self.worker])

    def test_stored_responses_continue_read_list_and_delete(self):
        # A stored response continued by previous_response_id answers as chat answers the
        # whole conversation (the first turn's instructions not carried over), streamed or
        # not; it reads back whole and its input items list; store=false keeps nothing;
        # other credentials see nothing; deleting a turn breaks the chains through it (404
        # naming previous_response_id).
        question, more, last = ("What is the capital of France?", "And of Italy?",
                                "And of Spain?")
        ask = dict(model=self.model, max_output_tokens=24, temperature=0)
        first = self.client.responses.create(instructions="Answer in one sentence.",
                                              input=question, **ask)
        self.assertTrue(first.store)
        self.assertIsNone(first.previous_response_id)
        second = self.client.responses.create(previous_response_id=first.id, input=more, **ask)
        self.assertEqual(second.previous_response_id, first.id)
        turns = [{"role": "user", "content": question},
                 {"role": "assistant", "content": first.output_text},
                 {"role": "user", "content": more}]
        chat = self.client.chat.completions.create(model=self.model, max_tokens=24,
                                                   temperature=0, messages=turns)
        self.assertEqual(second.output_text, chat.choices[0].message.content)
        self.assertEqual(second.usage.input_tokens, chat.usage.prompt_tokens)
        streamed, final = [], None
        for event in self.client.responses.create(previous_response_id=second.id, input=last,
                                                  stream=True, **ask):
            if event.type == "response.output_text.delta":
                streamed.append(event.delta)
            if event.type in ("response.completed", "response.incomplete"):
                final = event.response
        chat = self.client.chat.completions.create(
            model=self.model, max_tokens=24, temperature=0,
            messages=turns + [{"role": "assistant", "content": second.output_text},
                              {"role": "user", "content": last}])
        self.assertEqual("".join(streamed), chat.choices[0].message.content)
        third = self.client.responses.retrieve(final.id)
        self.assertEqual((third.id, third.output_text, third.previous_response_id),
                         (final.id, "".join(streamed), second.id))
        self.assertEqual(third.output[0].id, final.output[0].id)
        self.assertEqual(self.client.responses.retrieve(first.id).output_text, first.output_text)
        items = self.client.responses.input_items.list(second.id)
        self.assertEqual([(i.type, i.role, i.content[0].text) for i in items.data],
                         [("message", "user", more)])

        unkept = self.client.responses.create(input=question, store=False, **ask)
        self.assertFalse(unkept.store)
        mine, theirs = {"Authorization": "Bearer unused"}, {"Authorization": "Bearer other"}
        status, _, text = self.raw("GET", f"/v1/responses/{unkept.id}", headers=mine)
        self.assertApiError(status, text, 404)
        status, _, text = self.raw("GET", f"/v1/responses/{first.id}", headers=theirs)
        self.assertApiError(status, text, 404)
        status, _, text = self.raw("GET", f"/v1/responses/{first.id}/input_items?limit=0",
                                   headers=mine)
        self.assertApiError(status, text, 400, "limit")
        status, headers, text = self.raw("POST", f"/v1/responses/{first.id}", {}, headers=mine)
        self.assertEqual((status, headers.get("Allow")), (405, "GET, DELETE"), text)

        self.client.responses.delete(first.id)
        with self.assertRaises(openai.NotFoundError):
            self.client.responses.retrieve(first.id)
        status, _, text = self.raw("POST", "/v1/responses",
                                   {"input": "x", "previous_response_id": final.id},
                                   headers={"Authorization": "Bearer unused"})
        # As OpenAI answers an unknown previous_response_id (clients then resend the whole
        # conversation): 400, code previous_response_not_found.
        self.assertEqual(status, 400, text)
        error = json.loads(text)["error"]
        self.assertEqual((error["code"], error["param"], error["type"]),
                         ("previous_response_not_found", "previous_response_id",
                          "invalid_request_error"))
        self.assertIn(f"'{first.id}'", error["message"])
        ct.wait_until_nothing_reserved(self.router, [self.worker])

    def test_special_tokens_reach_the_text_when_asked(self):
        # Past its end of turn (ignore_eos) the reply holds special tokens: left out of the
        # text by default, there with skip_special_tokens false — as the tokenizer decodes.
        messages = [{"role": "system", "content": "Answer in one sentence."},
                    {"role": "user", "content": "What is the capital of France?"}]
        texts = {}
        for skip in (True, False):
            body = {"messages": messages, "max_tokens": 24,
                    "temperature": 0, "ignore_eos": True, "skip_special_tokens": skip}
            status, _, reply = self.raw("POST", "/v1/chat/completions", body)
            self.assertEqual(status, 200, reply)
            texts[skip] = json.loads(reply)["choices"][0]["message"]["content"]
        chat = self.pb.Chat(messages=[self.pb.ChatMessage(**m) for m in messages])
        _, ids, _, _ = self.grpc_generate(self.pb.GenerateRequest(
            chat=chat, sampling=self.pb.SamplingParams(temperature=0),
            stopping=self.pb.StoppingCriteria(max_new_tokens=24, ignore_eos=True)))
        for skip in (True, False):
            decoded = self.stub.Detokenize(self.pb.DetokenizeRequest(
                ids=ids, skip_special_tokens=skip), timeout=5).text
            self.assertEqual(texts[skip], decoded)
        self.assertNotEqual(texts[True], texts[False])  # the reply did pass its end of turn

    def test_json_object_replies_parse_as_objects(self):
        # Constrained decoding: whatever the model would say, each reply that ends (rather
        # than reaching max_tokens) is one JSON object, greedy or sampled, whole or streamed.
        messages = [{"role": "user", "content": "Describe a cat as a JSON object with name and age."}]
        unconstrained = self.client.chat.completions.create(
            model=self.model, messages=messages, max_tokens=60, temperature=0)
        reply = self.client.chat.completions.create(
            model=self.model, messages=messages, max_tokens=120, temperature=0,
            response_format={"type": "json_object"}, logprobs=True, top_logprobs=3)
        self.assertEqual(reply.choices[0].finish_reason, "stop")
        self.assertIsInstance(json.loads(reply.choices[0].message.content), dict)
        for t in reply.choices[0].logprobs.content:  # masked alternatives are left out
            self.assertIsInstance(t.logprob, float)
            self.assertLessEqual(len(t.top_logprobs), 3)
            for alt in t.top_logprobs:
                self.assertIsInstance(alt.logprob, float)
        self.assertNotEqual(reply.choices[0].message.content, unconstrained.choices[0].message.content)
        sampled = self.client.chat.completions.create(
            model=self.model, messages=messages, max_tokens=120, temperature=1.0, seed=11, n=8,
            response_format={"type": "json_object"})
        ended = [c for c in sampled.choices if c.finish_reason == "stop"]
        self.assertGreaterEqual(len(ended), 4, [c.message.content for c in sampled.choices])
        for choice in ended:
            self.assertIsInstance(json.loads(choice.message.content), dict, choice.message.content)
        for choice in sampled.choices:  # cut short: still a prefix of an object
            self.assertTrue(choice.message.content.lstrip().startswith("{"), choice.message.content)
        stream = self.client.completions.create(
            model=self.model, prompt="A JSON object with a city and its country:", max_tokens=120,
            temperature=0, stream=True, extra_body={"response_format": {"type": "json_object"}})
        chunks = list(stream)
        self.assertEqual(chunks[-1].choices[0].finish_reason, "stop")
        self.assertIsInstance(json.loads("".join(c.choices[0].text for c in chunks)), dict)
        ct.wait_until_nothing_reserved(self.router, [self.worker])

    def test_json_schema_replies_are_instances(self):
        # A pydantic model's schema ($defs, an Enum, a list of objects, an Optional, string
        # lengths and a pattern, number bounds): every reply that ends is an instance, as the
        # jsonschema package and pydantic both check; a schema keyword the decoder cannot
        # enforce is refused, named.
        import jsonschema
        import pydantic

        class Color(str, enum.Enum):
            black = "black"
            white = "white"
            orange = "orange"

        class Toy(pydantic.BaseModel):
            name: str = pydantic.Field(pattern=r"^[A-Z][a-z]{1,15}$")
            squeaks: bool

        class Cat(pydantic.BaseModel):
            name: str = pydantic.Field(min_length=2, max_length=20)
            age: int = pydantic.Field(ge=1, le=25)
            weight_kg: float = pydantic.Field(gt=0.5, lt=12.5)
            color: Color
            toys: list[Toy] = pydantic.Field(max_length=3)
            nickname: typing.Optional[str] = None

        schema = Cat.model_json_schema()
        messages = [{"role": "user", "content": "Describe a cat as JSON."}]
        for reply in self.ended_schema_replies(messages, schema, max_tokens=300, n=8, seed=5,
                                               at_least=7):
            jsonschema.validate(json.loads(reply), schema)
            Cat.model_validate_json(reply)
        status, _, text = self.raw("POST", "/v1/chat/completions", {
            "messages": messages, "response_format": {"type": "json_schema", "json_schema": {
                "name": "x", "schema": {"type": "object", "properties": {
                    "a": {"type": "integer", "multipleOf": 5}}}}}})
        self.assertEqual(status, 501, text)
        self.assertIn("at /properties/a: \\\"multipleOf\\\" is not supported", text)
        ct.wait_until_nothing_reserved(self.router, [self.worker])

    def test_formats_of_pydantic_types_validate(self):
        # datetime, date, time, UUID and IPv4Address fields carry JSON Schema formats, and a
        # tuple prefixItems, which the decoder follows: every reply that ends is what pydantic
        # accepts, greedy or sampled.
        import datetime
        import ipaddress
        import uuid
        import pydantic

        class Meeting(pydantic.BaseModel):
            title: str = pydantic.Field(max_length=30)
            starts: datetime.datetime
            day: datetime.date
            at: datetime.time
            id: uuid.UUID
            host: ipaddress.IPv4Address
            room: tuple[int, typing.Annotated[str, pydantic.Field(max_length=12)]]

        messages = [{"role": "user", "content": "Describe a team meeting as JSON."}]
        for reply in self.ended_schema_replies(messages, Meeting.model_json_schema(),
                                               max_tokens=200, n=6, seed=7, at_least=5):
            Meeting.model_validate_json(reply)
        ct.wait_until_nothing_reserved(self.router, [self.worker])

    def test_guided_choice_and_regex_replies_match(self):
        # vLLM's guided_choice and guided_regex (and structured_outputs): every reply that
        # ends is one of the choices, or matches the pattern whole as Python's re does, greedy
        # or sampled, whole or streamed; a pattern the decoder cannot follow is refused, named.
        messages = [{"role": "user", "content": "Is the sea salty? Answer in one word."}]
        choices = ["Yes, very", "No", "Only sometimes"]
        reply = self.client.chat.completions.create(
            model=self.model, messages=messages, max_tokens=20, temperature=0,
            extra_body={"guided_choice": choices})
        self.assertEqual(reply.choices[0].finish_reason, "stop")
        self.assertIn(reply.choices[0].message.content, choices)
        sampled = self.client.chat.completions.create(
            model=self.model, messages=messages, max_tokens=20, temperature=1.0, seed=3, n=8,
            extra_body={"structured_outputs": {"choice": choices}})
        for choice in sampled.choices:
            self.assertEqual(choice.finish_reason, "stop")
            self.assertIn(choice.message.content, choices)
        pattern = r"(19|20)\d{2}-(0[1-9]|1[0-2])-[0-3]\d, [A-Z][a-z]{2,12}"
        for temperature, stream in ((0, False), (1.0, True)):
            response = self.client.completions.create(
                model=self.model, prompt="The date and the city of the first moon landing:",
                max_tokens=40, temperature=temperature, seed=5, stream=stream,
                extra_body={"guided_regex": pattern})
            chunks = list(response) if stream else [response]
            text = "".join(c.choices[0].text for c in chunks)
            self.assertEqual(chunks[-1].choices[0].finish_reason, "stop", text)
            self.assertIsNotNone(re.fullmatch(pattern, text, re.ASCII), text)
            print(f"\nguided: {reply.choices[0].message.content!r}; regex "
                  f"(temperature {temperature}): {text!r}")
        status, _, body = self.raw("POST", "/v1/completions",
                                   {"prompt": "x", "guided_regex": "(a)\\1"})
        self.assertApiError(status, body, 400)
        self.assertIn("backreference", json.loads(body)["error"]["message"])
        ct.wait_until_nothing_reserved(self.router, [self.worker])

    def test_guided_grammar_replies_parse(self):
        # vLLM's guided_grammar (and structured_outputs.grammar) in GBNF: every reply that
        # ends is a sentence of the grammar, here arithmetic that Python's own parser reads
        # as an expression of integers, greedy or sampled; a left-recursive grammar is
        # refused, named.
        import ast
        grammar = r"""
            root   ::= expr
            expr   ::= term (("+" | "-") term){0,3}
            term   ::= factor (("*" | "/") factor){0,2}
            factor ::= [1-9] [0-9]{0,2} | "(" expr ")"
        """
        def arithmetic(node):
            if isinstance(node, ast.Expression):
                return arithmetic(node.body)
            if isinstance(node, ast.BinOp):
                return (isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div))
                        and arithmetic(node.left) and arithmetic(node.right))
            return isinstance(node, ast.Constant) and isinstance(node.value, int)
        messages = [{"role": "user", "content": "Write an arithmetic expression."}]
        replies = []
        for temperature, extra in ((0, {"guided_grammar": grammar}),
                                   (1.0, {"structured_outputs": {"grammar": grammar}})):
            reply = self.client.chat.completions.create(
                model=self.model, messages=messages, max_tokens=60, temperature=temperature,
                seed=11, n=1 if temperature == 0 else 6, extra_body=extra)
            replies += [c for c in reply.choices if c.finish_reason == "stop"]
        print(f"\ngrammar: {[c.message.content for c in replies]}")
        self.assertGreaterEqual(len(replies), 4)
        for choice in replies:
            self.assertTrue(arithmetic(ast.parse(choice.message.content, mode="eval")),
                            choice.message.content)
        status, _, body = self.raw("POST", "/v1/completions", {
            "prompt": "x", "guided_grammar": "root ::= root \"a\""})
        self.assertApiError(status, body, 400)
        self.assertIn("left recursion", json.loads(body)["error"]["message"])
        ct.wait_until_nothing_reserved(self.router, [self.worker])

    def test_logit_bias_allowed_tokens_and_min_tokens_steer_the_reply(self):
        prompt = "The three primary colors are"
        greedy = self.client.completions.create(model=self.model, prompt=prompt, max_tokens=6,
                                                temperature=0, logprobs=0)
        first = greedy.choices[0].logprobs.tokens[0]
        status, _, body = self.raw("POST", "/tokenize", {"prompt": first,
                                                         "add_special_tokens": False})
        self.assertEqual(status, 200, body)
        [first_id] = json.loads(body)["tokens"]
        # A ban moves the first token off greedy's.
        banned = self.client.completions.create(model=self.model, prompt=prompt, max_tokens=6,
                                                temperature=0, logprobs=0,
                                                logit_bias={str(first_id): -100})
        self.assertNotEqual(banned.choices[0].logprobs.tokens[0], first)
        # Only these tokens, whatever the model would rather say.
        status, _, body = self.raw("POST", "/tokenize", {"prompt": " red green blue",
                                                         "add_special_tokens": False})
        allowed = json.loads(body)["tokens"]
        only = self.client.completions.create(model=self.model, prompt=prompt, max_tokens=8,
                                              temperature=0,
                                              extra_body={"allowed_token_ids": allowed})
        self.assertEqual(only.usage.completion_tokens, 8)
        self.assertTrue(set(only.choices[0].text.split()) <= {"red", "green", "blue"},
                        only.choices[0].text)
        # A short reply goes on past its end-of-sequence until min_tokens.
        messages = [{"role": "user", "content": "Say hi."}]
        short = self.client.chat.completions.create(model=self.model, messages=messages,
                                                    max_tokens=60, temperature=0)
        self.assertEqual(short.choices[0].finish_reason, "stop")
        n = short.usage.completion_tokens
        longer = self.client.chat.completions.create(model=self.model, messages=messages,
                                                     max_tokens=60, temperature=0,
                                                     extra_body={"min_tokens": n + 5})
        self.assertGreaterEqual(longer.usage.completion_tokens, n + 5)
        self.assertTrue(longer.choices[0].message.content.startswith(
            short.choices[0].message.content.rstrip()), longer.choices[0].message.content)
        for body, param in (({"prompt": "x", "logit_bias": {"5": 101}}, None),
                            ({"prompt": "x", "logit_bias": {"99999999": 1}}, None),
                            ({"prompt": "x", "allowed_token_ids": [99999999]}, None),
                            ({"prompt": "x", "logit_bias": {"x": 1}}, "logit_bias")):
            with self.subTest(body=body):
                status, _, text = self.raw("POST", "/v1/completions", body)
                self.assertApiError(status, text, 400, param)

    def test_echo_with_logprobs_scores_the_prompt(self):
        """An evaluation harness's loglikelihood request (echo, logprobs, one new token):
        the prompt's tokens come back, the first unscored, the others with the
        log-probabilities the gRPC API's prompt_logprobs gives them."""
        prompt = "The capital of France is Paris"
        response = self.client.completions.create(model=self.model, prompt=prompt, max_tokens=1,
                                                  temperature=0, logprobs=1, echo=True)
        lp = response.choices[0].logprobs
        messages = list(self.stub.Generate(self.pb.GenerateRequest(
            text=prompt, add_special_tokens=True, parse_special_tokens=True, prompt_logprobs=1,
            sampling=self.pb.SamplingParams(temperature=0),
            stopping=self.pb.StoppingCriteria(max_new_tokens=1)), timeout=120))
        scored = list(messages[0].prompt_logprobs)
        n = len(scored) + 1  # The prompt's tokens, then the one generated.
        self.assertEqual(len(lp.tokens), n + 1)
        self.assertIsNone(lp.token_logprobs[0])
        self.assertEqual("".join(lp.tokens[:n]), prompt)
        self.assertTrue(response.choices[0].text.startswith(prompt))
        for i, entry in enumerate(scored, start=1):
            self.assertEqual(lp.tokens[i], entry.text)
            self.assertAlmostEqual(lp.token_logprobs[i], entry.logprob, delta=1e-3)
            self.assertEqual(lp.text_offset[i], len("".join(lp.tokens[:i])))
        # " Paris" after "The capital of France is" is likely.
        self.assertGreater(lp.token_logprobs[n - 1], -3.0)

    def test_stop_strings_end_the_text(self):
        free = self.client.completions.create(model=self.model, prompt="Count: one, two,",
                                              max_tokens=16, temperature=0)
        text = free.choices[0].text
        stop = text.strip().split()[1] if len(text.strip().split()) > 1 else text.strip()[:2]
        stopped = self.client.completions.create(model=self.model, prompt="Count: one, two,",
                                                 max_tokens=16, temperature=0, stop=[stop])
        self.assertEqual(stopped.choices[0].finish_reason, "stop")
        self.assertEqual(stopped.choices[0].model_extra["stop_reason"], stop)
        self.assertEqual(stopped.choices[0].text, text[:text.index(stop)])
        kept = self.client.completions.create(model=self.model, prompt="Count: one, two,",
                                              max_tokens=16, temperature=0, stop=[stop],
                                              extra_body={"include_stop_str_in_output": True})
        self.assertEqual(kept.choices[0].text, text[:text.index(stop) + len(stop)])
        # Before min_tokens a stop string does not end the text.
        n = stopped.usage.completion_tokens
        longer = self.client.completions.create(model=self.model, prompt="Count: one, two,",
                                                max_tokens=16, temperature=0, stop=[stop],
                                                extra_body={"min_tokens": n + 2})
        self.assertGreaterEqual(longer.usage.completion_tokens, n + 2)
        self.assertTrue(longer.choices[0].text.startswith(text[:text.index(stop) + len(stop)]),
                        longer.choices[0].text)

    def test_refusals_are_openai_errors_naming_the_parameter(self):
        cases = [
            ({"prompt": "x", "n": 17}, "/v1/completions", 400, "n"),
            ({"prompt": "x", "temperature": "hot"}, "/v1/completions", 400, "temperature"),
            ({"prompt": ["a"] * 17, "n": 16}, "/v1/completions", 400, "prompt"),
            ({"messages": []}, "/v1/chat/completions", 400, "messages"),
            ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
             "/v1/chat/completions", 400, "messages[0].content[0].type"),
            ({"messages": [{"role": "user", "content": "x"}],
              "response_format": {"type": "json_schema"}}, "/v1/chat/completions", 400,
             "response_format"),
            ({"messages": [{"role": "user", "content": "x"}], "ignore_eos": True,
              "response_format": {"type": "json_object"}}, "/v1/chat/completions", 400, None),
            # Values the router checks: its message names its field.
            ({"prompt": "x", "top_p": 1.5}, "/v1/completions", 400, None),
            ({"prompt": "x", "model": "nope"}, "/v1/completions", 404, None),
        ]
        for body, path, http_status, param in cases:
            with self.subTest(body=body):
                status, _, text = self.raw("POST", path, body)
                self.assertApiError(status, text, http_status, param)
        # A context overflow has OpenAI's code, which clients look for to trim.
        status, _, text = self.raw("POST", "/v1/completions", {"prompt": "x", "max_tokens": 100000})
        self.assertEqual(status, 400, text)
        self.assertEqual(json.loads(text)["error"]["code"], "context_length_exceeded")
        status, _, text = self.raw("POST", "/v1/completions", "{not json")
        self.assertApiError(status, text, 400)
        status, _, text = self.raw("POST", "/v1/completions", "[" * 100 + "]" * 100)
        self.assertApiError(status, text, 400)
        status, _, text = self.raw("POST", "/v1/audio/speech", {"input": "x"})
        self.assertApiError(status, text, 404)
        status, headers, text = self.raw("GET", "/v1/completions")
        self.assertApiError(status, text, 405)
        self.assertEqual(headers.get("Allow"), "POST")
        # The SDK raises the matching exceptions.
        with self.assertRaises(openai.BadRequestError) as caught:
            self.client.completions.create(model=self.model, prompt="x", best_of=2)
        self.assertEqual(caught.exception.body["param"], "best_of")
        with self.assertRaises(openai.NotFoundError):
            self.client.chat.completions.create(model="nope", messages=[{"role": "user",
                                                                         "content": "x"}])

    def test_a_cache_salt_keeps_the_prefix_cache_apart(self):
        """vLLM's cache_salt: a prompt reuses the cached blocks only of requests with the same
        salt (none being a salt of its own), and the reply is the same either way."""
        import random
        rng = random.Random(71)
        words = ["river", "stone", "quiet", "lantern", "orbit", "maple", "signal", "copper"]
        prompt = " ".join(rng.choice(words) for _ in range(120))  # Several full blocks.

        def cached(salt, path="/v1/completions"):
            body = {"prompt": prompt, "max_tokens": 6, "temperature": 0}
            if path != "/v1/completions":
                body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 6,
                        "temperature": 0}
            if salt is not None:
                body["cache_salt"] = salt
            status, _, text = self.raw("POST", path, body)
            self.assertEqual(status, 200, text)
            reply = json.loads(text)
            choice = reply["choices"][0]
            return (reply["usage"]["prompt_tokens_details"]["cached_tokens"],
                    choice.get("text", choice.get("message", {}).get("content")))

        first, text = cached("tenant-a")
        self.assertEqual(first, 0)
        self.assertEqual(cached("tenant-b"), (0, text))
        self.assertEqual(cached(None), (0, text))
        again, same = cached("tenant-a")
        self.assertGreaterEqual(again, 96)  # All but the last, partial block.
        self.assertEqual(same, text)
        self.assertEqual(cached(None), (again, text))
        # Chat and the Responses API pass it too.
        self.assertEqual(cached("chat-a", "/v1/chat/completions")[0], 0)
        self.assertGreater(cached("chat-a", "/v1/chat/completions")[0], 0)
        self.assertEqual(cached("chat-b", "/v1/chat/completions")[0], 0)
        # The Responses API renders the same conversation: chat-a's blocks are its own.
        for salt, hit in (("chat-a", True), ("responses-c", False)):
            status, _, text = self.raw("POST", "/v1/responses", {
                "input": prompt, "max_output_tokens": 2, "cache_salt": salt})
            self.assertEqual(status, 200, text)
            cached = json.loads(text)["usage"]["input_tokens_details"]["cached_tokens"]
            self.assertEqual(cached > 0, hit, (salt, cached))
        for salt, param in (("", "cache_salt"), (7, "cache_salt"), ("s" * 257, None)):
            with self.subTest(salt=salt):
                status, _, text = self.raw("POST", "/v1/completions",
                                           {"prompt": "x", "cache_salt": salt})
                self.assertApiError(status, text, 400, param)
                self.assertIn("cache_salt", text)

    def test_embeddings_are_the_last_hidden_state_normalized(self):
        """/v1/embeddings (as vLLM serves decoder models): each input's embedding is the
        model's last hidden state at its last token, of unit norm unless normalize is false;
        inputs keep their order, token ids embed as their text does, base64 carries the same
        floats, a cached prefix changes nothing, and bad requests name their field."""
        import base64
        import math
        import struct

        def embed(body, status=200):
            code, _, text = self.raw("POST", "/v1/embeddings", {"model": self.model, **body})
            self.assertEqual(code, status, text)
            return json.loads(text)

        def close(a, b, tolerance=1e-5):
            self.assertEqual(len(a), len(b))
            worst = max(abs(x - y) for x, y in zip(a, b))
            self.assertLess(worst, tolerance)

        texts = ["The lighthouse keeper trimmed the wick at dusk.",
                 "Copper wire carries the signal across the valley.",
                 "The lighthouse keeper trimmed the wick at dusk."]
        reply = embed({"input": texts})
        self.assertEqual(reply["object"], "list")
        self.assertEqual(reply["model"], self.model)
        vectors = [item["embedding"] for item in reply["data"]]
        self.assertEqual([item["index"] for item in reply["data"]], [0, 1, 2])
        self.assertEqual({len(v) for v in vectors}, {576})  # SmolLM2's hidden size.
        for v in vectors:
            self.assertAlmostEqual(math.sqrt(sum(x * x for x in v)), 1.0, places=5)
        close(vectors[0], vectors[2])  # The same input, computed twice.
        self.assertLess(sum(x * y for x, y in zip(vectors[0], vectors[1])), 0.999)
        ids = self.stub.Tokenize(self.pb.TokenizeRequest(text=texts[0], add_special_tokens=True),
                                 timeout=10).ids
        self.assertEqual(reply["usage"]["prompt_tokens"], len(ids) * 2 + len(
            self.stub.Tokenize(self.pb.TokenizeRequest(text=texts[1], add_special_tokens=True),
                               timeout=10).ids))
        close(embed({"input": list(ids)})["data"][0]["embedding"], vectors[0])
        raw = embed({"input": texts[0], "normalize": False})["data"][0]["embedding"]
        norm = math.sqrt(sum(x * x for x in raw))
        self.assertGreater(abs(norm - 1), 0.1)
        close([x / norm for x in raw], vectors[0])
        packed = embed({"input": texts[1], "encoding_format": "base64"})["data"][0]["embedding"]
        unpacked = base64.b64decode(packed)
        close(list(struct.unpack(f"<{len(unpacked) // 4}f", unpacked)), vectors[1], 1e-7)
        # vLLM's chat form: the conversation through the template, no reply prompt.
        conversation = [{"role": "user", "content": texts[0]}]
        rendered = self.stub.Tokenize(self.pb.TokenizeRequest(chat=self.pb.Chat(
            messages=[self.pb.ChatMessage(role="user", content=texts[0])],
            add_generation_prompt=False)), timeout=10).ids
        close(embed({"messages": conversation})["data"][0]["embedding"],
              embed({"input": list(rendered)})["data"][0]["embedding"])
        # OpenAI's SDK (which asks for base64 and decodes it).
        sdk = self.client.embeddings.create(model=self.model, input=texts[:2])
        close(sdk.data[1].embedding, vectors[1], 1e-7)
        # gRPC: the cached prefix of a repeated long input, within its cache salt only; the
        # HTTP API passes the salt too.
        long_text = " ".join(texts * 8)

        def grpc_embed(salt=""):
            return self.stub.Embed(self.pb.EmbedRequest(text=long_text, cache_salt=salt),
                                   timeout=60)
        first, again, salted = grpc_embed(), grpc_embed(), grpc_embed("tenant-e")
        self.assertEqual(first.prompt_tokens, again.prompt_tokens)
        self.assertGreater(again.cached_prompt_tokens, first.cached_prompt_tokens)
        self.assertEqual(salted.cached_prompt_tokens, 0)
        self.assertGreater(grpc_embed("tenant-e").cached_prompt_tokens, 0)
        close(list(first.embedding), list(again.embedding))
        close(list(first.embedding), list(salted.embedding))
        embed({"input": long_text, "cache_salt": "tenant-f"})
        self.assertGreater(grpc_embed("tenant-f").cached_prompt_tokens, 0)
        for body, param in (({"input": ""}, "input"), ({"input": []}, "input"),
                            ({"input": [1, -2]}, "input[1]"), ({"input": {"a": 1}}, "input"),
                            ({"input": "x", "dimensions": 64}, "dimensions"),
                            ({"input": "x", "encoding_format": "hex"}, "encoding_format"),
                            ({"input": "x", "cache_salt": ""}, "cache_salt"),
                            ({"input": ["x"] * 2049}, "input"),
                            ({"input": "x", "model": "nope"}, None)):
            with self.subTest(body=str(body)[:60]):
                code, _, text = self.raw("POST", "/v1/embeddings", body)
                self.assertApiError(code, text, 404 if body.get("model") else 400, param)
        code, _, text = self.raw("POST", "/v1/embeddings", {"input": [7] * 9000})
        self.assertEqual(code, 400, text)
        self.assertEqual(json.loads(text)["error"]["code"], "context_length_exceeded")

    def test_web_pages_of_other_origins_may_call_it(self):
        # A browser's preflight, then the call: any origin, as vLLM answers by default.
        status, headers, _ = self.raw("OPTIONS", "/v1/chat/completions", None, {
            "Origin": "https://chat.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        self.assertEqual(status, 200)
        self.assertEqual(headers["Access-Control-Allow-Origin"], "*")
        self.assertIn("POST", headers["Access-Control-Allow-Methods"])
        self.assertEqual(headers["Access-Control-Allow-Headers"], "authorization, content-type")
        status, headers, text = self.raw(
            "POST", "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "stream": True},
            {"Origin": "https://chat.example"})
        self.assertEqual(status, 200, text)
        self.assertEqual(headers["Access-Control-Allow-Origin"], "*")
        self.assertIn("X-Request-Id", headers["Access-Control-Expose-Headers"])
        status, headers, text = self.raw("GET", "/v1/models")  # No Origin: no CORS header.
        self.assertNotIn("Access-Control-Allow-Origin", headers)
        # The server's own refusals (a body over the limit, refused unread) are readable by
        # the page too.
        with socket.create_connection(("127.0.0.1", self.http_port), timeout=60) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nOrigin: https://chat.example\r\n"
                      b"Content-Length: 100000000000\r\n\r\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        self.assertIn(b" 413 ", data.split(b"\r\n")[0])
        self.assertIn(b"access-control-allow-origin: *", data.lower())

    def test_tools_without_a_parser_are_refused_unless_the_call_is_forced(self):
        # A router with no --tool-call-parser could not find the calls in a reply: "auto" is
        # refused (as vLLM refuses it), naming the flag; it needs no worker to say so.
        router = ct.Process([ct.binary("cleave-router"), "--listen=127.0.0.1:0",
                             "--metrics-port=0", f"--model={MODEL}", "--http-listen=127.0.0.1:0"])
        try:
            tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
            for path, body in (
                    ("/v1/chat/completions",
                     {"messages": [{"role": "user", "content": "x"}], "tools": tools}),
                    ("/v1/responses", {"input": "x", "tools": [{"type": "function", "name": "f"}]})):
                connection = http.client.HTTPConnection("127.0.0.1", router.ready["http_port"],
                                                        timeout=30)
                connection.request("POST", path, body=json.dumps(body),
                                   headers={"Content-Type": "application/json"})
                response = connection.getresponse()
                text = response.read().decode()
                connection.close()
                self.assertApiError(response.status, text, 400, "tool_choice")
                self.assertIn("--tool-call-parser", json.loads(text)["error"]["message"])
        finally:
            router.stop()

    def test_logprobs_of_tokens_that_split_a_character(self):
        # Byte-level tokens of CJK text are parts of characters: their text is U+FFFD,
        # their bytes exact, and the request completes (and frees its blocks).
        response = self.client.completions.create(
            model=self.model, prompt="你好，世界！我喜欢吃", max_tokens=12, temperature=0,
            logprobs=5, extra_body={"ignore_eos": True})
        self.assertEqual(response.usage.completion_tokens, 12)
        chat = self.client.chat.completions.create(
            model=self.model, messages=[{"role": "user", "content": "用中文说你好"}],
            max_tokens=12, temperature=0, logprobs=True, top_logprobs=5)
        for t in chat.choices[0].logprobs.content:
            self.assertEqual(bytes(t.bytes).decode(errors="replace"), t.token)
            for alt in t.top_logprobs:
                self.assertEqual(bytes(alt.bytes).decode(errors="replace"), alt.token)
        joined = b"".join(bytes(t.bytes) for t in chat.choices[0].logprobs.content)
        self.assertTrue(joined.decode(errors="replace").startswith(
            chat.choices[0].message.content[:1]))
        ct.wait_until_nothing_reserved(self.router, [self.worker])

    def test_content_parts_are_joined_into_text(self):
        parts = [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]
        status, _, body = self.raw("POST", "/tokenize", {"messages": [{"role": "user",
                                                                       "content": parts}]})
        self.assertEqual(status, 200, body)
        status, _, plain = self.raw("POST", "/tokenize", {"messages": [
            {"role": "user", "content": "Hello\nthere"}]})
        self.assertEqual(json.loads(body)["tokens"], json.loads(plain)["tokens"])

    def test_http_framing_limits_and_old_clients(self):
        # HTTP/1.0 gets an unchunked stream that ends with the connection.
        import socket
        payload = json.dumps({"prompt": "Hello", "max_tokens": 3, "stream": True}).encode()
        with socket.create_connection(("127.0.0.1", self.http_port), timeout=60) as s:
            s.sendall(b"POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
                      b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        self.assertNotIn(b"chunked", head.lower())
        self.assertEqual(events(body.decode())[-1], "[DONE]")
        # A body over the limit is refused and its connection closed, unread.
        with socket.create_connection(("127.0.0.1", self.http_port), timeout=60) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nContent-Length: 100000000000\r\n\r\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        self.assertIn(b" 413 ", data.split(b"\r\n")[0])
        self.assertIn(b"connection: close", data.lower())
        # A malformed request id is the client's to fix.
        status, _, text = self.raw("POST", "/v1/completions", {"prompt": "x"},
                                   {"X-Request-Id": "a b"})
        self.assertApiError(status, text, 400, "x-request-id")

    def test_several_choices_are_separate_samples_of_one_prompt(self):
        sampled = self.client.completions.create(
            model=self.model, prompt="My favourite animal is", max_tokens=12, temperature=1.0,
            seed=7, n=3, extra_body={"ignore_eos": True})
        self.assertEqual([c.index for c in sampled.choices], [0, 1, 2])
        self.assertEqual(sampled.usage.completion_tokens, 3 * 12)
        one = self.client.completions.create(model=self.model, prompt="My favourite animal is",
                                             max_tokens=12, temperature=1.0, seed=7,
                                             extra_body={"ignore_eos": True})
        self.assertEqual(sampled.usage.prompt_tokens, one.usage.prompt_tokens)
        # Choice i samples with seed + i: choice 0 is the single request's sample.
        self.assertEqual(sampled.choices[0].text, one.choices[0].text)
        self.assertGreater(len({c.text for c in sampled.choices}), 1)
        stream = self.client.chat.completions.create(
            model=self.model, messages=[{"role": "user", "content": "Say hi."}], max_tokens=8,
            temperature=0, n=2, stream=True, stream_options={"include_usage": True})
        text = {0: "", 1: ""}
        finished = set()
        for chunk in stream:
            for choice in chunk.choices:
                text[choice.index] += choice.delta.content or ""
                if choice.finish_reason:
                    finished.add(choice.index)
        self.assertEqual(finished, {0, 1})
        self.assertEqual(text[0], text[1])  # greedy: the same reply twice
        self.assertTrue(text[0])
        ct.wait_until_nothing_reserved(self.router, [self.worker])

    def test_a_batch_of_prompts_answers_each(self):
        prompts = ["The sky is", "Two plus two is", "Bread is made from"]
        singles = [self.client.completions.create(model=self.model, prompt=p, max_tokens=6,
                                                  temperature=0) for p in prompts]
        ids = list(self.stub.Tokenize(self.pb.TokenizeRequest(
            text=prompts[1], add_special_tokens=True, parse_special_tokens=True), timeout=5).ids)
        batch = self.client.completions.create(model=self.model,
                                               prompt=[prompts[0], ids, prompts[2]],
                                               max_tokens=6, temperature=0, n=2)
        self.assertEqual([c.index for c in batch.choices], list(range(6)))
        for k, choice in enumerate(batch.choices):
            self.assertEqual(choice.text, singles[k // 2].choices[0].text, k)
        self.assertEqual(batch.usage.prompt_tokens, sum(s.usage.prompt_tokens for s in singles))
        self.assertEqual(batch.usage.completion_tokens,
                         2 * sum(s.usage.completion_tokens for s in singles))
        # As large a batch as evaluation harnesses send (lm-eval's batch_size), 256 at most.
        many = self.client.completions.create(model=self.model, prompt=prompts * 43,
                                              max_tokens=6, temperature=0)
        self.assertEqual([c.text for c in many.choices],
                         [s.choices[0].text for s in singles] * 43)

    def test_request_ids_are_echoed(self):
        status, headers, text = self.raw("POST", "/v1/completions",
                                         {"prompt": "Hello", "max_tokens": 2},
                                         {"X-Request-Id": "client-7"})
        self.assertEqual(status, 200, text)
        self.assertEqual(headers.get("X-Request-Id"), "client-7")
        self.assertEqual(json.loads(text)["id"], "cmpl-client-7")
        # Without one the server names the request, the same way in the header and the id;
        # several choices too.
        status, headers, text = self.raw("POST", "/v1/chat/completions",
                                         {"messages": [{"role": "user", "content": "Hi"}],
                                          "max_tokens": 2, "n": 2})
        self.assertEqual(status, 200, text)
        self.assertTrue(headers.get("X-Request-Id"))
        self.assertEqual(json.loads(text)["id"], "chatcmpl-" + headers["X-Request-Id"])
        # The longest id still leaves room for a choice's suffix; longer is the client's to fix.
        for length, expected in ((124, 200), (125, 400)):
            status, headers, text = self.raw("POST", "/v1/completions",
                                             {"prompt": "Hello", "max_tokens": 2, "n": 16},
                                             {"X-Request-Id": "r" * length})
            self.assertEqual(status, expected, text)
            if expected == 400:
                self.assertEqual(json.loads(text)["error"]["param"], "x-request-id")
            else:
                self.assertEqual(len(json.loads(text)["choices"]), 16)

    def test_a_client_hanging_up_mid_stream_frees_its_blocks(self):
        connection = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=60)
        connection.request("POST", "/v1/completions", body=json.dumps(
            {"prompt": "Tell me a long story.", "max_tokens": 200, "ignore_eos": True,
             "stream": True}), headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        self.assertEqual(response.status, 200)
        self.assertEqual(response.getheader("Content-Type"), "text/event-stream")
        first = response.fp.readline()  # the first event has arrived: the request is decoding
        self.assertTrue(first.startswith(b"data: ") or first.strip().isalnum(), first)
        connection.sock.close()
        connection.close()
        ct.wait_until_nothing_reserved(self.router, [self.worker], seconds=30)
        ct.wait_for_metric(self.router.ready["metrics_port"], "cleave_http_requests_total", 1,
                           path="/v1/completions", code="499")

    def test_a_client_hanging_up_before_a_whole_response_frees_its_blocks(self):
        # Not streamed, nothing is written until the end: the router notices the closed
        # connection itself and cancels the request long before its 2000 tokens are done.
        port = self.router.ready["metrics_port"]
        def hung_up():
            try:
                return ct.metric(port, "cleave_http_requests_total",
                                 path="/v1/chat/completions", code="499")
            except AssertionError:  # none yet
                return 0
        before = hung_up()
        connection = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=60)
        connection.request("POST", "/v1/chat/completions", body=json.dumps(
            {"messages": [{"role": "user", "content": "Tell me a long story."}],
             "max_tokens": 2000, "ignore_eos": True}),
            headers={"Content-Type": "application/json"})
        deadline = time.monotonic() + 30
        while ct.metric(port, "cleave_router_admitted_requests") < 1:
            self.assertLess(time.monotonic(), deadline, "the request was never admitted")
            time.sleep(0.05)
        time.sleep(0.3)  # decoding
        connection.sock.close()
        connection.close()
        closed = time.monotonic()
        # Long before the 2000 tokens would have ended (a minute and more).
        ct.wait_until_nothing_reserved(self.router, [self.worker], seconds=15)
        print(f"\nblocks freed {time.monotonic() - closed:.2f} s after the client left")
        ct.wait_for_metric(port, "cleave_http_requests_total", before + 1,
                           path="/v1/chat/completions", code="499")
        self.assertEqual(hung_up(), before + 1)
        # A client that only closes its sending side counts as gone too (as it does for
        # vLLM's server); it is sent nothing more, not an error in place of its answer.
        body = json.dumps({"messages": [{"role": "user", "content": "Tell me a long story."}],
                           "max_tokens": 2000, "ignore_eos": True}).encode()
        with socket.create_connection(("127.0.0.1", self.http_port), timeout=30) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Type: application/json\r\nContent-Length: "
                      + str(len(body)).encode() + b"\r\n\r\n" + body)
            s.shutdown(socket.SHUT_WR)
            self.assertEqual(s.recv(4096), b"")  # closed within seconds, nothing written
        ct.wait_until_nothing_reserved(self.router, [self.worker], seconds=5)
        self.assertEqual(hung_up(), before + 2)

    def test_the_api_port_serves_the_metrics_too(self):
        # GET /metrics on the HTTP port, where vLLM's dashboards scrape: the metrics port's
        # families, in Prometheus's text format.
        self.assertEqual(self.raw("GET", "/health")[0], 200)  # an HTTP request counted
        status, headers, text = self.raw("GET", "/metrics")
        self.assertEqual(status, 200, text)
        self.assertTrue(headers["Content-Type"].startswith("text/plain"), headers)
        _, other = ct.http_get(self.router.ready["metrics_port"])
        families = [set(re.findall(r"^# TYPE (cleave_\S+)", t, re.M)) for t in (text, other)]
        self.assertIn("cleave_router_admitted_requests", families[0])
        self.assertEqual(families[0], families[1])

    def test_many_streams_at_once_all_finish(self):
        def one(i):
            stream = self.client.completions.create(
                model=self.model, prompt=f"Story number {i}:", max_tokens=10, temperature=0.8,
                seed=i, stream=True, extra_body={"ignore_eos": True})
            chunks = list(stream)
            return sum(1 for c in chunks if c.choices and c.choices[0].text is not None), \
                chunks[-1].choices[0].finish_reason
        with concurrent.futures.ThreadPoolExecutor(2 * TARGET) as pool:
            results = list(pool.map(one, range(2 * TARGET)))
        for count, finish in results:
            self.assertEqual(finish, "length")
            self.assertGreaterEqual(count, 1)
        ct.wait_until_nothing_reserved(self.router, [self.worker])
        ct.wait_for_metric(self.router.ready["metrics_port"], "cleave_http_requests_total",
                           2 * TARGET, path="/v1/completions", code="200")
        # docs/metrics.md lists what such a router exports, no more and no less.
        from deploy_files_test import documented_metrics
        documented = documented_metrics()
        _, body = ct.http_get(self.router.ready["metrics_port"])
        exported = set(re.findall(r"^# TYPE (cleave_[a-z0-9_]+)", body, re.M))
        self.assertEqual(exported - documented["Every process"],
                         documented["cleave-router"] | documented["cleave-router --http-listen"])

    def test_a_reasoning_parser_splits_replies(self):
        # With deepseek_r1 a reply starts inside the reasoning block; SmolLM2 never closes
        # it, so its whole reply is reasoning: the same text the plain router answers.
        messages = [{"role": "system", "content": "Answer in one sentence."},
                    {"role": "user", "content": "What is the capital of France?"}]
        plain = self.client.chat.completions.create(model=self.model, messages=messages,
                                                    max_tokens=16, temperature=0)
        router = ct.Process([ct.binary("cleave-router"), "--listen=127.0.0.1:0",
                             "--metrics-port=0", f"--model={MODEL}", "--http-listen=127.0.0.1:0",
                             "--reasoning-parser=deepseek_r1", f"--served-model-name={self.model}"])
        worker = None
        try:
            worker = ct.Process([ct.binary("cleave-worker"), f"--model={MODEL}",
                                 f"--router=127.0.0.1:{router.ready['grpc_port']}",
                                 "--listen=127.0.0.1:0", "--metrics-port=0",
                                 "--target-concurrency=2", "--planned-seq-len=256", "--threads=1"])
            client = sdk_client(f"http://127.0.0.1:{router.ready['http_port']}/v1")
            deadline = time.monotonic() + 60
            while not client.models.list().data:
                self.assertLess(time.monotonic(), deadline, worker.log())
                time.sleep(0.05)
            split = client.chat.completions.create(model=self.model, messages=messages,
                                                   max_tokens=16, temperature=0)
            message = split.choices[0].message
            self.assertIsNone(message.content)
            self.assertEqual(message.model_extra["reasoning_content"],
                             plain.choices[0].message.content)
            stream = client.chat.completions.create(model=self.model, messages=messages,
                                                    max_tokens=16, temperature=0, stream=True)
            reasoning = ""
            for chunk in stream:
                for choice in chunk.choices:
                    self.assertIsNone(choice.delta.content or None)
                    reasoning += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            self.assertEqual(reasoning, plain.choices[0].message.content)
            # A JSON-object reply is the object, not reasoning.
            constrained = client.chat.completions.create(
                model=self.model, messages=messages, max_tokens=120, temperature=0,
                response_format={"type": "json_object"})
            self.assertIsInstance(json.loads(constrained.choices[0].message.content), dict)
            self.assertIsNone(constrained.choices[0].message.model_extra.get("reasoning_content"))
            # Completions are never split.
            done = client.completions.create(model=self.model, prompt="Paris is", max_tokens=4,
                                             temperature=0)
            self.assertTrue(done.choices[0].text)
        finally:
            if worker is not None:
                self.assertEqual(worker.stop(), 0)
            self.assertEqual(router.stop(), 0)
        code, _, err = ct.run([ct.binary("cleave-router"), "--listen=127.0.0.1:0",
                               "--metrics-port=0", "--reasoning-parser=hermes",
                               "--http-listen=127.0.0.1:0"])
        self.assertEqual(code, 2)
        self.assertIn("qwen3, deepseek_r1, glm45 or openai_gptoss", err)

    def test_bench_measures_the_http_api_as_the_grpc_one(self):
        # The same workload through both APIs: every request succeeds with exactly its
        # output length, and the same prompt tokens are counted.
        work = tempfile.mkdtemp(prefix="cleave-bench-http-")
        summaries = {}
        for name, target in (("grpc", f"--router={self.address}"),
                             ("http", f"--openai=http://127.0.0.1:{self.http_port}/v1")):
            report = os.path.join(work, f"{name}.json")
            code, out, err = ct.run([ct.binary("cleave"), "bench", target, "--requests=6",
                                     "--warmup=0", "--concurrency=3", "--prompt-len=24",
                                     "--output-len=5", f"--json={report}"], timeout=120)
            self.assertEqual(code, 0, out + err)
            with open(report) as f:
                summaries[name] = json.load(f)["points"][0]["summary"]
        for summary in summaries.values():
            self.assertEqual((summary["requests"], summary["failed"]), (6, 0), summary)
            self.assertEqual(summary["output_tokens"], 6 * 5, summary)
        self.assertEqual(summaries["http"]["prompt_tokens"], summaries["grpc"]["prompt_tokens"])
        code, _, err = ct.run([ct.binary("cleave"), "bench", "--openai=http://127.0.0.1:1",
                               "--requests=1"])
        self.assertEqual(code, 1)
        self.assertIn("cannot connect", err)

    def test_api_keys_travel_in_the_authorization_header(self):
        with tempfile.TemporaryDirectory() as folder:
            keys = os.path.join(folder, "keys")
            with open(keys, "w") as f:
                f.write("team-a secret-key-0123456789\n")
            router = ct.Process([ct.binary("cleave-router"), "--listen=127.0.0.1:0",
                                 "--metrics-port=0", f"--api-keys={keys}",
                                 "--http-listen=127.0.0.1:0"])
            try:
                port = router.ready["http_port"]
                base = f"http://127.0.0.1:{port}/v1"
                with self.assertRaises(openai.AuthenticationError):
                    openai.OpenAI(base_url=base, api_key="wrong", max_retries=0).models.list()
                models = openai.OpenAI(base_url=base, api_key="secret-key-0123456789",
                                       max_retries=0).models.list()
                self.assertEqual(models.data, [])  # no worker registered with this router
                status, _ = ct.http_get(port, "/health")
                self.assertEqual(status, 200)
            finally:
                self.assertEqual(router.stop(), 0)


if __name__ == "__main__":
    unittest.main()
