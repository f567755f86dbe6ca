#!/usr/bin/env bash
# Data-parallel scaling in one call: soltrain on 1 GPU and on N GPUs (`soltrain bench --gpus N`, NCCL) next to
# transformers (+ PEFT) under torch DDP / FSDP2 (bench/peer_ddp.py via torchrun) on the same shapes, printing
# tokens/s, scaling against one GPU, memory per GPU and MFU. The run the scaling issue makes on 2, 4 and 8 GPUs:
#   bash bench/run_multi_gpu.sh [--gpus N] [--soltrain BIN] [--peers none] [lora8b] [full4b] [full8b]
# (no case: all three). Cases: Qwen3-8B LoRA r16, 2 rows of 2048 per GPU, ZeRO-0 (DDP for the peer);
# Qwen3-4B full, 2 rows per GPU, ZeRO-2 (FSDP2 without resharding); Qwen3-8B full, 1 row per GPU, ZeRO-3
# (FSDP2; soltrain ZeRO-3, no recompute: 91 GiB per GPU planned on 2). Results: $OUT/multi_gpu.jsonl.
# NVLink multicast stays off (the device README): NCCL_NVLS_ENABLE=0 for every worker.
set -u
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0
args=()
while [ $# -gt 0 ]; do
  case $1 in
    --gpus|--soltrain|--peers|--steps) args+=("$1" "$2"); shift 2 ;;
    *) args+=("--case" "$1"); shift ;;
  esac
done
exec python3 bench/multi_gpu.py "${args[@]}"
