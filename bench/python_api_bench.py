"""The Python API's training step against `soltrain bench`, in one run on the same model, batch shape and
optimizer settings: soltrain.Model.step (numpy rows in; the trainer's own TrainStep; the loss read back every step,
as bench waits for every step) timed per step by the wall clock, next to bench's median step. Qwen3-0.6B full
fine-tuning at 8 x 2048 and Qwen3-8B LoRA r16 (alpha 32, all seven projections) at 2 x 2048, random weights of
the real shapes (bench/qwen3_shapes.py). Issue 27 asks for the binding to cost nothing per step (within 1%).
Run on the GPU machine after the module is built there (bench/gpu_module):
    python3 bench/python_api_bench.py --soltrain .devbin/soltrain --models /tmp/models --out $OUT
The soltrain process imports no torch (the carried Debian libraries must not meet torch's); models are made in a
separate process that does.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CASES = {  # name: (size, rows, lora rank)
    "0.6B full 8x2048": ("0.6B", 8, 0),
    "8B LoRA r16 2x2048": ("8B", 2, 16),
}
SEQ = 2048


def make_model(size, root):
    code = f"import sys; sys.path.insert(0, 'bench'); import run_bench; print(run_bench.save_model({size!r}, {root!r}))"
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()[-1]


def bench(binary, path, rows, lora, steps):
    out = subprocess.run([binary, "bench", "--model", path, "--batch-size", str(rows), "--seq-len", str(SEQ),
                          "--steps", str(steps), "--device", "cuda", "--lora-rank", str(lora)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["tokens_per_s"]


def python_step(path, rows, lora, steps):
    """In its own process: soltrain.Model.step's median tokens/s."""
    code = f"""
import json, time, statistics, numpy as np, soltrain
keys = dict(learning_rate=1e-5, adamw_beta2=0.95, weight_decay=0.1)
if {lora}: keys.update(lora=True, lora_rank={lora}, lora_alpha={2 * lora}, lora_dropout=0.0)
m = soltrain.Model.from_pretrained({path!r}, sequence_len={SEQ}, rows={rows}, device="cuda", **keys)
rng = np.random.default_rng(1234)
ids = rng.integers(0, m.vocab_size, size=({rows}, {SEQ}), dtype=np.int32)
targets = np.roll(ids, -1)
times = []
for s in range(3 + {steps}):
    t0 = time.perf_counter()
    m.step(ids, targets)
    if s >= 3: times.append(time.perf_counter() - t0)
print(json.dumps({{"tokens_per_s": {rows} * {SEQ} / statistics.median(times)}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["tokens_per_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--soltrain", required=True)
    ap.add_argument("--models", default="/tmp/models")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2, help="bench and Python alternate this many times")
    ap.add_argument("--out", default=".")
    a = ap.parse_args()
    rows_out = []
    for name, (size, rows, lora) in CASES.items():
        path = make_model(size, a.models)
        b, p = [], []
        for _ in range(a.rounds):  # alternated, so a drifting clock or a warm GPU favours neither
            b.append(bench(a.soltrain, path, rows, lora, a.steps))
            p.append(python_step(path, rows, lora, a.steps))
        row = {"case": name, "bench_tok_s": b, "python_tok_s": p,
               "python_vs_bench": statistics.median(p) / statistics.median(b) - 1}
        rows_out.append(row)
        print(f"| {name} | {statistics.median(b):.0f} | {statistics.median(p):.0f} | "
              f"{100 * row['python_vs_bench']:+.2f}% |", flush=True)
    with open(os.path.join(a.out, "python_api_bench.json"), "w") as f:
        json.dump(rows_out, f, indent=1)


if __name__ == "__main__":
    main()
