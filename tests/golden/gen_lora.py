#!/usr/bin/env python3
"""LoRA adapter goldens: PEFT adapters on the tiny models of gen_engine_hf.py.

For every case writes tests/golden/data/engine/lora/<case>/:
  adapter_config.json, adapter_model.safetensors
                  PeftModel.save_pretrained of a LoraConfig on the base folder
                  (tests/golden/data/engine/hf/<base>), every lora_A and lora_B
                  random (N(0, 1/fan_in), so that the update shows: PEFT starts B
                  at zero), in the case's dtype
  logits.json     gen_engine_hf.py's format: full-sequence logits of three prompts
                  with the adapter applied (PEFT on transformers, float32, the
                  adapter reloaded from the written folder), 8 greedy tokens each,
                  and `base_logits_differ`: how far the adapter moves the logits

Oracle: peft (its LoRA layers and scaling: lora_alpha / r, or / sqrt(r) with
rslora) on transformers, CPU, one thread.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

try:
    import torch
    import peft
except ImportError:
    print("  torch or peft not installed: data/engine/lora left as committed")
    sys.exit(0)
from peft import LoraConfig, PeftModel, get_peft_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA_DIR, b64, fnv1a64, pkg_version, write_json  # noqa: E402
from gen_engine_hf import (MIN_GREEDY_MARGIN, NEW_TOKENS, TOLERANCE, draw_prompts, f32_bytes,  # noqa: E402
                           full_logits, greedy, greedy_margins, load, max_rel)

BASES = DATA_DIR / "engine" / "hf"
OUT = DATA_DIR / "engine" / "lora"
PRODUCER = (f"tests/golden/gen_lora.py with peft {pkg_version('peft')}, transformers "
            f"{pkg_version('transformers')}, torch {torch.__version__}")
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# name: (base case, LoraConfig kwargs, seed, stored dtype)
CASES: dict[str, tuple] = {
    # every projection, alpha / r = 2
    "llama_all_r8": ("llama_f32", dict(r=8, lora_alpha=16, target_modules=ALL), 201, torch.float32),
    # rank-stabilized scaling (alpha / sqrt(r)), two projections, stored bf16
    "llama_qv_rslora_bf16": ("llama_f32", dict(r=4, lora_alpha=8, use_rslora=True,
                                               target_modules=["q_proj", "v_proj"]), 202, torch.bfloat16),
    # the attention of a MoE model whose GGUF file permutes Q/K rows (llama.cpp's "llama" layout)
    "mixtral_attn_r4": ("mixtral_f32", dict(r=4, lora_alpha=4, target_modules=["q_proj", "k_proj", "v_proj",
                                                                                "o_proj"]), 203, torch.float32),
}


def randomize_lora(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)


def run_case(name: str, base: str, lora_kwargs: dict, seed: int, dtype: torch.dtype) -> None:
    d = OUT / name
    if d.exists():
        shutil.rmtree(d)
    base_dir = BASES / base
    model = get_peft_model(load(base_dir, torch.float32), LoraConfig(bias="none", **lora_kwargs))
    randomize_lora(model, seed)
    if dtype != torch.float32:
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.data = p.data.to(dtype)
    model.save_pretrained(str(d), safe_serialization=True)
    del model
    cfg_path = d / "adapter_config.json"  # no machine's path in the committed file
    cfg = json.loads(cfg_path.read_text())
    cfg["base_model_name_or_path"] = f"tests/golden/data/engine/hf/{base}"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    plain = load(base_dir, torch.float32)
    adapted = PeftModel.from_pretrained(load(base_dir, torch.float32), str(d))
    for n, p in adapted.named_parameters():  # bf16 adapters run upcast, exactly
        if "lora_" in n:
            p.data = p.data.to(torch.float32)
    adapted.eval()
    vocab = plain.config.vocab_size
    prompts, redraws = draw_prompts(adapted, vocab, seed)
    entries = []
    moved = float("inf")
    for ids in prompts:
        lg = full_logits(adapted, ids)
        moved = min(moved, max_rel(full_logits(plain, ids), lg))
        raw = f32_bytes(lg)
        gen = greedy(adapted, ids)
        margins, _ = greedy_margins(adapted, ids, gen)
        entries.append({"ids": ids, "len": len(ids), "logits_shape": [len(ids), vocab], "logits_b64": b64(raw),
                        "logits_fnv1a64": fnv1a64(raw), "greedy_next": gen, "greedy_margins": margins})
    assert moved > 1e-2, (name, moved)  # the adapter must show in every prompt's logits
    write_json(d / "logits.json", {
        "producer": PRODUCER,
        "case": name,
        "base": f"engine/hf/{base}",
        "lora": {k: v for k, v in lora_kwargs.items()},
        "adapter_dtype": str(dtype).replace("torch.", ""),
        "seed": seed,
        "vocab_size": vocab,
        "tolerance": {"metric": TOLERANCE["metric"], "max_rel": TOLERANCE["float32"]},
        "greedy": {"max_new_tokens": NEW_TOKENS, "eos": "ignored (eos_token_id=None)",
                   "min_margin_required": MIN_GREEDY_MARGIN, "prompt_redraws": redraws},
        "base_logits_differ": moved,
        "prompts": entries,
    })
    print(f"  {name}: on {base}, {dtype}, adapter moves logits >= {moved:.2e}, redraws {redraws}")


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    for name, (base, kwargs, seed, dtype) in CASES.items():
        if argv and name not in argv:
            continue
        run_case(name, base, kwargs, seed, dtype)


if __name__ == "__main__":
    main(sys.argv[1:])
