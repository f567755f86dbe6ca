# Qwen3 model shapes used by the benchmarks (vocab 151936, head_dim 128, tied embeddings as on the hub),
# and the PaLM-convention model FLOPs per token that PERFORMANCE.md counts.
SHAPES = {
    "0.6B": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8),
    "1.7B": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8),
    "4B": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
               num_key_value_heads=8),
    "8B": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
               num_key_value_heads=8, tie_word_embeddings=False),
}
# Qwen3-30B-A3B (Mixture-of-Experts: 128 experts of width 768, 8 per token) and the same with 12 of its 48 layers
# (what a 64 GiB disk there holds twice over: the generated model is saved before both engines load it).
_A3B = dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_experts=128,
            num_experts_per_tok=8, norm_topk_prob=True, num_attention_heads=32, num_key_value_heads=4,
            tie_word_embeddings=False)
SHAPES["30B-A3B"] = dict(_A3B, num_hidden_layers=48)
SHAPES["30B-A3B-L12"] = dict(_A3B, num_hidden_layers=12)
VOCAB, HEAD_DIM = 151936, 128


def config(name):
    from transformers import Qwen3Config, Qwen3MoeConfig
    kw = dict(vocab_size=VOCAB, head_dim=HEAD_DIM, max_position_embeddings=40960, rope_theta=1e6,
              tie_word_embeddings=True, rms_norm_eps=1e-6)
    kw.update(SHAPES[name])
    return Qwen3MoeConfig(**kw) if "num_experts" in kw else Qwen3Config(**kw)


def matmul_params(name):
    """N: parameters in matmuls (all linear layers + the LM head; not the embedding lookup); MoE: those a token uses."""
    s = dict(SHAPES[name])
    D, F, L, H, K = (s["hidden_size"], s["intermediate_size"], s["num_hidden_layers"], s["num_attention_heads"],
                     s["num_key_value_heads"])
    per_layer = D * H * HEAD_DIM + 2 * D * K * HEAD_DIM + H * HEAD_DIM * D + 3 * D * F
    if "num_experts" in s:  # the active ones: a token's k experts and the router
        per_layer += 3 * D * s["moe_intermediate_size"] * s["num_experts_per_tok"] - 3 * D * F + D * s["num_experts"]
    return L * per_layer + VOCAB * D


def flops_per_token(name, seq, lora=False):
    """Full fine-tuning 6N + 12·L·H·hd·T; LoRA 4N + 12·L·H·hd·T (PERFORMANCE.md)."""
    s = SHAPES[name]
    attn = 12 * s["num_hidden_layers"] * s["num_attention_heads"] * HEAD_DIM * seq
    return (4 if lora else 6) * matmul_params(name) + attn
