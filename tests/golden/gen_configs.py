#!/usr/bin/env python3
"""Model config.json goldens.

For every case writes tests/golden/data/configs/<name>/:
  config.json                  the file in the layout published checkpoints use
                               (top-level rope_theta / rope_scaling, per-family
                               key names such as num_experts or n_routed_experts)
  transformers_v5/config.json  the same config as the installed transformers
                               writes it with save_pretrained (rope_theta and
                               rope_scaling folded into rope_parameters)
  expected.json                normalized values Cleave should derive

Oracle: transformers' AutoConfig. Both files are loaded back with
AutoConfig.from_pretrained and every expected value is read from the loaded
config object; the two layouts must give identical values. Where the config
object has no attribute because the modeling code hard-wires a behaviour
(Qwen2's q/k/v bias, Mixtral's softmax router that always renormalizes its
top-k) the value comes from that modeling code, is checked against its source
text below, and is listed under "from_modeling_code".
No weights and no torch are needed.
"""
from __future__ import annotations

import json
import logging
import shutil
import sys
from pathlib import Path

import transformers
from transformers import AutoConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA_DIR, pkg_version, write_json  # noqa: E402

OUT = DATA_DIR / "configs"
transformers.logging.set_verbosity_error()
logging.getLogger("transformers").setLevel(logging.ERROR)

LLAMA_COMMON = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
                "initializer_range": 0.02, "pretraining_tp": 1, "use_cache": True, "attention_bias": False,
                "attention_dropout": 0.0, "mlp_bias": False}

