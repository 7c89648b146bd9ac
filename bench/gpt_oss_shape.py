#!/usr/bin/env python3
"""A random-weight checkpoint shaped like gpt-oss-20b (its config.json, fewer layers), stored as
OpenAI publishes it: attention, router and embeddings in bf16, the experts MXFP4 (_blocks and
_scales), for measuring the CPU engine on the real model's shapes against their floors:

  /usr/bin/python3 bench/gpt_oss_shape.py --out build/gpt-oss-shape --layers 2
  build/default/bin/bench_engine build/gpt-oss-shape --threads 2 --prefill 128 --batch 1,4,16

Only the Python standard library: weights are drawn with random.Random, written as raw bytes.
Magnitudes are those of a trained model (weights ~ N(0, 0.02), MXFP4 exponents around 2^-8), so
no value is subnormal or overflows; the logits mean nothing.
"""
import argparse
import json
import os
import random
import struct

# gpt-oss-20b's config.json (OpenAI's), less its layer count.
CONFIG = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "attention_bias": True,
    "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2880, "intermediate_size": 2880, "max_position_embeddings": 131072,
    "num_attention_heads": 64, "num_experts_per_tok": 4, "num_key_value_heads": 8,
    "num_local_experts": 32, "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                     "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False},
    "rope_theta": 150000, "sliding_window": 128, "swiglu_limit": 7.0, "tie_word_embeddings": False,
    "vocab_size": 201088,
    "quantization_config": {"quant_method": "mxfp4",
                            "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                       "model.embed_tokens", "lm_head"]},
}


def bf16_bytes(rng, count, std):
    """`count` bf16 values ~ N(0, std), drawn in chunks (a table of 4096 draws reused with a
    random rotation: the bytes only need realistic magnitudes)."""
    table = bytearray()
    for _ in range(4096):
        bits = struct.unpack("<I", struct.pack("<f", rng.gauss(0.0, std)))[0]
        table += struct.pack("<H", bits >> 16)
    out = bytearray()
    while len(out) < 2 * count:
        k = rng.randrange(4096) * 2
        out += table[k:] + table[:k]
    return bytes(out[: 2 * count])


def write(out, layers, seed):
    rng = random.Random(seed)
    cfg = dict(CONFIG, num_hidden_layers=layers,
               layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)])
    h, f, e = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_local_experts"]
    q, kv, vocab = cfg["num_attention_heads"] * 64, cfg["num_key_value_heads"] * 64, cfg["vocab_size"]
    tensors = []  # (name, dtype, shape, bytes)

    def bf16(name, shape, std=0.02):
        n = 1
        for d in shape:
            n *= d
        tensors.append((name, "BF16", shape, bf16_bytes(rng, n, std)))

    def mxfp4(name, rows, cols):
        groups = cols // 32
        codes = bytes(rng.getrandbits(8) for _ in range(4096))
        blocks = bytearray()
        while len(blocks) < e * rows * groups * 16:
            k = rng.randrange(4096)
            blocks += codes[k:] + codes[:k]
        tensors.append((name + "_blocks", "U8", [e, rows, groups, 16], bytes(blocks[: e * rows * groups * 16])))
        tensors.append((name + "_scales", "U8", [e, rows, groups],
                        bytes(118 + rng.randrange(6) for _ in range(e * rows * groups))))

    bf16("model.embed_tokens.weight", [vocab, h])
    bf16("lm_head.weight", [vocab, h])
    bf16("model.norm.weight", [h], 0.1)
    for layer in range(layers):
        p = f"model.layers.{layer}."
        bf16(p + "input_layernorm.weight", [h], 0.1)
        bf16(p + "post_attention_layernorm.weight", [h], 0.1)
        for name, rows in (("q", q), ("k", kv), ("v", kv)):
            bf16(p + f"self_attn.{name}_proj.weight", [rows, h])
            bf16(p + f"self_attn.{name}_proj.bias", [rows])
        bf16(p + "self_attn.o_proj.weight", [h, q])
        bf16(p + "self_attn.o_proj.bias", [h])
        bf16(p + "self_attn.sinks", [cfg["num_attention_heads"]], 1.0)
        bf16(p + "mlp.router.weight", [e, h])
        bf16(p + "mlp.router.bias", [e])
        mxfp4(p + "mlp.experts.gate_up_proj", 2 * f, h)
        mxfp4(p + "mlp.experts.down_proj", h, f)
        bf16(p + "mlp.experts.gate_up_proj_bias", [e, 2 * f])
        bf16(p + "mlp.experts.down_proj_bias", [e, h])

    os.makedirs(out, exist_ok=True)
    header, offset = {}, 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(os.path.join(out, "model.safetensors"), "wb") as file:
        file.write(struct.pack("<Q", len(encoded)) + encoded)
        for _, _, _, data in tensors:
            file.write(data)
    with open(os.path.join(out, "config.json"), "w") as file:
        json.dump(cfg, file, indent=2)
    print(f"{out}: {layers} layers of gpt-oss-20b, {offset / 2**30:.2f} GiB")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="build/gpt-oss-shape")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    write(args.out, args.layers, args.seed)
