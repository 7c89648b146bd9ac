"""End to end: Anthropic's Messages API (/v1/messages) on the router's HTTP port, in front of a
cleave-worker on the SmolLM2 model (real processes on loopback, API keys on), driven by
Anthropic's own Python SDK (pinned in tests/integration/client_requirements.txt) and checked
against the OpenAI-compatible chat API of the same router:

  * greedy text, whole and streamed (the SDK's stream helper), equals the chat completion of
    the same conversation; usage and stop_reason agree; count_tokens counts the prompt;
  * a forced tool call comes back as a tool_use block whose input is an instance of the
    tool's input_schema; its tool_result, sent back, is answered as chat answers it;
  * the key travels as x-api-key; a wrong one, a missing max_tokens and an image block are
    refused in Anthropic's error shape.
"""
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import cleave_testing as ct  # noqa: E402

sys.path.insert(0, os.path.join(ct.SOURCE_DIR, ".tools", "python"))
try:
    import anthropic  # noqa: E402
    import openai  # noqa: E402
except ImportError as e:  # The suite installs them; a missing SDK is a setup error, not a skip.
    raise SystemExit(f"a client SDK is missing ({e}); run scripts/install-deps.sh")

MODEL = os.path.join(ct.SOURCE_DIR, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
KEY = "messages-test-key"
GREEDY = {"temperature": 0}  # the SDK has no sampling arguments: sent as extra fields
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}}