CASES: dict[str, dict] = {
    # Llama 2 style: no num_key_value_heads, no rope_theta (both must default).
    "llama2": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": 96, "intermediate_size": 260, "num_hidden_layers": 3, "num_attention_heads": 6,
        "vocab_size": 32000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-05,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "tie_word_embeddings": False,
        "rope_scaling": None, "torch_dtype": "float16", "initializer_range": 0.02,
        "pretraining_tp": 1, "use_cache": True,
    },
    "llama3_rope": {
        **LLAMA_COMMON,
        "hidden_size": 128, "intermediate_size": 448, "num_hidden_layers": 2, "num_attention_heads": 8,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128256, "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
        "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    "llama_yarn": {
        **LLAMA_COMMON,
        "hidden_size": 120, "intermediate_size": 336, "num_hidden_layers": 2, "num_attention_heads": 5,
        "num_key_value_heads": 5, "vocab_size": 32000, "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192,
                         "beta_fast": 32.0, "beta_slow": 1.0},
        "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    },
    "smollm2_135m": {
        **LLAMA_COMMON,
        "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
        "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152, "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-05, "rope_theta": 100000, "rope_scaling": None,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    },
    "qwen2": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
        "hidden_size": 112, "intermediate_size": 320, "num_hidden_layers": 2, "num_attention_heads": 7,
        "num_key_value_heads": 1, "vocab_size": 151936, "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
        "use_sliding_window": False, "max_window_layers": 21, "bos_token_id": 151643,
        "eos_token_id": 151645, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
    },
    "qwen3": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_act": "silu",
        "hidden_size": 80, "intermediate_size": 200, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 151936, "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000, "rope_scaling": None, "attention_bias": False,
        "sliding_window": None, "use_sliding_window": False, "max_window_layers": 2,
        "bos_token_id": 151643, "eos_token_id": 151645, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16", "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
    },
    # Mistral 7B v0.1: a 4096-position window on every layer.
    "mistral_7b_v01": {
        "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_act": "silu",
        "hidden_size": 64, "intermediate_size": 224, "num_hidden_layers": 3, "num_attention_heads": 4,
        "num_key_value_heads": 1, "vocab_size": 32000, "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
        "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
    },
    # Mistral-Nemo / Small: no window (null), head_dim set apart from hidden / heads.
    "mistral_nemo": {
        "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_act": "silu",
        "hidden_size": 80, "intermediate_size": 224, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 131072, "max_position_embeddings": 1024000,
        "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": None,
        "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
    },
    # No sliding_window key at all: transformers' MistralConfig default (4096).
    "mistral_window_default": {
        "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_act": "silu",
        "hidden_size": 64, "intermediate_size": 224, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 4, "vocab_size": 32768, "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "bos_token_id": 1, "eos_token_id": 2,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    },
    # Phi-3-mini-4k: fused qkv_proj / gate_up_proj, a 2047-position window on every layer.
    "phi3_mini_4k": {
        "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_act": "silu",
        "hidden_size": 96, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 4, "vocab_size": 32064, "max_position_embeddings": 4096,
        "original_max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
        "rope_scaling": None, "sliding_window": 2047, "bos_token_id": 1, "eos_token_id": 32000,
        "pad_token_id": 32000, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "attention_dropout": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0, "initializer_range": 0.02,
        "use_cache": True,
    },
    # Phi-4: no window, grouped KV heads.
    "phi4": {
        "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_act": "silu",
        "hidden_size": 80, "intermediate_size": 224, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 100352, "max_position_embeddings": 16384,
        "original_max_position_embeddings": 16384, "rms_norm_eps": 1e-05, "rope_theta": 250000,
        "rope_scaling": None, "sliding_window": None, "bos_token_id": 100257, "eos_token_id": 100265,
        "pad_token_id": 100349, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "attention_dropout": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0, "initializer_range": 0.02,
        "use_cache": True,
    },
    "mixtral": {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_act": "silu",
        "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 32000, "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": None,
        "num_local_experts": 8, "num_experts_per_tok": 2, "output_router_logits": False,
        "router_aux_loss_coef": 0.02, "bos_token_id": 1, "eos_token_id": 2,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "attention_dropout": 0.0,
        "initializer_range": 0.02, "use_cache": True,
    },
    "qwen3_moe": {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_act": "silu",
        "hidden_size": 64, "intermediate_size": 192, "moe_intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 151936,
        "max_position_embeddings": 40960, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
        "rope_scaling": None, "attention_bias": False, "num_experts": 16, "num_experts_per_tok": 4,
        "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "output_router_logits": False, "router_aux_loss_coef": 0.001, "sliding_window": None,
        "use_sliding_window": False, "max_window_layers": 2, "bos_token_id": 151643,
        "eos_token_id": 151645, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
    },
    "deepseek_v3": {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_act": "silu",
        "hidden_size": 96, "intermediate_size": 256, "moe_intermediate_size": 32, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 129280,
        "max_position_embeddings": 163840, "rms_norm_eps": 1e-06, "rope_theta": 10000,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                         "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"},
        "n_routed_experts": 16, "num_experts_per_tok": 4, "n_group": 4, "topk_group": 2,
        "n_shared_experts": 1, "routed_scaling_factor": 2.5, "first_k_dense_replace": 1,
        "moe_layer_freq": 1, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "norm_topk_prob": True,
        "q_lora_rank": 48, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
        "v_head_dim": 16, "num_nextn_predict_layers": 1, "ep_size": 1, "aux_loss_alpha": 0.001,
        "seq_aux": True, "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "initializer_range": 0.02, "use_cache": True,
    },
    # gpt-oss-20b as OpenAI publishes it (the MXFP4 quantization_config included): sliding and
    # full attention layers alternating, experts_per_token next to num_experts_per_tok, YaRN
    # without truncation.
    "gpt_oss_20b": {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "attention_bias": True,
        "attention_dropout": 0.0, "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64,
        "hidden_act": "silu", "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
        "intermediate_size": 2880,
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(24)],
        "max_position_embeddings": 131072, "num_attention_heads": 64, "num_experts_per_tok": 4,
        "num_hidden_layers": 24, "num_key_value_heads": 8, "num_local_experts": 32,
        "output_router_logits": False, "pad_token_id": 199999,
        "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                           "model.embed_tokens", "lm_head"],
                                "quant_method": "mxfp4"},
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                         "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False},
        "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
        "tie_word_embeddings": False, "use_cache": True, "vocab_size": 201088,
    },
    # GLM-4.5-Air as published: DeepSeek-V3's routing (sigmoid, correction bias, one group),
    # a shared expert and a dense first layer, on grouped-query attention with Q/K/V biases,
    # rotary embedding on half of each head, and one multi-token-prediction layer (not run).
    "glm45_air": {
        "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "attention_bias": True,
        "attention_dropout": 0.0, "pad_token_id": 151329, "eos_token_id": [151329, 151336, 151338],
        "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "partial_rotary_factor": 0.5,
        "initializer_range": 0.02, "intermediate_size": 10944, "max_position_embeddings": 131072,
        "moe_intermediate_size": 1408, "norm_topk_prob": True, "num_attention_heads": 96, "n_group": 1,
        "topk_group": 1, "n_routed_experts": 128, "n_shared_experts": 1, "routed_scaling_factor": 1.0,
        "num_experts_per_tok": 8, "first_k_dense_replace": 1, "num_hidden_layers": 46,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 1000000,
        "num_nextn_predict_layers": 1, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "use_cache": True, "use_qk_norm": False, "vocab_size": 151552,
    },
    # Gemma 3 1B as published (a text model): five sliding layers to one global by
    # sliding_window_pattern, the local rotary base as rope_local_base_freq.
    "gemma3_1b": {
        "architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "attn_logit_softcapping": None, "bos_token_id": 2, "cache_implementation": "hybrid",
        "eos_token_id": [1, 106], "final_logit_softcapping": None, "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "initializer_range": 0.02,
        "intermediate_size": 6912, "max_position_embeddings": 32768, "model_type": "gemma3_text",
        "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1, "pad_token_id": 0,
        "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000,
        "rope_scaling": None, "rope_theta": 1000000, "sliding_window": 512, "sliding_window_pattern": 6,
        "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 262144,
    },
    # Gemma 3 4B as published (multimodal): the text model's config under text_config naming
    # five fields, the rest transformers' defaults; linear rope scaling on the global layers.
    "gemma3_4b": {
        "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
        "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
        "initializer_range": 0.02, "mm_tokens_per_image": 256, "model_type": "gemma3",
        "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                        "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                        "sliding_window": 1024},
        "torch_dtype": "bfloat16",
        "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                          "model_type": "siglip_vision_model", "num_attention_heads": 16,
                          "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": False},
    },
    # Not a decoder family Cleave serves: the loader must reject it cleanly.
    "gpt2_unsupported": {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "activation_function": "gelu_new",
        "n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 256, "n_ctx": 256, "vocab_size": 1000,
        "layer_norm_epsilon": 1e-05, "bos_token_id": 999, "eos_token_id": 999,
        "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1, "initializer_range": 0.02,
    },
}

