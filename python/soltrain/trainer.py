"""The Trainer: a config and datasets in, the run of `soltrain sft|pt|dpo` in this process, metrics out
through callbacks. TRL's conventions: Trainer(config, train_dataset=..., eval_dataset=...), train(),
save_model(path)."""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from ._native import DataError, native
from .config import SFTConfig, TrainConfig
from .rewards import RewardError, load, score


class TrainerCallback:
    """Subclass and override what you need; each gets the metrics as a dict (TRL's names)."""

    def on_log(self, metrics: dict[str, Any]) -> None:  # every logged step: loss, learning_rate, ...
        pass

    def on_evaluate(self, metrics: dict[str, Any]) -> None:  # every evaluation: eval_loss, ...
        pass


@dataclass
class TrainOutput:
    global_step: int
    training_loss: float  # the last logged step's loss
    metrics: dict[str, Any] = field(default_factory=dict)
    interrupted: bool = False  # stopped (Ctrl-C, SIGTERM or Trainer.stop()) after a checkpoint
    stopped_early: bool = False  # early_stopping_patience ended it (the final model was saved)


class Trainer:
    """Trains `config.model` on `train_dataset`: a file path or hub id, a list of dicts, any iterable of dict
    rows, or a Hugging Face `datasets.Dataset` (rows as the YAML datasets' files hold them: `messages`,
    `instruction`/`output`, `text`, or `prompt`/`chosen`/`rejected` for DPO)."""

    def __init__(
        self,
        config: TrainConfig,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        callbacks: Iterable[TrainerCallback | Callable[[dict], None]] | None = None,
    ) -> None:
        if not isinstance(config, TrainConfig):
            raise TypeError(f"config: expected soltrain.SFTConfig, PTConfig or DPOConfig, got {type(config).__name__}")
        self.config = config.replace()
        if train_dataset is not None:
            self.config.datasets = [_dataset_entry(train_dataset, "train_dataset", config)]
        if eval_dataset is not None:
            self.config.validation_datasets = [_dataset_entry(eval_dataset, "eval_dataset", config)]
        self.callbacks: list[Any] = list(callbacks or [])
        self.log_history: list[dict[str, Any]] = []
        self._stop = False
        self._bar: Any = None
        self._parse(self.config)  # a bad key or value fails here, as the CLI does at start

    def add_callback(self, callback: TrainerCallback | Callable[[dict], None]) -> None:
        self.callbacks.append(callback)

    def stop(self) -> None:
        """Asks the run to stop after the current step: it saves a checkpoint and train() returns."""
        self._stop = True

    def train(self, resume_from_checkpoint: bool | str | os.PathLike | None = None) -> TrainOutput:
        """Runs the training job (the config's output_dir gets what `soltrain sft` writes there). With
        `resume_from_checkpoint` (True: the newest checkpoint in output_dir, or a folder) it continues
        exactly where that checkpoint left off."""
        # Read again: keys set on trainer.config since the Trainer was made count (a stale copy would ignore them).
        config = self.config
        if resume_from_checkpoint is not None and resume_from_checkpoint is not False:
            value = resume_from_checkpoint if resume_from_checkpoint is True else os.fspath(resume_from_checkpoint)
            config = config.replace(resume_from_checkpoint=value)
        parsed = self._parse(config)
        self._stop = False
        self._bar = _notebook_progress_bar()
        try:
            result = native.run(parsed, self._on_log, self._on_evaluate, lambda: self._stop, self._rewards())
        finally:
            if self._bar is not None:
                self._bar.close()
        logged = [m for m in self.log_history if "loss" in m]
        return TrainOutput(
            global_step=result["steps"],
            training_loss=logged[-1]["loss"] if logged else float("nan"),
            metrics=result,
            interrupted=result["interrupted"],
            stopped_early=result.get("stopped_early", False),
        )

    def evaluate(self) -> dict[str, Any]:
        """The validation loss (mean over the answer tokens, one document per row) of the trained model or
        adapter in output_dir (before train(): of the config's model) on eval_dataset, as the run's evaluations
        compute it: {"eval_loss", "eval_tokens", "model"}."""
        metrics = native.evaluate(self._parse(self.config))
        self.log_history.append(metrics)
        return metrics

    def save_model(self, path: str | os.PathLike) -> pathlib.Path:
        """Copies the trained model (an HF folder) or adapter (a PEFT folder) to `path`, which must not exist."""
        out = pathlib.Path(self.config._base_dir) / pathlib.Path(self.config.output_dir)
        source = next((out / n for n in ("adapter", "model") if (out / n).is_dir()), None)
        if source is None:
            raise FileNotFoundError(f"{out}: no trained model or adapter yet: call train() first")
        path = pathlib.Path(path)
        if path.exists():
            raise FileExistsError(f"{path} exists: save_model writes a new folder and replaces nothing")
        staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent if str(path.parent) else "."))
        try:
            shutil.copytree(source, staging, dirs_exist_ok=True)
            staging.rename(path)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return path

    def _rewards(self) -> Callable[[str], str] | None:
        return None  # GRPOTrainer's reward functions

    def _parse(self, config: TrainConfig) -> Any:
        text, where, overrides = config._reader_input()
        return native.parse_config(text, where, overrides, config.mode)

    def _on_log(self, metrics: dict[str, Any]) -> None:
        self.log_history.append(metrics)
        if self._bar is not None:
            self._bar.total = metrics["total_steps"]
            self._bar.update(metrics["step"] - self._bar.n)
            self._bar.set_postfix(loss=f"{metrics['loss']:.4f}", lr=f"{metrics['learning_rate']:.2e}")
        for cb in self.callbacks:
            cb.on_log(metrics) if isinstance(cb, TrainerCallback) else cb(metrics)

    def _on_evaluate(self, metrics: dict[str, Any]) -> None:
        self.log_history.append(metrics)
        for cb in self.callbacks:
            if isinstance(cb, TrainerCallback):
                cb.on_evaluate(metrics)


