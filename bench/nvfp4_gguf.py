#!/usr/bin/env python3
"""A GGUF file's weights as NVFP4 (GGUF type 40), for measuring the CPU engine and llama.cpp on
the same NVFP4 file:

  .cache/oracle-venv/bin/python bench/nvfp4_gguf.py models/SmolLM2-135M-Instruct.Q4_1.gguf \\
      build/nvfp4/smollm2-nvfp4.gguf
  build/default/bin/bench_engine build/nvfp4/smollm2-nvfp4.gguf --threads 2
  .cache/oracle-venv/bin/python bench/llamacpp_peer.py build/nvfp4/smollm2-nvfp4.gguf --threads 2

Every 2-D weight of a layer whose rows are whole 64-element blocks is decoded by the gguf
package and quantized again by llama.cpp's own reference quantizer (quantize_row_nvfp4_ref, as
its NVFP4 file type would; that version's llama-quantize cannot write it); the embeddings and
the output head keep their format, as llama.cpp's quantizer keeps them at higher precision.
Requantizing an already quantized file adds its rounding to the NVFP4 one: fine for timing,
not for judging NVFP4's accuracy. Needs the gguf package and llama-cpp-python (the oracle
environment, tests/golden/README).
"""
import argparse
import ctypes
import glob
import os

import gguf
import numpy as np


def quantizer():
    import llama_cpp
    lib = ctypes.CDLL(sorted(glob.glob(os.path.join(os.path.dirname(llama_cpp.__file__), "lib",
                                                    "libggml-base.so*")))[0])
    lib.quantize_row_nvfp4_ref.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    return lib.quantize_row_nvfp4_ref


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source")
    parser.add_argument("out")
    args = parser.parse_args()
    quantize = quantizer()
    reader = gguf.GGUFReader(args.source)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    writer = gguf.GGUFWriter(args.out, arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        value = field.contents()
        if field.name == gguf.Keys.General.FILE_TYPE:
            value = int(gguf.LlamaFileType.MOSTLY_NVFP4)
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, field.types[0], sub_type=sub_type)
    converted = 0
    for t in reader.tensors:
        shape = [int(d) for d in reversed(t.shape)]  # rows first
        if t.name.startswith("blk.") and len(shape) == 2 and shape[1] % 64 == 0:
            values = np.ascontiguousarray(
                gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape), dtype=np.float32)
            blocks = np.empty((shape[0], shape[1] // 64 * 36), dtype=np.uint8)
            quantize(values.ctypes.data, blocks.ctypes.data, values.size)
            writer.add_tensor(t.name, blocks, raw_dtype=gguf.GGMLQuantizationType.NVFP4)
            converted += 1
        else:
            writer.add_tensor(t.name, np.asarray(t.data), raw_shape=t.data.shape,
                              raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"{args.out}: {converted} of {len(reader.tensors)} tensors in NVFP4")


if __name__ == "__main__":
    main()
