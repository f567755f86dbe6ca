# Checks soltrain's QLoRA base formats against torch (run on a machine with torch >= 2.1, safetensors,
# transformers; bitsandbytes is not needed) and writes the fixtures tests/test_quant_fixtures.cpp reads, so CI
# keeps checking them:
#   (a) FP8 casts: random fp32 values (every binade, subnormals, ties, overflow, inf, NaN) times a few scales,
#       cast by torch to float8_e4m3fn / float8_e5m2 (on the CPU; on the GPU too, which must agree) ->
#       tests/fixtures/quant/fp8_casts.safetensors; the gtest casts the same products and compares bit for bit.
#   (b) NF4: `soltrain quantize --format nf4` stores random matrices as NF4 blocks; a torch implementation of
#       bitsandbytes' codebook lookup (dequantize_4bit with the nested absmax) dequantises OUR stored blocks and
#       must equal what soltrain's twin gives (the gtest: bitwise), and bitsandbytes' quantize_4bit written in
#       torch (backends/default/ops.py) must pick the same packed codes -> tests/fixtures/quant/nf4.safetensors.
#   FP8 blocks: random matrices quantised per 128x128 tile by transformers' quantizer written in torch must
#       equal `soltrain quantize --format fp8` bit for bit -> tests/fixtures/quant/fp8_blocks.safetensors.
#   (c) FP8 checkpoint: a random Qwen3 (several 128x128 tiles, a ragged one) quantised as transformers'
#       fine-grained FP8 quantizer does and saved in the official layout (F8_E4M3 weights, F32
#       weight_scale_inv, quantization_config) -> tests/fixtures/quant/qwen3-fp8/ with a batch and the logits of
#       its dequantised bf16 twin computed by transformers (fp32); soltrain loading it must match within 1e-2.
#   --cuda also runs `soltrain dump --device cuda` on the FP8 checkpoint (a zero-B adapter: QLoRA over the FP8
#   base as stored) and on the bf16 twin with --qlora nf4 / fp8, against transformers with the same
#   dequantised weights: the CUDA dequantise kernels end to end.
# Run: python3 tests/tools/check_quant.py build/soltrain [--cuda] [--no-write] [--seed 0]
import argparse, json, os, shutil, subprocess, sys, tempfile
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, Qwen3Config

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures", "quant")
NF4 = torch.tensor([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                    0.7229568362236023, 1.0], dtype=torch.float32)
FAILED = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok: FAILED.append(what)


