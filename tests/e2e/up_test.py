"""`cleave up` starts a router and workers, reports the router's ports once every worker
has registered, serves requests through them, and stops every child on SIGINT."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import unittest
import urllib.request

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import cleave_testing as ct  # noqa: E402
from serving_test import MODEL  # noqa: E402


def children_of(pid):
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


@unittest.skipUnless(os.path.exists(MODEL), f"{MODEL} missing; run scripts/install-deps.sh")
class UpTest(unittest.TestCase):
    def test_up_serves_and_stops_everything_on_ctrl_c(self):
        up = ct.Process([ct.binary("cleave"), "up", f"--model={MODEL}", "--listen=127.0.0.1:0",
                         "--prefill=1", "--decode=1", "--threads=1", "--target-concurrency=4",
                         "--planned-seq-len=256", "--http-listen=127.0.0.1:0",
                         "--served-model-name=smol", "--log-requests"],
                        ready_timeout=120)
        children = children_of(up.proc.pid)
        self.assertEqual(len(children), 3, up.log())  # router, prefill, decode
        self.assertIn("decode-0_metrics_port", up.ready)
        code, out, err = ct.run([ct.binary("cleave"), "generate",
                                 f"--router=127.0.0.1:{up.ready['grpc_port']}", "--max-tokens=8",
                                 "--system=Answer in one sentence.", "What is the capital of France?"])
        self.assertEqual(code, 0, err)
        self.assertIn("Paris", out)
        # The OpenAI-compatible API of the router, on the port the ready file names.
        self.assertIn(f"OpenAI-compatible API http://127.0.0.1:{up.ready['http_port']}/v1",
                      up.log())
        body = json.dumps({"messages": [{"role": "system", "content": "Answer in one sentence."},
                                        {"role": "user", "content": "What is the capital of France?"}],
                           "max_tokens": 8, "temperature": 0, "model": "smol"}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{up.ready['http_port']}/v1/chat/completions", data=body,
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            reply = json.load(response)
        self.assertIn("Paris", reply["choices"][0]["message"]["content"])
        # The router's flags passed on: the model's name, and a log line per request.
        self.assertEqual(reply["model"], "smol")
        self.assertRegex(up.log(), r"request \S+ key=- model=smol prompt=\d+ .* -> OK")
        up.proc.send_signal(signal.SIGINT)
        self.assertEqual(up.proc.wait(60), 0, up.log())
        for pid in children:
            self.assertFalse(os.path.exists(f"/proc/{pid}"), f"child {pid} outlived cleave up")

    def test_a_broken_chat_template_fails_up_with_the_routers_reason(self):
        with tempfile.NamedTemporaryFile("w", suffix=".jinja") as template:
            template.write("{% if %}")
            template.flush()
            code, _, err = ct.run([ct.binary("cleave"), "up", f"--model={MODEL}",
                                   "--listen=127.0.0.1:0", f"--chat-template={template.name}"],
                                  timeout=120)
        self.assertEqual(code, 1)
        self.assertIn("chat template: line 1", err)
        self.assertIn("cleave-router exited", err)

    def test_a_worker_that_cannot_start_fails_up_with_its_reason(self):
        code, _, err = ct.run([ct.binary("cleave"), "up", f"--model={MODEL}",
                               "--listen=127.0.0.1:0", "--target-concurrency=64",
                               "--planned-seq-len=8192", "--memory-budget=200MiB"], timeout=120)
        self.assertEqual(code, 1)
        self.assertIn("exited", err)


class GoldenModelUpTest(unittest.TestCase):
    def serve_and_compare(self, case, block_size, workers=("--prefill=1", "--decode=1"),
                          repeat_cached=None):
        """Serves tests/golden/data/engine/hf/CASE with `workers` (by default a prefill and a
        decode worker; KV blocks of `block_size` positions): each golden prompt's KV moves from
        the prefill worker to the decode worker, which must continue it with the greedy tokens
        transformers chose."""
        folder = os.path.join(ct.SOURCE_DIR, "tests/golden/data/engine/hf", case)
        with open(os.path.join(folder, "logits.json")) as f:
            golden = json.load(f)
        up = ct.Process([ct.binary("cleave"), "up", f"--model={folder}", "--listen=127.0.0.1:0",
                         *workers, "--threads=1", "--target-concurrency=4",
                         "--planned-seq-len=64", "--http-listen=127.0.0.1:0",
                         f"--block-size={block_size}"],
                        ready_timeout=120)
        try:
            # The workers serve with the blocks asked for (the router reports their layout's).
            stub = ct.stubs()["generation_grpc"].GenerationStub(
                grpc.insecure_channel(f"127.0.0.1:{up.ready['grpc_port']}"))
            listed = stub.ListModels(ct.stubs()["generation_pb2"].ListModelsRequest(), timeout=10)
            self.assertEqual(listed.models[0].block_size, block_size)
            # With `repeat_cached`, the last prompt goes twice: the second time its first
            # `repeat_cached` tokens come from the prefix cache.
            prompts = golden["prompts"] + golden["prompts"][-1:] * (repeat_cached is not None)
            for i, prompt in enumerate(prompts):
                body = json.dumps({"prompt": prompt["ids"], "max_tokens": len(prompt["greedy_next"]),
                                   "temperature": 0, "return_token_ids": True}).encode()
                request = urllib.request.Request(
                    f"http://127.0.0.1:{up.ready['http_port']}/v1/completions", data=body,
                    headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=60) as response:
                    reply = json.load(response)
                self.assertEqual(reply["choices"][0]["token_ids"], prompt["greedy_next"], up.log())
                if i == len(golden["prompts"]):
                    self.assertEqual(reply["usage"]["prompt_tokens_details"]["cached_tokens"],
                                     repeat_cached, up.log())
                    # The worker that computed the prompts holds state checkpoints.
                    ports = [port for key, port in up.ready.items()
                             if key.endswith("_metrics_port") and key.startswith(("prefill", "both"))]
                    self.assertGreater(ct.metric(ports[0], "cleave_worker_state_checkpoints"), 0)
        finally:
            up.proc.send_signal(signal.SIGINT)
            up.proc.wait(60)

    def test_a_gpt_oss_mxfp4_checkpoint_served_disaggregated_decodes_transformers_tokens(self):
        """A tiny gpt-oss (MXFP4 experts, attention sinks, 4-position sliding windows), with KV
        blocks of 8 positions (not the default 16)."""
        self.serve_and_compare("gpt_oss_mxfp4", 8)

    def test_newer_families_served_disaggregated_decode_transformers_tokens(self):
        """Gemma 3 (sliding and global layers with their own rotary bases, sandwich norms, the
        logits' soft cap), GLM-4.5 (half of each head rotating, a shared expert), Ministral 3
        (the query temperature past the original context, on both workers), Phi-4-mini's
        longrope (the long factors, chosen by the context both workers serve), SmolLM3 (a layer
        without rotary embedding), MiniMax-M2 and OLMo 3 (Q and K normed across heads; OLMo's
        norms after attention and the MLP only), Gemma 2 (soft-capped attention scores), EXAONE
        4.0 (unrotated global layers) and GLM-4 (adjacent-pair partial rotary)."""
        for case in ("gemma3_f32", "glm4_moe_f32", "ministral3_f32", "phi3_longrope_f32", "smollm3_f32",
                     "minimax_m2_f32", "olmo3_f32", "gemma2_f32", "exaone4_f32", "glm4_f32"):
            with self.subTest(case):
                self.serve_and_compare(case, 16)

    def test_linear_attention_models_served_disaggregated_decode_transformers_tokens(self):
        """Qwen3.5, Qwen3.5-MoE and Qwen3-Next (Gated DeltaNet layers, whose per-sequence state moves with
        the prompt's KV into the decode worker's state slot): a combined worker prefilling for
        itself; a prefill and a decode worker of one rank each; and a prefill rank writing to a
        decode pair (each decode rank gets its key heads' state). The 17-token prompt sent
        again resumes from the state checkpoint its first run left at position 16."""
        layouts = {"both": ("--both=1",), "split": ("--prefill=1", "--decode=1"),
                   "tp1 to tp2": ("--prefill=1", "--decode=1", "--decode-tp=2")}
        for case in ("qwen3_5_f32", "qwen3_5_moe_f32", "qwen3_next_f32"):
            for name, workers in layouts.items():
                with self.subTest(case=case, layout=name):
                    self.serve_and_compare(case, 16, workers, repeat_cached=16)


if __name__ == "__main__":
    unittest.main()
