"""The NVFP4 base (Surogate's `qlora_fp4: true`, `--qlora nvfp4`, and ModelOpt NVFP4 checkpoints read as stored)
against torchao's NVFP4Tensor, live on the CPU: the codes, block scales and tensor scale soltrain stores equal
NVFP4Tensor.to_nvfp4's (with its per-tensor scale, unswizzled: the layout ModelOpt exports), and LoRA over the NVFP4
base gives the logits, loss and adapter gradients of PEFT over the weights torchao dequantises, whether soltrain
quantised the base itself or read a ModelOpt checkpoint torchao's codes were written into."""
import json
import subprocess
import warnings

import pytest

from conftest import BIN, reference_batch, rel
from live_refs import check_lora_dump, random_adapter, replace_projections, tiny_qwen3

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
import torchao  # noqa: E402,F401  (scripts/test.sh installs 0.17, Axolotl's pin: a reference, never skipped)
from safetensors.torch import load_file, save_file  # noqa: E402

warnings.filterwarnings("ignore")


def torchao_nvfp4(w):
    from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale

    t = NVFP4Tensor.to_nvfp4(w.contiguous(), per_tensor_scale=per_tensor_amax_to_scale(torch.max(torch.abs(w))),
                             is_swizzled_scales=False, use_triton_kernel=False)
    return t


def nvfp4_values(w):
    """torchao's codes and scales decoded as the format defines them, in fp32: code · (tensor scale · block scale)
    (NVFP4Tensor.dequantize would round that product to the bf16 of its source first, as ModelOpt's readers do not)."""
    from torchao.prototype.mx_formats.kernels import f4_unpacked_to_f32, unpack_uint4

    t = torchao_nvfp4(w)
    codes = f4_unpacked_to_f32(unpack_uint4(t.qdata.view(torch.uint8).contiguous()))
    scale = t.per_tensor_scale.float() * t.scale.float()
    return (codes.view(w.shape[0], -1, 16) * scale.unsqueeze(-1)).reshape(w.shape)


def test_codes_and_scales_equal_torchao(tmp_path):
    torch.manual_seed(7)
    mats = {"w.a": torch.randn(64, 96) * 0.05, "w.b": torch.randn(32, 48) * 3.0, "w.c": torch.randn(16, 256)}
    mats["w.b"][3] = 0.25 * torch.arange(48) - 6.0  # exact binary fractions: ties after scaling
    mats = {n: m.to(torch.bfloat16) for n, m in mats.items()}
    save_file(mats, str(tmp_path / "in.safetensors"))
    subprocess.run([str(BIN), "quantize", "--format", "nvfp4", "--in", str(tmp_path / "in.safetensors"), "--out",
                    str(tmp_path / "out.safetensors")], check=True, capture_output=True)
    ours = load_file(str(tmp_path / "out.safetensors"))
    for name, w in mats.items():
        t = torchao_nvfp4(w)
        assert torch.equal(ours[name], t.qdata.view(torch.uint8)), name
        assert torch.equal(ours[name + "_scale"].view(torch.uint8), t.scale.view(torch.uint8)), name
        assert torch.equal(ours[name + "_scale_2"].reshape(()), t.per_tensor_scale.reshape(())), name


def write_modelopt(tmp_path):
    """tmp_path/model as ModelOpt exports NVFP4 (torchao's codes and scales under ModelOpt's names) in tmp_path/mo."""
    src = tmp_path / "model"
    dst = tmp_path / "mo"
    dst.mkdir()
    sd = load_file(str(src / "model.safetensors"))
    out = {}
    for k, w in sd.items():
        if k.endswith("_proj.weight"):
            t = torchao_nvfp4(w)
            base = k[: -len(".weight")]
            out[k] = t.qdata.view(torch.uint8).contiguous()
            out[base + ".weight_scale"] = t.scale.contiguous()
            out[base + ".weight_scale_2"] = t.per_tensor_scale.reshape(()).float()
            out[base + ".input_scale"] = torch.tensor(1.0)
        else:
            out[k] = w
    save_file(out, str(dst / "model.safetensors"))
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                                  "ignore": ["lm_head"]}
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("source", ["quantised-on-load", "modelopt-checkpoint"])
def test_lora_over_nvfp4_matches_peft_on_torchaos_dequantised_base(tmp_path, source):
    model = tiny_qwen3(tmp_path / "model")
    replace_projections(model, nvfp4_values)
    pm = random_adapter(model, tmp_path / "adapter")
    ids, targets = reference_batch(300, masked=False)
    base = ["--model", str(tmp_path / "model"), "--qlora", "nvfp4"] if source == "quantised-on-load" else \
        ["--model", str(write_modelopt(tmp_path))]
    logits = check_lora_dump(tmp_path, pm, ids, targets, [*base, "--adapter", str(tmp_path / "adapter")])
    # the NVFP4 base is not the bf16 one: the same adapter over the unquantised weights gives other logits
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "model", dtype=torch.float32,
                                                              attn_implementation="eager")
    plain = peft.PeftModel.from_pretrained(plain, tmp_path / "adapter")
    assert rel(plain(input_ids=ids).logits.detach(), logits.detach()) > 1e-3


def test_a_modelopt_checkpoint_fine_tunes_in_full_from_its_dequantised_weights(tmp_path):
    model = tiny_qwen3(tmp_path / "model")
    mo = write_modelopt(tmp_path)
    replace_projections(model, nvfp4_values)
    ids, targets = reference_batch(300)
    save_file({"input_ids": ids.int(), "targets": targets.int()}, str(tmp_path / "batch.safetensors"))
    subprocess.run([str(BIN), "dump", "--model", str(mo), "--batch", str(tmp_path / "batch.safetensors"), "--out",
                    str(tmp_path / "ours.safetensors")], check=True, capture_output=True)
    ours = load_file(str(tmp_path / "ours.safetensors"))
    model.train(False)
    logits = model(input_ids=ids).logits
    assert rel(ours["logits"].reshape(logits.shape), logits.detach()) <= 1e-5
