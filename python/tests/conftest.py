"""Fixtures for the Python API's tests: the demo's model and data (soltrain demo-setup, from the build tree's
binary), made once per session, and a private dataset cache."""
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("SOLTRAIN_BIN", ROOT / "build" / "soltrain"))


@pytest.fixture(scope="session")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo-data")
    subprocess.run([str(BIN), "demo-setup", "--out", str(out)], check=True, capture_output=True)
    return out


@pytest.fixture(autouse=True)
def dataset_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SOLTRAIN_CACHE", str(tmp_path / "cache"))


def read_jsonl(path):
    import json

    return [json.loads(line) for line in pathlib.Path(path).read_text().splitlines() if line.strip()]


# The live-reference helpers (live_refs.py: no pytest there, so GPU-side tools import them too), re-exported.
from live_refs import check_full_gradients, dump, randomize, reference_batch, rel, torch_updates  # noqa: E402,F401
