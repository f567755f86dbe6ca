#!/usr/bin/env bash
# Fuzzes the parsers that read what users download (safetensors headers, config.json, tokenizer.json,
# chat templates, parquet, CSV and text datasets, the hub's file lists, indexes and ETags) with libFuzzer under ASan + UBSan: RUNS inputs per target (default 100000), seeded from
# tests/fixtures, two targets at a time. Any crash, sanitizer report, hang (over 10 s on one input) or
# internal error fails the script; libFuzzer leaves the input as crash-*/timeout-* in build-fuzz/work/.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-100000}
jobs=${JOBS:-2}
cxx=$(command -v clang++-14 || command -v clang++)
cmake -S tests/fuzz -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE= >/dev/null
cmake --build build-fuzz -j"$jobs"

fixtures=tests/fixtures
seed() {  # target -> its seed files
  case $1 in
    safetensors) ls $fixtures/models/*/batch.safetensors $fixtures/peft/qwen3-tiny/adapter/*.safetensors ;;
    model_config) ls $fixtures/models/*/config.json $fixtures/peft/qwen3-tiny/merged/config.json ;;
    tokenizer) ls $fixtures/fuzz/tokenizer/*.json ;;
    template) ls $fixtures/fuzz/template/* ;;
    parquet) ls $fixtures/parquet/*.parquet | grep -v bomb ;;  # the bomb (test_input_bombs.cpp) would make every run slow
    records) ls $fixtures/fuzz/records/* ;;
    csv) ls $fixtures/fuzz/csv/* ;;
    hub) ls $fixtures/fuzz/hub/* ;;
  esac
}
run_target() {
  local t=$1 work=build-fuzz/work/$1
  rm -rf "$work" && mkdir -p "$work/corpus"
  local i=0
  for f in $(seed "$t"); do cp "$f" "$work/corpus/seed-$((i++))-$(basename "$f")"; done
  local start=$SECONDS
  # -seed fixes the run; -max_len bounds inputs (seed sizes aside) so each run costs about the same.
  # SOLTRAIN_HOST_MEMORY_LIMIT: the readers' host-memory checks see 2 GiB, under libFuzzer's 4 GiB RSS limit, so
  # an input that expands past what they check (a bomb) fails the run, and one they check is refused.
  if (cd "$work" && ASAN_OPTIONS=detect_leaks=0 SOLTRAIN_HOST_MEMORY_LIMIT=2G ../../fuzz_"$t" corpus -runs="$runs" -seed=1 -timeout=10 \
        -rss_limit_mb=4096 -max_len=16384 -print_final_stats=1 >log 2>&1); then
    echo "fuzz_$t: $runs runs, no crash, hang or sanitizer report ($((SECONDS - start)) s)"
  else
    echo "fuzz_$t: FAILED after $((SECONDS - start)) s; the end of $work/log:"
    tail -40 "$work/log"
    return 1
  fi
}
export -f run_target seed
export runs fixtures
printf '%s\n' safetensors model_config tokenizer template parquet records csv hub | xargs -P "$jobs" -I{} bash -c 'run_target {}'
