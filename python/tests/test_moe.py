"""Mixture-of-Experts (Qwen3-MoE; Qwen2-MoE with its shared expert) against transformers live on CPU torch:
logits, the loss with transformers' load-balancing loss (output_router_logits × router_aux_loss_coef) and every
gradient (router, each expert's gate/up/down, the shared expert and its gate, attention, norms, biases) of random
tiny models, with norm_topk_prob on and off and dense layers interleaved (mlp_only_layers, decoder_sparse_step);
greedy generation; an `sft` run whose saved model transformers loads whole. Tolerances are the dense models' (test_live_references.py)."""
import json
import shutil
import subprocess

import numpy as np
import pytest

import soltrain
from conftest import BIN, dump, reference_batch, rel
from live_refs import check_against_peft, hf_grad, tiny_moe

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file  # noqa: E402


@pytest.mark.parametrize("kind,norm_topk,aux,dense_layers,sparse_step",
                         [("qwen3_moe", True, True, [], 1), ("qwen3_moe", False, True, [1], 1),
                          ("qwen3_moe", True, False, [], 2), ("qwen2_moe", False, True, [], 1),
                          ("qwen2_moe", True, False, [0], 1)])
def test_logits_loss_and_gradients_match_transformers(kind, norm_topk, aux, dense_layers, sparse_step, tmp_path):
    model = tiny_moe(tmp_path / "model", seed=11 + sparse_step + len(dense_layers), kind=kind, norm_topk_prob=norm_topk,
                     output_router_logits=aux, mlp_only_layers=dense_layers, decoder_sparse_step=sparse_step)
    ids, targets = reference_batch(300)
    ours = dump(tmp_path, ids, targets)

    model.train(False)
    out = model(input_ids=ids, output_router_logits=aux)
    loss = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
    if aux:  # what Qwen3MoeForCausalLM adds to its loss when the config asks for router logits
        assert out.aux_loss.item() > 1.0
        loss = loss + model.config.router_aux_loss_coef * out.aux_loss
    loss.backward()
    assert rel(ours["logits"].reshape(out.logits.shape), out.logits.detach()) <= 1e-5
    assert abs(float(ours["loss"].flatten()[0]) - loss.item()) / loss.item() <= 1e-6
    grads = [n for n in ours if n.startswith("grad.")]
    idle = 0
    for key in grads:
        ref = hf_grad(model, key[5:])
        if not ref.any():  # an expert no token chose: no gradient on either side
            assert not ours[key].any(), key
            idle += 1
            continue
        assert rel(ours[key], ref) <= 1e-4, key
    assert idle < len(grads) // 4
    experts = [n for n in grads if ".experts." in n]
    routers = [n for n in grads if n.endswith("mlp.gate.weight")]
    sparse = [l for l in range(3) if l not in dense_layers and (l + 1) % sparse_step == 0]
    assert len(experts) == 3 * 8 * len(sparse) and len(routers) == len(sparse)
    shared = [n for n in grads if ".shared_expert" in n]
    assert len(shared) == (4 * len(sparse) if kind == "qwen2_moe" else 0)
    assert len(grads) == sum(p.numel() > 0 for p in model.parameters()) + len(experts) - 2 * len(sparse)


@pytest.mark.parametrize("kind", ["qwen3_moe", "qwen2_moe"])
def test_greedy_generation_and_logprobs_match_transformers(kind, tmp_path):
    hf = tiny_moe(tmp_path / "model", seed=5, kind=kind, norm_topk_prob=True)
    hf.train(False)
    model = soltrain.Model.from_pretrained(tmp_path / "model", sequence_len=32, rows=2)
    prompts = [[5, 17, 99, 42, 7], [8, 3]]
    ours = model.generate(prompts, max_new_tokens=10, eos_token_id=[])
    for prompt, got in zip(prompts, ours):
        want = hf.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False, eos_token_id=None,
                           pad_token_id=0)
        assert got == want[0, len(prompt):].tolist()
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 300, size=(2, 32), dtype=np.int64)
    targets = np.roll(ids, -1, axis=1)
    targets[:, -1] = -100
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.from_numpy(ids)).logits, -1)
    t = torch.from_numpy(targets)
    expected = ref.gather(-1, t.clamp(min=0)[..., None])[..., 0].masked_fill(t == -100, 0).numpy()
    assert np.abs(model.logprobs(ids, targets) - expected).max() < 1e-4


