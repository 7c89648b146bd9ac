#!/usr/bin/env python3
"""safetensors goldens.

Writes into tests/golden/data/safetensors/:
  all_dtypes.safetensors           one small random tensor per dtype
  sharded/                         two shards + model.safetensors.index.json
  fp8_block/                       block-scaled FP8 (e4m3, 128x128 blocks)
  nvfp4/                           NVFP4 (packed e2m1, e4m3 group scales)
  expected.json                    what a reader must find in every file

Oracle: the `safetensors` package writes every file (numpy API; BF16 and the
FP8 formats are numpy dtypes provided by `ml_dtypes`, which safetensors maps to
its BF16 / F8_E4M3 / F8_E5M2 codes). Element values in expected.json are
decoded by ml_dtypes (exact widening to float64). Byte ranges come from the
file header as written.
"""
from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA_DIR, fnv1a64, pkg_version, write_json  # noqa: E402

OUT = DATA_DIR / "safetensors"
SEED = 7_340_033

E4M3 = ml_dtypes.float8_e4m3fn
E5M2 = ml_dtypes.float8_e5m2
BF16 = ml_dtypes.bfloat16

# Every finite fp8 bit pattern (e4m3fn: only 0x7F/0xFF are NaN; e5m2:
# exponent 31 is Inf/NaN).
E4M3_FINITE = np.array([b for b in range(256) if (b & 0x7F) != 0x7F], dtype=np.uint8)
E5M2_FINITE = np.array([b for b in range(256) if (b & 0x7C) != 0x7C], dtype=np.uint8)
E2M1_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def fp8_random(rng, shape, finite_codes, dtype):
    return rng.choice(finite_codes, size=shape).astype(np.uint8).view(dtype)


def bf16_random(rng, shape):
    f = (rng.standard_normal(shape) * 3.0).astype(np.float32)
    bits = (f.view(np.uint32) >> 16).astype(np.uint16)
    flat = bits.reshape(-1)
    flat[:3] = [0x8000, 0x0001, 0x7F7F][: flat.size]  # -0, subnormal, max
    return bits.view(BF16)


def header_of(path: Path) -> tuple[int, dict]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return n, json.loads(raw[8:8 + n])


def describe_file(path: Path, root: Path) -> dict:
    """Describe every tensor of one file, reading it back with safe_open."""
    hlen, header = header_of(path)
    raw = path.read_bytes()
    base = 8 + hlen
    tensors = []
    with safe_open(str(path), framework="np") as f:
        names = list(f.keys())
    for name in sorted(k for k in header if k != "__metadata__"):
        h = header[name]
        b, e = h["data_offsets"]
        blob = raw[base + b: base + e]
        dt = h["dtype"]
        if dt in ("BF16", "F8_E4M3", "F8_E5M2"):
            arr = np.frombuffer(blob, dtype="<u2" if dt == "BF16" else np.uint8).view(
                {"BF16": BF16, "F8_E4M3": E4M3, "F8_E5M2": E5M2}[dt])
        else:
            arr = np.frombuffer(blob, dtype={"F16": "<f2", "F32": "<f4", "F64": "<f8", "U8": "u1",
                                             "I8": "i1", "I16": "<i2", "I32": "<i4",
                                             "I64": "<i8"}[dt])
        if dt in ("U8", "I8", "I16", "I32", "I64"):
            vals = [int(v) for v in arr[:16]]
        else:
            vals = [float(v) for v in arr[:16].astype(np.float64)]
        assert name in names
        n_el = int(np.prod(h["shape"], dtype=np.int64)) if h["shape"] else 1
        assert arr.size == n_el, (name, arr.size, n_el)
        tensors.append({
            "file": str(path.relative_to(root)),
            "name": name,
            "dtype": dt,
            "shape": h["shape"],
            "data_offsets": [b, e],
            "n_bytes": e - b,
            "fnv1a64": fnv1a64(blob),
            "values": vals,
        })
    return {
        "file": str(path.relative_to(root)),
        "file_size": path.stat().st_size,
        "header_size": hlen,
        "data_start": base,
        "metadata": header.get("__metadata__"),
        "tensors": tensors,
    }


