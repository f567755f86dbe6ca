"""Qwen3-VL's language model on the GPU (bench/gpu_core_check.sh qwen3vl): a tiny random Qwen3VLForConditionalGeneration
with a PEFT adapter (live_refs.tiny_qwen3_vl / random_adapter), `soltrain dump` on cuda next to the CPU's (which
python/tests/test_qwen3_vl.py holds to PEFT at 1e-5): logits and adapter gradients within bf16's reach.
    python3 tests/tools/check_qwen3_vl_cuda.py SOLTRAIN_BINARY OUT_DIR"""
import pathlib
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python" / "tests"))
import torch  # noqa: E402

from live_refs import dump, random_adapter, reference_batch, rel, tiny_qwen3_vl  # noqa: E402

binary, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
model = tiny_qwen3_vl(out / "model", vocab=300)
pm = random_adapter(model, out / "adapter", targets=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                     "down_proj"])
torch.manual_seed(4)
ids, targets = reference_batch(300)
cpu = dump(out, ids, targets, adapter=out / "adapter", binary=binary)
cuda = dump(out, ids, targets, adapter=out / "adapter", device="cuda", binary=binary)
with torch.no_grad():
    logits = pm(input_ids=ids).logits
ok = True
e_cpu = rel(cpu["logits"].reshape(logits.shape), logits)
e_cuda = rel(cuda["logits"].reshape(logits.shape), logits)
print(f"logits vs PEFT: cpu {e_cpu:.2e}, cuda {e_cuda:.2e}")
ok &= e_cpu <= 1e-5 and e_cuda <= 3e-2
worst = max(rel(cuda[n], cpu[n]) for n in cpu if n.startswith("grad."))
print(f"adapter gradients cuda vs cpu: worst {worst:.2e} over {sum(n.startswith('grad.') for n in cpu)}")
ok &= worst <= 6e-2
print("ok" if ok else "FAIL")
sys.exit(0 if ok else 1)
