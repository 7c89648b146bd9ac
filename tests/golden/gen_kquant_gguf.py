"""A Q4_K_M GGUF file made by llama.cpp's own quantizer, and the logits of the model it
stores, for the engine's end-to-end test of the K-quant formats (Q4_K and Q6_K, the two a
Q4_K_M file holds).

1. A small random Llama (hidden 256, so every matrix is whole 256-element super-blocks) is
   written as float32 GGUF.
2. llama.cpp quantizes it to Q4_K_M (llama_model_quantize): data/engine/gguf/llama_q4_k_m.gguf.
3. gguf-py dequantizes every tensor of that file back to float32 (an implementation apart
   from both llama.cpp's and ours), and llama.cpp runs that float32 model: its logits are
   the exact model the Q4_K_M file stores, with no activation quantization.
4. llama.cpp also runs the Q4_K_M file itself (its activations quantized as it does); how
   far that lands from the exact logits is the yardstick the engine test holds the engine to.

Writes data/engine/gguf/llama_q4_k_m.gguf and llama_q4_k_m.json.

Run: .cache/oracle-venv/bin/python tests/golden/gen_kquant_gguf.py
"""
import base64
import ctypes
import json
import os
import tempfile

import gguf
import llama_cpp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "data", "engine", "gguf")
NAME = "llama_q4_k_m"
SHAPE = {"vocab": 512, "hidden": 256, "heads": 4, "kv_heads": 2, "ffn": 512, "layers": 2,
         "context": 256}


def metadata(w):
    s = SHAPE
    w.add_name(NAME)
    w.add_context_length(s["context"])
    w.add_embedding_length(s["hidden"])
    w.add_block_count(s["layers"])
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(s["vocab"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("none")  # The prompts are token ids.


def write(path, tensors):
    w = gguf.GGUFWriter(path, "llama")
    metadata(w)
    for name, array in tensors.items():
        w.add_tensor(name, np.ascontiguousarray(array, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def random_model(rng):
    s = SHAPE
    head_dim = s["hidden"] // s["heads"]

    def matrix(rows, cols):
        return rng.standard_normal((rows, cols)).astype(np.float32) / np.sqrt(cols)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    t = {"token_embd.weight": rng.standard_normal((s["vocab"], s["hidden"])).astype(np.float32),
         "output_norm.weight": norm(s["hidden"]),
         "output.weight": matrix(s["vocab"], s["hidden"])}
    for layer in range(s["layers"]):
        b = f"blk.{layer}."
        t[b + "attn_norm.weight"] = norm(s["hidden"])
        t[b + "attn_q.weight"] = matrix(s["heads"] * head_dim, s["hidden"])
        t[b + "attn_k.weight"] = matrix(s["kv_heads"] * head_dim, s["hidden"])
        t[b + "attn_v.weight"] = matrix(s["kv_heads"] * head_dim, s["hidden"])
        t[b + "attn_output.weight"] = matrix(s["hidden"], s["heads"] * head_dim)
        t[b + "ffn_norm.weight"] = norm(s["hidden"])
        t[b + "ffn_gate.weight"] = matrix(s["ffn"], s["hidden"])
        t[b + "ffn_up.weight"] = matrix(s["ffn"], s["hidden"])
        t[b + "ffn_down.weight"] = matrix(s["hidden"], s["ffn"])
    return t


def quantize(src, dst):
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
    params.nthread = 2
    if llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params)) != 0:
        raise SystemExit("llama.cpp could not quantize the model")


def dequantized(path):
    """Every tensor of `path` as float32, by gguf-py, with its types."""
    reader = gguf.GGUFReader(path)
    tensors, types = {}, {}
    for t in reader.tensors:
        types[t.name] = t.tensor_type.name
        tensors[t.name] = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
    return tensors, types


def logits(path, prompts):
    llm = llama_cpp.Llama(model_path=path, n_ctx=SHAPE["context"], n_threads=2, logits_all=True,
                          verbose=False, type_k=0, type_v=0)  # An f32 KV cache.
    out = []
    for ids in prompts:
        llm.reset()
        llm.eval(ids)
        out.append(np.array(llm.scores[: len(ids)], dtype=np.float32))
    return out


def main():
    rng = np.random.default_rng(20261202)
    prompts = [[int(v) for v in rng.integers(0, SHAPE["vocab"], n)] for n in (7, 23, 41)]
    path = os.path.join(OUT, f"{NAME}.gguf")
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "f32.gguf")
        write(source, random_model(rng))
        quantize(source, path)
        tensors, types = dequantized(path)
        kinds = sorted(set(types.values()))
        if "Q4_K" not in kinds or "Q6_K" not in kinds:
            raise SystemExit(f"{path} holds {kinds}, not both Q4_K and Q6_K")
        exact_path = os.path.join(tmp, "dequantized.gguf")
        write(exact_path, tensors)
        exact = logits(exact_path, prompts)
    quantized = logits(path, prompts)
    worst = 0.0
    for want, got in zip(exact, quantized):
        for row_want, row_got in zip(want, got):
            worst = max(worst, float(np.abs(row_got - row_want).max() / np.abs(row_want).max()))
    golden = {
        "tensor_types": types,
        "llamacpp_max_rel": worst,
        "prompts": [{"ids": ids, "logits_shape": list(e.shape),
                     "logits_b64": base64.b64encode(e.astype("<f4").tobytes()).decode()}
                    for ids, e in zip(prompts, exact)],
    }
    with open(os.path.join(OUT, f"{NAME}.json"), "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    print(f"{path}: {kinds}; llama.cpp on it against the dequantized model: max relative logit "
          f"error {worst:.2e}")


if __name__ == "__main__":
    main()
