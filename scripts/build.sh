#!/usr/bin/env bash
# Configures (once) and builds soltrain into build/; extra arguments go to `cmake --build` (e.g. --target).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
[ -f build/build.ninja ] || cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build "$@"
