"""The reference-free preference losses against TRL's own trainers, computed live on CPU torch: ORPO (TRL's
ORPOTrainer, as Axolotl's `rl: orpo` runs it: the odds-ratio term on the answers' mean log-probs plus the chosen
sequence's NLL over prompt and answer) and SimPO (TRL's CPOTrainer with loss_type simpo, as `rl: simpo`: the
margin-shifted sigmoid on mean log-probs plus cpo_alpha x the chosen answers' NLL). TRL's get_batch_loss_metrics
runs on fixed pairs through a transformers model and its loss is backpropagated; `soltrain dump --preference`
gets the same pairs as a batch file and must give the same loss, metrics and every gradient."""
import pathlib
import subprocess
from collections import defaultdict

import pytest

from conftest import BIN, check_full_gradients

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("trl")
from safetensors.torch import load_file, save_file  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAIRS = 4


@pytest.fixture(scope="module")
def peaked_model(tmp_path_factory):
    """The tiny Qwen3 with fresh random weights and a sharp head (large embeddings, tied): greedy answers get
    mean log-probs near 0, where ORPO's log(1 - p) is far from linear."""
    out = tmp_path_factory.mktemp("pref-model")
    model = transformers.AutoModelForCausalLM.from_pretrained(ROOT / "tests" / "fixtures" / "models" / "qwen3-tiny",
                                                              dtype=torch.float32)
    torch.manual_seed(23)
    with torch.no_grad():
        for n, p in model.named_parameters():
            scale = 0.25 if "embed" in n else (0.3 if p.ndim == 1 else 0.08)
            p.copy_(torch.randn_like(p) * scale + (1.0 if p.ndim == 1 else 0.0))
    model.save_pretrained(out)
    return out


def pairs_for(model_dir, seed):
    """Per pair: a random prompt, a chosen answer the model continues greedily (high mean log-prob) and a random
    rejected one, of other lengths."""
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    rnd = lambda n: [int(x) for x in torch.randint(1, 320, (n,), generator=g)]  # noqa: E731
    out = []
    for _ in range(PAIRS):
        prompt = rnd(int(torch.randint(3, 7, (1,), generator=g)))
        seq = list(prompt)
        with torch.no_grad():
            for _ in range(int(torch.randint(2, 6, (1,), generator=g))):
                seq.append(int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax()))
        out.append((prompt, seq[len(prompt):], rnd(int(torch.randint(2, 7, (1,), generator=g)))))
    return out


def trl_reference(model_dir, pairs, trainer_cls, **settings):
    """TRL's get_batch_loss_metrics on the pairs (its concatenated_forward and loss, on a trainer object given
    only the attributes those read) and the loss's gradients."""
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                              attn_implementation="eager")
    model.train(False)  # no dropout: TRL's trainers disable it

    def side(which):
        rows = [p + a for p, *ans in pairs for a in [ans[0 if which == "chosen" else 1]]]
        L = max(len(r) for r in rows)
        ids = torch.zeros(len(rows), L, dtype=torch.long)
        mask = torch.zeros(len(rows), L, dtype=torch.long)
        labels = torch.full((len(rows), L), -100, dtype=torch.long)
        for i, ((prompt, *_), r) in enumerate(zip(pairs, rows)):
            ids[i, :len(r)] = torch.tensor(r)
            mask[i, :len(r)] = 1
            labels[i, len(prompt):len(r)] = torch.tensor(r[len(prompt):])
        return {f"{which}_input_ids": ids, f"{which}_attention_mask": mask, f"{which}_labels": labels}

    batch = {**side("chosen"), **side("rejected")}
    trainer = object.__new__(trainer_cls)
    identity = lambda t: t  # noqa: E731  (one process: gathers return their input)
    import types
    trainer.__dict__.update(dict(
        is_encoder_decoder=False, padding_value=0, pad_token_id=0, aux_loss_enabled=False,
        accelerator=types.SimpleNamespace(device=torch.device("cpu"), gather_for_metrics=identity),
        _stored_metrics=defaultdict(lambda: defaultdict(list)), **settings))
    loss, metrics = trainer.get_batch_loss_metrics(model, batch)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return float(loss), metrics, grads


