#!/usr/bin/env bash
# The main job for now: builds soltrain and trains a small Qwen3-shaped model on CPU for a few dozen
# AdamW steps, printing a falling loss, then saves it as a Hugging Face folder in runs/demo.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh --target soltrain
model=tests/fixtures/models/qwen3-tiny
./build/soltrain train --model "$model" --batch "$model/batch.safetensors" --steps 30 --lr 3e-3 --out runs/demo
