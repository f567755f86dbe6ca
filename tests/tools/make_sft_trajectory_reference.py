# Reference loss trajectory for tests/test_sft_trajectory.cpp: the production loop (`soltrain sft`) against
# transformers + torch on the same micro-batches.
#   1. soltrain demo-setup makes the model and data; soltrain sft (CPU) trains with --dump-batches.
#   2. transformers loads the same model (fp32, CPU) and trains on the dumped micro-batches as HF Trainer
#      does: loss of an update = Σ token NLL over its micro-batches / their counted targets
#      (num_items_in_batch), clip_grad_norm_, torch.optim.AdamW (decay on 2-D parameters only),
#      transformers.get_scheduler. Packed documents run through the model one at a time (positions restart,
#      no attention across documents), which is what soltrain's packing means.
#   3. expected.json: losses and gradient norms per update, and the model file's sha256 (the test checks that
#      demo-setup still makes the same model).
# Run: python3 tests/tools/make_sft_trajectory_reference.py build/soltrain tests/fixtures/sft_trajectory
import glob, hashlib, json, os, shutil, subprocess, sys, tempfile
import torch, yaml
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, get_scheduler

soltrain, fixture = sys.argv[1], sys.argv[2]
cfg = yaml.safe_load(open(os.path.join(fixture, "config.yaml")))
work = tempfile.mkdtemp()
shutil.copy(os.path.join(fixture, "config.yaml"), work)
subprocess.run([soltrain, "demo-setup", "--out", os.path.join(work, "data"), "--train", "200", "--validation", "8",
                "--seed", "5"], check=True)
subprocess.run([soltrain, "sft", os.path.join(work, "config.yaml"), "--dump-batches", os.path.join(work, "batches")],
               check=True)
ours = [json.loads(l) for l in open(os.path.join(work, "out", "metrics.jsonl")) if '"loss"' in l]

torch.manual_seed(0)
model = AutoModelForCausalLM.from_pretrained(os.path.join(work, "data", "model"), dtype=torch.float32,
                                             attn_implementation="eager")
model.train(False)  # no dropout in these models; eval keeps it so
decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
rest = [p for n, p in model.named_parameters() if p.dim() < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg["weight_decay"]}, {"params": rest, "weight_decay": 0.0}],
                        lr=cfg["learning_rate"], betas=(0.9, cfg["adamw_beta2"]), eps=1e-8)
steps, ga = cfg["max_steps"], cfg["gradient_accumulation_steps"]
sched = get_scheduler(cfg["lr_scheduler_type"], opt, num_warmup_steps=cfg["warmup_steps"], num_training_steps=steps)


def token_nll_sum(b):
    ids, tgt = b["input_ids"].long().reshape(-1), b["targets"].long().reshape(-1)
    cu = b["cu_seqlens"].tolist()
    total = torch.zeros(())
    for a, e in zip(cu[:-1], cu[1:]):
        t = tgt[a:e]
        if (t != -100).any():
            logits = model(input_ids=ids[a:e].unsqueeze(0)).logits[0]
            total = total + torch.nn.functional.cross_entropy(logits, t, ignore_index=-100, reduction="sum")
    return total, int((tgt != -100).sum())


losses, norms = [], []
for step in range(1, steps + 1):
    micro = [load_file(os.path.join(work, "batches", f"step-{step}-micro-{m}.safetensors")) for m in range(ga)]
    n_items = sum(int((b["targets"] != -100).sum()) for b in micro)
    opt.zero_grad()
    loss = 0.0
    for b in micro:
        s, _ = token_nll_sum(b)
        (s / n_items).backward()
        loss += float(s) / n_items
    norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["max_grad_norm"])))
    losses.append(loss)
    opt.step()
    sched.step()

sha = hashlib.sha256(open(os.path.join(work, "data", "model", "model.safetensors"), "rb").read()).hexdigest()
json.dump({"losses": losses, "grad_norms": norms, "model_sha256": sha,
           "soltrain_losses_when_made": [r["loss"] for r in ours]}, open(os.path.join(fixture, "expected.json"), "w"),
          indent=1)
for i, (a, b) in enumerate(zip(losses, [r["loss"] for r in ours])):
    print(f"step {i + 1}: transformers {a:.7f} soltrain {b:.7f} rel {abs(a - b) / a:.2e}")
