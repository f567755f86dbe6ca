"""The decode step's GEMMs in torch (cuBLAS behind F.linear), timed as `soltrain bench-decode` times its own: 20 calls
recorded in a CUDA graph, replayed, device time per call; beside them in bench-decode's JSON ("gemms").

    python3 bench/decode_gemm_torch.py --rows 64 256 --shapes 0.6B 8B
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from qwen3_shapes import HEAD_DIM, SHAPES  # noqa: E402


def time_linear(rows, inp, out, out_dtype=torch.bfloat16, calls=20):
    x = torch.randn(rows, inp, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(out, inp, device="cuda", dtype=torch.bfloat16)
    run = (lambda: F.linear(x, w)) if out_dtype == torch.bfloat16 else (lambda: F.linear(x.float(), w.float()))
    if out_dtype != torch.bfloat16:  # the LM head: bf16 inputs, fp32 logits
        run = lambda: torch.matmul(x, w.t()).float()  # noqa: E731
    for _ in range(3):
        run()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g):
            for _ in range(calls):
                run()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (5 * calls)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--shapes", nargs="+", default=["0.6B", "8B"])
    a = ap.parse_args()
    for shape in a.shapes:
        s = SHAPES[shape]
        D, F_, H, Hkv, V = (s["hidden_size"], s["intermediate_size"], s["num_attention_heads"],
                            s["num_key_value_heads"], s.get("vocab_size", 151936))
        for rows in a.rows:
            out = {"shape": shape, "rows": rows}
            for name, i, o, dt in [("q", D, H * HEAD_DIM, torch.bfloat16), ("k/v", D, Hkv * HEAD_DIM, torch.bfloat16),
                                   ("o", H * HEAD_DIM, D, torch.bfloat16), ("gate/up", D, F_, torch.bfloat16),
                                   ("down", F_, D, torch.bfloat16), ("lm_head", D, V, torch.float32)]:
                out[name] = round(time_linear(rows, i, o, dt), 2)
            print(json.dumps(out))


if __name__ == "__main__":
    main()
