#!/usr/bin/env bash
# The main job: builds soltrain, makes a small random Qwen3-shaped model with a byte-level tokenizer and a
# synthetic task (reversing words, as conversations), fine-tunes it on CPU with `soltrain sft
# examples/demo.yaml`, shows the validation loss before and after and a few sample generations; then the same job
# and samples from Python (examples/demo.py). Offline; a few minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh --target soltrain _soltrain
./build/soltrain demo-setup --out runs/demo-data
./build/soltrain sft examples/demo.yaml "$@"
echo
echo "validation loss (mean over the answer tokens, from runs/demo/metrics.jsonl):"
grep '"eval_loss"' runs/demo/metrics.jsonl | sed -n '1p;$p' |
  sed -E 's/.*"eval_loss":([0-9.eE+-]+).*"step":([0-9]+).*/  step \2: \1/'
echo
echo "sample generations by the trained model (soltrain generate, greedy; it answers each word reversed):"
for w in hello world python; do
  out=$(./build/soltrain generate --model runs/demo/model --chat "$w" --max-new-tokens 24 2>/dev/null)
  echo "  $w -> ${out//$'\n'/ }"
done
echo "trained model: runs/demo/model; curves: runs/demo/training_curves.svg; TensorBoard: runs/demo/tensorboard"
echo
echo "the same from Python (examples/demo.py: soltrain.Trainer on examples/demo.yaml, then soltrain.Model.generate):"
PYTHONPATH=python python3 examples/demo.py 2>/dev/null