def rel(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    return float((a - b).norm() / b.norm())


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0: sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return r.stdout


# ---- (a) FP8 casts ----
def fp8_values(g):
    mags = torch.exp2(torch.empty(8000).uniform_(-24, 17, generator=g))
    x = mags * torch.where(torch.rand(8000, generator=g) < 0.5, -1.0, 1.0)
    specials = [0.0, -0.0, 1.0, 448.0, 464.0, 470.0, 479.9, 480.0, 500.0, 57344.0, 61439.0, 61440.0, 65536.0, 1e30,
                2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -10, 2.0 ** -16, 2.0 ** -17, 3 * 2.0 ** -17, 1.0625, 1.1875, 1.125,
                1.375, float("inf"), float("nan")]
    s = torch.tensor(specials + [-v for v in specials], dtype=torch.float32)
    return torch.cat([s, x.float()])


def check_fp8_casts(g, out):
    x = fp8_values(g)
    scales = torch.tensor([1.0, 448.0 / 3.5, 0.37, 1024.0, 1.0 / 1024], dtype=torch.float32)
    prods = x.unsqueeze(0) * scales.unsqueeze(1)  # fp32 products, as the gtest forms them
    e4 = prods.to(torch.float8_e4m3fn)
    e5 = prods.to(torch.float8_e5m2)
    # torch does not saturate: past the largest finite value E4M3 gives NaN, E5M2 inf.
    check(torch.isnan(torch.tensor([1000.0]).to(torch.float8_e4m3fn).float()).all().item(),
          "torch: float8_e4m3fn(1000) is NaN (no saturation)")
    check(torch.isinf(torch.tensor([1e6]).to(torch.float8_e5m2).float()).all().item(),
          "torch: float8_e5m2(1e6) is inf (no saturation)")
    if torch.cuda.is_available():
        c4 = prods.cuda().to(torch.float8_e4m3fn).cpu().view(torch.uint8)
        c5 = prods.cuda().to(torch.float8_e5m2).cpu().view(torch.uint8)
        check(torch.equal(c4, e4.view(torch.uint8)), "FP8 E4M3: torch's CUDA cast equals its CPU cast bit for bit")
        check(torch.equal(c5, e5.view(torch.uint8)), "FP8 E5M2: torch's CUDA cast equals its CPU cast bit for bit")
    out["fp8_casts.safetensors"] = {"x": x, "scales": scales, "e4m3": e4, "e5m2": e5}


# ---- (b) NF4 ----
def bnb_quantize_4bit(w):  # bitsandbytes' default backend quantize_4bit (blocksize 64), packed codes only
    flat = w.reshape(-1).float()
    n = flat.numel()
    codes, absmax = [], []
    bounds = (NF4[:-1] + NF4[1:]) / 2
    for b in range(0, n, 64):
        blk = flat[b:b + 64]
        am = blk.abs().max()
        codes.append(torch.bucketize(torch.clamp(blk * (1.0 / am.clamp(min=1e-38)), -1, 1), bounds, out_int32=True))
    q = torch.cat(codes).to(torch.uint8)
    if q.numel() % 2: q = torch.cat([q, torch.zeros(1, dtype=torch.uint8)])
    return (q[::2] << 4) | q[1::2]


def torch_dequantize_nf4(st, name, n):  # bitsandbytes' dequantize_4bit with a nested absmax, in torch
    packed = st[name]
    blocks = st[name + ".absmax"].numel()
    nested = st[name + ".nested_absmax"].repeat_interleave(256)[:blocks]
    absmax = st[name + ".nested_quant_map"][st[name + ".absmax"].long()] * nested  # dequantize_blockwise
    absmax = absmax + st[name + ".offset"]  # absmax += offset
    idx = torch.empty(packed.numel() * 2, dtype=torch.long)
    idx[0::2] = (packed >> 4).long()
    idx[1::2] = (packed & 15).long()
    vals = st[name + ".quant_map"][idx][:n]
    return vals * absmax.repeat_interleave(64)[:n]


def check_nf4(soltrain, g, tmp, out):
    shapes = [(96, 200), (37, 523), (64, 192)]  # 300 blocks: two nested blocks; 37x523: ragged and odd
    ws = {f"w{i}": (torch.randn(s, generator=g) * 0.02) for i, s in enumerate(shapes)}
    ws["w0"][5, 7] = 0.5  # an outlier: absmaxes that differ
    save_file(ws, os.path.join(tmp, "nf4_in.safetensors"))
    run([soltrain, "quantize", "--format", "nf4", "--in", os.path.join(tmp, "nf4_in.safetensors"), "--out",
         os.path.join(tmp, "nf4_out.safetensors")])
    st = load_file(os.path.join(tmp, "nf4_out.safetensors"))
    fx = {}
    for name, w in ws.items():
        check(torch.equal(st[name + ".quant_map"], NF4), f"NF4 {name}: the code book is bitsandbytes'")
        check(torch.equal(st[name], bnb_quantize_4bit(w)),
              f"NF4 {name}: packed codes equal bitsandbytes' quantize_4bit written in torch")
        deq = torch_dequantize_nf4(st, name, w.numel()).reshape(w.shape)
        err = rel(deq, w)
        check(err < 0.15, f"NF4 {name}: dequantised values near the input (rel {err:.4f})")
        fx[name] = w
        fx[name + ".dequantised"] = deq.contiguous()
        fx[name + ".packed"] = st[name]
    out["nf4.safetensors"] = fx


# ---- (c) FP8 checkpoint ----
def fp8_quantize(w):  # transformers' fine-grained FP8 quantizer: per 128x128 tile, scale = 448 / amax
    rows, cols = w.shape
    tr, tc = (rows + 127) // 128, (cols + 127) // 128
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    s_inv = torch.empty(tr, tc, dtype=torch.float32)
    for i in range(tr):
        for j in range(tc):
            t = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128].float()
            amax = t.abs().max()
            scale = 448.0 / amax if amax > 0 else torch.tensor(1.0)
            q[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = (t * scale).clamp(-448, 448).to(torch.float8_e4m3fn)
            s_inv[i, j] = 1.0 / scale
    return q, s_inv


def fp8_dequantize(q, s_inv):
    rows, cols = q.shape
    s = s_inv.repeat_interleave(128, 0)[:rows].repeat_interleave(128, 1)[:, :cols]
    return q.float() * s


def check_fp8_blocks(soltrain, g, tmp, out):
    ws = {"w0": torch.randn(300, 200, generator=g) * 0.05, "w1": torch.randn(200, 136, generator=g) * 3.0}
    ws["w0"][256:, 128:] = 0  # an all-zero tile: scale_inv 1
    save_file(ws, os.path.join(tmp, "fp8_in.safetensors"))
    run([soltrain, "quantize", "--format", "fp8", "--in", os.path.join(tmp, "fp8_in.safetensors"), "--out",
         os.path.join(tmp, "fp8_out.safetensors")])
    st = load_file(os.path.join(tmp, "fp8_out.safetensors"))
    fx = {}
    for name, w in ws.items():
        q, s_inv = fp8_quantize(w)
        check(torch.equal(st[name].view(torch.uint8), q.view(torch.uint8)),
              f"FP8 blocks {name}: codes equal transformers' quantizer in torch bit for bit")
        check(torch.equal(st[name + "_scale_inv"], s_inv), f"FP8 blocks {name}: scale_inv equal bit for bit")
        fx[name], fx[name + ".q"], fx[name + ".scale_inv"] = w, q, s_inv
        fx[name + ".dequantised"] = fp8_dequantize(q, s_inv)
    out["fp8_blocks.safetensors"] = fx


PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_fp8_checkpoint(g, out_dir, twin_dir):
    cfg = Qwen3Config(vocab_size=320, hidden_size=256, intermediate_size=320, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=256,
                      rms_norm_eps=1e-6, tie_word_embeddings=False, rope_theta=1e6, attn_implementation="eager")
    torch.manual_seed(int(torch.randint(0, 2 ** 31, (1,), generator=g)))
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n: p.copy_(1.0 + 0.1 * torch.randn_like(p))
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    fp8, twin = {}, {}
    for k, v in sd.items():
        if k.endswith(".weight") and k.split(".")[-2] in PROJ:
            q, s_inv = fp8_quantize(v)
            fp8[k], fp8[k + "_scale_inv"] = q, s_inv
            twin[k] = fp8_dequantize(q, s_inv).to(torch.bfloat16)
        else:
            fp8[k] = v.to(torch.bfloat16)  # embedding, LM head, norms: bf16, as the official releases
            twin[k] = v.to(torch.bfloat16)
    for d, tensors, quant in ((out_dir, fp8, True), (twin_dir, twin, False)):
        os.makedirs(d, exist_ok=True)
        save_file(tensors, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        c = json.loads(cfg.to_json_string())
        c["dtype"] = "bfloat16"
        c.pop("attn_implementation", None)
        if quant:
            c["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                        "weight_block_size": [128, 128]}
        with open(os.path.join(d, "config.json"), "w") as f: json.dump(c, f, indent=2)
    return cfg


def logits_of(model_dir, batch, replace=None):  # transformers in fp32 (weights optionally replaced)
    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    if replace:
        with torch.no_grad():
            for k, v in replace.items(): m.get_parameter(k).copy_(v)
    with torch.no_grad():
        return m(input_ids=batch["input_ids"]).logits.float()


def zero_b_adapter(d, cfg):
    os.makedirs(d, exist_ok=True)
    t = {}
    for l in range(cfg.num_hidden_layers):
        for p in PROJ:
            mod = f"model.layers.{l}.{'self_attn' if p in PROJ[:4] else 'mlp'}.{p}"
            w = dict(q_proj=(4 * 64, 256), k_proj=(2 * 64, 256), v_proj=(2 * 64, 256), o_proj=(256, 4 * 64),
                     gate_proj=(320, 256), up_proj=(320, 256), down_proj=(256, 320))[p]
            t[f"base_model.model.{mod}.lora_A.weight"] = torch.randn(8, w[1]) * 0.1
            t[f"base_model.model.{mod}.lora_B.weight"] = torch.zeros(w[0], 8)
    save_file(t, os.path.join(d, "adapter_model.safetensors"))
    with open(os.path.join(d, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": list(PROJ), "lora_dropout": 0.0,
                   "bias": "none", "use_rslora": False, "task_type": "CAUSAL_LM"}, f)


def check_fp8_checkpoint(soltrain, g, tmp, out, cuda):
    ck, twin = os.path.join(tmp, "qwen3-fp8"), os.path.join(tmp, "qwen3-fp8-twin")
    cfg = write_fp8_checkpoint(g, ck, twin)
    ids = torch.randint(0, cfg.vocab_size, (2, 24), generator=g)
    batch = {"input_ids": ids, "targets": torch.cat([ids[:, 1:], torch.full((2, 1), -100)], 1)}
    save_file(batch, os.path.join(ck, "batch.safetensors"))
    expected = logits_of(twin, batch)
    save_file({"logits": expected.contiguous()}, os.path.join(ck, "expected.safetensors"))
    out["qwen3-fp8"] = ck
    devices = ["cpu"] + (["cuda"] if cuda else [])
    adapter = os.path.join(tmp, "zero-b-adapter")
    zero_b_adapter(adapter, cfg)
    for dev in devices:
        o = os.path.join(tmp, f"fp8_{dev}.safetensors")
        run([soltrain, "dump", "--model", ck, "--adapter", adapter, "--batch", os.path.join(ck, "batch.safetensors"),
             "--out", o, "--device", dev])
        err = rel(load_file(o)["logits"].reshape(expected.shape), expected)
        check(err <= 1e-2, f"FP8 checkpoint as stored (QLoRA, {dev}): logits vs its dequantised bf16 twin, rel {err:.2e}")
    # NF4 and FP8 quantised on load from the bf16 twin, against transformers holding the same dequantised
    # weights (NF4: our stored blocks dequantised by the torch code book lookup above).
    twin_sd = load_file(os.path.join(twin, "model.safetensors"))
    projs = {k: v.float() for k, v in twin_sd.items() if k.endswith(".weight") and k.split(".")[-2] in PROJ}
    save_file(projs, os.path.join(tmp, "twin_proj.safetensors"))
    for fmt in ("nf4", "fp8"):
        run([soltrain, "quantize", "--format", fmt, "--in", os.path.join(tmp, "twin_proj.safetensors"), "--out",
             os.path.join(tmp, f"twin_{fmt}.safetensors")])
        st = load_file(os.path.join(tmp, f"twin_{fmt}.safetensors"))
        if fmt == "nf4":
            deq = {k: torch_dequantize_nf4(st, k, v.numel()).reshape(v.shape) for k, v in projs.items()}
        else:
            deq = {k: fp8_dequantize(st[k], st[k + "_scale_inv"]) for k in projs}
        ref = logits_of(twin, batch, deq)
        for dev in devices:
            o = os.path.join(tmp, f"twin_{fmt}_{dev}.safetensors")
            run([soltrain, "dump", "--model", twin, "--adapter", adapter, "--qlora", fmt, "--batch",
                 os.path.join(ck, "batch.safetensors"), "--out", o, "--device", dev])
            err = rel(load_file(o)["logits"].reshape(ref.shape), ref)
            check(err <= (1e-4 if dev == "cpu" else 1e-2),
                  f"{fmt} quantised on load ({dev}): logits vs transformers on the torch-dequantised weights, rel {err:.2e}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("soltrain")
    ap.add_argument("--cuda", action="store_true")
    ap.add_argument("--no-write", action="store_true", help="check only; leave tests/fixtures/quant as it is")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    g = torch.Generator().manual_seed(a.seed)
    print(f"seed {a.seed}")
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        check_fp8_casts(g, out)
        check_nf4(a.soltrain, g, tmp, out)
        check_fp8_blocks(a.soltrain, g, tmp, out)
        check_fp8_checkpoint(a.soltrain, g, tmp, out, a.cuda)
        if not a.no_write and not FAILED:
            os.makedirs(FIXTURES, exist_ok=True)
            for name, v in out.items():
                dst = os.path.join(FIXTURES, name)
                if isinstance(v, dict):
                    save_file({k: t.contiguous() for k, t in v.items()}, dst)
                else:
                    shutil.rmtree(dst, ignore_errors=True)
                    shutil.copytree(v, dst)
            print(f"fixtures written to {os.path.normpath(FIXTURES)} (commit them)")
    if FAILED:
        sys.exit(f"{len(FAILED)} check(s) failed")
    print("all quantisation checks passed")


if __name__ == "__main__":
    main()
