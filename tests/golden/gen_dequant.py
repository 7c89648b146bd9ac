#!/usr/bin/env python3
"""GGUF dequantization and metadata goldens.

Writes into tests/golden/data/gguf/:
  quant_<TYPE>.gguf        synthetic GGUF v3 files: tensor "q" of TYPE holding
                           random blocks, tensor "expected" (F32, same logical
                           shape) holding the oracle's dequantization of "q".
  smollm2_dequant.json     fingerprints of dequantized tensors of the real
                           SmolLM2 GGUF model.
  smollm2_metadata.json    header, metadata and tensor directory of that file.

Oracle: the `gguf` package (gguf.quants.dequantize, GGUFReader). It has no
Q8_K dequantizer, so Q8_K uses the reference formula y = d * qs written here
in numpy. When llama-cpp-python is installed, every synthetic tensor is also
dequantized by ggml's own C routine (the type's `to_float`, or the exported
`dequantize_row_q8_K` for Q8_K) through ctypes, and the two results must be
bit-identical; the outcome is stored in the metadata key
`cleave.test.crosscheck` of each file.
"""
from __future__ import annotations

import ctypes
import glob
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA_DIR, SMOLLM2_GGUF, fnv1a64, pkg_version, rel, write_json  # noqa: E402

import gguf  # noqa: E402
from gguf import GGMLQuantizationType as QT  # noqa: E402

OUT = DATA_DIR / "gguf"
SEED = 20240611
ROWS = 3

# Byte offsets of the per-block scale fields that must stay finite.
# (offset, kind) with kind "f16" or "f32".
SCALE_FIELDS: dict[str, list[tuple[int, str]]] = {
    "Q4_0": [(0, "f16")],
    "Q4_1": [(0, "f16"), (2, "f16")],
    "Q5_0": [(0, "f16")],
    "Q5_1": [(0, "f16"), (2, "f16")],
    "Q8_0": [(0, "f16")],
    "Q4_K": [(0, "f16"), (2, "f16")],
    "Q5_K": [(0, "f16"), (2, "f16")],
    "Q6_K": [(208, "f16")],
    "Q8_K": [(0, "f32")],
    "MXFP4": [],  # its exponent byte: every value is finite
    "NVFP4": [],  # its UE4M3 scale bytes: every value is finite (0x7F, the NaN, reads as 0)
}

TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
         "Q4_K", "Q5_K", "Q6_K", "Q8_K", "MXFP4", "NVFP4"]


def random_scales(rng: np.random.Generator, n: int) -> np.ndarray:
    mag = rng.uniform(1e-3, 2.0, size=n)
    sign = rng.choice([-1.0, 1.0], size=n)
    return mag * sign


def make_raw(rng: np.random.Generator, type_name: str, cols: int) -> np.ndarray:
    """Raw little-endian bytes of a [ROWS, cols] tensor, shape [ROWS, row_bytes]."""
    qt = QT[type_name]
    block, tsize = gguf.GGML_QUANT_SIZES[qt]
    n = ROWS * cols
    if type_name == "F32":
        vals = rng.standard_normal(n).astype(np.float32) * np.float32(3.0)
        vals[:4] = [0.0, -0.0, 1.0e-40, -3.4e38]  # incl. a subnormal
        return vals.view(np.uint8).reshape(ROWS, -1)
    if type_name == "F16":
        vals = (rng.standard_normal(n) * 4.0).astype(np.float16)
        vals[:5] = [0.0, -0.0, 2.0 ** -24, -65504.0, 6.0e-5]  # subnormal, max
        return vals.view(np.uint8).reshape(ROWS, -1)
    if type_name == "BF16":
        f = (rng.standard_normal(n) * 5.0).astype(np.float32)
        bits = (f.view(np.uint32) >> 16).astype(np.uint16)
        bits[:5] = [0x0000, 0x8000, 0x0001, 0xFF7F, 0x3F80]  # 0,-0,subnormal,-max,1
        return bits.view(np.uint8).reshape(ROWS, -1)
    nblocks = n // block
    blocks = rng.integers(0, 256, size=(nblocks, tsize), dtype=np.uint8)
    for off, kind in SCALE_FIELDS[type_name]:
        s = random_scales(rng, nblocks)
        if kind == "f16":
            blocks[:, off:off + 2] = s.astype("<f2").view(np.uint8).reshape(nblocks, 2)
        else:
            blocks[:, off:off + 4] = s.astype("<f4").view(np.uint8).reshape(nblocks, 4)
    return blocks.reshape(ROWS, -1)


def dequant_q8_k(raw: np.ndarray) -> np.ndarray:
    """Q8_K block: f32 d, int8 qs[256], int16 bsums[16]; y = d * qs."""
    blocks = raw.reshape(-1, 292)
    d = blocks[:, :4].copy().view("<f4").astype(np.float32)
    qs = blocks[:, 4:260].copy().view(np.int8).astype(np.float32)
    return (d * qs).astype(np.float32)


