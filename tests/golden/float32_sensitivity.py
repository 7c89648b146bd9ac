#!/usr/bin/env python3
"""How far float32 rounding alone can move a golden model's logits.

For each case of data/engine/hf named on the command line: the model in float64 (Gated DeltaNet
layers through gen_engine_hf.py's exact recurrence), its logits for a random prompt of 36 tokens
(TpEquivalenceTest's longest sequence), then the same with every weight multiplied by
1 + 6e-8 N(0, 1) (float32's rounding, half an ulp), three times; prints the largest change of a
position's logits relative to its largest logit. Two correct float32 runs of the model that
differ only in the order of their sums (tensor-parallel ranks, another kernel) can differ by
about that much, so it sizes the bound of a test comparing them.

Oracle: transformers on torch, CPU.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("gen_engine_hf", HERE / "gen_engine_hf.py")
gen = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gen)  # its float64 Gated DeltaNet and settings


def load(folder: Path):
    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float64, attn_implementation="eager",
                                                experts_implementation="eager").eval()


@torch.no_grad()
def sensitivity(name: str) -> float:
    folder = gen.OUT / name
    g = torch.Generator().manual_seed(7)
    model = load(folder)
    ids = torch.randint(0, model.config.vocab_size, (1, 36), generator=g)
    base = model(input_ids=ids).logits[0]
    worst = 0.0
    for _ in range(3):
        noisy = load(folder)
        for p in noisy.parameters():
            p.mul_(1 + 6e-8 * torch.randn(p.shape, generator=g, dtype=torch.float64))
        out = noisy(input_ids=ids).logits[0]
        worst = max(worst, float(((out - base).abs().amax(-1) / base.abs().amax(-1)).max()))
    return worst


if __name__ == "__main__":
    for case in sys.argv[1:]:
        print(f"{case}: logits move up to {sensitivity(case):.2e} under float32-sized weight noise")
