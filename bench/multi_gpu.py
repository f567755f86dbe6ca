# The body of bench/run_multi_gpu.sh (read its header for the cases): each case runs soltrain on one GPU and
# on N, and the peer on one GPU and on N, in this one process's call, then prints one table for all cases.
import argparse, json, os, subprocess, sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from qwen3_shapes import flops_per_token  # noqa: E402
from run_bench import gemm_ceiling, save_model  # noqa: E402

# name: (model size, rows per GPU, LoRA rank, soltrain's bench arguments on N GPUs, peer shard mode, one GPU too)
CASES = {
    "lora8b": ("8B", 2, 16, ["--data-parallel", "0"], "ddp", True),
    "full4b": ("4B", 2, 0, ["--data-parallel", "2"], "zero2", True),
    # ZeRO-3, no recompute: `bench --plan-only --gpus 2 --data-parallel 3` puts it at 91.2 GiB per GPU on 2 ranks
    # (38.0 on 8), 95.1 (66.5) while the whole loaded model is sharded (add `--recompute full` if it does not fit)
    "full8b": ("8B", 1, 0, ["--data-parallel", "3"], "zero3", False),
}
SEQ = 2048


def soltrain(binary, path, gpus, batch, lora, extra, steps):
    cmd = [binary, "bench", "--model", path, "--batch-size", str(batch), "--seq-len", str(SEQ), "--steps",
           str(steps), "--warmup", "2", "--device", "cuda", "--lora-rank", str(lora)]
    if gpus > 1:
        cmd += ["--gpus", str(gpus), *extra]
    elif "--recompute" in extra:
        cmd += extra[extra.index("--recompute"):][:2]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        return {"engine": "soltrain", "gpus": gpus, "error": (r.stderr.strip() + " | stdout: " + r.stdout.strip())[-400:]}
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["engine"] = "soltrain" + (f" ZeRO-{extra[1]}" if gpus > 1 else "")
    out.pop("profile_ms", None)
    return out


def peer(size, gpus, batch, lora, shard, steps):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}",
           os.path.join(os.path.dirname(__file__), "peer_ddp.py"), "--size", size, "--batch", str(batch),
           "--seq", str(SEQ), "--steps", str(steps), "--lora-rank", str(lora), "--shard", shard]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
    if r.returncode != 0 or not lines:
        err = r.stderr.strip().splitlines()
        msg = next((l for l in reversed(err) if "Error" in l), err[-1] if err else "failed")
        return {"engine": f"peer {shard}", "gpus": gpus, "error": msg[-300:]}
    return json.loads(lines[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=torch.cuda.device_count())
    ap.add_argument("--soltrain", default="build/soltrain")
    ap.add_argument("--peers", default="torch", help="torch, or none")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--case", action="append", default=[])
    ap.add_argument("--models", default="/tmp/soltrain-bench-models")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    cases = a.case or list(CASES)
    peak = gemm_ceiling()
    print(f"{torch.cuda.device_count()} x {torch.cuda.get_device_name()}, bf16 GEMM 8192^3: {peak:.1f} TFLOP/s, "
          f"N = {a.gpus}", flush=True)
    rows = []
    with open(os.path.join(a.out, "multi_gpu.jsonl"), "a") as log:
        for case in cases:
            size, batch, lora, extra, shard, one = CASES[case]
            path = save_model(size, a.models)
            fpt = flops_per_token(size, SEQ, lora=lora > 0)
            runs = []
            for gpus in ([1] if one else []) + [a.gpus]:
                runs.append(soltrain(a.soltrain, path, gpus, batch, lora, extra, a.steps))
            if a.peers != "none":
                for gpus in ([1] if one else []) + [a.gpus]:
                    runs.append(peer(size, gpus, batch, lora, shard if gpus > 1 else "ddp", a.steps))
            base = {}
            for r in runs:
                r.update(case=case, model=f"Qwen3-{size}" + (f" LoRA r{lora}" if lora else " full"),
                         rows_per_gpu=batch)
                fam = r["engine"].split()[0]
                if "tokens_per_s" in r:
                    r["mfu"] = r["tokens_per_s"] / r["gpus"] * fpt / 1e12 / peak
                    if r["gpus"] == 1: base[fam] = r["tokens_per_s"]
                    if fam in base: r["scaling"] = r["tokens_per_s"] / base[fam]
                print(json.dumps(r), flush=True)
                log.write(json.dumps(r) + "\n")
                rows.append(r)
    print(f"\n| model | rows x seq per GPU | engine | GPUs | tokens/s | scaling | per GPU | MFU | memory GiB/GPU | "
          f"optimizer GiB/GPU |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['model']} | {r['rows_per_gpu']}x{SEQ} | {r['engine']} | {r['gpus']} | error: "
                  f"{r['error'][:100]} | | | | | |")
            continue
        sc = f"{r['scaling']:.2f}x" if "scaling" in r else ""
        per = f"{100 * r['scaling'] / r['gpus']:.1f}%" if "scaling" in r else ""
        opt = f"{r['optimizer_gib']:.1f}" if "optimizer_gib" in r else ""
        print(f"| {r['model']} | {r['rows_per_gpu']}x{SEQ} | {r['engine']} | {r['gpus']} | {r['tokens_per_s']:.0f} | "
              f"{sc} | {per} | {100 * r['mfu']:.1f}% | {r['memory_gib']:.1f} | {opt} |")


if __name__ == "__main__":
    main()
