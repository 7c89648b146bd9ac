"""How far native operands move the logits of the tiny quantized models: the activations of
every product that runs natively on the GPU quantized per row as kernels/cuda/quantize_rows.h
does (FP8: e4m3 per 128 elements; NVFP4: E2M1 with e4m3 scales per 16 and a row global),
against the same decoded weights with float activations (the widened path). The bounds of
CudaLlamaModelTest.NativeOperandsStayCloseToTheCpuBackend come from these numbers.

Usage (the oracle venv of scripts/install-deps.sh):
  .cache/oracle-venv/bin/python tests/golden/measure_native_operands.py \
      llama_fp8_block128 llama_nvfp4_ct llama_nvfp4_modelopt qwen3_moe_nvfp4_ct

Each model is rebuilt as tests/golden/gen_engine_hf.py built it and checked against its
golden logits first. MoE experts whose weights transformers fuses (not nn.Linear) keep float
activations here, so the MoE number is a lower bound.
"""
import base64
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_engine_hf as g  # noqa: E402
from quantize_formats import quantize_checkpoint, write_decoded_checkpoint  # noqa: E402

E4M3_MAX, E2M1 = 448.0, torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6])

def e4m3(x):  # round to e4m3fn (nearest even via float8 dtype), saturating
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32)

def e2m1(v):  # nearest of the 8 magnitudes, ties to even code, saturating at 6
    a = v.abs().clamp(max=6.0)
    d = (a.unsqueeze(-1) - E2M1).abs()
    best = d.min(-1, keepdim=True).values
    cand = (d == best).float() * (1 - 0.5 * (torch.arange(8) % 2))  # prefer even codes on ties
    idx = cand.argmax(-1)
    return E2M1[idx] * torch.sign(v)

def nvfp4_rows(x):  # [..., K] -> what the W4A4 kernel sees
    shape = x.shape
    x = x.reshape(-1, shape[-1]).float()
    amax = x.abs().amax(-1, keepdim=True)
    glob = torch.where(amax > 0, amax / (6 * 448), torch.ones_like(amax))
    groups = x.reshape(x.shape[0], -1, 16)
    gmax = groups.abs().amax(-1, keepdim=True)
    s = e4m3(gmax / 6 / glob.unsqueeze(-1))
    den = s * glob.unsqueeze(-1)
    q = torch.where(den > 0, e2m1(groups / torch.where(den > 0, den, torch.ones_like(den))) * den, torch.zeros_like(groups))
    return q.reshape(shape)

def fp8_rows(x):  # [..., K] -> e4m3 per 128 elements, amax / 448
    shape = x.shape
    b = x.reshape(-1, shape[-1] // 128, 128).float()
    amax = b.abs().amax(-1, keepdim=True)
    scale = torch.where(amax > 0, amax / 448, torch.ones_like(amax))
    return (e4m3(b / scale) * scale).reshape(shape)

def main(name):
    cls, kwargs, seed, quant = g.CASES[name]
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        cfg = cls(**kwargs); torch.manual_seed(seed)
        m = g.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="eager")
        g.randomize(m, seed); m.save_pretrained(a, safe_serialization=True)
        decoded = quantize_checkpoint(Path(a), quant)
        write_decoded_checkpoint(Path(a), Path(b), decoded)
        model = g.load(Path(b), torch.float32)
    golden = json.loads((g.OUT / name / "logits.json").read_text())
    p0 = golden["prompts"][0]
    ref = np.frombuffer(base64.b64decode(p0["logits_b64"]), np.float32).reshape(p0["logits_shape"])
    got = g.full_logits(model, p0["ids"]).numpy()
    assert np.array_equal(got, ref), "the rebuilt model is not the golden's"
    hooks = []
    for mod_name, mod in model.named_modules():
        fp8 = quant.startswith("fp8")
        fits = mod.in_features % (128 if fp8 else 64) == 0 if isinstance(mod, torch.nn.Linear) else False
        if fits and "lm_head" not in mod_name and "gate" != mod_name.split(".")[-1]:  # router: bf16
            fn = fp8_rows if fp8 else nvfp4_rows
            hooks.append(mod.register_forward_pre_hook(lambda _m, args, fn=fn: (fn(args[0]),)))
    worst = 0.0
    for p in golden["prompts"]:
        base = np.frombuffer(base64.b64decode(p["logits_b64"]), np.float32).reshape(p["logits_shape"])
        w4a4 = g.full_logits(model, p["ids"]).numpy()
        rel = np.linalg.norm(w4a4 - base, axis=-1) / np.linalg.norm(base, axis=-1)
        worst = max(worst, float(rel.max()))
        print(f"{name} len {p['len']}: native vs widened relative L2 per position: median {np.median(rel):.3f}, max {rel.max():.3f}")
    print(f"{name}: worst {worst:.3f} over {len(hooks)} quantized-activation products")

if __name__ == "__main__":
    for n in sys.argv[1:]:
        main(n)
