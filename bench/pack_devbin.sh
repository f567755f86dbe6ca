#!/usr/bin/env bash
# Packs a CUDA build's binaries, its static libraries (for the Python module, built there) and the Debian
# libraries they need for the GPU machine (bench/NOTES.md, "How
# these runs were made"): .devbin/ (soltrain.bin behind a wrapper that sets LD_LIBRARY_PATH, soltrain_tests,
# lib/, tokenizers.tgz) packed as .gl/devbin.txz to carry. There: `tar xJf .gl/devbin.txz && bash bench/...`.
#   bash bench/pack_devbin.sh [build-dir] [baseline-soltrain]     (default: build)
# baseline-soltrain: an earlier build's binary (or a devbin.txz holding one), carried as .devbin/soltrain-before
# for run_bench.py --baseline (the same libraries: pack it from a build of the same dependencies).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
baseline=${2:-}
if [ -n "$baseline" ]; then  # read it before .devbin and .gl/devbin.txz are replaced
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  case $baseline in
    *.txz) tar xJf "$baseline" -C "$tmp" .devbin/soltrain.bin && baseline=$tmp/.devbin/soltrain.bin ;;
    *) cp "$baseline" "$tmp/soltrain.bin" && baseline=$tmp/soltrain.bin ;;
  esac
fi
rm -rf .devbin && mkdir -p .devbin/lib .gl
cp "$B/soltrain" .devbin/soltrain.bin
[ -n "$baseline" ] && cp "$baseline" .devbin/soltrain-before.bin
cp "$B/tests/soltrain_tests" .devbin/
strip --strip-unneeded .devbin/soltrain.bin .devbin/soltrain_tests
# Every Debian library either binary resolves, except glibc's, the C++ runtime and OpenBLAS (36 MB: Debian's
# reference BLAS carries the same cblas symbols); libraries the GPU machine has (CUDA, NCCL) are not copied.
for bin in .devbin/soltrain.bin .devbin/soltrain_tests; do
  ldd "$bin" | awk '$3 ~ /^\/(usr\/)?lib\/x86_64-linux-gnu\// {print $3}'
done | sort -u | while read -r lib; do
  case $(basename "$lib") in
    libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|libstdc++*|libgcc_s*|libopenblas*|libblas*) ;;
    *) cp -L "$lib" .devbin/lib/ ;;
  esac
done
cp -L /usr/lib/x86_64-linux-gnu/blas/libblas.so.3 .devbin/lib/libopenblas.so.0
cat > .devbin/soltrain <<'EOF'
#!/usr/bin/env bash
# soltrain with the carried libraries, CUDA's and the Python environment's NCCL: for this binary alone
here=$(dirname "$(readlink -f "$0")")
nccl=$(python3 -c 'import nvidia.nccl as m; print(m.__path__[0])' 2>/dev/null)/lib
LD_LIBRARY_PATH=$here/lib:/usr/local/cuda/lib64:$nccl exec "$here/soltrain.bin" "$@"
EOF
chmod +x .devbin/soltrain
if [ -n "$baseline" ]; then
  sed 's/soltrain\.bin/soltrain-before.bin/' .devbin/soltrain >.devbin/soltrain-before
  chmod +x .devbin/soltrain-before
fi
[ -d "$B/tokenizers" ] && tar czf .devbin/tokenizers.tgz -C "$B" tokenizers
# The Python module is compiled on the GPU machine (its python3 is another version): carry the static libraries
# and the third-party headers src/python/module.cpp includes (bench/gpu_module/CMakeLists.txt links them).
mkdir -p .devbin/static .devbin/include
for l in cli dist lib; do cp "$B/libsoltrain_$l.a" .devbin/static/ && strip --strip-debug ".devbin/static/libsoltrain_$l.a"; done
cp -r /usr/include/CLI /usr/include/nlohmann /usr/include/yaml-cpp .devbin/include/
tar cJf .gl/devbin.txz .devbin
ls -la .gl/devbin.txz
