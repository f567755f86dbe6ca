"""Early stopping (Axolotl's early_stopping_patience) against transformers' own EarlyStoppingCallback: the
validation losses soltrain logged are replayed through the callback and the Trainer's best-metric bookkeeping
(Trainer._determine_best_metric, called on a stand-in holding args and state), which must stop at the step
soltrain stopped at and name the same best step and loss; load_best_model_at_end leaves that checkpoint's
weights as the final model, and save_total_limit keeps it."""
import json
import pathlib
import types

import pytest

import soltrain
from conftest import read_jsonl

transformers = pytest.importorskip("transformers")


def hf_replay(evals, patience, threshold, eval_steps):
    """The step at which the Trainer with EarlyStoppingCallback stops (None: it does not) and its best step and
    loss, for evaluations [(step, eval_loss), ...]."""
    from transformers import EarlyStoppingCallback, Trainer, TrainerControl, TrainerState, TrainingArguments

    args = TrainingArguments(output_dir="unused", eval_strategy="steps", save_strategy="steps", eval_steps=eval_steps,
                             save_steps=eval_steps, load_best_model_at_end=True, metric_for_best_model="loss",
                             report_to=[], use_cpu=True)
    state, control = TrainerState(), TrainerControl()
    callback = EarlyStoppingCallback(early_stopping_patience=patience, early_stopping_threshold=threshold)
    callback.on_train_begin(args, state, control)
    trainer = types.SimpleNamespace(args=args, state=state)
    for step, loss in evals:
        state.global_step = step
        metrics = {"eval_loss": loss}
        # Trainer.evaluate runs the callbacks, then _evaluate records the best (this order).
        callback.on_evaluate(args, state, control, metrics)
        Trainer._determine_best_metric(trainer, metrics, None)
        if control.should_training_stop:
            return step, state.best_global_step, state.best_metric
    return None, state.best_global_step, state.best_metric


def config(demo, out, **keys):
    base = dict(model=str(demo / "model"), output_dir=str(out), sequence_len=256, per_device_train_batch_size=4,
                max_steps=40, learning_rate=2.0e-2, lr_scheduler_type="constant", logging_steps=1, eval_steps=2,
                save_steps=2, save_total_limit=1, early_stopping_patience=2, early_stopping_threshold=0.0,
                device="cpu")
    base.update(keys)
    return soltrain.SFTConfig(**base)


# The demo run's validation loss falls, rises, falls by ~0.12, then rises: without a threshold the Trainer stops at
# step 10 with step 6 best; with 0.15 the fall to step 6 is no gain and it stops there.
@pytest.mark.parametrize("threshold", [0.0, 0.15])
def test_stops_where_transformers_early_stopping_stops_and_keeps_the_best(demo, tmp_path, threshold):
    out = tmp_path / "run"
    trainer = soltrain.Trainer(config(demo, out, early_stopping_threshold=threshold),
                               train_dataset={"path": str(demo / "train.jsonl"), "type": "conversation"},
                               eval_dataset={"path": str(demo / "validation.jsonl"), "type": "conversation"})
    result = trainer.train()
    evals = [(m["step"], m["eval_loss"]) for m in read_jsonl(out / "metrics.jsonl") if "eval_loss" in m and m["step"] > 0]
    stop, best_step, best_loss = hf_replay(evals, patience=2, threshold=threshold, eval_steps=2)
    assert stop is not None and stop < 40, f"the reference did not stop: {evals}"  # the case under test
    assert result.stopped_early and result.global_step == stop
    assert evals[-1][0] == stop  # no evaluation after the stop
    if threshold > 0:  # the threshold decided it: without one the same losses do not stop there
        assert hf_replay(evals, patience=2, threshold=0.0, eval_steps=2)[0] != stop
    else:
        assert best_step < stop  # the best is an earlier checkpoint, restored
    # The best checkpoint survived save_total_limit: 1 beside the last one, and its HF trainer_state names it.
    kept = sorted(p.name for p in out.glob("checkpoint-*"))
    assert kept == sorted({f"checkpoint-{best_step}", f"checkpoint-{stop}"})
    hf_state = json.loads((out / f"checkpoint-{stop}" / "trainer_state.json").read_text())
    assert hf_state["best_global_step"] == best_step
    assert hf_state["best_metric"] == pytest.approx(best_loss, rel=1e-12)
    assert hf_state["best_model_checkpoint"] == str(out / f"checkpoint-{best_step}")
    # The final model is the best checkpoint's: its validation loss read back is the best one (fp32 on the CPU).
    assert trainer.evaluate()["eval_loss"] == pytest.approx(best_loss, rel=1e-6)


def test_load_best_model_at_end_false_keeps_the_last_model(demo, tmp_path):
    out = tmp_path / "last"
    trainer = soltrain.Trainer(config(demo, out, load_best_model_at_end=False),
                               train_dataset={"path": str(demo / "train.jsonl"), "type": "conversation"},
                               eval_dataset={"path": str(demo / "validation.jsonl"), "type": "conversation"})
    result = trainer.train()
    assert result.stopped_early
    evals = [m["eval_loss"] for m in read_jsonl(out / "metrics.jsonl") if "eval_loss" in m]
    assert trainer.evaluate()["eval_loss"] == pytest.approx(evals[-1], rel=1e-6)


def test_needs_evaluations_during_training(demo, tmp_path):
    with pytest.raises(soltrain.ConfigError, match="early_stopping_patience needs evaluations during training"):
        soltrain.Trainer(config(demo, tmp_path / "x", eval_steps=0, save_steps=0),
                         train_dataset={"path": str(demo / "train.jsonl"), "type": "conversation"},
                         eval_dataset={"path": str(demo / "validation.jsonl"), "type": "conversation"}).train()
