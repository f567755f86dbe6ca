# Checks soltrain's LoRA against PEFT on random configurations (run on a machine with torch, transformers,
# peft 0.21, safetensors): for each case PEFT builds an adapter (random rank, alpha, rsLoRA, target subset,
# dropout in the config) on a tiny random model and saves it; then
#   soltrain dump  --adapter  → logits, loss and every LoRA gradient vs PEFT (fp32, eval mode: no dropout),
#   soltrain merge            → merged weights vs merge_and_unload() (and the base tensor's dtype kept),
#   soltrain dump --save-adapter → PEFT loads OUR adapter files: same tensor names, same logits.
#   with --cuda: soltrain dump --device cuda (bf16) → every LoRA gradient against PEFT in fp64, next to PEFT's own
#                bf16 autocast run on the same inputs: ours may not be worse than the peer's (check_cuda_grads).
# Run: python3 tests/tools/check_peft.py build/soltrain [--cases 12] [--seed 0] [--keep DIR] [--cuda]
import argparse, json, os, random, shutil, subprocess, sys, tempfile
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
COMMON = dict(vocab_size=320, max_position_embeddings=256, rms_norm_eps=1e-6, attn_implementation="eager")
BASES = {
    "qwen3": lambda: Qwen3Config(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, head_dim=16, tie_word_embeddings=True, rope_theta=1e6, **COMMON),
    "llama": lambda: LlamaConfig(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=4, tie_word_embeddings=False, rope_theta=1e4, **COMMON),
    # q/k/v biases: frozen under LoRA ("bias": "none"), they must still shape the output
    "qwen2": lambda: Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=1, tie_word_embeddings=False, rope_theta=1e4, **COMMON),
}


def rel(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    den = b.norm()
    return float((a - b).norm() / den) if den > 0 else float((a - b).norm())


def make_base(root, name, dtype):
    torch.manual_seed(list(BASES).index(name))  # the fp32 and bf16 copies get the same weights
    model = AutoModelForCausalLM.from_config(BASES[name](), dtype=torch.float32)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n: p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif n.endswith("bias"): p.copy_(0.1 * torch.randn_like(p))
            else: p.copy_(0.08 * torch.randn_like(p))
    out = os.path.join(root, f"{name}-{str(dtype).split('.')[-1]}")
    model.to(dtype).save_pretrained(out, safe_serialization=True)
    return out


def make_batch(root, V, B=2, T=20):
    ids = torch.randint(0, V, (B, T))
    tgt = torch.roll(ids, -1, dims=1).clone()
    tgt[:, -1] = -100
    tgt[0, :4] = -100
    path = os.path.join(root, "batch.safetensors")
    save_file({"input_ids": ids.to(torch.int32).contiguous(), "targets": tgt.to(torch.int32).contiguous()}, path)
    return path, ids, tgt


def loss_of(logits, tgt):
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=-100)


def soltrain(binary, *args):
    r = subprocess.run([binary, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"soltrain {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")


def grads_of(model, ids, tgt, autocast=False):
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=ids.cuda()).logits
    loss_of(logits.float(), tgt.cuda()).backward()
    return {"grad." + n.replace(".default", ""): p.grad.float().cpu() for n, p in model.named_parameters()
            if p.grad is not None}