class GRPOTrainer(Trainer):
    """Online RL (GRPO) from Python: `config` a GRPOConfig, `reward_funcs` callables with TRL's signature
    f(prompts, completions, completion_ids, **columns) -> list[float | None] (the dataset's other columns by
    name), called in this process, or names the YAML takes (built-in "accuracy", "think_format", or
    "module.path:function"); `train_dataset` rows with a `prompt` (text or a list of messages). A function that
    raises or returns the wrong count stops the run with soltrain.SoltrainError naming it."""

    def __init__(self, config: TrainConfig, reward_funcs: Any, train_dataset: Any = None,
                 callbacks: Iterable[TrainerCallback | Callable[[dict], None]] | None = None) -> None:
        from .config import GRPOConfig

        if not isinstance(config, GRPOConfig):
            raise TypeError(f"config: expected soltrain.GRPOConfig, got {type(config).__name__}")
        funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        if not funcs:
            raise ValueError("reward_funcs: give at least one reward function")
        specs, self._callables = [], {}
        for i, f in enumerate(funcs):
            if isinstance(f, str):
                specs.append(f)
            elif callable(f):
                spec = f"{getattr(f, '__module__', None) or 'python'}:{getattr(f, '__name__', f'reward_{i}')}"
                while spec in self._callables:
                    spec += "_"
                self._callables[spec] = f
                specs.append(spec)
            else:
                raise TypeError(f"reward_funcs[{i}]: {type(f).__name__} is neither callable nor a name")
        super().__init__(config.replace(reward_funcs=specs), train_dataset=train_dataset, callbacks=callbacks)

    def _rewards(self) -> Callable[[str], str] | None:
        if not self._callables:
            return None

        def call(request: str) -> str:
            req = json.loads(request)
            try:
                funcs = []
                for spec in req["functions"]:
                    if spec not in self._callables:  # a "module:function" name: imported here, as a YAML run would
                        self._callables[spec] = load(spec)
                    funcs.append((spec.rpartition(":")[2], self._callables[spec]))
                return json.dumps({"rewards": score(funcs, req)})
            except RewardError as e:
                return json.dumps({"error": str(e)})

        return call


def _notebook_progress_bar() -> Any:
    """In Jupyter the engine's own progress line (on stderr) goes to the kernel's log, not the cell: a tqdm
    widget there, moved on every logged step. In a terminal the engine's line is the progress bar."""
    try:
        shell = get_ipython().__class__.__name__  # type: ignore[name-defined]  # noqa: F821
    except NameError:
        return None
    if shell != "ZMQInteractiveShell":
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(desc="soltrain", unit="step")


def _cache_dir() -> pathlib.Path:
    root = os.environ.get("SOLTRAIN_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "soltrain"
    )
    return pathlib.Path(root) / "datasets"


def _dataset_entry(data: Any, name: str, config: TrainConfig) -> dict[str, Any]:
    """A dataset argument as a config's datasets entry: paths and hub ids as they are; rows written once to a
    JSONL file named by its content's hash (the same rows reuse the file and its tokenized shards)."""
    if isinstance(data, (str, os.PathLike)):
        return {"path": os.fspath(data)}
    if isinstance(data, dict):
        if "path" in data:  # a datasets entry as in YAML: {path, type, field_messages, ...}
            return dict(data)
        raise DataError(f"{name}: a dict is one row; pass a list of rows, or {{'path': ...}} for a file")
    if type(data).__name__ == "DatasetDict":
        raise DataError(f"{name}: a DatasetDict holds several splits: pass one, e.g. dataset['train']")
    lines = []
    for i, row in enumerate(data):
        if not isinstance(row, dict):
            raise DataError(f"{name}: row {i} is a {type(row).__name__}, expected a dict of fields")
        try:
            lines.append(json.dumps(row, ensure_ascii=False))
        except (TypeError, ValueError) as e:
            raise DataError(f"{name}: row {i}: not JSON-serialisable ({e})") from None
    if not lines:
        raise DataError(f"{name}: no rows")
    body = ("\n".join(lines) + "\n").encode("utf-8")
    folder = _cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{hashlib.sha256(body).hexdigest()[:32]}.jsonl"
    if not path.exists():
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".rows.", suffix=".jsonl")
        with os.fdopen(fd, "wb") as f:
            f.write(body)
        os.replace(tmp, path)
    return {"path": str(path)}
