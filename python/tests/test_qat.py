"""Quantisation-aware training (Axolotl's `qat:` block, model/qat.h) against torchao 0.17, the version Axolotl pins,
live on the CPU: logits, loss and every gradient of a model whose projections and LM head are fake-quantised.

int4 weights with int8 activations run through torchao's own QAT modules, built as Axolotl's _make_qat_config builds
them. torchao's MXFP4 / NVFP4 QAT linears need a GPU for their forward GEMM, so those two are checked against a module
doing what torchao's autograd functions do (_MXQuantizedForwardFakeQuantizedBackward, _NVFP4...): its operands
quantised and dequantised by torchao's own MXTensor.to_mx / NVFP4Tensor.to_nvfp4, a plain matmul, and the gradients
multiplied by the dequantised operands."""
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import torchao  # noqa: E402,F401  (scripts/test.sh installs 0.17, Axolotl's pin: a reference, never skipped)

from live_refs import check_full_gradients, dump, randomize, reference_batch, rel  # noqa: E402

warnings.filterwarnings("ignore")


def tiny_llama(path, seed, tie):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                   max_position_embeddings=128, tie_word_embeddings=tie, attn_implementation="eager")
    model = transformers.LlamaForCausalLM(cfg).to(torch.float32)
    randomize(model)
    model.save_pretrained(path)
    return model


def prepare_int4(model, group, activations):
    """Axolotl's prepare_model_for_qat for weight_dtype int4 (utils/quantization.py _make_qat_config)."""
    from torchao.quantization import quantize_
    from torchao.quantization.qat import QATConfig
    from torchao.quantization.qat.fake_quantize_config import Int4WeightFakeQuantizeConfig, IntxFakeQuantizeConfig

    act = IntxFakeQuantizeConfig(dtype=torch.int8, granularity="per_token", is_symmetric=False) if activations else None
    kwargs = {"group_size": group}
    if activations:
        kwargs["activation_dtype"] = torch.bfloat16
    quantize_(model, QATConfig(weight_config=Int4WeightFakeQuantizeConfig(**kwargs), activation_config=act))


class _Fp4Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, fake):
        shape = x.shape
        xq, wq = fake(x.reshape(-1, shape[-1])), fake(w)
        ctx.save_for_backward(xq, wq)
        ctx.shape = shape
        return (xq @ wq.t()).reshape(*shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, g):
        xq, wq = ctx.saved_tensors
        g2 = g.reshape(-1, g.shape[-1])
        return (g2 @ wq).reshape(ctx.shape), g2.t() @ xq, None


def mx_fake(t):
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import MXTensor

    return MXTensor.to_mx(t.contiguous(), elem_dtype=torch.float4_e2m1fn_x2, block_size=32,
                          scaling_mode=ScaleCalculationMode.RCEIL).dequantize(t.dtype)


def nv_fake(t):
    from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale

    scale = per_tensor_amax_to_scale(torch.max(torch.abs(t)))
    return NVFP4Tensor.to_nvfp4(t.contiguous(), per_tensor_scale=scale, is_swizzled_scales=False,
                                use_triton_kernel=False).dequantize(t.dtype)


def prepare_fp4(model, fake):
    for module in list(model.modules()):
        if isinstance(module, torch.nn.Linear):
            module.forward = (lambda m: lambda x: _Fp4Linear.apply(x, m.weight, fake))(module)


