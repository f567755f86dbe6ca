"""LoftQ (Axolotl's `peft: {loftq_config: {loftq_bits: 4}}`, PEFT's init_lora_weights="loftq") against PEFT's own
loftq_init: each adapted weight becomes its NF4 round trip and the adapter its residual's rank-r SVD factors. PEFT's
function computes on a GPU; here its device moves are pointed at the CPU (bitsandbytes quantises NF4 there too),
its arithmetic untouched. soltrain's logits over the LoftQ model equal a transformers + PEFT model built from
loftq_init's outputs; the adapter saved is PEFT's (init_lora_weights "loftq"), which PEFT loads by redoing
loftq_init; soltrain's merge adds it to the round-tripped base, as PEFT's merge_and_unload does."""
import contextlib
import json
import subprocess

import pytest

import shutil

from conftest import BIN, dump, reference_batch, rel

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")

RANK = 8
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@contextlib.contextmanager
def loftq_on_cpu():
    """PEFT's loftq_init with its .to("cuda") moves kept on the CPU."""
    import bitsandbytes.nn.modules as bnb_modules
    from peft.utils import loftq_utils

    def cpu(args, kwargs):
        args = tuple("cpu" if a in ("cuda", "xpu") else a for a in args)
        if kwargs.get("device") in ("cuda", "xpu"):
            kwargs["device"] = "cpu"
        return args, kwargs

    tensor_to, params_to, available = torch.Tensor.to, bnb_modules.Params4bit.to, loftq_utils.is_bnb_4bit_available
    torch.Tensor.to = lambda self, *a, **k: tensor_to(self, *cpu(a, k)[0], **cpu(a, k)[1])
    bnb_modules.Params4bit.to = lambda self, *a, **k: params_to(self, *cpu(a, k)[0], **cpu(a, k)[1])
    loftq_utils.is_bnb_4bit_available = lambda: True
    try:
        yield loftq_utils.loftq_init
    finally:
        torch.Tensor.to, bnb_modules.Params4bit.to = tensor_to, params_to
        loftq_utils.is_bnb_4bit_available = available


def peft_loftq_model(model_dir, iterations=1):
    """transformers + PEFT: the base weights and adapters loftq_init makes (scaling alpha 16 / r 8)."""
    import transformers

    base = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = peft.LoraConfig(r=RANK, lora_alpha=16, target_modules=TARGETS, init_lora_weights=False)
    pm = peft.get_peft_model(base, config)
    made = {}
    with loftq_on_cpu() as loftq_init, torch.no_grad():
        for name, module in pm.named_modules():
            if not hasattr(module, "lora_A") or "default" not in module.lora_A:
                continue
            q, a, b = loftq_init(module.base_layer.weight, num_bits=4, reduced_rank=RANK, num_iter=iterations)
            module.base_layer.weight.copy_(q)
            module.lora_A["default"].weight.copy_(a)
            module.lora_B["default"].weight.copy_(b)
            made[name.replace("base_model.model.", "")] = (q, a, b)
    return pm.eval(), made


def train_tiny_lr(tmp_path, iterations=1):
    """A 1-step soltrain run at learning rate 1e-30 (no change in fp32): the adapter it saves is LoftQ's initial one."""
    (tmp_path / "data.jsonl").write_text("".join(json.dumps({"text": f"word {i} and word {i + 1}"}) + "\n"
                                                 for i in range(8)))
    (tmp_path / "run.yaml").write_text(f"""base_model: {tmp_path / 'model'}
datasets: [{{path: {tmp_path / 'data.jsonl'}, type: completion}}]
output_dir: {tmp_path / 'out'}
adapter: lora
lora_r: {RANK}
lora_alpha: 16
lora_target_linear: true
peft:
  loftq_config:
    loftq_bits: 4
    loftq_iter: {iterations}
sequence_len: 32
max_steps: 1
learning_rate: 1.0e-30
device: cpu
""")
    r = subprocess.run([str(BIN), "sft", str(tmp_path / "run.yaml")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return tmp_path / "out" / "adapter"


@pytest.mark.parametrize("iterations", [1, 2])
def test_logits_equal_a_peft_model_built_by_loftq_init(demo, tmp_path, iterations):
    shutil.copytree(demo / "model", tmp_path / "model")
    adapter = train_tiny_lr(tmp_path, iterations)
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    assert cfg["init_lora_weights"] == "loftq"
    assert cfg["loftq_config"] == {"loftq_bits": 4, "loftq_iter": iterations}
    pm, made = peft_loftq_model(tmp_path / "model", iterations)
    # The adapter factors as loftq_init gives them (an SVD's vectors up to sign: compared as B·A, and per factor
    # with each rank component's sign aligned).
    from safetensors.torch import load_file

    saved = load_file(str(adapter / "adapter_model.safetensors"))
    for module, (q, a, b) in made.items():
        ours_a = saved[f"base_model.model.{module}.lora_A.weight"]
        ours_b = saved[f"base_model.model.{module}.lora_B.weight"]
        # (two LAPACK builds' singular vectors differ in the last bits, more where singular values lie close)
        assert rel(ours_b @ ours_a, b @ a) <= 1e-4, module
        sign = torch.sign((ours_a * a).sum(dim=1))
        assert rel(ours_a * sign[:, None], a) <= 1e-3 and rel(ours_b * sign[None, :], b) <= 1e-3, module
    # soltrain over the LoftQ base with that adapter (dump reads the adapter and redoes the base as PEFT does)
    torch.manual_seed(5)
    ids, targets = reference_batch(pm.config.vocab_size)
    ours = dump(tmp_path, ids, targets, adapter=adapter)
    with torch.no_grad():
        logits = pm(input_ids=ids).logits
    assert rel(ours["logits"].reshape(logits.shape), logits) <= 1e-5


def test_peft_loads_the_adapter_and_merges_as_soltrain_merges(demo, tmp_path):
    import transformers
    from safetensors.torch import load_file

    shutil.copytree(demo / "model", tmp_path / "model")
    adapter = train_tiny_lr(tmp_path)
    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "model", dtype=torch.float32)
    with loftq_on_cpu():
        pm = peft.PeftModel.from_pretrained(base, adapter)  # (PEFT redoes loftq_init on the base as it loads)
    theirs = pm.merge_and_unload().state_dict()
    subprocess.run([str(BIN), "merge", "--model", str(tmp_path / "model"), "--adapter", str(adapter), "--out",
                    str(tmp_path / "merged")], check=True, capture_output=True)
    ours = load_file(str(tmp_path / "merged" / "model.safetensors"))
    assert set(ours) <= set(theirs) and len(ours) >= len(theirs) - 1  # (the tied LM head written once)
    for name in ours:
        assert rel(ours[name].float(), theirs[name]) <= 1e-5, name
    plain = load_file(str(tmp_path / "model" / "model.safetensors"))
    changed = "model.layers.0.self_attn.q_proj.weight"
    assert rel(ours[changed], plain[changed]) > 1e-3  # the round trip and the adapter changed it


def test_refused_over_a_quantised_base(demo, tmp_path):
    (tmp_path / "run.yaml").write_text(f"""base_model: {demo / 'model'}
datasets: [{{path: data.jsonl, type: completion}}]
output_dir: {tmp_path / 'out'}
adapter: qlora
load_in_4bit: true
peft: {{loftq_config: {{loftq_bits: 4}}}}
""")
    r = subprocess.run([str(BIN), "sft", str(tmp_path / "run.yaml")], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "peft.loftq_config: LoftQ quantises a full-precision base itself: use adapter: lora" in r.stderr
