# The peer of bench/run_multi_gpu.sh: transformers (+ PEFT) under torch's own data parallel, as users run it,
# started by torchrun (one process per GPU):
#   torchrun --nproc_per_node N bench/peer_ddp.py --size 8B --batch 2 --lora-rank 16 --shard ddp
# --shard ddp: DistributedDataParallel (gradients all-reduced; LoRA's usual setup); zero2: FSDP2 fully_shard
# with reshard_after_forward=False (ZeRO-2: optimizer state and gradients sharded, weights kept whole after
# forward); zero3: FSDP2 resharding after forward (ZeRO-3). Random-init bf16 Qwen3 shapes (qwen3_shapes.py),
# AdamW with gradient clipping, each rank its own random rows. Rank 0 prints one JSON line: tokens/s of all
# ranks (median step after warm-up), and the largest peak memory of any rank.
import argparse, json, os, sys, time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
from qwen3_shapes import config  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="8B")
    ap.add_argument("--batch", type=int, default=1, help="rows per GPU")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--lora-rank", type=int, default=0)
    ap.add_argument("--shard", choices=["ddp", "zero2", "zero3"], default="ddp")
    ap.add_argument("--checkpointing", action="store_true", help="transformers' gradient checkpointing")
    a = ap.parse_args()
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, world = dist.get_rank(), dist.get_world_size()
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config(a.size), dtype=torch.bfloat16)
    if a.checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    if a.lora_rank:
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=a.lora_rank, lora_alpha=2 * a.lora_rank, lora_dropout=0.0,
                                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                                 "gate_proj", "up_proj", "down_proj"]))
    model.train()
    if a.shard == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        wrapped = DistributedDataParallel(model, device_ids=[local])
    else:
        from torch.distributed.fsdp import fully_shard
        reshard = a.shard == "zero3"
        layers = model.base_model.model.model.layers if a.lora_rank else model.model.layers
        for layer in layers:
            fully_shard(layer, reshard_after_forward=reshard)
        fully_shard(model, reshard_after_forward=reshard)
        wrapped = model
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5, betas=(0.9, 0.95), weight_decay=0.1, fused=a.shard == "ddp")
    g = torch.Generator(device="cuda").manual_seed(1234 + rank)
    ids = torch.randint(0, model.config.vocab_size, (a.batch, a.seq), device="cuda", generator=g)
    torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(a.warmup + a.steps):
        torch.cuda.synchronize(); dist.barrier(); t0 = time.perf_counter()
        loss = wrapped(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step(); opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if i >= a.warmup: times.append(time.perf_counter() - t0)
    times.sort()
    step = times[len(times) // 2]
    peak = torch.tensor([torch.cuda.max_memory_allocated() / 2 ** 30], device="cuda")
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    if rank == 0:
        engine = "transformers" + (" + PEFT" if a.lora_rank else "") + {"ddp": " DDP", "zero2": " FSDP2 (ZeRO-2)",
                                                                         "zero3": " FSDP2 (ZeRO-3)"}[a.shard]
        print(json.dumps({"engine": engine, "gpus": world, "batch": a.batch, "seq": a.seq, "step_s": step,
                          "tokens_per_s": a.batch * a.seq * world / step, "memory_gib": float(peak.item()),
                          "loss": float(loss.item())}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
