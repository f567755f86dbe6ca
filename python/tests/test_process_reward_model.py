"""Process reward models (Axolotl's process_reward_model, TRL's PRMTrainer) against transformers, computed live on
CPU torch: a transformers Qwen2ForTokenClassification (two labels, its score head with a bias) labels each token,
and its own loss (cross-entropy over the labelled tokens, the mean over the batch's) is backpropagated; `soltrain
dump --token-labels 2` gets the same rows as a batch file (the labels as targets at their own tokens) and must give
the same logits, loss and every gradient, score head and bias included. End to end, PRMConfig trains on
stepwise_supervised rows tokenized as TRL's PRMTrainer.tokenize_row does (its documented example), and the saved
folder loads in AutoModelForTokenClassification."""
import json
import pathlib
import subprocess

import pytest

from conftest import BIN, check_full_gradients, rel

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402

import soltrain  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def token_classifier(tmp_path_factory):
    """The tiny Qwen2 (q/k/v biases) as transformers' token classifier with two labels, every weight drawn fresh
    (score head and bias included)."""
    out = tmp_path_factory.mktemp("prm")
    cfg = transformers.AutoConfig.from_pretrained(ROOT / "tests" / "fixtures" / "models" / "qwen2-tiny-mqa-bias")
    cfg.num_labels = 2
    torch.manual_seed(17)
    model = transformers.Qwen2ForTokenClassification(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            scale = 1.0 if n.startswith("score") else (0.3 if p.ndim == 1 else 0.08)
            p.copy_(torch.randn_like(p) * scale + (1.0 if p.ndim == 1 and not n.startswith("score") else 0.0))
    model.save_pretrained(out)
    return out


def random_rows(seed, n=4, vocab=320):
    """Rows of other lengths, a label (0 or 1) on a few tokens each (a step's last), -100 elsewhere."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        length = int(torch.randint(6, 14, (1,), generator=g))
        ids = [int(x) for x in torch.randint(0, vocab, (length,), generator=g)]
        labels = [-100] * length
        for at in torch.randperm(length - 2, generator=g)[:3]:
            labels[int(at) + 2] = int(torch.randint(0, 2, (1,), generator=g))
        rows.append((ids, labels))
    return rows


def transformers_reference(model_dir, rows):
    """transformers' own loss (model(..., labels=...)) on the rows right-padded into one batch, its logits and the
    gradients (eval mode: TRL's PRMConfig disables dropout)."""
    model = transformers.AutoModelForTokenClassification.from_pretrained(model_dir, dtype=torch.float32,
                                                                         attn_implementation="eager")
    model.train(False)
    T = max(len(ids) for ids, _ in rows)
    ids = torch.tensor([i + [0] * (T - len(i)) for i, _ in rows])
    labels = torch.tensor([l + [-100] * (T - len(l)) for _, l in rows])
    mask = torch.tensor([[1] * len(i) + [0] * (T - len(i)) for i, _ in rows])
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return float(out.loss), out.logits.detach(), mask.bool(), grads


def soltrain_batch(rows, path, packed):
    """The labels are the targets at their own tokens; unpacked one row per sequence, packed end to end in one."""
    t = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    if packed:
        T = sum(len(i) for i, _ in rows) + 2
        ids, targets, positions, cu = [], [], [], [0]
        for i, l in rows:
            ids, targets, positions = ids + i, targets + l, positions + list(range(len(i)))
            cu.append(len(ids))
        positions += list(range(T - len(ids)))
        targets += [-100] * (T - len(ids))
        ids += [0] * (T - len(ids))
        cu.append(T)
        n_rows = 1
    else:
        T = max(len(i) for i, _ in rows)
        n_rows, ids, targets, positions, cu = len(rows), [], [], [], [0]
        for r, (i, l) in enumerate(rows):
            ids += i + [0] * (T - len(i))
            targets += l + [-100] * (T - len(i))
            positions += list(range(len(i))) + list(range(T - len(i)))
            cu.append(r * T + len(i))
            if len(i) < T:
                cu.append((r + 1) * T)
    save_file({"input_ids": t(ids).view(n_rows, T), "targets": t(targets).view(n_rows, T),
               "positions": t(positions).view(n_rows, T), "cu_seqlens": t(cu)}, str(path))
    return T


@pytest.mark.parametrize("packed", [False, True])
def test_loss_logits_and_gradients_match_transformers(token_classifier, tmp_path, packed):
    rows = random_rows(seed=9 if packed else 4)
    loss, logits, valid, grads = transformers_reference(token_classifier, rows)
    T = soltrain_batch(rows, tmp_path / "batch.safetensors", packed)
    r = subprocess.run([str(BIN), "dump", "--model", str(token_classifier), "--batch", str(tmp_path / "batch.safetensors"),
                        "--out", str(tmp_path / "ours.safetensors"), "--token-labels", "2"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ours = load_file(str(tmp_path / "ours.safetensors"))
    assert abs(float(ours["loss"][0]) - loss) <= 1e-5 * loss, (float(ours["loss"][0]), loss)
    flat = ours["logits"].reshape(-1, 2)
    if packed:
        mine = torch.cat([flat[sum(len(i) for i, _ in rows[:k]):][:len(rows[k][0])] for k in range(len(rows))])
    else:
        mine = flat.view(len(rows), T, 2)[valid]
    assert rel(mine, logits[valid]) <= 1e-5
    assert "grad.score.weight" in ours and "grad.score.bias" in ours
    check_full_gradients(ours, grads)


def test_a_causal_lm_folder_is_read_with_a_new_biased_head(tmp_path):
    """A causal LM read as a token classifier: its lm_head left unread, score.weight drawn and score.bias zero."""
    folder = ROOT / "tests" / "fixtures" / "models" / "qwen2-tiny-mqa-bias"
    rows = random_rows(seed=2)
    soltrain_batch(rows, tmp_path / "batch.safetensors", packed=False)
    r = subprocess.run([str(BIN), "dump", "--model", str(folder), "--batch", str(tmp_path / "batch.safetensors"),
                        "--out", str(tmp_path / "ours.safetensors"), "--token-labels", "3"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "score.bias is new" in r.stderr and "score.weight is new" in r.stderr, r.stderr
    ours = load_file(str(tmp_path / "ours.safetensors"))
    assert ours["logits"].shape[-1] == 3 and ours["grad.score.bias"].shape == (3,)


# TRL's PRMTrainer.tokenize_row docstring (trl v0.19, trl/trainer/prm_trainer.py), with the Qwen2.5 tokenizer (whose
# ids Qwen3's share): the prompt, then each step followed by "\n" (198), the step's label on that "\n".
TRL_EXAMPLE = {"prompt": "Which number is larger, 9.8 or 9.11?",
               "completions": ["11 is greater than 8.", "Hence, 9.11 > 9.8."], "labels": [True, False]}
TRL_IDS = [23085, 1372, 374, 8131, 11, 220, 24, 13, 23, 476, 220, 24, 13, 16, 16, 30, 16, 16, 374, 7046, 1091, 220,
           23, 13, 198, 39, 763, 11, 220, 24, 13, 16, 16, 861, 220, 24, 13, 23, 13, 198]
TRL_COMPLETION_LABELS = [-100] * 8 + [1] + [-100] * 14 + [0]


def test_stepwise_rows_are_tokenized_as_trl_documents_them(tmp_path):
    tok = ROOT / "build" / "tokenizers" / "qwen3"
    if not (tok / "tokenizer.json").exists():
        pytest.skip("the Qwen3 tokenizer is not in the build tree")
    data = tmp_path / "steps.jsonl"
    data.write_text(json.dumps(TRL_EXAMPLE) + "\n")
    r = subprocess.run([str(BIN), "tokenize", "--tokenizer", str(tok), "--data", f"{data}:stepwise_supervised",
                        "--out", str(tmp_path / "shards"), "--quiet"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    manifest = json.loads((tmp_path / "shards" / "manifest.json").read_text())
    assert manifest["token_labels"] is True
    name = manifest["shards"][0]["name"]
    ids = list(memoryview((tmp_path / "shards" / f"{name}.tokens").read_bytes()).cast("i"))
    mask = list((tmp_path / "shards" / f"{name}.mask").read_bytes())
    assert ids == TRL_IDS
    labels = [m - 1 if m else -100 for m in mask]  # (a mask byte holds label + 1)
    assert labels == [-100] * 16 + TRL_COMPLETION_LABELS


def math_shepherd_rows(n, seed):
    """trl-lib/math_shepherd's shape: a prompt, its steps and a correctness label per step."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        a, b = int(torch.randint(1, 50, (1,), generator=g)), int(torch.randint(1, 50, (1,), generator=g))
        right = bool(torch.rand(1, generator=g) < 0.5)
        rows.append({"prompt": f"What is {a} + {b}?",
                     "completions": [f"Add {a} and {b}.", f"The sum is {a + b if right else a + b + 1}."],
                     "labels": [True, right]})
    return rows


def transformers_eval_loss(model, tok, rows):
    """A transformers (or PEFT) token classifier's loss over rows tokenized by TRL's tokenize_row (the mean
    cross-entropy over every labelled token) and TRL's compute_accuracy (argmax against the labels)."""
    model.train(False)
    sep = tok.encode("\n", add_special_tokens=False)
    total, count, correct = 0.0, 0, 0
    with torch.no_grad():
        for row in rows:
            ids = tok(row["prompt"], add_special_tokens=False)["input_ids"]
            if tok.bos_token_id is not None:
                ids = [tok.bos_token_id] + ids
            labels = [-100] * len(ids)
            for step, label in zip(row["completions"], row["labels"]):
                s = tok(step, add_special_tokens=False)["input_ids"] + sep
                ids += s
                labels += [-100] * (len(s) - 1) + [int(label)]
            logits = model(input_ids=torch.tensor([ids])).logits[0]
            lab = torch.tensor(labels)
            total += float(torch.nn.functional.cross_entropy(logits, lab, ignore_index=-100, reduction="sum"))
            count += int((lab != -100).sum())
            correct += int((logits.argmax(-1)[lab != -100] == lab[lab != -100]).sum())
    return total / count, correct / count


def train_prm(demo, tmp_path, **keys):
    rows, held = math_shepherd_rows(40, seed=1), math_shepherd_rows(6, seed=2)
    cfg = soltrain.PRMConfig(model=str(demo / "model"), output_dir=str(tmp_path / "run"), max_steps=8,
                             per_device_train_batch_size=4, learning_rate=5e-4, sequence_len=64, sample_packing=False,
                             eval_steps=8, save_steps=0, logging_steps=1, **keys)
    trainer = soltrain.Trainer(cfg, train_dataset=rows, eval_dataset=held)
    out = trainer.train()
    assert out.global_step == 8
    evals = [e for e in trainer.log_history if "eval_loss" in e]
    assert evals, trainer.log_history
    return held, evals[-1]


def test_prm_config_trains_and_saves_a_token_classifier(demo, tmp_path):
    """PRMConfig on a list of rows (no type given: stepwise_supervised) trains; the saved folder is a
    Qwen3ForTokenClassification that transformers loads, and its loss on the validation rows (transformers'
    TokenClassification loss over the rows tokenized by TRL's rule) is the run's last eval loss."""
    held, last = train_prm(demo, tmp_path)
    folder = tmp_path / "run" / "model"
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForTokenClassification"] and len(config["id2label"]) == 2
    model = transformers.AutoModelForTokenClassification.from_pretrained(folder, dtype=torch.float32)
    tok = transformers.AutoTokenizer.from_pretrained(demo / "model")
    ref, accuracy = transformers_eval_loss(model, tok, held)
    assert abs(ref - last["eval_loss"]) <= 2e-3 * max(1.0, ref), (ref, last)
    assert abs(accuracy - last["eval_accuracy"]) <= 1e-9, (accuracy, last)


def test_lora_prm_is_peft_token_classification_adapter(demo, tmp_path):
    """With LoRA the adapter is PEFT's TOKEN_CLS one (score weight and bias trained in full beside it): PEFT's
    PeftModel on AutoModelForTokenClassification(num_labels=2) gives the run's last eval loss."""
    peft = pytest.importorskip("peft")
    held, last = train_prm(demo, tmp_path, adapter="lora", lora_r=8, lora_alpha=16,
                                lora_target_modules=["q_proj", "v_proj"])
    folder = tmp_path / "run" / "adapter"
    cfg = json.loads((folder / "adapter_config.json").read_text())
    assert cfg["task_type"] == "TOKEN_CLS" and cfg["modules_to_save"] == ["classifier", "score"]
    base = transformers.AutoModelForTokenClassification.from_pretrained(demo / "model", num_labels=2,
                                                                        dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(base, folder)
    tok = transformers.AutoTokenizer.from_pretrained(demo / "model")
    ref, accuracy = transformers_eval_loss(model, tok, held)
    assert abs(ref - last["eval_loss"]) <= 2e-3 * max(1.0, ref), (ref, last)
    assert abs(accuracy - last["eval_accuracy"]) <= 1e-9, (accuracy, last)
