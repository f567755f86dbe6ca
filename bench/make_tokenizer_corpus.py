# A ~20 MB JSONL corpus for bench/tokenizer_bench.sh from text already on the GPU machine (the Python
# sources and docs of installed packages: code, English prose, some non-ASCII), since nothing can be
# downloaded there.   python3 bench/make_tokenizer_corpus.py OUT.jsonl [MB]
import json, os, sys, transformers

out, limit = sys.argv[1], float(sys.argv[2]) * 1e6 if len(sys.argv) > 2 else 20e6
root = os.path.dirname(os.path.dirname(transformers.__file__))
total = 0
with open(out, "w", encoding="utf-8") as f:
    for d, _, files in sorted(os.walk(root)):
        for name in sorted(files):
            if not name.endswith((".py", ".md", ".txt", ".rst")):
                continue
            try:
                text = open(os.path.join(d, name), encoding="utf-8").read()
            except (UnicodeDecodeError, OSError):
                continue
            for i in range(0, len(text), 4000):
                chunk = text[i:i + 4000]
                f.write(json.dumps({"text": chunk}, ensure_ascii=False) + "\n")
                total += len(chunk.encode("utf-8"))
            if total >= limit:
                print(f"{total / 1e6:.1f} MB written to {out}")
                sys.exit(0)
print(f"{total / 1e6:.1f} MB written to {out}")