def test_sft_saves_a_model_transformers_loads(demo, tmp_path):
    tiny_moe(tmp_path / "model", seed=9, vocab=320, norm_topk_prob=True, output_router_logits=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(demo / "model" / f, tmp_path / "model" / f)
    config = soltrain.SFTConfig(model=str(tmp_path / "model"), output_dir=str(tmp_path / "out"), sequence_len=128,
                                per_device_train_batch_size=2, max_steps=8, learning_rate=3e-3, logging_steps=1,
                                device="cpu", datasets=[{"path": str(demo / "train.jsonl"), "type": "conversation"}])
    logged = []
    soltrain.Trainer(config, callbacks=[logged.append]).train()
    losses = [m["loss"] for m in logged if "loss" in m]
    assert len(losses) == 8 and losses[-1] < losses[0]
    # the experts' load in each step's metrics: the busiest expert over the mean, 1 (even) to E/k (8/3 here)
    loads = [(m["moe_load_imbalance"], m["moe_load_imbalance_mean"]) for m in logged if "loss" in m]
    assert len(loads) == 8 and all(1 <= mean <= worst <= 8 / 3 for worst, mean in loads)
    saved, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out" / "model", dtype=torch.float32,
                                                                    output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    before = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "model", dtype=torch.float32)
    moved = [n for n, p in saved.named_parameters() if not torch.equal(p, dict(before.named_parameters())[n])]
    assert any(".experts." in n for n in moved) and any(n.endswith("mlp.gate.weight") for n in moved)


def merge_matches_peft(pm, tmp_path, adapter, router):
    """`soltrain merge` folds the adapter (attention's, the experts' or the shared expert's, the router's) into the
    base as PEFT's merge_and_unload does, into the per-expert files transformers writes by default and into its
    stacked layout (save_original_format=False) alike. pm: the PeftModel over tmp_path/model, merged here."""
    merged_by_peft = {n: p.detach() for n, p in pm.merge_and_unload().named_parameters()}
    # (merge_and_unload changed the base in place: the unmerged one again, and it in the stacked layout)
    before = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "model", dtype=torch.float32)
    before.save_pretrained(tmp_path / "stacked", save_original_format=False)
    moved = [n for n, p in before.named_parameters() if not torch.equal(p, merged_by_peft[n])]
    assert any(n.endswith("mlp.gate.weight") for n in moved) == router
    for layout in ("model", "stacked"):
        subprocess.run([str(BIN), "merge", "--model", str(tmp_path / layout), "--adapter", str(adapter), "--out",
                        str(tmp_path / f"merged-{layout}")], check=True, capture_output=True)
        ours = dict(transformers.AutoModelForCausalLM.from_pretrained(tmp_path / f"merged-{layout}",
                                                                      dtype=torch.float32).named_parameters())
        assert sorted(ours) == sorted(merged_by_peft)
        for n, p in merged_by_peft.items():
            assert rel(ours[n].detach(), p) <= 1e-6, (layout, n)
    return moved


@pytest.mark.parametrize("kind,targets,rslora", [
    ("qwen3_moe", ["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"], False),
    ("qwen3_moe", ["o_proj", "down_proj"], True),
    ("qwen3_moe", "all-linear", False),  # + the router (target_parameters gate.weight)
    ("qwen2_moe", ["k_proj", "gate_proj", "up_proj", "down_proj"], False),
    ("qwen2_moe", "all-linear", False)])  # + the shared expert's gate (a [1, D] Linear)
def test_lora_adapters_match_peft(kind, targets, rslora, tmp_path):
    """PEFT 0.21 puts gate/up/down on Qwen3-MoE's experts (one fused gate_up adapter of rank 2r, alpha 2a, and
    down: target_parameters) and on Qwen2-MoE's shared expert; its adapter (random A and B) loads here, and the
    logits, the loss with the load-balancing loss and every adapter gradient equal PEFT's."""
    peft = pytest.importorskip("peft")
    model = tiny_moe(tmp_path / "model", seed=21, kind=kind, norm_topk_prob=True, output_router_logits=True)
    pm = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets, use_rslora=rslora))
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn_like(p) * 0.1)
    pm.save_pretrained(tmp_path / "adapter")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert bool(config["target_parameters"]) == (kind == "qwen3_moe")
    ids, targets_ = reference_batch(300, masked=False)
    ours = dump(tmp_path, ids, targets_, adapter=tmp_path / "adapter")
    pm.train(False)
    out = pm(input_ids=ids, output_router_logits=True)
    loss = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), targets_.flatten(), ignore_index=-100)
    loss = loss + model.config.router_aux_loss_coef * out.aux_loss
    loss.backward()
    adapters = check_against_peft(ours, pm, out.logits, loss)
    experts = [n for n in adapters if ".experts." in n]
    all_linear = targets == "all-linear"
    assert bool(experts) == (kind == "qwen3_moe" and (all_linear or any(t in targets for t in ("gate_proj", "down_proj"))))
    assert any(".mlp.gate.lora_" in n for n in adapters) == (all_linear and kind == "qwen3_moe")
    assert any(".shared_expert_gate.lora_" in n for n in adapters) == (all_linear and kind == "qwen2_moe")
    # the adapter as soltrain writes it back (adapter_config, tensors) is PEFT's own
    subprocess.run([str(BIN), "dump", "--model", str(tmp_path / "model"), "--adapter", str(tmp_path / "adapter"),
                    "--batch", str(tmp_path / "batch.safetensors"), "--out", str(tmp_path / "again.safetensors"),
                    "--save-adapter", str(tmp_path / "written")], check=True, capture_output=True)
    written = json.loads((tmp_path / "written" / "adapter_config.json").read_text())
    assert sorted(written["target_modules"]) == sorted(config["target_modules"])
    assert sorted(written["target_parameters"] or []) == sorted(config["target_parameters"] or [])  # (PEFT: a set)
    again = load_file(str(tmp_path / "written" / "adapter_model.safetensors"))
    saved = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    assert sorted(again) == sorted(saved) and all(torch.equal(again[n], saved[n]) for n in saved)
    moved = merge_matches_peft(pm, tmp_path, tmp_path / "adapter", router=all_linear and kind == "qwen3_moe")
    assert any(".experts." in n for n in moved) == bool(experts)
    assert any(".shared_expert." in n for n in moved) == (kind == "qwen2_moe")


