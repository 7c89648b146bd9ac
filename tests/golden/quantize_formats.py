"""Quantized checkpoint formats for the engine goldens, written from each format's own
definition and decoded back by the format's owners where their code runs on a CPU.

quantize_checkpoint(folder, kind) rewrites folder/model.safetensors with every linear
weight of the decoder layers (attention, dense MLP, routed and shared experts; not the
router gate, the embedding or lm_head) quantized, writes the config files that declare the
scheme, and returns {tensor name: float32 weight the stored bytes decode to}. The logits of
a quantized case are transformers' on a float checkpoint made of those decoded weights:
the engine runs these checkpoints weight-only, so that is exactly what it must reproduce.

Kinds
  fp8_hf          Hugging Face "fp8" (DeepSeek-V3 / Qwen FP8): F8_E4M3 weight and F32
                  weight_scale_inv per [16, 32] block (multiplied, despite the name).
  fp8_hf_128      the same with DeepSeek-V3's own [128, 128] blocks (what the GPU's FP8
                  kernels read natively).
  fp8_modelopt    ModelOpt FP8 (hf_quant_config.json quant_algo FP8): per-tensor F32
                  weight_scale and input_scale.
  fp8_ct_channel  compressed-tensors float-quantized, strategy channel: weight_scale
                  [rows, 1] in BF16 (compressed-tensors stores scales in the model dtype).
  fp8_ct_block    compressed-tensors float-quantized, strategy block [16, 32]: F32
                  weight_scale grid.
  nvfp4_modelopt  ModelOpt NVFP4: U8 weight (two E2M1 codes, low nibble first), F8_E4M3
                  weight_scale per 16 elements, F32 weight_scale_2 and input_scale.
  nvfp4_ct        compressed-tensors nvfp4-pack-quantized, produced from the ModelOpt
                  tensors by compressed-tensors' own ModelOpt converter (weight_packed,
                  weight_global_scale = 1 / weight_scale_2, input_global_scale) with the
                  quantization_config compressed-tensors itself serializes.
  int4_ct         compressed-tensors pack-quantized int4 (W4A16), symmetric, a BF16 scale
                  per 32 elements of a row (absmax / 7.5 rounded to bf16, as compressed-tensors
                  stores scales in the model dtype), packed by compressed-tensors' own
                  PackedQuantizationCompressor; its unpacking gives the codes round(w / s).
  mxfp4_experts   gpt-oss as OpenAI publishes it: only the stacked experts (gate_up_proj,
                  down_proj) quantized, to U8 _blocks (E2M1 codes, low nibble first) and U8
                  _scales (E8M0 exponents, one per 32 elements along the input), outputs
                  first; config.json quantization_config {"quant_method": "mxfp4"}.

Cross-checks (asserted): compressed-tensors' dequantize() reproduces the decoded weights
of the fp8_ct_* kinds bit for bit, its unpack_fp4_from_uint8 + dequantize() those of
nvfp4_ct, transformers' own MXFP4 converter (convert_moe_packed_tensors) those of
mxfp4_experts, and torch's float8_e4m3fn decoding is used for every E4M3 value.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

E4M3_MAX = 448.0
E2M1_MAX = 6.0
E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
BLOCK = (16, 32)
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "w1", "w2", "w3",
           "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj")  # the last four: DeepSeek's MLA
KINDS = ("fp8_hf", "fp8_hf_128", "fp8_modelopt", "fp8_ct_channel", "fp8_ct_block", "nvfp4_modelopt", "nvfp4_ct",
         "int4_ct", "mxfp4_experts")
INT4_GROUP = 32
MXFP4_GROUP = 32
MXFP4_EXPERTS = (".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")


def is_quantized_linear(name: str, t: torch.Tensor) -> bool:
    parts = name.split(".")
    return t.dim() == 2 and name.endswith(".weight") and parts[-2] in LINEARS and ".layers." in name


def to_e4m3(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def fp8_with_scales(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """E4M3 codes of w with one float32 scale per block (amax / 448), and the decoded weight."""
    rows, cols = w.shape
    r, c = block
    br, bc = -(-rows // r), -(-cols // c)
    scale = torch.empty(br, bc)
    for i in range(br):
        for j in range(bc):
            scale[i, j] = w[i * r:(i + 1) * r, j * c:(j + 1) * c].abs().amax().clamp(min=1e-12) / E4M3_MAX
    expanded = scale.repeat_interleave(r, 0)[:rows].repeat_interleave(c, 1)[:, :cols]
    q = to_e4m3(w / expanded)
    return q, scale, q.to(torch.float32) * expanded


def e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """Nearest E2M1 code of each value (sign in bit 3), ties to the smaller magnitude."""
    mag = x.abs().clamp(max=E2M1_MAX)
    idx = (mag.unsqueeze(-1) - E2M1_VALUES).abs().argmin(-1)
    return (idx | ((x < 0).to(torch.int64) << 3)).to(torch.uint8)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    v = E2M1_VALUES[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -v, v)


def nvfp4_modelopt(w: torch.Tensor) -> tuple[dict, torch.Tensor]:
    """ModelOpt's NVFP4 of one weight: global scale amax / (6 * 448), per-16 E4M3 scales of
    group amax / 6 in units of it, E2M1 codes of w over their product."""
    rows, cols = w.shape
    assert cols % 32 == 0 or cols % 16 == 0, cols
    scale_2 = (w.abs().amax() / (E2M1_MAX * E4M3_MAX)).reshape(())
    groups = w.reshape(rows, cols // 16, 16)
    scale = to_e4m3(groups.abs().amax(-1) / E2M1_MAX / scale_2)
    step = scale.to(torch.float32) * scale_2
    codes = e2m1_codes(groups / step.clamp(min=1e-30).unsqueeze(-1)).reshape(rows, cols)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    decoded = (e2m1_decode(codes).reshape(rows, cols // 16, 16) * scale.to(torch.float32).unsqueeze(-1)) * scale_2
    return {"weight": packed, "weight_scale": scale, "weight_scale_2": scale_2.clone(),
            "input_scale": torch.tensor(0.05)}, decoded.reshape(rows, cols)


def ct_config(kind: str) -> dict:
    """The quantization_config compressed-tensors serializes for this kind."""
    from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme
    if kind == "nvfp4_ct":
        from compressed_tensors.quantization.quant_scheme import NVFP4
        scheme = QuantizationScheme(targets=["Linear"], **NVFP4)
        fmt = "nvfp4-pack-quantized"
    elif kind == "int4_ct":
        weights = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group",
                                   group_size=INT4_GROUP)
        scheme = QuantizationScheme(targets=["Linear"], weights=weights)
        fmt = "pack-quantized"
    else:
        strategy = "channel" if kind == "fp8_ct_channel" else "block"
        weights = QuantizationArgs(num_bits=8, type="float", symmetric=True, strategy=strategy,
                                   block_structure=list(BLOCK) if strategy == "block" else None)
        scheme = QuantizationScheme(targets=["Linear"], weights=weights)
        fmt = "float-quantized"
    cfg = QuantizationConfig(config_groups={"group_0": scheme}, format=fmt, quantization_status="compressed",
                             ignore=["lm_head", "re:.*mlp.gate$"])
    return json.loads(cfg.model_dump_json(exclude_none=True)) | {"quant_method": "compressed-tensors"}


def ct_weights_args(kind: str):
    from compressed_tensors.quantization import QuantizationScheme
    return QuantizationScheme.model_validate(ct_config(kind)["config_groups"]["group_0"]).weights


def ct_decode_fp8(q: torch.Tensor, scale: torch.Tensor, kind: str) -> torch.Tensor:
    from compressed_tensors.quantization.lifecycle.forward import dequantize
    return dequantize(x_q=q, scale=scale, args=ct_weights_args(kind), dtype=torch.float32)


def ct_decode_nvfp4(packed: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    from compressed_tensors.quantization.lifecycle.forward import dequantize
    m, n = packed.shape
    codes = unpack_fp4_from_uint8(packed, m, n * 2, dtype=torch.float32)
    return dequantize(x_q=codes, scale=scale.to(torch.float32), args=ct_weights_args("nvfp4_ct"),
                      global_scale=global_scale, dtype=torch.float32)


def int4_ct(module: str, w: torch.Tensor) -> tuple[dict, torch.Tensor]:
    """compressed-tensors' pack-quantized int4 of `w`, packed and decoded by its own compressor."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
    from compressed_tensors.quantization import QuantizationScheme
    rows, cols = w.shape
    groups = -(-cols // INT4_GROUP)
    padded = torch.nn.functional.pad(w, (0, groups * INT4_GROUP - cols)).reshape(rows, groups, INT4_GROUP)
    scale = (padded.abs().amax(-1).clamp(min=1e-8) / 7.5).to(torch.bfloat16)
    scheme = QuantizationScheme.model_validate(ct_config("int4_ct")["config_groups"]["group_0"])
    stored = PackedQuantizationCompressor.compress({"weight": w, "weight_scale": scale}, scheme)
    assert set(stored) == {"weight_packed", "weight_scale", "weight_shape"}, stored.keys()
    # The format's definition: each code (round(w / s) clamped to [-8, 7]) times its scale, in
    # float32; compressed-tensors' unpacking gives those codes, and its decompress() the
    # products in the scales' dtype (bf16).
    s = scale.to(torch.float32).repeat_interleave(INT4_GROUP, dim=1)[:, :cols]
    codes = unpack_from_int32(stored["weight_packed"], 4, stored["weight_shape"]).to(torch.float32)
    assert torch.equal(codes, torch.clamp(torch.round(w / s), -8, 7)), module
    dec = codes * s
    rounded = PackedQuantizationCompressor.decompress(dict(stored), scheme)["weight"]
    assert torch.equal(rounded, dec.to(rounded.dtype)), module
    return {f"{module}.{k}": v for k, v in stored.items()}, dec


def quantize_one(name: str, w: torch.Tensor, kind: str) -> tuple[dict, torch.Tensor]:
    """{stored tensor name: tensor} replacing weight `name`, and the weight they decode to."""
    module = name[:-len(".weight")]
    if kind in ("fp8_hf", "fp8_hf_128"):
        q, scale, dec = fp8_with_scales(w, BLOCK if kind == "fp8_hf" else (128, 128))
        return {name: q, name + "_scale_inv": scale}, dec
    if kind == "fp8_modelopt":
        q, scale, dec = fp8_with_scales(w, tuple(w.shape))
        return {name: q, module + ".weight_scale": scale.reshape(()), module + ".input_scale": torch.tensor(0.05)}, dec
    if kind == "fp8_ct_channel":
        scale = (w.abs().amax(-1, keepdim=True).clamp(min=1e-12) / E4M3_MAX).to(torch.bfloat16)
        q = to_e4m3(w / scale.to(torch.float32))
        dec = q.to(torch.float32) * scale.to(torch.float32)
        assert torch.equal(ct_decode_fp8(q, scale.to(torch.float32), kind), dec), name
        return {name: q, module + ".weight_scale": scale}, dec
    if kind == "fp8_ct_block":
        q, scale, dec = fp8_with_scales(w, BLOCK)
        assert torch.equal(ct_decode_fp8(q, scale, kind), dec), name
        return {name: q, module + ".weight_scale": scale}, dec
    if kind == "int4_ct":
        return int4_ct(module, w)
    params, dec = nvfp4_modelopt(w)
    stored = {f"{module}.{k}": v for k, v in params.items()}
    if kind == "nvfp4_modelopt":
        return stored, dec
    assert kind == "nvfp4_ct", kind
    from compressed_tensors.entrypoints.convert.converters.modelopt_nvfp4 import ModelOptNvfp4Converter
    converted = ModelOptNvfp4Converter(targets=["re:.*"]).process(dict(stored))
    assert set(converted) == {f"{module}.{k}" for k in
                              ("weight_packed", "weight_scale", "weight_global_scale", "input_global_scale")}, converted.keys()
    for k in ("weight_global_scale", "input_global_scale"):  # compressed-tensors' own shape
        converted[f"{module}.{k}"] = converted[f"{module}.{k}"].reshape([1])
    dec = ct_decode_nvfp4(converted[module + ".weight_packed"], converted[module + ".weight_scale"],
                          converted[module + ".weight_global_scale"])
    return converted, dec


def mxfp4_experts(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """MXFP4 of stacked experts stored inputs first ([experts, in, out]): per 32 inputs of an
    output row, the exponent 2^e with e = ceil(log2(amax / 6)) (the group's largest value fits
    E2M1's 6), E2M1 codes of w / 2^e. Returns blocks [experts, out, in / 32, 16], scales
    [experts, out, in / 32] (e + 127) and the decoded [experts, in, out]."""
    rows_first = w.transpose(1, 2).contiguous()
    experts, rows, cols = rows_first.shape
    assert cols % MXFP4_GROUP == 0, cols
    groups = rows_first.reshape(experts, rows, cols // MXFP4_GROUP, MXFP4_GROUP)
    amax = groups.abs().amax(-1)
    exponent = torch.where(amax > 0, torch.ceil(torch.log2(amax / E2M1_MAX)), torch.full_like(amax, -127.0))
    exponent = exponent.clamp(-127, 127)
    codes = e2m1_codes(groups / torch.exp2(exponent).unsqueeze(-1))
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    decoded = e2m1_decode(codes) * torch.exp2(exponent).unsqueeze(-1)
    scales = (exponent + 127).to(torch.uint8)
    return blocks, scales, decoded.reshape(experts, rows, cols).transpose(1, 2).contiguous()


def quantize_mxfp4_experts(folder: Path) -> dict[str, torch.Tensor]:
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    tensors = load_file(str(folder / "model.safetensors"))
    out, decoded = {}, {}
    for name, t in tensors.items():
        if not name.endswith(MXFP4_EXPERTS):
            out[name] = t
            continue
        blocks, scales, dec = mxfp4_experts(t.to(torch.float32))
        out[name + "_blocks"], out[name + "_scales"] = blocks, scales
        theirs = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
        assert torch.equal(theirs, dec), name
        decoded[name] = dec
    assert decoded, "no stacked experts found"
    save_file(out, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4",
                                  "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                             "model.embed_tokens", "lm_head"]}
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return decoded


def quantize_checkpoint(folder: Path, kind: str) -> dict[str, torch.Tensor]:
    assert kind in KINDS, kind
    if kind == "mxfp4_experts":
        return quantize_mxfp4_experts(folder)
    tensors = load_file(str(folder / "model.safetensors"))
    out, decoded = {}, {}
    for name, t in tensors.items():
        if not is_quantized_linear(name, t):
            out[name] = t
            continue
        stored, dec = quantize_one(name, t.to(torch.float32), kind)
        out.update(stored)
        decoded[name] = dec
    assert decoded, "no linear weights found"
    save_file(out, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((folder / "config.json").read_text())
    if kind.startswith("fp8_hf"):
        block = list(BLOCK) if kind == "fp8_hf" else [128, 128]
        cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                                      "weight_block_size": block}
    elif kind.endswith("_modelopt"):
        algo = "FP8" if kind.startswith("fp8") else "NVFP4"
        quant = {"quant_algo": algo, "kv_cache_quant_algo": None, "exclude_modules": ["lm_head", "*mlp.gate"]}
        if algo == "NVFP4":
            quant["group_size"] = 16
        (folder / "hf_quant_config.json").write_text(json.dumps(
            {"producer": {"name": "modelopt", "version": "0.35.0"}, "quantization": quant}, indent=2) + "\n")
    else:
        cfg["quantization_config"] = ct_config(kind)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return decoded


def write_decoded_checkpoint(src: Path, dst: Path, decoded: dict[str, torch.Tensor]) -> None:
    """A float32 checkpoint of `src`'s model with the decoded weights, for transformers."""
    dst.mkdir(parents=True, exist_ok=True)
    tensors = {k: v for k, v in load_file(str(src / "model.safetensors")).items()}
    float_tensors = {}
    for name, t in tensors.items():
        module = name.rsplit(".", 1)[0]
        if name in decoded:
            float_tensors[name] = decoded[name].contiguous()
        elif module + ".weight" in decoded or (name.endswith(("_blocks", "_scales"))
                                               and name.rsplit("_", 1)[0] in decoded):
            continue  # a scale or the packed codes of a decoded weight (MXFP4: x_blocks, x_scales)
        else:
            float_tensors[name] = t
    for name, t in decoded.items():
        float_tensors[name] = t.contiguous()
    save_file(float_tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    cfg.pop("quantization_config", None)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    gen = src / "generation_config.json"
    if gen.exists():
        (dst / "generation_config.json").write_text(gen.read_text())
