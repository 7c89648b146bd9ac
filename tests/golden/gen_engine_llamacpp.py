#!/usr/bin/env python3
"""End-to-end engine golden: llama.cpp running the SmolLM2-135M-Instruct Q4_1 GGUF.

Writes tests/golden/data/engine/smollm2_llamacpp.json: for 12 prompts the
token ids llama.cpp feeds the model, its first 64 greedy tokens (EOS does not
stop generation), and for every generated step the winning logit and the
top-5 (id, logit) pairs; for two prompts also the full logits vector at the
last prompt position.

Oracle: llama-cpp-python (llama.cpp + ggml, CPU). Generation uses
Llama.generate with llama.cpp's greedy sampler (temp 0, no penalties), which
never stops on its own; the logits are the rows llama.cpp returned
(logits_all=True) and each sampled token is checked against their argmax.
Logit values depend on ggml's CPU kernels (the SIMD flags are recorded), so
compare them with a tolerance; the token ids should match exactly except
where a step's top-2 margin is tiny.
"""
from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA_DIR, SMOLLM2_GGUF, b64, fnv1a64, pkg_version, rel, write_json  # noqa: E402

OUT = DATA_DIR / "engine" / "smollm2_llamacpp.json"
N_CTX = 2048
N_THREADS = 2
N_BATCH = 512
SEED = 1234
N_GEN = 64
TOP_N = 5
FULL_LOGITS_TAGS = ("chat_capital", "long_lighthouse")


def chat(user: str, system: str | None = None) -> str:
    s = f"<|im_start|>system\n{system}<|im_end|>\n" if system is not None else ""
    return s + f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


LONG_TEXT = (
    "Lighthouses have guided sailors along dangerous coasts for more than two thousand years. The earliest "
    "ones were simple fires burning on hilltops, tended through the night by keepers who carried wood up "
    "steep paths. Later, builders raised stone towers so that the light could be seen from farther away, "
    "and they set polished metal behind the flames to throw the glow out over the water. In the nineteenth "
    "century a French engineer designed a lens made of many rings of glass, each ring bending the light "
    "toward the horizon. His design let a single lamp shine for twenty miles or more, and it spread quickly "
    "to harbors around the world. Keepers lived in small houses beside the towers. They trimmed wicks, "
    "polished brass, wound the clockwork that turned the lens, and wrote down the weather in a logbook every "
    "few hours. Storms could cut them off from the mainland for weeks, so they kept stores of flour, salted "
    "fish and lamp oil. Today most lighthouses run automatically, powered by electricity and watched by "
    "sensors instead of people, and many of the old keepers' houses have become museums or guest cottages. "
    "Satellite navigation has made the lights less important than they once were, yet ships still look for "
    "them on dark nights when their instruments fail. Fog signals, radio beacons and painted day marks "
    "complete the picture: each tower has its own pattern of flashes and its own colors, so a navigator who "
    "sees one can tell exactly which coast lies ahead.\n\nSummarize the history of lighthouses in one "
    "sentence:"
)