SUPPORTED = {"llama", "mistral", "phi3", "qwen2", "qwen3", "mixtral", "qwen3_moe", "deepseek_v3", "gpt_oss",
             "glm4_moe", "gemma3", "gemma3_text"}

MODELING_FACTS = {
    # model_type: (file, must-contain snippet, facts)
    "qwen2": ("qwen2/modeling_qwen2.py",
              ["self.q_proj = nn.Linear(config.hidden_size, config.num_attention_heads * self.head_dim, bias=True)"],
              {"attention_bias": True}),
    "mistral": ("mistral/modeling_mistral.py",
                ["self.q_proj = nn.Linear(config.hidden_size, config.num_attention_heads * self.head_dim, bias=False)",
                 "sliding_window=getattr(self.config, \"sliding_window\", None)"],
                {"attention_bias": False}),
    "phi3": ("phi3/modeling_phi3.py",
             ["self.qkv_proj = nn.Linear(config.hidden_size, op_size, bias=False)",
              "gate, up_states = up_states.chunk(2, dim=-1)",
              "sliding_window=getattr(self.config, \"sliding_window\", None)"],
             {"attention_bias": False}),
    "mixtral": ("mixtral/modeling_mixtral.py",
                ["router_top_value /= router_top_value.sum(dim=-1, keepdim=True)",
                 "router_probs = torch.nn.functional.softmax(router_logits.float(), dim=-1)",
                 "self.intermediate_dim = config.intermediate_size",
                 "self.q_proj = nn.Linear(config.hidden_size, config.num_attention_heads * self.head_dim, bias=False)"],
                {"norm_topk_prob": True, "scoring": "softmax", "attention_bias": False,
                 "moe_intermediate_size": "intermediate_size"}),
    "gpt_oss": ("gpt_oss/modeling_gpt_oss.py",
                ["router_scores = torch.nn.functional.softmax(router_top_value, dim=1, dtype=router_top_value.dtype)",
                 "self.intermediate_size = config.intermediate_size",
                 "self.sinks = nn.Parameter(torch.empty(config.num_attention_heads))",
                 "config.num_attention_heads * self.head_dim, config.hidden_size, bias=config.attention_bias"],
                {"norm_topk_prob": True, "scoring": "softmax", "moe_intermediate_size": "intermediate_size",
                 "attention_sinks": True, "o_proj_bias": "attention_bias"}),
    "glm4_moe": ("glm4_moe/modeling_glm4_moe.py",
                 ["scores = router_logits.sigmoid()",
                  "q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]",
                  "if self.use_qk_norm:"],
                 {"scoring": "sigmoid"}),
    "qwen3_moe": ("qwen3_moe/modeling_qwen3_moe.py",
                  ["router_probs = torch.nn.functional.softmax(router_logits, dtype=torch.float, dim=-1)"],
                  {"scoring": "softmax"}),
}


