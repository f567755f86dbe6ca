"""What soltrain writes, loaded by the peers' own tools as they load theirs (issue 29): a full fine-tune and a merged
LoRA model of a bf16 base load in transformers in bf16, equal to the fp32 masters rounded to bf16, and generate with
the chat template; an adapter loads in PEFT by its base's hub id from the HF cache; a checkpoint-N folder loads in
transformers / PEFT as saved and its trainer_state.json in transformers.TrainerState; the saved config.yaml runs
again as it is. The peers run in subprocesses where the hub cache's environment must be theirs from import on."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import BIN, read_jsonl

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors import safe_open  # noqa: E402  (transformers brings safetensors)
from safetensors.torch import load_file  # noqa: E402

HUB_ID = "soltrain-test/tiny-bf16"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def bf16_base(demo, dst):
    """The demo model re-saved by transformers in bf16, its chat template in chat_template.jinja (transformers
    4.45+'s place for it)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(demo / "model", dtype=torch.bfloat16)
    model.save_pretrained(dst)
    tok = json.loads((demo / "model" / "tokenizer_config.json").read_text())
    (dst / "chat_template.jinja").write_text(tok.pop("chat_template"))
    (dst / "tokenizer_config.json").write_text(json.dumps(tok))
    shutil.copy(demo / "model" / "tokenizer.json", dst)
    return dst


def hub_cache(demo, root):
    """An HF hub cache holding the bf16 base under HUB_ID, as huggingface_hub lays it out."""
    repo = root / ("models--" + HUB_ID.replace("/", "--"))
    bf16_base(demo, repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    return root


def train(tmp_path, name, model, demo, extra="", env=None, save_steps=4):
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(f"model: {model}\ndatasets: [{{path: {demo / 'train.jsonl'}, type: conversation}}]\n"
                   f"output_dir: {tmp_path / name}\nsequence_len: 64\nmax_steps: 4\nsave_steps: {save_steps}\n"
                   f"learning_rate: 1e-3\nlogging_steps: 1\n{extra}")
    r = subprocess.run([str(BIN), "sft", str(cfg)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return tmp_path / name


def peer(code, env):
    """Runs `code` in a fresh Python whose huggingface_hub reads `env` from import on."""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r.stdout


def test_full_fine_tune_of_a_bf16_base_is_saved_in_bf16(demo, tmp_path):
    base = bf16_base(demo, tmp_path / "base")
    out = train(tmp_path, "full", base, demo)
    model = transformers.AutoModelForCausalLM.from_pretrained(out / "model")
    assert next(model.parameters()).dtype == torch.bfloat16
    assert json.loads((out / "model" / "config.json").read_text())["dtype"] == "bfloat16"
    # the checkpoint of the last step holds the fp32 masters: the model is them rounded to nearest even
    masters = load_file(str(out / "checkpoint-4" / "model.safetensors"))
    assert all(t.dtype == torch.float32 for t in masters.values())
    saved = load_file(str(out / "model" / "model.safetensors"))
    assert saved.keys() == masters.keys()
    for name, w in masters.items():
        assert saved[name].dtype == torch.bfloat16, name
        assert torch.equal(saved[name], w.to(torch.bfloat16)), name
    assert not torch.equal(saved["model.embed_tokens.weight"],
                           load_file(str(base / "model.safetensors"))["model.embed_tokens.weight"])
    # generates from the chat template it carries, in transformers and in soltrain
    tok = transformers.AutoTokenizer.from_pretrained(out / "model")
    assert tok.chat_template
    ids = tok.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    assert model.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False).shape[1] == ids.shape[1] + 4
    r = subprocess.run([str(BIN), "generate", "--model", str(out / "model"), "--chat", "hello", "--max-new-tokens",
                        "4"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    # save_dtype chooses
    f32 = train(tmp_path, "f32", base, demo, "save_dtype: float32\n")
    with safe_open(str(f32 / "model" / "model.safetensors"), "pt") as f:
        assert f.get_tensor("model.norm.weight").dtype == torch.float32


def test_checkpoint_folder_loads_in_transformers_and_its_state_in_trainer_state(demo, tmp_path):
    out = train(tmp_path, "full", demo / "model", demo, save_steps=2)
    ckpt = out / "checkpoint-2"
    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    masters = load_file(str(ckpt / "model.safetensors"))
    assert torch.equal(model.model.norm.weight.detach(), masters["model.norm.weight"])
    state = transformers.TrainerState.load_from_json(str(ckpt / "trainer_state.json"))
    assert state.global_step == 2 and state.max_steps == 4
    logged = [r for r in read_jsonl(out / "metrics.jsonl") if "loss" in r and r["step"] <= 2]
    assert [h["loss"] for h in state.log_history if "loss" in h] == [r["loss"] for r in logged]
    assert len(logged) == 2


def test_adapter_names_its_hub_base_and_loads_in_peft_from_the_cache(demo, tmp_path):
    pytest.importorskip("peft")
    cache = hub_cache(demo, tmp_path / "hub")
    env = dict(os.environ, HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1")
    out = train(tmp_path, "lora", HUB_ID, demo, "adapter: lora\nlora_r: 8\nlora_alpha: 16\nmerge_adapter: true\n",
                env=env)
    adapter = out / "adapter"
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == HUB_ID
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "README.md"):
        assert (adapter / f).exists(), f
    assert f"base_model: \"{HUB_ID}\"" in (adapter / "README.md").read_text()
    # PEFT finds the base by its hub id in the cache; the adapter, PEFT's merge, ours and the checkpoint agree
    out_text = peer(f"""
import torch, peft, transformers
from safetensors.torch import load_file
m = peft.AutoPeftModelForCausalLM.from_pretrained({str(adapter)!r}, dtype=torch.float32)
ours = load_file({str(out / 'merged' / 'model.safetensors')!r})
theirs = m.merge_and_unload().state_dict()
worst = 0
for name, w in ours.items():
    assert w.dtype == torch.bfloat16, name
    # one bf16 step at most: both merge in fp32, summing in their own order
    d = (w.float() - theirs[name].to(torch.bfloat16).float()).abs().max().item()
    worst = max(worst, d / max(theirs[name].abs().max().item(), 1e-30))
assert worst <= 2 ** -7, worst
base = transformers.AutoModelForCausalLM.from_pretrained({HUB_ID!r}, dtype=torch.float32)
ck = peft.PeftModel.from_pretrained(base, {str(out / 'checkpoint-4')!r})
a = load_file({str(adapter / 'adapter_model.safetensors')!r})
for name, w in ck.state_dict().items():
    if "lora_" in name:
        key = name.replace(".default", "")
        assert torch.equal(w, a[key]), name
print("ok", len(a))
""", env)
    assert out_text.startswith("ok")
    merged = transformers.AutoModelForCausalLM.from_pretrained(out / "merged")
    assert next(merged.parameters()).dtype == torch.bfloat16
    tok = transformers.AutoTokenizer.from_pretrained(out / "merged")
    ids = tok.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    assert merged.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False).shape[1] == ids.shape[1] + 4


def test_saved_config_runs_again_as_it_is(demo, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"# my run\nmodel: {demo / 'model'}\ndatasets:\n  - path: {demo / 'train.jsonl'}\n"
                   f"    type: conversation\noutput_dir: {tmp_path / 'a'}\nsequence_len: 64\nmax_steps: 2\n"
                   "learning_rate: 1e-3\n")
    r = subprocess.run([str(BIN), "sft", str(cfg), "--set", f"output_dir={tmp_path / 'b'}", "--set", "max_steps=3",
                        "--set", "save_steps=3"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    saved = tmp_path / "b" / "checkpoint-3" / "config.yaml"
    text = saved.read_text()
    assert text.count("output_dir:") == 1 and text.count("max_steps:") == 1, text
    # as it is, from another folder, into a new output_dir: the same run
    again = saved.read_text().replace(str(tmp_path / "b"), str(tmp_path / "c"))
    (tmp_path / "again.yaml").write_text(again)
    r = subprocess.run([str(BIN), "sft", str(tmp_path / "again.yaml")], capture_output=True, text=True,
                       cwd=str(tmp_path / "b"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "c" / "model" / "model.safetensors").read_bytes() == \
        (tmp_path / "b" / "model" / "model.safetensors").read_bytes()