# (tag, kind, text, parse_special)
PROMPTS: list[tuple[str, str, str, bool]] = [
    ("chat_capital", "chat", chat("What is the capital of France?"), True),
    ("chat_poem", "chat", chat("Write a short poem about the ocean."), True),
    ("chat_system_cooking", "chat",
     chat("Give me three tips for learning to cook.",
          system="You are a helpful AI assistant named SmolLM, trained by Hugging Face"), True),
    ("chat_binary_search", "chat", chat("Explain what a binary search does in two sentences."), True),
    ("plain_fox", "plain", "The quick brown fox", False),
    ("plain_story", "plain", "Once upon a time, in a small village by the sea,", False),
    ("plain_colors", "plain", "The three primary colors are", False),
    ("code_python", "code", 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n', False),
    ("code_c", "code", '#include <stdio.h>\n\nint main(void) {\n    printf("', False),
    ("single_token", "single", "Hello", False),
    ("plain_counting", "plain", "1, 2, 3, 4, 5,", False),
    ("long_lighthouse", "long", LONG_TEXT, False),
]


def ggml_strings() -> dict:
    import llama_cpp
    out = {"llama_cpp_python": pkg_version("llama-cpp-python"),
           "llama_version": llama_cpp.llama_version().decode()}
    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
        for fn in ("ggml_version", "ggml_commit"):
            f = getattr(lib, fn)
            f.restype = ctypes.c_char_p
            out[fn] = f().decode()
    except (OSError, AttributeError):
        out["ggml_version"] = out["ggml_commit"] = "unavailable"
    out["system_info"] = llama_cpp.llama_print_system_info().decode().strip()
    return out


def top_n(row: np.ndarray, n: int) -> list[int]:
    # descending logit, ties by ascending id (stable sort on the negated row)
    return np.argsort(-row, kind="stable")[:n].tolist()


def main() -> None:
    if not SMOLLM2_GGUF.exists():
        print(f"  {SMOLLM2_GGUF} missing: SmolLM2 engine golden skipped")
        return
    from llama_cpp import Llama
    llm = Llama(str(SMOLLM2_GGUF), n_ctx=N_CTX, n_threads=N_THREADS, n_threads_batch=N_THREADS, n_batch=N_BATCH,
                seed=SEED, logits_all=True, verbose=False)
    md = llm.metadata
    add_bos = md.get("tokenizer.ggml.add_bos_token", "false") == "true"
    eos = llm.token_eos()
    vocab = llm.n_vocab()
    cases = []
    for tag, kind, text, special in PROMPTS:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)
        if kind == "single":
            assert len(ids) == 1, ids
        llm.reset()
        gen, top1, tops_id, tops_logit, margins = [], [], [], [], []
        for tok in llm.generate(list(ids), top_k=1, top_p=1.0, min_p=0.0, typical_p=1.0, temp=0.0,
                                repeat_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0, reset=True):
            row = llm.scores[len(ids) - 1 + len(gen)]
            best = top_n(row, TOP_N)
            assert tok == best[0], (tag, len(gen), tok, best)
            gen.append(int(tok))
            top1.append(float(row[best[0]]))
            tops_id.append(best)
            tops_logit.append([float(row[i]) for i in best])
            margins.append(float(row[best[0]] - row[best[1]]))
            if len(gen) == N_GEN:
                break
        case = {
            "tag": tag, "kind": kind, "text_b64": b64(text.encode("utf-8")),
            "parse_special": special, "add_bos": add_bos,
            "prompt_ids": ids, "n_prompt": len(ids),
            "generated": gen,
            "generated_text_b64": b64(llm.detokenize(gen, special=True)),
            "eos_steps": [i for i, t in enumerate(gen) if t == eos],
            "top1_logit": top1,
            "top5_ids": tops_id,
            "top5_logits": tops_logit,
            "min_margin": min(margins),
            "min_margin_step": margins.index(min(margins)),
        }
        if tag in FULL_LOGITS_TAGS:
            # re-run the prompt alone so this row is the prompt evaluation, not a later step
            llm.reset()
            llm.eval(ids)
            raw = np.ascontiguousarray(llm.scores[len(ids) - 1], dtype="<f4").tobytes()
            case["last_prompt_logits_b64"] = b64(raw)
            case["last_prompt_logits_fnv1a64"] = fnv1a64(raw)
            lp = np.frombuffer(raw, dtype="<f4")
            assert top_n(lp, TOP_N) == tops_id[0] and float(lp[tops_id[0][0]]) == top1[0], tag
        cases.append(case)
        print(f"  {tag}: {len(ids)} prompt tokens, eos at {case['eos_steps'][:4]}, "
              f"min margin {case['min_margin']:.3f}")
    doc = {
        "producer": f"tests/golden/gen_engine_llamacpp.py with llama-cpp-python {pkg_version('llama-cpp-python')}",
        "model": rel(SMOLLM2_GGUF),
        "model_file_size": SMOLLM2_GGUF.stat().st_size,
        "llama_cpp": ggml_strings(),
        "settings": {"n_ctx": N_CTX, "n_threads": N_THREADS, "n_batch": N_BATCH, "seed": SEED,
                     "logits_all": True, "kv_cache_type": "f16 (llama.cpp default)",
                     "sampler": "llama.cpp greedy (temp 0, top_k 1, no penalties); EOS does not stop",
                     "n_generated": N_GEN},
        "vocab_size": vocab,
        "eos_token_id": eos,
        "conventions": ("prompt_ids = tokenize(text, add_bos=GGUF tokenizer.ggml.add_bos_token (false), "
                        "special=parse_special); the prompt is evaluated in one batch, then one token per step. "
                        "Step i's logits are those after the prompt plus generated[:i]; generated[i] is their "
                        "argmax; top5 lists descending logits (ties: lower id first), top1_logit = "
                        "top5_logits[i][0]; min_margin = smallest top1 - top2 over the 64 steps. "
                        "last_prompt_logits_b64: float32 LE, n_vocab values, the logits after the prompt "
                        "(the row step 0 is chosen from). eos_steps: steps whose token is eos_token_id."),
        "prompts": cases,
    }
    write_json(OUT, doc)
    print(f"  wrote {rel(OUT)} ({OUT.stat().st_size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
