"""`optimizer: adamw_torch_8bit` and `adamw_torch_4bit` (HF's names for torchao's AdamW8bit and AdamW4bit) against
torchao computed live on CPU torch: three updates of a tiny Llama whose matrices are of whole blocks or not (torchao
quantises only the former; bitsandbytes' 8-bit rule both) through soltrain.Model.step, next to transformers'
gradients, clip_grad_norm_ and torchao's optimizer (run eagerly: its update as written, not compiled). The 8-bit run
under bitsandbytes' rule (adamw_8bit) differs on the partial-block matrices, so the rule is what the comparison sees;
the 4-bit run differs from the 8-bit one, so its own format is."""
import json
import pathlib

import pytest

from conftest import randomize, rel, torch_updates

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
torchao_optim = pytest.importorskip("torchao.optim")
from safetensors.torch import load_file  # noqa: E402

import soltrain  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
LR, WD, STEPS = 3e-3, 0.01, 3


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """hidden 72: q/k/v/o and the embedding are not whole 256-element blocks (5184, 21600 elements), gate/up/down
    (9216) are."""
    out = tmp_path_factory.mktemp("ao-model")
    cfg = json.loads((ROOT / "tests" / "fixtures" / "models" / "llama-tiny" / "config.json").read_text())
    cfg.update(hidden_size=72, intermediate_size=128, num_attention_heads=4, num_key_value_heads=4, head_dim=18,
               vocab_size=300)
    config = transformers.LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    torch.manual_seed(5)
    model = transformers.LlamaForCausalLM(config)
    randomize(model)
    model.save_pretrained(out)
    return out


def batches(vocab):
    g = torch.Generator().manual_seed(2)
    out = []
    for _ in range(STEPS):
        ids = torch.randint(0, vocab, (2, 24), generator=g)
        targets = torch.roll(ids, -1, 1)
        targets[:, -1] = -100
        out.append((ids, targets))
    return out


def torchao_run(folder, data, monkeypatch, cls="AdamW8bit"):
    monkeypatch.setattr(torch, "compile", lambda fn=None, **kw: fn if fn is not None else (lambda f: f))
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    named = dict(model.named_parameters())
    decay = [p for n, p in named.items() if p.ndim >= 2]  # HF's: no decay for norms and biases
    flat = [p for n, p in named.items() if p.ndim < 2]
    opt = getattr(torchao_optim, cls)([{"params": decay, "weight_decay": WD}, {"params": flat, "weight_decay": 0.0}],
                                  lr=LR, betas=(0.9, 0.999), eps=1e-8)
    torch_updates(model, data, opt.step)
    return {n: p.detach().clone() for n, p in named.items()}


def soltrain_run(folder, data, out, optimizer):
    model = soltrain.Model.from_pretrained(folder, sequence_len=24, rows=2, optimizer=optimizer, learning_rate=LR,
                                           weight_decay=WD, max_grad_norm=1.0)
    for ids, targets in data:
        model.step(ids, targets, lr=LR)
    model.save_pretrained(out)
    return load_file(str(out / "model.safetensors"))


def test_updates_equal_torchao_adamw8bit(llama, tmp_path, monkeypatch):
    data = batches(300)
    start = load_file(str(llama / "model.safetensors"))
    theirs = torchao_run(llama, data, monkeypatch)
    ours = soltrain_run(llama, data, tmp_path / "ao", "adamw_torch_8bit")
    bnb = soltrain_run(llama, data, tmp_path / "bnb", "adamw_8bit")
    partial = 0
    for name, w in theirs.items():
        moved = w - start[name]
        err = rel(ours[name] - start[name], moved)
        assert err <= 2e-3, (name, err)
        n = w.numel()
        if n >= 4096 and n % 256:  # quantised by bitsandbytes' rule, not torchao's
            partial += 1
            assert rel(bnb[name] - start[name], moved) > 5 * max(err, 1e-4), name
    assert partial >= 4


def test_updates_equal_torchao_adamw4bit(llama, tmp_path, monkeypatch):
    """4-bit moments (16-entry maps, blocks of 128, only whole-block tensors): torchao's updates to the rounding of
    a code that lands within fp32 rounding of a bucket edge; far from the 8-bit updates on the quantised matrices."""
    data = batches(300)
    start = load_file(str(llama / "model.safetensors"))
    theirs = torchao_run(llama, data, monkeypatch, "AdamW4bit")
    ours = soltrain_run(llama, data, tmp_path / "ao4", "adamw_torch_4bit")
    eight = soltrain_run(llama, data, tmp_path / "ao8", "adamw_torch_8bit")
    quantised = 0
    for name, w in theirs.items():
        moved = w - start[name]
        err = rel(ours[name] - start[name], moved)
        assert err <= 2e-3, (name, err)
        if w.numel() >= 4096 and w.numel() % 128 == 0:
            quantised += 1
            assert rel(eight[name] - start[name], moved) > 5 * max(err, 1e-4), name
    assert quantised >= 4
