# Writes the parquet fixtures of tests/fixtures/parquet with pyarrow (the reference writer; run where pyarrow is
# installed, e.g. the GPU machine): the same rows as JSONL and as parquet files in the encodings Hugging Face
# datasets are published with, so soltrain's own parquet reader can be checked to give the same rows.
#   flat.jsonl     instruction rows (instruction, input: sometimes null or empty, output, id: int64, score: double)
#   flat_*.parquet the same rows: snappy/zstd/gzip/uncompressed, dictionary on and off, data pages v1 and v2,
#                  several row groups and several pages per column chunk
#   chat.jsonl     conversations: messages = list<struct<role, content>> (some with a system turn), plus an id
#   chat_*.parquet the same rows
#   folder/        one dataset split over two files, named the way the hub names them
# Run: python3 tests/tools/make_parquet_fixtures.py tests/fixtures/parquet
import json, os, random, sys

import pyarrow as pa
import pyarrow.parquet as pq

WORDS = ("the model reads tokens and writes answers; ümlaut café naïve 東京 данные emoji 🙂 tab\there "
         "quote\" backslash\\ newline\nend").split(" ")


def text(rng, lo, hi):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def flat_rows(rng, n):
    rows = []
    for i in range(n):
        r = rng.random()
        inp = None if r < 0.25 else ("" if r < 0.4 else text(rng, 1, 12))
        rows.append({"instruction": text(rng, 2, 30), "input": inp, "output": text(rng, 1, 80),
                     "id": i * 7919 - 300, "score": None if i % 5 == 3 else rng.uniform(-2, 2)})
    return rows


def chat_rows(rng, n):
    rows = []
    for i in range(n):
        msgs = []
        if i % 3 == 0: msgs.append({"role": "system", "content": text(rng, 2, 10)})
        for _ in range(rng.randint(1, 4)):
            msgs.append({"role": "user", "content": text(rng, 1, 25)})
            msgs.append({"role": "assistant", "content": text(rng, 1, 40)})
        rows.append({"id": f"conv-{i}", "messages": msgs})
    return rows


FLAT = pa.schema([("instruction", pa.string()), ("input", pa.string()), ("output", pa.string()),
                  ("id", pa.int64()), ("score", pa.float64())])
CHAT = pa.schema([("id", pa.string()),
                  ("messages", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())])))])

# (name, compression, dictionary, data page version)
VARIANTS = [("snappy", "snappy", True, "1.0"), ("zstd", "zstd", True, "2.0"), ("gzip", "gzip", False, "1.0"),
            ("none", "none", False, "2.0"), ("snappy_plain", "snappy", False, "1.0")]


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows: f.write(json.dumps(r, ensure_ascii=False) + "\n")


def main():
    out = sys.argv[1]
    os.makedirs(os.path.join(out, "folder"), exist_ok=True)
    rng = random.Random(1234)
    flat, chat = flat_rows(rng, 57), chat_rows(rng, 23)
    write_jsonl(os.path.join(out, "flat.jsonl"), flat)
    write_jsonl(os.path.join(out, "chat.jsonl"), chat)
    ft, ct = pa.Table.from_pylist(flat, schema=FLAT), pa.Table.from_pylist(chat, schema=CHAT)
    for name, comp, dic, ver in VARIANTS:
        kw = dict(compression=comp, use_dictionary=dic, data_page_version=ver, data_page_size=512,
                  write_statistics=True)
        pq.write_table(ft, os.path.join(out, f"flat_{name}.parquet"), row_group_size=10, **kw)
        if name in ("snappy", "zstd", "none"):
            pq.write_table(ct, os.path.join(out, f"chat_{name}.parquet"), row_group_size=6, **kw)
    half = len(flat) // 2
    pq.write_table(ft.slice(0, half), os.path.join(out, "folder", "train-00000-of-00002.parquet"), compression="snappy")
    pq.write_table(ft.slice(half), os.path.join(out, "folder", "train-00001-of-00002.parquet"), compression="zstd")
    for f in sorted(os.listdir(out)):
        p = os.path.join(out, f)
        if f.endswith(".parquet"):
            md = pq.ParquetFile(p).metadata
            print(f, md.num_rows, "rows,", md.num_row_groups, "row groups,", os.path.getsize(p), "bytes")


if __name__ == "__main__":
    main()
