"""The config's keys, from the engine's own table (`soltrain config-keys --json`): the configs' docstrings,
signatures and early name checks come from it, and so does config.pyi (the type hints editors read), which
python/tests/test_schema.py holds to it."""
from __future__ import annotations

import difflib
import functools
import inspect
import json
from typing import Any

from ._native import native

_PY_TYPES = {"bool": "bool", "integer": "int", "number": "float", "string": "str", "path": "str | os.PathLike",
             "choice": "str", "list": "list[str] | str", "datasets": "list[Any] | str", "map": "dict[str, Any]"}


@functools.lru_cache(maxsize=None)
def keys() -> tuple[dict[str, Any], ...]:
    return tuple(json.loads(native.config_keys_json()))


@functools.lru_cache(maxsize=None)
def known_names() -> frozenset[str]:
    names = set(native.peer_key_names())
    for k in keys():
        names.add(k["name"])
        names.update(k["aliases"])
    return frozenset(names)


def check_names(given: dict[str, Any], cls_name: str) -> None:
    """An unknown keyword argument is the reader's one line, at once, with the closest key."""
    from ._native import ConfigError

    for name in given:
        if name not in known_names() and not native.is_peer_key(name):
            close = difflib.get_close_matches(name, sorted(known_names()), n=1)
            hint = f' (did you mean "{close[0]}"?)' if close else ""
            raise ConfigError(f'{cls_name}: unknown key "{name}"{hint}')


def docstring(summary: str, commands: str) -> str:
    lines = [summary, "", "Keyword arguments are the YAML config's keys (peers' names in brackets):", ""]
    for k in keys():
        if k["commands"] != "all" and commands not in k["commands"]:
            continue
        alias = f" [{', '.join(k['aliases'])}]" if k["aliases"] else ""
        default = f" Default: {k['default']}." if k["default"] else ""
        lines.append(f"    {k['name']}{alias} ({k['expected']}): {k['doc']}.{default}")
    return "\n".join(lines)


def signature(commands: str) -> inspect.Signature:
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)] + [
        inspect.Parameter(k["name"], inspect.Parameter.KEYWORD_ONLY, default=None,
                          annotation=f"{_PY_TYPES.get(k['type'], 'Any')} | None")
        for k in keys()
        if k["commands"] == "all" or commands in k["commands"]
    ]
    params.append(inspect.Parameter("keys", inspect.Parameter.VAR_KEYWORD, annotation="Any"))
    return inspect.Signature(params)


def stub_text() -> str:
    """config.pyi: each config class's keyword arguments with their types, for editors and type checkers."""
    out = ['"""Generated from the engine\'s key table by soltrain._schema.stub_text(); test_schema.py checks it."""',
           "import os", "from typing import Any", ""]
    for cls, commands, doc in (("SFTConfig", "sft", "Supervised fine-tuning."), ("PTConfig", "pt", "Pretraining."),
                               ("DPOConfig", "dpo", "Preference training."), ("GRPOConfig", "grpo", "Online RL (GRPO).")):
        out.append(f"class {cls}(TrainConfig):")
        out.append(f'    """{doc}"""')
        out.append("    def __init__(")
        out.append("        self,")
        out.append("        *,")
        for k in keys():
            if k["commands"] == "all" or commands in k["commands"]:
                out.append(f"        {k['name']}: {_PY_TYPES.get(k['type'], 'Any')} | None = None,")
        out.append("        **keys: Any,")
        out.append("    ) -> None: ...")
        out.append("")
    # TRL's trainer names for a preference method: DPOConfig's keywords, `rl` set
    for cls, doc in (("ORPOConfig", "ORPO (rl: orpo)."), ("KTOConfig", "KTO (rl: kto)."),
                     ("RewardConfig", "A Bradley-Terry reward model (reward_model: true).")):
        out += [f"class {cls}(DPOConfig):", f'    """{doc}"""', ""]
    out += ["class PRMConfig(SFTConfig):", '    """A process reward model (process_reward_model: true)."""', ""]
    out.append("class TrainConfig:")
    out.append("    mode: str")
    out.append("    def __init__(self, **keys: Any) -> None: ...")
    out.append("    @classmethod")
    out.append("    def from_yaml(cls, path: str | os.PathLike) -> TrainConfig: ...")
    out.append("    def to_dict(self) -> dict[str, Any]: ...")
    out.append("    def to_yaml(self, path: str | os.PathLike | None = None) -> str: ...")
    out.append("    def replace(self, **keys: Any) -> TrainConfig: ...")
    out.append("    def __getattr__(self, name: str) -> Any: ...")
    out.append("")
    return "\n".join(out)
