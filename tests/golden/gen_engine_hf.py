#!/usr/bin/env python3
"""Inference-engine goldens from tiny random-weight transformers models.

For every case writes tests/golden/data/engine/hf/<case>/:
  config.json, generation_config.json, model.safetensors
                  save_pretrained(safe_serialization=True) of a model built
                  from a transformers config class (nothing downloaded); the
                  checkpoint uses the published tensor layout (per-expert
                  tensors, Mixtral's block_sparse_moe.*.w1/w2/w3)
  logits.json     full-sequence logits of three prompts at every position,
                  plus 8 greedy continuation tokens per prompt
  quantized cases the decoder's linear layers stored FP8 or NVFP4 in one of the
                  conventions of quantize_formats.py (Hugging Face fp8, ModelOpt,
                  compressed-tensors); the logits are transformers' on the same model with
                  each weight replaced by what its stored bytes decode to; for NVFP4 and
                  MXFP4, each such layer whose input is whole 32-element blocks also has its input
                  rounded to int8 per block (d = max|x| / 127, codes rounded half to even),
                  as the CPU engine's int8 kernels multiply it
  routing.json    MoE cases only: router decisions of every MoE layer's gate
                  for random hidden states, from transformers' own router
                  modules, so routing can be checked without attention

Every weight is random with a fixed seed: matrices N(0, 1/fan_in) (fan_in =
last dimension), RMSNorm weights 1 + 0.1 N(0,1), biases 0.2 N(0,1),
DeepSeek's e_score_correction_bias 0.1 N(0,1). The logits are computed from
the model reloaded from the written folder (eager attention, batch of one,
no padding), so they belong to the committed bytes.

Oracle: transformers (modeling code of each family) on torch, CPU, one thread.
"""
from __future__ import annotations

import contextlib
import json
from base64 import b64decode
import logging
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

try:
    import torch
except ImportError:  # CLEAVE_ORACLE_NO_TORCH=1
    print("  torch not installed: data/engine/hf left as committed")
    sys.exit(0)
import transformers
from safetensors import safe_open
from transformers import (AutoModelForCausalLM, DeepseekV2Config, DeepseekV3Config, Exaone4Config, Gemma2Config, Gemma3TextConfig, Glm4Config, Glm4MoeConfig,
                          GptOssConfig, GraniteConfig, LlamaConfig, MiniMaxM2Config, Ministral3Config, MistralConfig, MixtralConfig,
                          Olmo2Config, Olmo3Config, Phi3Config,
                          Qwen2Config, Qwen3Config, Qwen3NextConfig, Qwen3_5MoeTextConfig, Qwen3_5TextConfig,
                          SeedOssConfig,
                          SmolLM3Config,
                          Qwen3MoeConfig)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA_DIR, b64, fnv1a64, pkg_version, write_json  # noqa: E402
from quantize_formats import quantize_checkpoint, write_decoded_checkpoint  # noqa: E402

OUT = DATA_DIR / "engine" / "hf"
PRODUCER = (f"tests/golden/gen_engine_hf.py with transformers {pkg_version('transformers')}, "
            f"torch {torch.__version__}, safetensors {pkg_version('safetensors')}")
MAX_FOLDER_BYTES = 1_000_000
PROMPT_LENGTHS = (5, 11, 17)
NEW_TOKENS = 8
MIN_GREEDY_MARGIN = 2e-3   # prompts are redrawn until every greedy step wins by at least this
ROUTING_TOKENS = 16
MIN_ROUTING_MARGIN = 1e-3  # router inputs whose k-th / (k+1)-th choice is closer are skipped
TOLERANCE = {
    "metric": "per position: max_v |cleave[v] - golden[v]| / max_v |golden[v]|; take the max over positions",
    "float32": 1e-4,
    "bfloat16": 2e-2,
    # NVFP4 and MXFP4: the reference rounds the activations to int8 as the engine's int8
    # kernels do (int8_inputs), so what is left is the order of float sums, and a code rounded
    # the other way where an input lies within that of a half step
    "int8_inputs": 1e-3,
}
INT8_INPUT_KINDS = ("nvfp4_modelopt", "nvfp4_ct", "int4_ct", "mxfp4_experts")

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()
logging.getLogger("transformers").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")

LLAMA_BASE = dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, vocab_size=701, max_position_embeddings=256,
                  rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                  bos_token_id=1, eos_token_id=2, attention_bias=False, mlp_bias=False)

