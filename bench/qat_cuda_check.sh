#!/usr/bin/env bash
# QAT on the GPU (model/qat.h, kernels/cuda/fake_quant.cu) against the CPU twin: `soltrain dump` of one random
# Llama and batch on both devices, plain and under each fake quantisation scheme; the relative errors of the logits
# and gradients are printed (the CUDA run computes in bf16: its plain error is the yardstick). Then an Axolotl-style
# qat run trains on the GPU. Run there with the CUDA build's binaries unpacked (bench/pack_devbin.sh):
#   tar xJf .gl/devbin.txz && bash bench/qat_cuda_check.sh "$OUT"
set -euo pipefail
out=${1:-/tmp/qat-check}
mkdir -p "$out"
B=${SOLTRAIN:-.devbin/soltrain}
work=$(mktemp -d)
python3 - "$work" <<'PY'
import sys, torch, transformers
from safetensors.torch import save_file
w = sys.argv[1]
torch.manual_seed(5)
cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=256,
                               tie_word_embeddings=False)
m = transformers.LlamaForCausalLM(cfg)
with torch.no_grad():
    for p in m.parameters():
        p.copy_(torch.randn_like(p) * (0.5 if p.ndim == 1 else 0.08) + (1.0 if p.ndim == 1 else 0.0))
m.save_pretrained(f"{w}/model")
ids = torch.randint(0, 512, (4, 64))
t = torch.roll(ids, -1, 1); t[:, -1] = -100
save_file({"input_ids": ids.int(), "targets": t.int()}, f"{w}/batch.safetensors")
import peft
pm = peft.get_peft_model(m, peft.LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
with torch.no_grad():
    for n, p in pm.named_parameters():
        if "lora_" in n:
            p.copy_(torch.randn_like(p) * 0.05)
pm.save_pretrained(f"{w}/adapter")
PY
for scheme in none int4:int8:32 int4:int8:256 mxfp4:mxfp4 nvfp4:nvfp4; do
  for dev in cpu ${DEV:-cuda}; do
    extra=()
    [ "$scheme" != none ] && extra=(--qat "$scheme")
    "$B" dump --device "$dev" --model "$work/model" --batch "$work/batch.safetensors" \
      --out "$work/${scheme//:/_}-$dev.safetensors" "${extra[@]}" > /dev/null
  done
done
for q in none nf4 nvfp4; do  # the NVFP4 base's dequantise kernel next to NF4's and the bf16 base, LoRA over each
  for dev in cpu ${DEV:-cuda}; do
    "$B" dump --device "$dev" --model "$work/model" --adapter "$work/adapter" --qlora "$q" \
      --batch "$work/batch.safetensors" --out "$work/lora-$q-$dev.safetensors" > /dev/null
  done
done
python3 - "$work" <<'PY' | tee "$out/qat_cuda_vs_cpu.txt"
import sys
import os
from safetensors.torch import load_file
w = sys.argv[1]
def rel(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    return float((a - b).norm() / b.norm())
runs = [(s, s.replace(":", "_")) for s in ["none", "int4:int8:32", "int4:int8:256", "mxfp4:mxfp4", "nvfp4:nvfp4"]]
runs += [(f"LoRA over {q}", f"lora-{q}") for q in ["none", "nf4", "nvfp4"]]
for scheme, stem in runs:
    c = load_file(f"{w}/{stem}-cpu.safetensors")
    g = load_file(f"{w}/{stem}-{os.environ.get('DEV', 'cuda')}.safetensors")
    grads = [rel(g[k], c[k]) for k in c if k.startswith("grad.")]
    print(f"{scheme:18s} logits {rel(g['logits'], c['logits']):.2e}  loss cpu {float(c['loss'][0]):.6f} cuda "
          f"{float(g['loss'][0]):.6f}  grads worst {max(grads):.2e} median {sorted(grads)[len(grads) // 2]:.2e}")
PY
"$B" demo-setup --out "$work/demo" > /dev/null
cat > "$work/run.yml" <<YML
base_model: $work/demo/model
datasets:
  - path: $work/demo/train.jsonl
    type: chat_template
output_dir: $work/run
sequence_len: 256
micro_batch_size: 8
max_steps: 30
learning_rate: 3e-3
logging_steps: 10
device: ${DEV:-cuda}
qat:
  weight_dtype: nvfp4
  activation_dtype: nvfp4
  group_size: 16
YML
"$B" train "$work/run.yml" 2>&1 | tail -8 | tee "$out/qat_cuda_run.txt"
