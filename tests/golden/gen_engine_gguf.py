"""GGUF files of tiny models in data/engine/hf/ (Qwen3-MoE, Mixtral, the dense Qwen3 and
Qwen2, and gpt-oss with MXFP4 experts), written as llama.cpp's convert_hf_to_gguf.py lays them out: the experts of a layer
stacked in one tensor per projection (ffn_gate_exps, ffn_up_exps, ffn_down_exps, dims
[hidden, ffn, experts] fastest first), the router as ffn_gate_inp, and for the "llama"
architecture (Mixtral) the query and key rows permuted from rotate-half to llama.cpp's
adjacent pairs (the Qwen architectures keep Hugging Face's rotate-half, llama.cpp's NEOX
rope). Float32, so the files check the layout and nothing else.

Each file is checked with llama.cpp itself: its logits at every position of the HF golden's
prompts must match transformers' (logits.json) — so the layout is llama.cpp's, not ours.
gpt-oss: llama.cpp's YaRN always truncates its correction range, where gpt-oss's config says
not to (the golden logits and Cleave follow the config), so gpt_oss_f32.gguf is checked
against transformers run with truncation; gpt_oss_mxfp4.gguf, the same layout with MXFP4
experts, by its experts' values (the gguf package's decoding against transformers' MXFP4
converter's).
gemma3_pattern6_f32.gguf is Gemma 3 as convert_hf_to_gguf.py's Gemma3Model writes it (norm weights
stored as 1 + w; write_gemma3).
deepseek_v3_wide_latent_f32.gguf is DeepSeek-V3 as convert_hf_to_gguf.py's DeepseekV2Model writes
it (kv_b_proj split into attn_k_b and attn_v_b; write_deepseek2).
glm4_moe_f32.gguf is GLM-4.5 as convert_hf_to_gguf.py's Glm4MoeModel writes it, with a stand-in
multi-token-prediction layer after the others (write_glm4moe).
phi3_f32.gguf is Phi-3 as convert_hf_to_gguf.py's Phi3MiniModel writes it: qkv_proj as attn_qkv,
gate_up_proj (gate rows first) as ffn_up, rotate-half rope (no permutation), the window as
phi3.attention.sliding_window. llama.cpp turns Phi-3's window off, so it is checked against
transformers only at positions before the window's end (where the window changes nothing);
Cleave applies the window, as transformers does, and the engine test compares every position.
smollm3_f32.gguf is SmolLM3 as convert_hf_to_gguf.py's SmolLM3Model writes it (Q and K permuted as
for llama; nothing states the unrotated layers: llama.cpp takes every fourth).
granite_f32.gguf is Granite 3 as convert_hf_to_gguf.py's GraniteModel writes it (the multipliers
as granite.embedding_scale, residual_scale, attention.scale and logit_scale; Q, K and their biases
permuted as for llama).
olmo2_f32.gguf and minimax_m2_f32.gguf are OLMo 2 (Olmo2Model) and MiniMax-M2 (MiniMaxM2Model) as the
converter writes them: Q and K unpermuted (NEOX rope) with their norms across heads as attn_q_norm
and attn_k_norm; OLMo's post_attention_norm and post_ffw_norm; MiniMax's experts stacked, its
correction bias as exp_probs_b, rope.dimension_count its rotary_dim. glm4_f32.gguf is GLM-4 (dense) as
Glm4Model writes it (write_glm4). gemma2_f32.gguf is Gemma 2 as Gemma2Model writes it (write_gemma2;
llama.cpp reads it at 7e-4, its GELU through an fp16 table as for Gemma 3).
phi3_longrope_f32.gguf adds longrope as the converter writes it (rope_factors_long and
rope_factors_short tensors, rope.scaling.attn_factor) and a partial rotary dimension count.
The engine test (HfLogitsTest, "NAME.gguf") loads these files against the same transformers logits.

qwen3_nvfp4.gguf is qwen3_f32 with its decoder's linear weights whose rows are whole 64-element
blocks in NVFP4, quantized by llama.cpp's own reference quantizer (quantize_row_nvfp4_ref), the
others float32, as llama.cpp's NVFP4 file type leaves them. Its golden, qwen3_nvfp4.logits.json,
is transformers' on qwen3_f32 with those weights replaced by the gguf package's decoding of the
blocks and their inputs rounded to int8 per 32 elements, as the engine multiplies NVFP4
(gen_engine_hf.int8_inputs); llama.cpp, which rounds its inputs to Q8_0 instead (an fp16 scale),
is checked against it loosely.

Run: .cache/oracle-venv/bin/python tests/golden/gen_engine_gguf.py
"""
import base64
import json
import math
import os

import gguf
import numpy as np
from safetensors.numpy import load_file

HERE = os.path.dirname(os.path.abspath(__file__))
HF = os.path.join(HERE, "data", "engine", "hf")
OUT = os.path.join(HERE, "data", "engine", "gguf")
CASES = {"qwen3_moe_f32": "qwen3moe", "mixtral_f32": "llama", "qwen3_f32": "qwen3",
         "qwen2_f32": "qwen2"}


