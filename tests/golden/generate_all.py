#!/usr/bin/env python3
"""Regenerate every Cleave golden file under tests/golden/data/.

Run with the oracle virtualenv (see setup_oracles.sh and README.md):
    .cache/oracle-venv/bin/python tests/golden/generate_all.py [name ...]
where each optional name is one of: dequant kv_format safetensors configs tokenizers
engine_hf engine_gguf lora kquant_gguf engine_llamacpp regex.
Every generator is deterministic (fixed seeds, fixed inputs), so a rerun with
the pinned oracle versions rewrites identical bytes.
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
GENERATORS = {
    "dequant": "gen_dequant.py",
    "kv_format": "gen_kv_format.py",
    "safetensors": "gen_safetensors.py",
    "configs": "gen_configs.py",
    "tokenizers": "gen_tokenizers.py",
    "chat_templates": "gen_chat_templates.py",
    "engine_hf": "gen_engine_hf.py",
    "engine_gguf": "gen_engine_gguf.py",  # From engine_hf's folders.
    "lora": "gen_lora.py",  # Adapters on engine_hf's folders.
    "kquant_gguf": "gen_kquant_gguf.py",
    "engine_llamacpp": "gen_engine_llamacpp.py",
    "regex": "gen_regex.py",
}
MAX_FILE_BYTES = 1 << 20


def main(argv: list[str]) -> int:
    names = argv or list(GENERATORS)
    unknown = [n for n in names if n not in GENERATORS]
    if unknown:
        print(f"unknown generator(s): {unknown}; choose from {list(GENERATORS)}", file=sys.stderr)
        return 2
    for name in names:
        t0 = time.monotonic()
        print(f"[{name}] {GENERATORS[name]}", flush=True)
        subprocess.run([sys.executable, str(HERE / GENERATORS[name])], check=True, cwd=HERE.parent.parent)
        print(f"[{name}] done in {time.monotonic() - t0:.1f}s", flush=True)
    data = HERE / "data"
    files = sorted(p for p in data.rglob("*") if p.is_file())
    total = sum(p.stat().st_size for p in files)
    big = [p for p in files if p.stat().st_size > MAX_FILE_BYTES]
    print(f"{len(files)} files, {total / 1024:.0f} KiB under {data.relative_to(HERE.parent.parent)}")
    for p in big:
        print(f"too large (> 1 MiB): {p}", file=sys.stderr)
    return 1 if big else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
