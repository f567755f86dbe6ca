"""Training configs as Python objects: the keyword arguments are the YAML file's keys (Axolotl's, Surogate's
and TRL's names, as `soltrain sft` reads them; see the README's key reference), checked by the same reader
when a Trainer is made, so a mistake is the CLI's one line raised as soltrain.ConfigError."""
from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import yaml


class TrainConfig:
    """A run's settings: `TrainConfig(model=..., output_dir=..., learning_rate=2e-5, lora=True, ...)`."""

    mode = "sft"

    def __init__(self, **keys: Any) -> None:
        from . import _schema

        _schema.check_names(keys, type(self).__name__)
        object.__setattr__(self, "_keys", dict(keys))
        # Relative paths in the keys are relative to this folder (a YAML file's own, or the working directory).
        object.__setattr__(self, "_base_dir", pathlib.Path.cwd())

    @classmethod
    def from_yaml(cls, path: str | os.PathLike) -> "TrainConfig":
        """The keys of a YAML config file; its relative paths stay relative to the file's folder."""
        path = pathlib.Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            from ._native import ConfigError

            raise ConfigError(f"{path}: config file not found or unreadable ({e.strerror})") from None
        keys = yaml.safe_load(text) or {}
        if not isinstance(keys, dict):
            from ._native import ConfigError

            raise ConfigError(f"{path}: expected a map of settings at the top level")
        config = cls(**keys)
        object.__setattr__(config, "_base_dir", path.resolve().parent)
        # The file as written, so errors name its lines; keys set later go to the reader as overrides.
        object.__setattr__(config, "_source", (path.resolve(), text, dict(keys)))
        return config

    def _reader_input(self) -> tuple[str, str, list[str]]:
        """(YAML text, where, overrides) for the native reader: a YAML file's own text with the keys changed
        since as overrides (errors then name the file's lines), or these keys as YAML."""
        source = self.__dict__.get("_source")
        if source is not None:
            path, text, loaded = source
            if all(k in self._keys for k in loaded):
                changed = [k for k, v in self._keys.items() if k not in loaded or loaded[k] != v]
                overrides = [f"{k}={json.dumps(_plain(self._keys[k]))}" for k in changed]
                return text, str(path), overrides
        return self.to_yaml(), str(self._base_dir / type(self).__name__), []

    def to_dict(self) -> dict[str, Any]:
        return dict(self._keys)

    def to_yaml(self, path: str | os.PathLike | None = None) -> str:
        """The config as YAML text (written to `path` too when given): `soltrain sft` runs the same file."""
        text = yaml.safe_dump(_plain(self._keys), sort_keys=False)
        if path is not None:
            pathlib.Path(path).write_text(text, encoding="utf-8")
        return text

    def replace(self, **keys: Any) -> "TrainConfig":
        """A copy with these keys set (on a from_yaml config, relative paths among them are relative to the
        working directory, as `soltrain sft --set` takes them; the file's own stay relative to the file)."""
        config = type(self)(**{**self._keys, **keys})
        object.__setattr__(config, "_base_dir", self._base_dir)
        if "_source" in self.__dict__:  # a YAML file's: keys set since go to the reader as overrides
            object.__setattr__(config, "_source", self.__dict__["_source"])
        return config

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # (not a key; and unpickling asks before _keys exists)
            raise AttributeError(name)
        try:
            return self._keys[name]
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no key {name!r} set") from None

    def __setattr__(self, name: str, value: Any) -> None:
        self._keys[name] = value

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self._keys.items())
        return f"{type(self).__name__}({inner})"


class SFTConfig(TrainConfig):
    mode = "sft"

    def __init__(self, **keys: Any) -> None:
        super().__init__(**keys)


class PTConfig(TrainConfig):
    mode = "pt"

    def __init__(self, **keys: Any) -> None:
        super().__init__(**keys)


class DPOConfig(TrainConfig):
    mode = "dpo"

    def __init__(self, **keys: Any) -> None:
        super().__init__(**keys)


class _PreferenceMethod(DPOConfig):
    """A preference run whose trainer TRL names by class: `rl` is the method (given, it must agree)."""

    rl = ""

    def __init__(self, **keys: Any) -> None:
        if keys.setdefault("rl", self.rl) != self.rl:
            from ._native import ConfigError

            raise ConfigError(f"{type(self).__name__}: rl is {self.rl} (got {keys['rl']!r})")
        super().__init__(**keys)


class ORPOConfig(_PreferenceMethod):
    rl = "orpo"


class KTOConfig(_PreferenceMethod):
    rl = "kto"


class RewardConfig(DPOConfig):
    """TRL's RewardConfig: preference pairs train a Bradley-Terry reward model (`reward_model: true`)."""

    def __init__(self, **keys: Any) -> None:
        if keys.setdefault("reward_model", True) is not True:
            from ._native import ConfigError

            raise ConfigError(f"RewardConfig: reward_model is true (got {keys['reward_model']!r})")
        super().__init__(**keys)


class PRMConfig(SFTConfig):
    """TRL's PRMConfig: stepwise_supervised rows train a process reward model (`process_reward_model: true`)."""

    def __init__(self, **keys: Any) -> None:
        if keys.setdefault("process_reward_model", True) is not True:
            from ._native import ConfigError

            raise ConfigError(f"PRMConfig: process_reward_model is true (got {keys['process_reward_model']!r})")
        super().__init__(**keys)


class GRPOConfig(TrainConfig):
    mode = "grpo"

    def __init__(self, **keys: Any) -> None:
        super().__init__(**keys)


def _document(cls: type, summary: str, command: str) -> None:
    """The class's docstring and signature from the engine's key table (help(), editors' hovers)."""
    from . import _schema

    cls.__doc__ = _schema.docstring(summary, command)
    cls.__init__.__signature__ = _schema.signature(command)  # type: ignore[attr-defined]


def _plain(value: Any) -> Any:
    """Paths as strings, tuples as lists: what YAML and the reader take."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


_document(SFTConfig, "Supervised fine-tuning (conversation, instruction or text datasets), as `soltrain sft`.", "sft")
_document(PTConfig, "(Continued) pretraining on text, every token trained, as `soltrain pt`.", "pt")
_document(DPOConfig, "Preference training (DPO, IPO, hinge; `rl` orpo, simpo, kto) on prompt / chosen / rejected rows, "
          "as `soltrain dpo`.",
          "dpo")
_document(ORPOConfig, "ORPO (TRL's ORPOConfig, no reference model) on prompt / chosen / rejected rows, as `soltrain dpo` "
          "with `rl: orpo`.", "dpo")
_document(KTOConfig, "KTO (TRL's KTOConfig) on unpaired prompt / completion / label rows, as `soltrain dpo` with "
          "`rl: kto`.", "dpo")
_document(RewardConfig, "A Bradley-Terry reward model (TRL's RewardConfig) on prompt / chosen / rejected rows: the model "
          "as its *ForSequenceClassification with one label, as `soltrain dpo` with `reward_model: true`.", "dpo")
_document(PRMConfig, "A process reward model (TRL's PRMConfig) on stepwise_supervised rows (prompt, completions, labels): "
          "the model as its *ForTokenClassification, each step's label at its last token, as `soltrain sft` with "
          "`process_reward_model: true`.", "sft")
_document(GRPOConfig, "Online RL (GRPO, TRL's GRPOConfig keys): completions of `prompt` rows generated by the model, "
          "scored by reward functions, as `soltrain grpo`.", "grpo")
