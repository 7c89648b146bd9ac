#!/usr/bin/env python3
"""KV cache element encodings: float32 -> bfloat16 and -> float8 e4m3fn codes.

Writes tests/golden/data/kv_format/codes.json: float32 inputs (as bit patterns) and the
codes ml_dtypes rounds them to (nearest, ties to even). Inputs: normal values at many
magnitudes, e4m3's subnormal range, the exact midpoints between neighbouring codes (ties)
of both formats, and values next to e4m3's largest finite value 448 (ml_dtypes turns what
lies beyond it into NaN; Cleave saturates, which its own test checks).
"""
from __future__ import annotations

import sys
from pathlib import Path

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DATA_DIR, pkg_version, write_json  # noqa: E402

OUT = DATA_DIR / "kv_format"
SEED = 20261201


def inputs(rng: np.random.Generator) -> np.ndarray:
    parts = []
    for magnitude in (1e-4, 3e-3, 0.05, 1.0, 7.0, 60.0, 300.0):
        parts.append(rng.standard_normal(256) * magnitude)
    parts.append(rng.uniform(-2.0 ** -6, 2.0 ** -6, 256))  # e4m3 subnormals.
    # Midpoints of neighbouring e4m3 codes (positive finite ones), with both signs.
    codes = np.arange(0, 0x7F, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    mids = (codes[:-1] + codes[1:]) / 2
    parts += [mids, -mids]
    # bf16 ties: float32s whose low 16 bits are exactly half a bf16 step.
    high = rng.integers(0x3000, 0x4400, 256, dtype=np.uint32)
    ties = ((high << 16) | 0x8000).view(np.float32).astype(np.float64)
    parts += [ties, -ties]
    parts.append(np.array([0.0, -0.0, 440.0, 447.0, 448.0, -448.0, 2.0 ** -9, 2.0 ** -10,
                           3 * 2.0 ** -10, 1e-30]))
    x = np.concatenate(parts).astype(np.float32)
    # ml_dtypes maps past-448 to NaN; keep the finite range.
    return x[np.abs(x) <= 448.0]


def main() -> None:
    rng = np.random.default_rng(SEED)
    x = inputs(rng)
    bf16 = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    e4m3 = x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    OUT.mkdir(parents=True, exist_ok=True)
    write_json(OUT / "codes.json", {
        "producer": f"gen_kv_format.py; ml_dtypes {pkg_version('ml_dtypes')}, numpy {np.__version__}",
        "input_bits": [int(v) for v in x.view(np.uint32)],
        "bf16": [int(v) for v in bf16],
        "e4m3": [int(v) for v in e4m3],
    })
    print(f"{len(x)} values -> {OUT / 'codes.json'}")


if __name__ == "__main__":
    main()
