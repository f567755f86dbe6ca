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

from conftest import BIN, randomize, reference_batch, rel
from live_refs import check_lora_dump

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
    torch.manual_seed(9)
    config = transformers.Qwen3Config(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                      max_position_embeddings=128, tie_word_embeddings=False,
                                      attn_implementation="eager")
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize(model)
    model.to(torch.bfloat16).save_pretrained(tmp_path / "model")  # bf16, as the base would come
    # read back in fp32 (not .float() in place: the cast rounded RoPE's inv_freq buffer to bf16 too)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "model", dtype=torch.float32,
                                                              attn_implementation="eager")
    quantised = 0
    with torch.no_grad():
        for name, m in model.named_modules():
            if isinstance(m, torch.nn.Linear) and name != "lm_head":
                codes, scb = bnb_int8(m.weight.to(torch.bfloat16))
                m.weight.copy_(bnb_f.int8_vectorwise_dequant(codes, scb))
                quantised += 1
    assert quantised == 2 * 7
    pm = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn_like(p) * 0.1)
    pm.save_pretrained(tmp_path / "adapter")
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
