#!/usr/bin/env bash
# Installs the Debian 12 packages soltrain builds and tests with (skipped when all are present), and from PyPI
# what the Python module builds with (nanobind, PyYAML) and, where nvcc is, NCCL.
set -euo pipefail
packages=(cmake ninja-build g++ pkg-config libopenblas-dev nlohmann-json3-dev libcli11-dev libpcre2-dev
          libutf8proc-dev libyaml-cpp-dev libgtest-dev libopenmpi-dev openmpi-bin
          zlib1g-dev libzstd-dev libsnappy-dev  # compressed datasets and parquet pages
          libcurl4-openssl-dev libssl-dev  # Hugging Face hub downloads (src/hub/); SHA-256 (libcrypto)
          libcpp-httplib-dev  # soltrain serve's OpenAI-compatible endpoint (header-only)
          clang-14 libclang-rt-14-dev)  # scripts/fuzz.sh: libFuzzer and the sanitizer runtimes
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The CUDA backend (built wherever nvcc and cuBLAS are, scripts/build.sh) links NCCL for data parallel over GPUs: Debian has none, PyPI's
# nvidia-nccl-cu13 wheel carries nccl.h and libnccl (CMakeLists.txt finds it through `import nvidia.nccl`).
nvcc=$(command -v nvcc || true)
[ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
if [ -n "$nvcc" ] && [ -f /usr/local/cuda/include/cublasLt.h ] && ! python3 -c "import nvidia.nccl" 2>/dev/null; then
  echo "installing: nvidia-nccl-cu13 (PyPI)"
  python3 -m pip install --quiet --disable-pip-version-check nvidia-nccl-cu13
fi
# The Python package's native module (CMakeLists.txt builds it where nanobind is found) and its config files.
python3 -c "import nanobind, yaml" 2>/dev/null ||
  python3 -m pip install --quiet --disable-pip-version-check nanobind pyyaml
