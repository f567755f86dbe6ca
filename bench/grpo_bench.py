"""GRPO on the GPU machine (issue 30): `soltrain grpo` on random models of Qwen3 shapes (demo-setup's byte-level
tokenizer, so the vocabulary is 320 and the LM head nearly free; the decoder layers are the real shapes' but for
head_dim = hidden / heads), prompts of random words, completions that run to max_completion_length (a random
model rarely says EOS). Per setting: the generation throughput the run reports (generation_tokens_per_second) and
its share of the memory-bandwidth bound (bf16 weights + the KV cache read per decode step at the GPU's datasheet HBM
rate, as bench-decode counts it), and the whole step's time split into generation and training.

    python3 bench/grpo_bench.py --soltrain .devbin/soltrain --out $OUT [--shapes 0.6B 1.7B] [--concurrency 64 256]
"""
import argparse
import json
import os
import random
import subprocess
import time

def hbm_rate():
    """The datasheet HBM rate of the GPU here (bench-decode's --hbm-gbps figures): H200 4.8 TB/s, H100 3.35."""
    try:
        name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True).stdout
    except OSError:
        name = ""
    return 4.8e12 if "H200" in name else 3.35e12
SHAPES = {  # hidden, layers, heads, kv heads, intermediate (Qwen3's, head_dim = hidden / heads here)
    "0.6B": (1024, 28, 8, 4, 3072),
    "1.7B": (2048, 28, 16, 8, 6144),
    "tiny": (128, 4, 4, 2, 384),  # a check of this script on the CPU
}


def make_real_model(shape, root, tokenizer_dir):
    """A random bf16 model of the real Qwen3 shape (vocab 151936, head_dim 128; bench/qwen3_shapes.py) with the
    Qwen3 tokenizer and chat template: the LM head and the sampling over 152k tokens cost what they do on hub models."""
    import shutil

    from run_bench import save_model  # the trainer benchmark's random models (bench/run_bench.py)
    d = save_model(shape, os.path.join(root, "real"))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tokenizer_dir, f), d)
    return d


def real_params_bytes(shape):
    from qwen3_shapes import matmul_params
    return 2 * matmul_params(shape)  # bf16; the tied embedding is the LM head read once per step


def real_kv_bytes_per_token(shape):
    from qwen3_shapes import HEAD_DIM, SHAPES as Q
    s = Q[shape]
    return 2 * s["num_hidden_layers"] * 2 * s["num_key_value_heads"] * HEAD_DIM


def make_model(soltrain, shape, root):
    d = os.path.join(root, shape)
    if not os.path.isdir(os.path.join(d, "model")):
        h, l, a, kv, f = SHAPES[shape]
        subprocess.run([soltrain, "demo-setup", "--out", d, "--model-only", "--hidden-size", str(h), "--layers", str(l),
                        "--heads", str(a), "--kv-heads", str(kv), "--intermediate-size", str(f)], check=True,
                       capture_output=True)
    return os.path.join(d, "model")


def params_bytes(shape):
    h, l, a, kv, f = SHAPES[shape]
    hd = h // a
    per_layer = h * (a * hd) * 2 + h * (kv * hd) * 2 + 3 * h * f
    return 2 * (l * per_layer + 320 * h)  # bf16


