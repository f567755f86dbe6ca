"""Qwen3-VL's language model fine-tuned on text (Surogate's qwen3vl-text-lora example): a
Qwen3VLForConditionalGeneration folder as transformers writes it, its decoder under model.language_model and a vision
tower beside it (live_refs.tiny_qwen3_vl). The reference is transformers' own Qwen3VLForConditionalGeneration on text-only input (its interleaved multimodal RoPE with three equal
position ids) and PEFT on it: logits, loss and every gradient; the adapter, merged model and full fine-tune soltrain
saves load back there with the vision tower untouched."""
import json
import subprocess

import pytest
import torch

from conftest import BIN
from live_refs import (check_full_gradients, check_lora_dump, dump, random_adapter, reference_batch, rel,
                       tiny_qwen3_vl)

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def hf_loss(model, ids, targets):
    out = model(input_ids=ids)
    loss = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
    return out.logits, loss


@pytest.mark.parametrize("tied", [True, False])
def test_full_fine_tune_logits_loss_and_gradients_equal_transformers(tmp_path, tied):
    model = tiny_qwen3_vl(tmp_path / "model", vocab=300, tied=tied)
    torch.manual_seed(3)
    ids, targets = reference_batch(300)
    ours = dump(tmp_path, ids, targets)
    logits, loss = hf_loss(model, ids, targets)
    loss.backward()
    assert rel(ours["logits"].reshape(logits.shape), logits.detach()) <= 1e-5
    assert abs(float(ours["loss"].flatten()[0]) - loss.item()) <= 1e-5 * loss.item()
    # every language-model weight's gradient under its checkpoint name; the vision tower is not trained
    grads = {n: p.grad for n, p in model.named_parameters() if not n.startswith("model.visual.")}
    assert all(n.startswith("model.language_model.") or n == "lm_head.weight" for n in grads)
    check_full_gradients(ours, grads)
    assert not any(n.startswith("grad.model.visual.") for n in ours)


def test_lora_logits_and_adapter_gradients_equal_peft(tmp_path):
    model = tiny_qwen3_vl(tmp_path / "model", vocab=300)
    pm = random_adapter(model, tmp_path / "adapter", targets=TARGETS)
    names = [n for n, _ in pm.named_parameters() if "lora_A" in n]
    assert names and all(".language_model." in n for n in names)  # PEFT adapts the decoder only
    torch.manual_seed(4)
    ids, targets = reference_batch(300)
    check_lora_dump(tmp_path, pm, ids, targets, ["--model", str(tmp_path / "model"), "--adapter",
                                                 str(tmp_path / "adapter")])


