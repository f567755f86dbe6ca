"""The GPU's measured HBM rate, the denominator issue 30 names for the decode step's share of its bound ("weights + KV
cache read per decode step at the measured HBM rate"): a device-to-device copy (each byte read once and written
once) of 1, 2 and 4 GiB, the best of 20 after a warm-up, and a read-only sum for comparison.

    python3 bench/hbm_rate.py        # prints one JSON line: copy_tb_s, read_tb_s, datasheet_tb_s
"""
import json
import subprocess

import torch


def best_seconds(fn, reps=20):
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return best


def main():
    name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                          text=True).stdout.strip()
    copy, read = 0.0, 0.0
    for gib in (1, 2, 4):
        n = gib << 30
        src = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
        dst = torch.empty_like(src)
        copy = max(copy, 2 * n / best_seconds(lambda: dst.copy_(src)))
        words = src.view(torch.int64)
        read = max(read, n / best_seconds(lambda: words.sum()))
        del src, dst, words
    print(json.dumps({"gpu": name, "copy_tb_s": round(copy / 1e12, 3), "read_tb_s": round(read / 1e12, 3),
                      "datasheet_tb_s": 4.8 if "H200" in name else 3.35}))


if __name__ == "__main__":
    main()
