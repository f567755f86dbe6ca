"""A model folder's tokenizer (tokenizer.json, byte-level BPE) and chat template (tokenizer_config.json's Jinja),
as the engine tokenizes and renders data: HF's ids and texts, character for character."""
from __future__ import annotations

import json
import os
from typing import Any

from ._native import native


class Tokenizer:
    def __init__(self, folder: str | os.PathLike) -> None:
        self._tok = native.Tokenizer(os.fspath(folder))

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike) -> "Tokenizer":
        return cls(folder)

    @property
    def vocab_size(self) -> int:
        return self._tok.vocab_size

    def encode(self, text: str) -> list[int]:
        """HF's Tokenizer.encode(text, add_special_tokens=False): added tokens in the text are matched."""
        return self._tok.encode(text)

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = False,
                            tokenize: bool = False, **variables: Any) -> str | list[int]:
        """transformers' apply_chat_template with the model's own template (enable_thinking=... and other
        template variables as keyword arguments)."""
        text = self._tok.render_chat(json.dumps({"messages": messages, "add_generation_prompt": add_generation_prompt,
                                                 **variables}))
        return self.encode(text) if tokenize else text