def gen_all_dtypes(rng) -> Path:
    t = {
        "bf16_3x5": bf16_random(rng, (3, 5)),
        "f16_7": (rng.standard_normal(7) * 10).astype(np.float16),
        "f32_2x3x4": rng.standard_normal((2, 3, 4)).astype(np.float32),
        "f8_e4m3_3x5": fp8_random(rng, (3, 5), E4M3_FINITE, E4M3),
        "f8_e5m2_2x3x4": fp8_random(rng, (2, 3, 4), E5M2_FINITE, E5M2),
        "u8_7": rng.integers(0, 256, 7, dtype=np.uint8),
        "i8_3x5": rng.integers(-128, 128, (3, 5), dtype=np.int8),
        "i32_1": np.array([-2_000_000_123], dtype=np.int32),
        "i64_2x3": np.array([[-(2 ** 53) + 1, -1, 0], [1, 2 ** 40, 2 ** 53 - 1]], dtype=np.int64),
        "f32_scalar": np.array(3.25, dtype=np.float32),  # shape []
    }
    p = OUT / "all_dtypes.safetensors"
    save_file(t, p, metadata={"format": "pt", "note": "cleave golden"})
    return p


def gen_sharded(rng) -> list[Path]:
    d = OUT / "sharded"
    d.mkdir(parents=True, exist_ok=True)
    hidden, inter, vocab = 16, 40, 48
    shard1 = {
        "model.embed_tokens.weight": bf16_random(rng, (vocab, hidden)),
        "model.layers.0.input_layernorm.weight": np.ones(hidden, dtype=BF16),
        "model.layers.0.self_attn.q_proj.weight": bf16_random(rng, (hidden, hidden)),
        "model.layers.0.self_attn.k_proj.weight": bf16_random(rng, (8, hidden)),
        "model.layers.0.self_attn.v_proj.weight": bf16_random(rng, (8, hidden)),
        "model.layers.0.self_attn.o_proj.weight": bf16_random(rng, (hidden, hidden)),
    }
    shard2 = {
        "model.layers.0.post_attention_layernorm.weight": np.ones(hidden, dtype=BF16),
        "model.layers.0.mlp.gate_proj.weight": bf16_random(rng, (inter, hidden)),
        "model.layers.0.mlp.up_proj.weight": bf16_random(rng, (inter, hidden)),
        "model.layers.0.mlp.down_proj.weight": bf16_random(rng, (hidden, inter)),
        "model.norm.weight": np.ones(hidden, dtype=BF16),
        "lm_head.weight": bf16_random(rng, (vocab, hidden)),
    }
    files = []
    weight_map = {}
    total = 0
    for i, shard in enumerate([shard1, shard2], start=1):
        fname = f"model-{i:05d}-of-00002.safetensors"
        save_file(shard, d / fname, metadata={"format": "pt"})
        files.append(d / fname)
        for k, v in shard.items():
            weight_map[k] = fname
            total += v.nbytes
    index = {"metadata": {"total_size": total},
             "weight_map": {k: weight_map[k] for k in sorted(weight_map)}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return files


def gen_fp8_block(rng) -> tuple[Path, dict]:
    d = OUT / "fp8_block"
    d.mkdir(parents=True, exist_ok=True)
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 256,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "vocab_size": 256,
        "torch_dtype": "bfloat16",
        "quantization_config": {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": [128, 128],
        },
    }
    (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    # weights: random finite e4m3 bytes; scale_inv per 128x128 block
    w = fp8_random(rng, (256, 256), E4M3_FINITE, E4M3)
    s = rng.uniform(1e-4, 1e-2, size=(2, 2)).astype(np.float32)
    name = "model.layers.0.mlp.down_proj.weight"
    p = d / "model.safetensors"
    save_file({name: w, name + "_scale_inv": s}, p, metadata={"format": "pt"})
    # reference dequantization: W[i, j] = fp8(W[i, j]) * scale_inv[i // 128, j // 128]
    full_scale = np.repeat(np.repeat(s, 128, axis=0), 128, axis=1)
    deq = (w.astype(np.float32) * full_scale).astype(np.float32)
    picks = np.random.default_rng(SEED + 5).choice(256 * 256, 32, replace=False)
    picks.sort()
    ref = {
        "tensor": name,
        "rule": "out[i][j] = float(e4m3(w[i][j])) * scale_inv[i/128][j/128], float32 multiply",
        "shape": [256, 256],
        "fnv1a64": fnv1a64(deq.astype("<f4").tobytes()),
        "at": [[int(k), float(deq.reshape(-1)[k])] for k in picks],
    }
    return p, ref


def fp4_unpack(packed: np.ndarray) -> np.ndarray:
    """Two e2m1 codes per byte: element 2k in the low nibble, 2k+1 in the high nibble."""
    lo = packed & 0x0F
    hi = packed >> 4
    codes = np.stack([lo, hi], axis=-1).reshape(packed.shape[0], -1)
    mag = np.array(E2M1_VALUES, dtype=np.float32)[codes & 0x7]
    return np.where(codes & 0x8, -mag, mag).astype(np.float32)


def gen_nvfp4(rng) -> tuple[Path, dict]:
    d = OUT / "nvfp4"
    d.mkdir(parents=True, exist_ok=True)
    hq = {"producer": {"name": "modelopt"},
          "quantization": {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]}}
    (d / "hf_quant_config.json").write_text(json.dumps(hq, indent=2) + "\n")
    prefix = "model.layers.0.mlp.down_proj."
    packed = rng.integers(0, 256, (64, 32), dtype=np.uint8)
    # positive finite e4m3 group scales in [2^-3, 2^5]
    pos = np.array([b for b in E4M3_FINITE if b < 0x80 and 0x18 <= b <= 0x68], dtype=np.uint8)
    scale = rng.choice(pos, size=(64, 4)).astype(np.uint8).view(E4M3)
    scale2 = np.array(np.float32(rng.uniform(1e-3, 1e-2)), dtype=np.float32)
    in_scale = np.array(np.float32(rng.uniform(0.01, 0.1)), dtype=np.float32)
    p = d / "model.safetensors"
    save_file({prefix + "weight": packed, prefix + "weight_scale": scale,
               prefix + "weight_scale_2": scale2, prefix + "input_scale": in_scale},
              p, metadata={"format": "pt"})
    vals = fp4_unpack(packed)  # [64, 64]
    gs = np.repeat(scale.astype(np.float32), 16, axis=1)
    deq = ((vals * gs) * scale2).astype(np.float32)
    picks = np.random.default_rng(SEED + 6).choice(64 * 64, 32, replace=False)
    picks.sort()
    ref = {
        "tensor": prefix + "weight",
        "rule": ("logical shape [64, 64]; byte w[i][k] holds element 2k in bits 0-3 and 2k+1 in "
                 "bits 4-7; e2m1 code: bit3 sign, magnitudes {0,0.5,1,1.5,2,3,4,6}; "
                 "out[i][j] = (e2m1 * float(e4m3(weight_scale[i][j/16]))) * weight_scale_2, float32"),
        "shape": [64, 64],
        "fnv1a64": fnv1a64(deq.astype("<f4").tobytes()),
        "first": [float(v) for v in deq.reshape(-1)[:16]],
        "at": [[int(k), float(deq.reshape(-1)[k])] for k in picks],
    }
    return p, ref


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    files = [gen_all_dtypes(rng)]
    files += gen_sharded(rng)
    fp8_path, fp8_ref = gen_fp8_block(rng)
    nv_path, nv_ref = gen_nvfp4(rng)
    files += [fp8_path, nv_path]
    write_json(OUT / "expected.json", {
        "producer": (f"tests/golden/gen_safetensors.py with safetensors {pkg_version('safetensors')}, "
                     f"ml_dtypes {pkg_version('ml_dtypes')}, numpy {np.__version__}"),
        "conventions": ("paths relative to this folder; shape outermost first; data_offsets are "
                        "[begin, end) relative to data_start = 8 + header_size; values = first 16 "
                        "elements in row-major order; float dtypes widened exactly to float64, "
                        "integer dtypes written as JSON integers (all exact in float64 too)"),
        "files": [describe_file(p, OUT) for p in files],
        "sharded_index": json.loads((OUT / "sharded" / "model.safetensors.index.json").read_text()),
        "dequant_reference": {"fp8_block": fp8_ref, "nvfp4": nv_ref},
    })


if __name__ == "__main__":
    main()
