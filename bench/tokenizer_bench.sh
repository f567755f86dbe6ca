#!/usr/bin/env bash
# Tokenizer throughput: `soltrain encode` against HF tokenizers (python `tokenizers`) on the same JSONL,
# in MB of UTF-8 text per second, and a check that both give identical ids for every line.
# Usage: bench/tokenizer_bench.sh TOKENIZER(.json or folder) INPUT.jsonl [SOLTRAIN_BINARY]
#   INPUT.jsonl has one {"text": ...} per line. Needs python3 with `tokenizers` (the GPU machine has it).
set -euo pipefail

tokenizer=${1:?usage: tokenizer_bench.sh TOKENIZER INPUT.jsonl [SOLTRAIN_BINARY]}
input=${2:?usage: tokenizer_bench.sh TOKENIZER INPUT.jsonl [SOLTRAIN_BINARY]}
soltrain=${3:-build/soltrain}
[[ -d "$tokenizer" ]] && tokenizer="$tokenizer/tokenizer.json"

python3 - "$tokenizer" "$input" "$soltrain" <<'PY'
import json, os, subprocess, sys, tempfile, time
from tokenizers import Tokenizer

tok_path, input_path, soltrain = sys.argv[1:4]
texts = [json.loads(line)["text"] for line in open(input_path, encoding="utf-8") if line.strip()]
mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
print(f"{len(texts)} texts, {mb:.1f} MB")

# soltrain: one thread, includes loading tokenizer.json (reported separately below).
with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as empty:
    pass
t0 = time.perf_counter()
subprocess.run([soltrain, "encode", "--tokenizer", tok_path], stdin=open(empty.name), check=True, stdout=subprocess.DEVNULL)
load_s = time.perf_counter() - t0
os.unlink(empty.name)
t0 = time.perf_counter()
out = subprocess.run([soltrain, "encode", "--tokenizer", tok_path], stdin=open(input_path, "rb"), check=True,
                     capture_output=True).stdout
ours_s = time.perf_counter() - t0 - load_s
ours = [json.loads(line)["ids"] for line in out.decode().splitlines()]

hf = Tokenizer.from_file(tok_path)
t0 = time.perf_counter()
ref = [hf.encode(t, add_special_tokens=False).ids for t in texts]
hf_s = time.perf_counter() - t0
t0 = time.perf_counter()
hf.encode_batch(texts, add_special_tokens=False)
hf_batch_s = time.perf_counter() - t0

print(f"soltrain encode (1 thread, after {load_s:.2f} s load): {mb / ours_s:8.1f} MB/s")
print(f"HF tokenizers encode (1 thread, python loop):          {mb / hf_s:8.1f} MB/s")
print(f"HF tokenizers encode_batch ({os.cpu_count()} threads):             {mb / hf_batch_s:8.1f} MB/s")

bad = [i for i, (a, b) in enumerate(zip(ours, ref)) if a != b]
if len(ours) != len(ref) or bad:
    print(f"MISMATCH: {len(bad)} of {len(ref)} texts differ (line counts {len(ours)} vs {len(ref)})")
    for i in bad[:5]:
        print(f"  line {i + 1}: {texts[i][:80]!r}")
    sys.exit(1)
print("ids identical on every text")
PY