def kv_bytes_per_token(shape):
    h, l, a, kv, f = SHAPES[shape]
    return 2 * l * 2 * kv * (h // a)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--soltrain", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", nargs="+", default=["0.6B", "1.7B"])
    ap.add_argument("--concurrency", nargs="+", type=int, default=[64, 256])
    ap.add_argument("--completion", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--lora", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--real", metavar="TOKENIZER_DIR",
                    help="real Qwen3 shapes and vocabulary (random weights), with this folder's Qwen3 tokenizer")
    ap.add_argument("--sampling", default="{}", help="JSON of extra sampling keys (top_p, top_k, min_p, ...)")
    a = ap.parse_args()
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    root = "/tmp/soltrain-grpo-models"
    rng = random.Random(0)
    prompts = os.path.join(root, "prompts.jsonl")
    os.makedirs(root, exist_ok=True)
    with open(prompts, "w") as f:
        for _ in range(4096):
            w = " ".join("".join(rng.choice("abcdefghij") for _ in range(5)) for _ in range(8))
            f.write(json.dumps({"prompt": [{"role": "user", "content": w}], "answer": w}) + "\n")
    results = []
    hbm = hbm_rate()
    for shape in a.shapes:
        model = make_real_model(shape, root, a.real) if a.real else make_model(a.soltrain, shape, root)
        pbytes = real_params_bytes(shape) if a.real else params_bytes(shape)
        kvtok = real_kv_bytes_per_token(shape) if a.real else kv_bytes_per_token(shape)
        for n in a.concurrency:
            out = os.path.join(root, f"run-{'real-' if a.real else ''}{shape}-{n}")
            cfg = {"model": model, "output_dir": out, "overwrite_output_dir": True,
                   "datasets": [{"path": prompts}], "reward_funcs": ["think_format"], "num_generations": 8,
                   "max_prompt_length": 64, "max_completion_length": a.completion,
                   "per_device_train_batch_size": min(n, 32), "gradient_accumulation_steps": max(1, n // 32),
                   "max_steps": a.steps, "learning_rate": 1e-6, "logging_steps": 1, "device": a.device,
                   "lora": a.lora, "recompute": "full", **json.loads(a.sampling)}
            path = out + ".yaml"
            with open(path, "w") as f:
                json.dump(cfg, f)
            t0 = time.time()
            r = subprocess.run([a.soltrain, "grpo", path], capture_output=True, text=True, timeout=900)
            wall = time.time() - t0
            with open(os.path.join(a.out, f"grpo-{shape}-{n}.log"), "w") as f:
                f.write(r.stdout + r.stderr)
            if r.returncode != 0:
                print(shape, n, "failed:", r.stderr.strip().splitlines()[-1:])
                continue
            rows = [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl")) if '"reward"' in x]
            last = rows[-1]
            # With generation_overlap the last update generates nothing ahead and the first generates twice: the
            # steady step is the mean of the others (in the serial run every step is alike).
            mid = rows[1:-1] if a.steps >= 3 else rows[-1:]
            mean = lambda k: sum(x[k] for x in mid) / len(mid)
            gen = last["generation_tokens_per_second"]
            mean_len = last["completions/mean_length"]
            ctx = 64 + mean_len / 2  # the mean context a decode step reads
            step_bytes = pbytes + n * ctx * kvtok
            bound = n / (step_bytes / hbm)
            gen_s = mean("generation_seconds")
            step_s = sum(n * (64 + x["completions/mean_length"]) / x["tokens_per_s"] for x in mid) / len(mid)  # (prompts and completions)
            res = {"shape": shape, "vocab": 151936 if a.real else 320, "lora": a.lora, "concurrency": n, "generation_tok_s": round(gen), "bound_tok_s": round(bound),
                   "share_of_bound": round(gen / bound, 4), "step_s": round(step_s, 3), "generation_s": round(gen_s, 3),
                   "training_s": round(step_s - gen_s, 3), "train_tok_s": round(last["tokens_per_s"]),
                   "mean_completion": mean_len, "wall_s": round(wall, 1),
                   "losses": [x["loss"] for x in rows], "rewards": [x["reward"] for x in rows]}
            if "generation_wait_seconds" in mid[0]:  # overlapped: what the update waited for, not the generation's time
                res["generation_wait_s"] = round(mean("generation_wait_seconds"), 3)
                res["training_s"] = round(step_s - res["generation_wait_s"], 3)
            for k in ("sampling/sampling_logp_difference/mean", "sampling/sampling_logp_difference/max",
                      "sampling/importance_sampling_ratio/min", "sampling/importance_sampling_ratio/mean",
                      "sampling/importance_sampling_ratio/max"):
                if k in last:
                    res[k] = last[k]
            results.append(res)
            print(json.dumps(res), flush=True)
    with open(os.path.join(a.out, "grpo-bench.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
