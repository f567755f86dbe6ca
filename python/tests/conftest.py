"""Fixtures for the Python API's tests: the demo's model and data (soltrain demo-setup, from the build tree's
binary), made once per session, and a private dataset cache."""
import json
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
from live_refs import (  # noqa: E402,F401
    check_full_gradients, dump, muon_parameter_groups, randomize, reference_batch, rel, torch_updates,
    write_tiny_llama)


def prepared_documents(folder):
    """A prepared dataset's documents in order, each (ids, mask): manifest.json's shards, .tokens int32, .mask a byte
    per token (0: not trained), .docs the int64 offsets."""
    manifest = json.loads((pathlib.Path(folder) / "manifest.json").read_text())
    out = []
    for shard in manifest["shards"]:
        base = pathlib.Path(folder) / shard["name"]
        ids = list(memoryview(base.with_suffix(".tokens").read_bytes()).cast("i"))
        mask = list(base.with_suffix(".mask").read_bytes())
        offsets = list(memoryview(base.with_suffix(".docs").read_bytes()).cast("q"))
        out += [(ids[a:b], mask[a:b]) for a, b in zip(offsets, offsets[1:])]
    return out
