"""Pre-quantised bitsandbytes 4-bit checkpoints (what transformers' save_pretrained writes after load_in_4bit: the
hub's *-bnb-4bit and BNB-NF4 releases), made live here by transformers and bitsandbytes on CPU: `soltrain merge`
writes every 4-bit weight dequantised exactly as bitsandbytes' dequantize_4bit gives it (nested scales or not, NF4
and FP4) and the adapted ones with their delta, as a plain bf16 model; LoRA trains over it; 8-bit is one line."""
import json
import subprocess

import pytest

from conftest import BIN, randomize, reference_batch, rel
from live_refs import random_adapter

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
bnb = pytest.importorskip("bitsandbytes")
from safetensors.torch import load_file, save_file  # noqa: E402


def quantised(tmp_path, quant_type="nf4", nested=True, **bnb_kwargs):
    torch.manual_seed(5)
    config = transformers.LlamaConfig(vocab_size=300, hidden_size=128, intermediate_size=192, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize(model)
    model.to(torch.bfloat16).save_pretrained(tmp_path / "dense")
    q = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "dense", device_map="cpu",
        quantization_config=transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=quant_type,
                                                            bnb_4bit_use_double_quant=nested,
                                                            bnb_4bit_compute_dtype=torch.bfloat16, **bnb_kwargs))
    q.save_pretrained(tmp_path / "q")
    return q


def saved_adapter(model, folder):
    """PEFT LoRA on q_proj and v_proj, its B drawn (not PEFT's zeros), saved to `folder`."""
    return random_adapter(model, folder, targets=["q_proj", "v_proj"], drawn="lora_B", scale=0.05)


@pytest.mark.parametrize("quant_type,nested", [("nf4", True), ("nf4", False), ("fp4", True)])
def test_merge_dequantises_as_bitsandbytes(tmp_path, quant_type, nested):
    q = quantised(tmp_path, quant_type, nested)
    dense = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "dense", dtype=torch.float32)
    pm = saved_adapter(dense, tmp_path / "adapter")
    r = subprocess.run([str(BIN), "merge", "--model", str(tmp_path / "q"), "--adapter", str(tmp_path / "adapter"),
                        "--out", str(tmp_path / "merged")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    merged = load_file(str(tmp_path / "merged" / "model.safetensors"))
    cfg = json.loads((tmp_path / "merged" / "config.json").read_text())
    assert "quantization_config" not in cfg
    assert not any("absmax" in k or "quant_" in k for k in merged)
    lora = {n: p.detach() for n, p in pm.named_parameters() if "lora_" in n}
    checked = 0
    for name, module in q.named_modules():
        if not isinstance(module, bnb.nn.Linear4bit):
            continue
        w = module.weight
        want = bnb.functional.dequantize_4bit(w.data, w.quant_state).float()  # fp32 values, then bf16 as saved
        got = merged[name + ".weight"]
        assert got.dtype == torch.bfloat16 and got.shape == want.shape, name
        if name.endswith(("q_proj", "v_proj")):
            a = lora[f"base_model.model.{name}.lora_A.default.weight"]
            b = lora[f"base_model.model.{name}.lora_B.default.weight"]
            want = want + 2.0 * (b @ a)
            assert rel(got.float(), want) <= 4e-3, name  # (one bf16 rounding of the sum)
        else:
            assert torch.equal(got, want.to(torch.bfloat16)), name  # bit for bit
        checked += 1
    assert checked == 14
    # the merged folder is a plain model transformers loads
    transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)


def test_lora_trains_over_a_4bit_checkpoint(tmp_path):
    quantised(tmp_path)
    ids, targets = reference_batch(300, masked=False)
    save_file({"input_ids": ids.int(), "targets": targets.int()}, str(tmp_path / "batch.safetensors"))
    # the base as stored, dequantised by bitsandbytes into a dense fp32 folder: the same model to within NF4's
    # requantised scales (soltrain keeps a 4-bit base under LoRA in its own NF4, quantising the scales again)
    q = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "q", device_map="cpu")
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "dense", dtype=torch.float32)
    with torch.no_grad():
        for name, module in q.named_modules():
            if isinstance(module, bnb.nn.Linear4bit):
                ref.get_submodule(name).weight.copy_(
                    bnb.functional.dequantize_4bit(module.weight.data, module.weight.quant_state).float())
    ref.save_pretrained(tmp_path / "deq")
    pm = saved_adapter(ref, tmp_path / "adapter")
    outs = {}
    for model in ["q", "deq"]:
        r = subprocess.run([str(BIN), "dump", "--model", str(tmp_path / model), "--adapter", str(tmp_path / "adapter"),
                            "--batch", str(tmp_path / "batch.safetensors"), "--out",
                            str(tmp_path / f"{model}.safetensors")], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        outs[model] = load_file(str(tmp_path / f"{model}.safetensors"))
    out = pm(input_ids=ids).logits.detach()
    assert rel(outs["deq"]["logits"].reshape(out.shape), out) <= 1e-5
    assert rel(outs["q"]["logits"].reshape(out.shape), out) <= 2e-2  # (NF4 of the re-quantised scales, bf16)
    assert rel(outs["q"]["grad.base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"],
               outs["deq"]["grad.base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]) <= 5e-2


def test_an_8bit_checkpoint_is_one_line(tmp_path):
    quantised(tmp_path)
    cfg = json.loads((tmp_path / "q" / "config.json").read_text())
    cfg["quantization_config"].update(load_in_8bit=True, load_in_4bit=False)
    (tmp_path / "q" / "config.json").write_text(json.dumps(cfg))
    ids, targets = reference_batch(300, masked=False)
    save_file({"input_ids": ids.int(), "targets": targets.int()}, str(tmp_path / "batch.safetensors"))
    r = subprocess.run([str(BIN), "dump", "--model", str(tmp_path / "q"), "--batch", str(tmp_path / "batch.safetensors"),
                        "--out", str(tmp_path / "o.safetensors")], capture_output=True, text=True)
    assert r.returncode == 2 and "pre-quantised 8-bit bitsandbytes checkpoint" in r.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "o.safetensors").exists()