# name: (config class, kwargs, seed, weight dtype); a string weight dtype is a quantized
# format of quantize_formats.py applied to the float32 weights (its [16, 32] blocks are
# uneven at the edges: 176 = 5.5 x 32). The quantized Llama cases share llama_f32's weights.
CASES: dict[str, tuple] = {
    "llama_fp8": (LlamaConfig, LLAMA_BASE, 101, "fp8_hf"),
    "llama_fp8_modelopt": (LlamaConfig, LLAMA_BASE, 101, "fp8_modelopt"),
    "llama_fp8_ct_channel": (LlamaConfig, LLAMA_BASE, 101, "fp8_ct_channel"),
    "llama_fp8_ct_block": (LlamaConfig, LLAMA_BASE, 101, "fp8_ct_block"),
    "llama_nvfp4_modelopt": (LlamaConfig, LLAMA_BASE, 101, "nvfp4_modelopt"),
    "llama_nvfp4_ct": (LlamaConfig, LLAMA_BASE, 101, "nvfp4_ct"),
    "llama_f32": (LlamaConfig, LLAMA_BASE, 101, torch.float32),
    "llama3_rope_f32": (LlamaConfig, {
        **LLAMA_BASE, "hidden_size": 128, "intermediate_size": 96, "num_attention_heads": 4,
        "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 227, "max_position_embeddings": 512,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 64}}, 102, torch.float32),
    # same shapes and the same seed as llama_f32: its weights are llama_f32's rounded to bf16
    "llama_bf16": (LlamaConfig, LLAMA_BASE, 101, torch.bfloat16),
    "smollm2_like_f32": (LlamaConfig, {
        **LLAMA_BASE, "hidden_size": 192, "intermediate_size": 96, "num_hidden_layers": 1,
        "num_attention_heads": 3, "num_key_value_heads": 1, "head_dim": 64, "vocab_size": 211,
        "rope_theta": 100000.0, "tie_word_embeddings": True}, 104, torch.float32),
    # Mistral: Llama's graph with a sliding window on every layer, shorter than the prompts
    "mistral_f32": (MistralConfig, dict(
        hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, vocab_size=281, max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=1000000.0,
        sliding_window=6, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2), 111, torch.float32),
    # Ministral 3: Mistral's graph with YaRN and Llama 4's query temperature, 1 + beta ln(1 + floor(p / 8)):
    # the original context is 8 positions, so the prompts' later positions are scaled 1.21 and 1.33
    "ministral3_f32": (Ministral3Config, dict(
        hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, vocab_size=283, max_position_embeddings=64, rms_norm_eps=1e-5, sliding_window=None,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0,
                         "original_max_position_embeddings": 8, "beta_fast": 32.0, "beta_slow": 1.0,
                         "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.3},
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0), 115, torch.float32),
    # Llama with attention_bias: biases on Q, K, V and O (transformers' LlamaAttention puts one on all four)
    "llama_bias_f32": (LlamaConfig, {
        **LLAMA_BASE, "hidden_size": 64, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 293, "attention_bias": True}, 117, torch.float32),
    # Seed-OSS: biases on Q, K and V only (attention_out_bias false, as published), rope_theta 1e7
    "seed_oss_f32": (SeedOssConfig, dict(
        hidden_size=64, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, vocab_size=307, max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=10000000.0,
        attention_dropout=0.0, residual_dropout=0.0, tie_word_embeddings=False, bos_token_id=0, eos_token_id=2,
        pad_token_id=1), 118, torch.float32),
    # SmolLM3: Llama's graph with every fourth layer unrotated (NoPE; here the last of 4), tied embeddings
    "smollm3_f32": (SmolLM3Config, dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=627, max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=5000000.0,
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0), 116, torch.float32),
    # Phi-3: Q, K, V fused in qkv_proj, gate and up in gate_up_proj; a window on every layer
    "phi3_f32": (Phi3Config, dict(
        hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=617, max_position_embeddings=256, original_max_position_embeddings=256, rms_norm_eps=1e-5,
        rope_theta=10000.0, sliding_window=7, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
        pad_token_id=0), 112, torch.float32),
    # longrope as Phi-4-mini has it (rotary embedding on 0.75 of each head), its context 8x the
    # pretraining one, so the long factors and the derived attention factor apply (every prompt is
    # longer than the original context, so transformers takes the long ones for every position)
    "phi3_longrope_f32": (Phi3Config, dict(
        hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=619, max_position_embeddings=32, original_max_position_embeddings=4, rms_norm_eps=1e-5,
        rope_theta=10000.0, partial_rotary_factor=0.75, sliding_window=None, tie_word_embeddings=True,
        rope_scaling={"type": "longrope", "short_factor": [1.0, 1.02, 1.1, 1.3, 1.7, 2.4],
                      "long_factor": [1.0, 1.4, 2.3, 3.9, 6.2, 9.5]},
        bos_token_id=1, eos_token_id=2, pad_token_id=0), 113, torch.float32),
    # the short factors: a context no longer than the pretraining one, the attention factor from
    # a stated stretch
    "phi3_longrope_short_f32": (Phi3Config, dict(
        hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=311, max_position_embeddings=256, original_max_position_embeddings=256, rms_norm_eps=1e-5,
        rope_theta=10000.0, sliding_window=None, tie_word_embeddings=False,
        rope_scaling={"type": "longrope", "factor": 16.0,
                      "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8],
                      "long_factor": [2.0, 3.0, 5.0, 8.0, 13.0, 21.0, 34.0, 55.0]},
        bos_token_id=1, eos_token_id=2, pad_token_id=0), 114, torch.float32),
    "qwen2_f32": (Qwen2Config, dict(
        hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=701, max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=False, use_sliding_window=False, bos_token_id=1, eos_token_id=2), 105, torch.float32),
    "qwen3_f32": (Qwen3Config, dict(
        hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, vocab_size=577, max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=False, use_sliding_window=False, attention_bias=False,
        bos_token_id=1, eos_token_id=2), 106, torch.float32),
    "mixtral_f32": (MixtralConfig, dict(
        hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=509, max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=1000000.0,
        num_local_experts=4, num_experts_per_tok=2, sliding_window=None, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2), 107, torch.float32),
    "qwen3_moe_f32": (Qwen3MoeConfig, dict(
        hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=509, max_position_embeddings=256,
        rms_norm_eps=1e-6, rope_theta=1000000.0, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False, use_sliding_window=False,
        attention_bias=False, bos_token_id=1, eos_token_id=2), 108, torch.float32),
    "qwen3_moe_nonorm_f32": (Qwen3MoeConfig, dict(
        hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=251, max_position_embeddings=256,
        rms_norm_eps=1e-6, rope_theta=1000000.0, num_experts=8, num_experts_per_tok=2, norm_topk_prob=False,
        decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False, use_sliding_window=False,
        attention_bias=False, bos_token_id=1, eos_token_id=2), 109, torch.float32),
    "deepseek_v3_moe_f32": (DeepseekV3Config, dict(
        hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, vocab_size=509, max_position_embeddings=256,
        rms_norm_eps=1e-6, rope_theta=10000.0, n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
        n_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True,
        scoring_func="sigmoid", topk_method="noaux_tc", q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16,
        qk_rope_head_dim=8, v_head_dim=16, tie_word_embeddings=False, attention_bias=False,
        bos_token_id=0, eos_token_id=1), 110, torch.float32),
    # DeepSeek-V2-style attention: full-rank Q (no q_lora_rank), rotate-half rope, and YaRN
    # with an attention factor != 1 (mscale != mscale_all_dim).
    "deepseek_v2_yarn_f32": (DeepseekV3Config, dict(
        hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, vocab_size=257, max_position_embeddings=256,
        rms_norm_eps=1e-6, n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
        n_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True,
        scoring_func="sigmoid", topk_method="noaux_tc", q_lora_rank=None, kv_lora_rank=16,
        qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, rope_interleave=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0,
                         "mscale": 1.0, "mscale_all_dim": 0.5},
        tie_word_embeddings=False, attention_bias=False, bos_token_id=0, eos_token_id=1), 112, torch.float32),
}

