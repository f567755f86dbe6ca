"""Live references, shared by the Python tests (test_live_references.py, test_moe.py) and the GPU machine's tools
(tests/tools/check_moe_cuda.py): transformers models with fresh random weights, a batch, and `soltrain dump`'s logits,
loss and gradients for it. No pytest here."""
import os
import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("SOLTRAIN_BIN", ROOT / "build" / "soltrain"))


def rel(a, b):
    """Relative L2 error of a against b (torch tensors)."""
    a, b = a.double().flatten(), b.double().flatten()
    return float((a - b).norm() / b.norm())


def randomize(model):
    """Every weight drawn fresh (norms near 1, biases and matrices small), not the init's ones and zeros."""
    import torch

    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * (0.5 if p.ndim == 1 else 0.08) + (1.0 if p.ndim == 1 else 0.0))


def write_tiny_llama(out, seed):
    """tests/fixtures/models/llama-tiny's architecture with fresh random weights (randomize), saved to `out`."""
    import torch
    import transformers

    cfg = transformers.AutoConfig.from_pretrained(ROOT / "tests" / "fixtures" / "models" / "llama-tiny")
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg)
    randomize(model)
    model.save_pretrained(out)
    return out


def tiny_qwen3(out, seed=9, tied=False, bf16=True):
    """A small random Qwen3 (2 layers) saved to `out` (in bf16 by default, as a base to quantise would come), and read
    back in fp32 (not .float() in place: the cast rounded RoPE's inv_freq buffer to bf16 too)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.Qwen3Config(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                      max_position_embeddings=128, tie_word_embeddings=tied,
                                      attn_implementation="eager")
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize(model)
    (model.to(torch.bfloat16) if bf16 else model).save_pretrained(out)
    return transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager")


def tiny_qwen3_vl(out, vocab, seed=11, tied=True, tokenizer_from=None):
    """A small random Qwen3-VL (2 text layers, a 1-block vision tower) saved to `out` in fp32, every weight drawn."""
    import shutil

    import torch
    import transformers

    torch.manual_seed(seed)
    text = dict(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-6,
                rope_parameters={"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [2, 3, 3],
                                 "mrope_interleaved": True})
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=16,
                  spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64, deepstack_visual_indexes=[0])
    cfg = transformers.Qwen3VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=tied,
                                     image_token_id=vocab - 3, video_token_id=vocab - 2,
                                     vision_start_token_id=vocab - 4, vision_end_token_id=vocab - 1)
    cfg._attn_implementation = "eager"
    model = transformers.Qwen3VLForConditionalGeneration(cfg).float()
    randomize(model)
    model.save_pretrained(out)
    if tokenizer_from:
        for f in tokenizer_from.iterdir():
            if f.name.startswith("tokenizer") or f.name in ("special_tokens_map.json", "chat_template.jinja"):
                shutil.copy(f, out / f.name)
    return transformers.Qwen3VLForConditionalGeneration.from_pretrained(out, dtype=torch.float32,
                                                                        attn_implementation="eager")


def random_adapter(model, out, r=4, targets="all-linear", drawn="lora_", scale=0.1):
    """PEFT LoRA (alpha 2r) on `targets` of `model`, the factors whose names hold `drawn` drawn from normal(0, scale)
    (not PEFT's zero B), saved to `out`."""
    import peft
    import torch

    pm = peft.get_peft_model(model, peft.LoraConfig(r=r, lora_alpha=2 * r, target_modules=targets))
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if drawn in n:
                p.copy_(torch.randn_like(p) * scale)
    pm.save_pretrained(out)
    return pm


def replace_projections(model, fn):
    """Every decoder projection's weight (each nn.Linear but the LM head, as transformers' quantised loading leaves the
    head) replaced by fn(its bf16 weight), in place; checks there are 7 a layer."""
    import torch

    done = 0
    with torch.no_grad():
        for name, m in model.named_modules():
            if isinstance(m, torch.nn.Linear) and name != "lm_head":
                m.weight.copy_(fn(m.weight.to(torch.bfloat16)))
                done += 1
    assert done == 7 * model.config.num_hidden_layers


def muon_parameter_groups(named):
    """How Muon-family optimizers split a model's parameters (train/optimizer.h updated_by_muon): the hidden 2-D
    matrices' names, then AdamW's decayed matrices (embedding, LM head) and its undecayed 1-D parameters."""
    hidden = [n for n, p in named.items() if p.ndim == 2 and "embed_tokens" not in n and "lm_head" not in n]
    decay = [named[n] for n, p in named.items() if n not in hidden and p.ndim == 2]
    flat = [named[n] for n, p in named.items() if p.ndim < 2]
    return hidden, decay, flat


def reference_batch(vocab, masked=True):
    """2 x 24 random ids and their next-token targets (-100 at each row's end; some leading ones masked)."""
    import torch

    ids = torch.randint(0, vocab, (2, 24))
    targets = torch.roll(ids, -1, 1)
    targets[:, -1] = -100
    if masked:
        targets[1, :4] = -100
    return ids, targets


def dump(tmp_path, ids, targets, model="model", adapter=None, device="cpu", binary=None, extra=()):
    """`soltrain dump` of tmp_path/model (with a PEFT adapter folder) on this batch: its tensors by name."""
    from safetensors.torch import load_file, save_file

    save_file({"input_ids": ids.int(), "targets": targets.int()}, str(tmp_path / "batch.safetensors"))
    args = [str(binary or BIN), "dump", "--device", device, "--model", str(tmp_path / model), "--batch", str(tmp_path / "batch.safetensors"),
            "--out", str(tmp_path / "ours.safetensors")]
    subprocess.run(args + (["--adapter", str(adapter)] if adapter else []) + list(extra), check=True, capture_output=True)
    return load_file(str(tmp_path / "ours.safetensors"))


def check_against_peft(ours, pm, logits, loss):
    """`soltrain dump`'s logits, loss and every adapter gradient against a PEFT model's (after loss.backward()), at
    the dense tolerances; returns the adapters by their saved names."""
    assert rel(ours["logits"].reshape(logits.shape), logits.detach()) <= 1e-5
    assert abs(float(ours["loss"].flatten()[0]) - loss.item()) / loss.item() <= 1e-6
    adapters = {n.replace(".default", ""): p for n, p in pm.named_parameters() if "lora_" in n}
    assert sorted("grad." + n for n in adapters) == sorted(n for n in ours if n.startswith("grad."))
    for name, p in adapters.items():
        assert rel(ours["grad." + name], p.grad) <= 1e-4, name
    return adapters


def check_lora_dump(tmp_path, pm, ids, targets, args):
    """`soltrain dump` with `args` (the model, its --adapter, a --qlora base, ...) on this batch against the PEFT model
    `pm` (its adapter saved where args point): logits, loss and every adapter gradient. Returns PEFT's logits."""
    import torch
    from safetensors.torch import load_file, save_file

    save_file({"input_ids": ids.int(), "targets": targets.int()}, str(tmp_path / "batch.safetensors"))
    subprocess.run([str(BIN), "dump", *args, "--batch", str(tmp_path / "batch.safetensors"), "--out",
                    str(tmp_path / "ours.safetensors")], check=True, capture_output=True)
    ours = load_file(str(tmp_path / "ours.safetensors"))
    pm.train(False)
    out = pm(input_ids=ids)
    loss = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
    loss.backward()
    check_against_peft(ours, pm, out.logits, loss)
    return out.logits


def check_full_gradients(ours, grads, tol=1e-5):
    """`soltrain dump`'s gradient of every weight of a full fine-tune against torch's ({name: grad}): a tied head's
    weight is the embedding's, one gradient. At least 10 compared."""
    checked = 0
    for name, g in grads.items():
        key = "grad." + name
        if key not in ours:
            assert name == "lm_head.weight", name
            continue
        assert rel(ours[key], g) <= tol, (name, rel(ours[key], g))
        checked += 1
    assert checked >= 10


def tiny_moe(path, seed, vocab=300, kind="qwen3_moe", **keys):
    """A random Qwen3-MoE (or Qwen2-MoE, with its shared expert and q/k/v biases) written by transformers (every
    weight drawn fresh, norms and biases too), and the model."""
    import torch
    import transformers

    torch.manual_seed(seed)
    base = dict(vocab_size=vocab, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=3,
                max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False, router_aux_loss_coef=0.05,
                attn_implementation="eager")
    if kind == "qwen2_moe":
        base.update(shared_expert_intermediate_size=48)
    base.update(keys)
    config = (transformers.Qwen2MoeConfig if kind == "qwen2_moe" else transformers.Qwen3MoeConfig)(**base)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize(model)
    model.save_pretrained(path)
    return model


def hf_grad(model, name):
    """transformers 5 holds each layer's experts as [E, 2F, D] gate_up and [E, D, F] down parameters; its saved
    files (and soltrain) name them per expert."""
    params = dict(model.named_parameters())
    if ".experts." not in name:
        return params[name].grad
    prefix, rest = name.split(".experts.")
    e, proj = rest.split(".")[:2]
    if proj == "down_proj":
        return params[prefix + ".experts.down_proj"].grad[int(e)]
    g = params[prefix + ".experts.gate_up_proj"].grad[int(e)]
    half = g.shape[0] // 2
    return g[:half] if proj == "gate_proj" else g[half:]


def torch_updates(model, batches, step, max_grad_norm=1.0):
    """Updates of a transformers causal LM as a run (and soltrain.Model.step) makes them, one per (ids, targets)
    batch (targets already shifted): the mean cross-entropy over the counted targets, backward,
    clip_grad_norm_, then `step()` (the optimizers' updates). Returns the losses."""
    import torch

    losses = []
    for ids, targets in batches:
        model.zero_grad()
        logits = model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-100)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        losses.append(float(loss.detach()))
        step()
    return losses

