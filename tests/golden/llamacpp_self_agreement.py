"""How well llama.cpp agrees with itself on the SmolLM2 greedy golden when only its own
numerics change (flash attention on, or an f32 KV cache instead of f16): the noise floor
for comparing any other engine's greedy tokens with data/engine/smollm2_llamacpp.json.

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

for name, options in [("flash attention on", {"flash_attn": True}),
                      ("f32 KV cache", {"flash_attn": False, "type_k": 0, "type_v": 0})]:
    llm = llama_cpp.Llama(model_path=MODEL, n_ctx=1024, n_threads=2, verbose=False, **options)
    exact = 0
    for prompt in golden["prompts"]:
        llm.reset()
        llm.eval(prompt["prompt_ids"])
        tokens = []
        for _ in range(len(prompt["generated"])):
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
            tokens.append(int(logits.argmax()))
            llm.eval([tokens[-1]])
        exact += tokens == prompt["generated"]
    print(f"llama.cpp with {name}: {exact} of {len(golden['prompts'])} prompts give the golden's "
          f"{len(golden['prompts'][0]['generated'])} greedy tokens exactly")
