"""GRPO's loss, metrics and every gradient against TRL's GRPOTrainer computed live on CPU torch: TRL scores fixed
completions (its rollout_func hook stands in for generation) with fixed rewards, computes the advantages, the
sampling policy's log-probs (num_iterations 2, after which the weights move) and the reference's (beta > 0), and
its _compute_loss runs over the update's micro-batches; `soltrain dump --grpo` gets the same rows, rewards and
log-probs and must give the same loss, advantages, clip ratios and gradients, for every loss_type x scale_rewards
x beta x num_iterations and the sequence-level (GSPO) ratio."""
import itertools
import pathlib
import json
import subprocess

import pytest

from conftest import BIN, check_full_gradients

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
from safetensors.torch import load_file, save_file  # noqa: E402

PROMPTS, G, PROMPT_LEN, MAX_COMPLETION = 3, 4, 5, 7  # 12 completions, two micro-batches of 6


@pytest.fixture(scope="module")
def random_model(demo, tmp_path_factory):
    """The demo model's architecture and tokenizer with fresh random weights (norms too), saved."""
    out = tmp_path_factory.mktemp("grpo-model")
    model = transformers.AutoModelForCausalLM.from_pretrained(demo / "model", dtype=torch.float32)
    torch.manual_seed(11)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.ndim == 1 else 0.1) + (1.0 if p.ndim == 1 else 0.0))
    model.save_pretrained(out)
    tok = transformers.AutoTokenizer.from_pretrained(demo / "model")
    tok.save_pretrained(out)
    return out


def rollouts(tok, seed):
    """Prompt ids, completion ids (no EOS inside: every token counts) and rewards with ties and a zero-std group."""
    g = torch.Generator().manual_seed(seed)
    special = set(tok.all_special_ids)
    ordinary = [i for i in range(256) if i not in special]
    pick = lambda n: [ordinary[int(j)] for j in torch.randint(0, len(ordinary), (n,), generator=g)]  # noqa: E731
    prompts = [pick(PROMPT_LEN) for _ in range(PROMPTS)]
    completions = [pick(int(torch.randint(2, MAX_COMPLETION + 1, (1,), generator=g))) for _ in range(PROMPTS * G)]
    rewards = [float(x) for x in torch.randn(PROMPTS * G, generator=g)]
    rewards[4:8] = [0.5] * 4  # the second prompt's group: all equal (std 0)
    rewards[1] = rewards[2]
    return prompts, completions, rewards


