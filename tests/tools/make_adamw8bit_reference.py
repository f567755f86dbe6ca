# Writes tests/fixtures/adamw8bit/reference.safetensors: bitsandbytes' 8-bit blockwise AdamW computed in torch
# (run on the GPU machine, where torch is; bitsandbytes itself is not installed there, so its algorithm is written
# out here from its own sources: functional.py create_dynamic_map, backends/default/ops.py quantize_blockwise,
# backends/cpu/ops.py _optimizer_update_8bit_blockwise_cpu, with torch.optim.AdamW's update between).
# soltrain's CPU twin (tests/test_adamw8bit.cpp) replays the same steps and must give the same codes and
# parameters.
# Run: python3 tests/tools/make_adamw8bit_reference.py tests/fixtures/adamw8bit
import math, os, sys

import torch
from safetensors.torch import save_file


def create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8):  # bitsandbytes/functional.py
    data = []
    non_sign_bits = total_bits - 1
    additional_items = 2 ** (non_sign_bits - max_exponent_bits) - 1
    for i in range(max_exponent_bits):
        fraction_items = int(2 ** (i + non_sign_bits - max_exponent_bits) + 1 if signed
                             else 2 ** (i + non_sign_bits - max_exponent_bits + 1) + 1)
        boundaries = torch.linspace(0.1, 1, fraction_items, dtype=torch.float32)
        means = (boundaries[:-1] + boundaries[1:]) / 2.0
        data += ((10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
        if signed:
            data += (-(10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
    assert additional_items == 0
    data.append(0)
    data.append(1.0)
    data.sort()
    return torch.tensor(data, dtype=torch.float32)


def quantize_blockwise(A, code, blocksize=256):  # backends/default/ops.py
    n = A.numel()
    rem = n % blocksize
    full = n - rem
    A_com = A[:full].reshape(-1, blocksize)
    absmax = A_com.abs().max(dim=-1)[0]
    scaled = torch.clamp(A_com * (1.0 / absmax.clamp(min=1e-38).view(-1, 1)), -1, 1).reshape(-1)
    if rem:
        am = A[full:].abs().max().clamp(min=1e-38)
        absmax = torch.cat([absmax, am.unsqueeze(0)])
        scaled = torch.cat([scaled, torch.clamp(A[full:] / am, -1, 1)])
    bounds = (code[:-1] + code[1:]) / 2
    return torch.bucketize(scaled, bounds, out_int32=True).to(torch.uint8), absmax


def dequantize_blockwise(q, absmax, code, blocksize=256):
    out = code[q.to(torch.int64)]
    blk = torch.arange(q.numel()) // blocksize
    return out * absmax[blk]


def main():
    out = sys.argv[1]
    torch.manual_seed(7)
    n, steps = 5000, 6  # n: a tail block of 136
    lr, b1, b2, eps, wd, scale = 1e-2, 0.9, 0.999, 1e-8, 0.1, 0.75
    m_code, v_code = create_dynamic_map(True), create_dynamic_map(False)
    p = torch.randn(n)
    t = {"map_signed": m_code, "map_unsigned": v_code, "param0": p.clone()}
    qm = torch.zeros(n, dtype=torch.uint8)
    qv = torch.zeros(n, dtype=torch.uint8)
    am = torch.zeros((n + 255) // 256)
    av = torch.zeros((n + 255) // 256)
    for step in range(1, steps + 1):
        g = torch.randn(n) * (0.1 * step)
        t[f"grad{step}"] = g.clone()
        m = dequantize_blockwise(qm, am, m_code)
        v = dequantize_blockwise(qv, av, v_code)
        grad = g * scale  # the gradient as clipping leaves it (bitsandbytes' gnorm_scale)
        # torch.optim.AdamW, single tensor, operation for operation
        p.mul_(1 - lr * wd)
        m.lerp_(grad, 1 - b1)
        v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        bc1, bc2 = 1 - b1 ** step, 1 - b2 ** step
        denom = (v.sqrt() / math.sqrt(bc2)).add_(eps)
        p.addcdiv_(m, denom, value=-(lr / bc1))
        qm, am = quantize_blockwise(m, m_code)
        qv, av = quantize_blockwise(v, v_code)
        t[f"param{step}"], t[f"m_code{step}"], t[f"v_code{step}"] = p.clone(), qm.clone(), qv.clone()
        t[f"m_absmax{step}"], t[f"v_absmax{step}"] = am.clone(), av.clone()
    os.makedirs(out, exist_ok=True)
    save_file({k: v.contiguous() for k, v in t.items()}, os.path.join(out, "reference.safetensors"),
              metadata={"lr": str(lr), "beta1": str(b1), "beta2": str(b2), "eps": str(eps), "weight_decay": str(wd),
                        "grad_scale": str(scale), "steps": str(steps)})
    print("maps:", m_code[:3].tolist(), m_code[-3:].tolist(), v_code[:3].tolist(), v_code[-3:].tolist())


if __name__ == "__main__":
    main()
