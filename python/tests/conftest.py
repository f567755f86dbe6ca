"""Fixtures for the Python API's tests: the demo's model and data (soltrain demo-setup, from the build tree's
binary), made once per session, and a private dataset cache."""
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("SOLTRAIN_BIN", ROOT / "build" / "soltrain"))


@pytest.fixture(scope="session")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo-data")
    subprocess.run([str(BIN), "demo-setup", "--out", str(out)], check=True, capture_output=True)
    return out


@pytest.fixture(autouse=True)
def dataset_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SOLTRAIN_CACHE", str(tmp_path / "cache"))


def read_jsonl(path):
    import json

    return [json.loads(line) for line in pathlib.Path(path).read_text().splitlines() if line.strip()]


# Live references (test_live_references.py, test_moe.py): a transformers model with fresh random weights, a
# batch, and `soltrain dump`'s logits, loss and gradients for it.
def rel(a, b):
    """Relative L2 error of a against b (torch tensors)."""
    a, b = a.double().flatten(), b.double().flatten()
    return float((a - b).norm() / b.norm())


def randomize(model):
    """Every weight drawn fresh (norms near 1, biases and matrices small), not the init's ones and zeros."""
    import torch

    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * (0.5 if p.ndim == 1 else 0.08) + (1.0 if p.ndim == 1 else 0.0))


def reference_batch(vocab, masked=True):
    """2 x 24 random ids and their next-token targets (-100 at each row's end; some leading ones masked)."""
    import torch

    ids = torch.randint(0, vocab, (2, 24))
    targets = torch.roll(ids, -1, 1)
    targets[:, -1] = -100
    if masked:
        targets[1, :4] = -100
    return ids, targets


def dump(tmp_path, ids, targets, model="model", adapter=None):
    """`soltrain dump` of tmp_path/model (with a PEFT adapter folder) on this batch: its tensors by name."""
    from safetensors.torch import load_file, save_file

    save_file({"input_ids": ids.int(), "targets": targets.int()}, str(tmp_path / "batch.safetensors"))
    args = [str(BIN), "dump", "--model", str(tmp_path / model), "--batch", str(tmp_path / "batch.safetensors"),
            "--out", str(tmp_path / "ours.safetensors")]
    subprocess.run(args + (["--adapter", str(adapter)] if adapter else []), check=True, capture_output=True)
    return load_file(str(tmp_path / "ours.safetensors"))
