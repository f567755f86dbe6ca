#!/usr/bin/env bash
# Builds everything and runs the whole test suite (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
ctest --test-dir build --output-on-failure -j3  # many tests wait on subprocesses
# The Python API (python/tests) over the module just built: pytest and datasets from PyPI when missing.
python3 -c "import pytest, datasets" 2>/dev/null ||
  python3 -m pip install --quiet --disable-pip-version-check pytest datasets
python3 -m pytest python/tests -q