@pytest.mark.parametrize("targets", [["q_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], ["all-linear"]])
def test_lora_sft_adapter_loads_in_peft_with_our_logits(targets, demo, tmp_path):
    """A LoRA run on Qwen3-MoE (attention and experts; all-linear: the router too, as PEFT) saves an adapter PEFT
    loads whole, with PEFT's adapter_config; PEFT's logits with it are ours."""
    peft = pytest.importorskip("peft")
    tiny_moe(tmp_path / "model", seed=13, vocab=320, norm_topk_prob=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(demo / "model" / f, tmp_path / "model" / f)
    config = soltrain.SFTConfig(model=str(tmp_path / "model"), output_dir=str(tmp_path / "out"), sequence_len=128,
                                per_device_train_batch_size=2, max_steps=4, learning_rate=1e-2, logging_steps=1,
                                device="cpu", adapter="lora", lora_r=4, lora_alpha=8,
                                lora_target_modules=targets,
                                datasets=[{"path": str(demo / "train.jsonl"), "type": "conversation"}])
    soltrain.Trainer(config).train()
    adapter = tmp_path / "out" / "adapter"
    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "model", dtype=torch.float32)
    pm = peft.PeftModel.from_pretrained(base, adapter)
    saved = load_file(str(adapter / "adapter_model.safetensors"))
    loaded = {n.replace(".default", ""): p for n, p in pm.named_parameters() if "lora_" in n}
    assert sorted(loaded) == sorted(saved) and any(".experts." in n for n in saved)
    assert all(torch.equal(loaded[n], saved[n]) for n in saved)
    written = json.loads((adapter / "adapter_config.json").read_text())
    assert written["target_parameters"] == (["down_proj", "gate.weight", "gate_up_proj"] if targets == ["all-linear"]
                                            else ["down_proj", "gate_up_proj"])
    assert written["rank_pattern"] == {".*\\.gate_up_proj": 8} and written["alpha_pattern"] == {".*\\.gate_up_proj": 16}
    assert any(saved[n].abs().max() > 0 for n in saved if "lora_B" in n and ".experts." in n)  # trained
    ids = torch.randint(0, 320, (2, 24))
    ours = dump(tmp_path, ids, torch.roll(ids, -1, 1), adapter=adapter)
    pm.train(False)
    with torch.no_grad():
        logits = pm(input_ids=ids).logits
    assert rel(ours["logits"].reshape(logits.shape), logits) <= 1e-5
    merge_matches_peft(pm, tmp_path, adapter, router=targets == ["all-linear"])


def test_transformers_stacked_expert_layout_loads_as_the_per_expert_one(tmp_path):
    """transformers 5 also writes its in-memory layout (save_original_format=False: one [E, 2F, D] gate_up_proj and
    one [E, D, F] down_proj per layer): it loads as the per-expert files do, gradient for gradient."""
    model = tiny_moe(tmp_path / "model", seed=17, norm_topk_prob=True, output_router_logits=True)
    model.save_pretrained(tmp_path / "stacked", save_original_format=False)
    stacked = load_file(str(tmp_path / "stacked" / "model.safetensors"))
    assert "model.layers.0.mlp.experts.gate_up_proj" in stacked and not any(".experts.0." in n for n in stacked)
    ids = torch.randint(0, 300, (2, 24))
    targets = torch.roll(ids, -1, 1)
    per_expert = dump(tmp_path, ids, targets)
    shutil.rmtree(tmp_path / "model")
    shutil.copytree(tmp_path / "stacked", tmp_path / "model")
    ours = dump(tmp_path, ids, targets)
    assert sorted(ours) == sorted(per_expert)
    for name in ours:
        assert torch.equal(ours[name], per_expert[name]), name
