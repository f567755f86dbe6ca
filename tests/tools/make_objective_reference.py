# Reference for the objective interface (tests/test_objective.cpp): transformers (fp32, CPU) computes a loss
# that is not SFT's, on packed documents, and its gradients.
#   documents: row 0 of the fixture batch split at token 10, row 1 at token 7 (positions restart, no
#              attention across documents: each document runs through the model on its own)
#   loss     = Σ_d c_d · m_d²,  m_d = mean NLL of document d's counted targets,  c_d = 1 + 0.5·d
# Written to OUT/<model>.safetensors: input_ids, targets, positions, cu_seqlens (the packed batch), coef,
# doc_nll (Σ NLL per document), loss, grad.<hf name>.
# Run: python3 tests/tools/make_objective_reference.py tests/fixtures/models tests/fixtures/objective
import os, sys, torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

SPLITS = {0: 10, 1: 7}  # row -> where its second document starts


def make(model_dir, out_file):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    model.train(False)
    batch = load_file(os.path.join(model_dir, "batch.safetensors"))
    ids, tgt = batch["input_ids"].long(), batch["targets"].long()
    B, T = ids.shape
    docs, positions = [], torch.zeros(B, T, dtype=torch.int32)
    for r in range(B):
        cut = SPLITS.get(r, T)
        for a, b in ((0, cut), (cut, T)):
            if b > a:
                docs.append((r, a, b))
                positions[r, a:b] = torch.arange(b - a, dtype=torch.int32)
    cu = [0] + [r * T + b for (r, a, b) in docs]
    coef = torch.tensor([1.0 + 0.5 * d for d in range(len(docs))])
    loss = torch.zeros(())
    doc_nll = []
    for d, (r, a, b) in enumerate(docs):
        logits = model(input_ids=ids[r:r + 1, a:b]).logits[0]
        t = tgt[r, a:b]
        nll = torch.nn.functional.cross_entropy(logits, t, ignore_index=-100, reduction="none")
        counted = int((t != -100).sum())
        doc_nll.append(nll.sum())
        if counted:
            loss = loss + coef[d] * (nll.sum() / counted) ** 2
    loss.backward()
    out = {"input_ids": ids.to(torch.int32).contiguous(), "targets": tgt.to(torch.int32).contiguous(),
           "positions": positions.contiguous(), "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
           "coef": coef.float(), "doc_nll": torch.stack(doc_nll).detach().float(),
           "loss": loss.detach().reshape(1).float()}
    for n, p in model.named_parameters():
        if p.grad is not None:
            out["grad." + n] = p.grad.detach().float().contiguous()
    save_file(out, out_file)
    print(out_file, "documents", len(docs), "loss", float(loss))


src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst, exist_ok=True)
for name in ("qwen3-tiny", "llama-tiny", "qwen2-tiny-mqa-bias"):
    make(os.path.join(src, name), os.path.join(dst, name + ".safetensors"))
