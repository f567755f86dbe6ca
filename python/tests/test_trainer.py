"""The Python Trainer against the CLI it wraps: the same config trains the same model bitwise from YAML, from
keyword arguments with rows in a list or a datasets.Dataset; callbacks see every logged step; a stop from a
callback checkpoints and a resume finishes the uninterrupted run's model bitwise; bad input is one line in a
typed exception."""
import json
import pathlib
import subprocess

import pytest

import soltrain
from conftest import BIN, read_jsonl


def demo_config(demo, out, **keys):
    base = dict(
        model=str(demo / "model"),
        output_dir=str(out),
        sequence_len=256,
        per_device_train_batch_size=4,
        max_steps=12,
        learning_rate=3.0e-3,
        lr_scheduler_type="cosine",
        warmup_steps=2,
        adamw_beta2=0.99,
        logging_steps=1,
        eval_steps=6,
        device="cpu",
    )
    base.update(keys)
    return soltrain.SFTConfig(**base)


def model_bytes(out):
    return (pathlib.Path(out) / "model" / "model.safetensors").read_bytes()


def cli_run(demo, tmp_path):
    """The reference: `soltrain sft` on the same keys, written as a YAML file."""
    cfg = demo_config(
        demo,
        tmp_path / "cli",
        datasets=[{"path": str(demo / "train.jsonl"), "type": "conversation"}],
        validation_datasets=[{"path": str(demo / "validation.jsonl"), "type": "conversation"}],
    )
    cfg.to_yaml(tmp_path / "cli.yaml")
    subprocess.run([str(BIN), "sft", str(tmp_path / "cli.yaml")], check=True, capture_output=True)
    return tmp_path / "cli"


def test_rows_from_a_list_train_what_the_cli_trains(demo, tmp_path):
    reference = cli_run(demo, tmp_path)
    rows = read_jsonl(demo / "train.jsonl")
    logged = []
    trainer = soltrain.Trainer(
        demo_config(demo, tmp_path / "py"),
        train_dataset=rows,
        eval_dataset={"path": str(demo / "validation.jsonl"), "type": "conversation"},
        callbacks=[logged.append],
    )
    out = trainer.train()
    assert out.global_step == 12 and not out.interrupted
    assert model_bytes(tmp_path / "py") == model_bytes(reference)
    # Every step logged once, with the CLI's metrics file's values.
    assert [m["step"] for m in logged] == list(range(1, 13))
    cli_losses = [m["loss"] for m in read_jsonl(reference / "metrics.jsonl") if "loss" in m and "eval_loss" not in m]
    assert [m["loss"] for m in logged] == pytest.approx(cli_losses, rel=1e-6)
    assert out.metrics["last_eval_loss"] < out.metrics["first_eval_loss"]
    assert trainer.log_history[0]["eval_loss"] == out.metrics["first_eval_loss"]
    # evaluate() reads the saved model back and reports the run's last validation loss exactly (fp32 CPU)
    ev = trainer.evaluate()
    assert ev["eval_loss"] == out.metrics["last_eval_loss"] and ev["model"].endswith("model")