def reference(model, ids, targets):
    model.train(False)
    logits = model(input_ids=ids).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
    loss.backward()
    return logits, loss, {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("scheme", ["int4:int8:32", "int4:int8:64", "mxfp4:mxfp4", "nvfp4:nvfp4"])
def test_fake_quantised_logits_loss_and_gradients_match_torchao(scheme, tmp_path):
    seed = {"int4:int8:32": 11, "int4:int8:64": 12, "mxfp4:mxfp4": 13, "nvfp4:nvfp4": 14}[scheme]
    model = tiny_llama(tmp_path / "model", seed, tie=scheme == "int4:int8:32")
    ids, targets = reference_batch(320)
    plain = dump(tmp_path, ids, targets)
    ours = dump(tmp_path, ids, targets, extra=["--qat", scheme])
    weight, act = scheme.split(":")[:2]
    if weight == "int4":
        prepare_int4(model, int(scheme.split(":")[2]), act == "int8")
    else:
        prepare_fp4(model, mx_fake if weight == "mxfp4" else nv_fake)
    logits, loss, grads = reference(model, ids, targets)
    # the fake quantisation changes the result (the check below is not of the plain model)
    assert rel(plain["logits"].reshape(logits.shape), logits.detach()) > 1e-3
    assert rel(ours["logits"].reshape(logits.shape), logits.detach()) <= 1e-5
    assert abs(float(ours["loss"].flatten()[0]) - loss.item()) / loss.item() <= 1e-6
    check_full_gradients(ours, grads, tol=1e-4)


def train(demo, tmp_path, name, extra=""):
    import subprocess

    from live_refs import BIN

    out = tmp_path / name
    cfg = tmp_path / f"{name}.yml"
    cfg.write_text(f"""base_model: {demo / 'model'}
datasets:
  - path: {demo / 'train.jsonl'}
    type: chat_template
output_dir: {out}
sequence_len: 256
micro_batch_size: 4
max_steps: 4
learning_rate: 1e-2
logging_steps: 1
device: cpu
{extra}""")
    return out, subprocess.run([str(BIN), "train", str(cfg)], capture_output=True, text=True)


def test_an_axolotl_qat_run_trains_fake_quantised_after_n_steps_and_saves_the_plain_model(demo, tmp_path):
    from conftest import read_jsonl

    plain, r = train(demo, tmp_path, "plain")
    assert r.returncode == 0, r.stderr
    qat, r = train(demo, tmp_path, "qat", "qat:\n  activation_dtype: int8\n  weight_dtype: int4\n  group_size: 32\n"
                                          "  fake_quant_after_n_steps: 2\n")
    assert r.returncode == 0, r.stderr
    assert "qat: int4 (group 32) weights, int8 (per token) activations fake-quantised" in r.stderr
    loss = lambda out: [m["loss"] for m in read_jsonl(out / "metrics.jsonl") if "loss" in m]  # noqa: E731
    a, b = loss(plain), loss(qat)
    assert len(a) == len(b) == 4
    assert a[:2] == b[:2]  # the first two steps without fake quantisation: the plain run's, bit for bit
    assert a[2] != b[2] and a[3] != b[3]
    # what it saves is the plain model transformers loads (Axolotl's convert step leaves nn.Linear weights)
    model = transformers.AutoModelForCausalLM.from_pretrained(qat / "model")
    before = transformers.AutoModelForCausalLM.from_pretrained(plain / "model")
    assert not torch.equal(model.model.layers[0].mlp.down_proj.weight, before.model.layers[0].mlp.down_proj.weight)


@pytest.mark.parametrize("block, line", [
    ("adapter: lora\nlora_r: 8\nqat:\n  weight_dtype: int4\n  activation_dtype: int8\n",
     "QAT trains the whole model and does not combine with adapter"),
    ("qat:\n  weight_dtype: int4\n", "int4 weights train with activation_dtype int8 here"),
    ("qat:\n  weight_dtype: nvfp4\n  activation_dtype: nvfp4\n  group_size: 32\n", "nvfp4 quantises blocks of 16"),
    ("qat:\n  weight_dtype: int8\n", "weight_dtype int8 is not built"),
    ("qat:\n  weight_dtype: int4\n  activation_dtype: int8\n  quantize_embedding: true\n",
     "fake-quantising the embedding is not built"),
])
def test_what_qat_does_not_build_is_refused_in_one_line(demo, tmp_path, block, line):
    out, r = train(demo, tmp_path, "refused", block)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and line in lines[0] and lines[0].startswith("error: "), r.stderr
    assert not out.exists()
