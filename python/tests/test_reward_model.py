"""Bradley-Terry reward models against TRL's RewardTrainer, computed live on CPU torch: a transformers
Qwen3ForSequenceClassification (one label) scores each chosen and rejected sequence at its last token that is
not the pad token, and TRL's compute_loss (-log sigmoid(r_chosen - r_rejected), plus center_rewards_coefficient
x (r_chosen + r_rejected)^2) is backpropagated; `soltrain dump --reward` gets the same pairs as a batch file and
must give the same loss, TRL's metrics and every gradient, score head included."""
import pathlib
import subprocess
import types
from collections import defaultdict

import pytest

from conftest import BIN, check_full_gradients

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("trl")
from safetensors.torch import load_file, save_file  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAD = 7  # the pad token id (TRL: the tokenizer's pad, else eos): a trailing one is not the sequence's


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """The tiny Qwen3 as transformers' sequence classifier with one label, every weight drawn fresh (the score
    head's at a scale that gives rewards of a few units)."""
    out = tmp_path_factory.mktemp("reward-model")
    cfg = transformers.AutoConfig.from_pretrained(ROOT / "tests" / "fixtures" / "models" / "qwen3-tiny")
    cfg.num_labels = 1
    cfg.pad_token_id = PAD
    torch.manual_seed(31)
    model = transformers.Qwen3ForSequenceClassification(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            scale = 2.0 if n == "score.weight" else (0.3 if p.ndim == 1 else 0.08)
            p.copy_(torch.randn_like(p) * scale + (1.0 if p.ndim == 1 and n != "score.weight" else 0.0))
    model.save_pretrained(out)
    return out


def random_pairs(seed, n=5):
    """Per pair: a prompt and two answers of other lengths; some answers end with the pad token (as TRL's text
    rows do when eos is the pad token), one pad also inside a sequence (it counts there)."""
    g = torch.Generator().manual_seed(seed)
    rnd = lambda k: [int(x) for x in torch.randint(8, 320, (k,), generator=g)]  # noqa: E731
    pairs = []
    for i in range(n):
        prompt = rnd(int(torch.randint(2, 6, (1,), generator=g)))
        c, r = rnd(int(torch.randint(1, 6, (1,), generator=g))), rnd(int(torch.randint(1, 6, (1,), generator=g)))
        if i % 2 == 0:
            c = c + [PAD]
        if i == 1:
            r = [PAD] + r + [PAD, PAD]
        pairs.append((prompt + c, prompt + r))
    return pairs


def trl_reference(model_dir, pairs, center):
    """TRL's RewardTrainer.compute_loss on the pairs (its DataCollatorForPreference's batch; a trainer object given
    only the attributes compute_loss reads) and the loss's gradients."""
    from trl import RewardTrainer
    from trl.trainer.reward_trainer import DataCollatorForPreference

    model = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32,
                                                                            attn_implementation="eager")
    model.train(False)  # no dropout (TRL's disable_dropout); the mode compute_loss reads is the trainer's below
    batch = DataCollatorForPreference(pad_token_id=PAD)(
        [{"chosen_ids": c, "rejected_ids": r} for c, r in pairs])
    trainer = object.__new__(RewardTrainer)
    identity = lambda t: t  # noqa: E731  (one process: gathers return their input)
    trainer.__dict__.update(dict(
        model=types.SimpleNamespace(training=True), args=types.SimpleNamespace(center_rewards_coefficient=center),
        accelerator=types.SimpleNamespace(gather_for_metrics=identity, gather=identity), _tp_size=1,
        _total_train_tokens=0, _metrics={"train": defaultdict(list)}))
    loss = trainer.compute_loss(model, batch)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    return float(loss), metrics, grads


def soltrain_batch(pairs, path, packed):
    """Each sequence a document of its own (no targets: a reward model reads scores); unpacked one row per sequence,
    packed every sequence in one row end to end."""
    seqs = [s for c, r in pairs for s in (c, r)]
    if packed:
        T = sum(len(s) for s in seqs) + 3
        ids, positions, cu = [], [], [0]
        for s in seqs:
            ids += s
            positions += list(range(len(s)))
            cu.append(len(ids))
        positions += list(range(T - len(ids)))
        ids += [0] * (T - len(ids))
        cu.append(T)
        rows, docs = 1, list(range(len(seqs)))
    else:
        T = max(len(s) for s in seqs)
        rows, ids, positions, cu, docs = len(seqs), [], [], [0], []
        for r, s in enumerate(seqs):
            docs.append(len(cu) - 1)
            ids += s + [0] * (T - len(s))
            positions += list(range(len(s))) + list(range(T - len(s)))
            cu.append(r * T + len(s))
            if len(s) < T:
                cu.append((r + 1) * T)
    t = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    save_file({"input_ids": t(ids).view(rows, T), "targets": torch.full((rows, T), -100, dtype=torch.int32),
               "positions": t(positions).view(rows, T), "cu_seqlens": t(cu),
               "pairs": t(docs).view(-1, 2)}, str(path))