def oracle_dequant(raw: np.ndarray, type_name: str) -> np.ndarray:
    if type_name == "Q8_K":
        out = dequant_q8_k(raw)
    else:
        out = gguf.quants.dequantize(raw, QT[type_name])
    return np.ascontiguousarray(out, dtype=np.float32).reshape(ROWS, -1)


# ---------------------------------------------------------------- ggml cross-check
class _TypeTraits(ctypes.Structure):
    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.c_void_p),
        ("from_float_ref", ctypes.c_void_p),
    ]


_TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_float), ctypes.c_int64)


def load_ggml():
    """ggml-base from the llama-cpp-python wheel, or None."""
    try:
        import llama_cpp  # noqa: F401
    except Exception:
        return None, None
    libdir = Path(llama_cpp.__file__).parent / "lib"
    cands = sorted(glob.glob(str(libdir / "libggml-base.so*"))) or sorted(glob.glob(str(libdir / "libggml.so*")))
    if not cands:
        return None, None
    lib = ctypes.CDLL(cands[0])
    lib.ggml_get_type_traits.restype = ctypes.POINTER(_TypeTraits)
    lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
    return lib, pkg_version("llama_cpp_python")


def ggml_dequant(lib, raw: np.ndarray, type_name: str) -> np.ndarray | None:
    tr = lib.ggml_get_type_traits(int(QT[type_name])).contents
    if type_name == "F32":
        return raw.copy().view("<f4").reshape(ROWS, -1)
    if not tr.to_float:
        # Q8_K is only an intermediate type for ggml's dot products; its traits
        # carry no to_float, but the row routine is exported.
        sym = f"dequantize_row_{type_name.lower()}".replace("_k", "_K")
        if not hasattr(lib, sym):
            return None
        fn = _TO_FLOAT(ctypes.cast(getattr(lib, sym), ctypes.c_void_p).value)
        src = np.ascontiguousarray(raw)
        n = src.nbytes // tr.type_size * tr.blck_size
        out = np.empty(n, dtype=np.float32)
        fn(src.ctypes.data, out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), n)
        return out.reshape(ROWS, -1)
    assert tr.type_name.decode().lower() == type_name.lower(), (tr.type_name, type_name)
    fn = _TO_FLOAT(tr.to_float)
    src = np.ascontiguousarray(raw)
    n = src.nbytes // tr.type_size * tr.blck_size
    out = np.empty(n, dtype=np.float32)
    fn(src.ctypes.data, out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), n)
    return out.reshape(ROWS, -1)


# ---------------------------------------------------------------- synthetic files
def write_synthetic(lib, lib_ver) -> list[str]:
    notes = []
    for i, name in enumerate(TYPES):
        rng = np.random.default_rng(SEED + i)
        qt = QT[name]
        block, _ = gguf.GGML_QUANT_SIZES[qt]
        cols = 2 * block if block == 256 else 256
        raw = make_raw(rng, name, cols)
        expected = oracle_dequant(raw, name)
        assert expected.shape == (ROWS, cols)
        assert np.all(np.isfinite(expected)), name

        cross = "not run (llama-cpp-python missing)"
        if lib is not None:
            ref = ggml_dequant(lib, raw, name)
            if ref is None:
                cross = "not run (ggml has no to_float for this type)"
            elif ref.view(np.uint32).tobytes() == expected.view(np.uint32).tobytes():
                cross = f"bit-identical to ggml to_float (llama-cpp-python {lib_ver})"
            else:
                bad = int(np.sum(ref.view(np.uint32) != expected.view(np.uint32)))
                raise SystemExit(f"{name}: gguf-py and ggml disagree on {bad} values")
        notes.append(f"{name}: {cross}")

        path = OUT / f"quant_{name}.gguf"
        w = gguf.GGUFWriter(path, arch="cleave_test")
        w.add_string("cleave.test.type", name)
        w.add_string("cleave.test.oracle",
                     "numpy reference y = d * qs (gguf-py lacks Q8_K)" if name == "Q8_K"
                     else f"gguf-py {pkg_version('gguf')} gguf.quants.dequantize")
        w.add_string("cleave.test.crosscheck", cross)
        w.add_uint32("cleave.test.seed", SEED + i)
        w.add_tensor("q", raw, raw_dtype=qt)
        w.add_tensor("expected", expected)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

        # read back
        r = gguf.GGUFReader(path)
        tq = next(t for t in r.tensors if t.name == "q")
        te = next(t for t in r.tensors if t.name == "expected")
        assert tq.tensor_type == qt and te.tensor_type == QT.F32
        assert list(tq.shape) == [cols, ROWS] and list(te.shape) == [cols, ROWS]
        assert np.array_equal(np.asarray(tq.data).view(np.uint8).reshape(-1), raw.reshape(-1))
        assert np.asarray(te.data).tobytes() == expected.tobytes()
        assert r.fields["cleave.test.type"].contents() == name
    return notes