def test_a_datasets_dataset_trains_as_its_rows(demo, tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = read_jsonl(demo / "train.jsonl")
    a = soltrain.Trainer(demo_config(demo, tmp_path / "list", eval_steps=0), train_dataset=rows)
    a.train()
    b = soltrain.Trainer(
        demo_config(demo, tmp_path / "hf", eval_steps=0), train_dataset=datasets.Dataset.from_list(rows)
    )
    b.train()
    assert model_bytes(tmp_path / "hf") == model_bytes(tmp_path / "list")


def test_from_yaml_is_the_cli_run(demo, tmp_path):
    reference = cli_run(demo, tmp_path)
    config = soltrain.SFTConfig.from_yaml(tmp_path / "cli.yaml")
    config.output_dir = str(tmp_path / "yaml")
    soltrain.Trainer(config).train()
    assert model_bytes(tmp_path / "yaml") == model_bytes(reference)
    assert config.to_dict()["max_steps"] == 12


def test_stop_from_a_callback_then_resume_is_bitwise(demo, tmp_path):
    rows = read_jsonl(demo / "train.jsonl")
    whole = soltrain.Trainer(demo_config(demo, tmp_path / "whole", eval_steps=0), train_dataset=rows)
    whole.train()

    parts = soltrain.Trainer(demo_config(demo, tmp_path / "parts", eval_steps=0), train_dataset=rows)

    def stop_at_5(metrics):
        if metrics["step"] == 5:
            parts.stop()

    parts.add_callback(stop_at_5)
    first = parts.train()
    assert first.interrupted and first.global_step == 5
    assert (tmp_path / "parts" / "checkpoint-5" / "trainer_state.json").exists()
    assert not (tmp_path / "parts" / "model").exists()
    second = parts.train(resume_from_checkpoint=True)
    assert second.global_step == 12 and not second.interrupted
    assert model_bytes(tmp_path / "parts") == model_bytes(tmp_path / "whole")
    saved = parts.save_model(tmp_path / "saved")
    assert (saved / "model.safetensors").read_bytes() == model_bytes(tmp_path / "whole")
    with pytest.raises(FileExistsError):
        parts.save_model(tmp_path / "saved")


def test_bad_input_is_one_line_in_a_typed_exception(demo, tmp_path):
    rows = read_jsonl(demo / "train.jsonl")
    with pytest.raises(soltrain.ConfigError, match=r'learning_rte.*learning_rate') as e:
        soltrain.Trainer(demo_config(demo, tmp_path / "a", learning_rte=1e-3), train_dataset=rows)
    assert "\n" not in str(e.value)
    with pytest.raises(soltrain.ConfigError, match="lr_scheduler_type"):
        soltrain.Trainer(demo_config(demo, tmp_path / "b", lr_scheduler_type="sawtooth"), train_dataset=rows)
    with pytest.raises(soltrain.DataError, match="row 1 is a str"):
        soltrain.Trainer(demo_config(demo, tmp_path / "c"), train_dataset=[rows[0], "not a row"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n{"messages": 5}\n')
    trainer = soltrain.Trainer(demo_config(demo, tmp_path / "d"), train_dataset=str(bad))
    with pytest.raises(soltrain.DataError) as e:
        trainer.train()
    assert "bad.jsonl:2" in str(e.value) and "\n" not in str(e.value)
    assert isinstance(e.value, soltrain.SoltrainError) and isinstance(e.value, ValueError)
    # A Python exception in a callback ends the run and arrives as itself.
    def boom(metrics):
        raise RuntimeError("from the callback")

    with pytest.raises(RuntimeError, match="from the callback"):
        soltrain.Trainer(demo_config(demo, tmp_path / "e"), train_dataset=rows, callbacks=[boom]).train()


def test_ctrl_c_checkpoints_at_a_step_boundary(demo, tmp_path):
    """SIGINT to a Python process in train(): the engine finishes the step, checkpoints, and train() returns
    interrupted (the interpreter lives on); a resume then finishes the run."""
    import os
    import signal
    import sys

    script = f"""
import json, sys, soltrain
rows = [json.loads(l) for l in open({str(demo / 'train.jsonl')!r})]
cfg = soltrain.SFTConfig(model={str(demo / 'model')!r}, output_dir={str(tmp_path / 'run')!r}, sequence_len=256,
                         per_device_train_batch_size=4, max_steps=400, learning_rate=3e-3, logging_steps=1, device="cpu")
def show(m):
    print("STEP", m["step"], flush=True)
out = soltrain.Trainer(cfg, train_dataset=rows, callbacks=[show]).train()
print("RESULT", out.interrupted, out.global_step, flush=True)
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env)
    for line in p.stdout:
        if line.startswith("STEP 3"):
            p.send_signal(signal.SIGINT)
            break
    rest, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-2000:]
    result = [l for l in rest.splitlines() if l.startswith("RESULT")]
    assert result and result[0].startswith("RESULT True"), rest + err[-2000:]
    step = int(result[0].split()[2])
    assert 3 <= step < 400
    assert (tmp_path / "run" / f"checkpoint-{step}" / "trainer_state.json").exists()
    assert "stopped by signal 2" in err


def test_keys_set_after_the_trainer_is_made_count(demo, tmp_path):
    """trainer.config is read again by train(): a key changed after the Trainer was made is not silently ignored."""
    trainer = soltrain.Trainer(demo_config(demo, tmp_path / "late", max_steps=2, eval_steps=0),
                               train_dataset=read_jsonl(demo / "train.jsonl"))
    trainer.config.max_steps = 3
    assert trainer.train().global_step == 3
    trainer.config.lerning_rate = 1.0  # a typo set late is still one line, at train()
    with pytest.raises(soltrain.ConfigError, match="lerning_rate"):
        trainer.train()


def test_kto_and_orpo_configs_run_their_methods_as_the_cli(demo, tmp_path):
    """TRL's class names: KTOConfig on unpaired rows from a list trains what `soltrain dpo` with `rl: kto` trains
    (the same losses, TRL's kl logged), ORPOConfig is `rl: orpo`; a contradicting `rl` is one line."""
    pairs = read_jsonl(demo / "dpo_train.jsonl")[:32]
    rows = [{"prompt": p["prompt"], "completion": p[k], "label": k == "chosen"} for p in pairs for k in ("chosen", "rejected")]
    keys = dict(model=str(demo / "model"), sequence_len=48, per_device_train_batch_size=4, max_steps=4,
                learning_rate=3e-3, logging_steps=1, lora=True, lora_rank=8, device="cpu")
    (tmp_path / "kto.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cli = soltrain.KTOConfig(output_dir=str(tmp_path / "cli"), datasets=[{"path": str(tmp_path / "kto.jsonl")}], **keys)
    assert cli.to_dict()["rl"] == "kto"
    cli.to_yaml(tmp_path / "kto.yaml")
    subprocess.run([str(BIN), "dpo", str(tmp_path / "kto.yaml")], check=True, capture_output=True)
    logged = []
    out = soltrain.Trainer(soltrain.KTOConfig(output_dir=str(tmp_path / "py"), **keys), train_dataset=rows,
                           callbacks=[logged.append]).train()
    assert out.global_step == 4
    cli_losses = [m["loss"] for m in read_jsonl(tmp_path / "cli" / "metrics.jsonl") if "loss" in m]
    assert [m["loss"] for m in logged] == pytest.approx(cli_losses, rel=1e-6)
    assert all("kl" in m for m in logged)
    assert soltrain.ORPOConfig(beta=0.2).to_dict()["rl"] == "orpo"
    with pytest.raises(soltrain.ConfigError, match="ORPOConfig: rl is orpo"):
        soltrain.ORPOConfig(rl="dpo")
