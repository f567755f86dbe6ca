# Builds extra reference fixtures with Hugging Face transformers (fp32, CPU math) for configurations the
# shared fixtures do not cover: Qwen2 q/k/v biases with MQA, Llama with llama3 RoPE scaling, biases
# everywhere and head_dim != hidden/heads, Qwen3 with linear RoPE scaling. Some configs are rewritten to the
# transformers-4 keys (rope_theta / rope_scaling) that real hub checkpoints use.
# Layout per fixture: the same as ../shared/fixtures/models/<name> (config.json, model.safetensors,
# batch.safetensors, expected.safetensors, train.json, expected_train.safetensors).
# Run: python3 tests/tools/make_references.py OUT_DIR   (needs torch, transformers, safetensors)
import json, os, sys, torch
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen2Config, LlamaConfig
from safetensors.torch import save_file

HP = dict(steps=5, lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, max_grad_norm=1.0,
          decay="2-D parameters (matrices and embeddings) only; norms and biases get no weight decay")


def randomize(model):
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n: p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif n.endswith("bias"): p.copy_(0.1 * torch.randn_like(p))
            else: p.copy_(0.08 * torch.randn_like(p))


def ce(model, ids, tgt):
    V = model.config.vocab_size
    logits = model(input_ids=ids).logits
    return logits, torch.nn.functional.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1), ignore_index=-100)


def make(outdir, cfg, B, T, seed, legacy_rope):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    randomize(model)
    os.makedirs(outdir, exist_ok=True)
    model.save_pretrained(outdir, safe_serialization=True)
    V = cfg.vocab_size
    ids = torch.randint(0, V, (B, T), dtype=torch.int64)
    tgt = torch.roll(ids, -1, dims=1).clone()
    tgt[:, -1] = -100
    tgt[0, :7] = -100
    tgt[B - 1, 11:15] = -100
    model.eval()
    logits, loss = ce(model, ids, tgt)
    loss.backward()
    exp = {"logits": logits.detach().contiguous(), "loss": loss.detach().reshape(1)}
    for n, p in model.named_parameters():
        if p.grad is not None: exp["grad." + n] = p.grad.detach().contiguous()
    save_file({"input_ids": ids.to(torch.int32).contiguous(), "targets": tgt.to(torch.int32).contiguous()},
              os.path.join(outdir, "batch.safetensors"))
    save_file(exp, os.path.join(outdir, "expected.safetensors"))

    # five AdamW steps, as torch does them
    model.zero_grad(); model.train()
    named = list(model.named_parameters())
    groups = [{"params": [p for n, p in named if p.dim() >= 2], "weight_decay": HP["weight_decay"]},
              {"params": [p for n, p in named if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=HP["lr"], betas=(HP["beta1"], HP["beta2"]), eps=HP["eps"], foreach=False)
    losses, norms = [], []
    for _ in range(HP["steps"]):
        opt.zero_grad(); _, l = ce(model, ids, tgt); l.backward(); losses.append(l.item())
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), HP["max_grad_norm"])))
        opt.step()
    with torch.no_grad(): losses.append(ce(model, ids, tgt)[1].item())
    out = {"losses": torch.tensor(losses), "grad_norm": torch.tensor(norms)}
    for n, p in named: out["final." + n] = p.detach().contiguous()
    save_file(out, os.path.join(outdir, "expected_train.safetensors"))
    json.dump(HP, open(os.path.join(outdir, "train.json"), "w"), indent=2)

    if legacy_rope:  # rewrite to the transformers-4 keys that hub checkpoints carry
        path = os.path.join(outdir, "config.json")
        c = json.load(open(path))
        rp = c.pop("rope_parameters")
        c["rope_theta"] = rp.pop("rope_theta")
        if rp.get("rope_type", "default") != "default":
            c["rope_scaling"] = rp
        json.dump(c, open(path, "w"), indent=2)
    print(outdir, "loss", float(loss), "losses", [round(x, 5) for x in losses])


common = dict(vocab_size=320, max_position_embeddings=256, rms_norm_eps=1e-6, attn_implementation="eager")
root = sys.argv[1]
make(f"{root}/qwen2-tiny-mqa-bias",
     Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=1, tie_word_embeddings=False,
                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **common),
     B=2, T=32, seed=2, legacy_rope=True)
make(f"{root}/llama3-tiny-scaled",
     LlamaConfig(hidden_size=96, intermediate_size=200, num_hidden_layers=3, num_attention_heads=6,
                 num_key_value_heads=2, head_dim=24, attention_bias=True, mlp_bias=True, tie_word_embeddings=True,
                 rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 16}, **common),
     B=3, T=40, seed=3, legacy_rope=True)
make(f"{root}/qwen3-tiny-linear",
     Qwen3Config(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, attention_bias=True, tie_word_embeddings=False,
                 rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}, **common),
     B=2, T=40, seed=4, legacy_rope=False)

# the rewritten configs must still mean the same model to transformers
from safetensors.torch import load_file
for name in ("qwen2-tiny-mqa-bias", "llama3-tiny-scaled", "qwen3-tiny-linear"):
    d = f"{root}/{name}"
    m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    b, e = load_file(f"{d}/batch.safetensors"), load_file(f"{d}/expected.safetensors")
    with torch.no_grad():
        got = m(input_ids=b["input_ids"].long()).logits
    err = float((got - e["logits"]).norm() / e["logits"].norm())
    print(name, "reload rel err", err)
    assert err < 1e-6, name
