#!/usr/bin/env bash
# Create .cache/oracle-venv with the oracle libraries that generate the goldens.
# Versions are pinned to the ones that produced the committed data.
# Needs network access to PyPI and a C/C++ toolchain with CMake: llama-cpp-python
# builds llama.cpp from source (several minutes on 2 cores).
# CLEAVE_ORACLE_NO_TORCH=1 skips torch (several GB); transformers' GGUF reader
# and gen_engine_hf.py need it, so without it tokenizers/smollm2_gguf/golden_hf.json
# and engine/hf/ are left as is.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="$ROOT/.cache/oracle-venv"
PYTHON="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip)
"${PIP[@]}" install --upgrade pip

"${PIP[@]}" install \
    numpy==2.4.6 \
    gguf==0.19.0 \
    safetensors==0.8.0 \
    ml_dtypes==0.6.0 \
    tokenizers==0.23.3 \
    transformers==5.24.0 \
    sentencepiece==0.2.3 \
    protobuf==7.36.2

CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF}" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
    "${PIP[@]}" install llama-cpp-python==0.3.36

if [ "${CLEAVE_ORACLE_NO_TORCH:-0}" != "1" ]; then
    "${PIP[@]}" install torch==2.15.0 compressed-tensors==0.20.1 peft==0.21.2
fi

echo "oracle venv ready: $VENV"
echo "regenerate: $VENV/bin/python tests/golden/generate_all.py"
