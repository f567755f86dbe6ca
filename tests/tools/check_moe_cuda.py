#!/usr/bin/env python3
"""Mixture-of-Experts on CUDA against transformers (+ PEFT) on the GPU machine: tiny random Qwen3-MoE and Qwen2-MoE
models (python/tests/live_refs.py), `soltrain dump --device cuda` (bf16 compute) against an fp32 CPU reference, next to
transformers' own bf16 autocast run on the same GPU: logits, the loss with the load-balancing loss, and every
gradient (full: base weights incl. each expert, router, shared expert; LoRA: every adapter incl. the experts' and
the router's). Ours may not be worse than the peer's bf16 error (median over tensors within 1.5x + 2e-3, worst within
3x + 1e-2): that is "within bf16 error". Also: the same dump twice is bitwise identical.
Run: python3 tests/tools/check_moe_cuda.py build/soltrain [--keep DIR]; exit 1 on a failure."""
import argparse
import copy
import pathlib
import sys
import tempfile

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python" / "tests"))
from live_refs import dump, hf_grad, rel, tiny_moe  # noqa: E402

CASES = [
    dict(name="qwen3-moe norm_topk, aux", kind="qwen3_moe", keys=dict(norm_topk_prob=True, output_router_logits=True)),
    dict(name="qwen3-moe dense layer 1", kind="qwen3_moe",
         keys=dict(norm_topk_prob=False, output_router_logits=True, mlp_only_layers=[1])),
    dict(name="qwen2-moe shared expert", kind="qwen2_moe", keys=dict(norm_topk_prob=False, output_router_logits=True)),
    dict(name="qwen3-moe LoRA all-linear", kind="qwen3_moe", keys=dict(norm_topk_prob=True, output_router_logits=True),
         lora="all-linear"),
    dict(name="qwen2-moe LoRA shared expert", kind="qwen2_moe", keys=dict(norm_topk_prob=True, output_router_logits=True),
         lora=["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"]),
]
# Wider than the CPU tests' models, so the experts' GEMMs run more than one tile and the router has real choices.
SHAPE = dict(hidden_size=256, intermediate_size=384, moe_intermediate_size=128, num_experts=16, num_experts_per_tok=4,
             num_attention_heads=4, num_key_value_heads=2, head_dim=64)


def loss_of(model, ids, targets, config):
    out = model(input_ids=ids, output_router_logits=True)
    loss = torch.nn.functional.cross_entropy(out.logits.float().flatten(0, 1), targets.flatten(), ignore_index=-100)
    return out.logits, loss + config.router_aux_loss_coef * out.aux_loss.float()


def gradients(model, names, lora):
    if lora:
        params = {n.replace(".default", ""): p for n, p in model.named_parameters()}
        return {n: params[n].grad.detach().double().cpu() for n in names}
    return {n: hf_grad(model, n).detach().double().cpu() for n in names}


def check(binary, work, case):
    work.mkdir(parents=True)
    hf = tiny_moe(work / "model", seed=7, vocab=512, kind=case["kind"], **SHAPE, **case["keys"])
    adapter = None
    if case.get("lora"):
        import peft

        hf = peft.get_peft_model(hf, peft.LoraConfig(r=8, lora_alpha=16, target_modules=case["lora"]))
        with torch.no_grad():
            for n, p in hf.named_parameters():
                if "lora_" in n:
                    p.copy_(torch.randn_like(p) * 0.1)
        hf.save_pretrained(work / "adapter")
        adapter = work / "adapter"
    config = hf.config
    torch.manual_seed(3)
    ids = torch.randint(0, 512, (8, 192))  # 1,536 tokens: ~380 rows per expert
    targets = torch.roll(ids, -1, 1)
    targets[:, -1] = -100
    targets[1, :10] = -100
    ours = dump(work, ids, targets, adapter=adapter, device="cuda", binary=binary)
    again = dump(work, ids, targets, adapter=adapter, device="cuda", binary=binary)
    repeat = all(torch.equal(ours[k], again[k]) for k in ours)

    ref = copy.deepcopy(hf)  # fp32 on the CPU (transformers' grouped_mm experts take no fp64): ~1e-6, far below bf16
    ref.train(False)
    logits, loss = loss_of(ref, ids, targets, config)
    loss.backward()
    names = [k[5:] for k in ours if k.startswith("grad.")]
    want = gradients(ref, names, case.get("lora"))
    peer = copy.deepcopy(hf).cuda()
    peer.train(False)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        plogits, ploss = loss_of(peer, ids.cuda(), targets.cuda(), config)
    ploss.backward()
    got_peer = gradients(peer, names, case.get("lora"))

    rows = []
    for n in names:
        if not want[n].any():
            continue  # an expert no token chose
        rows.append((rel(ours["grad." + n], want[n]), rel(got_peer[n], want[n]), n))
    ours_e = sorted(r[0] for r in rows)
    peer_e = sorted(r[1] for r in rows)
    med = lambda v: v[len(v) // 2]  # noqa: E731
    lerr, plerr = rel(ours["logits"].reshape(logits.shape), logits.detach()), rel(plogits.float().cpu(), logits.detach())
    loss_err = abs(float(ours["loss"].flatten()[0]) - loss.item()) / loss.item()
    ok = (repeat and lerr <= 1.5 * plerr + 2e-3 and loss_err <= 1e-2 and med(ours_e) <= 1.5 * med(peer_e) + 2e-3
          and ours_e[-1] <= 3 * peer_e[-1] + 1e-2)
    worst = max(rows)
    print(f"{'ok  ' if ok else 'FAIL'} {case['name']}: {len(rows)} gradients; logits {lerr:.2e} (peer {plerr:.2e}); "
          f"loss {loss_err:.1e}; gradients median {med(ours_e):.2e} (peer {med(peer_e):.2e}), worst {ours_e[-1]:.2e} "
          f"(peer {peer_e[-1]:.2e}; ours' worst: {worst[2]}); repeat bitwise {repeat}")
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--keep", help="keep the models and dumps here")
    a = ap.parse_args()
    root = pathlib.Path(a.keep or tempfile.mkdtemp(prefix="moe-cuda-"))
    fails = [c["name"] for i, c in enumerate(CASES) if not check(a.binary, root / f"case{i}", c)]
    print("all passed" if not fails else f"FAILED: {fails}")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
