#!/usr/bin/env bash
# Configures (once) and builds soltrain into build/; extra arguments go to `cmake --build` (e.g. --target).
# The CUDA backend is built whenever nvcc is found (on PATH or in /usr/local/cuda) with the toolkit's cuBLAS
# headers (cublasLt.h), GPU or not; a toolkit without cuBLAS (nvcc alone) builds the CPU backend, saying so.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
if [ ! -f build/build.ninja ]; then
  cuda=()
  nvcc=$(command -v nvcc || true)
  [ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
  if [ -n "$nvcc" ]; then
    if [ -f "$(dirname "$(readlink -f "$nvcc")")/../include/cublasLt.h" ] || [ -f /usr/local/cuda/include/cublasLt.h ]; then
      cuda=(-DSOLTRAIN_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc")
    else
      echo "note: $nvcc has no cuBLAS headers (cublasLt.h) beside it: building the CPU backend only" >&2
    fi
  fi
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${cuda[@]}" "${SOLTRAIN_CMAKE_ARGS[@]:-}" >/dev/null
fi
cmake --build build "$@"
