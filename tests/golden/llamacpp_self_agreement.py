"""How well llama.cpp agrees with itself on the SmolLM2 greedy golden when only its own
numerics change (this machine's build, flash attention on, or an f32 KV cache instead of
f16): the noise floor for comparing any other engine with data/engine/smollm2_llamacpp.json.

Two measures, as services/engine/llama_model_test.cc takes them:
* free-running greedy: prompts whose 64 tokens all match the golden's;
* teacher-forced (fed the golden's tokens, so every step meets the golden at the same
  context): steps whose argmax differs and the golden's margin there, and the error of the
  logits of the golden's top 5 at every step (median, p99, max).

Run: .cache/oracle-venv/bin/python tests/golden/llamacpp_self_agreement.py
(Not a test; its numbers are quoted where the engine's agreement is reported.)
"""
import json
import os

import llama_cpp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(HERE, "..", "..", "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
golden = json.load(open(os.path.join(HERE, "data", "engine", "smollm2_llamacpp.json")))


def last_logits(llm):
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))


for name, options in [("this build", {}),
                      ("flash attention on", {"flash_attn": True}),
                      ("f32 KV cache", {"flash_attn": False, "type_k": 0, "type_v": 0})]:
    llm = llama_cpp.Llama(model_path=MODEL, n_ctx=1024, n_threads=2, verbose=False, **options)
    exact = 0
    for prompt in golden["prompts"]:
        llm.reset()
        llm.eval(prompt["prompt_ids"])
        tokens = []
        for _ in range(len(prompt["generated"])):
            tokens.append(int(last_logits(llm).argmax()))
            llm.eval([tokens[-1]])
        exact += tokens == prompt["generated"]

    errors, steps, disagreements, worst = [], 0, 0, 0.0
    for prompt in golden["prompts"]:
        llm.reset()
        llm.eval(prompt["prompt_ids"])
        for step, want in enumerate(prompt["generated"]):
            logits = last_logits(llm)
            top = dict(zip(prompt["top5_ids"][step], prompt["top5_logits"][step]))
            errors += [abs(float(logits[i]) - v) for i, v in top.items()]
            steps += 1
            chosen = int(logits.argmax())
            if chosen != want:
                disagreements += 1
                worst = max(worst, prompt["top5_logits"][step][0] - top.get(chosen, -np.inf))
            llm.eval([want])
    errors.sort()
    print(f"llama.cpp with {name}: free-running, {exact} of {len(golden['prompts'])} prompts give "
          f"the golden's {len(golden['prompts'][0]['generated'])} greedy tokens exactly; "
          f"teacher-forced, {disagreements} of {steps} steps differ (golden margin up to {worst:.3f}), "
          f"top-5 logit error median {errors[len(errors) // 2]:.4f}, "
          f"p99 {errors[len(errors) * 99 // 100]:.4f}, max {errors[-1]:.4f}")
