"""The LLM.int8 base (`load_in_8bit: true`, `--qlora int8`) against bitsandbytes itself, live on CPU: the codes
and row scales soltrain stores equal bitsandbytes' int8_vectorwise_quant (what Int8Params runs on a weight), and
LoRA over the int8 base gives the logits, loss and adapter gradients of PEFT over the weights bitsandbytes
dequantises (int8_vectorwise_dequant), every projection of the decoder quantised and the embedding and LM head
kept, as transformers' load_in_8bit does; the adapter's target_modules as PEFT writes them for a small model
(full module paths). (bitsandbytes' matmul also rounds the activations to int8; soltrain's
GEMMs read the dequantised weight, so the reference is PEFT over those weights.)"""
import json
import subprocess

import pytest

from conftest import BIN, reference_batch, rel
from live_refs import check_lora_dump, random_adapter, replace_projections, tiny_qwen3

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
import bitsandbytes.functional as bnb_f  # noqa: E402  (scripts/test.sh installs it: a reference, never skipped)
from safetensors.torch import load_file, save_file  # noqa: E402


def bnb_int8(w):
    """bitsandbytes' Int8Params quantisation of a weight in its dtype (no outlier threshold): codes, SCB."""
    codes, scb, _ = bnb_f.int8_vectorwise_quant(w.clone())
    return codes, scb


def test_codes_and_scales_equal_bitsandbytes(tmp_path):
    torch.manual_seed(5)
    mats = {"w.a": torch.randn(64, 96) * 0.05, "w.b": torch.randn(33, 40) * 3.0, "w.c": torch.randn(128, 8)}
    mats["w.b"][7] = 0.25 * torch.arange(40) - 5.0  # a row of exact binary fractions: ties after scaling
    mats = {n: m.to(torch.bfloat16) for n, m in mats.items()}  # the checkpoint's dtype, as load_in_8bit reads it
    save_file(mats, str(tmp_path / "in.safetensors"))
    subprocess.run([str(BIN), "quantize", "--format", "int8", "--in", str(tmp_path / "in.safetensors"), "--out",
                    str(tmp_path / "out.safetensors")], check=True, capture_output=True)
    ours = load_file(str(tmp_path / "out.safetensors"))
    for name, w in mats.items():
        codes, scb = bnb_int8(w)
        assert torch.equal(ours[name].view(torch.int8), codes), name
        assert torch.equal(ours[name + ".SCB"], scb), name
        assert (codes.abs().amax(dim=1) == 127).all(), name  # every row reaches its absmax


def test_lora_over_int8_matches_peft_on_the_dequantised_base(tmp_path):
    model = tiny_qwen3(tmp_path / "model")
    replace_projections(model, lambda w: bnb_f.int8_vectorwise_dequant(*bnb_int8(w)))
    pm = random_adapter(model, tmp_path / "adapter")
    # (PEFT writes all-linear on a two-layer model as full module paths, not names: soltrain reads those too)
    saved_targets = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["target_modules"]
    assert len(saved_targets) == 14 and all(t.startswith("model.layers.") for t in saved_targets)
    ids, targets = reference_batch(300, masked=False)
    logits = check_lora_dump(tmp_path, pm, ids, targets, ["--model", str(tmp_path / "model"), "--adapter",
                                                          str(tmp_path / "adapter"), "--qlora", "int8"])
    # the int8 base is not the bf16 one: the same adapter over the unquantised weights gives other logits
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "model", dtype=torch.float32,
                                                              attn_implementation="eager")
    plain = peft.PeftModel.from_pretrained(plain, tmp_path / "adapter")
    assert rel(plain(input_ids=ids).logits.detach(), logits.detach()) > 1e-4