def check_cuda_grads(binary, cdir, bf16_base, adapter, batch, ids, tgt, fails, name, stats):
    """Our bf16 CUDA LoRA gradients vs PEFT fp32, next to PEFT under bf16 autocast on the GPU.

    The base is the case's bf16 checkpoint (every weight exact in bf16, as in the checkpoints users train), held
    in fp32 for the reference and for autocast, so the comparison is of the compute alone. Judged per case:
    ours may not be worse than autocast's median (by >10%) or worst tensor (by >25%). Per tensor the two bf16
    schemes scatter more than that (tests/tools/probe_lora_precision.py: autocast against itself with a bf16
    residual stream differs by >5% on many tensors), and cases whose gradients are chaotic (autocast's own worst
    error >10%: large LoRA scales on random B) are reported, not judged."""
    dump = os.path.join(cdir, "dump-cuda.safetensors")
    soltrain(binary, "dump", "--model", bf16_base, "--adapter", adapter, "--batch", batch, "--out", dump,
             "--device", "cuda")
    d = load_file(dump)

    def peft(dtype):
        m = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(bf16_base, dtype=dtype).cuda(), adapter,
                                      is_trainable=True).cuda()
        m.eval()
        return m
    ref = grads_of(peft(torch.float64), ids, tgt)  # fp64: the reference's own rounding is out of the picture
    peer = grads_of(peft(torch.float32), ids, tgt, autocast=True)
    # For the diagnosis only: the model held in bf16 end to end (no autocast: bf16 residual stream and bf16
    # gradients between the matmuls; PEFT keeps the adapter's branch in fp32).
    pure = grads_of(peft(torch.bfloat16), ids, tgt)
    ours_e = sorted(rel(d[k], g) for k, g in ref.items())
    peer_e = sorted(rel(peer[k], g) for k, g in ref.items())
    for k, g in ref.items():
        stats.append((rel(d[k], g), rel(peer[k], g), rel(pure[k], g)))
    med = lambda v: v[len(v) // 2]
    judged = peer_e[-1] <= 0.1
    bad = judged and (med(ours_e) > 1.1 * med(peer_e) + 1e-4 or ours_e[-1] > 1.25 * peer_e[-1] + 1e-4)
    print(f"  {'FAIL' if bad else 'ok  ' if judged else 'info'} CUDA LoRA gradients vs PEFT fp64, median / worst: "
          f"ours {med(ours_e):.2e} / {ours_e[-1]:.2e}, PEFT bf16 autocast {med(peer_e):.2e} / {peer_e[-1]:.2e}"
          + ("" if judged else " (chaotic case: reported, not judged)"))
    if bad: fails.append(f"{name} CUDA LoRA gradients worse than PEFT's bf16 autocast")


def check_case(binary, work, base_dir, batch, ids, tgt, case, fails, cuda=False, stats=None):
    name = f"case{case['index']}"
    cdir = os.path.join(work, name)
    os.makedirs(cdir, exist_ok=True)
    torch.manual_seed(case["index"])
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    cfg = LoraConfig(r=case["r"], lora_alpha=case["alpha"], lora_dropout=case["dropout"],
                     target_modules=case["targets"], use_rslora=case["rslora"], task_type="CAUSAL_LM")
    m = get_peft_model(base, cfg)
    with torch.no_grad():  # both random (PEFT starts B at zero, which would hide every mistake in B·A)
        for n, p in m.named_parameters():
            if "lora_A" in n or "lora_B" in n: p.copy_(0.2 * torch.randn_like(p))
    adapter = os.path.join(cdir, "adapter")
    m.save_pretrained(adapter)
    m.eval()  # dropout off (soltrain's dump runs without dropout); gradients still flow
    logits = m(input_ids=ids).logits
    loss = loss_of(logits, tgt)
    loss.backward()
    grads = {"grad." + n.replace(".default", ""): p.grad for n, p in m.named_parameters() if p.grad is not None}

    def expect(what, err, tol):
        ok = err <= tol
        print(f"  {'ok  ' if ok else 'FAIL'} {what}: {err:.2e} (tol {tol:.0e})")
        if not ok: fails.append(f"{name} {what}")

    # 1. dump with PEFT's adapter (base in fp32 only: PEFT's reference is fp32 math)
    dump = os.path.join(cdir, "dump.safetensors")
    ours_adapter = os.path.join(cdir, "ours")
    soltrain(binary, "dump", "--model", base_dir, "--adapter", adapter, "--batch", batch, "--out", dump,
             "--save-adapter", ours_adapter)
    d = load_file(dump)
    expect("logits", rel(d["logits"], logits.detach()), 1e-4)
    expect("loss", abs(float(d["loss"][0]) - float(loss)) / float(loss), 1e-5)
    ours_grads = {k for k in d if k.startswith("grad.")}
    if ours_grads != set(grads):
        fails.append(f"{name} gradient names differ: {sorted(ours_grads ^ set(grads))[:4]}")
    expect("worst LoRA gradient", max(rel(d[k], g) for k, g in grads.items() if k in d), 1e-3)

    # 2. PEFT loads our saved adapter: same files' tensor names, same logits
    saved = load_file(os.path.join(adapter, "adapter_model.safetensors"))
    ours = load_file(os.path.join(ours_adapter, "adapter_model.safetensors"))
    if set(saved) != set(ours): fails.append(f"{name} saved tensor names differ")
    expect("our saved tensors", max(rel(ours[k], saved[k]) for k in saved if k in ours), 0.0)
    with open(os.path.join(ours_adapter, "adapter_config.json")) as f:
        ours_cfg = json.load(f)
    with open(os.path.join(adapter, "adapter_config.json")) as f:
        peft_cfg = json.load(f)
    for k in ("peft_type", "r", "lora_alpha", "lora_dropout", "use_rslora", "bias", "task_type", "fan_in_fan_out"):
        if ours_cfg.get(k) != peft_cfg.get(k): fails.append(f"{name} adapter_config {k}: {ours_cfg.get(k)} vs {peft_cfg.get(k)}")
    if sorted(ours_cfg["target_modules"]) != sorted(peft_cfg["target_modules"]): fails.append(f"{name} target_modules")
    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32), ours_adapter)
    reloaded.eval()
    with torch.no_grad():
        expect("PEFT on our adapter: logits", rel(reloaded(input_ids=ids).logits, logits.detach()), 1e-6)

    if cuda:
        check_cuda_grads(binary, cdir, case["bf16_base"], adapter, batch, ids, tgt, fails, name, stats)

    # 3. merge, for the fp32 base and the same base stored in bf16 (dtype kept; PEFT rounds W and the delta
    # separately in bf16, we round once, so up to one bf16 ulp apart)
    for bdir, tol in ((base_dir, 1e-6), (case["bf16_base"], 8e-3)):
        merged_dir = os.path.join(cdir, "merged-" + os.path.basename(bdir))
        soltrain(binary, "merge", "--model", bdir, "--adapter", adapter, "--out", merged_dir)
        dtype = torch.float32 if bdir == base_dir else torch.bfloat16
        pm = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(bdir, dtype=dtype), adapter)
        ref = pm.merge_and_unload().state_dict()
        got = load_file(os.path.join(merged_dir, "model.safetensors"))
        missing = [k for k in ref if k not in got and not (k == "lm_head.weight" and "model.embed_tokens.weight" in got)]
        if missing: fails.append(f"{name} merged model lacks {missing[:3]}")
        if any(got[k].dtype != dtype for k in got): fails.append(f"{name} merged dtype is not {dtype}")
        expect(f"merged weights ({str(dtype).split('.')[-1]} base)", max(rel(got[k], ref[k]) for k in got), tol)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("soltrain", help="path to the soltrain binary")
    ap.add_argument("--cases", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", help="work in this folder and keep it (default: a temporary one)")
    ap.add_argument("--cuda", action="store_true", help="also check soltrain's CUDA LoRA gradients (bf16)")
    a = ap.parse_args()
    binary = os.path.abspath(a.soltrain)
    work = a.keep or tempfile.mkdtemp(prefix="check_peft-")
    os.makedirs(work, exist_ok=True)
    rng = random.Random(a.seed)
    torch.manual_seed(a.seed)
    bases = {n: (make_base(work, n, torch.float32), make_base(work, n, torch.bfloat16)) for n in BASES}
    batch, ids, tgt = make_batch(work, COMMON["vocab_size"])
    fails, stats = [], []
    for i in range(a.cases):
        base_name = list(BASES)[i % len(BASES)]
        targets = ALL if i % 4 == 0 else sorted(rng.sample(ALL, rng.randint(1, len(ALL))), key=ALL.index)
        case = dict(index=i, r=rng.choice([1, 2, 4, 8, 16]), alpha=rng.choice([1, 8, 16, 32, 7.5]),
                    rslora=bool(i % 2), dropout=rng.choice([0.0, 0.05, 0.1]), targets=targets,
                    bf16_base=bases[base_name][1])
        print(f"case {i}: {base_name} r={case['r']} alpha={case['alpha']} rslora={case['rslora']} "
              f"dropout={case['dropout']} targets={targets}")
        try:
            check_case(binary, work, bases[base_name][0], batch, ids, tgt, case, fails, a.cuda, stats)
        except Exception as e:  # one broken case should not hide the others
            fails.append(f"case{i}: {e}")
            print("  FAIL", e)
    if not a.keep: shutil.rmtree(work, ignore_errors=True)
    if stats:
        ours, theirs, pure = (sorted(s[i] for s in stats) for i in range(3))
        print(f"\nCUDA LoRA gradients over {len(stats)} tensors, relative L2 error vs PEFT fp64: ours median "
              f"{ours[len(ours) // 2]:.3e} worst {ours[-1]:.3e}; PEFT bf16 autocast median {theirs[len(theirs) // 2]:.3e} "
              f"worst {theirs[-1]:.3e}; PEFT pure bf16 (no autocast) median {pure[len(pure) // 2]:.3e} worst {pure[-1]:.3e}")
    print(f"\n{a.cases} cases, {len(fails)} failures")
    for f in fails: print("  " + f)
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
