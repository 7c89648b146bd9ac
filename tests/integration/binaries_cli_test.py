"""Command-line behaviour of every binary: help, version, and bad input that must end in a
one-line error and exit status 2 — never a stack trace or a hang."""
import os
import tempfile
import unittest

import cleave_testing as ct

BINARIES = ["cleave-router", "cleave-worker", "cleave"]


class BinariesCliTest(unittest.TestCase):
    def assert_usage_error(self, args, expected):
        code, out, err = ct.run(args, timeout=60)
        self.assertEqual(code, 2, f"{args}: stdout={out!r} stderr={err!r}")
        self.assertIn(expected, err)
        self.assertNotIn("terminate called", err)
        self.assertNotIn("Aborted", err)
        # The error itself is one line; a second line may point at --help.
        self.assertLessEqual(len(err.strip().splitlines()), 2, err)

    def test_help_and_version(self):
        for name in BINARIES:
            code, out, _ = ct.run([ct.binary(name), "--help"])
            self.assertEqual(code, 0, name)
            self.assertIn("Usage:", out)
            code, out, _ = ct.run([ct.binary(name), "--version"])
            self.assertEqual(code, 0, name)
            self.assertRegex(out, r"\d+\.\d+\.\d+ \(commit \w+\)")

    def test_unknown_flags_exit_two(self):
        self.assert_usage_error([ct.binary("cleave-router"), "--lisen=1"],
                                "unknown flag --lisen (did you mean --listen?)")
        self.assert_usage_error([ct.binary("cleave-worker"), "--bogus"], "unknown flag --bogus")
        self.assert_usage_error([ct.binary("cleave"), "info", "--bogus"], "unknown flag --bogus")
        self.assert_usage_error([ct.binary("cleave"), "frobnicate"], "unknown command")
        self.assert_usage_error([ct.binary("cleave-router"), "--metrics-port=abc"],
                                "invalid value 'abc' for --metrics-port")

    def test_router_port_in_use(self):
        taken = ct.listening_socket()
        port = taken.getsockname()[1]
        try:
            self.assert_usage_error([ct.binary("cleave-router"), f"--listen=127.0.0.1:{port}",
                                     "--metrics-port=0"], f"cannot listen on 127.0.0.1:{port}")
            self.assert_usage_error([ct.binary("cleave-router"), "--listen=127.0.0.1:0",
                                     f"--metrics-port={port}"], "--metrics-port")
        finally:
            taken.close()

    def test_router_bad_address_and_unwritable_ready_file(self):
        self.assert_usage_error([ct.binary("cleave-router"), "--listen=not-an-address",
                                 "--metrics-port=0"], "cannot listen on not-an-address")
        self.assert_usage_error([ct.binary("cleave-router"), "--listen=127.0.0.1:0",
                                 "--metrics-port=0", "--ready-file=/nonexistent/dir/ready"],
                                "/nonexistent/dir/ready")

    def test_worker_validates_before_doing_anything(self):
        self.assert_usage_error([ct.binary("cleave-worker"), "--model=/nonexistent.gguf"],
                                "/nonexistent.gguf")
        self.assert_usage_error([ct.binary("cleave-worker"), "--role=router", "--model=/"],
                                "--role must be prefill, decode or both")

    def test_a_worker_whose_kv_cannot_hold_its_target_refuses_to_start(self):
        model = os.path.join(ct.SOURCE_DIR, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
        if not os.path.exists(model):
            self.skipTest(f"{model} missing; run scripts/install-deps.sh")
        code, _, err = ct.run([ct.binary("cleave-worker"), "--role=decode", f"--model={model}",
                               "--target-concurrency=64", "--planned-seq-len=2048",
                               "--memory-budget=200MiB", "--threads=1"])
        self.assertEqual(code, 1)
        # 64 x 2048 positions x 30 layers x 3 KV heads x 64 dims x bf16 keys and values.
        for words in ("64 sequences of 2048 tokens need 2880.0 MiB of KV",
                      "after weights (", "workspace (", "Raise --memory-budget to at least"):
            self.assertIn(words, err)

    def test_worker_names_the_file_it_cannot_load(self):
        with tempfile.NamedTemporaryFile(suffix=".gguf") as model:
            code, _, err = ct.run([ct.binary("cleave-worker"), f"--model={model.name}"])
        self.assertEqual(code, 1)
        self.assertIn(model.name, err)
        self.assertIn("truncated", err)

    def test_cli_info_against_a_running_router_and_against_nothing(self):
        router = ct.Process([ct.binary("cleave-router"), "--listen=127.0.0.1:0",
                             "--metrics-port=0"])
        try:
            address = f"127.0.0.1:{router.ready['grpc_port']}"
            code, out, err = ct.run([ct.binary("cleave"), "info", f"--router={address}"])
            self.assertEqual(code, 0, err)
            self.assertIn("workers: 0 registered", out)
        finally:
            self.assertEqual(router.stop(), 0)
        # The router is gone: a clear message, exit 1, within the timeout.
        code, _, err = ct.run([ct.binary("cleave"), "info", f"--router={address}",
                               "--timeout-ms=500"])
        self.assertEqual(code, 1)
        self.assertIn(f"no router answers at {address}", err)

    def test_inspect_reads_the_real_model(self):
        model = os.path.join(ct.SOURCE_DIR, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
        if not os.path.exists(model):
            self.skipTest(f"{model} missing; run scripts/install-deps.sh")
        code, out, err = ct.run([ct.binary("cleave"), "inspect", model])
        self.assertEqual(code, 0, err)
        self.assertIn("architecture: llama", out)
        self.assertIn("layers 30, heads 9 (kv 3), head_dim 64", out)
        self.assertIn("vocab 49152, context 8192", out)
        self.assertIn("blk.0.attn_q.weight", out)
        self.assertIn("total weight bytes: 96576768", out)
        with tempfile.TemporaryDirectory() as folder:
            truncated = os.path.join(folder, "truncated.gguf")
            with open(model, "rb") as src, open(truncated, "wb") as dst:
                dst.write(src.read(2_000_000))
            code, _, err = ct.run([ct.binary("cleave"), "inspect", truncated])
            self.assertEqual(code, 1)
            self.assertIn("truncated.gguf", err)
            self.assertIn("truncated", err)
        code, _, err = ct.run([ct.binary("cleave"), "inspect", "/nonexistent.gguf"])
        self.assertEqual(code, 1)
        self.assertIn("/nonexistent.gguf", err)

    def test_inspect_shows_what_sets_a_family_apart(self):
        """Gemma 3's windows, rotary bases and norms; GLM-4.5's partial rotary; int4 weights; longrope; OLMo 3; Granite."""
        golden = os.path.join(ct.SOURCE_DIR, "tests", "golden", "data", "engine")
        code, out, err = ct.run([ct.binary("cleave"), "inspect", os.path.join(golden, "hf", "gemma3_f32")])
        self.assertEqual(code, 0, err)
        self.assertIn("sliding window 4 on 2 of 3 layers (their rope_theta 10000)", out)
        self.assertIn("norms after attention and the MLP (and before), GELU (tanh) MLP, embeddings x 8", out)
        self.assertIn("final logit soft cap 10", out)
        code, out, err = ct.run([ct.binary("cleave"), "inspect", os.path.join(golden, "gguf", "glm4_moe_f32.gguf")])
        self.assertEqual(code, 0, err)
        self.assertIn("rotary dims: the first 8 of each head", out)
        code, out, err = ct.run([ct.binary("cleave"), "inspect", os.path.join(golden, "hf", "qwen3_moe_int4_ct")])
        self.assertEqual(code, 0, err)
        self.assertIn("quantization int4 groups of 32 (compressed-tensors)", out)
        code, out, err = ct.run([ct.binary("cleave"), "inspect", os.path.join(golden, "gguf", "phi3_longrope_f32.gguf")])
        self.assertEqual(code, 0, err)
        self.assertIn("rope_scaling longrope (factor 8)", out)
        self.assertIn("longrope: original context 4, attention factor 1.58", out)
        code, out, err = ct.run([ct.binary("cleave"), "inspect", os.path.join(golden, "hf", "ministral3_f32")])
        self.assertEqual(code, 0, err)
        self.assertIn("query temperature: 1 + 0.3 ln(1 + floor(position / 8))", out)
        code, out, err = ct.run([ct.binary("cleave"), "inspect", os.path.join(golden, "hf", "smollm3_f32")])
        self.assertEqual(code, 0, err)
        self.assertIn("without rotary embedding (NoPE): 1 of 4 layers", out)
        code, out, err = ct.run([ct.binary("cleave"), "inspect", os.path.join(golden, "hf", "olmo3_f32")])
        self.assertEqual(code, 0, err)
        self.assertIn("qk_norm yes (across all heads)", out)
        self.assertIn("norms after attention and the MLP only, SiLU MLP", out)
        self.assertIn("sliding window 5 on 3 of 4 layers (their rope_theta 500000)", out)
        code, out, err = ct.run([ct.binary("cleave"), "inspect", os.path.join(golden, "hf", "granite_f32")])
        self.assertEqual(code, 0, err)
        self.assertIn("embeddings x 12, block outputs x 0.22 before the residual add, softmax scale 0.15, "
                      "logits / 8", out)

    def test_tokenize_detokenize_and_generate_on_the_real_model(self):
        model = os.path.join(ct.SOURCE_DIR, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
        if not os.path.exists(model):
            self.skipTest(f"{model} missing; run scripts/install-deps.sh")
        cleave = ct.binary("cleave")
        code, out, err = ct.run([cleave, "tokenize", f"--model={model}", "Hello, world"])
        self.assertEqual((code, out.strip()), (0, "19556 28 905"), err)
        code, out, err = ct.run([cleave, "tokenize", "--json", f"--model={model}", "Hello"])
        self.assertEqual(code, 0, err)
        self.assertIn('"piece":"Hello"', out)
        code, out, err = ct.run([cleave, "detokenize", f"--model={model}", "19556", "28", "905"])
        self.assertEqual((code, out), (0, "Hello, world\n"), err)
        # A conversation through the model's chat template: its prompt, then its ids, which
        # are the prompt's with special tokens parsed and none added.
        conversation = ('{"messages": [{"role": "system", "content": "Be brief."}, '
                        '{"role": "user", "content": "Hello"}], "add_generation_prompt": true}')
        code, prompt, err = ct.run([cleave, "tokenize", f"--model={model}", "--chat",
                                    "--show-prompt", conversation])
        self.assertEqual((code, prompt), (0, "<|im_start|>system\nBe brief.<|im_end|>\n"
                                             "<|im_start|>user\nHello<|im_end|>\n"
                                             "<|im_start|>assistant\n"), err)
        code, chat_ids, err = ct.run([cleave, "tokenize", f"--model={model}", "--chat", conversation])
        self.assertEqual(code, 0, err)
        code, text_ids, err = ct.run([cleave, "tokenize", f"--model={model}", "--parse-special",
                                      "--no-add-special", prompt])
        self.assertEqual((chat_ids, len(chat_ids.split()) > 10), (text_ids, True), err)
        self.assert_usage_error([cleave, "tokenize", f"--model={model}", "--chat", "[{}]"],
                                "role")
        self.assert_usage_error([cleave, "detokenize", f"--model={model}", "49152"],
                                "not a token id below the vocabulary size 49152")
        # Greedy decoding is deterministic: the model's answer, streamed, then timings.
        code, out, err = ct.run([cleave, "generate", f"--model={model}", "--max-tokens=12",
                                 "--system=Answer in one sentence.", "What is the capital of France?"], timeout=120)
        self.assertEqual(code, 0, err)
        self.assertIn("Paris", out)
        self.assertRegex(err, r"generated \d+ tokens")
        # Sampling with a seed repeats itself; a stop string ends the text before it.
        sampled = [ct.run([cleave, "generate", f"--model={model}", "--max-tokens=16", "--temperature=0.9",
                           "--seed=7", "Tell me about cats."], timeout=120)[1] for _ in range(2)]
        self.assertEqual(sampled[0], sampled[1])
        code, out, err = ct.run([cleave, "generate", f"--model={model}", "--max-tokens=12", "--stop=Paris",
                                 "--system=Answer in one sentence.", "What is the capital of France?"], timeout=120)
        self.assertEqual(code, 0, err)
        self.assertNotIn("Paris", out)
        self.assertIn("France is", out)

    def test_generate_takes_token_id_prompts(self):
        """--prompt-ids: the same continuation as the text it tokenizes to, and a model without
        a tokenizer generates from ids alone (printing ids)."""
        model = os.path.join(ct.SOURCE_DIR, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
        cleave = ct.binary("cleave")
        if os.path.exists(model):
            code, text_ids, err = ct.run([cleave, "generate", f"--model={model}", "--no-chat",
                                          "--max-tokens=6", "--print-ids", "Hello, world"], timeout=120)
            self.assertEqual(code, 0, err)
            code, id_ids, err = ct.run([cleave, "generate", f"--model={model}", "--max-tokens=6",
                                        "--print-ids", "--prompt-ids=19556,28,905"], timeout=120)
            self.assertEqual(code, 0, err)
            self.assertEqual(id_ids, text_ids)
        tiny = os.path.join(ct.SOURCE_DIR, "tests", "golden", "data", "engine", "hf", "llama_f32")
        code, out, err = ct.run([cleave, "generate", f"--model={tiny}", "--max-tokens=5",
                                 "--prompt-ids", "5 9 17 33"], timeout=60)
        self.assertEqual(code, 0, err)
        self.assertEqual(len(out.split()), 5, out)
        self.assertTrue(all(t.isdigit() for t in out.split()), out)
        self.assert_usage_error([cleave, "generate", f"--model={tiny}", "--prompt-ids=5,x"],
                                "--prompt-ids: 'x' is not a token id")
        self.assert_usage_error([cleave, "generate", f"--model={tiny}", "--prompt-ids=5", "Hi"],
                                "give PROMPT or --prompt-ids, not both")

    def test_generate_follows_a_json_schema(self):
        """--json-schema (a file or inline): the output is an instance (checked with the
        jsonschema package); a schema the decoder cannot enforce is a usage error naming the
        keyword."""
        import json
        import jsonschema
        model = os.path.join(ct.SOURCE_DIR, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
        if not os.path.exists(model):
            self.skipTest("model missing")
        cleave = ct.binary("cleave")
        schema = {"type": "object", "properties": {
            "name": {"type": "string"}, "age": {"type": "integer"},
            "colors": {"type": "array", "items": {"enum": ["black", "white", "orange"]},
                       "maxItems": 2}},
            "required": ["name", "age", "colors"]}
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "cat.json")
            with open(path, "w") as f:
                json.dump(schema, f)
            for given in (path, json.dumps(schema)):
                code, out, err = ct.run([cleave, "generate", f"--model={model}", "--max-tokens=80",
                                         "--threads=2", f"--json-schema={given}",
                                         "Describe a cat: its name, age and colors."], timeout=120)
                self.assertEqual(code, 0, err)
                jsonschema.validate(json.loads(out), schema)
        self.assert_usage_error([cleave, "generate", f"--model={model}",
                                 '--json-schema={"type": "object", "minProperties": 2}', "Hi"],
                                '--json-schema: at /: "minProperties" is not supported')
        self.assert_usage_error([cleave, "generate", f"--model={model}",
                                 "--json-schema=/nonexistent.json", "Hi"],
                                "--json-schema: cannot read /nonexistent.json")

    def test_generate_backend_flag(self):
        model = os.path.join(ct.SOURCE_DIR, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
        if not os.path.exists(model):
            self.skipTest(f"{model} missing; run scripts/install-deps.sh")
        cleave = ct.binary("cleave")
        self.assert_usage_error([cleave, "generate", f"--model={model}", "--backend=tpu", "Hi"],
                                "--backend is cpu or cuda, not 'tpu'")
        code, out, err = ct.run([cleave, "generate", f"--model={model}", "--backend=cuda",
                                 "--max-tokens=12", "--system=Answer in one sentence.", "What is the capital of France?"], timeout=120)
        if code == 0:  # A GPU is here: the GPU model answers as the CPU one does.
            self.assertIn("Paris", out)
            return
        # No GPU (or a build without CUDA): one clear line saying what is missing, no crash;
        # the same for two ranks (one GPU each).
        self.assertEqual(code, 1, err)
        self.assertRegex(err, r"GPU|CUDA")
        self.assertNotIn("Aborted", err)
        self.assertLessEqual(len(err.strip().splitlines()), 1, err)
        code, out, err = ct.run([cleave, "generate", f"--model={model}", "--backend=cuda", "--tp=2",
                                 "--max-tokens=4", "Hi"], timeout=120)
        if code != 0:
            self.assertEqual(code, 1, err)
            self.assertRegex(err, r"GPU|CUDA")
            self.assertNotIn("Aborted", err)
            self.assertLessEqual(len(err.strip().splitlines()), 1, err)


if __name__ == "__main__":
    unittest.main()
