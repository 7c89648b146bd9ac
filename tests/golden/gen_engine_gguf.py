"""GGUF files of tiny models in data/engine/hf/ (Qwen3-MoE, Mixtral, the dense Qwen3 and
Qwen2, and gpt-oss with MXFP4 experts), written as llama.cpp's convert_hf_to_gguf.py lays them out: the experts of a layer
stacked in one tensor per projection (ffn_gate_exps, ffn_up_exps, ffn_down_exps, dims
[hidden, ffn, experts] fastest first), the router as ffn_gate_inp, and for the "llama"
architecture (Mixtral) the query and key rows permuted from rotate-half to llama.cpp's
adjacent pairs (the Qwen architectures keep Hugging Face's rotate-half, llama.cpp's NEOX
rope). Float32, so the files check the layout and nothing else.

Each file is checked with llama.cpp itself: its logits at every position of the HF golden's
prompts must match transformers' (logits.json) — so the layout is llama.cpp's, not ours.
The engine test (HfLogitsTest, "NAME.gguf") loads these files against the same transformers logits.

Run: .cache/oracle-venv/bin/python tests/golden/gen_engine_gguf.py
"""
import base64
import json
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


def write(case, arch):
    cfg = json.load(open(os.path.join(HF, case, "config.json")))
    t = load_file(os.path.join(HF, case, "model.safetensors"))
    path = os.path.join(OUT, f"{case}.gguf")
    w = gguf.GGUFWriter(path, arch)
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    w.add_name(case)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    experts = cfg.get("num_local_experts", cfg.get("num_experts"))
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(cfg["num_experts_per_tok"])
    if arch == "qwen3moe":
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    # No tokenizer: the prompts are token ids.
    w.add_tokenizer_model("none")

    def tensor(name, array):
        w.add_tensor(name, np.ascontiguousarray(array, dtype=np.float32))

    tensor("token_embd.weight", t["model.embed_tokens.weight"])
    tensor("output_norm.weight", t["model.norm.weight"])
    if not cfg.get("tie_word_embeddings"):
        tensor("output.weight", t["lm_head.weight"])
    moe = "block_sparse_moe" if arch == "llama" else "mlp"
    gate, up, down = ("w1", "w3", "w2") if arch == "llama" else ("gate_proj", "up_proj", "down_proj")
    for layer in range(cfg["num_hidden_layers"]):
        hf = f"model.layers.{layer}."
        blk = f"blk.{layer}."
        q, k = t[hf + "self_attn.q_proj.weight"], t[hf + "self_attn.k_proj.weight"]
        if arch == "llama":
            q, k = permute(q, heads), permute(k, kv_heads)
        tensor(blk + "attn_norm.weight", t[hf + "input_layernorm.weight"])
        tensor(blk + "attn_q.weight", q)
        tensor(blk + "attn_k.weight", k)
        tensor(blk + "attn_v.weight", t[hf + "self_attn.v_proj.weight"])
        tensor(blk + "attn_output.weight", t[hf + "self_attn.o_proj.weight"])
        if arch == "qwen2":
            for p in "qkv":
                tensor(blk + f"attn_{p}.bias", t[hf + f"self_attn.{p}_proj.bias"])
        if arch in ("qwen3", "qwen3moe"):
            tensor(blk + "attn_q_norm.weight", t[hf + "self_attn.q_norm.weight"])
            tensor(blk + "attn_k_norm.weight", t[hf + "self_attn.k_norm.weight"])
        tensor(blk + "ffn_norm.weight", t[hf + "post_attention_layernorm.weight"])
        if not experts:
            for p in ("gate", "up", "down"):
                tensor(blk + f"ffn_{p}.weight", t[hf + f"mlp.{p}_proj.weight"])
            continue
        tensor(blk + "ffn_gate_inp.weight", t[hf + f"{moe}.gate.weight"])
        for gguf_name, hf_name in (("ffn_gate_exps", gate), ("ffn_up_exps", up), ("ffn_down_exps", down)):
            stacked = np.stack([t[hf + f"{moe}.experts.{e}.{hf_name}.weight"] for e in range(experts)])
            tensor(blk + gguf_name + ".weight", stacked)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


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
    """gpt-oss with OpenAI's MXFP4 experts, as convert_hf_to_gguf.py's GptOssModel writes it:
    gate and up split from gate_up_proj's interleaved rows (and its bias), the MXFP4 blocks
    repacked, the second norm named post_attention_norm, the sinks attn_sinks."""
    cfg = json.load(open(os.path.join(HF, case, "config.json")))
    t = load_file(os.path.join(HF, case, "model.safetensors"))
    path = os.path.join(OUT, f"{case}.gguf")
    w = gguf.GGUFWriter(path, "gpt-oss")
    rope = cfg["rope_parameters"]
    w.add_name(case)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(rope["factor"])
    w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(cfg["num_local_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_feed_forward_length(cfg["intermediate_size"])
    w.add_sliding_window(cfg["sliding_window"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE)
    w.add_tokenizer_model("none")

    def tensor(name, array):
        w.add_tensor(name, np.ascontiguousarray(array, dtype=np.float32))

    tensor("token_embd.weight", t["model.embed_tokens.weight"])
    tensor("output_norm.weight", t["model.norm.weight"])
    tensor("output.weight", t["lm_head.weight"])
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
        gate_up = mxfp4_gguf(t[experts + "gate_up_proj_blocks"], t[experts + "gate_up_proj_scales"])
        down = mxfp4_gguf(t[experts + "down_proj_blocks"], t[experts + "down_proj_scales"])
        mxfp4 = gguf.GGMLQuantizationType.MXFP4
        w.add_tensor(blk + "ffn_gate_exps.weight", np.ascontiguousarray(gate_up[:, 0::2]), raw_dtype=mxfp4)
        w.add_tensor(blk + "ffn_up_exps.weight", np.ascontiguousarray(gate_up[:, 1::2]), raw_dtype=mxfp4)
        w.add_tensor(blk + "ffn_down_exps.weight", np.ascontiguousarray(down), raw_dtype=mxfp4)
        bias = t[experts + "gate_up_proj_bias"]
        tensor(blk + "ffn_gate_exps.bias", bias[:, 0::2])
        tensor(blk + "ffn_up_exps.bias", bias[:, 1::2])
        tensor(blk + "ffn_down_exps.bias", t[experts + "down_proj_bias"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def check_with_llamacpp(case, path, tolerance):
    import llama_cpp
    golden = json.load(open(os.path.join(HF, case, "logits.json")))
    llm = llama_cpp.Llama(model_path=path, n_ctx=256, n_threads=2, logits_all=True, verbose=False,
                          type_k=0, type_v=0)  # An f32 KV cache, as the golden computed.
    worst = 0.0
    for prompt in golden["prompts"]:
        want = np.frombuffer(base64.b64decode(prompt["logits_b64"]), dtype=np.float32)
        want = want.reshape(prompt["logits_shape"])
        llm.reset()
        llm.eval(prompt["ids"])
        got = np.array(llm.scores[: len(prompt["ids"])], dtype=np.float32)
        for row_got, row_want in zip(got, want):
            worst = max(worst, float(np.abs(row_got - row_want).max() / np.abs(row_want).max()))
    print(f"{os.path.basename(path)}: llama.cpp against transformers, max relative logit error "
          f"{worst:.2e} (bound {tolerance:.0e})")
    if worst > tolerance:
        raise SystemExit(f"{path}: llama.cpp does not read it as transformers computes it")


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    for case, arch in CASES.items():
        check_with_llamacpp(case, write(case, arch), 1e-4)
    # MXFP4 experts: llama.cpp multiplies them with activations rounded to 8 bits, as Cleave's
    # CPU engine does, hence the golden's own bound (2e-2) instead of float's.
    check_with_llamacpp("gpt_oss_mxfp4", write_gpt_oss("gpt_oss_mxfp4"), 2e-2)