# DeepSeek-V3's 128 x 128 FP8 blocks need every projection a whole number of blocks wide:
# one layer of hidden 128, 4 heads of 32 with no grouping (K and V 128 rows), MLP 256, tied.
CASES["llama_fp8_block128"] = (LlamaConfig, {
    **LLAMA_BASE, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 1,
    "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 32,
    "tie_word_embeddings": True}, 111, "fp8_hf_128")

# DeepSeek-V2-Lite's attention: full-rank Q, rotate-half rope, YaRN with mscale ==
# mscale_all_dim (attention factor 1, as the GPU rope takes it; the softmax scale still
# gets mscale_all_dim's factor squared).
CASES["deepseek_v2_lite_f32"] = (DeepseekV3Config, {
    **CASES["deepseek_v2_yarn_f32"][1],
    "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                        "original_max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0,
                        "mscale": 0.707, "mscale_all_dim": 0.707}}, 114, torch.float32)

# DeepSeek-V3 as its checkpoints ship: every linear layer FP8 in 128 x 128 blocks, some of them
# partial (kv_a_proj_with_mqa's 80 rows, q_b_proj's 96 columns, the experts' 64), and kv_b_proj's
# 8 heads of 32 rows over two row blocks (so a rank's heads can start inside a block). Tied
# embeddings keep the folder under 1 MB.
CASES["deepseek_v3_fp8_block128"] = (DeepseekV3Config, {
    **CASES["deepseek_v3_moe_f32"][1], "hidden_size": 128, "intermediate_size": 256,
    "num_attention_heads": 8, "num_key_value_heads": 8,
    "moe_intermediate_size": 64, "q_lora_rank": 96, "kv_lora_rank": 64, "qk_rope_head_dim": 16,
    "tie_word_embeddings": True}, 113, "fp8_hf_128")

# DeepSeek-V2(-Lite): the same latent attention (rope always on adjacent pairs), softmax routing
# without renormalization, weights times routed_scaling_factor (2 here, so it shows).
CASES["deepseek_v2_moe_f32"] = (DeepseekV2Config, dict(
    hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=4, vocab_size=263, max_position_embeddings=256,
    rms_norm_eps=1e-6, n_routed_experts=8, num_experts_per_tok=2, topk_method="greedy",
    n_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=2.0, norm_topk_prob=False,
    q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    tie_word_embeddings=False, attention_bias=False, bos_token_id=0, eos_token_id=1), 115, torch.float32)

# DeepSeek-V3 with a latent wider than the heads (kv_lora 32, q/k heads 16 + 8, values 24), so
# a GGUF file's key_length (latent + rope, 40) and key_length_mla (a head, 24) differ, as do
# value_length (32) and value_length_mla (24); gen_engine_gguf.py writes it as llama.cpp does.
CASES["deepseek_v3_wide_latent_f32"] = (DeepseekV3Config, {
    **CASES["deepseek_v3_moe_f32"][1], "q_lora_rank": 24, "kv_lora_rank": 32, "v_head_dim": 24},
    120, torch.float32)

# DeepSeek-V3 stored in bf16 (the weights of deepseek_v3_moe_f32 rounded).
CASES["deepseek_v3_bf16"] = (DeepseekV3Config, CASES["deepseek_v3_moe_f32"][1], 110, torch.bfloat16)

# The MoE experts (routed, 32 columns per down projection) in NVFP4; the router stays float.
CASES["qwen3_moe_nvfp4_ct"] = (Qwen3MoeConfig, CASES["qwen3_moe_f32"][1], 108, "nvfp4_ct")
# Every decoder linear weight (attention, routed experts) in compressed-tensors' int4 W4A16, a
# bf16 scale per 32 elements (compressed-tensors wants whole groups: these shapes have them).
CASES["qwen3_moe_int4_ct"] = (Qwen3MoeConfig, CASES["qwen3_moe_f32"][1], 108, "int4_ct")


# gpt-oss: per-head attention sinks, sliding windows of 4 positions on the even layers (shorter
# than every prompt, so they bind), biases on Q/K/V/O, the router and the experts, and the
# experts' clamped SwiGLU at the real models' limit of 7 (which GGUF files cannot state:
# llama.cpp fixes it), made to bind in gpt_oss_f32 by expert gate/up weights 8 times the usual
# scale (EXPERT_GAIN); YaRN as gpt-oss uses it (truncate false), scaled down to these positions.
CASES["gpt_oss_f32"] = (GptOssConfig, dict(
    hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, vocab_size=509, max_position_embeddings=256, rms_norm_eps=1e-5, num_local_experts=8,
    num_experts_per_tok=2, sliding_window=4, layer_types=["sliding_attention", "full_attention"],
    swiglu_limit=7.0, attention_bias=True, tie_word_embeddings=False,
    rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                     "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 64},
    bos_token_id=0, eos_token_id=1), 116, torch.float32)