def soltrain_batch(pairs, orpo, path):
    """One row per answer (chosen, rejected of each pair), each a document of its own: the answer's tokens are
    targets (ORPO's chosen rows: the prompt's too, counted in prompt_targets)."""
    rows = [(p, a, kind == 0) for p, *ans in pairs for kind, a in enumerate(ans)]
    T = max(len(p) + len(a) for p, a, _ in rows)
    R = len(rows)
    ids = torch.zeros(R, T, dtype=torch.int32)
    targets = torch.full((R, T), -100, dtype=torch.int32)
    positions = torch.zeros(R, T, dtype=torch.int32)
    cu = [0]
    for r, (p, a, chosen) in enumerate(rows):
        seq = p + a
        ids[r, :len(seq)] = torch.tensor(seq, dtype=torch.int32)
        first = 0 if (orpo and chosen) else len(p) - 1
        for i in range(first, len(seq) - 1):
            targets[r, i] = seq[i + 1]
        positions[r, :len(seq)] = torch.arange(len(seq), dtype=torch.int32)
        positions[r, len(seq):] = torch.arange(T - len(seq), dtype=torch.int32)
        cu.append(r * T + len(seq))
        if len(seq) < T:
            cu.append((r + 1) * T)
    doc_of_row = [cu.index(r * T) for r in range(R)]
    tensors = {"input_ids": ids, "targets": targets, "positions": positions,
               "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
               "pairs": torch.tensor([[doc_of_row[2 * i], doc_of_row[2 * i + 1]] for i in range(len(pairs))],
                                     dtype=torch.int32)}
    if orpo:
        tensors["prompt_targets"] = torch.tensor([len(p) - 1 for p, *_ in pairs], dtype=torch.int32)
    save_file(tensors, str(path))


CASES = [
    ("orpo", dict(beta=0.1), []),
    ("orpo", dict(beta=0.7), []),
    ("simpo", dict(beta=2.0, loss_type="simpo", label_smoothing=0.0, cpo_alpha=0.0, simpo_gamma=0.5, alpha=0.0), []),
    ("simpo", dict(beta=0.1, loss_type="simpo", label_smoothing=0.1, cpo_alpha=1.0, simpo_gamma=0.3, alpha=0.0),
     ["--label-smoothing", "0.1", "--simpo-gamma", "0.3"]),
]


