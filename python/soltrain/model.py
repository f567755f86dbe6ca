"""Step-level training from code: a model held in the engine, with per-token log-probs, one update under
per-token loss weights you choose (your own objective: GRPO's advantages, a distillation weight), generation
and the save. Tensors go in as numpy arrays or torch tensors (CPU; copied only when their dtype or layout
needs it) and come out as numpy arrays, or torch tensors when torch tensors went in (through DLPack, no copy)."""
from __future__ import annotations

import json
import os
import pathlib
import tempfile
from typing import Any

import numpy as np

from ._native import native
from .config import TrainConfig


def _to_numpy(x: Any, dtype: Any) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor, wherever it is
        x = x.detach()
        if x.device.type != "cpu":
            x = x.cpu()
    a = np.ascontiguousarray(np.asarray(x), dtype=dtype)
    if a.ndim == 1:
        a = a[None, :]
    return a


def _like(result: np.ndarray, like: Any) -> Any:
    if hasattr(like, "detach"):
        import torch

        return torch.from_dlpack(result)
    return result


class Model:
    """`Model.from_pretrained(path, sequence_len=..., rows=..., lora=True, ...)`: keyword arguments are the
    config keys of a run (learning_rate, lora_rank, qlora_nf4, max_grad_norm, device, ...)."""

    def __init__(self, session: Any, config: TrainConfig) -> None:
        self._session = session
        self.config = config

    @classmethod
    def from_pretrained(
        cls, model: str | os.PathLike, *, sequence_len: int = 2048, rows: int = 1, device: str = "cpu", **keys: Any
    ) -> "Model":
        # A session reads no dataset and writes no run folder: the reader's required keys get placeholders.
        config = TrainConfig(
            model=os.fspath(model),
            sequence_len=sequence_len,
            device=device,
            output_dir=tempfile.gettempdir(),
            datasets=[{"path": "unused-by-a-model-session.jsonl"}],
            **keys,
        )
        text, where, overrides = config._reader_input()
        parsed = native.parse_config(text, where, overrides, "sft")
        return cls(native.Session(parsed, rows), config)

    @property
    def rows(self) -> int:
        return self._session.rows

    @property
    def sequence_len(self) -> int:
        return self._session.seq_len

    @property
    def vocab_size(self) -> int:
        return self._session.vocab_size

    def logprobs(self, input_ids: Any, targets: Any) -> Any:
        """log p(targets[r, t] | input_ids[r, :t+1]) for every token, [rows, sequence_len] float32; 0 where the
        target is -100. Targets are already shifted (targets[r, t] is the token after input_ids[r, t])."""
        ids, tgt = _to_numpy(input_ids, np.int32), _to_numpy(targets, np.int32)
        return _like(self._session.logprobs(ids, tgt), input_ids)

    def step(self, input_ids: Any, targets: Any, weights: Any = None, lr: float | None = None) -> dict[str, float]:
        """One optimizer update (clipping and AdamW as in a run). The loss is the mean cross-entropy over the
        counted targets without `weights`; with them, Σ weights[r, t] · (−log p(targets[r, t])), so weights are
        d loss / d NLL per token. Returns {"loss", "grad_norm"} (the norm before clipping)."""
        ids, tgt = _to_numpy(input_ids, np.int32), _to_numpy(targets, np.int32)
        w = None if weights is None else _to_numpy(weights, np.float32)
        rate = float(self.config.to_dict().get("learning_rate", 1e-5) if lr is None else lr)
        loss, norm = self._session.step(ids, tgt, w, rate)
        return {"loss": loss, "grad_norm": norm}

    def generate(
        self,
        prompt: Any,
        max_new_tokens: int = 256,
        *,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        seed: int = 0,
        eos_token_id: int | list[int] | None = None,
    ) -> list[int] | list[list[int]]:
        """New token ids after `prompt` (greedy at temperature 0), ending at an EOS id (included) or the budget.
        `prompt` is one sequence of ids, or a list of them (lengths may differ): those are generated together as
        one batch and a list of continuations comes back, prompt i sampling with seed + i. Sampling follows
        transformers' generate (repetition_penalty, temperature, top_k, top_p, min_p, in that order), drawn on the
        device. EOS ids default to the model folder's generation_config.json."""
        many = _is_batch(prompt)
        prompts = [_to_numpy(p, np.int32).reshape(-1).tolist() for p in (prompt if many else [prompt])]
        if eos_token_id is None:
            eos = _generation_eos(pathlib.Path(self.config.model))
        else:
            eos = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
        out = self._session.generate(
            prompts, max_new_tokens, temperature, top_k, top_p, min_p, repetition_penalty, seed, eos
        )
        return out if many else out[0]

    def save_pretrained(self, path: str | os.PathLike) -> None:
        """The model as an HF folder (the adapter as a PEFT folder with LoRA), written whole or not at all."""
        self._session.save(os.fspath(path))


def _is_batch(prompt: Any) -> bool:
    """A list of prompts (a 2-D array, or a sequence whose items are sequences) rather than one."""
    shape = getattr(prompt, "shape", None)
    if shape is not None:
        return len(shape) == 2
    return isinstance(prompt, (list, tuple)) and len(prompt) > 0 and not np.isscalar(prompt[0])


def _generation_eos(folder: pathlib.Path) -> list[int]:
    """generation_config.json's eos_token_id, else tokenizer_config.json's eos_token (as `soltrain generate`)."""
    try:
        eos = json.loads((folder / "generation_config.json").read_text()).get("eos_token_id")
    except (OSError, ValueError):
        eos = None
    if eos is not None:
        return [eos] if isinstance(eos, int) else list(eos)
    try:
        token = json.loads((folder / "tokenizer_config.json").read_text()).get("eos_token")
    except (OSError, ValueError):
        return []
    if isinstance(token, dict):
        token = token.get("content")
    if not isinstance(token, str) or not (folder / "tokenizer.json").exists():
        return []
    found = native.Tokenizer(os.fspath(folder)).token_to_id(token)
    return [] if found is None else [found]
