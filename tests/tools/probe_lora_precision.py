# Diagnosis of soltrain's CUDA LoRA gradient error (issue "Open the model core", item 8): the same random cases
# as check_peft.py --cuda, each LoRA gradient's relative L2 error against PEFT fp32 for
#   ours        soltrain dump --device cuda (bf16 weights and activations, fp32 residual stream)
#   ours-bf16res the same with the residual stream in bf16
#   autocast    PEFT under bf16 autocast (fp32 weights: norms, embeddings and the residual stream stay fp32)
#   ac+resid    autocast with the residual stream (forward and its gradient) rounded to bf16 after each add
# each on two bases: the fp32 base of check_peft.py (weights not representable in bf16) and the same weights
# rounded to bf16 and held in fp32 (every weight exact in bf16, as in the bf16 checkpoints users train).
# Run on the GPU machine: python3 tests/tools/probe_lora_precision.py build/soltrain [--cases 6]
import argparse, math, os, random, sys, tempfile, types

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_peft as cp  # noqa: E402


class RoundBf16(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.to(torch.bfloat16).to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        return g.to(torch.bfloat16).to(g.dtype)


def layer_forward_rounding_residual(self, hidden_states, **kwargs):
    residual = hidden_states
    h = self.input_layernorm(hidden_states)
    h = self.self_attn(hidden_states=h, **kwargs)[0]
    h = RoundBf16.apply(residual + h)
    residual = h
    h = self.mlp(self.post_attention_layernorm(h))
    h = RoundBf16.apply(residual + h)
    return (h,) if self._returns_tuple else h


def peft_grads(base_dir, adapter, ids, tgt, *, autocast, round_residual):
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).cuda()
    if round_residual:
        layers = base.model.layers
        seen = {}
        h = layers[0].register_forward_hook(lambda m, i, o: seen.update(tuple=isinstance(o, tuple)))  # returns None: output kept
        with torch.no_grad():
            base(input_ids=ids.cuda())
        h.remove()
        for layer in layers:
            layer._returns_tuple = seen["tuple"]
            layer.forward = types.MethodType(layer_forward_rounding_residual, layer)
    m = PeftModel.from_pretrained(base, adapter, is_trainable=True).cuda()
    m.eval()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        logits = m(input_ids=ids.cuda()).logits
    cp.loss_of(logits.float(), tgt.cuda()).backward()
    return {"grad." + n.replace(".default", ""): p.grad.float().cpu() for n, p in m.named_parameters() if p.grad is not None}


def bf16_rounded_copy(src, dst):
    m = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    with torch.no_grad():
        for p in m.parameters(): p.copy_(p.to(torch.bfloat16).float())
    m.save_pretrained(dst, safe_serialization=True)
    return dst


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("soltrain")
    ap.add_argument("--cases", type=int, default=6)
    ap.add_argument("--verbose", action="store_true", help="list the tensors where ours is worse than autocast")
    a = ap.parse_args()
    binary = os.path.abspath(a.soltrain)
    work = tempfile.mkdtemp(prefix="probe_lora-")
    rng = random.Random(0)
    torch.manual_seed(0)
    bases = {}
    for n in cp.BASES:
        f32 = cp.make_base(work, n, torch.float32)
        bases[n] = {"fp32": f32, "bf16-exact": bf16_rounded_copy(f32, f32 + "-exact")}
    batch, ids, tgt = cp.make_batch(work, cp.COMMON["vocab_size"])
    table = {}  # (base kind, variant) -> list of errors
    ratios = {}  # (base kind, variant) -> log(error / autocast's error) per tensor
    for i in range(a.cases):
        name = list(cp.BASES)[i % len(cp.BASES)]
        targets = cp.ALL if i % 4 == 0 else sorted(rng.sample(cp.ALL, rng.randint(1, len(cp.ALL))), key=cp.ALL.index)
        r, alpha = rng.choice([1, 2, 4, 8, 16]), rng.choice([1, 8, 16, 32, 7.5])
        rslora, dropout = bool(i % 2), rng.choice([0.0, 0.05, 0.1])
        scale = alpha / (r ** 0.5 if rslora else r)
        for kind, base_dir in bases[name].items():
            torch.manual_seed(i)
            m = get_peft_model(AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32),
                               LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets,
                                          use_rslora=rslora, task_type="CAUSAL_LM"))
            with torch.no_grad():
                for n, p in m.named_parameters():
                    if "lora_A" in n or "lora_B" in n: p.copy_(0.2 * torch.randn_like(p))
            adapter = os.path.join(work, f"case{i}-{kind}")
            m.save_pretrained(adapter)
            m.eval()
            cp.loss_of(m(input_ids=ids).logits, tgt).backward()
            ref = {"grad." + n.replace(".default", ""): p.grad for n, p in m.named_parameters() if p.grad is not None}
            dump = os.path.join(adapter, "dump.safetensors")
            cp.soltrain(binary, "dump", "--model", base_dir, "--adapter", adapter, "--batch", batch, "--out", dump,
                        "--device", "cuda")
            dump_b = os.path.join(adapter, "dump-bf16res.safetensors")
            cp.soltrain(binary, "dump", "--model", base_dir, "--adapter", adapter, "--batch", batch, "--out", dump_b,
                        "--device", "cuda", "--residual-dtype", "bf16")
            runs = {"ours": load_file(dump), "ours-bf16res": load_file(dump_b),
                    "autocast": peft_grads(base_dir, adapter, ids, tgt, autocast=True, round_residual=False),
                    "ac+resid": peft_grads(base_dir, adapter, ids, tgt, autocast=True, round_residual=True)}
            line = []
            for v, g in runs.items():
                errs = sorted(cp.rel(g[k], ref[k]) for k in ref)
                table.setdefault((kind, v), []).extend(errs)
                line.append(f"{v} {errs[len(errs) // 2]:.2e}/{errs[-1]:.2e}")
            for v in runs:
                if v != "autocast":
                    ratios.setdefault((kind, v), []).extend(
                        math.log(max(cp.rel(runs[v][k], ref[k]), 1e-9) / max(cp.rel(runs["autocast"][k], ref[k]), 1e-9))
                        for k in ref)
            worse = sum(cp.rel(runs["ours"][k], ref[k]) > 1.05 * cp.rel(runs["autocast"][k], ref[k]) + 1e-4 for k in ref)
            print(f"case {i} {name} r={r} alpha={alpha} rslora={rslora} scale={scale:.3g} [{kind}] median/worst: "
                  + ", ".join(line) + f"; ours worse than autocast on {worse}/{len(ref)}", flush=True)
            if kind == "bf16-exact" and a.verbose:
                for k in ref:
                    o, t = cp.rel(runs["ours"][k], ref[k]), cp.rel(runs["autocast"][k], ref[k])
                    if o > 1.05 * t + 1e-4: print(f"    {k}: ours {o:.3e} autocast {t:.3e}")
    print("\nall cases, relative L2 error of the LoRA gradients vs PEFT fp32, median / worst:")
    for (kind, v), errs in sorted(table.items()):
        errs.sort()
        lr = ratios.get((kind, v))
        gm = f", error / autocast's: geometric mean {math.exp(sum(lr) / len(lr)):.3f}" if lr else ""
        print(f"  [{kind:10s}] {v:12s} {errs[len(errs) // 2]:.3e} / {errs[-1]:.3e}  ({len(errs)} tensors){gm}")


if __name__ == "__main__":
    main()
