#!/usr/bin/env bash
# Builds everything and runs the whole test suite (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
ctest --test-dir build --output-on-failure -j3  # many tests wait on subprocesses