def sampling_logprobs(model, prompts, completions, temperature, noise_seed):
    """What a generation engine would report: each completion token's log-prob under the model (logits /
    temperature), moved by seeded noise (an engine's numerics, or a policy a step behind)."""
    g = torch.Generator().manual_seed(noise_seed)
    out = []
    with torch.no_grad():
        for i, c in enumerate(completions):
            p = prompts[i // G]
            ids = torch.tensor([p + c])
            logp = torch.log_softmax(model(ids).logits[0].float() / temperature, -1)
            lp = [float(logp[len(p) - 1 + j, t]) for j, t in enumerate(c)]
            out.append([x + 0.25 * float(torch.randn(1, generator=g)) for x in lp])
    return out


def trl_reference(model_dir, tmp_path, cfg, prompts, completions, rewards, micro, correction=None):
    """correction: TRL's vllm_importance_sampling_* settings; the rollouts then report sampling log-probs and TRL
    takes the vLLM path for them (use_vllm set on the trainer after it is built: no vLLM is needed for it)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    texts = [f"p{i}" for i in range(PROMPTS)]
    reward_of = {tuple(c): r for c, r in zip(completions, rewards)}
    sampled = (sampling_logprobs(model, prompts, completions, cfg.get("temperature", 1.0), 17) if correction
               else [[0.0] * len(c) for c in completions])

    def rollout(batch_prompts, trainer):
        assert batch_prompts == [t for t in texts for _ in range(G)]
        return {"prompt_ids": [prompts[i // G] for i in range(PROMPTS * G)], "completion_ids": completions,
                "logprobs": sampled}

    def reward(prompts, completions, completion_ids, **kw):
        return [reward_of[tuple(c)] for c in completion_ids]

    args = trl.GRPOConfig(output_dir=str(tmp_path / "trl"), per_device_train_batch_size=PROMPTS * G // micro,
                          gradient_accumulation_steps=micro, num_generations=G,
                          max_completion_length=MAX_COMPLETION, report_to=[], use_cpu=True, bf16=False,
                          logging_steps=1, **cfg, **(correction or {}))
    trainer = trl.GRPOTrainer(model=model, reward_funcs=[reward], args=args, processing_class=tok,
                              train_dataset=datasets.Dataset.from_dict({"prompt": texts}), rollout_func=rollout)
    if correction:
        trainer.use_vllm = True
        trainer.vllm_importance_sampling_correction = True
        trainer._last_loaded_step = trainer.state.global_step  # (no weights to send to an engine)
    model.train()
    inputs = trainer._generate_and_score_completions([{"prompt": t} for t in texts for _ in range(G)])
    if cfg.get("num_iterations", 1) > 1:  # the second iteration: the weights have moved since sampling
        with torch.no_grad():
            torch.manual_seed(5)
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.02)
        model.save_pretrained(tmp_path / "moved")
    trainer.current_gradient_accumulation_steps = micro
    rows = PROMPTS * G // micro
    total = 0.0
    for m in range(micro):
        part = {k: (v[m * rows:(m + 1) * rows] if torch.is_tensor(v) and v.dim() >= 1 and v.shape[0] == PROMPTS * G
                    else v) for k, v in inputs.items()}
        loss = trainer._compute_loss(model, part)
        loss.backward()
        total += loss.item()
    metrics = {k: sum(v) / len(v) for k, v in trainer._metrics["train"].items() if v}
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return inputs, total, metrics, grads


def soltrain_rows(inputs):
    """TRL's left-padded prompts and right-padded completions as soltrain's rows: prompt, completion, padding;
    targets are the completion's counted tokens; the per-token log-probs placed at their targets' positions."""
    pid, pm = inputs["prompt_ids"], inputs["prompt_mask"]
    cid, cm = inputs["completion_ids"], inputs["completion_mask"]
    R = pid.shape[0]
    T = PROMPT_LEN + MAX_COMPLETION
    ids = torch.zeros(R, T, dtype=torch.int32)
    targets = torch.full((R, T), -100, dtype=torch.int32)
    place = torch.zeros(R, T, dtype=torch.long)  # where each completion token's target sits, per row
    for r in range(R):
        p = pid[r][pm[r].bool()]
        c = cid[r]
        n = int(cm[r].sum())
        row = torch.cat([p, c[:n]])
        ids[r, :len(row)] = row.int()
        for j in range(n):
            targets[r, len(p) - 1 + j] = int(c[j])
        place[r] = len(p) - 1
    return ids, targets, place


def per_token(values, inputs, place):
    """TRL's [R, completion] log-probs as soltrain's [R, T] NLLs (0 where no target)."""
    R, C = values.shape
    out = torch.zeros(R, PROMPT_LEN + MAX_COMPLETION)
    for r in range(R):
        n = int(inputs["completion_mask"][r].sum())
        out[r, int(place[r, 0]):int(place[r, 0]) + n] = -values[r, :n]
    return out


def rel(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    return float((a - b).norm() / max(float(b.norm()), 1e-30))


def dump_command(cfg, random_model, tmp_path, micro):
    """`soltrain dump --grpo` over the files the test wrote, for cfg's loss settings; the weights TRL moved after
    sampling (num_iterations > 1) beside the tokenizer soltrain reads."""
    model_dir = tmp_path / "moved" if cfg["num_iterations"] > 1 else random_model
    if cfg["num_iterations"] > 1:
        for f in random_model.iterdir():
            if f.name.startswith("tokenizer") or f.name.endswith(".jinja"):
                (model_dir / f.name).write_bytes(f.read_bytes())
    cmd = [str(BIN), "dump", "--model", str(model_dir), "--batch", str(tmp_path / "batch.safetensors"),
           "--out", str(tmp_path / "ours.safetensors"), "--grpo", str(tmp_path / "grpo.safetensors"),
           "--num-generations", str(G), "--micro-batches", str(micro), "--max-completion-length", str(MAX_COMPLETION),
           "--loss-type", cfg["loss_type"], "--scale-rewards", cfg["scale_rewards"], "--beta", str(cfg["beta"]),
           "--importance-sampling-level", cfg.get("importance_sampling_level", "token"),
           "--epsilon", str(cfg.get("epsilon", 0.2)), "--temperature", str(cfg.get("temperature", 1.0))]
    for key, flag in [("epsilon_high", "--epsilon-high"), ("delta", "--delta"),
                      ("top_entropy_quantile", "--top-entropy-quantile")]:
        if key in cfg:
            cmd += [flag, str(cfg[key])]
    if "use_bias_correction_kl" in cfg:
        cmd += ["--use-bias-correction-kl", str(cfg["use_bias_correction_kl"]).lower()]
    return cmd


CASES = [dict(loss_type=lt, scale_rewards=sr, beta=beta, num_iterations=it)
         for lt, sr, beta, it in itertools.product(["grpo", "bnpo", "dr_grpo", "dapo"], ["group", "batch", "none"],
                                                   [0.0, 0.04], [1, 2])]
CASES += [dict(loss_type="grpo", scale_rewards="group", beta=0.04, num_iterations=2, importance_sampling_level="sequence"),
          dict(loss_type="bnpo", scale_rewards="group", beta=0.04, num_iterations=2, use_bias_correction_kl=False,
               delta=1.01),
          dict(loss_type="dapo", scale_rewards="group", beta=0.0, num_iterations=2, importance_sampling_level="sequence",
               epsilon=0.05, epsilon_high=0.08, temperature=0.7)]
# Full fine-tuning's reference pass: soltrain computes the reference's log-probs itself, with the starting weights
# lent to the model (model/reference_weights.h, what `grpo` does with beta > 0), instead of reading TRL's.
CASES += [dict(loss_type=lt, scale_rewards="group", beta=0.04, num_iterations=it, reference_pass=True)
          for lt, it in [("dapo", 2), ("grpo", 1)]]
# TRL's top_entropy_quantile: the policy term at each micro-batch's high-entropy completion tokens only.
CASES += [dict(loss_type="dapo", scale_rewards="group", beta=0.04, num_iterations=2, top_entropy_quantile=0.5),
          dict(loss_type="grpo", scale_rewards="batch", beta=0.0, num_iterations=1, top_entropy_quantile=0.3),
          dict(loss_type="bnpo", scale_rewards="group", beta=0.04, num_iterations=2, top_entropy_quantile=0.6,
               importance_sampling_level="sequence")]


def case_id(c):
    return "-".join(f"{k}={v}" for k, v in c.items())


@pytest.mark.parametrize("cfg", CASES, ids=[case_id(c) for c in CASES])
def test_grpo_loss_and_gradients_match_trl(cfg, random_model, tmp_path):
    tok = transformers.AutoTokenizer.from_pretrained(random_model)
    prompts, completions, rewards = rollouts(tok, seed=len(case_id(cfg)))
    cfg = dict(cfg)
    reference_pass = cfg.pop("reference_pass", False)
    micro = 2
    # Small clips make ratios leave the trust region after the weights move: both clipped branches are exercised.
    cfg = {"epsilon": 0.02, **cfg} if cfg["num_iterations"] > 1 else cfg
    inputs, trl_loss, trl_metrics, trl_grads = trl_reference(random_model, tmp_path, cfg, prompts, completions,
                                                             rewards, micro)
    ids, targets, place = soltrain_rows(inputs)
    save_file({"input_ids": ids, "targets": targets}, str(tmp_path / "batch.safetensors"))
    grpo = {"rewards": torch.tensor(rewards, dtype=torch.float32)}
    if "old_per_token_logps" in inputs and inputs["old_per_token_logps"] is not None:
        grpo["old_nll"] = per_token(inputs["old_per_token_logps"], inputs, place).contiguous()
    if cfg["beta"] > 0 and not reference_pass:
        grpo["ref_nll"] = per_token(inputs["ref_per_token_logps"], inputs, place).contiguous()
    save_file(grpo, str(tmp_path / "grpo.safetensors"))
    cmd = dump_command(cfg, random_model, tmp_path, micro)
    if reference_pass:  # TRL's reference is the model before the weights moved
        cmd += ["--reference", str(random_model)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ours = load_file(str(tmp_path / "ours.safetensors"))

    assert rel(ours["advantages"], inputs["advantages"]) <= 1e-5
    assert abs(float(ours["loss"][0]) - trl_loss) <= 1e-5 * max(1.0, abs(trl_loss)), (float(ours["loss"][0]), trl_loss)
    if cfg["beta"] > 0:
        assert abs(float(ours["kl"][0]) - trl_metrics["kl"]) <= 1e-5 * max(1.0, trl_metrics["kl"])
    # TRL's entropy metric: the policy's softmax entropy (logits / temperature) over completion tokens
    assert trl_metrics["entropy"] > 0.1, trl_metrics
    assert abs(float(ours["entropy"][0]) - trl_metrics["entropy"]) <= 1e-5 * trl_metrics["entropy"], (
        float(ours["entropy"][0]), trl_metrics["entropy"])
    for k in ["clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "clip_ratio/low_min",
              "clip_ratio/high_max"]:
        assert abs(float(ours[k][0]) - trl_metrics[k]) <= 1e-6, (k, float(ours[k][0]), trl_metrics[k])
    check_full_gradients(ours, trl_grads)
    if cfg["num_iterations"] > 1:  # the moved weights clipped some ratios: the clipped branches were taken
        assert trl_metrics["clip_ratio/region_mean"] > 0, trl_metrics


def test_dump_refuses_what_it_cannot_use(random_model, tmp_path):
    """`dump --reference`: one line and exit 2 without --beta, and for a folder of another shape; so is
    `--sampling-correction` without the file's old_nll and sampling_nll. Nothing is written."""
    tok = transformers.AutoTokenizer.from_pretrained(random_model)
    prompts, completions, rewards = rollouts(tok, seed=3)
    ids = torch.tensor([(p + c + [0] * MAX_COMPLETION)[:PROMPT_LEN + MAX_COMPLETION]
                        for p, c in zip([p for p in prompts for _ in range(G)], completions)], dtype=torch.int32)
    save_file({"input_ids": ids, "targets": ids.clone()}, str(tmp_path / "batch.safetensors"))
    save_file({"rewards": torch.tensor(rewards, dtype=torch.float32)}, str(tmp_path / "grpo.safetensors"))
    other = pathlib.Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "models" / "qwen3-tiny"
    base = [str(BIN), "dump", "--model", str(random_model), "--batch", str(tmp_path / "batch.safetensors"),
            "--out", str(tmp_path / "o.safetensors"), "--grpo", str(tmp_path / "grpo.safetensors"),
            "--num-generations", str(G)]
    for extra, message in [(["--reference", str(random_model)], "the reference counts only with --beta > 0"),
                           (["--beta", "0.04", "--reference", str(other)], "not the model's shape"),
                           (["--sampling-correction", "token_mask"], "needs old_nll and sampling_nll")]:
        r = subprocess.run(base + extra, capture_output=True, text=True)
        last = r.stderr.strip().splitlines()[-1]
        assert r.returncode == 2 and message in last, r.stderr
        assert not (tmp_path / "o.safetensors").exists()


# TRL's importance-sampling correction for the generation engine's log-probs (vllm_importance_sampling_*): each mode,
# with bounds that clip or mask some ratios, at one and two iterations; soltrain reads the same sampling log-probs
# (the --grpo file's sampling_nll) and must give TRL's loss, ratios, metrics and gradients.
CORRECTIONS = [
    (dict(loss_type="dapo", scale_rewards="group", beta=0.0, num_iterations=1),
     dict(vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_max=1.2)),
    (dict(loss_type="grpo", scale_rewards="batch", beta=0.04, num_iterations=2),
     dict(vllm_importance_sampling_mode="token_mask", vllm_importance_sampling_clip_min=0.8,
          vllm_importance_sampling_clip_max=1.25)),
    (dict(loss_type="bnpo", scale_rewards="group", beta=0.0, num_iterations=1),
     dict(vllm_importance_sampling_mode="sequence_truncate", vllm_importance_sampling_clip_min=0.5,
          vllm_importance_sampling_clip_max=1.5)),
    (dict(loss_type="dr_grpo", scale_rewards="none", beta=0.04, num_iterations=2),
     dict(vllm_importance_sampling_mode="sequence_mask", vllm_importance_sampling_clip_max=1.4)),
    (dict(loss_type="dapo", scale_rewards="group", beta=0.0, num_iterations=1, importance_sampling_level="sequence",
          top_entropy_quantile=0.5),
     dict(vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_max=1.3)),
]


@pytest.mark.parametrize("cfg,correction", CORRECTIONS,
                         ids=[case_id({**c, **k}) for c, k in CORRECTIONS])
def test_sampling_correction_matches_trl(cfg, correction, random_model, tmp_path):
    tok = transformers.AutoTokenizer.from_pretrained(random_model)
    prompts, completions, rewards = rollouts(tok, seed=len(case_id(cfg)) + 7)
    micro = 2
    cfg = {"epsilon": 0.02, **cfg} if cfg["num_iterations"] > 1 else dict(cfg)
    inputs, trl_loss, trl_metrics, trl_grads = trl_reference(random_model, tmp_path, cfg, prompts, completions,
                                                             rewards, micro, correction)
    ratio = inputs["importance_sampling_ratio"]
    counted = inputs["completion_mask"].bool()
    seq = correction["vllm_importance_sampling_mode"].startswith("sequence")
    flat = ratio.flatten() if seq else ratio[counted]
    lo = correction.get("vllm_importance_sampling_clip_min") or 0.0
    hi = correction["vllm_importance_sampling_clip_max"]
    if correction["vllm_importance_sampling_mode"].endswith("truncate"):
        assert ((flat == hi) | (flat == lo)).any() and ((flat > lo) & (flat < hi)).any(), flat  # bounds bite
    else:
        assert (flat == 0).any() and (flat > 0).any(), flat
    ids, targets, place = soltrain_rows(inputs)
    save_file({"input_ids": ids, "targets": targets}, str(tmp_path / "batch.safetensors"))
    grpo = {"rewards": torch.tensor(rewards, dtype=torch.float32),
            "old_nll": per_token(inputs["old_per_token_logps"], inputs, place).contiguous(),
            "sampling_nll": per_token(inputs["sampling_per_token_logps"], inputs, place).contiguous()}
    if cfg["beta"] > 0:
        grpo["ref_nll"] = per_token(inputs["ref_per_token_logps"], inputs, place).contiguous()
    save_file(grpo, str(tmp_path / "grpo.safetensors"))
    cmd = dump_command(cfg, random_model, tmp_path, micro) + [
        "--sampling-correction", correction["vllm_importance_sampling_mode"], "--sampling-clip-max", str(hi)]
    if "vllm_importance_sampling_clip_min" in correction:
        cmd += ["--sampling-clip-min", str(correction["vllm_importance_sampling_clip_min"])]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ours = load_file(str(tmp_path / "ours.safetensors"))
    assert abs(float(ours["loss"][0]) - trl_loss) <= 1e-5 * max(1.0, abs(trl_loss)), (float(ours["loss"][0]), trl_loss)
    for k in ["sampling/sampling_logp_difference/mean", "sampling/sampling_logp_difference/max",
              "sampling/importance_sampling_ratio/min", "sampling/importance_sampling_ratio/mean",
              "sampling/importance_sampling_ratio/max", "clip_ratio/region_mean"]:
        assert abs(float(ours[k][0]) - trl_metrics[k]) <= 1e-5 * max(1.0, abs(trl_metrics[k])), (
            k, float(ours[k][0]), trl_metrics[k])
    check_full_gradients(ours, trl_grads)
    # Without the correction the loss differs: the ratios were not all 1
    i = cmd.index("--sampling-correction")
    plain = cmd[:i] + cmd[i + 2:]
    plain[plain.index(str(tmp_path / "ours.safetensors"))] = str(tmp_path / "plain.safetensors")
    assert subprocess.run(plain, capture_output=True, text=True).returncode == 0
    assert abs(float(load_file(str(tmp_path / "plain.safetensors"))["loss"][0]) - trl_loss) > 1e-4