def _modeling_source(rel: str) -> str:
    return (Path(transformers.__file__).parent / "models" / rel).read_text()


def derive(cfg, name: str, raw: dict) -> dict:
    mt = cfg.model_type
    outer = cfg
    if mt == "gemma3":  # multimodal: the text model's config, the top level's token ids
        cfg = cfg.get_text_config()
    e: dict = {"architecture": mt, "cleave_supported": mt in SUPPORTED}
    if mt not in SUPPORTED:
        # gpt2 uses its own names; report what the object exposes through its attribute_map
        e.update({"hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.num_hidden_layers,
                  "num_attention_heads": cfg.num_attention_heads, "vocab_size": cfg.vocab_size})
        return e
    heads = cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None)
    head_dim = getattr(cfg, "head_dim", None)
    rp = dict(getattr(cfg, "rope_parameters", None) or {})
    gemma = mt in ("gemma3", "gemma3_text")
    if gemma:  # per layer type: the global layers' rotation here, the sliding ones' below
        rp = dict(rp["full_attention"])
    e.update({
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv if kv is not None else heads,
        "head_dim": head_dim if head_dim is not None else cfg.hidden_size // heads,
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": float(cfg.rms_norm_eps),
        "rope_theta": float(rp["rope_theta"]),
        "rope_type": rp.get("rope_type", rp.get("type")),
        # as written in config.json (null when absent / null there)
        "rope_scaling": rp if gemma else raw.get("rope_scaling"),
        # the oracle's normalized view: scaling fields plus rope_theta and rope_type
        "rope_parameters": rp,
        "tie_word_embeddings": bool(cfg.tie_word_embeddings),
        "bos_token_id": outer.bos_token_id if getattr(outer, "bos_token_id", None) is not None else cfg.bos_token_id,
        "eos_token_id": outer.eos_token_id if getattr(outer, "eos_token_id", None) is not None else cfg.eos_token_id,
        "attention_bias": getattr(cfg, "attention_bias", None),
        # the leading dimensions of each head that rotate, as the rotary embedding class sizes them
        "rotary_dim": int((head_dim if head_dim is not None else cfg.hidden_size // heads)
                          * rp.get("partial_rotary_factor", 1.0)),
    })
    if mt == "glm4_moe":
        e["qk_norm"] = cfg.use_qk_norm
    if gemma:
        src = _modeling_source("gemma3/modeling_gemma3.py")
        for snippet in ["embed_scale=self.config.hidden_size**0.5", "output * (1.0 + self.weight.float())",
                        "self.scaling = config.query_pre_attn_scalar**-0.5",
                        "hidden_states = self.post_feedforward_layernorm(hidden_states)"]:
            assert snippet in src, f"modeling code changed: {snippet}"
        e.update({"qk_norm": True, "embedding_scale": cfg.hidden_size ** 0.5, "sandwich_norms": True,
                  "hidden_activation": cfg.hidden_activation,
                  "query_pre_attn_scalar": cfg.query_pre_attn_scalar,
                  "sliding_rope_theta": float(cfg.rope_parameters["sliding_attention"]["rope_theta"]),
                  "final_logit_softcapping": cfg.final_logit_softcapping,
                  "sliding_window": cfg.sliding_window, "layer_types": list(cfg.layer_types)})
    moe = {k: None for k in ["num_experts", "experts_per_token", "moe_intermediate_size", "norm_topk_prob",
                             "shared_experts", "scoring", "n_group", "topk_group",
                             "routed_scaling_factor", "first_k_dense_replace"]}
    n_exp = getattr(cfg, "n_routed_experts", None) or getattr(cfg, "num_local_experts", None)
    if n_exp:
        moe.update({
            "num_experts": n_exp,
            "experts_per_token": cfg.num_experts_per_tok,
            "moe_intermediate_size": getattr(cfg, "moe_intermediate_size", None),
            "norm_topk_prob": getattr(cfg, "norm_topk_prob", None),
            "shared_experts": getattr(cfg, "n_shared_experts", None) or 0,
            "scoring": getattr(cfg, "scoring_func", None),
            "n_group": getattr(cfg, "n_group", None),
            "topk_group": getattr(cfg, "topk_group", None),
            "routed_scaling_factor": getattr(cfg, "routed_scaling_factor", None),
            "first_k_dense_replace": getattr(cfg, "first_k_dense_replace", None),
        })
        if mt == "qwen3_moe":
            moe["decoder_sparse_step"] = cfg.decoder_sparse_step
            moe["mlp_only_layers"] = list(cfg.mlp_only_layers)
        if mt == "deepseek_v3":
            moe["topk_method"] = getattr(cfg, "topk_method", None)
    e["moe"] = moe
    from_code = {}
    if mt in MODELING_FACTS:
        rel, snippets, facts = MODELING_FACTS[mt]
        src = _modeling_source(rel)
        for snippet in snippets:
            assert snippet in src, f"modeling code changed: {rel}: {snippet}"
        for k, v in facts.items():
            if v == "intermediate_size":  # experts sized by the dense field
                v = cfg.intermediate_size
            elif v == "attention_bias":  # gpt-oss: O has a bias when Q/K/V have one
                v = cfg.attention_bias
            tgt = e["moe"] if k in moe else e
            if tgt.get(k) is None:
                tgt[k] = v
                from_code[k] = f"transformers/models/{rel}"
    e["from_modeling_code"] = from_code
    if mt == "gpt_oss":
        e["sliding_window"] = cfg.sliding_window
        e["layer_types"] = list(cfg.layer_types)
        e["swiglu_limit"] = cfg.swiglu_limit
        e["swiglu_alpha"] = cfg.swiglu_alpha
        e["rope_truncate"] = rp.get("truncate", True)
    if mt in ("mistral", "phi3"):  # every layer attends to the window, when there is one
        e["sliding_window"] = cfg.sliding_window
        e["layer_types"] = [("sliding_attention" if cfg.sliding_window else "full_attention")
                            for _ in range(cfg.num_hidden_layers)]
    e["mla"] = mt == "deepseek_v3"
    if mt == "deepseek_v3":
        e["mla_dims"] = {k: getattr(cfg, k) for k in
                         ["q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                          "v_head_dim", "qk_head_dim"]}
    return e


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, raw in CASES.items():
        d = OUT / name
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
        cfg = AutoConfig.from_pretrained(str(d))
        exp = derive(cfg, name, raw)
        v5 = d / "transformers_v5"
        cfg.save_pretrained(str(v5))
        cfg2 = AutoConfig.from_pretrained(str(v5))
        exp2 = derive(cfg2, name, raw)
        assert exp == exp2, (name, exp, exp2)
        exp["producer"] = f"tests/golden/gen_configs.py with transformers {pkg_version('transformers')}"
        exp["config_class"] = type(cfg).__name__
        write_json(d / "expected.json", exp)
        print(f"  {name}: {type(cfg).__name__}")


if __name__ == "__main__":
    main()
