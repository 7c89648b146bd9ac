"""End to end: LoRA adapters served next to the base model (cleave-worker --lora-modules),
SmolLM2 (Q4_1) with two random adapters in PEFT's format written by this test.

  * Disaggregated (router + prefill + decode workers): requests naming an adapter as their
    model, the base model, and the other adapter, all at once, decode the offline engine's
    greedy tokens with that adapter (cleave generate --lora); again with the prompts cached
    on both workers (each adapter's blocks apart), where the decode worker is sent only what
    its cache lacks for that adapter.
  * ListModels and GET /v1/models list the adapters with their parent; an OpenAI completion
    naming an adapter gets the gRPC reply; an unknown model is NOT_FOUND / 404 naming the
    served ones.
  * A worker whose adapters differ from the others' is refused by the router; a worker given
    an adapter that does not fit the model stops with a message naming the tensor.
"""
import concurrent.futures
import http.client
import json
import os
import random
import struct
import sys
import tempfile
import time
import unittest

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import cleave_testing as ct  # noqa: E402
from serving_test import MODEL, WORDS, metric  # noqa: E402

# SmolLM2-135M's shapes.
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, LAYERS = 576, 9, 3, 64, 1536, 30
SHAPES = {  # module: (out, in)
    "q_proj": (HEADS * HEAD_DIM, HIDDEN), "k_proj": (KV_HEADS * HEAD_DIM, HIDDEN),
    "v_proj": (KV_HEADS * HEAD_DIM, HIDDEN), "o_proj": (HIDDEN, HEADS * HEAD_DIM),
    "gate_proj": (FFN, HIDDEN), "up_proj": (FFN, HIDDEN), "down_proj": (HIDDEN, FFN),
}


def bf16(values):
    """Little-endian bfloat16 bytes (rounded to nearest even) of Python floats."""
    out = bytearray()
    for v in values:
        bits = struct.unpack("<I", struct.pack("<f", v))[0]
        bits += 0x7FFF + ((bits >> 16) & 1)
        out += struct.pack("<H", (bits >> 16) & 0xFFFF)
    return bytes(out)


def write_adapter(folder, modules, r, alpha, seed, rslora=False):
    """A PEFT LoRA folder for SmolLM2 with random A ~ N(0, 1/in) and B ~ N(0, 0.3^2 / r)
    (an update comparable to the weights), stored bf16."""
    rng = random.Random(seed)
    header, blobs, offset = {}, [], 0
    for layer in range(LAYERS):
        for module in modules:
            out, inp = SHAPES[module]
            part = "mlp" if module in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            prefix = f"base_model.model.model.layers.{layer}.{part}.{module}"
            for name, shape, std in (("lora_A", [r, inp], inp ** -0.5), ("lora_B", [out, r], 0.3 / r ** 0.5)):
                data = bf16(rng.gauss(0, std) for _ in range(shape[0] * shape[1]))
                header[f"{prefix}.{name}.weight"] = {"dtype": "BF16", "shape": shape,
                                                     "data_offsets": [offset, offset + len(data)]}
                blobs.append(data)
                offset += len(data)
    os.makedirs(folder, exist_ok=True)
    encoded = json.dumps(header).encode()
    with open(os.path.join(folder, "adapter_model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(encoded)) + encoded + b"".join(blobs))
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": r, "lora_alpha": alpha, "use_rslora": rslora,
                   "target_modules": modules, "bias": "none", "use_dora": False,
                   "base_model_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct"}, f)


_REFERENCE = {}


def offline(prompt, lora, max_tokens=10):
    """Greedy token ids of the offline engine with the adapter folder `lora` (None: none)."""
    key = (prompt, lora, max_tokens)
    if key not in _REFERENCE:
        code, out, err = ct.run([ct.binary("cleave"), "generate", f"--model={MODEL}", "--no-chat",
                                 "--print-ids", f"--max-tokens={max_tokens}", "--threads=2",
                                 *([f"--lora={lora}"] if lora else []), prompt], timeout=120)
        assert code == 0, err
        _REFERENCE[key] = [int(t) for t in out.split()]
    return _REFERENCE[key]


