# Reference for preference training (tests/test_dpo.cpp): torch computes TRL's DPO losses (sigmoid with
# label smoothing, IPO, hinge; rpo_alpha's NLL term) on pairs of packed documents, and every gradient.
#   documents: row 0 of the model's fixture batch cut at token 10, row 1 at 7 (positions restart, no
#              attention across documents: each runs through the model alone); the first 3 targets of each
#              document are not counted (its prompt); pairs (0 chosen, 1 rejected), (2 chosen, 3 rejected)
#   reference: Σ NLL of each document under the same model plus fixed offsets, so z != 0 and the pairs differ
#   policy log-prob π = −Σ NLL over the answer (IPO: divided by its counted targets, as TRL does), and per pair
#   z = (π_c − π_r) − (ref_c − ref_r)
#   sigmoid: −(1−ε) logσ(βz) − ε logσ(−βz);  ipo: (z − 1/(2β))²;  hinge: relu(1 − βz)
#   loss = mean over pairs + rpo_alpha · (Σ chosen NLL / chosen counted targets)
# Written to OUT/<model>.safetensors: input_ids, targets, positions, cu_seqlens (the packed batch), pairs [P,2],
# ref_nll [P,2], and per variant V: V.loss, V.rewards_chosen, V.rewards_rejected, V.rewards_accuracies,
# V.logps_chosen, V.logps_rejected (means over pairs, TRL's metrics) and V.grad.<hf name>.
# Run (on the GPU machine, where torch and transformers are installed; it computes on the CPU in fp32):
#   python3 tests/tools/make_dpo_reference.py tests/fixtures/models tests/fixtures/dpo
import os, sys, torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

CUTS = {0: 10, 1: 7}
PROMPT = 3
OFFSETS = [0.7, -0.4, -0.3, 0.9]  # added to each document's reference Σ NLL
# name: (loss_type, beta, label_smoothing, rpo_alpha) — the same list as kVariants in tests/test_dpo.cpp
VARIANTS = {
    "sigmoid": ("sigmoid", 0.1, 0.0, 0.0),
    "sigmoid_smooth_rpo": ("sigmoid", 0.2, 0.1, 0.5),
    "ipo": ("ipo", 0.1, 0.0, 0.0),
    "hinge": ("hinge", 0.5, 0.0, 0.0),
}


def documents(batch):
    ids, tgt = batch["input_ids"].long(), batch["targets"].long().clone()
    B, T = ids.shape
    docs, positions = [], torch.zeros(B, T, dtype=torch.int32)
    for r in range(2):
        cut = CUTS[r]
        for a, b in ((0, cut), (cut, T)):
            docs.append((r, a, b))
            positions[r, a:b] = torch.arange(b - a, dtype=torch.int32)
            tgt[r, a:a + PROMPT] = -100
    cu = [0] + [r * T + b for (r, a, b) in docs]
    return ids, tgt, positions, cu, docs


def doc_nll(model, ids, tgt, docs):
    out = []
    for (r, a, b) in docs:
        logits = model(input_ids=ids[r:r + 1, a:b]).logits[0]
        out.append(F.cross_entropy(logits, tgt[r, a:b], ignore_index=-100, reduction="sum"))
    return torch.stack(out)


def make(model_dir, out_file):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    model.train(False)
    batch = load_file(os.path.join(model_dir, "batch.safetensors"))
    assert batch["input_ids"].shape[0] >= 2, "the tool needs a batch of at least two rows"
    ids, tgt, positions, cu, docs = documents(batch)
    counted = torch.tensor([float((tgt[r, a:b] != -100).sum()) for (r, a, b) in docs])
    pairs = torch.tensor([[0, 1], [2, 3]])
    with torch.no_grad():
        ref = doc_nll(model, ids, tgt, docs) + torch.tensor(OFFSETS)
    out = {"input_ids": ids.to(torch.int32).contiguous(), "targets": tgt.to(torch.int32).contiguous(),
           "positions": positions.contiguous(), "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
           "pairs": pairs.to(torch.int32), "ref_nll": ref[pairs].float().contiguous()}
    for name, (loss_type, beta, eps, rpo) in VARIANTS.items():
        model.zero_grad(set_to_none=True)
        nll = doc_nll(model, ids, tgt, docs)
        scale = 1.0 / counted if loss_type == "ipo" else torch.ones_like(counted)  # TRL: IPO averages
        logp, ref_logp = -nll * scale, -ref * scale
        pc, pr = logp[pairs[:, 0]], logp[pairs[:, 1]]
        rc, rr = ref_logp[pairs[:, 0]], ref_logp[pairs[:, 1]]
        z = (pc - pr) - (rc - rr)
        if loss_type == "sigmoid":
            losses = -F.logsigmoid(beta * z) * (1 - eps) - F.logsigmoid(-beta * z) * eps
        elif loss_type == "ipo":
            losses = (z - 1 / (2 * beta)) ** 2
        else:
            losses = torch.relu(1 - beta * z)
        loss = losses.mean()
        if rpo:  # TRL's rpo_alpha: the chosen answers' token-mean NLL
            loss = loss + rpo * nll[pairs[:, 0]].sum() / counted[pairs[:, 0]].sum()
        loss.backward()
        rew_c, rew_r = beta * (pc - rc).detach(), beta * (pr - rr).detach()
        metrics = {"loss": loss.detach(), "rewards_chosen": rew_c.mean(), "rewards_rejected": rew_r.mean(),
                   "rewards_accuracies": (rew_c > rew_r).float().mean(), "logps_chosen": pc.detach().mean(),
                   "logps_rejected": pr.detach().mean()}
        for k, v in metrics.items():
            out[f"{name}.{k}"] = v.reshape(1).float()
        for n, p in model.named_parameters():
            if p.grad is not None:
                out[f"{name}.grad.{n}"] = p.grad.detach().float().contiguous()
        print(f"{out_file}: {name} loss {float(loss):.6f} z {[round(float(v), 4) for v in z]}")
    save_file(out, out_file)
    print(out_file, "written:", len(docs), "documents,", len(pairs), "pairs,", len(VARIANTS), "loss variants")


src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst, exist_ok=True)
for name in ("qwen3-tiny", "llama-tiny"):
    make(os.path.join(src, name), os.path.join(dst, name + ".safetensors"))