@pytest.mark.parametrize("center,packed", [(None, False), (0.01, True), (0.01, False), (None, True)])
def test_loss_metrics_and_gradients_match_trl(classifier, tmp_path, center, packed):
    pairs = random_pairs(seed=5 if packed else 3)
    trl_loss, metrics, trl_grads = trl_reference(classifier, pairs, center)
    assert 0 < metrics["accuracy"] < 1, metrics  # both outcomes among the pairs: the loss is not saturated
    soltrain_batch(pairs, tmp_path / "batch.safetensors", packed)
    cmd = [str(BIN), "dump", "--model", str(classifier), "--batch", str(tmp_path / "batch.safetensors"),
           "--out", str(tmp_path / "ours.safetensors"), "--reward"]
    if center is not None:
        cmd += ["--center-rewards-coefficient", str(center)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ours = load_file(str(tmp_path / "ours.safetensors"))
    assert abs(float(ours["loss"][0]) - trl_loss) <= 1e-5 * max(1.0, abs(trl_loss)), (float(ours["loss"][0]), trl_loss)
    for k in ["accuracy", "margin", "min_reward", "mean_reward", "max_reward"]:
        assert abs(float(ours[k][0]) - float(metrics[k])) <= 1e-5 * max(1.0, abs(float(metrics[k]))), (
            k, float(ours[k][0]), float(metrics[k]))
    assert "grad.score.weight" in ours
    check_full_gradients(ours, trl_grads)


def transformers_rewards(model, tok, pairs):
    """A transformers (or PEFT) sequence classifier's rewards of each pair's chosen and rejected answer, each
    conversation rendered by the tokenizer's chat template (as the run renders it), one sequence at a time."""
    model.train(False)
    rewards = []
    with torch.no_grad():
        for r in pairs:
            for answer in (r["chosen"], r["rejected"]):
                ids = tok.apply_chat_template([{"role": "user", "content": r["prompt"]},
                                               {"role": "assistant", "content": answer}], tokenize=True)
                ids = ids["input_ids"] if hasattr(ids, "keys") else ids
                rewards.append(float(model(input_ids=torch.tensor([ids])).logits[0, 0]))
    return torch.tensor(rewards[0::2]), torch.tensor(rewards[1::2])


def test_reward_config_trains_a_classifier_transformers_loads(demo, tmp_path):
    """soltrain.RewardConfig (TRL's name) on prompt / chosen / rejected rows from a list: the reward model learns
    (the demo's chosen answer is the reversed prompt), `soltrain dpo` with `reward_model: true` trains the same, and
    the saved folder loads in transformers' AutoModelForSequenceClassification, whose rewards on the validation
    pairs (each rendered by the chat template, scored at the last non-pad token) give the run's last evaluation."""
    import json

    import soltrain
    from conftest import read_jsonl

    rows = read_jsonl(demo / "dpo_train.jsonl")[:96]
    val = read_jsonl(demo / "dpo_validation.jsonl")[:24]
    (tmp_path / "val.jsonl").write_text("".join(json.dumps(r) + "\n" for r in val))
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    keys = dict(model=str(demo / "model"), sequence_len=64, per_device_train_batch_size=8, max_steps=12,
                learning_rate=2e-3, warmup_steps=1, logging_steps=1, eval_steps=12, device="cpu",
                validation_datasets=[{"path": str(tmp_path / "val.jsonl")}])
    cli = soltrain.RewardConfig(output_dir=str(tmp_path / "cli"), datasets=[{"path": str(tmp_path / "train.jsonl")}],
                                **keys)
    cli.to_yaml(tmp_path / "reward.yaml")
    subprocess.run([str(BIN), "dpo", str(tmp_path / "reward.yaml")], check=True, capture_output=True)
    logged = []
    out = soltrain.Trainer(soltrain.RewardConfig(output_dir=str(tmp_path / "py"), **keys), train_dataset=rows,
                           callbacks=[logged.append]).train()
    assert out.global_step == 12
    cli_metrics = read_jsonl(tmp_path / "cli" / "metrics.jsonl")
    assert [m["loss"] for m in logged] == pytest.approx([m["loss"] for m in cli_metrics if "loss" in m], rel=1e-6)
    assert all("accuracy" in m and "mean_reward" in m for m in logged)
    assert logged[-1]["loss"] < logged[0]["loss"] - 0.05, (logged[0], logged[-1])
    last_eval = {k: v for m in cli_metrics if m["step"] == 12 for k, v in m.items() if k.startswith("eval_")}

    folder = tmp_path / "cli" / "model"
    model = transformers.AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    assert model.config.num_labels == 1 and model.config.pad_token_id is not None
    rc, rr = transformers_rewards(model, tok, val)
    assert float((rc > rr).float().mean()) == pytest.approx(last_eval["eval_accuracy"], abs=1e-6)
    assert float((rc - rr).mean()) == pytest.approx(last_eval["eval_margin"], abs=1e-4)
    loss = float(-torch.nn.functional.logsigmoid(rc - rr).mean())
    assert loss == pytest.approx(last_eval["eval_loss"], abs=1e-4)
    with pytest.raises(soltrain.ConfigError, match="RewardConfig: reward_model is true"):
        soltrain.RewardConfig(reward_model=False)


def test_lora_reward_model_loads_in_peft(demo, tmp_path):
    """A LoRA reward model: the adapters and the score head (trained in full beside them) saved as PEFT's SEQ_CLS
    task saves them (modules_to_save; base_model.model.score.weight); PEFT's PeftModel on the base built as
    AutoModelForSequenceClassification(num_labels=1) gives the run's last evaluation on the validation pairs; a
    resumed run continues from the checkpoint's adapters and head; merging such an adapter is one line."""
    import json

    import soltrain
    from conftest import read_jsonl

    peft = pytest.importorskip("peft")
    rows = read_jsonl(demo / "dpo_train.jsonl")[:64]
    val = read_jsonl(demo / "dpo_validation.jsonl")[:16]
    (tmp_path / "val.jsonl").write_text("".join(json.dumps(r) + "\n" for r in val))
    keys = dict(model=str(demo / "model"), sequence_len=64, per_device_train_batch_size=8, max_steps=8,
                learning_rate=5e-3, warmup_steps=1, logging_steps=1, eval_steps=8, save_steps=4, device="cpu",
                adapter="lora", lora_r=8, lora_alpha=16, lora_target_modules=["q_proj", "v_proj"],
                validation_datasets=[{"path": str(tmp_path / "val.jsonl")}])
    logged = []
    soltrain.Trainer(soltrain.RewardConfig(output_dir=str(tmp_path / "run"), **keys), train_dataset=rows,
                     callbacks=[logged.append]).train()
    assert logged[-1]["loss"] < logged[0]["loss"], (logged[0], logged[-1])
    folder = tmp_path / "run" / "adapter"
    cfg = json.loads((folder / "adapter_config.json").read_text())
    assert cfg["task_type"] == "SEQ_CLS" and cfg["modules_to_save"] == ["classifier", "score"]
    last_eval = {k: v for m in read_jsonl(tmp_path / "run" / "metrics.jsonl") if m["step"] == 8 for k, v in m.items()
                 if k.startswith("eval_")}

    tok = transformers.AutoTokenizer.from_pretrained(demo / "model")
    pad = tok.convert_tokens_to_ids(tok.pad_token or tok.eos_token)
    base = transformers.AutoModelForSequenceClassification.from_pretrained(demo / "model", num_labels=1,
                                                                           pad_token_id=pad, dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(base, folder)
    rc, rr = transformers_rewards(model, tok, val)
    assert float((rc - rr).mean()) == pytest.approx(last_eval["eval_margin"], abs=1e-4)
    assert float(-torch.nn.functional.logsigmoid(rc - rr).mean()) == pytest.approx(last_eval["eval_loss"], abs=1e-4)

    # stopped at step 4 and resumed: the uninterrupted run's losses (the checkpoint holds adapters and score head)
    parts = soltrain.Trainer(soltrain.RewardConfig(output_dir=str(tmp_path / "parts"), **keys), train_dataset=rows)
    parts.add_callback(lambda m: m["step"] == 4 and parts.stop())
    assert parts.train().interrupted
    resumed = []
    parts.add_callback(resumed.append)
    parts.train(resume_from_checkpoint=True)
    assert [m["loss"] for m in resumed] == pytest.approx([m["loss"] for m in logged[4:]], rel=1e-6)
    with pytest.raises(soltrain.SoltrainError, match="merging a reward model.s adapter"):
        soltrain.Trainer(soltrain.RewardConfig(output_dir=str(tmp_path / "m"), merge_adapter=True, **keys),
                         train_dataset=rows).train()
