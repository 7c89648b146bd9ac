#!/usr/bin/env python3
"""A random-weight Qwen3.5 checkpoint for bench_engine, in bf16 (nothing downloaded).

  .cache/oracle-venv/bin/python bench/make_random_qwen35.py OUT_DIR [--moe]

Dense (default): hidden 1024, 24 layers (three Gated DeltaNet layers to one gated-attention
layer), 8 query heads and 2 KV heads of 256, 16 linear key and value heads of 128, MLP 3584,
vocabulary 248320 with tied embeddings (about 0.85B parameters). --moe: the same layers with
64 experts of 512 (top 8) beside a gated shared expert of 512 on every layer. Weights are
N(0, 0.02): the numbers are meaningless, the shapes and bytes are a real model's.
"""
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Qwen3_5MoeTextConfig, Qwen3_5TextConfig

COMMON = dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=8, num_key_value_heads=2,
              head_dim=256, vocab_size=248320, max_position_embeddings=32768, rms_norm_eps=1e-6,
              linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
              linear_num_key_heads=16, linear_num_value_heads=16, tie_word_embeddings=True,
              rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
              bos_token_id=1, eos_token_id=2)


def main(out: Path, moe: bool) -> None:
    torch.manual_seed(0)
    cfg = (Qwen3_5MoeTextConfig(**COMMON, num_experts=64, num_experts_per_tok=8, moe_intermediate_size=512,
                                shared_expert_intermediate_size=512)
           if moe else Qwen3_5TextConfig(**COMMON, intermediate_size=3584))
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    model.save_pretrained(str(out), safe_serialization=True)
    print(f"{out}: {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters")


if __name__ == "__main__":
    main(Path(sys.argv[1]), "--moe" in sys.argv[2:])
