"""The reward model's CUDA path against the CPU on the GPU machine: `soltrain dump --reward` of one batch of random
pairs (some ending with the pad token, a pad inside one) on both devices, the causal LM read as its classifier with
a fresh score head (drawn on the host: the same on both). The loss and TRL's metrics agree to bf16's precision, and
so do the gradients of the score head (its one-column GEMMs forward and backward), the embedding and a projection.
    python3 tests/tools/check_reward_cuda.py SOLTRAIN_BIN MODEL_DIR [PAD_ID]"""
import subprocess
import sys
import tempfile

import torch
from dump_compare import compare_tensors
from safetensors.torch import load_file, save_file

binary, model = sys.argv[1], sys.argv[2]
pad = int(sys.argv[3]) if len(sys.argv) > 3 else 256
g = torch.Generator().manual_seed(11)
seqs = []
for i in range(12):
    n = int(torch.randint(6, 40, (1,), generator=g))
    s = [int(x) for x in torch.randint(8, 250, (n,), generator=g)]
    if i % 3 == 0:
        s.append(pad)
    if i == 4:
        s.insert(2, pad)
    seqs.append(s)
T = max(len(s) for s in seqs)
ids, positions, cu = [], [], [0]
for r, s in enumerate(seqs):
    ids += s + [0] * (T - len(s))
    positions += list(range(len(s))) + list(range(T - len(s)))
    cu.append(r * T + len(s))
    if len(s) < T:
        cu.append((r + 1) * T)
docs = [cu.index(r * T) for r in range(len(seqs))]
t = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
tmp = tempfile.mkdtemp()
save_file({"input_ids": t(ids).view(len(seqs), T), "targets": torch.full((len(seqs), T), -100, dtype=torch.int32),
           "positions": t(positions).view(len(seqs), T), "cu_seqlens": t(cu), "pairs": t(docs).view(-1, 2)},
          f"{tmp}/batch.safetensors")
out = {}
for device in ("cpu", "cuda"):
    r = subprocess.run([binary, "dump", "--model", model, "--batch", f"{tmp}/batch.safetensors", "--out",
                        f"{tmp}/{device}.safetensors", "--reward", "--pad-token-id", str(pad),
                        "--center-rewards-coefficient", "0.01", "--device", device], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL {device}: {r.stderr.strip()[-400:]}")
    out[device] = load_file(f"{tmp}/{device}.safetensors")
cpu, gpu = out["cpu"], out["cuda"]
failures = 0
for k in ["loss", "accuracy", "margin", "min_reward", "mean_reward", "max_reward"]:
    a, b = float(cpu[k][0]), float(gpu[k][0])
    ok = abs(a - b) <= 2e-2 * max(1.0, abs(a))
    failures += not ok
    print(f"{'ok' if ok else 'FAIL'} {k}: cpu {a:.6f} cuda {b:.6f}")
failures += compare_tensors(cpu, gpu, lambda k: k.startswith("grad.") and any(
    s in k for s in ("score", "embed", "layers.0.self_attn.q_proj", "layers.0.mlp.down_proj", "model.norm")))
print(f"{failures} failures")
sys.exit(1 if failures else 0)