# The same model at the usual scale with its experts in MXFP4 as OpenAI publishes gpt-oss (E2M1
# codes with an E8M0 exponent per 32 elements, in _blocks and _scales tensors); everything
# else stays float. (With the clamp binding, the activations an int8 engine rounds would be
# too large for a bound that still checks the format.)
CASES["gpt_oss_mxfp4"] = (GptOssConfig, CASES["gpt_oss_f32"][1], 116, "mxfp4_experts")


# GLM-4.5: DeepSeek-V3's routing (sigmoid, correction bias, one group, scaled weights), a shared
# expert and a dense first layer, on grouped-query attention with Q/K/V biases and per-head Q/K
# norms (GLM-4.5's use_qk_norm; Air has none), rotating the first half of each head.
CASES["glm4_moe_f32"] = (Glm4MoeConfig, dict(
    hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=509, max_position_embeddings=256,
    rms_norm_eps=1e-5, n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1, n_shared_experts=1,
    first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True, attention_bias=True,
    use_qk_norm=True, partial_rotary_factor=0.5, rope_theta=1000000.0, num_nextn_predict_layers=0,
    tie_word_embeddings=False, bos_token_id=0, eos_token_id=1), 117, torch.float32)


# Gemma 3: norms before and after attention and the MLP (weights w for a scale of 1 + w), GELU
# (tanh) MLP, embeddings times sqrt(hidden), Q/K norms, a softmax scale of query_pre_attn_scalar
# (24, not head_dim), two sliding layers (window 4, rotary base 1e4) and a global one (base 1e6,
# linear scaling 4), tied embeddings, and the logits soft-capped at 10 (Gemma 2's cap, which
# Gemma 3's class applies when set) so the cap binds.
CASES["gemma3_f32"] = (Gemma3TextConfig, dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, vocab_size=509, max_position_embeddings=256, rms_norm_eps=1e-6, query_pre_attn_scalar=24,
    sliding_window=4, layer_types=["sliding_attention", "sliding_attention", "full_attention"],
    rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000000.0},
                     "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
    final_logit_softcapping=10.0, hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
    bos_token_id=2, eos_token_id=1, pad_token_id=0), 118, torch.float32)
# GLM-4 (dense): norms before and after attention and the MLP, Q/K/V biases, gate and up in one matrix,
# rotary embedding on adjacent pairs of the first half of each head.
CASES["glm4_f32"] = (Glm4Config, dict(
    hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, vocab_size=277, max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0,
    partial_rotary_factor=0.5, attention_bias=True, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
    pad_token_id=0), 126, torch.float32)
# EXAONE 4.0: OLMo 2's norms with per-head Q/K norms, three sliding layers (window 4) to one global, the
# global one without rotary embedding.
CASES["exaone4_f32"] = (Exaone4Config, dict(
    hidden_size=64, intermediate_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, vocab_size=271, max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=1000000.0,
    sliding_window=4, sliding_window_pattern=4, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
    pad_token_id=0), 125, torch.float32)
# Gemma 2: Gemma 3's norms, GELU MLP and scales without Q/K norms, a window (4) on every other layer, one
# rotation for all, the attention scores soft-capped at 1.5 and the logits at 10 (both bind here);
# query_pre_attn_scalar the head size, as the 2B and 9B have it (what a GGUF file implies).
CASES["gemma2_f32"] = (Gemma2Config, dict(
    hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, vocab_size=263, max_position_embeddings=256, rms_norm_eps=1e-6, query_pre_attn_scalar=16,
    sliding_window=4, rope_theta=10000.0, attn_logit_softcapping=1.5, final_logit_softcapping=10.0,
    hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, bos_token_id=2, eos_token_id=1,
    pad_token_id=0), 124, torch.float32)
# Gemma 3 as the 1B-12B models are (what a GGUF file can state; gen_engine_gguf.py writes it):
# six layers, every sixth global by the default pattern, query_pre_attn_scalar = head_dim,
# no soft cap, linear scaling 8 on the global layer.
CASES["gemma3_pattern6_f32"] = (Gemma3TextConfig, dict(
    hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=1,
    head_dim=16, vocab_size=509, max_position_embeddings=256, rms_norm_eps=1e-6, query_pre_attn_scalar=16,
    sliding_window=5, rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                                       "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
    hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
    bos_token_id=2, eos_token_id=1, pad_token_id=0), 119, torch.float32)

# MiniMax-M2: Mixtral's layout routed by sigmoid scores with a correction bias (renormalized), Q and K each
# normed across all their heads, rotary embedding on the first rotary_dim (half) of each head.
CASES["minimax_m2_f32"] = (MiniMaxM2Config, dict(
    hidden_size=64, intermediate_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, rotary_dim=8, vocab_size=251, max_position_embeddings=256, rms_norm_eps=1e-6,
    num_local_experts=8, num_experts_per_tok=2, tie_word_embeddings=False,
    bos_token_id=1, eos_token_id=2, pad_token_id=0), 120, torch.float32)
# OLMo 2: norms after attention and the MLP only, Q and K normed across heads.
CASES["olmo2_f32"] = (Olmo2Config, dict(
    hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=253, max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=500000.0,
    tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0), 121, torch.float32)
# OLMo 3: OLMo 2 with three sliding layers (window 5) to one global, the global one with YaRN
# (factor 4 over 16 positions), the sliding ones unscaled.
CASES["olmo3_f32"] = (Olmo3Config, dict(
    hidden_size=64, intermediate_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=257, max_position_embeddings=64, rms_norm_eps=1e-6, sliding_window=5,
    rope_parameters={"full_attention": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                                        "rope_theta": 500000.0, "beta_fast": 32.0, "beta_slow": 1.0},
                     "sliding_attention": {"rope_type": "default", "rope_theta": 500000.0}},
    tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0), 122, torch.float32)