# ---------------------------------------------------------------- SmolLM2
FP_TENSORS = [
    "token_embd.weight",          # Q8_0 (the only one)
    "blk.0.attn_q.weight",        # Q4_1
    "blk.0.attn_k.weight",        # Q4_1 (576 x 192)
    "blk.7.ffn_down.weight",      # Q4_1 (1536 x 576)
    "blk.29.ffn_gate.weight",     # Q4_1, last block
    "blk.0.attn_norm.weight",     # F32
    "blk.12.ffn_norm.weight",     # F32
    "output_norm.weight",         # F32
]


def smollm2_dequant(r: gguf.GGUFReader) -> None:
    by_name = {t.name: t for t in r.tensors}
    entries = []
    for k, name in enumerate(FP_TENSORS):
        t = by_name[name]
        data = np.asarray(t.data)
        vals = np.ascontiguousarray(gguf.quants.dequantize(data, t.tensor_type), dtype=np.float32).reshape(-1)
        n = int(t.n_elements)
        assert vals.size == n
        rng = np.random.default_rng(SEED + 1000 + k)
        idx = np.sort(rng.choice(n, size=32, replace=False))
        entries.append({
            "name": name,
            "type": t.tensor_type.name,
            "dims": [int(d) for d in t.shape],
            "n_elements": n,
            "fnv1a64": fnv1a64(vals.astype("<f4").tobytes()),
            "first": [float(v) for v in vals[:64]],
            "at": [[int(i), float(vals[i])] for i in idx],
        })
        print(f"  {name}: {t.tensor_type.name} {[int(d) for d in t.shape]}", flush=True)
    write_json(OUT / "smollm2_dequant.json", {
        "producer": f"tests/golden/gen_dequant.py with gguf-py {pkg_version('gguf')} "
                    f"(gguf.quants.dequantize), numpy {np.__version__}",
        "model": rel(SMOLLM2_GGUF),
        "hash": "FNV-1a 64 over the dequantized values as little-endian float32 bytes, flat order",
        "index_convention": "flat index in file element order: dims[0] is fastest",
        "tensors": entries,
    })


def _field_value(f: gguf.ReaderField):
    v = f.contents()
    if isinstance(v, np.generic):
        v = v.item()
    return v


def smollm2_metadata(r: gguf.GGUFReader) -> None:
    kv = []
    for key, f in r.fields.items():
        if key.startswith("GGUF."):
            continue
        vt = f.types[0]
        ent = {"key": key, "type": vt.name}
        if vt == gguf.GGUFValueType.ARRAY:
            et = f.types[1] if len(f.types) > 1 else None
            ent["element_type"] = et.name if et is not None else None
            n = len(f.data)
            ent["length"] = n
            vals = f.contents()
            if n <= 16:
                ent["value"] = vals
            else:
                ent["head"] = vals[:5]
                ent["tail"] = vals[-5:]
        else:
            v = _field_value(f)
            if isinstance(v, float):
                # float32 widened to double: repr round-trips the float32
                v = float(np.float32(v))
            ent["value"] = v
        kv.append(ent)
    tensors = []
    for t in r.tensors:
        tensors.append({
            "name": t.name,
            "type": t.tensor_type.name,
            "type_id": int(t.tensor_type),
            "dims": [int(d) for d in t.shape],
            "offset": int(t.data_offset - r.data_offset),
            "n_bytes": int(t.n_bytes),
        })
    write_json(OUT / "smollm2_metadata.json", {
        "producer": f"tests/golden/gen_dequant.py with gguf-py {pkg_version('gguf')} GGUFReader",
        "model": rel(SMOLLM2_GGUF),
        "file_size": os.path.getsize(SMOLLM2_GGUF),
        "version": int(r.fields["GGUF.version"].contents()),
        "tensor_count": int(r.fields["GGUF.tensor_count"].contents()),
        "kv_count": int(r.fields["GGUF.kv_count"].contents()),
        "alignment": int(r.alignment),
        "data_offset": int(r.data_offset),
        "metadata": kv,
        "tensors": tensors,
    })


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    lib, lib_ver = load_ggml()
    for line in write_synthetic(lib, lib_ver):
        print("  " + line)
    if not SMOLLM2_GGUF.exists():
        print(f"  {SMOLLM2_GGUF} missing: SmolLM2 goldens skipped")
        return
    r = gguf.GGUFReader(SMOLLM2_GGUF)
    smollm2_metadata(r)
    smollm2_dequant(r)


if __name__ == "__main__":
    main()