@unittest.skipUnless(os.path.exists(MODEL), f"{MODEL} missing; run scripts/install-deps.sh")
class LoraTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.alpha = os.path.join(cls.tmp.name, "alpha")
        cls.beta = os.path.join(cls.tmp.name, "beta")
        write_adapter(cls.alpha, list(SHAPES), r=8, alpha=16, seed=1)
        write_adapter(cls.beta, ["q_proj", "v_proj"], r=4, alpha=8, seed=2, rslora=True)
        cls.modules = f"--lora-modules=alpha={cls.alpha},beta={cls.beta}"

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_adapters_decode_the_offline_engines_tokens_disaggregated(self):
        pb = ct.stubs()["generation_pb2"]
        router = ct.Process([ct.binary("cleave-router"), "--listen=127.0.0.1:0",
                             "--metrics-port=0", f"--model={MODEL}",
                             "--http-listen=127.0.0.1:0"])
        address = f"127.0.0.1:{router.ready['grpc_port']}"
        common = [f"--model={MODEL}", f"--router={address}", "--listen=127.0.0.1:0",
                  "--metrics-port=0", "--target-concurrency=8", "--planned-seq-len=128",
                  "--threads=1", self.modules]
        workers = [ct.Process([ct.binary("cleave-worker"), f"--role={role}", *common])
                   for role in ("prefill", "decode")]
        channel = grpc.insecure_channel(address)
        rng = random.Random(21)
        # Two full blocks of prompt at least, so that a repeat finds cached blocks.
        prompts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 60)))
                   for _ in range(3)]
        folders = {"": None, "alpha": self.alpha, "beta": self.beta}
        try:
            stub = ct.stubs()["generation_grpc"].GenerationStub(channel)
            ct.wait_for_workers(stub, 2)

            def generate(job):
                prompt, model = job
                request = pb.GenerateRequest(model=model, text=prompt, add_special_tokens=True,
                                             sampling=pb.SamplingParams(temperature=0),
                                             stopping=pb.StoppingCriteria(max_new_tokens=10))
                ids, final, first = [], None, None
                for message in stub.Generate(request, timeout=120):
                    first = message if first is None else first
                    ids += list(message.token_ids)
                    if message.HasField("final"):
                        final = message.final
                # The first message already says what the cache supplied.
                self.assertEqual(first.cached_prompt_tokens, final.usage.cached_prompt_tokens)
                return ids, final.usage.cached_prompt_tokens

            jobs = [(p, m) for p in prompts for m in folders]
            decode_port = workers[1].ready["metrics_port"]
            for round_ in ("fresh", "cached"):
                sent_before = metric(decode_port, "cleave_worker_kv_reserve_cached_blocks_total")
                with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
                    results = list(pool.map(generate, jobs))
                for (prompt, model), (ids, cached) in zip(jobs, results):
                    self.assertEqual(ids, offline(prompt, folders[model]), (round_, model, prompt))
                    if round_ == "cached":
                        self.assertGreaterEqual(cached, 32, (model, prompt))
                if round_ == "cached":  # the decode worker held every prompt's blocks
                    self.assertGreater(
                        metric(decode_port, "cleave_worker_kv_reserve_cached_blocks_total"),
                        sent_before)
            differing = sum(offline(p, self.alpha) != offline(p, None) for p in prompts)
            self.assertGreaterEqual(differing, 2)
            self.assertTrue(any(offline(p, self.beta) != offline(p, None) for p in prompts))
            print(f"\nLoRA: {differing} of {len(prompts)} prompts' greedy replies differ "
                  "with adapter alpha; every reply equals the offline engine's")

            # The models listed, and an unknown one.
            listed = stub.ListModels(pb.ListModelsRequest(), timeout=10).models
            self.assertEqual([(m.id, m.parent) for m in listed],
                             [("SmolLM2-135M-Instruct.Q4_1", ""),
                              ("alpha", "SmolLM2-135M-Instruct.Q4_1"),
                              ("beta", "SmolLM2-135M-Instruct.Q4_1")])
            with self.assertRaises(grpc.RpcError) as refused:
                list(stub.Generate(pb.GenerateRequest(model="gamma", text="hi"), timeout=30))
            self.assertEqual(refused.exception.code(), grpc.StatusCode.NOT_FOUND)
            self.assertIn("'alpha', 'beta'", refused.exception.details())

            # The HTTP API: the adapters in /v1/models, a completion naming one.
            http_port = router.ready["http_port"]

            def post(path, body):
                connection = http.client.HTTPConnection("127.0.0.1", http_port, timeout=120)
                connection.request("POST", path, json.dumps(body),
                                   {"Content-Type": "application/json"})
                try:
                    response = connection.getresponse()
                    return response.status, json.loads(response.read())
                finally:
                    connection.close()

            models = json.loads(ct.http_get(http_port, "/v1/models")[1])["data"]
            self.assertEqual([(m["id"], m["parent"]) for m in models],
                             [("SmolLM2-135M-Instruct.Q4_1", None),
                              ("alpha", "SmolLM2-135M-Instruct.Q4_1"),
                              ("beta", "SmolLM2-135M-Instruct.Q4_1")])
            status, body = post("/v1/completions", {"model": "alpha", "prompt": prompts[0],
                                                    "max_tokens": 10, "temperature": 0,
                                                    "logprobs": 0})
            self.assertEqual(status, 200, body)
            self.assertEqual(body["model"], "alpha")
            code, out, err = ct.run([ct.binary("cleave"), "generate", f"--router={address}",
                                     "--no-chat", "--max-tokens=10", "--lora=alpha", prompts[0]],
                                    timeout=120)
            self.assertEqual(code, 0, err)
            self.assertEqual(body["choices"][0]["text"], out.rstrip("\n"))
            status, body = post("/v1/completions", {"model": "gamma", "prompt": "hi"})
            self.assertEqual(status, 404, body)
            self.assertIn("alpha", body["error"]["message"])
        finally:
            channel.close()
            codes = [w.stop() for w in workers] + [router.stop()]
            self.assertEqual(codes, [0] * len(codes))

    def test_workers_must_serve_the_same_adapters_and_fitting_ones(self):
        router = ct.Process([ct.binary("cleave-router"), "--listen=127.0.0.1:0",
                             "--metrics-port=0"])
        address = f"127.0.0.1:{router.ready['grpc_port']}"
        common = [f"--model={MODEL}", f"--router={address}", "--listen=127.0.0.1:0",
                  "--metrics-port=0", "--target-concurrency=2", "--planned-seq-len=64",
                  "--threads=1"]
        first = ct.Process([ct.binary("cleave-worker"), "--role=both", *common, self.modules])
        other = None
        channel = grpc.insecure_channel(address)
        try:
            stub = ct.stubs()["generation_grpc"].GenerationStub(channel)
            ct.wait_for_workers(stub, 1)
            other = ct.Process([ct.binary("cleave-worker"), "--role=both", *common,
                                f"--lora-modules=alpha={self.alpha}"])
            deadline = time.monotonic() + 60
            while "the router refused this worker" not in other.log():
                self.assertLess(time.monotonic(), deadline, other.log())
                time.sleep(0.1)
            self.assertIn("differ from worker", other.log())
            self.assertIn("--lora-modules", other.log())
        finally:
            channel.close()
            if other is not None:
                other.stop()
            self.assertEqual([first.stop(), router.stop()], [0, 0])
        # An adapter of another model's shapes: the worker names the tensor and stops.
        wrong = os.path.join(self.tmp.name, "wrong")
        write_adapter(wrong, ["q_proj"], r=4, alpha=8, seed=3)
        with open(os.path.join(wrong, "adapter_model.safetensors"), "rb") as f:
            size = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(size))
            data = f.read()
        header["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]["shape"] = [288, 8]
        encoded = json.dumps(header).encode()
        with open(os.path.join(wrong, "adapter_model.safetensors"), "wb") as f:
            f.write(struct.pack("<Q", len(encoded)) + encoded + data)
        code, _, err = ct.run([ct.binary("cleave-worker"), "--role=both", *common,
                               f"--lora-modules=wrong={wrong}"], timeout=60)
        self.assertNotEqual(code, 0)
        self.assertIn("q_proj.lora_B.weight has shape [288, 8], the model needs [576, 4]", err)


if __name__ == "__main__":
    unittest.main()
