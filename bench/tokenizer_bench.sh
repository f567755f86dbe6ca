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

# soltrain end to end (process start, loading tokenizer.json once per thread, parsing, encoding, writing),
# with one thread and with all cores; the load alone is timed on empty input and reported beside it.
def run(threads, stdin_path):
    t0 = time.perf_counter()
    p = subprocess.run([soltrain, "encode", "--tokenizer", tok_path, "--threads", str(threads)],
                       stdin=open(stdin_path, "rb"), check=True, capture_output=True)
    return time.perf_counter() - t0, p.stdout

with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as empty:
    pass
ncpu = os.cpu_count()
load1, _ = run(1, empty.name)
loadn, _ = run(ncpu, empty.name)
os.unlink(empty.name)
one_s, _ = run(1, input_path)
all_s, out = run(ncpu, input_path)
ours = [json.loads(line)["ids"] for line in out.decode().splitlines()]

hf = Tokenizer.from_file(tok_path)
t0 = time.perf_counter()
ref = [hf.encode(t, add_special_tokens=False).ids for t in texts]
hf_s = time.perf_counter() - t0
t0 = time.perf_counter()
hf.encode_batch(texts, add_special_tokens=False)
hf_batch_s = time.perf_counter() - t0

print(f"soltrain encode, 1 thread, end to end:              {mb / one_s:8.1f} MB/s  (load {load1:.2f} s)")
print(f"soltrain encode, {ncpu} threads, end to end:             {mb / all_s:8.1f} MB/s  (load {loadn:.2f} s)")
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