def run(tmp_path, demo, lora):
    (tmp_path / "data.jsonl").write_text("".join(json.dumps({"text": f"word {i} and word {i + 1} and {i + 2}"}) + "\n"
                                                 for i in range(16)))
    lora_keys = "lora: true\nlora_rank: 4\nlora_alpha: 8\nlora_target_modules: [" + ", ".join(TARGETS) + "]\n"
    (tmp_path / "run.yaml").write_text(f"""model: {tmp_path / 'model'}
datasets: [{{path: {tmp_path / 'data.jsonl'}, type: text}}]
output_dir: {tmp_path / 'out'}
{lora_keys if lora else ''}sequence_len: 32
per_device_train_batch_size: 2
max_steps: 3
learning_rate: 1.0e-2
device: cpu
""")
    r = subprocess.run([str(BIN), "sft", str(tmp_path / "run.yaml")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "the vision tower" in r.stderr  # said once: what is not loaded
    return tmp_path / "out" / ("adapter" if lora else "model")


def test_a_lora_run_saves_what_peft_loads_and_merges(demo, tmp_path):
    import peft
    import transformers
    from safetensors.torch import load_file

    vocab = json.loads((demo / "model" / "config.json").read_text())["vocab_size"]
    tiny_qwen3_vl(tmp_path / "model", vocab=vocab, tokenizer_from=demo / "model")
    adapter = run(tmp_path, demo, lora=True)
    saved = load_file(str(adapter / "adapter_model.safetensors"))
    assert saved and all(n.startswith("base_model.model.model.language_model.layers.") for n in saved)
    assert max(float(t.abs().max()) for n, t in saved.items() if "lora_B" in n) > 0  # it trained
    base = transformers.Qwen3VLForConditionalGeneration.from_pretrained(tmp_path / "model", dtype=torch.float32,
                                                                       attn_implementation="eager")
    pm = peft.PeftModel.from_pretrained(base, adapter)
    loaded = {n.replace(".default", ""): p for n, p in pm.named_parameters() if "lora_" in n}
    assert sorted(loaded) == sorted(saved)
    for n, t in saved.items():
        assert torch.equal(loaded[n].detach(), t), n
    torch.manual_seed(6)
    ids, targets = reference_batch(vocab)
    ours = dump(tmp_path, ids, targets, adapter=adapter)
    with torch.no_grad():
        logits = pm(input_ids=ids).logits
    assert rel(ours["logits"].reshape(logits.shape), logits) <= 1e-5
    # merged: the Qwen3-VL folder transformers loads, its vision tower the base's bytes, the decoder PEFT's merge
    subprocess.run([str(BIN), "merge", "--model", str(tmp_path / "model"), "--adapter", str(adapter), "--out",
                    str(tmp_path / "merged")], check=True, capture_output=True)
    theirs = pm.merge_and_unload().state_dict()
    merged = load_file(str(tmp_path / "merged" / "model.safetensors"))
    plain = load_file(str(tmp_path / "model" / "model.safetensors"))
    assert set(merged) == set(plain)
    for n, t in merged.items():
        if n.startswith("model.visual."):
            assert torch.equal(t, plain[n]), n
        else:
            assert rel(t.float(), theirs[n]) <= 1e-6, n
    again = transformers.Qwen3VLForConditionalGeneration.from_pretrained(tmp_path / "merged", dtype=torch.float32,
                                                                        attn_implementation="eager")
    with torch.no_grad():
        assert rel(again(input_ids=ids).logits, logits) <= 1e-5


def test_a_full_fine_tune_saves_a_qwen3_vl_folder_with_its_vision_tower(demo, tmp_path):
    import transformers
    from safetensors.torch import load_file

    vocab = json.loads((demo / "model" / "config.json").read_text())["vocab_size"]
    tiny_qwen3_vl(tmp_path / "model", vocab=vocab, tokenizer_from=demo / "model")
    out = run(tmp_path, demo, lora=False)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3VLForConditionalGeneration"] and "vision_config" in cfg
    ours = {}
    for f in sorted(out.glob("*.safetensors")):
        ours.update(load_file(str(f)))
    plain = load_file(str(tmp_path / "model" / "model.safetensors"))
    assert set(ours) == set(plain)
    for n, t in plain.items():
        if n.startswith("model.visual."):
            assert torch.equal(ours[n], t), n
    changed = "model.language_model.layers.0.self_attn.q_proj.weight"
    assert rel(ours[changed].float(), plain[changed]) > 1e-4
    again = transformers.Qwen3VLForConditionalGeneration.from_pretrained(out, dtype=torch.float32,
                                                                        attn_implementation="eager")
    for n, p in again.state_dict().items():
        if n in ours:
            assert torch.equal(p, ours[n].float()), n


def test_reward_models_on_it_are_one_line(demo, tmp_path):
    vocab = json.loads((demo / "model" / "config.json").read_text())["vocab_size"]
    tiny_qwen3_vl(tmp_path / "model", vocab=vocab, tokenizer_from=demo / "model")
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps({"prompt": f"q {i}", "chosen": "yes", "rejected": "no"})
                                                  + "\n" for i in range(4)))
    (tmp_path / "run.yaml").write_text(f"""model: {tmp_path / 'model'}
datasets: [{{path: {tmp_path / 'pairs.jsonl'}}}]
output_dir: {tmp_path / 'out'}
reward_model: true
sequence_len: 32
max_steps: 1
device: cpu
""")
    r = subprocess.run([str(BIN), "dpo", str(tmp_path / "run.yaml")], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert "reward model" in r.stderr and "vision-language" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "model").exists()


def test_surogates_qwen3vl_text_lora_example_runs(demo, tmp_path):
    """Surogate's examples/sft/qwen3vl/qwen3vl-text-lora-bf16.yaml (tests/fixtures/peer_configs), its paths pointed at a
    stand-in Qwen3-VL and gsm8k-style rows (Surogate's `type: auto`), one update on short rows (CPU time)."""
    from conftest import ROOT

    vocab = json.loads((demo / "model" / "config.json").read_text())["vocab_size"]
    tiny_qwen3_vl(tmp_path / "model", vocab=vocab, tokenizer_from=demo / "model")
    (tmp_path / "gsm8k.jsonl").write_text("".join(json.dumps({"question": f"What is {i} + 1?", "answer": f"{i + 1}"})
                                                  + "\n" for i in range(24)))
    text = (ROOT / "tests" / "fixtures" / "peer_configs" / "surogate-qwen3vl-text-lora-bf16.yaml").read_text()
    paths = {"MODEL_DIR": tmp_path / "model", "DATA_FILE": tmp_path / "gsm8k.jsonl", "OUTPUT_DIR": tmp_path / "out"}
    for k, v in paths.items():
        assert k in text
        text = text.replace(k, str(v))
    (tmp_path / "run.yaml").write_text(text)
    r = subprocess.run([str(BIN), "sft", str(tmp_path / "run.yaml"), "--set", "max_steps=1", "--set", "sequence_len=64",
                        "--set", "device=cpu"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    cfg = json.loads((tmp_path / "out" / "adapter" / "adapter_config.json").read_text())
    assert cfg["r"] == 16 and cfg["lora_alpha"] == 32 and sorted(cfg["target_modules"]) == sorted(TARGETS)
    from safetensors.torch import load_file
    saved = load_file(str(tmp_path / "out" / "adapter" / "adapter_model.safetensors"))
    assert len(saved) == 2 * 7 * 2 and all(".language_model.layers." in n for n in saved)
