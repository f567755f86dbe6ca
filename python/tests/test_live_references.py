"""References computed in the test run by the peers themselves, on CPU torch: transformers' logits, loss and
every gradient of random tiny Qwen3 / Llama / Qwen2 / Mistral models (soltrain dump), PEFT adapters both ways
(tests/tools/check_peft.py: random ranks, alphas, rsLoRA, targets; gradients, PEFT loading our adapter files,
merges). Tolerances are the committed fixtures' (tests/test_reference_model.cpp: logits 1e-5, loss 1e-6,
gradients 1e-4)."""
import subprocess
import sys

import pytest

from conftest import BIN, ROOT, dump, randomize, reference_batch, rel

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file  # noqa: E402  (transformers brings safetensors)

COMMON = dict(vocab_size=300, max_position_embeddings=128, rms_norm_eps=1e-6, attn_implementation="eager")


def tiny(kind):
    if kind == "qwen3":
        return transformers.Qwen3Config(hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                        tie_word_embeddings=True, rope_theta=1e6, **COMMON)
    if kind == "llama":
        return transformers.LlamaConfig(hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False,
                                        rope_theta=1e4, **COMMON)
    if kind == "mistral":  # (its sliding window, 32, reaches past the batch's 24 tokens: see the test below)
        return transformers.MistralConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                                          tie_word_embeddings=False, rope_theta=1e6, sliding_window=32, **COMMON)
    return transformers.Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=1, tie_word_embeddings=False, rope_theta=1e4, **COMMON)


@pytest.mark.parametrize("kind", ["qwen3", "llama", "qwen2", "mistral"])
def test_logits_loss_and_gradients_match_transformers(kind, tmp_path):
    torch.manual_seed({"qwen3": 1, "llama": 2, "qwen2": 3, "mistral": 4}[kind])
    model = transformers.AutoModelForCausalLM.from_config(tiny(kind), dtype=torch.float32)
    randomize(model)
    model.save_pretrained(tmp_path / "model")
    ids, targets = reference_batch(300)
    ours = dump(tmp_path, ids, targets)

    model.train(False)
    logits = model(input_ids=ids).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
    loss.backward()
    assert rel(ours["logits"].reshape(logits.shape), logits.detach()) <= 1e-5
    assert abs(float(ours["loss"].flatten()[0]) - loss.item()) / loss.item() <= 1e-6
    checked = 0
    for name, p in model.named_parameters():
        key = "grad." + name
        if key not in ours:  # a tied head's weight is the embedding's, one gradient
            assert name == "lm_head.weight" and kind == "qwen3", name
            continue
        assert rel(ours[key], p.grad) <= 1e-4, name
        checked += 1
    assert checked == len([n for n in ours if n.startswith("grad.")]) >= 20


def test_mistral_past_its_sliding_window_is_refused_in_one_line(tmp_path):
    """Mistral's sliding window is not in soltrain's attention: a document whose scored tokens reach past it is
    refused (exit 2, one line) rather than computed with full attention, unlike transformers; within it, the
    window changes nothing (transformers' own logits with and without it agree there)."""
    torch.manual_seed(6)
    config = tiny("mistral")
    config.sliding_window = 16
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize(model)
    model.save_pretrained(tmp_path / "model")
    ids, targets = reference_batch(300)  # 24 tokens a row, the last 23 scored
    from safetensors.torch import save_file
    save_file({"input_ids": ids.int(), "targets": targets.int()}, str(tmp_path / "batch.safetensors"))
    r = subprocess.run([str(BIN), "dump", "--model", str(tmp_path / "model"), "--batch",
                        str(tmp_path / "batch.safetensors"), "--out", str(tmp_path / "ours.safetensors")],
                       capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert r.stderr == ("error: a document reaches 23 tokens, past the model's sliding_window of 16: sliding-window "
                        "attention is not built yet; lower sequence_len to 16 or drop the longer documents\n")
    # the same rows scored only within the window: transformers' windowed logits there are soltrain's
    short = targets.clone()
    short[:, 16:] = -100
    ours = dump(tmp_path, ids, short)
    model.train(False)
    logits = model(input_ids=ids).logits.detach()
    assert rel(ours["logits"].reshape(logits.shape)[:, :16], logits[:, :16]) <= 1e-5


def test_peft_adapters_both_ways():
    pytest.importorskip("peft")
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "tools" / "check_peft.py"), str(BIN), "--cases", "6",
                        "--seed", "7"], capture_output=True, text=True)
    assert r.returncode == 0 and "6 cases, 0 failures" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]



