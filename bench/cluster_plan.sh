#!/usr/bin/env bash
# The README's cluster table: `bench --plan-only` per GPU for the bench/cluster_configs shapes at 1 x 4096 tokens a
# rank, recompute full, ZeRO-3, full fine-tuning and LoRA r16, on 8 GPUs (1 node), 16 (2 nodes) and 64 (8 nodes).
# Each cell: device memory per GPU, the load's peak, GiB rank 0 sends per update, the estimated step.
# Usage: bash bench/cluster_plan.sh [path/to/soltrain]   (no GPU needed: nothing is allocated)
set -euo pipefail
bin=${1:-build/soltrain}
here=$(cd "$(dirname "$0")" && pwd)
echo "| model | run | 8 GPUs, 1 node | 16 GPUs, 2 nodes | 64 GPUs, 8 nodes |"
echo "|---|---|---|---|---|"
for model in qwen3-32b llama-3.1-70b qwen3-235b-a22b; do
  for run in full "LoRA r16"; do
    row="| $model | $run |"
    for gn in 8:1 16:2 64:8; do
      extra=()
      [ "$run" = full ] || extra=(--lora-rank 16)
      cell=$("$bin" bench --plan-only --device cuda --model "$here/cluster_configs/$model" --batch-size 1 \
        --seq-len 4096 --recompute full --gpus "${gn%:*}" --nodes "${gn#*:}" --data-parallel 3 "${extra[@]}" |
        python3 -c 'import json, sys
j = json.load(sys.stdin); d = j["data_parallel"]; c = d["communication"]
sent = c["all_gather_gib"] + c["reduce_scatter_gib"] + c["all_reduce_gib"]
print("%.1f GiB, load %.1f, %.1f GiB, %.1f s" % (j["total_gib"], d["load_peak_gib"], sent, c["step_ms"] / 1e3))')
      row="$row $cell |"
    done
    echo "$row"
  done
done
