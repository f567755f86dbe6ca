"""The process reward model's CUDA path against the CPU on the GPU machine: `soltrain dump --token-labels 2` of one
batch of random rows (labels on a few tokens each, padded rows) on both devices, the causal LM read as its token
classifier with a fresh score head and zero bias (drawn on the host: the same on both). The loss and the logits agree
to bf16's precision, and so do the gradients of the score head and its bias (the bias epilogue and column sum of a
two-column head), the embedding and a projection.
    python3 tests/tools/check_prm_cuda.py SOLTRAIN_BIN MODEL_DIR"""
import subprocess
import sys
import tempfile

import torch
from dump_compare import compare_tensors
from safetensors.torch import load_file, save_file

binary, model = sys.argv[1], sys.argv[2]
g = torch.Generator().manual_seed(5)
rows, T = 6, 48
ids = torch.randint(8, 250, (rows, T), generator=g, dtype=torch.int32)
targets = torch.full((rows, T), -100, dtype=torch.int32)
positions, cu = [], [0]
for r in range(rows):
    n = int(torch.randint(12, T + 1, (1,), generator=g))
    for at in torch.randperm(n, generator=g)[:4]:
        targets[r, int(at)] = int(torch.randint(0, 2, (1,), generator=g))
    positions += list(range(n)) + list(range(T - n))
    cu.append(r * T + n)
    if n < T:
        cu.append((r + 1) * T)
tmp = tempfile.mkdtemp()
save_file({"input_ids": ids, "targets": targets, "positions": torch.tensor(positions, dtype=torch.int32).view(rows, T),
           "cu_seqlens": torch.tensor(cu, dtype=torch.int32)}, f"{tmp}/batch.safetensors")
out = {}
for device in ("cpu", "cuda"):
    r = subprocess.run([binary, "dump", "--model", model, "--batch", f"{tmp}/batch.safetensors", "--out",
                        f"{tmp}/{device}.safetensors", "--token-labels", "2", "--device", device],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL {device}: {r.stderr.strip()[-400:]}")
    out[device] = load_file(f"{tmp}/{device}.safetensors")
cpu, gpu = out["cpu"], out["cuda"]
failures = 0
a, b = float(cpu["loss"][0]), float(gpu["loss"][0])
ok = abs(a - b) <= 2e-2 * max(1.0, abs(a))
failures += not ok
print(f"{'ok' if ok else 'FAIL'} loss: cpu {a:.6f} cuda {b:.6f}")
failures += compare_tensors(cpu, gpu, lambda k: k == "logits" or (k.startswith("grad.") and any(
    s in k for s in ("score", "embed", "layers.0.self_attn.q_proj", "layers.0.mlp.down_proj", "model.norm"))))
print(f"{failures} failures")
sys.exit(1 if failures else 0)
