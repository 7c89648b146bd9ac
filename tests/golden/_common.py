"""Shared helpers for the Cleave golden-data generators.

Every generator imports this module; nothing here talks to the network.
"""
from __future__ import annotations

import base64
import importlib.metadata
import json
import math
import os
from pathlib import Path
from typing import Any

GOLDEN_DIR = Path(__file__).resolve().parent
DATA_DIR = GOLDEN_DIR / "data"
REPO_ROOT = GOLDEN_DIR.parent.parent
SMOLLM2_GGUF = REPO_ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"

FNV64_OFFSET = 0xCBF29CE484222325
FNV64_PRIME = 0x100000001B3
_MASK64 = (1 << 64) - 1


def fnv1a64(data: bytes | bytearray | memoryview) -> str:
    """FNV-1a 64-bit over raw bytes, as a 16-digit lower-case hex string."""
    h = FNV64_OFFSET
    prime = FNV64_PRIME
    mask = _MASK64
    for b in bytes(data):
        h = ((h ^ b) * prime) & mask
    return f"{h:016x}"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def pkg_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not-installed"


def _is_leaf(v: Any) -> bool:
    return not isinstance(v, (dict, list)) or (
        isinstance(v, list) and all(not isinstance(x, (dict, list)) for x in v))


def _check_finite(v: Any) -> None:
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"non-finite float in golden data: {v!r}")


def _dump(v: Any, indent: int) -> str:
    """JSON text where lists of scalars stay on one line and containers nest.

    Floats are written with Python's repr, which round-trips exactly (for a
    float32 value widened to double, parsing the text as double and narrowing
    to float gives back the same float32).
    """
    pad = " " * indent
    if isinstance(v, dict):
        if not v:
            return "{}"
        items = []
        for k, x in v.items():
            items.append(f"{pad} {json.dumps(str(k))}: {_dump(x, indent + 1)}")
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(v, list):
        if _is_leaf(v):
            for x in v:
                _check_finite(x)
            return "[" + ",".join(json.dumps(x, allow_nan=False) for x in v) + "]"
        items = [f"{pad} {_dump(x, indent + 1)}" for x in v]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    _check_finite(v)
    return json.dumps(v, allow_nan=False)


def write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = _dump(obj, 0) + "\n"
    json.loads(text)  # sanity: must parse back
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text, encoding="ascii")
    os.replace(tmp, path)


def rel(path: Path) -> str:
    return str(Path(path).resolve().relative_to(REPO_ROOT))
