"""The Python configs' keyword arguments come from the engine's key table: their docstrings and signatures at
import, an unknown name refused at once with the closest key, and config.pyi (editors' type hints) equal to what
the table generates today (regenerate: python -c "import soltrain._schema as s; print(s.stub_text(), end='')" >
python/soltrain/config.pyi)."""
import inspect
import json
import pathlib
import subprocess

import pytest

import soltrain
from soltrain import _schema
from conftest import BIN


def test_stub_is_the_table():
    stub = pathlib.Path(soltrain.__file__).with_name("config.pyi").read_text()
    assert stub == _schema.stub_text(), "config.pyi drifted from the key table: regenerate it"


def test_python_sees_the_cli_table():
    cli = json.loads(subprocess.run([str(BIN), "config-keys", "--json"], check=True, capture_output=True,
                                    text=True).stdout)
    assert [k["name"] for k in cli] == [k["name"] for k in _schema.keys()]


def test_docstring_signature_and_names():
    sig = inspect.signature(soltrain.SFTConfig)
    assert "learning_rate" in sig.parameters and "lora_rank" in sig.parameters
    assert "beta" not in sig.parameters  # a DPO key
    assert "beta" in inspect.signature(soltrain.DPOConfig).parameters
    assert "learning_rate" in soltrain.SFTConfig.__doc__ and "lr_scheduler" in soltrain.SFTConfig.__doc__
    with pytest.raises(soltrain.ConfigError, match='unknown key "lerning_rate".*learning_rate'):
        soltrain.SFTConfig(lerning_rate=1e-4)
    soltrain.SFTConfig(base_model="x", micro_batch_size=2, load_in_4bit=False)  # peers' names are keys too