# Granite 3: Llama's graph with the embeddings times 12, each block's output times 0.22 before the residual
# add, a softmax scale of 0.15 (not 1/sqrt(16)), the logits divided by 8, and biases on Q, K, V and O.
CASES["granite_f32"] = (GraniteConfig, dict(
    hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=259, max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=10000000.0,
    embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.15, logits_scaling=8.0,
    attention_bias=True, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0),
    123, torch.float32)

# Qwen3.5 (text): Gated DeltaNet linear attention on three layers of four, gated full attention (a sigmoid
# gate per query value, Q/K norms, rotary embedding on a quarter of each head) on the fourth, as the default
# full_attention_interval places it (what a GGUF file states); norms stored as offsets from 1. Two value heads
# per key head, all of 12 (llama.cpp's graph takes key and value heads of one size; Qwen3-Next's golden has
# them apart).
CASES["qwen3_5_f32"] = (Qwen3_5TextConfig, dict(
    hidden_size=64, intermediate_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, vocab_size=267, max_position_embeddings=256, rms_norm_eps=1e-6,
    linear_conv_kernel_dim=4, linear_key_head_dim=12, linear_value_head_dim=12, linear_num_key_heads=2,
    linear_num_value_heads=4, rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                                               "partial_rotary_factor": 0.25},
    tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0), 130, torch.float32)

# Qwen3.5-MoE: the same layers (attention on the fourth, as a GGUF file states it) with a mixture of experts
# on each (softmax top-2 of 8, renormalized) beside one shared expert whose output a sigmoid gate of the
# token's input scales.
CASES["qwen3_5_moe_f32"] = (Qwen3_5MoeTextConfig, dict(
    hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    vocab_size=261, max_position_embeddings=256, rms_norm_eps=1e-6,
    linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
    linear_num_value_heads=2, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
    shared_expert_intermediate_size=24,
    rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
    tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0), 128, torch.float32)

# Qwen3-Next: Qwen3.5-MoE's layers with each key head's q, k, v, z (and b, a) side by side in one projection,
# two value heads per key head; MoE on every layer but the second (mlp_only_layers), a dense MLP there.
CASES["qwen3_next_f32"] = (Qwen3NextConfig, dict(
    hidden_size=32, intermediate_size=24, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, vocab_size=259, max_position_embeddings=256, rms_norm_eps=1e-6,
    layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=12, linear_num_key_heads=2,
    linear_num_value_heads=4, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
    shared_expert_intermediate_size=24, mlp_only_layers=[1], norm_topk_prob=True,
    rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
    tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0), 129, torch.float32)


# ---------------------------------------------------------------- helpers
def f32_bytes(t: torch.Tensor) -> bytes:
    return np.ascontiguousarray(t.detach().to(torch.float32).cpu().numpy(), dtype="<f4").tobytes()


def floats(t: torch.Tensor) -> list:
    """float32 tensor -> nested lists of Python floats (exact as double)."""
    return t.detach().to(torch.float32).cpu().numpy().astype(np.float64).tolist()


def max_rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    a, ref = a.float(), ref.float()
    return float(((a - ref).abs().amax(-1) / ref.abs().amax(-1)).max())


EXPERT_GAIN = {"gpt_oss_f32": 8.0}  # gate_up_proj's scale, times the usual


def randomize(model: torch.nn.Module, seed: int, expert_gain: float = 1.0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                assert p.dim() == 1, name
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(".sinks"):  # gpt-oss: logits beside the scores, of their size
                p.copy_(torch.randn(p.shape, generator=g))
            elif name.endswith(".A_log"):  # Gated DeltaNet: decay rates in [1, 16), as trained
                p.copy_(torch.empty(p.shape).uniform_(1, 16, generator=g).log())
            elif name.endswith(".dt_bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            else:
                assert p.dim() >= 2, name
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
                if name.endswith("mlp.experts.gate_up_proj"):  # gpt-oss: past the SwiGLU clamp
                    p.mul_(expert_gain)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))


def exact_gated_delta_rule(query, key, value, g, beta, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, **kwargs):
    """Gated DeltaNet's recurrence token by token in float64, for transformers' two float32 kernels
    (chunked for a prompt, recurrent for a token), which differ from one another by ~1e-7 per layer
    and ~2e-5 in these models' logits. Same arguments and layout ([batch, tokens, heads, dim])."""
    ratio = value.shape[2] // key.shape[2]
    q, k = (x.repeat_interleave(ratio, dim=2) for x in (query, key))
    q, k, v, b, decay = (x.transpose(1, 2).to(torch.float64) for x in (q, k, value, beta, g))
    if use_qk_l2norm_in_kernel:
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q = q / q.shape[-1] ** 0.5
    batch, heads, tokens, dk = k.shape
    state = (torch.zeros(batch, heads, dk, v.shape[-1], dtype=torch.float64) if initial_state is None
             else initial_state.to(torch.float64))
    out = torch.zeros_like(v)
    for t in range(tokens):
        state = state * decay[:, :, t].exp()[..., None, None]
        kv = (state * k[:, :, t, :, None]).sum(-2)
        state = state + k[:, :, t, :, None] * ((v[:, :, t] - kv) * b[:, :, t, None])[..., None, :]
        out[:, :, t] = (state * q[:, :, t, :, None]).sum(-2)
    return out.transpose(1, 2).to(value.dtype), state if output_final_state else None


# Cases whose logits come from the model run in float64: a small random MoE with linear attention
# turns float32 rounding into ~4e-5 of its logits (transformers' own float32 run is that far from
# its float64 one), too close to the tolerance to tell rounding from a fault.
REFERENCE_DTYPE = {"qwen3_5_f32": torch.float64, "qwen3_5_moe_f32": torch.float64,
                   "qwen3_next_f32": torch.float64}

