"""`soltrain grpo` end to end on CPU: the demo's tiny model is first taught a task by `sft` (repeat the word, half
the answers ending in "!"), then GRPO with a built-in reward (accuracy: the answer column, the word with "!") and
a Python one (ends with "!") must raise the mean reward from its first step to >= 0.9 (a 10-step mean within 100
steps), as far as TRL's GRPOTrainer takes the same model with the same settings, run live beside it; the run
resumes from a checkpoint; bad reward functions and empty prompts stop with one line and exit 2."""
import json
import os
import random
import re
import subprocess
import textwrap

import pytest

from conftest import BIN, read_jsonl

REWARDS = textwrap.dedent("""\
    def exclaims(prompts, completions, completion_ids, **columns):
        assert "answer" in columns and len(columns["answer"]) == len(completions)
        return [1.0 if c[0]["content"].strip().endswith("!") else 0.0 for c in completions]

    def raises(prompts, completions, **kw):
        raise ValueError("no score today")

    def too_few(prompts, completions, **kw):
        return [1.0]
""")


def run(args, cwd):
    return subprocess.run([str(BIN), *args], capture_output=True, text=True, cwd=cwd)


@pytest.fixture(scope="module")
def taught(demo, tmp_path_factory):
    """The demo model after sft on the task; the GRPO prompts beside it."""
    d = tmp_path_factory.mktemp("grpo-task")
    words = [json.loads(line)["messages"][0]["content"] for line in (demo / "train.jsonl").read_text().splitlines()]
    rng = random.Random(3)
    with open(d / "sft.jsonl", "w") as f:
        for w in words:
            answer = w + "!" if rng.random() < 0.5 else w
            f.write(json.dumps({"messages": [{"role": "user", "content": w},
                                             {"role": "assistant", "content": answer}]}) + "\n")
    with open(d / "prompts.jsonl", "w") as f:
        for w in words[:1000]:
            f.write(json.dumps({"prompt": [{"role": "user", "content": w}], "answer": w + "!"}) + "\n")
    (d / "task_rewards.py").write_text(REWARDS)
    (d / "sft.yaml").write_text(textwrap.dedent(f"""\
        model: {demo / 'model'}
        output_dir: {d / 'sft'}
        datasets:
          - path: {d / 'sft.jsonl'}
            type: conversation
        sequence_len: 256
        sample_packing: true
        per_device_train_batch_size: 4
        max_steps: 1200
        learning_rate: 3.0e-3
        lr_scheduler_type: cosine
        warmup_steps: 10
        weight_decay: 0.01
        adamw_beta2: 0.99
        logging_steps: 100
        device: cpu
        """))
    r = run(["sft", str(d / "sft.yaml")], d)
    assert r.returncode == 0, r.stderr[-2000:]
    return d


def grpo_config(d, out, **extra):
    cfg = {
        "model": str(d / "sft" / "model"),
        "output_dir": str(out),
        "datasets": [{"path": str(d / "prompts.jsonl")}],
        "reward_funcs": ["accuracy", "task_rewards:exclaims"],
        "reward_weights": [0.5, 0.5],
        "num_generations": 8,
        "max_prompt_length": 32,
        "max_completion_length": 12,
        "per_device_train_batch_size": 32,
        "gradient_accumulation_steps": 2,
        "max_steps": 100,
        "learning_rate": 1.0e-4,
        "lr_scheduler_type": "cosine",
        "adamw_beta2": 0.99,
        "temperature": 0.5,
        "logging_steps": 1,
        "save_steps": 50,
        "seed": 7,
        "device": "cpu",
    }
    cfg.update(extra)
    path = d / f"{out.name}.yaml"
    path.write_text(json.dumps(cfg))  # JSON is YAML
    return path


