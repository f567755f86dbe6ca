"""References computed in the test run by the peers themselves, on CPU torch: transformers' logits, loss and
every gradient of random tiny Qwen3 / Llama / Qwen2 models (soltrain dump), PEFT adapters both ways
(tests/tools/check_peft.py: random ranks, alphas, rsLoRA, targets; gradients, PEFT loading our adapter files,
merges). Tolerances are the committed fixtures' (tests/test_reference_model.cpp: logits 1e-5, loss 1e-6,
gradients 1e-4)."""
import subprocess
import sys

import pytest

from conftest import BIN, ROOT

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402  (transformers brings safetensors)

COMMON = dict(vocab_size=300, max_position_embeddings=128, rms_norm_eps=1e-6, attn_implementation="eager")


def tiny(kind):
    if kind == "qwen3":
        return transformers.Qwen3Config(hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                        tie_word_embeddings=True, rope_theta=1e6, **COMMON)
    if kind == "llama":
        return transformers.LlamaConfig(hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False,
                                        rope_theta=1e4, **COMMON)
    return transformers.Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=1, tie_word_embeddings=False, rope_theta=1e4, **COMMON)


def rel(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("kind", ["qwen3", "llama", "qwen2"])
def test_logits_loss_and_gradients_match_transformers(kind, tmp_path):
    torch.manual_seed({"qwen3": 1, "llama": 2, "qwen2": 3}[kind])
    model = transformers.AutoModelForCausalLM.from_config(tiny(kind), dtype=torch.float32)
    with torch.no_grad():  # fresh random weights everywhere (norms and biases too), not the init's ones and zeros
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * (0.5 if p.ndim == 1 else 0.08) + (1.0 if p.ndim == 1 else 0.0))
    model.save_pretrained(tmp_path / "model")
    ids = torch.randint(0, 300, (2, 24))
    targets = torch.roll(ids, -1, 1)
    targets[:, -1] = -100
    targets[1, :4] = -100
    save_file({"input_ids": ids.int(), "targets": targets.int()}, str(tmp_path / "batch.safetensors"))
    subprocess.run([str(BIN), "dump", "--model", str(tmp_path / "model"), "--batch", str(tmp_path / "batch.safetensors"),
                    "--out", str(tmp_path / "ours.safetensors")], check=True, capture_output=True)
    ours = load_file(str(tmp_path / "ours.safetensors"))

    model.train(False)
    logits = model(input_ids=ids).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
    loss.backward()
    assert rel(ours["logits"].reshape(logits.shape), logits.detach()) <= 1e-5
    assert abs(float(ours["loss"].flatten()[0]) - loss.item()) / loss.item() <= 1e-6
    checked = 0
    for name, p in model.named_parameters():
        key = "grad." + name
        if key not in ours:  # a tied head's weight is the embedding's, one gradient
            assert name == "lm_head.weight" and kind == "qwen3", name
            continue
        assert rel(ours[key], p.grad) <= 1e-4, name
        checked += 1
    assert checked == len([n for n in ours if n.startswith("grad.")]) >= 20


def test_peft_adapters_both_ways():
    pytest.importorskip("peft")
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "tools" / "check_peft.py"), str(BIN), "--cases", "6",
                        "--seed", "7"], capture_output=True, text=True)
    assert r.returncode == 0 and "6 cases, 0 failures" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]

