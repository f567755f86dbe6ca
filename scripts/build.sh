#!/usr/bin/env bash
# Configures (once) and builds soltrain into build/; extra arguments go to `cmake --build` (e.g. --target).
# The CUDA backend is built whenever nvcc is found (on PATH or in /usr/local/cuda), GPU or not.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
if [ ! -f build/build.ninja ]; then
  cuda=()
  nvcc=$(command -v nvcc || true)
  [ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
  [ -n "$nvcc" ] && cuda=(-DSOLTRAIN_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc")
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${cuda[@]}" "${SOLTRAIN_CMAKE_ARGS[@]:-}" >/dev/null
fi
cmake --build build "$@"