for _module in (transformers.models.qwen3_5.modeling_qwen3_5, transformers.models.qwen3_5_moe.modeling_qwen3_5_moe,
                transformers.models.qwen3_next.modeling_qwen3_next):
    _module.torch_chunk_gated_delta_rule = exact_gated_delta_rule
    _module.torch_recurrent_gated_delta_rule = exact_gated_delta_rule


def load(folder: Path, dtype: torch.dtype):
    # transformers' grouped expert products take no float64; its loop over the experts does.
    extra = {"experts_implementation": "eager"} if dtype == torch.float64 else {}
    m = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, attn_implementation="eager", **extra)
    m.eval()
    m.generation_config.eos_token_id = None  # greedy runs the full 8 steps
    m.generation_config.pad_token_id = 0
    return m


@torch.no_grad()
def full_logits(model, ids: list[int]) -> torch.Tensor:
    x = torch.tensor([ids])
    return model(input_ids=x, attention_mask=torch.ones_like(x)).logits[0]


@torch.no_grad()
def greedy(model, ids: list[int]) -> list[int]:
    x = torch.tensor([ids])
    out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False,
                         max_new_tokens=NEW_TOKENS, min_new_tokens=0, eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist()


def greedy_margins(model, ids: list[int], gen: list[int]) -> tuple[list[float], bool]:
    """top1 - top2 logit at each generated step from one full forward over prompt + gen,
    and whether that forward's argmax chain reproduces gen (cache path == full path)."""
    lg = full_logits(model, ids + gen[:-1])[len(ids) - 1:]
    top = lg.float().topk(2, dim=-1)
    margins = (top.values[:, 0] - top.values[:, 1]).tolist()
    return margins, top.indices[:, 0].tolist() == gen


