# Checks on the GPU machine (torch + transformers) that transformers loads what soltrain exports, with
# logits matching soltrain's own: (1) a model trained by `soltrain train` (full fine-tuning, HF folder),
# sharded and unsharded; (2) a model merged by `soltrain merge` from a PEFT-made adapter.
#   python3 tests/tools/check_export_hf.py SOLTRAIN_BIN   (run from the repository root)
import os, subprocess, sys, tempfile

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

soltrain = sys.argv[1]
root = "tests/fixtures"
work = tempfile.mkdtemp()
failures = 0


def run(*args):
    subprocess.run([soltrain, *args], check=True, capture_output=True, text=True)


def compare(model_dir, batch, what):
    global failures
    out = os.path.join(work, "dump.safetensors")
    run("dump", "--model", model_dir, "--batch", batch, "--out", out)
    ours = load_file(out)["logits"]
    ids = load_file(batch)["input_ids"].long()
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        theirs = hf(input_ids=ids).logits
    err = float((ours - theirs).norm() / theirs.norm())
    ok = err < 1e-5
    failures += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {what}: transformers loads it, logits rel err {err:.2e}")


for name in ("qwen3-tiny", "llama3-tiny-scaled", "qwen2-tiny-mqa-bias"):
    src = f"{root}/models/{name}"
    batch = f"{src}/batch.safetensors"
    out = os.path.join(work, f"trained-{name}")
    run("train", "--model", src, "--batch", batch, "--steps", "3", "--lr", "1e-3", "--out", out)
    compare(out, batch, f"{name} trained by soltrain train")
base = f"{root}/models/qwen3-tiny"
merged = os.path.join(work, "merged")
run("merge", "--model", base, "--adapter", f"{root}/peft/qwen3-tiny/adapter", "--out", merged)
compare(merged, f"{base}/batch.safetensors", "qwen3-tiny + PEFT adapter merged by soltrain merge")
print("FAILURES", failures)
sys.exit(1 if failures else 0)