def trl_dpo_loss(per_token_logps, mask, ref_logps, loss_type, beta, loss_weights=None):
    """TRL's own DPOTrainer._compute_loss (trl 1.16), run on given per-token log-probs: a stand-in model returns
    them (and zeros for the metrics' entropy, logits and top-1), the reference's sums come precomputed. Rows are
    [chosen..., rejected...]; `mask` marks the answer tokens the log-probs count."""
    import types
    from collections import defaultdict

    from trl import DPOTrainer

    rows, length = per_token_logps.shape
    completion_mask = torch.zeros(rows, length + 1, dtype=torch.long)  # TRL shifts it by one: a leading 0 column
    completion_mask[:, 1:] = mask.long()
    out = types.SimpleNamespace(log_probs=per_token_logps * mask, entropy=torch.zeros(rows, length),
                                mean_logits=torch.zeros(rows, length), is_top1=torch.zeros(rows, length, dtype=torch.bool))
    identity = lambda t: t  # noqa: E731  (one process: gathers return their input)
    types_ = loss_type if isinstance(loss_type, list) else [loss_type]
    fake = types.SimpleNamespace(
        model=types.SimpleNamespace(training=False), accelerator=types.SimpleNamespace(
            device="cpu", gather_for_metrics=identity, gather=identity), aux_loss_enabled=False, ld_alpha=None,
        precompute_ref_logps=True, f_divergence_type="reverse_kl", loss_types=types_,
        loss_weights=loss_weights or [1.0] * len(types_), beta=beta, label_smoothing=0.0, use_weighting=False,
        _metrics=defaultdict(lambda: defaultdict(list)), _total_train_tokens=0, _tp_size=1)
    chosen_ref, rejected_ref = ref_logps.chunk(2)
    inputs = {"input_ids": torch.zeros(rows, length + 1, dtype=torch.long), "completion_mask": completion_mask,
              "attention_mask": torch.ones(rows, length + 1, dtype=torch.long), "ref_chosen_logps": chosen_ref,
              "ref_rejected_logps": rejected_ref}
    return float(DPOTrainer._compute_loss(fake, lambda **kw: out, inputs, False))


def test_dpo_fixture_losses_are_trls():
    """The DPO references the C++ tests hold soltrain's objective to (tests/fixtures/dpo, tests/test_dpo.cpp:
    loss and every gradient within 1e-5) are TRL's own losses: TRL's code run live on the fixture's pairs, with
    transformers' log-probs of each document and the fixture's reference sums. (cDPO's label_smoothing inside
    the sigmoid loss, the fixture's fourth variant, is no longer TRL's: trl 1.16's sigmoid ignores it.)"""
    pytest.importorskip("trl")
    fixture = load_file(str(ROOT / "tests" / "fixtures" / "dpo" / "qwen3-tiny.safetensors"))
    model = transformers.AutoModelForCausalLM.from_pretrained(ROOT / "tests" / "fixtures" / "models" / "qwen3-tiny",
                                                              dtype=torch.float32, attn_implementation="eager")
    model.train(False)
    ids, tgt, cu = fixture["input_ids"].flatten().long(), fixture["targets"].flatten().long(), fixture["cu_seqlens"]
    docs = []  # each document through the model alone (positions restart), its answer tokens' log-probs
    with torch.no_grad():
        for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
            logp = torch.log_softmax(model(input_ids=ids[None, a:b]).logits[0].double(), -1)
            t = tgt[a:b]
            docs.append((logp.gather(-1, t.clamp(min=0)[:, None])[:, 0], t != -100))
    pairs = fixture["pairs"].long()
    order = [int(p[0]) for p in pairs] + [int(p[1]) for p in pairs]  # chosen rows, then rejected rows
    length = max(len(docs[i][0]) for i in order)
    lp = torch.zeros(len(order), length, dtype=torch.float64)
    mask = torch.zeros(len(order), length, dtype=torch.bool)
    for r, i in enumerate(order):
        lp[r, : len(docs[i][0])], mask[r, : len(docs[i][1])] = docs[i][0], docs[i][1]
    ref = -fixture["ref_nll"].double()
    ref_logps = torch.cat([ref[:, 0], ref[:, 1]])
    for variant, loss_type, beta in (("sigmoid", "sigmoid", 0.1), ("ipo", "ipo", 0.1), ("hinge", "hinge", 0.5)):
        trl = trl_dpo_loss(lp, mask, ref_logps, loss_type, beta)
        assert abs(trl - float(fixture[variant + ".loss"])) <= 1e-5 * max(1.0, abs(trl)), variant