def round_to_int8_blocks(x: torch.Tensor) -> torch.Tensor:
    """x with each 32-element block of its last dimension rounded to int8 codes times
    max|block| / 127, in float32 as the engine's activation quantizer computes it."""
    blocks = x.reshape(*x.shape[:-1], x.shape[-1] // 32, 32)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    inverse = torch.where(amax != 0, 127.0 / amax, torch.zeros_like(amax))
    codes = torch.round(blocks * inverse)  # half to even
    return (codes * (amax / 127.0)).reshape(x.shape)


@contextlib.contextmanager
def int8_inputs(model, decoded: dict):
    """Within: every linear product (F.linear, or `@` with the weight on the right: gpt-oss's
    experts) with a weight of `decoded` (checkpoint names; a fused experts parameter counts
    when all its experts' weights are there) whose input is whole 32-element blocks takes its
    input through round_to_int8_blocks."""
    storages, hooked = set(), set()
    for name, p in model.named_parameters():
        if name in decoded:
            storages.add(p.untyped_storage().data_ptr())
            hooked.add(name)
        elif name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            prefix, fused = name.rsplit(".", 1)
            parts = ("gate_proj", "up_proj") if fused == "gate_up_proj" else ("down_proj",)
            names = [f"{prefix}.{e}.{part}.weight" for e in range(p.shape[0]) for part in parts]
            held = sum(n in decoded for n in names)
            assert held in (0, len(names)), name
            if held:
                storages.add(p.untyped_storage().data_ptr())
                hooked.add(name)
    assert storages
    # Matched by storage: no other parameter may share one (a tied weight would be hooked too).
    for name, p in model.named_parameters():
        assert name in hooked or p.untyped_storage().data_ptr() not in storages, name
    # Experts run their eager loop of linear products, not a fused kernel.
    configs = {id(m.config): m.config for m in model.modules()
               if hasattr(m, "config") and hasattr(m.config, "_experts_implementation")}
    experts = {key: c._experts_implementation for key, c in configs.items()}
    for c in configs.values():
        c._experts_implementation = "eager"
    linear, matmul = torch.nn.functional.linear, torch.Tensor.__matmul__

    def rounded(x, weight):
        held = isinstance(weight, torch.Tensor) and weight.untyped_storage().data_ptr() in storages
        return round_to_int8_blocks(x) if held and x.shape[-1] % 32 == 0 else x

    torch.nn.functional.linear = lambda x, weight, bias=None: linear(rounded(x, weight), weight, bias)
    torch.Tensor.__matmul__ = lambda x, weight: matmul(rounded(x, weight), weight)
    try:
        yield
    finally:
        torch.nn.functional.linear = linear
        torch.Tensor.__matmul__ = matmul
        for key, c in configs.items():
            c._experts_implementation = experts[key]


def tensor_list(folder: Path) -> list[dict]:
    out = []
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        for k in sorted(f.keys()):
            sl = f.get_slice(k)
            out.append({"name": k, "dtype": sl.get_dtype(), "shape": list(sl.get_shape())})
    return out


# ---------------------------------------------------------------- routing
def choice_margin(choice: torch.Tensor, k: int) -> torch.Tensor:
    s = choice.sort(dim=-1, descending=True).values
    return s[:, k - 1] - s[:, k]


def route_reference(kind: str, gate, x: torch.Tensor):
    """Independent recomputation, only used for margins and as a cross-check of ids."""
    logits = x.float() @ gate.weight.float().t()
    k = gate.top_k
    if kind == "softmax":
        choice = logits.softmax(-1)
        return choice, choice_margin(choice, k), None
    scores = logits.sigmoid()
    choice = scores + gate.e_score_correction_bias
    n_group = gate.num_group
    per = choice.shape[-1] // n_group
    gs = choice.view(-1, n_group, per).topk(min(2, per), dim=-1).values.sum(-1)
    # every group kept (GLM-4.5's one group): no group choice to be near a tie
    g_margin = (choice_margin(gs, gate.topk_group) if gate.topk_group < n_group
                else torch.full((gs.shape[0],), float("inf")))
    keep = torch.zeros_like(gs, dtype=torch.bool)
    keep.scatter_(1, gs.topk(gate.topk_group, dim=-1).indices, True)
    masked = choice.masked_fill(~keep.repeat_interleave(per, dim=1), float("-inf"))
    e_margin = choice_margin(masked, k)
    groups = [sorted(r) for r in gs.topk(gate.topk_group, dim=-1).indices.tolist()]
    return masked, torch.minimum(g_margin, e_margin), groups


@torch.no_grad()
def routing_golden(name: str, model, cfg, seed: int) -> dict:
    mt = cfg.model_type
    kind = "sigmoid_grouped" if mt in ("deepseek_v3", "glm4_moe") else "softmax"
    g = torch.Generator().manual_seed(seed + 7000)
    layers = []
    for li, layer in enumerate(model.model.layers):
        mlp = layer.mlp
        gate = getattr(mlp, "gate", None)
        if gate is None or not hasattr(gate, "top_k"):
            continue  # dense layer (DeepSeek's first_k_dense_replace)
        hidden = cfg.hidden_size
        rows, skipped = [], 0
        while len(rows) < ROUTING_TOKENS:
            x = torch.randn(1, hidden, generator=g)
            _, margin, _ = route_reference(kind, gate, x)
            if float(margin[0]) < MIN_ROUTING_MARGIN:
                skipped += 1
                continue
            rows.append(x)
        x = torch.cat(rows)
        router_logits, weights, ids = gate(x)          # transformers' router module
        moe_out = mlp(x.view(1, ROUTING_TOKENS, hidden))[0]  # the whole MoE block
        choice, margin, groups = route_reference(kind, gate, x)
        # list each token's experts by descending choice score (prob, or sigmoid + bias)
        order = torch.gather(choice, 1, ids).argsort(dim=-1, descending=True)
        ids = torch.gather(ids, 1, order)
        weights = torch.gather(weights.float(), 1, order)
        ref_ids = choice.topk(gate.top_k, dim=-1).indices
        assert ids.tolist() == ref_ids.tolist(), (name, li)
        entry = {
            "layer": li,
            "gate_weight_tensor": f"model.layers.{li}.{'block_sparse_moe' if mt == 'mixtral' else 'mlp'}.gate.weight",
            "gate_weight_shape": list(gate.weight.shape),
            "gate_weight_b64": b64(f32_bytes(gate.weight)),
        }
        if kind == "sigmoid_grouped":
            entry["e_score_correction_bias_tensor"] = f"model.layers.{li}.mlp.gate.e_score_correction_bias"
            entry["e_score_correction_bias"] = floats(gate.e_score_correction_bias)
            unbiased = torch.sigmoid(router_logits).topk(gate.top_k, dim=-1).indices.sort(-1).values
            entry["bias_changes_selection"] = int((unbiased != ids.sort(-1).values).any(-1).sum())
            entry["selected_groups"] = groups
        entry.update({
            "n_tokens": ROUTING_TOKENS,
            "skipped_near_ties": skipped,
            "inputs": floats(x),
            "router_logits": floats(router_logits),
            "ids": ids.tolist(),
            "weights": floats(weights),
            "min_margin": float(margin.min()),
            "moe_output": floats(moe_out),
        })
        layers.append(entry)
    if kind == "softmax":
        rule = ("p = softmax(x @ W^T) in float32; take the top_k p (descending); "
                + ("renormalize them to sum 1" if getattr(cfg, "norm_topk_prob", True) else "no renormalization"))
        moe_layer = model.model.layers[layers[0]["layer"]].mlp
    else:
        rule = ("s = sigmoid(x @ W^T) in float32; c = s + e_score_correction_bias; group score = sum of the top-2 "
                "c in each of n_group groups of consecutive experts; keep the topk_group best groups; take the "
                "top_k c among experts of kept groups; weight = s of those experts / (sum + 1e-20) * "
                "routed_scaling_factor")
        moe_layer = model.model.layers[layers[0]["layer"]].mlp
    return {
        "producer": PRODUCER,
        "case": name,
        "model_type": mt,
        "oracle": f"transformers {type(moe_layer.gate).__name__}.forward (router_logits, ids, weights) and "
                  f"{type(moe_layer).__name__}.forward (moe_output)",
        "rule": rule,
        "params": {
            "num_experts": getattr(cfg, "num_local_experts", None) or getattr(cfg, "num_experts", None)
                           or cfg.n_routed_experts,
            "top_k": cfg.num_experts_per_tok,
            "norm_topk_prob": bool(getattr(cfg, "norm_topk_prob", True)),
            "scoring": "sigmoid" if kind != "softmax" else "softmax",
            "n_group": getattr(cfg, "n_group", None) if kind != "softmax" else None,
            "topk_group": getattr(cfg, "topk_group", None) if kind != "softmax" else None,
            "routed_scaling_factor": getattr(cfg, "routed_scaling_factor", None) if kind != "softmax" else None,
            "n_shared_experts": getattr(cfg, "n_shared_experts", None) if kind != "softmax" else None,
        },
        "order": "each token's ids/weights by descending choice score (softmax prob, or sigmoid + bias)",
        "min_margin_note": f"inputs whose k-th and (k+1)-th choice scores (and, for grouped routing, group "
                           f"scores) differ by < {MIN_ROUTING_MARGIN} were skipped",
        "layers": layers,
    }


# ---------------------------------------------------------------- main
def draw_prompts(model, vocab: int, seed: int) -> tuple[list[list[int]], int]:
    g = torch.Generator().manual_seed(seed + 5000)
    redraws = 0
    while True:
        prompts = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]
        ok = True
        for ids in prompts:
            gen = greedy(model, ids)
            m, same = greedy_margins(model, ids, gen)
            ok = ok and same and min(m) >= MIN_GREEDY_MARGIN
        if ok:
            return prompts, redraws
        redraws += 1


