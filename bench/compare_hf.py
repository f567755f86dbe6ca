# Correctness at scale: `soltrain dump --device cuda` (bf16 compute, fp32 masters) against transformers on
# a random-init Qwen3-shaped model (8 layers, hidden 1024, GQA 16:8, head_dim 128, vocab 151936, untied).
# The truth is transformers in fp32 (TF32 off); transformers in bf16 shows the error bf16 itself costs,
# so ours should land near it. Prints relative errors ‖x − ref‖ / ‖ref‖.
#   python3 bench/compare_hf.py --soltrain build/soltrain
import argparse, os, subprocess, tempfile

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, Qwen3Config


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def run_hf(model, ids, tgt):
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids).logits
    loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tgt.reshape(-1),
                                             ignore_index=-100)
    loss.backward()
    grads = {n: p.grad.detach().float() for n, p in model.named_parameters()}
    return logits.detach().float(), loss.detach().float(), grads


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--soltrain", default="build/soltrain")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=512)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cfg = Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=8,
                      num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False,
                      rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=4096)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="sdpa")
    ids = torch.randint(0, cfg.vocab_size, (a.batch, a.seq), device="cuda")
    tgt = torch.roll(ids, -1, 1); tgt[:, -1] = -100; tgt[0, :a.seq // 4] = -100
    work = tempfile.mkdtemp()
    model.save_pretrained(os.path.join(work, "model"))
    save_file({"input_ids": ids.int().cpu().contiguous(), "targets": tgt.int().cpu().contiguous()},
              os.path.join(work, "batch.safetensors"))
    ref_logits, ref_loss, ref_grads = run_hf(model, ids, tgt)
    bf_logits, bf_loss, bf_grads = run_hf(model.to(torch.bfloat16), ids, tgt)
    del model
    torch.cuda.empty_cache()
    out = subprocess.run([a.soltrain, "dump", "--model", os.path.join(work, "model"), "--batch",
                          os.path.join(work, "batch.safetensors"), "--out", os.path.join(work, "ours.safetensors"),
                          "--device", "cuda"], capture_output=True, text=True)
    print(out.stdout.strip(), out.stderr.strip())
    ours = load_file(os.path.join(work, "ours.safetensors"))
    g_ours = sorted((rel(ours["grad." + n].cuda(), g), n) for n, g in ref_grads.items())
    g_bf = sorted((rel(bf_grads[n], g), n) for n, g in ref_grads.items())
    med = lambda v: v[len(v) // 2][0]
    print("| vs transformers fp32 | soltrain cuda (bf16) | transformers bf16 |")
    print("|---|---|---|")
    print(f"| logits | {rel(ours['logits'].cuda(), ref_logits):.2e} | {rel(bf_logits, ref_logits):.2e} |")
    print(f"| loss ({float(ref_loss):.5f}) | {abs(float(ours['loss']) - float(ref_loss)) / float(ref_loss):.2e} | "
          f"{abs(float(bf_loss) - float(ref_loss)) / float(ref_loss):.2e} |")
    print(f"| gradients, median over tensors | {med(g_ours):.2e} | {med(g_bf):.2e} |")
    print(f"| gradients, worst tensor | {g_ours[-1][0]:.2e} ({g_ours[-1][1]}) | {g_bf[-1][0]:.2e} ({g_bf[-1][1]}) |")


if __name__ == "__main__":
    main()