def trl_best_reward(d, out, cfg):
    """TRL's GRPOTrainer on the same model, prompts, rewards and settings: its best 10-step mean reward. (At
    learning_rate 3e-4 both TRL and soltrain unlearn the copying within 6 steps, accuracy 0.36 -> 0.0: this model
    needs the gentler 1e-4; temperature 0.5 keeps sampling's copying errors from capping the reward below 0.9.)"""
    import datasets
    import torch
    import transformers
    import trl

    def accuracy(prompts, completions, answer, **kw):  # the built-in's rule for a text answer
        return [1.0 if " ".join(c[0]["content"].split()).lower() == a.lower() else 0.0
                for c, a in zip(completions, answer)]

    def exclaims(prompts, completions, **kw):
        return [1.0 if c[0]["content"].strip().endswith("!") else 0.0 for c in completions]

    args = trl.GRPOConfig(output_dir=str(out), per_device_train_batch_size=cfg["per_device_train_batch_size"],
                          gradient_accumulation_steps=cfg["gradient_accumulation_steps"],
                          num_generations=cfg["num_generations"], max_completion_length=cfg["max_completion_length"],
                          learning_rate=cfg["learning_rate"], lr_scheduler_type=cfg["lr_scheduler_type"],
                          adam_beta2=cfg["adamw_beta2"], temperature=cfg["temperature"], max_steps=cfg["max_steps"],
                          reward_weights=cfg["reward_weights"], seed=cfg["seed"], logging_steps=1, use_cpu=True,
                          bf16=False, report_to=[], save_strategy="no", disable_tqdm=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(cfg["model"], dtype=torch.float32)
    tok = transformers.AutoTokenizer.from_pretrained(cfg["model"])
    rows = read_jsonl(d / "prompts.jsonl")
    trainer = trl.GRPOTrainer(model=model, reward_funcs=[accuracy, exclaims], args=args, processing_class=tok,
                              train_dataset=datasets.Dataset.from_list(rows))
    trainer.train()
    rewards = [x["reward"] for x in trainer.state.log_history if "reward" in x]
    return max(sum(rewards[i:i + 10]) / 10 for i in range(len(rewards) - 9))


def test_grpo_raises_the_reward_and_resumes(taught, tmp_path):
    out = tmp_path / "grpo"
    cfg_path = grpo_config(taught, out)
    r = run(["grpo", str(cfg_path)], taught)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [x for x in read_jsonl(out / "metrics.jsonl") if "reward" in x]
    assert [x["step"] for x in rows] == list(range(1, 101))
    for key in ["rewards/accuracy/mean", "rewards/exclaims/mean", "reward_std", "frac_reward_zero_std",
                "completions/mean_length", "completions/clipped_ratio", "clip_ratio/region_mean", "loss"]:
        assert key in rows[0], key
    first = rows[0]["reward"]
    best = max(sum(x["reward"] for x in rows[i:i + 10]) / 10 for i in range(len(rows) - 9))
    trajectory = [round(x["reward"], 2) for x in rows]
    assert first <= 0.75, first  # the taught model ends with "!" about half the time
    assert best >= 0.9, trajectory  # reached within the 100 steps (10-step mean); measured 0.947-0.963 (seeds 1, 7)
    trl_best = trl_best_reward(taught, tmp_path / "trl", json.loads(cfg_path.read_text()))  # measured 0.952
    assert best >= trl_best - 0.1, (trl_best, trajectory)
    assert (out / "model" / "model.safetensors").exists() and (out / "checkpoint-100").is_dir()

    # Resume: 4 more steps from checkpoint-100, the metrics of the first 100 kept.
    r = run(["grpo", str(grpo_config(taught, out, max_steps=104, resume_from_checkpoint=True))], taught)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "checkpoint-100" in r.stderr
    steps = [x["step"] for x in read_jsonl(out / "metrics.jsonl") if "reward" in x]
    assert steps == list(range(1, 105)), steps


def test_generation_streams_through_fewer_rows_when_the_budget_is_short(taught, tmp_path):
    """A generation budget below what all 64 completions need: the most whole groups of 8 that fit are decoded
    together and the prompts stream through them (continuous batching); the run trains as before."""
    r = run(["grpo", str(grpo_config(taught, tmp_path / "all", max_steps=1))], taught)
    assert r.returncode == 0, r.stderr[-3000:]
    m = re.search(r"grpo: generation memory ([0-9.]+) (B|KiB|MiB|GiB) \(KV cache .* for 64 completions", r.stderr)
    assert m and "stream through" not in r.stderr, r.stderr[-3000:]
    need_gib = float(m.group(1)) * {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[m.group(2)] / 2**30
    out = tmp_path / "stream"
    r = run(["grpo", str(grpo_config(taught, out, max_steps=3, generation_memory_gib=need_gib * 0.5))], taught)
    assert r.returncode == 0, r.stderr[-3000:]
    m = re.search(r"the 64 completions of an update stream through (\d+) rows", r.stderr)
    assert m and 8 <= int(m.group(1)) < 64 and int(m.group(1)) % 8 == 0, r.stderr[-3000:]
    rows = [x for x in read_jsonl(out / "metrics.jsonl") if "reward" in x]
    assert [x["step"] for x in rows] == [1, 2, 3] and all(0 < x["completions/mean_length"] <= 12 for x in rows), rows


def test_use_vllm_turns_on_the_sampling_correction_over_the_engines_log_probs(taught, tmp_path):
    """use_vllm: true (a TRL config's): soltrain still generates in its own engine, and TRL's importance-sampling
    correction (vllm_importance_sampling_*, sequence_mask at 3 by TRL's default) runs over the log-probs the sampler
    reports. On the CPU the engine and the trainer compute in fp32 from the same weights, so each token's sampling
    log-prob must equal the trainer's within rounding: the ratios are 1 (a wrong token, position or temperature
    would show here as a difference of order 1). Bounds the wrong way round: one line, exit 2."""
    out = tmp_path / "vllm"
    r = run(["grpo", str(grpo_config(taught, out, max_steps=2, use_vllm=True, temperature=0.7, top_k=20))], taught)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "use_vllm: soltrain generates in its own engine" in r.stderr, r.stderr[-3000:]
    assert "sampling correction sequence_mask" in r.stderr, r.stderr[-3000:]
    rows = [x for x in read_jsonl(out / "metrics.jsonl") if "reward" in x]
    assert len(rows) == 2, rows
    for x in rows:
        # top_k 20 renormalises the sampled distribution: its log-probs sit above the trainer's full softmax by
        # the log of the kept mass, at most a little (the 20 likeliest of a taught model hold nearly all of it)
        assert 0 <= x["sampling/sampling_logp_difference/max"] < 0.05, x
        assert 0.9 < x["sampling/importance_sampling_ratio/min"] <= x["sampling/importance_sampling_ratio/max"] <= 1 + 1e-5, x
    out = tmp_path / "exact"
    r = run(["grpo", str(grpo_config(taught, out, max_steps=1, vllm_importance_sampling_correction=True,
                                     vllm_importance_sampling_mode="token_truncate"))], taught)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "applied to the log-probs of soltrain's generation engine" in r.stderr, r.stderr[-3000:]
    x = [x for x in read_jsonl(out / "metrics.jsonl") if "reward" in x][0]
    assert x["sampling/sampling_logp_difference/max"] < 1e-4, x  # no top_k: the same distribution exactly
    assert abs(x["sampling/importance_sampling_ratio/mean"] - 1) < 1e-4, x
    r = run(["grpo", str(grpo_config(taught, tmp_path / "bad", max_steps=1, use_vllm=True,
                                     vllm_importance_sampling_clip_min=2, vllm_importance_sampling_clip_max=1.5))],
            taught)
    assert r.returncode == 2, r.stderr[-3000:]
    assert "vllm_importance_sampling_clip_min 2 is above vllm_importance_sampling_clip_max 1.5" in \
        r.stderr.strip().splitlines()[-1], r.stderr[-2000:]
    assert not (tmp_path / "bad").exists()


def test_generation_overlap_is_one_step_off_policy(taught, tmp_path):
    """generation_overlap: the next batch generates from the update's starting weights (a second backend, a thread of
    its own) while the update trains, and the update waits for it before it changes the weights.
    (1) The concurrent run equals the same schedule run on one thread (SOLTRAIN_GRPO_OVERLAP_INLINE=1), metrics and
    saved weights bit for bit: a generation that read weights the update was changing would draw other tokens.
    (2) Its first update trains on the batch the serial run trains on (the same prompts, seeds and weights); its
    second does not (that batch came from the starting weights, the serial run's from the updated ones).
    (3) Each batch's old log-probs are the trainer's under the weights that sampled it: with TRL's correction on
    (token_truncate, no top_k) the sampler's log-probs equal them within rounding at every step (measured 9e-6 at
    most). Taken after the update instead (at the swap), they differed by 3e-2 to 0.12 (measured): far above 1e-4.
    What it is not built for (the fp8 recipe, full fine-tuning's frozen reference) gets one line and exit 2."""
    cfg = dict(max_steps=4, per_device_train_batch_size=16, gradient_accumulation_steps=2,
               vllm_importance_sampling_correction=True, vllm_importance_sampling_mode="token_truncate")
    timing = ("generation_seconds", "generation_tokens_per_second", "generation_wait_seconds", "tokens_per_s")

    def metrics(out):
        rows = [x for x in read_jsonl(out / "metrics.jsonl") if "reward" in x]
        return [{k: v for k, v in x.items() if k not in timing} for x in rows]

    runs = {}
    for name, overlap, env in [("threaded", True, {}), ("inline", True, {"SOLTRAIN_GRPO_OVERLAP_INLINE": "1"}),
                               ("serial", False, {})]:
        out = tmp_path / name
        r = subprocess.run([str(BIN), "grpo", str(grpo_config(taught, out, generation_overlap=overlap, **cfg))],
                           capture_output=True, text=True, cwd=taught, env={**os.environ, **env})
        assert r.returncode == 0, r.stderr[-3000:]
        runs[name] = metrics(out)
        assert [x["step"] for x in runs[name]] == [1, 2, 3, 4], runs[name]
    threaded, inline, serial = runs["threaded"], runs["inline"], runs["serial"]
    assert threaded == inline, (threaded, inline)
    assert (tmp_path / "threaded" / "model" / "model.safetensors").read_bytes() == \
        (tmp_path / "inline" / "model" / "model.safetensors").read_bytes()
    rows = [x for x in read_jsonl(tmp_path / "threaded" / "metrics.jsonl") if "reward" in x]
    assert all("generation_wait_seconds" in x for x in rows[1:]), rows
    for key in ("reward", "loss", "completions/mean_length"):
        assert threaded[0][key] == serial[0][key], (key, threaded[0], serial[0])
    assert threaded[1]["loss"] != serial[1]["loss"], (threaded[1], serial[1])
    for x in threaded:
        assert x["sampling/sampling_logp_difference/max"] < 1e-4, x
    for name, extra, message in [("fp8", {"recipe": "fp8-hybrid"}, "generation_overlap is not built for the fp8 recipe"),
                                 ("ref", {"beta": 0.1}, "generation_overlap is not built for beta > 0 with full")]:
        r = run(["grpo", str(grpo_config(taught, tmp_path / name, generation_overlap=True, max_steps=1, **extra))],
                taught)
        assert r.returncode == 2, r.stderr[-2000:]
        assert message in r.stderr.strip().splitlines()[-1], r.stderr[-2000:]
        assert not (tmp_path / name).exists()


def test_exact_deduplication_drops_repeated_prompt_rows(taught, tmp_path):
    """dataset_exact_deduplication in a grpo run drops rows whose every column repeats an earlier row's, as Axolotl's
    rl.py does for grpo (it was read and then not applied); a row differing only in another column stays."""
    rows = [json.loads(line) for line in (taught / "prompts.jsonl").read_text().splitlines()[:40]]
    dup = rows + rows[:15] + [dict(rows[0], answer="other")]
    (tmp_path / "dup.jsonl").write_text("".join(json.dumps(r) + "\n" for r in dup))
    cfg = grpo_config(taught, tmp_path / "d", datasets=[{"path": str(tmp_path / "dup.jsonl")}], max_steps=1,
                      dataset_exact_deduplication=True)
    r = run(["grpo", str(cfg)], taught)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "dataset_exact_deduplication: dropped 15 duplicate prompt rows, 41 left" in r.stderr, r.stderr[-3000:]


def test_full_fine_tuning_with_beta_keeps_the_starting_weights_as_reference(taught, tmp_path):
    """beta > 0 without LoRA: a frozen copy of the starting weights is the reference, so the first step's KL is 0
    exactly (policy = reference) and later ones are not; a resumed run's reference is still the starting model,
    not the checkpoint it resumes (else its first KL would be 0 again). The loss against TRL with this reference
    pass: test_grpo_loss.py's reference_pass cases."""
    out = tmp_path / "beta"
    cfg = dict(beta=0.1, max_steps=2, save_steps=2, learning_rate=3e-4, per_device_train_batch_size=16,
               gradient_accumulation_steps=1)
    r = run(["grpo", str(grpo_config(taught, out, **cfg))], taught)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "the reference is a frozen copy of the starting weights" in r.stderr
    kl = [x["kl"] for x in read_jsonl(out / "metrics.jsonl") if "reward" in x]
    assert kl[0] == 0 and kl[1] > 0, kl
    r = run(["grpo", str(grpo_config(taught, out, **{**cfg, "max_steps": 3}, resume_from_checkpoint=True))], taught)
    assert r.returncode == 0, r.stderr[-3000:]
    kl = [x["kl"] for x in read_jsonl(out / "metrics.jsonl") if "reward" in x]
    assert len(kl) == 3 and kl[2] > 0, kl


@pytest.mark.parametrize("funcs,message", [
    (["task_rewards:raises"], "reward function task_rewards:raises raised ValueError: no score today"),
    (["task_rewards:too_few"], "reward function task_rewards:too_few returned 1 values for 16 completions"),
    (["task_rewards:missing"], "reward function task_rewards:missing: cannot import it"),
    (["no_such_module:f"], "reward function no_such_module:f: cannot import it (ModuleNotFoundError"),
    (["acuracy"], "is neither a built-in reward (accuracy, think_format), module.path:function, an http(s):// "
                  "endpoint nor command:CMD"),
    (["accuracy", "command:exit 3"], "reward_funcs: command:exit 3 exited with code 3; its messages are above"),
    (["command:echo '[1]'"], "reward_funcs: command:echo '[1]' answered 1 values for 16 completions"),
])
def test_bad_reward_functions_stop_with_one_line(taught, tmp_path, funcs, message):
    cfg = grpo_config(taught, tmp_path / "bad", reward_funcs=funcs, reward_weights=None, max_steps=2,
                      per_device_train_batch_size=8)
    r = run(["grpo", str(cfg)], taught)
    assert r.returncode == 2, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert message in last, r.stderr[-2000:]
    assert "Traceback" not in r.stderr


def test_empty_prompt_and_bad_settings_stop_with_one_line(taught, tmp_path):
    (tmp_path / "empty.jsonl").write_text(json.dumps({"prompt": "ok", "answer": "a"}) + "\n" +
                                          json.dumps({"prompt": "", "answer": "b"}) + "\n")
    cfg = grpo_config(taught, tmp_path / "e", datasets=[{"path": str(tmp_path / "empty.jsonl")}], max_steps=1)
    r = run(["grpo", str(cfg)], taught)
    assert r.returncode == 2 and "empty.jsonl:2: the prompt is empty" in r.stderr, r.stderr[-2000:]
    cfg = grpo_config(taught, tmp_path / "g", num_generations=5)
    r = run(["grpo", str(cfg)], taught)
    assert r.returncode == 2 and "not a multiple of num_generations 5" in r.stderr, r.stderr[-2000:]
    cfg = grpo_config(taught, tmp_path / "k", beta=0.1, recipe="fp8-hybrid")
    r = run(["grpo", str(cfg)], taught)
    assert r.returncode == 2 and "beta 0.1 with full fine-tuning and the fp8-hybrid recipe" in r.stderr, \
        r.stderr[-2000:]
    cfg = grpo_config(taught, tmp_path / "m", generation_memory_gib=0.0001)
    r = run(["grpo", str(cfg)], taught)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 2 and "generation needs" in last and "more than generation_memory_gib 0.0001" in last, \
        r.stderr[-2000:]
    cfg = grpo_config(taught, tmp_path / "s")
    r = run(["sft", str(cfg)], taught)
    assert r.returncode == 2 and "reward_funcs is a GRPO key: run `soltrain grpo` or set rl: grpo" in r.stderr


def test_python_grpo_trainer_calls_reward_functions_in_process(taught, tmp_path):
    soltrain = pytest.importorskip("soltrain")
    rows = [json.loads(line) for line in (taught / "prompts.jsonl").read_text().splitlines()[:64]]
    seen = []

    def ends_with_bang(prompts, completions, completion_ids, answer, **kw):
        seen.append((len(completions), answer[0], type(completion_ids[0][0]).__name__))
        return [1.0 if c[0]["content"].endswith("!") else None for c in completions]

    cfg = soltrain.GRPOConfig(model=str(taught / "sft" / "model"), output_dir=str(tmp_path / "py"), num_generations=4,
                              max_prompt_length=32, max_completion_length=8, per_device_train_batch_size=8,
                              gradient_accumulation_steps=2, max_steps=2, learning_rate=1e-4, logging_steps=1,
                              device="cpu")
    trainer = soltrain.GRPOTrainer(cfg, reward_funcs=[ends_with_bang, "accuracy"], train_dataset=rows)
    out = trainer.train()
    assert out.global_step == 2 and len(seen) == 2 and seen[0][0] == 16 and seen[0][2] == "int"
    assert seen[0][1].endswith("!")  # the answer column, by name
    logged = [m for m in trainer.log_history if "reward" in m]
    assert len(logged) == 2 and "rewards/ends_with_bang/mean" in logged[0] and "rewards/accuracy/mean" in logged[0]

    def broken(prompts, completions, **kw):
        return [0.0] * (len(completions) - 1)

    trainer = soltrain.GRPOTrainer(cfg.replace(output_dir=str(tmp_path / "py2")), reward_funcs=[broken],
                                   train_dataset=rows)
    with pytest.raises(soltrain.SoltrainError, match="reward function broken returned 15 values for 16 completions"):
        trainer.train()


def test_stop_strings_end_completions(taught, tmp_path):
    """stop_strings (and TRL's generation_kwargs.stop): a completion ends at the token completing one, kept; the
    same run without them has completions that go on past it (else the check proves nothing)."""
    (taught / "seen_rewards.py").write_text(textwrap.dedent(f"""\
        import json
        def record(prompts, completions, **kw):
            with open({str(tmp_path / 'seen.jsonl')!r}, "a") as f:
                for c in completions:
                    f.write(json.dumps(c[0]["content"]) + "\\n")
            return [0.0] * len(completions)
        """))

    def texts(name, **extra):
        seen = tmp_path / "seen.jsonl"
        seen.unlink(missing_ok=True)
        cfg = grpo_config(taught, tmp_path / name, reward_funcs=["seen_rewards:record"], reward_weights=None,
                          max_steps=1, per_device_train_batch_size=32, gradient_accumulation_steps=1,
                          temperature=1.0, **extra)
        r = run(["grpo", str(cfg)], taught)
        assert r.returncode == 0, r.stderr[-2000:]
        return [json.loads(line) for line in seen.read_text().splitlines()]

    free = texts("free")
    stop = next((t[len(t) // 2] for t in free if len(t) >= 3), None)  # a character inside a completion
    assert stop is not None and any(stop in t[:-1] for t in free), free  # some completion goes on past it
    # The same seeds draw the same tokens until a row stops: each completion is the free one cut after the
    # stop's first occurrence.
    want = [t[:t.index(stop) + 1] if stop in t else t for t in free]
    assert want != free
    for i, extra in enumerate(({"stop_strings": [stop]}, {"generation_kwargs": {"stop": stop}})):
        assert texts(f"cut{i}", **extra) == want, extra
