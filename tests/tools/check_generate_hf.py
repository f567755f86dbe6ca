# Greedy generation of `soltrain generate` against transformers' generate(do_sample=False) on a randomly
# initialised Qwen3 model (fp32 weights) with the demo's byte-level tokenizer. On CPU the token ids must be
# identical; on CUDA (bf16) a near-tie may flip a token and the runs diverge, so the common prefix is reported
# and the check fails only when it is short on average.
# Run on the GPU machine: python3 tests/tools/check_generate_hf.py build/soltrain [--device cuda]
# (needs torch, transformers, tokenizers)
import argparse, json, os, shutil, subprocess, sys, tempfile

import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, Qwen3Config

PROMPTS = ["hello world", "The quick brown fox", "reverse: abcdef", "1 2 3 4 5 6 7"]
EOS = 258  # <|im_end|> of the demo tokenizer


def make_model(soltrain, out):
    subprocess.run([soltrain, "demo-setup", "--out", os.path.join(out, "demo"), "--train", "1", "--validation", "1"],
                   check=True, stdout=subprocess.DEVNULL)
    cfg = Qwen3Config(vocab_size=320, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=2, head_dim=64, max_position_embeddings=1024,
                      tie_word_embeddings=False, eos_token_id=EOS, bos_token_id=None)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():  # larger than the default init, so logits are peaked and greedy has few near-ties
        for n, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in n else 0.08 * torch.randn_like(p))
    path = os.path.join(out, "model")
    model.save_pretrained(path, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(out, "demo", "model", f), path)
    return model, path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("soltrain")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--max-new-tokens", type=int, default=48)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model, path = make_model(a.soltrain, tmp)
        tok = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
        if a.device == "cuda":
            model = model.to("cuda", torch.bfloat16)
        fails, prefixes = 0, []
        for text in PROMPTS:
            ids = tok.encode(text, add_special_tokens=False).ids
            with torch.no_grad():
                out = model.generate(torch.tensor([ids], device=model.device), do_sample=False,
                                     max_new_tokens=a.max_new_tokens, eos_token_id=EOS, pad_token_id=EOS)
            want = out[0, len(ids):].tolist()
            r = subprocess.run([a.soltrain, "generate", "--model", path, "--prompt", text, "--max-new-tokens",
                                str(a.max_new_tokens), "--device", a.device, "--print-ids"],
                               check=True, capture_output=True, text=True)
            got = [int(x) for x in r.stdout.split()]
            n = 0
            while n < min(len(got), len(want)) and got[n] == want[n]:
                n += 1
            prefixes.append(n / max(len(want), 1))
            same = got == want
            fails += not same
            print(f"{'OK  ' if same else 'DIFF'} {text!r}: {n}/{len(want)} tokens agree"
                  + ("" if same else f"\n  soltrain {got}\n  hf       {want}"))
        if a.device == "cpu":
            ok = fails == 0
        else:
            ok = sum(prefixes) / len(prefixes) >= 0.5
        print(("PASS" if ok else "FAIL") + f": {len(PROMPTS) - fails}/{len(PROMPTS)} identical on {a.device}")
        sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
