#!/usr/bin/env bash
# CI's compile check of the CUDA backend where nvcc is (no GPU needed): this machine kind's CUDA toolkit has
# nvcc but not cuBLAS's headers, so they come from PyPI's nvidia-cublas (as NCCL from nvidia-nccl-cu13); then
# build-cuda/soltrain is built (kernels for sm_80 and sm_90a) and not run. The GPU machine runs what it builds
# (bench/NOTES.md, "How these runs were made"). About 15 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
nvcc=$(command -v nvcc || true)
[ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
if [ -z "$nvcc" ]; then
  echo "cuda-check: no nvcc on this machine: skipped"
  exit 0
fi
pip=(python3 -m pip install --quiet --disable-pip-version-check)
headers() { python3 -c 'import nvidia.cu13 as m; print(m.__path__[0] + "/include")' 2>/dev/null || true; }
[ -f "$(headers)/cublasLt.h" ] || "${pip[@]}" "nvidia-cublas==13.*"
python3 -c "import nvidia.nccl" 2>/dev/null || "${pip[@]}" nvidia-nccl-cu13
inc=$(headers)
if [ ! -f build-cuda/build.ninja ]; then
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DSOLTRAIN_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc" \
    -DSOLTRAIN_TESTS=OFF -DSOLTRAIN_PYTHON=OFF -DCMAKE_CXX_FLAGS="-I$inc" -DCMAKE_CUDA_FLAGS="-I$inc" >/dev/null
fi
cmake --build build-cuda --target soltrain
echo "cuda-check: the CUDA backend compiles (sm_80, sm_90a)"
