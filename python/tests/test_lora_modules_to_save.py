"""LoRA with modules trained in full beside the adapters (PEFT's modules_to_save, Axolotl's lora_modules_to_save:
embed_tokens and lm_head) against PEFT itself, live on CPU: a PEFT adapter whose saved embedding and LM head differ
from the base's is read (`soltrain dump --adapter`) with the same logits, loss, adapter gradients and the full
modules' gradients as PEFT's, written back under PEFT's names with modules_to_save in its config, and merged into
the weights PEFT's merge_and_unload gives; on a tied model as PEFT's two untied copies (ensure_weight_tying: one line)."""
import json
import subprocess

import pytest

from conftest import BIN, reference_batch, rel
from live_refs import tiny_qwen3

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
from safetensors.torch import load_file, save_file  # noqa: E402


def tiny(tmp_path, tied):
    return tiny_qwen3(tmp_path / "model", seed=13, tied=tied, bf16=False)


def dumped_against_peft(tmp_path, model, target_modules, modules):
    """A PEFT adapter with modules_to_save (its adapters and trained copies moved off the base) read by `soltrain
    dump` and written back: (PEFT's model after a backward of the batch's loss, its logits and loss, ours, the
    PEFT gradients by soltrain's names)."""
    pm = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=target_modules,
                                                    modules_to_save=modules))
    with torch.no_grad():  # the adapters and the trained copies away from the base
        for n, p in pm.named_parameters():
            if "lora_" in n or "modules_to_save" in n:
                p.add_(torch.randn_like(p) * 0.1)
    pm.save_pretrained(tmp_path / "adapter")
    ids, targets = reference_batch(300, masked=False)
    save_file({"input_ids": ids.int(), "targets": targets.int()}, str(tmp_path / "batch.safetensors"))
    r = subprocess.run([str(BIN), "dump", "--model", str(tmp_path / "model"), "--adapter", str(tmp_path / "adapter"),
                        "--batch", str(tmp_path / "batch.safetensors"), "--out", str(tmp_path / "ours.safetensors"),
                        "--save-adapter", str(tmp_path / "again")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ours = load_file(str(tmp_path / "ours.safetensors"))
    pm.train(False)
    out = pm(input_ids=ids)
    loss = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
    loss.backward()
    grads = {}
    for n, p in pm.named_parameters():
        if p.grad is not None:
            n = n.replace(".default", "")
            grads[n.replace("base_model.model.", "", 1).replace(".modules_to_save", "")
                  if "modules_to_save" in n else n] = p
    return pm, ids, out, loss, ours, grads


def test_modules_saved_in_full_match_peft(tmp_path):
    model = tiny(tmp_path, tied=False)
    pm, ids, out, loss, ours, grads = dumped_against_peft(tmp_path, model, ["q_proj", "v_proj"],
                                                         ["embed_tokens", "lm_head"])
    assert rel(ours["logits"].reshape(out.logits.shape), out.logits.detach()) <= 1e-5
    assert abs(float(ours["loss"].flatten()[0]) - loss.item()) / loss.item() <= 1e-6
    assert sorted("grad." + n for n in grads) == sorted(n for n in ours if n.startswith("grad."))
    for name, p in grads.items():
        assert rel(ours["grad." + name], p.grad) <= 1e-4, name
    assert {"grad.model.embed_tokens.weight", "grad.lm_head.weight"} <= set(ours)
    # written back as PEFT writes it
    theirs, again = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors")), load_file(
        str(tmp_path / "again" / "adapter_model.safetensors"))
    assert sorted(theirs) == sorted(again) and all(torch.equal(theirs[k], again[k]) for k in theirs)
    cfg = json.loads((tmp_path / "again" / "adapter_config.json").read_text())
    assert sorted(cfg["modules_to_save"]) == ["embed_tokens", "lm_head"]
    # merged: PEFT's merge_and_unload's weights
    subprocess.run([str(BIN), "merge", "--model", str(tmp_path / "model"), "--adapter", str(tmp_path / "adapter"),
                    "--out", str(tmp_path / "merged")], check=True, capture_output=True)
    merged = load_file(str(tmp_path / "merged" / "model.safetensors"))
    want = pm.merge_and_unload().state_dict()
    for k in ["model.embed_tokens.weight", "lm_head.weight", "model.layers.1.self_attn.q_proj.weight"]:
        assert rel(merged[k].float(), want[k]) <= 1e-6, k
    base = load_file(str(tmp_path / "model" / "model.safetensors"))
    assert rel(merged["lm_head.weight"].float(), base["lm_head.weight"].float()) > 1e-3  # the trained copy, not the base's


@pytest.mark.parametrize("modules", [["embed_tokens", "lm_head"], ["embed_tokens"], ["lm_head"]])
def test_tied_model_trains_two_copies_as_peft(tmp_path, modules):
    # PEFT's default (ensure_weight_tying False, Axolotl's too) wraps each listed module of a tied model in its own
    # trained copy: the lookup and the head then differ, and an unlisted one stays the stored weight, frozen.
    model = tiny(tmp_path, tied=True)
    pm, ids, out, loss, ours, grads = dumped_against_peft(tmp_path, model, ["q_proj"], modules)
    assert rel(ours["logits"].reshape(out.logits.shape), out.logits.detach()) <= 1e-5
    want = {"embed_tokens": "model.embed_tokens.weight", "lm_head": "lm_head.weight"}
    assert {want[m] for m in modules} <= set(grads)
    assert sorted("grad." + n for n in grads) == sorted(n for n in ours if n.startswith("grad."))
    for name, p in grads.items():
        assert rel(ours["grad." + name], p.grad) <= 1e-4, name
    theirs, again = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors")), load_file(
        str(tmp_path / "again" / "adapter_model.safetensors"))
    assert sorted(theirs) == sorted(again) and all(torch.equal(theirs[k], again[k]) for k in theirs)
    # merged: untied, each of the two as PEFT's merge_and_unload leaves it (transformers would re-tie a saved model
    # whose config still says tied, losing one copy: ours says tie_word_embeddings false)
    subprocess.run([str(BIN), "merge", "--model", str(tmp_path / "model"), "--adapter", str(tmp_path / "adapter"),
                    "--out", str(tmp_path / "merged")], check=True, capture_output=True)
    merged = load_file(str(tmp_path / "merged" / "model.safetensors"))
    assert json.loads((tmp_path / "merged" / "config.json").read_text())["tie_word_embeddings"] is False
    state = pm.merge_and_unload().state_dict()
    for k in ["model.embed_tokens.weight", "lm_head.weight", "model.layers.1.self_attn.q_proj.weight"]:
        assert rel(merged[k].float(), state[k]) <= 1e-6, k
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32,
                                                                 attn_implementation="eager")
    assert rel(reloaded(input_ids=ids).logits.detach(), out.logits.detach()) <= 1e-5


def test_tied_adapters_of_ensure_weight_tying_are_one_line(tmp_path):
    model = tiny(tmp_path, tied=True)
    pm = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj"], modules_to_save=["lm_head"],
                                                    ensure_weight_tying=True))
    pm.save_pretrained(tmp_path / "adapter")
    ids, targets = reference_batch(300, masked=False)
    save_file({"input_ids": ids.int(), "targets": targets.int()}, str(tmp_path / "batch.safetensors"))
    r = subprocess.run([str(BIN), "dump", "--model", str(tmp_path / "model"), "--adapter", str(tmp_path / "adapter"),
                        "--batch", str(tmp_path / "batch.safetensors"), "--out", str(tmp_path / "o.safetensors")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "ensure_weight_tying" in r.stderr.strip().splitlines()[-1], r.stderr
