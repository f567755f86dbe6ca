# End-to-end benchmark on one GPU, side by side in one run: soltrain vs Hugging Face transformers (eager and
# torch.compile) on random-init Qwen3 shapes (full fine-tuning, bf16, AdamW), plus our attention kernels vs
# torch's scaled_dot_product_attention (flash and cuDNN backends). Prints one table; JSON results go to --out.
#   python3 bench/run_bench.py --soltrain build/soltrain --sizes 0.6B,1.7B,4B --peers eager,compile
# Tokens/s count B x T per whole step (forward, backward, optimizer), median over timed steps after warm-up.
# MFU = tokens/s x FLOPs/token (bench/qwen3_shapes.py) / the bf16 GEMM rate measured here (8192^3).
import argparse, gc, json, os, subprocess, sys, time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from qwen3_shapes import config, flops_per_token  # noqa: E402

BATCH = {"0.6B": 8, "1.7B": 4, "4B": 2, "8B": 1, "30B-A3B": 2, "30B-A3B-L12": 2}


def gemm_ceiling():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3): a @ b
    times = []
    for _ in range(20):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); a @ b; e.record(); torch.cuda.synchronize(); times.append(s.elapsed_time(e) / 1e3)
    times.sort()
    return 2 * 8192 ** 3 / times[len(times) // 2] / 1e12


def save_model(name, root, config_only=False):
    """A random-init model of these shapes, saved once; config_only: config.json alone (for soltrain's
    --random-weights, which draws the weights itself: Qwen3-30B-A3B's 61 GB never touch the disk)."""
    from transformers import AutoModelForCausalLM
    path = os.path.join(root, name + ("-config" if config_only else ""))
    if config_only:
        os.makedirs(path, exist_ok=True)
        config(name).save_pretrained(path)
        return path
    if not os.path.exists(os.path.join(path, "config.json")):
        torch.manual_seed(0)
        with torch.device("cuda"):
            m = AutoModelForCausalLM.from_config(config(name), dtype=torch.bfloat16)
        m.save_pretrained(path)
        del m
        gc.collect(); torch.cuda.empty_cache()
    return path


def run_soltrain(binary, path, batch, seq, steps, lora_rank=0, recompute="none", extra=()):
    # a variant's own --recompute replaces the table's (the CLI takes the flag once)
    own_recompute = [] if "--recompute" in extra else ["--recompute", recompute]
    out = subprocess.run([binary, "bench", "--model", path, "--batch-size", str(batch), "--seq-len", str(seq),
                          "--steps", str(steps), "--device", "cuda", "--lora-rank", str(lora_rank),
                          *own_recompute, *extra],
                         capture_output=True, text=True)
    if out.returncode != 0:
        return {"error": out.stderr.strip()[-300:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def peer_optimizer(params, low_memory):
    """The peer's AdamW: torch's fused one, or with low_memory an 8-bit one where a library for it is installed
    (bitsandbytes, else torchao), as users cut optimizer memory. Returns (optimizer, label)."""
    if low_memory:
        try:
            import bitsandbytes as bnb
            return bnb.optim.AdamW8bit(params, lr=1e-5, betas=(0.9, 0.95), weight_decay=0.1), " + bnb AdamW8bit"
        except ImportError:
            pass
        try:
            from torchao.optim import AdamW8bit
            return AdamW8bit(params, lr=1e-5, betas=(0.9, 0.95), weight_decay=0.1), " + torchao AdamW8bit"
        except ImportError:
            pass
    return torch.optim.AdamW(params, lr=1e-5, betas=(0.9, 0.95), weight_decay=0.1, fused=True), ""


def run_hf(name, batch, seq, steps, compile_, lora_rank=0, low_memory=False):
    """transformers (+ PEFT) on the same shapes. low_memory: the peer's own best memory settings without
    offloading libraries: gradient checkpointing, and 8-bit AdamW for full fine-tuning where installed."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    torch.cuda.reset_peak_memory_stats()
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config(name), dtype=torch.bfloat16)
    if low_memory:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if lora_rank:  # PEFT, LoRA on all seven projections, as users run it
        from peft import LoraConfig, get_peft_model
        if low_memory:
            model.enable_input_require_grads()
        model = get_peft_model(model, LoraConfig(r=lora_rank, lora_alpha=2 * lora_rank, lora_dropout=0.0,
                                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                                 "gate_proj", "up_proj", "down_proj"]))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt, opt_label = peer_optimizer(params, low_memory and not lora_rank)
    fwd = torch.compile(model) if compile_ else model
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), device="cuda")
    times = []
    try:
        for i in range(steps + 3):
            torch.cuda.synchronize(); t0 = time.perf_counter()
            loss = fwd(input_ids=ids, labels=ids).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step(); opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            if i >= 3: times.append(time.perf_counter() - t0)
        times.sort()
        step = times[len(times) // 2]
        r = {"engine": "transformers" + (" + PEFT" if lora_rank else "") + (" + compile" if compile_ else " eager")
                       + (" + grad ckpt" if low_memory else "") + opt_label,
             "step_s": step,
             "tokens_per_s": batch * seq / step, "memory_gib": torch.cuda.max_memory_allocated() / 2 ** 30}
    except torch.OutOfMemoryError:
        r = {"engine": "transformers" + (" + compile" if compile_ else " eager"), "error": "out of memory"}
    del model, opt, fwd
    gc.collect(); torch.cuda.empty_cache()
    return r


def torch_attention(b, h, kv, t, d, backend="flash", iters=20):
    q = torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, kv, t, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, kv, t, d, device="cuda", dtype=torch.bfloat16)
    k = k.repeat_interleave(h // kv, dim=1).requires_grad_()  # the flash backend wants equal heads
    v = v.repeat_interleave(h // kv, dim=1).requires_grad_()
    do = torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16)
    fwd, bwd = [], []
    from torch.nn.attention import sdpa_kernel, SDPBackend
    chosen = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
    with sdpa_kernel(chosen):
        for i in range(iters + 3):
            s, m, e = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            s.record(); o = F.scaled_dot_product_attention(q, k, v, is_causal=True); m.record()
            torch.autograd.grad(o, (q, k, v), do); e.record(); torch.cuda.synchronize()
            if i >= 3: fwd.append(s.elapsed_time(m)); bwd.append(m.elapsed_time(e))
    fwd.sort(); bwd.sort()
    flops = 4 * b * h * t * t * d / 2
    f, bw = fwd[len(fwd) // 2] / 1e3, bwd[len(bwd) // 2] / 1e3
    return {"engine": f"torch sdpa {backend}", "fwd_ms": f * 1e3, "bwd_ms": bw * 1e3, "fwd_tflops": flops / f / 1e12,
            "bwd_tflops": 2.5 * flops / bw / 1e12}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--soltrain", default="build/soltrain")
    ap.add_argument("--baseline", default="", help="another soltrain binary (an earlier build) run in the same table")
    ap.add_argument("--sizes", default="0.6B,1.7B,4B")
    ap.add_argument("--peers", default="eager,compile",
                    help="eager, compile, lowmem (eager with gradient checkpointing and, for full fine-tuning, "
                         "8-bit AdamW where installed: the peer's own best memory settings), or none")
    ap.add_argument("--compile-sizes", default="0.6B", help="sizes to also run with torch.compile")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--attention", default="8x16x8x2048,4x32x8x4096,2x32x8x8192")
    ap.add_argument("--attention-engines", default="split,split-longest,atomic,ordered,portable",
                    help="soltrain's attention rows: split, split-longest, atomic, ordered, portable (comma-separated)")
    ap.add_argument("--models", default="/tmp/soltrain-bench-models")
    ap.add_argument("--recompute", default="none", help="soltrain's activation recompute: none, selective, full")
    ap.add_argument("--lora-rank", type=int, default=0, help="LoRA on all seven projections (PEFT for the peer)")
    ap.add_argument("--variant", action="append", default=[],
                    help="LABEL=ARGS: one more run of --soltrain with these extra bench arguments, e.g. "
                         "'bf16 residual=--residual-dtype bf16'")
    ap.add_argument("--batch", default="", help="override batch sizes, e.g. 8B=2,0.6B=8")
    ap.add_argument("--random-weights", action="store_true",
                    help="soltrain draws its weights from config.json alone (no checkpoint written or read)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    results = {"gpu": torch.cuda.get_device_name(), "gemm_tflops": gemm_ceiling(), "train": [], "attention": []}
    peak = results["gemm_tflops"]
    print(f"bf16 GEMM 8192^3: {peak:.1f} TFLOP/s", flush=True)
    batches = dict(BATCH, **{k: int(v) for k, v in (kv.split("=") for kv in a.batch.split(",") if kv)})
    for name in [s for s in a.sizes.split(",") if s]:
        batch, fpt = batches[name], flops_per_token(name, a.seq, lora=a.lora_rank > 0)
        path = save_model(name, a.models, config_only=a.random_weights)
        own = ["--random-weights"] if a.random_weights else []
        rows = [run_soltrain(a.soltrain, path, batch, a.seq, a.steps, a.lora_rank, a.recompute, own)]
        rows[0].setdefault("engine", "soltrain")  # an error row names its engine too
        for v in a.variant:
            label, args = v.split("=", 1)
            rows.append(run_soltrain(a.soltrain, path, batch, a.seq, a.steps, a.lora_rank, a.recompute,
                                     own + args.split()))
            rows[-1]["engine"] = f"soltrain ({label})"
        if a.baseline:
            rows.append(run_soltrain(a.baseline, path, batch, a.seq, a.steps, a.lora_rank, a.recompute, own))
            rows[-1]["engine"] = "soltrain (baseline)"
        if "eager" in a.peers: rows.append(run_hf(name, batch, a.seq, a.steps, False, a.lora_rank))
        if "lowmem" in a.peers: rows.append(run_hf(name, batch, a.seq, a.steps, False, a.lora_rank, low_memory=True))
        if "compile" in a.peers and name in a.compile_sizes.split(","):
            rows.append(run_hf(name, batch, a.seq, a.steps, True, a.lora_rank))
        for r in rows:
            r.update(model=f"Qwen3-{name}" + (f" LoRA r{a.lora_rank}" if a.lora_rank else ""), batch=batch, seq=a.seq)
            if "tokens_per_s" in r:
                r["tflops"] = r["tokens_per_s"] * fpt / 1e12
                r["mfu"] = r["tflops"] / peak
            print(json.dumps(r), flush=True)
            results["train"].append(r)
    for shape in [s for s in a.attention.split(",") if s]:
        b, h, kv, t = map(int, shape.split("x"))
        rows = []
        # on an H200 the sm_90a kernels (the backward's forms: kernels/ops.h, AttentionBackward); the sm_80 ones
        # for reference; --attention-engines picks among them
        engines = {"split": ("soltrain", {}),
                   "split-longest": ("soltrain (split, longest first)", {"SOLTRAIN_ATTENTION_ORDER": "longest"}),
                   "atomic": ("soltrain (backward atomic)", {"SOLTRAIN_ATTENTION_BACKWARD": "atomic"}),
                   "ordered": ("soltrain (backward ordered)", {"SOLTRAIN_ATTENTION_BACKWARD": "ordered"}),
                   "portable": ("soltrain (sm_80 kernels)", {"SOLTRAIN_ATTENTION": "portable"})}
        for engine, env in [engines[e] for e in a.attention_engines.split(",") if e]:
            try:
                out = subprocess.run([a.soltrain, "bench-attention", "--batch", str(b), "--heads", str(h), "--kv-heads",
                                      str(kv), "--seq-len", str(t), "--head-dim", "128"], capture_output=True, text=True,
                                     env=dict(os.environ, **env), timeout=120)
                r = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else {"error": out.stderr[-300:]}
            except subprocess.TimeoutExpired:
                r = {"error": "timed out after 120 s"}
            r["engine"] = engine
            rows.append(r)
        for backend in ("flash", "cudnn"):
            try:
                rows.append(torch_attention(b, h, kv, t, 128, backend))
            except RuntimeError as e:
                rows.append({"engine": f"torch sdpa {backend}", "error": str(e)[:200]})
        for r in rows:
            r["shape"] = f"{b}x{h}({kv})x{t}"
            print(json.dumps(r), flush=True)
            results["attention"].append(r)
    with open(os.path.join(a.out, "bench_results.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(f"\n| model | batch x seq | engine | tokens/s | model TFLOP/s | MFU | memory GiB |")
    print("|---|---|---|---|---|---|---|")
    for r in results["train"]:
        if "error" in r:
            print(f"| {r['model']} | {r['batch']}x{r['seq']} | {r.get('engine')} | error: {r['error'][:80]} | | | |")
        else:
            print(f"| {r['model']} | {r['batch']}x{r['seq']} | {r['engine']} | {r['tokens_per_s']:.0f} | "
                  f"{r['tflops']:.0f} | {100 * r['mfu']:.1f}% | {r['memory_gib']:.1f} |")
    for r in results["train"]:
        prof = r.get("profile_ms")
        if not prof:
            continue
        total = sum(prof.values())
        print(f"\nsoltrain {r['model']} per-op device time in one step ({total:.1f} ms summed):")
        for name, ms in sorted(prof.items(), key=lambda kv: -kv[1]):
            print(f"  {name:28s} {ms:8.2f} ms  {100 * ms / total:5.1f}%")
    print(f"\n| attention B x H(kv) x T, hd 128, causal | engine | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s |")
    print("|---|---|---|---|---|---|")
    for r in results["attention"]:
        if "error" in r:
            print(f"| {r['shape']} | {r.get('engine', 'soltrain')} | error | | | |")
        else:
            print(f"| {r['shape']} | {r['engine']} | {r['fwd_ms']:.2f} | {r['fwd_tflops']:.0f} | {r['bwd_ms']:.2f} | "
                  f"{r['bwd_tflops']:.0f} |")


if __name__ == "__main__":
    main()