@pytest.mark.parametrize("loss,settings,extra", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_loss_metrics_and_gradients_match_trl(loss, settings, extra, peaked_model, tmp_path):
    from trl.experimental.cpo import CPOTrainer
    from trl.experimental.orpo import ORPOTrainer

    pairs = pairs_for(peaked_model, seed=len(extra) + int(settings["beta"] * 10))
    trl_loss, metrics, trl_grads = trl_reference(peaked_model, pairs, ORPOTrainer if loss == "orpo" else CPOTrainer,
                                                 **settings)
    if loss == "orpo":  # the greedy answers are likely: log(1 - p) is well away from -p
        assert metrics["logps/chosen"] > -1.5, metrics
    soltrain_batch(pairs, loss == "orpo", tmp_path / "batch.safetensors")
    cmd = [str(BIN), "dump", "--model", str(peaked_model), "--batch", str(tmp_path / "batch.safetensors"),
           "--out", str(tmp_path / "ours.safetensors"), "--preference", loss, "--beta", str(settings["beta"])] + extra
    if loss == "simpo":
        cmd += ["--nll-alpha", str(settings["cpo_alpha"])]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ours = load_file(str(tmp_path / "ours.safetensors"))
    assert abs(float(ours["loss"][0]) - trl_loss) <= 1e-5 * max(1.0, abs(trl_loss)), (float(ours["loss"][0]), trl_loss)
    for k in ["rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
              "logps/rejected"] + (["nll_loss"] if loss == "orpo" or settings["cpo_alpha"] > 0 else []):
        assert abs(float(ours[k][0]) - float(metrics[k])) <= 1e-5 * max(1.0, abs(float(metrics[k]))), (
            k, float(ours[k][0]), float(metrics[k]))
    check_full_gradients(ours, trl_grads)


def test_orpo_batch_without_prompt_targets_is_refused(peaked_model, tmp_path):
    pairs = pairs_for(peaked_model, seed=1)
    soltrain_batch(pairs, False, tmp_path / "batch.safetensors")
    r = subprocess.run([str(BIN), "dump", "--model", str(peaked_model), "--batch", str(tmp_path / "batch.safetensors"),
                        "--out", str(tmp_path / "o.safetensors"), "--preference", "orpo", "--beta", "0.1"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "needs prompt_targets" in r.stderr.strip().splitlines()[-1], r.stderr


# KTO (TRL's KTOTrainer, `rl: kto`): unpaired examples, each with a KL document (its prompt and the previous
# example's completion, the block's first taking the last one's, as TRL builds them), the reference the model
# before its weights moved (its log-probs precomputed, TRL's precompute_ref_logps), the KL estimate floored at 0.
def kto_examples(seed, n=6):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda k: [int(x) for x in torch.randint(1, 320, (k,), generator=g)]  # noqa: E731
    ex = [(rnd(int(torch.randint(3, 7, (1,), generator=g))), rnd(int(torch.randint(2, 7, (1,), generator=g))))
          for _ in range(n)]
    labels = [bool(x) for x in torch.randint(0, 2, (n,), generator=g)]
    labels[0], labels[1] = True, False  # both kinds
    kl = [(p, ex[(i - 1) % n][1]) for i, (p, _) in enumerate(ex)]
    return ex, kl, labels


def completion_logps(model, rows):
    """Σ log p of each row's completion tokens (prompt, completion pairs), one sequence at a time."""
    out = []
    for p, c in rows:
        seq = torch.tensor([p + c])
        logp = torch.log_softmax(model(input_ids=seq).logits[0, :-1].double(), -1)
        out.append(logp[torch.arange(len(p) - 1, len(p) + len(c) - 1), seq[0, len(p):]].sum())
    return torch.stack(out)


@pytest.mark.parametrize("loss_type", ["kto", "apo_zero_unpaired"])
def test_kto_loss_metrics_and_gradients_match_trl(peaked_model, tmp_path, loss_type):
    import types
    from trl import KTOTrainer

    ex, kl_rows, labels = kto_examples(seed=4)
    reference = transformers.AutoModelForCausalLM.from_pretrained(peaked_model, dtype=torch.float32)
    policy = transformers.AutoModelForCausalLM.from_pretrained(peaked_model, dtype=torch.float32)
    # the policy has moved from the reference, towards the KL documents' completions: log-ratios are not 0 and
    # the KL estimate is above its floor
    opt = torch.optim.SGD(policy.parameters(), lr=0.05)
    for _ in range(3):
        opt.zero_grad()
        (-completion_logps(policy, kl_rows).sum()).backward()
        opt.step()
    policy.zero_grad(set_to_none=True)
    with torch.no_grad():
        ref_ex, ref_kl = completion_logps(reference, ex), completion_logps(reference, kl_rows)
    policy.save_pretrained(tmp_path / "moved")

    def padded(rows):
        L = max(len(p) + len(c) for p, c in rows)
        ids = torch.zeros(len(rows), L, dtype=torch.long)
        att = torch.zeros(len(rows), L, dtype=torch.long)
        comp = torch.zeros(len(rows), L, dtype=torch.long)
        for i, (p, c) in enumerate(rows):
            ids[i, :len(p) + len(c)] = torch.tensor(p + c)
            att[i, :len(p) + len(c)] = 1
            comp[i, len(p):len(p) + len(c)] = 1
        return ids, att, comp

    def fused_head(input_ids, attention_mask, labels, **kw):  # what TRL's fused LM head returns: log p per target
        logits = policy(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]
        t = labels[:, 1:]
        lp = torch.log_softmax(logits, -1).gather(-1, t.clamp(min=0)[..., None])[..., 0] * (t != -100)
        zeros = torch.zeros_like(lp)
        return types.SimpleNamespace(log_probs=lp, entropy=zeros, mean_logits=zeros)

    ids, att, comp = padded(ex)
    kids, katt, kcomp = padded(kl_rows)
    batch = {"input_ids": ids, "attention_mask": att, "completion_mask": comp, "label": torch.tensor(labels),
             "KL_input_ids": kids, "KL_attention_mask": katt, "KL_completion_mask": kcomp,
             "ref_logps": ref_ex.float(), "ref_KL_logps": ref_kl.float()}
    trainer = object.__new__(KTOTrainer)
    identity = lambda t: t  # noqa: E731
    trainer.__dict__.update(dict(
        model=types.SimpleNamespace(training=True), calculate_KL=loss_type == "kto", precompute_ref_logps=True,
        loss_type=loss_type,
        beta=0.3, desirable_weight=1.3, undesirable_weight=0.7, aux_loss_enabled=False, _tp_size=1,
        _total_train_tokens=0, _metrics={"train": defaultdict(list)},
        accelerator=types.SimpleNamespace(device=torch.device("cpu"), gather_for_metrics=identity)))
    loss = trainer._compute_loss(fused_head, batch, False)
    loss.backward()
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    # kto: the floor is not what is compared; apo_zero_unpaired: TRL makes no KL estimate
    assert metrics["kl"] > 0 if loss_type == "kto" else metrics["kl"] == 0, metrics

    # soltrain's batch: example i in row 2i, its KL document in row 2i + 1; the reference sums from the file
    rows = [r for pair in zip(ex, kl_rows) for r in pair]
    T = max(len(p) + len(c) for p, c in rows)
    tids = torch.zeros(len(rows), T, dtype=torch.int32)
    targets = torch.full((len(rows), T), -100, dtype=torch.int32)
    for r, (p, c) in enumerate(rows):
        seq = p + c
        tids[r, :len(seq)] = torch.tensor(seq, dtype=torch.int32)
        for i in range(len(p) - 1, len(seq) - 1):
            targets[r, i] = seq[i + 1]
    ref_nll = torch.stack([-ref_ex, -ref_kl], 1).flatten().float()
    save_file({"input_ids": tids, "targets": targets,
               "pairs": torch.tensor([[2 * i, 2 * i + 1] for i in range(len(ex))], dtype=torch.int32),
               "desirable": torch.tensor(labels, dtype=torch.int32), "ref_nll": ref_nll},
              str(tmp_path / "batch.safetensors"))
    for f in peaked_model.iterdir():
        if f.name.startswith("tokenizer"):
            (tmp_path / "moved" / f.name).write_bytes(f.read_bytes())
    r = subprocess.run([str(BIN), "dump", "--model", str(tmp_path / "moved"), "--batch",
                        str(tmp_path / "batch.safetensors"), "--out", str(tmp_path / "ours.safetensors"),
                        "--preference", loss_type, "--beta", "0.3", "--desirable-weight", "1.3",
                        "--undesirable-weight", "0.7"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ours = load_file(str(tmp_path / "ours.safetensors"))
    assert abs(float(ours["loss"][0]) - float(loss)) <= 1e-5 * max(1.0, abs(float(loss))), (float(ours["loss"][0]),
                                                                                            float(loss))
    for k in ["kl", "rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen", "logps/rejected"]:
        assert abs(float(ours[k][0]) - float(metrics[k])) <= 1e-5 * max(1.0, abs(float(metrics[k]))), (
            k, float(ours[k][0]), float(metrics[k]))
    check_full_gradients(ours, {n: p.grad for n, p in policy.named_parameters() if p.grad is not None})