@unittest.skipUnless(os.path.exists(MODEL), f"{MODEL} missing; run scripts/install-deps.sh")
class MessagesApiTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import grpc
        cls.keys = tempfile.NamedTemporaryFile("w", suffix=".keys")
        cls.keys.write(f"tests {KEY}\n")
        cls.keys.flush()
        cls.router = ct.Process([ct.binary("cleave-router"), "--listen=127.0.0.1:0",
                                 "--metrics-port=0", f"--model={MODEL}",
                                 "--http-listen=127.0.0.1:0", "--tool-call-parser=hermes",
                                 f"--api-keys={cls.keys.name}"])
        address = f"127.0.0.1:{cls.router.ready['grpc_port']}"
        cls.worker = ct.Process([ct.binary("cleave-worker"), f"--model={MODEL}",
                                 f"--router={address}", "--listen=127.0.0.1:0",
                                 "--metrics-port=0", "--target-concurrency=4",
                                 "--planned-seq-len=256", "--threads=2"])
        cls.channel = grpc.insecure_channel(address)
        stub = ct.stubs()["generation_grpc"].GenerationStub(cls.channel)
        ct.wait_for_workers(stub, 1, metadata=(("authorization", f"Bearer {KEY}"),))
        base = f"http://127.0.0.1:{cls.router.ready['http_port']}"
        cls.client = anthropic.Anthropic(base_url=base, api_key=KEY, max_retries=0, timeout=120)
        cls.chat = openai.OpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0, timeout=120)
        cls.model = cls.chat.models.list().data[0].id

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        codes = (cls.worker.stop(), cls.router.stop())
        cls.keys.close()
        assert codes == (0, 0), codes

    def as_chat(self, messages, **kwargs):
        return self.chat.chat.completions.create(model=self.model, temperature=0, **kwargs,
                                                 messages=messages)

    def test_text_whole_and_streamed_equals_chat(self):
        system, question = "Answer in one sentence.", "What is the capital of France?"
        reply = self.client.messages.create(model=self.model, max_tokens=24, extra_body=GREEDY,
                                            system=system,
                                            messages=[{"role": "user", "content": question}])
        chat = self.as_chat([{"role": "system", "content": system},
                             {"role": "user", "content": question}], max_tokens=24)
        self.assertEqual(reply.type, "message")
        self.assertEqual(reply.role, "assistant")
        self.assertEqual([b.type for b in reply.content], ["text"])
        self.assertEqual(reply.content[0].text, chat.choices[0].message.content)
        self.assertEqual(reply.stop_reason,
                         "end_turn" if chat.choices[0].finish_reason == "stop" else "max_tokens")
        self.assertEqual(reply.usage.input_tokens + reply.usage.cache_read_input_tokens,
                         chat.usage.prompt_tokens)
        self.assertEqual(reply.usage.output_tokens, chat.usage.completion_tokens)
        counted = self.client.messages.count_tokens(
            model=self.model, system=system, messages=[{"role": "user", "content": question}])
        self.assertEqual(counted.input_tokens, chat.usage.prompt_tokens)

        with self.client.messages.stream(model=self.model, max_tokens=24, extra_body=GREEDY,
                                         system=system,
                                         messages=[{"role": "user", "content": question}]) as s:
            text = "".join(s.text_stream)
            final = s.get_final_message()
        self.assertEqual(text, reply.content[0].text)
        self.assertEqual(final.content[0].text, text)
        self.assertEqual(final.stop_reason, reply.stop_reason)
        self.assertEqual(final.usage.output_tokens, reply.usage.output_tokens)

        short = self.client.messages.create(model=self.model, max_tokens=3, extra_body=GREEDY,
                                            messages=[{"role": "user", "content": question}])
        self.assertEqual(short.stop_reason, "max_tokens")
        self.assertEqual(short.usage.output_tokens, 3)
        whole = reply.content[0].text
        stop = whole[len(whole) // 2:len(whole) // 2 + 3]  # met by the greedy reply
        stopped = self.client.messages.create(
            model=self.model, max_tokens=24, extra_body=GREEDY, stop_sequences=[stop],
            system=system, messages=[{"role": "user", "content": question}])
        self.assertEqual((stopped.stop_reason, stopped.stop_sequence), ("stop_sequence", stop))
        self.assertEqual(stopped.content[0].text, whole[:whole.index(stop)])

    def test_a_forced_tool_call_and_its_result(self):
        import jsonschema
        ask = {"role": "user", "content": "What is the weather in Paris?"}
        reply = self.client.messages.create(
            model=self.model, max_tokens=48, extra_body=GREEDY, tools=[WEATHER],
            tool_choice={"type": "tool", "name": "get_weather"}, messages=[ask])
        uses = [b for b in reply.content if b.type == "tool_use"]
        self.assertEqual(len(uses), 1, reply.content)
        self.assertEqual(uses[0].name, "get_weather")
        jsonschema.validate(uses[0].input, WEATHER["input_schema"])
        self.assertEqual(reply.stop_reason, "tool_use")

        answered = self.client.messages.create(
            model=self.model, max_tokens=32, extra_body=GREEDY, tools=[WEATHER], messages=[
                ask, {"role": "assistant", "content": [b.model_dump() for b in reply.content]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                              "content": "Sunny, 24 C"}]}])
        chat = self.as_chat([ask, {"role": "assistant", "content": "", "tool_calls": [
            {"id": uses[0].id, "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps(uses[0].input)}}]},
            {"role": "tool", "tool_call_id": uses[0].id, "content": "Sunny, 24 C"}],
            max_tokens=32, tools=[{"type": "function", "function": {
                "name": WEATHER["name"], "description": WEATHER["description"],
                "parameters": WEATHER["input_schema"]}}])
        text = "".join(b.text for b in answered.content if b.type == "text")
        self.assertEqual(text, chat.choices[0].message.content or "")

        with self.client.messages.stream(
                model=self.model, max_tokens=48, extra_body=GREEDY, tools=[WEATHER],
                tool_choice={"type": "any"}, messages=[ask]) as s:
            final = s.get_final_message()
        [use] = [b for b in final.content if b.type == "tool_use"]
        jsonschema.validate(use.input, WEATHER["input_schema"])

    def test_structured_output_follows_its_schema(self):
        import jsonschema
        schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                                   "age": {"type": "integer", "minimum": 0}},
                  "required": ["name", "age"], "additionalProperties": False}
        reply = self.client.messages.create(
            model=self.model, max_tokens=60, extra_body=GREEDY,
            output_config={"format": {"type": "json_schema", "schema": schema}},
            messages=[{"role": "user", "content": "Describe a cat as JSON."}])
        self.assertEqual(reply.stop_reason, "end_turn", reply.content)
        jsonschema.validate(json.loads(reply.content[0].text), schema)

    def test_refusals_are_in_anthropics_shape(self):
        wrong = anthropic.Anthropic(base_url=str(self.client.base_url), api_key="wrong",
                                    max_retries=0)
        with self.assertRaises(anthropic.AuthenticationError) as caught:
            wrong.messages.create(model=self.model, max_tokens=4,
                                  messages=[{"role": "user", "content": "x"}])
        self.assertEqual(caught.exception.body["error"]["type"], "authentication_error")
        for body, fragment in (
                ({"messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
                ({"max_tokens": 4, "messages": [{"role": "user", "content": [
                    {"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}]}]},
                 "messages[0].content[0].type"),
                ({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
                  "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
                 "tools[0].type")):
            with self.assertRaises(anthropic.BadRequestError) as caught:
                self.client.post("/v1/messages", cast_to=object, body=body)
            self.assertEqual(caught.exception.body["type"], "error")
            self.assertEqual(caught.exception.body["error"]["type"], "invalid_request_error")
            self.assertIn(fragment, caught.exception.body["error"]["message"])


if __name__ == "__main__":
    unittest.main()