def prompt_entries(model, vocab: int, seed: int) -> tuple[list[dict], int]:
    """Prompts drawn for `model` (draw_prompts), each with its logits at every position and
    its greedy continuation; and the redraws it took."""
    prompts, redraws = draw_prompts(model, vocab, seed)
    entries = []
    for ids in prompts:
        raw = f32_bytes(full_logits(model, ids))
        gen = greedy(model, ids)
        margins, _ = greedy_margins(model, ids, gen)
        entries.append({"ids": ids, "len": len(ids), "logits_shape": [len(ids), vocab], "logits_b64": b64(raw),
                        "logits_fnv1a64": fnv1a64(raw), "greedy_next": gen, "greedy_margins": margins})
    return entries, redraws


def run_case(name: str, cls, kwargs: dict, seed: int, wdtype) -> None:
    d = OUT / name
    if d.exists():
        shutil.rmtree(d)
    cfg = cls(**kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="eager")
    randomize(model, seed, EXPERT_GAIN.get(name, 1.0))
    quant = wdtype if isinstance(wdtype, str) else None
    if quant:
        wdtype = torch.float32
    elif wdtype != torch.float32:
        model = model.to(wdtype)
        model.config.dtype = wdtype
    model.save_pretrained(str(d), safe_serialization=True)
    del model
    if quant:
        # transformers cannot run these formats on the CPU: run what the stored bytes decode to
        decoded = quantize_checkpoint(d, quant)
        with tempfile.TemporaryDirectory() as tmp:
            write_decoded_checkpoint(d, Path(tmp), decoded)
            f32 = load(Path(tmp), torch.float32)
    else:
        f32 = load(d, REFERENCE_DTYPE.get(name, torch.float32))   # bf16 weights are upcast exactly
    lo = load(d, wdtype) if wdtype != torch.float32 else None
    cfg = f32.config
    vocab = cfg.vocab_size
    assert vocab % 64 != 0, name
    with int8_inputs(f32, decoded) if quant in INT8_INPUT_KINDS else contextlib.nullcontext():
        entries, redraws = prompt_entries(f32, vocab, seed)
    worst = 0.0
    for e in entries if lo is not None else []:
        lg = torch.frombuffer(bytearray(b64decode(e["logits_b64"])), dtype=torch.float32).reshape(
            e["logits_shape"])
        lb = full_logits(lo, e["ids"])
        rawb = f32_bytes(lb)
        worst = max(worst, max_rel(lb, lg))
        e.update({"logits_bf16_compute_b64": b64(rawb), "logits_bf16_compute_fnv1a64": fnv1a64(rawb),
                  "greedy_next_bf16_compute": greedy(lo, e["ids"])})
    saved_cfg = json.loads((d / "config.json").read_text())
    doc = {
        "producer": PRODUCER,
        "case": name,
        "model_type": cfg.model_type,
        "architecture_class": type(f32).__name__,
        "config_dtype": saved_cfg.get("dtype"),
        "weights_dtype": quant or str(wdtype).replace("torch.", ""),
        "compute_dtype": str(REFERENCE_DTYPE.get(name, torch.float32)).replace("torch.", ""),
        "attn_implementation": "eager",
        "transformers_version": pkg_version("transformers"),
        "torch_version": torch.__version__,
        "seed": seed,
        "vocab_size": vocab,
        **({"activations": "rounded to int8 per 32-element block (round_to_int8_blocks) at the input "
                           "of each quantized layer whose input is whole blocks"}
           if quant in INT8_INPUT_KINDS else {}),
        "tolerance": {"metric": TOLERANCE["metric"],
                      "max_rel": TOLERANCE["int8_inputs"] if quant in INT8_INPUT_KINDS
                      else TOLERANCE["float32"] if wdtype == torch.float32 else TOLERANCE["bfloat16"]},
        "greedy": {"max_new_tokens": NEW_TOKENS, "eos": "ignored (eos_token_id=None)",
                   "min_margin_required": MIN_GREEDY_MARGIN, "prompt_redraws": redraws},
        "tensors": tensor_list(d),
        "prompts": entries,
    }
    if lo is not None:
        doc["bf16_compute"] = {
            "note": "logits_b64 / greedy_next: the bf16 weights upcast to float32 and run in float32 "
                    "(an engine computing in float32 should reach 1e-4); *_bf16_compute: "
                    "transformers with the model in bfloat16 (model.to(torch.bfloat16))",
            "max_rel_vs_float32_compute": worst,
            "max_rel_float32_compute": TOLERANCE["float32"],
        }
    write_json(d / "logits.json", doc)
    if cfg.model_type in ("mixtral", "qwen3_moe", "deepseek_v3", "glm4_moe"):
        rt = routing_golden(name, f32, cfg, seed)
        names = {t["name"] for t in doc["tensors"]}
        for layer in rt["layers"]:
            assert layer["gate_weight_tensor"] in names, layer["gate_weight_tensor"]
            assert layer.get("e_score_correction_bias_tensor", layer["gate_weight_tensor"]) in names
        write_json(d / "routing.json", rt)
    size = sum(p.stat().st_size for p in d.rglob("*") if p.is_file())
    assert size < MAX_FOLDER_BYTES, (name, size)
    print(f"  {name}: vocab {vocab}, {size / 1024:.0f} KiB, redraws {redraws}"
          + (f", bf16 vs f32 compute {worst:.2e}" if lo is not None else ""))


def main(argv: list[str]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, (cls, kwargs, seed, wdtype) in CASES.items():
        if argv and name not in argv:
            continue
        run_case(name, cls, kwargs, seed, wdtype)


if __name__ == "__main__":
    main(sys.argv[1:])