def permute(w, heads):
    """Rotate-half rows to adjacent pairs, as convert_hf_to_gguf.py's LlamaModel.permute."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def open_writer(case, arch, name=None, extra_blocks=0, kv=None):
    """`case`'s config, tensors and a GGUF writer for it (the file `name`, or the case's)
    holding the keys every file has; block_count counts `extra_blocks` after the layers; `kv`
    (head_count_kv, key_length, value_length) replaces the config's KV heads and head size."""
    cfg = json.load(open(os.path.join(HF, case, "config.json")))
    t = load_file(os.path.join(HF, case, "model.safetensors"))
    w = gguf.GGUFWriter(os.path.join(OUT, f"{name or case}.gguf"), arch)
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    w.add_name(case)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"] + extra_blocks)
    if "intermediate_size" in cfg:  # Qwen3.5-MoE has no dense MLP
        w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    kv_heads, key_length, value_length = kv or (cfg["num_key_value_heads"], head_dim, head_dim)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(key_length)
    w.add_value_length(value_length)
    rope = cfg["rope_parameters"]  # Gemma 3: per layer type; the global layers' base here
    w.add_rope_freq_base(rope.get("rope_theta") or rope["full_attention"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    return cfg, t, w


def float_file_keys(w, cfg):
    """The keys of a float32 file without a tokenizer (the prompts are token ids)."""
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("none")


def float_writer(w, t, cfg, norm_offset=0.0):
    """A function adding a float32 tensor to `w`, after it has added the embeddings, the final
    norm (plus `norm_offset`) and (untied) the head from `t`."""
    def tensor(name, array):
        w.add_tensor(name, np.ascontiguousarray(array, dtype=np.float32))

    tensor("token_embd.weight", t["model.embed_tokens.weight"])
    tensor("output_norm.weight", t["model.norm.weight"] + norm_offset)
    if not cfg.get("tie_word_embeddings"):
        tensor("output.weight", t["lm_head.weight"])
    return tensor


def close_writer(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(w.path)


def nvfp4_blocks(weight):
    """`weight` ([rows, cols], cols a multiple of 64) as llama.cpp's reference quantizer writes
    it in NVFP4 blocks: [rows, cols / 64 * 36] bytes."""
    import ctypes
    import glob
    import llama_cpp
    lib = ctypes.CDLL(sorted(glob.glob(os.path.join(os.path.dirname(llama_cpp.__file__), "lib",
                                                    "libggml-base.so*")))[0])
    x = np.ascontiguousarray(weight, dtype=np.float32)
    out = np.empty((x.shape[0], x.shape[1] // 64 * 36), dtype=np.uint8)
    lib.quantize_row_nvfp4_ref.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    lib.quantize_row_nvfp4_ref(x.ctypes.data, out.ctypes.data, x.size)
    return out


def write(case, arch, nvfp4=False):
    """`case` as llama.cpp's converter writes it: float32, or with `nvfp4` its dense decoder's
    linear weights of whole 64-element rows in NVFP4 (the file <case without _f32>_nvfp4)."""
    name = case.removesuffix("_f32") + "_nvfp4" if nvfp4 else None
    cfg, t, w = open_writer(case, arch, name)
    # write_nvfp4_golden maps the blocks back to dense, unpermuted checkpoint tensors.
    assert not nvfp4 or (arch != "llama" and not cfg.get("num_experts")), case
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    experts = cfg.get("num_local_experts", cfg.get("num_experts"))
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(cfg["num_experts_per_tok"])
    if arch == "qwen3moe":
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    if arch == "minimax-m2":  # MiniMaxM2Model: the experts' width and the rotated dims; the
        w.add_expert_feed_forward_length(cfg["intermediate_size"])  # published config's
        w.add_rope_dimension_count(cfg["rotary_dim"])  # scoring_func "sigmoid" gives the gating
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_vocab_size(cfg["vocab_size"])
    if arch == "granite":  # GraniteModel's four multipliers
        w.add_embedding_scale(cfg["embedding_multiplier"])
        w.add_residual_scale(cfg["residual_multiplier"])
        w.add_attention_scale(cfg["attention_multiplier"])
        w.add_logit_scale(cfg["logits_scaling"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_NVFP4 if nvfp4 else gguf.LlamaFileType.ALL_F32)
    # No tokenizer: the prompts are token ids.
    w.add_tokenizer_model("none")

    def tensor(name, array):
        if nvfp4 and name.startswith("blk.") and array.ndim == 2 and array.shape[1] % 64 == 0:
            w.add_tensor(name, nvfp4_blocks(array), raw_dtype=gguf.GGMLQuantizationType.NVFP4)
        else:
            w.add_tensor(name, np.ascontiguousarray(array, dtype=np.float32))

    tensor("token_embd.weight", t["model.embed_tokens.weight"])
    tensor("output_norm.weight", t["model.norm.weight"])
    if not cfg.get("tie_word_embeddings"):
        tensor("output.weight", t["lm_head.weight"])
    mixtral_layout = arch in ("llama", "minimax-m2")
    moe = "block_sparse_moe" if mixtral_layout else "mlp"
    gate, up, down = ("w1", "w3", "w2") if mixtral_layout else ("gate_proj", "up_proj", "down_proj")
    for layer in range(cfg["num_hidden_layers"]):
        hf = f"model.layers.{layer}."
        blk = f"blk.{layer}."
        q, k = t[hf + "self_attn.q_proj.weight"], t[hf + "self_attn.k_proj.weight"]
        if arch in ("llama", "smollm3", "granite"):
            q, k = permute(q, heads), permute(k, kv_heads)
        if arch != "olmo2":  # OLMo 2: norms after attention and the MLP only
            tensor(blk + "attn_norm.weight", t[hf + "input_layernorm.weight"])
        tensor(blk + "attn_q.weight", q)
        tensor(blk + "attn_k.weight", k)
        tensor(blk + "attn_v.weight", t[hf + "self_attn.v_proj.weight"])
        tensor(blk + "attn_output.weight", t[hf + "self_attn.o_proj.weight"])
        if arch == "qwen2" or cfg.get("attention_bias"):
            for p in "qkv":
                bias = t[hf + f"self_attn.{p}_proj.bias"]
                if arch != "qwen2" and p in "qk":  # permuted with its rows
                    bias = permute(bias, heads if p == "q" else kv_heads)
                tensor(blk + f"attn_{p}.bias", bias)
        if arch == "granite" and cfg.get("attention_bias"):
            tensor(blk + "attn_output.bias", t[hf + "self_attn.o_proj.bias"])
        if arch in ("qwen3", "qwen3moe", "olmo2", "minimax-m2"):  # per head, or across heads
            tensor(blk + "attn_q_norm.weight", t[hf + "self_attn.q_norm.weight"])
            tensor(blk + "attn_k_norm.weight", t[hf + "self_attn.k_norm.weight"])
        if arch == "olmo2":
            tensor(blk + "post_attention_norm.weight", t[hf + "post_attention_layernorm.weight"])
            tensor(blk + "post_ffw_norm.weight", t[hf + "post_feedforward_layernorm.weight"])
        else:
            tensor(blk + "ffn_norm.weight", t[hf + "post_attention_layernorm.weight"])
        if not experts:
            for p in ("gate", "up", "down"):
                tensor(blk + f"ffn_{p}.weight", t[hf + f"mlp.{p}_proj.weight"])
            continue
        tensor(blk + "ffn_gate_inp.weight", t[hf + f"{moe}.gate.weight"])
        if arch == "minimax-m2":
            tensor(blk + "exp_probs_b.bias", t[hf + f"{moe}.e_score_correction_bias"])
        for gguf_name, hf_name in (("ffn_gate_exps", gate), ("ffn_up_exps", up), ("ffn_down_exps", down)):
            stacked = np.stack([t[hf + f"{moe}.experts.{e}.{hf_name}.weight"] for e in range(experts)])
            tensor(blk + gguf_name + ".weight", stacked)
    return close_writer(w)


def write_phi3(case):
    """Phi-3 as convert_hf_to_gguf.py's Phi3MiniModel writes it (float32): the fused
    qkv_proj and gate_up_proj under llama.cpp's names, Hugging Face's row order kept."""
    cfg, t, w = open_writer(case, "phi3")
    heads = cfg["num_attention_heads"]
    rope = cfg["rope_parameters"]
    w.add_rope_dimension_count(int(rope.get("partial_rotary_factor", 1.0) * cfg["hidden_size"]) // heads)
    original = cfg["original_max_position_embeddings"]
    w.add_rope_scaling_orig_ctx_len(original)
    if rope.get("rope_type") == "longrope":
        # the attention factor from the contexts' ratio, the factors as tensors
        scale = cfg["max_position_embeddings"] / original
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0)
        w.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
        w.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))
    if cfg.get("sliding_window"):
        w.add_sliding_window(cfg["sliding_window"])
    float_file_keys(w, cfg)
    tensor = float_writer(w, t, cfg)
    for layer in range(cfg["num_hidden_layers"]):
        hf, blk = f"model.layers.{layer}.", f"blk.{layer}."
        tensor(blk + "attn_norm.weight", t[hf + "input_layernorm.weight"])
        tensor(blk + "attn_qkv.weight", t[hf + "self_attn.qkv_proj.weight"])
        tensor(blk + "attn_output.weight", t[hf + "self_attn.o_proj.weight"])
        tensor(blk + "ffn_norm.weight", t[hf + "post_attention_layernorm.weight"])
        tensor(blk + "ffn_up.weight", t[hf + "mlp.gate_up_proj.weight"])
        tensor(blk + "ffn_down.weight", t[hf + "mlp.down_proj.weight"])
    return close_writer(w)


def write_glm4(case):
    """GLM-4 (dense) as convert_hf_to_gguf.py's Glm4Model writes it (float32): Q and K unpermuted
    (its rotary part already pairs adjacent values), rope.dimension_count the rotated half, the
    norm after attention as post_attention_norm, the one before the MLP as ffn_norm, the one after
    it as post_ffw_norm, gate_up_proj as ffn_up."""
    cfg, t, w = open_writer(case, "glm4")
    w.add_rope_dimension_count(int(cfg["head_dim"] * cfg["rope_parameters"]["partial_rotary_factor"]))
    float_file_keys(w, cfg)
    tensor = float_writer(w, t, cfg)
    for layer in range(cfg["num_hidden_layers"]):
        hf, blk = f"model.layers.{layer}.", f"blk.{layer}."
        tensor(blk + "attn_norm.weight", t[hf + "input_layernorm.weight"])
        for p in "qkv":
            tensor(blk + f"attn_{p}.weight", t[hf + f"self_attn.{p}_proj.weight"])
            tensor(blk + f"attn_{p}.bias", t[hf + f"self_attn.{p}_proj.bias"])
        tensor(blk + "attn_output.weight", t[hf + "self_attn.o_proj.weight"])
        tensor(blk + "post_attention_norm.weight", t[hf + "post_self_attn_layernorm.weight"])
        tensor(blk + "ffn_norm.weight", t[hf + "post_attention_layernorm.weight"])
        tensor(blk + "post_ffw_norm.weight", t[hf + "post_mlp_layernorm.weight"])
        tensor(blk + "ffn_up.weight", t[hf + "mlp.gate_up_proj.weight"])
        tensor(blk + "ffn_down.weight", t[hf + "mlp.down_proj.weight"])
    return close_writer(w)


def tiled_value_heads(x, axis, key_heads, per_key, size):
    """Value heads from grouped by key head (HF: [k0: v0..v{r-1}, k1: ...]) to tiled ([v0 of every
    key head, v1 of every key head, ...]) along `axis`, `size` elements each, as llama.cpp's
    converter reorders Qwen3.5's (ggml broadcasts the key heads over them by tiling)."""
    shape = list(x.shape)
    x = x.reshape(shape[:axis] + [key_heads, per_key, size] + shape[axis + 1:])
    return np.swapaxes(x, axis, axis + 1).reshape(shape)


def write_qwen35(case, arch="qwen35"):
    """Qwen3.5 (dense) as convert_hf_to_gguf.py's Qwen3_5TextModel writes it (float32): the
    linear layers' ssm.* keys, every norm but the gated one stored as 1 + w, A_log as
    -exp(A_log), dt_bias as ssm_dt.bias, the convolution squeezed, in_proj_qkv as attn_qkv and
    in_proj_z as attn_gate, in_proj_b / in_proj_a as ssm_beta / ssm_alpha, and every value-head
    dimension (V rows, z rows, b, a, A_log, dt_bias, the convolution's V channels, out_proj's
    columns) in tiled order; post_attention_layernorm as post_attention_norm."""
    cfg, t, w = open_writer(case, arch)
    experts = cfg.get("num_experts", 0)
    if experts:  # Qwen3_5MoeTextModel: Qwen2MoeModel's expert keys, the shared expert's width
        w.add_expert_count(experts)
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    key_heads, value_heads = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv, r = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], value_heads // key_heads
    w.add_ssm_conv_kernel(cfg["linear_conv_kernel_dim"])
    w.add_ssm_state_size(dk)
    w.add_ssm_group_count(key_heads)
    w.add_ssm_time_step_rank(value_heads)
    w.add_ssm_inner_size(dv * value_heads)
    w.add_full_attention_interval(4)
    rotary = int(cfg["head_dim"] * cfg["rope_parameters"]["partial_rotary_factor"])
    w.add_rope_dimension_count(rotary)
    # Interleaved M-RoPE's sections: text alone (every axis at one position) rotates as plain RoPE
    # whatever they are, but llama.cpp wants them within the rotary pairs (11, 11, 10 in a real file).
    w.add_rope_dimension_sections([rotary // 4, rotary // 2 - rotary // 4, 0, 0])
    float_file_keys(w, cfg)
    tensor = float_writer(w, t, cfg, norm_offset=1.0)
    tile = lambda x, axis, size: tiled_value_heads(x, axis, key_heads, r, size)  # noqa: E731
    for layer in range(cfg["num_hidden_layers"]):
        hf, blk = f"model.layers.{layer}.", f"blk.{layer}."
        tensor(blk + "attn_norm.weight", t[hf + "input_layernorm.weight"] + 1)
        tensor(blk + "post_attention_norm.weight", t[hf + "post_attention_layernorm.weight"] + 1)
        if experts:
            tensor(blk + "ffn_gate_inp.weight", t[hf + "mlp.gate.weight"])
            tensor(blk + "ffn_gate_inp_shexp.weight", t[hf + "mlp.shared_expert_gate.weight"])
            for p in ("gate", "up", "down"):
                stacked = np.stack([t[hf + f"mlp.experts.{e}.{p}_proj.weight"] for e in range(experts)])
                tensor(blk + f"ffn_{p}_exps.weight", stacked)
                tensor(blk + f"ffn_{p}_shexp.weight", t[hf + f"mlp.shared_expert.{p}_proj.weight"])
        else:
            for p in ("gate", "up", "down"):
                tensor(blk + f"ffn_{p}.weight", t[hf + f"mlp.{p}_proj.weight"])
        if cfg["layer_types"][layer] == "full_attention":
            for p in "qkv":
                tensor(blk + f"attn_{p}.weight", t[hf + f"self_attn.{p}_proj.weight"])
            tensor(blk + "attn_output.weight", t[hf + "self_attn.o_proj.weight"])
            tensor(blk + "attn_q_norm.weight", t[hf + "self_attn.q_norm.weight"] + 1)
            tensor(blk + "attn_k_norm.weight", t[hf + "self_attn.k_norm.weight"] + 1)
            continue
        la = hf + "linear_attn."
        qkv = t[la + "in_proj_qkv.weight"]
        qk = 2 * key_heads * dk
        tensor(blk + "attn_qkv.weight", np.concatenate([qkv[:qk], tile(qkv[qk:], 0, dv)]))
        tensor(blk + "attn_gate.weight", tile(t[la + "in_proj_z.weight"], 0, dv))
        tensor(blk + "ssm_beta.weight", tile(t[la + "in_proj_b.weight"], 0, 1))
        tensor(blk + "ssm_alpha.weight", tile(t[la + "in_proj_a.weight"], 0, 1))
        tensor(blk + "ssm_a", tile(-np.exp(t[la + "A_log"]), 0, 1))
        tensor(blk + "ssm_dt.bias", tile(t[la + "dt_bias"], 0, 1))
        conv = t[la + "conv1d.weight"].squeeze(1)
        tensor(blk + "ssm_conv1d.weight", np.concatenate([conv[:qk], tile(conv[qk:], 0, dv)]))
        tensor(blk + "ssm_norm.weight", t[la + "norm.weight"])
        tensor(blk + "ssm_out.weight", tile(t[la + "out_proj.weight"], 1, dv))
    return close_writer(w)


def deepseek_moe_keys(w, t, cfg):
    """A DeepSeek-style MoE's keys as llama.cpp's converter writes them (sigmoid gating, the
    weights' scale and renormalization, shared experts, dense first layers), and the rest of
    a float32 file's; returns float_writer's tensor writer."""
    w.add_leading_dense_block_count(cfg["first_k_dense_replace"])
    w.add_expert_count(cfg["n_routed_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_shared_count(cfg["n_shared_experts"])
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_expert_weights_scale(cfg["routed_scaling_factor"])
    w.add_expert_weights_norm(cfg["norm_topk_prob"])
    float_file_keys(w, cfg)
    return float_writer(w, t, cfg)


def deepseek_mlp(tensor, t, cfg, layer, hf, blk):
    """A DeepSeek-style layer's MLP as llama.cpp's converter writes it: dense in the first
    first_k_dense_replace layers, else the router (ffn_gate_inp), the correction bias
    (exp_probs_b), the routed experts stacked (ffn_*_exps) and the shared ones (ffn_*_shexp)."""
    if layer < cfg["first_k_dense_replace"]:
        for p in ("gate", "up", "down"):
            tensor(blk + f"ffn_{p}.weight", t[hf + f"mlp.{p}_proj.weight"])
        return
    tensor(blk + "ffn_gate_inp.weight", t[hf + "mlp.gate.weight"])
    tensor(blk + "exp_probs_b.bias", t[hf + "mlp.gate.e_score_correction_bias"])
    for p in ("gate", "up", "down"):
        tensor(blk + f"ffn_{p}_exps.weight",
               np.stack([t[hf + f"mlp.experts.{e}.{p}_proj.weight"] for e in range(cfg["n_routed_experts"])]))
        tensor(blk + f"ffn_{p}_shexp.weight", t[hf + f"mlp.shared_experts.{p}_proj.weight"])


def write_glm4moe(case):
    """GLM-4.5 as convert_hf_to_gguf.py's Glm4MoeModel writes it (float32): DeepSeek-style
    expert keys (sigmoid gating, weights scale and norm, shared experts as *_shexp, the
    correction bias as exp_probs_b), the rotary part of each head as rope.dimension_count,
    the second norm as post_attention_norm, Hugging Face's rotate-half rows kept (NEOX rope).
    The checkpoint's multi-token-prediction layer, which GLM-4.5 files carry after the others
    and count in block_count, is stood in for by a copy of the last layer's tensors plus
    random nextn.* tensors: a reader must leave it out to match transformers."""
    cfg, t, w = open_writer(case, "glm4moe", extra_blocks=1)
    layers = cfg["num_hidden_layers"]
    head_dim = cfg["head_dim"]
    w.add_nextn_predict_layers(1)
    w.add_rope_dimension_count(int(head_dim * cfg["rope_parameters"]["partial_rotary_factor"]))
    tensor = deepseek_moe_keys(w, t, cfg)
    rng = np.random.default_rng(7)
    hidden = cfg["hidden_size"]
    for layer in range(layers + 1):
        hf, blk = f"model.layers.{min(layer, layers - 1)}.", f"blk.{layer}."
        tensor(blk + "attn_norm.weight", t[hf + "input_layernorm.weight"])
        for p in "qkv":
            tensor(blk + f"attn_{p}.weight", t[hf + f"self_attn.{p}_proj.weight"])
            tensor(blk + f"attn_{p}.bias", t[hf + f"self_attn.{p}_proj.bias"])
        tensor(blk + "attn_output.weight", t[hf + "self_attn.o_proj.weight"])
        if cfg.get("use_qk_norm"):
            tensor(blk + "attn_q_norm.weight", t[hf + "self_attn.q_norm.weight"])
            tensor(blk + "attn_k_norm.weight", t[hf + "self_attn.k_norm.weight"])
        tensor(blk + "post_attention_norm.weight", t[hf + "post_attention_layernorm.weight"])
        deepseek_mlp(tensor, t, cfg, layer, hf, blk)
        if layer == layers:  # The prediction layer's own tensors.
            tensor(blk + "nextn.eh_proj.weight", rng.standard_normal((hidden, 2 * hidden)) / hidden)
            for n in ("enorm", "hnorm", "shared_head_norm"):
                tensor(blk + f"nextn.{n}.weight", 1 + 0.1 * rng.standard_normal(hidden))
    return close_writer(w)


def write_gemma3(case):
    """Gemma 3 as convert_hf_to_gguf.py's Gemma3Model writes it (float32): every norm weight
    stored as 1 + w (the scale the model applies), the norms after attention and after the MLP
    as post_attention_norm and post_ffw_norm, the one before the MLP as ffn_norm, rotate-half
    rows kept (NEOX rope), the global layers' linear rope scaling under rope.scaling, the window
    as attention.sliding_window, tied embeddings (no output.weight). What the file cannot state
    llama.cpp fixes: every sixth layer global, the sliding layers' base 10000, the queries
    scaled by head_dim (but in the 27B) - the case is built to match."""
    cfg, t, w = open_writer(case, "gemma3")
    rope = cfg["rope_parameters"]
    assert cfg["query_pre_attn_scalar"] == cfg["head_dim"] and not cfg.get("final_logit_softcapping")
    assert rope["sliding_attention"]["rope_theta"] == 10000.0
    assert cfg["layer_types"] == ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                                  for i in range(cfg["num_hidden_layers"])]
    w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    w.add_rope_scaling_factor(rope["full_attention"]["factor"])
    w.add_sliding_window(cfg["sliding_window"])
    float_file_keys(w, cfg)
    write_gemma_tensors(w, t, cfg, qk_norm=True)
    return close_writer(w)


def write_gemma_tensors(w, t, cfg, qk_norm):
    """Gemma 2's and 3's tensors as their converters write them: every norm weight as 1 + w,
    tied embeddings; Gemma 3's Q/K norms when `qk_norm`."""
    def tensor(name, array):
        w.add_tensor(name, np.ascontiguousarray(array, dtype=np.float32))

    def norm(name, weight):
        tensor(name, weight + 1.0)

    tensor("token_embd.weight", t["model.embed_tokens.weight"])
    norm("output_norm.weight", t["model.norm.weight"])
    for layer in range(cfg["num_hidden_layers"]):
        hf, blk = f"model.layers.{layer}.", f"blk.{layer}."
        norm(blk + "attn_norm.weight", t[hf + "input_layernorm.weight"])
        for p in "qkv":
            tensor(blk + f"attn_{p}.weight", t[hf + f"self_attn.{p}_proj.weight"])
        tensor(blk + "attn_output.weight", t[hf + "self_attn.o_proj.weight"])
        if qk_norm:
            norm(blk + "attn_q_norm.weight", t[hf + "self_attn.q_norm.weight"])
            norm(blk + "attn_k_norm.weight", t[hf + "self_attn.k_norm.weight"])
        norm(blk + "post_attention_norm.weight", t[hf + "post_attention_layernorm.weight"])
        norm(blk + "ffn_norm.weight", t[hf + "pre_feedforward_layernorm.weight"])
        norm(blk + "post_ffw_norm.weight", t[hf + "post_feedforward_layernorm.weight"])
        for p in ("gate", "up", "down"):
            tensor(blk + f"ffn_{p}.weight", t[hf + f"mlp.{p}_proj.weight"])


def write_gemma2(case):
    """Gemma 2 as convert_hf_to_gguf.py's Gemma2Model writes it (float32): Gemma 3's tensors
    without Q/K norms, both soft caps and the window as keys. llama.cpp fixes what the file
    cannot state: every other layer sliding (the even ones), the queries scaled by the head size
    (but in the 27B) - the case is built to match."""
    cfg, t, w = open_writer(case, "gemma2")
    assert cfg["query_pre_attn_scalar"] == cfg["head_dim"]
    assert cfg["layer_types"] == ["sliding_attention" if i % 2 == 0 else "full_attention"
                                  for i in range(cfg["num_hidden_layers"])]
    w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
    w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    w.add_sliding_window(cfg["sliding_window"])
    float_file_keys(w, cfg)
    write_gemma_tensors(w, t, cfg, qk_norm=False)
    return close_writer(w)


def write_deepseek2(case):
    """DeepSeek-V3 as convert_hf_to_gguf.py's DeepseekV2Model writes it (float32): latent
    attention as one KV head (head_count_kv 1, key_length = latent + rope, value_length =
    latent, the heads' sizes as key_length_mla / value_length_mla), kv_b_proj split per head
    into attn_k_b (W_UK transposed: [heads, latent, no-rope dims]) and attn_v_b ([heads, v,
    latent]), the rope part's adjacent pairs kept (llama.cpp's NORM rope), DeepSeek-style expert
    keys with the group-limited routing's expert_group_count / expert_group_used_count."""
    cfg = json.load(open(os.path.join(HF, case, "config.json")))
    lora, rope, nope, v = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    cfg, t, w = open_writer(case, "deepseek2", kv=(1, lora + rope, lora))
    heads, layers = cfg["num_attention_heads"], cfg["num_hidden_layers"]
    assert cfg.get("rope_interleave", True) and cfg.get("q_lora_rank")
    w.add_key_length_mla(nope + rope)
    w.add_value_length_mla(v)
    w.add_q_lora_rank(cfg["q_lora_rank"])
    w.add_kv_lora_rank(lora)
    w.add_rope_dimension_count(rope)
    w.add_expert_group_count(cfg["n_group"])
    w.add_expert_group_used_count(cfg["topk_group"])
    tensor = deepseek_moe_keys(w, t, cfg)
    for layer in range(layers):
        hf, blk = f"model.layers.{layer}.", f"blk.{layer}."
        a = hf + "self_attn."
        tensor(blk + "attn_norm.weight", t[hf + "input_layernorm.weight"])
        tensor(blk + "attn_q_a.weight", t[a + "q_a_proj.weight"])
        tensor(blk + "attn_q_a_norm.weight", t[a + "q_a_layernorm.weight"])
        tensor(blk + "attn_q_b.weight", t[a + "q_b_proj.weight"])
        tensor(blk + "attn_kv_a_mqa.weight", t[a + "kv_a_proj_with_mqa.weight"])
        tensor(blk + "attn_kv_a_norm.weight", t[a + "kv_a_layernorm.weight"])
        kv_b = t[a + "kv_b_proj.weight"].reshape(heads, nope + v, lora)
        tensor(blk + "attn_k_b.weight", kv_b[:, :nope, :].transpose(0, 2, 1))
        tensor(blk + "attn_v_b.weight", kv_b[:, nope:, :])
        tensor(blk + "attn_output.weight", t[a + "o_proj.weight"])
        tensor(blk + "ffn_norm.weight", t[hf + "post_attention_layernorm.weight"])
        deepseek_mlp(tensor, t, cfg, layer, hf, blk)
    return close_writer(w)


def mxfp4_gguf(blocks, scales):
    """OpenAI's MXFP4 ([..., groups, 16] bytes, element 2k in the low nibble of byte k; an E8M0
    exponent per group) as llama.cpp's converter repacks it: per group the exponent, then
    element j in the low nibble of byte j and element 16 + j in its high nibble."""
    codes = np.empty(blocks.shape[:-1] + (32,), dtype=np.uint8)
    codes[..., 0::2], codes[..., 1::2] = blocks & 0x0F, blocks >> 4
    qs = codes[..., :16] | (codes[..., 16:] << 4)
    packed = np.concatenate([scales[..., None], qs], axis=-1)
    return packed.reshape(packed.shape[:-2] + (-1,))


def write_gpt_oss(case):
    """gpt-oss as convert_hf_to_gguf.py's GptOssModel writes it: gate and up split from
    gate_up_proj's interleaved rows (and its bias), OpenAI's MXFP4 blocks repacked (float
    experts, transformers' [experts, in, out], transposed), the second norm named
    post_attention_norm, the sinks attn_sinks."""
    cfg, t, w = open_writer(case, "gpt-oss")
    rope = cfg["rope_parameters"]
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(rope["factor"])
    w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    w.add_expert_count(cfg["num_local_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_feed_forward_length(cfg["intermediate_size"])
    w.add_sliding_window(cfg["sliding_window"])
    w.add_vocab_size(cfg["vocab_size"])
    mxfp4 = "mlp.experts.gate_up_proj_blocks" in " ".join(t)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE if mxfp4 else gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("none")
    tensor = float_writer(w, t, cfg)
    for layer in range(cfg["num_hidden_layers"]):
        hf, blk = f"model.layers.{layer}.", f"blk.{layer}."
        tensor(blk + "attn_norm.weight", t[hf + "input_layernorm.weight"])
        tensor(blk + "post_attention_norm.weight", t[hf + "post_attention_layernorm.weight"])
        for p, name in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "output")):
            tensor(blk + f"attn_{name}.weight", t[hf + f"self_attn.{p}_proj.weight"])
            tensor(blk + f"attn_{name}.bias", t[hf + f"self_attn.{p}_proj.bias"])
        tensor(blk + "attn_sinks.weight", t[hf + "self_attn.sinks"])
        tensor(blk + "ffn_gate_inp.weight", t[hf + "mlp.router.weight"])
        tensor(blk + "ffn_gate_inp.bias", t[hf + "mlp.router.bias"])
        experts = hf + "mlp.experts."
        if mxfp4:
            gate_up = mxfp4_gguf(t[experts + "gate_up_proj_blocks"], t[experts + "gate_up_proj_scales"])
            down = mxfp4_gguf(t[experts + "down_proj_blocks"], t[experts + "down_proj_scales"])
            kind = gguf.GGMLQuantizationType.MXFP4
            w.add_tensor(blk + "ffn_gate_exps.weight", np.ascontiguousarray(gate_up[:, 0::2]), raw_dtype=kind)
            w.add_tensor(blk + "ffn_up_exps.weight", np.ascontiguousarray(gate_up[:, 1::2]), raw_dtype=kind)
            w.add_tensor(blk + "ffn_down_exps.weight", np.ascontiguousarray(down), raw_dtype=kind)
        else:
            gate_up = t[experts + "gate_up_proj"]
            tensor(blk + "ffn_gate_exps.weight", gate_up[:, :, 0::2].transpose(0, 2, 1))
            tensor(blk + "ffn_up_exps.weight", gate_up[:, :, 1::2].transpose(0, 2, 1))
            tensor(blk + "ffn_down_exps.weight", t[experts + "down_proj"].transpose(0, 2, 1))
        bias = t[experts + "gate_up_proj_bias"]
        tensor(blk + "ffn_gate_exps.bias", bias[:, 0::2])
        tensor(blk + "ffn_up_exps.bias", bias[:, 1::2])
        tensor(blk + "ffn_down_exps.bias", t[experts + "down_proj_bias"])
    return close_writer(w)


def check_mxfp4_blocks(path, case):
    """The MXFP4 experts of `path`, decoded by the gguf package, are the weights transformers'
    MXFP4 converter decodes from `case`'s blocks (gate and up split from their interleaved rows)."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    import torch
    t = load_file(os.path.join(HF, case, "model.safetensors"))
    reader = gguf.GGUFReader(path)
    checked = 0
    for tensor in reader.tensors:
        if tensor.tensor_type != gguf.GGMLQuantizationType.MXFP4:
            continue
        layer, name = int(tensor.name.split(".")[1]), tensor.name.split(".")[2]
        source = "gate_up_proj" if name in ("ffn_gate_exps", "ffn_up_exps") else "down_proj"
        prefix = f"model.layers.{layer}.mlp.experts.{source}"
        weights = convert_moe_packed_tensors(torch.from_numpy(t[prefix + "_blocks"]),
                                             torch.from_numpy(t[prefix + "_scales"]),
                                             dtype=torch.float32).numpy()  # [experts, in, out]
        if source == "gate_up_proj":
            weights = weights[:, :, 0::2] if name == "ffn_gate_exps" else weights[:, :, 1::2]
        want = weights.transpose(0, 2, 1)
        got = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(want.shape)
        if not np.array_equal(got, want):
            raise SystemExit(f"{path}: {tensor.name} does not hold {prefix}'s values")
        checked += 1
    print(f"{os.path.basename(path)}: {checked} MXFP4 tensors hold the checkpoint's values exactly")


def truncated_yarn_logits(case, prompts):
    """transformers' logits of `case` with YaRN's correction range truncated to whole
    dimensions, as llama.cpp computes YaRN whatever the config says (gpt-oss's is
    truncate: false, which the golden and Cleave follow; on these tiny models the two differ
    by about 7e-2)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    folder = os.path.join(HF, case)
    config = AutoConfig.from_pretrained(folder)
    config.rope_parameters["truncate"] = True
    if "quantization_config" in json.load(open(os.path.join(folder, "config.json"))):
        raise SystemExit(f"{case}: check the float case's file; transformers cannot run MXFP4 here")
    model = AutoModelForCausalLM.from_pretrained(folder, config=config, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    with torch.no_grad():
        return [model(input_ids=torch.tensor([p["ids"]])).logits[0].numpy() for p in prompts]


def write_nvfp4_golden(case, path):
    """The golden of `path` (NVFP4 weights of `case`), next to it as <file>.logits.json."""
    import sys
    from pathlib import Path
    import torch
    sys.path.insert(0, HERE)
    import gen_engine_hf as hf
    model = hf.load(Path(HF) / case, torch.float32)
    params = dict(model.named_parameters())
    # GGUF names back to the checkpoint's (this file's dense layers, unpermuted).
    names = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj"}
    decoded = {}
    for tensor in gguf.GGUFReader(path).tensors:
        if tensor.tensor_type != gguf.GGMLQuantizationType.NVFP4:
            continue
        _, layer, kind, _ = tensor.name.split(".")
        name = f"model.layers.{layer}.{names[kind]}.weight"
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(params[name].shape)
        with torch.no_grad():
            params[name].copy_(torch.from_numpy(values))
        decoded[name] = True
    with hf.int8_inputs(model, decoded):
        entries, redraws = hf.prompt_entries(model, model.config.vocab_size, 20261206)
    golden = {
        "producer": hf.PRODUCER + f", gguf {hf.pkg_version('gguf')}",
        "case": os.path.basename(path),
        "weights": f"{case} with its {len(decoded)} NVFP4 weights replaced by the gguf package's decoding",
        "activations": "rounded to int8 per 32-element block at the input of each NVFP4 layer "
                       "(gen_engine_hf.round_to_int8_blocks)",
        "compute_dtype": "float32",
        "tolerance": {"metric": hf.TOLERANCE["metric"], "max_rel": hf.TOLERANCE["int8_inputs"]},
        "greedy": {"max_new_tokens": hf.NEW_TOKENS, "min_margin_required": hf.MIN_GREEDY_MARGIN,
                   "prompt_redraws": redraws},
        "prompts": entries,
    }
    out = path.removesuffix(".gguf") + ".logits.json"
    hf.write_json(Path(out), golden)
    return out


def check_with_llamacpp(case, path, tolerance, reference=None, golden_path=None, positions=None):
    """llama.cpp's logits of `path` against `case`'s golden (or `reference`), at every position
    of each prompt or its first `positions`."""
    import llama_cpp
    golden = json.load(open(golden_path or os.path.join(HF, case, "logits.json")))
    if reference is not None:
        for prompt, logits in zip(golden["prompts"], reference):
            prompt["logits_b64"] = base64.b64encode(logits.astype(np.float32).tobytes())
    llm = llama_cpp.Llama(model_path=path, n_ctx=256, n_threads=2, logits_all=True, verbose=False,
                          type_k=0, type_v=0)  # An f32 KV cache, as the golden computed.
    worst = 0.0
    for prompt in golden["prompts"]:
        want = np.frombuffer(base64.b64decode(prompt["logits_b64"]), dtype=np.float32)
        want = want.reshape(prompt["logits_shape"])
        llm.reset()
        llm.eval(prompt["ids"])
        got = np.array(llm.scores[: len(prompt["ids"])], dtype=np.float32)
        for row_got, row_want in list(zip(got, want))[:positions]:
            worst = max(worst, float(np.abs(row_got - row_want).max() / np.abs(row_want).max()))
    print(f"{os.path.basename(path)}: llama.cpp against transformers, max relative logit error "
          f"{worst:.2e} (bound {tolerance:.0e})")
    if worst > tolerance:
        raise SystemExit(f"{path}: llama.cpp does not read it as transformers computes it")


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    for case, arch in CASES.items():
        check_with_llamacpp(case, write(case, arch), 1e-4)
    # gpt-oss: the float file against transformers with llama.cpp's truncated YaRN (2e-6 when
    # written), which shows the layout is llama.cpp's; the MXFP4 file shares it but for the
    # experts' blocks, whose bytes are checked against the gguf package's MXFP4 decoding.
    check_with_llamacpp("gpt_oss_f32", write_gpt_oss("gpt_oss_f32"), 1e-4,
                        truncated_yarn_logits("gpt_oss_f32", json.load(open(os.path.join(
                            HF, "gpt_oss_f32", "logits.json")))["prompts"]))
    check_mxfp4_blocks(write_gpt_oss("gpt_oss_mxfp4"), "gpt_oss_mxfp4")
    # Phi-3: llama.cpp ignores its window (7 positions here), so only the first 7 positions.
    phi3 = json.load(open(os.path.join(HF, "phi3_f32", "config.json")))
    check_with_llamacpp("phi3_f32", write_phi3("phi3_f32"), 1e-4, positions=phi3["sliding_window"])
    # longrope with rotary embedding on 0.75 of each head (Phi-4-mini's shape): llama.cpp's context
    # (256) is past the original (4), so it takes the long factors, as transformers does here
    check_with_llamacpp("phi3_longrope_f32", write_phi3("phi3_longrope_f32"), 1e-4)
    check_with_llamacpp("glm4_moe_f32", write_glm4moe("glm4_moe_f32"), 1e-4)
    # SmolLM3: Q and K permuted as for llama; llama.cpp leaves every fourth layer unrotated
    check_with_llamacpp("smollm3_f32", write("smollm3_f32", "smollm3"), 1e-4)
    # Granite: the four multipliers as keys; Q, K (and their biases) permuted as for llama
    check_with_llamacpp("granite_f32", write("granite_f32", "granite"), 1e-4)
    # Q and K normed across heads: OLMo 2 (norms after attention and the MLP only) and MiniMax-M2
    # (sigmoid routing with exp_probs_b, half of each head rotating)
    check_with_llamacpp("olmo2_f32", write("olmo2_f32", "olmo2"), 1e-4)
    check_with_llamacpp("minimax_m2_f32", write("minimax_m2_f32", "minimax-m2"), 1e-4)
    # GLM-4 (dense): adjacent pairs on half of each head, sandwich norms, gate and up fused
    check_with_llamacpp("glm4_f32", write_glm4("glm4_f32"), 1e-4)
    check_with_llamacpp("deepseek_v3_wide_latent_f32", write_deepseek2("deepseek_v3_wide_latent_f32"), 1e-4)
    # Qwen3.5: Gated DeltaNet layers with their value heads tiled, the norms as 1 + w
    check_with_llamacpp("qwen3_5_f32", write_qwen35("qwen3_5_f32"), 1e-4)
    check_with_llamacpp("qwen3_5_moe_f32", write_qwen35("qwen3_5_moe_f32", "qwen35moe"), 1e-4)
    # Gemma 3: llama.cpp's CPU GELU reads a table of fp16 inputs (1.5e-3 when written; a layout
    # or scale error moves the logits by 1e-1 and more).
    check_with_llamacpp("gemma3_pattern6_f32", write_gemma3("gemma3_pattern6_f32"), 3e-3)
    check_with_llamacpp("gemma2_f32", write_gemma2("gemma2_f32"), 3e-3)
    # NVFP4: llama.cpp rounds its activations to Q8_0 blocks (an fp16 scale, halves away from
    # zero) where the golden rounds them as the engine does.
    nvfp4 = write("qwen3_f32", "qwen3", nvfp4=True)
    check_with_llamacpp("qwen3_f32", nvfp4, 2e-2, golden_path=write_nvfp4_golden("qwen3_f32", nvfp4))
