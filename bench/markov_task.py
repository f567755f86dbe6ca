#!/usr/bin/env python3
"""A language with a known entropy, for bench/convergence.sh --task markov: text from a random Markov chain.

The chain: order ORDER over the first LETTERS lowercase letters; each context (the last ORDER letters, a start
symbol standing in before the first) has its own next-letter distribution drawn from a symmetric Dirichlet of
concentration ALPHA (small: peaked rows, an entropy of about 1.5 nats per letter at 26 letters and 0.1). After
every letter the document ends with probability 1 / MEAN_LENGTH, whatever the letters (so the end is as
learnable as a constant), except that a document reaching MAX_TOKENS letters is cut there.

As soltrain counts a text document (`soltrain pt`, `type: text`; the demo's byte tokenizer): one token per
letter, then the eos token appended; documents longer than sequence_len keep their first sequence_len tokens
(so a cut document, MAX_TOKENS = sequence_len letters, loses the appended eos); the targets are the tokens after
the first of each document (packing keeps documents apart: per-document positions and attention). So the exact
floor of a file, the best any model can do, is the mean over those targets of -log p_true(target | document so
far), with p_true(letter) = (1 - q) * row(context)[letter] and p_true(eos) = q, q = 1 / MEAN_LENGTH.

  markov_task.py generate --out DIR [--train-tokens N] [--validation N] [--seed S] [--letters K] [--order O]
                 [--alpha A] [--mean-length L] [--max-tokens T]
      writes DIR/chain.json (the chain), DIR/train.jsonl (documents until N tokens) and DIR/validation.jsonl
      (N documents), {"text": "..."} per line, and prints the chain's entropy rate and the validation floor
  markov_task.py floor DIR/chain.json FILE [--tokens N]
      prints the floor of FILE (a line of diagnostics on stderr); --tokens: soltrain's eval_tokens, checked
      against the targets counted here
  markov_task.py check DIR/chain.json FILE
      the floor three ways: the formula above, a "model" that knows the chain scoring FILE token by token as a
      language model does, and the chain's entropy rate (equal up to sampling noise on a long file)
Standard library only.
"""
import argparse
import bisect
import json
import math
import random
import sys

START = "^"


def die(msg):
    print(f"markov_task.py: {msg}", file=sys.stderr)
    sys.exit(2)


def make_chain(letters, order, alpha, mean_length, max_tokens, seed):
    rng = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyz"[:letters]
    rows = {}

    def contexts(n):  # every context of n symbols a document can have: start symbols, then letters
        out = [""]
        for _ in range(n):
            out = [c + a for c in out for a in START + alphabet]
        return [c for c in out if START not in c.lstrip(START)]

    for ctx in contexts(order):
        g = [rng.gammavariate(alpha, 1.0) for _ in alphabet]
        total = sum(g)
        if total == 0.0:  # every draw underflowed (vanishingly rare): one letter at random
            g[rng.randrange(len(g))] = total = 1.0
        rows[ctx] = [x / total for x in g]
    return dict(letters=letters, order=order, alpha=alpha, mean_length=mean_length, max_tokens=max_tokens,
                seed=seed, alphabet=alphabet, rows=rows)


def load_chain(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        die(f"{path}: {e}")


def context(chain, doc, k):
    """The context of letter k of doc (0-based): the ORDER symbols before it, start symbols before the first."""
    o = chain["order"]
    return (START * o + doc[:k])[-o:] if o else ""


def generate_docs(chain, rng, count=None, tokens=None):
    alphabet, q, cap, o = chain["alphabet"], 1.0 / chain["mean_length"], chain["max_tokens"], chain["order"]
    # Per context: the cumulative row and, per letter, the next context (the inner loop is all Python).
    ctxs = list(chain["rows"])
    at = {c: i for i, c in enumerate(ctxs)}
    cum = [[sum(chain["rows"][c][: i + 1]) for i in range(len(alphabet))] for c in ctxs]
    nxt = [[at[(c + a)[-o:]] if o else 0 for a in alphabet] for c in ctxs]
    start, log_keep, last = at[START * o], math.log(1.0 - q), len(alphabet) - 1
    made_docs = made_tokens = 0
    rnd, bis = rng.random, bisect.bisect_right
    while (count is not None and made_docs < count) or (tokens is not None and made_tokens < tokens):
        # The length first: after each letter the document ends with probability q (geometric), cut at cap.
        n = min(cap, 1 + int(math.log(1.0 - rnd()) / log_keep))
        c, doc = start, []
        for _ in range(n):
            row = cum[c]
            i = bis(row, rnd() * row[-1])
            if i > last:
                i = last
            doc.append(i)
            c = nxt[c][i]
        made_docs += 1
        made_tokens += min(n + 1, cap)
        yield "".join(alphabet[i] for i in doc)


def doc_nll(chain, doc):
    """(sum of -log p_true over the document's targets, targets) as soltrain counts them."""
    q, cap, rows = 1.0 / chain["mean_length"], chain["max_tokens"], chain["rows"]
    idx = {a: i for i, a in enumerate(chain["alphabet"])}
    if not doc or len(doc) > cap:
        raise ValueError(f"a document of {len(doc)} letters (1 to {cap} expected)")
    nll, n = 0.0, 0
    for k in range(1, len(doc)):  # letters 2.. (the first is no target)
        p = (1.0 - q) * rows[context(chain, doc, k)][idx[doc[k]]]
        if p <= 0:
            raise ValueError(f"letter {k} ({doc[k]!r}) has probability 0 under the chain")
        nll -= math.log(p)
        n += 1
    if len(doc) < cap:  # the appended eos is a target unless the cut dropped it
        nll -= math.log(q)
        n += 1
    return nll, n


def read_docs(path):
    with open(path) as f:
        for n, line in enumerate(f, 1):
            try:
                yield json.loads(line)["text"]
            except (json.JSONDecodeError, KeyError, TypeError):
                die(f"{path}:{n}: expected a JSON line with a \"text\" string")


def floor(chain, path):
    total, counted, docs = 0.0, 0, 0
    for n, doc in enumerate(read_docs(path), 1):
        try:
            nll, k = doc_nll(chain, doc)
        except (ValueError, KeyError) as e:
            die(f"{path}:{n}: {e}")
        total += nll
        counted += k
        docs += 1
    if counted == 0:
        die(f"{path}: no targets")
    return total / counted, counted, docs


def entropy_rate(chain):
    """The expected floor: E[sum of -log p_true over a document's targets] / E[its targets], the context
    distribution carried letter by letter from the start, the lengths as generated and cut (what a file of many
    documents' floor approaches)."""
    o, alphabet, rows = chain["order"], chain["alphabet"], chain["rows"]
    q = 1.0 / chain["mean_length"]
    ctxs = list(rows)
    at = {c: i for i, c in enumerate(ctxs)}
    h = [-sum(p * math.log(p) for p in rows[c] if p > 0) for c in ctxs]
    moves = [[(at[(c + a)[-o:]] if o else 0, p) for a, p in zip(alphabet, rows[c]) if p > 0] for c in ctxs]
    # The distribution of the context at letter k, carried from the start; once it stops changing (stationary,
    # to 1e-15) only the length weights move.
    dist = [0.0] * len(ctxs)
    dist[at[START * o]] = 1.0
    weight, acc, total_w, settled = 1.0, 0.0, 0.0, False
    for k in range(chain["max_tokens"]):
        hk = sum(d * hc for d, hc in zip(dist, h))
        if k >= 1:  # letter k is a target; weight: the chance the document has it
            acc += weight * (hk - math.log(1.0 - q))
            total_w += weight
        if not settled:
            new = [0.0] * len(ctxs)
            for c, d in enumerate(dist):
                if d:
                    for nc, p in moves[c]:
                        new[nc] += d * p
            settled = max(abs(a - b) for a, b in zip(new, dist)) < 1e-15
            dist = new
        if k + 1 < chain["max_tokens"]:
            acc += weight * q * -math.log(q)  # the eos after letter k, a document of k + 1 letters
            total_w += weight * q
            weight *= 1.0 - q
    return acc / total_w


def lm_score(chain, path):
    """A language model that knows the chain, scoring each document as soltrain does: the token sequence
    (letters, eos, cut to max_tokens), a distribution over letters + eos at every position but the last, the
    next token's -log probability."""
    q, cap, rows, alphabet = 1.0 / chain["mean_length"], chain["max_tokens"], chain["rows"], chain["alphabet"]
    eos = "</s>"
    total, n = 0.0, 0
    for doc in read_docs(path):
        tokens = (list(doc) + [eos])[:cap]
        for pos in range(len(tokens) - 1):  # the prediction made at pos, of tokens[pos + 1]
            ctx = context(chain, doc, pos + 1)
            dist = {a: (1.0 - q) * p for a, p in zip(alphabet, rows[ctx])}
            dist[eos] = q
            assert abs(sum(dist.values()) - 1.0) < 1e-9
            total -= math.log(dist[tokens[pos + 1]])
            n += 1
    return total / n, n


def write_jsonl(path, docs):
    with open(path + ".tmp", "w") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    import os
    os.replace(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--out", required=True)
    g.add_argument("--train-tokens", type=int, default=10_000_000)
    g.add_argument("--validation", type=int, default=500, help="validation documents")
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--letters", type=int, default=26)
    g.add_argument("--order", type=int, default=2)
    g.add_argument("--alpha", type=float, default=0.1)
    g.add_argument("--mean-length", type=float, default=100.0)
    g.add_argument("--max-tokens", type=int, default=256, help="the training's sequence_len")
    f = sub.add_parser("floor")
    f.add_argument("chain")
    f.add_argument("file")
    f.add_argument("--tokens", type=int, default=None)
    c = sub.add_parser("check")
    c.add_argument("chain")
    c.add_argument("file")
    a = ap.parse_args()

    if a.cmd == "generate":
        if not 1 <= a.letters <= 26 or a.order < 0 or a.alpha <= 0 or a.mean_length <= 1 or a.max_tokens < 2:
            die("expected 1 <= --letters <= 26, --order >= 0, --alpha > 0, --mean-length > 1, --max-tokens >= 2")
        if a.train_tokens < 1 or a.validation < 1:
            die("--train-tokens and --validation: positive whole numbers")
        import os
        os.makedirs(a.out, exist_ok=True)
        chain = make_chain(a.letters, a.order, a.alpha, a.mean_length, a.max_tokens, a.seed)
        with open(os.path.join(a.out, "chain.json"), "w") as fh:
            json.dump(chain, fh)
        # Train and validation from streams of their own: the same validation file whatever --train-tokens.
        write_jsonl(os.path.join(a.out, "validation.jsonl"),
                    generate_docs(chain, random.Random(a.seed * 1000 + 2), count=a.validation))
        write_jsonl(os.path.join(a.out, "train.jsonl"),
                    generate_docs(chain, random.Random(a.seed * 1000 + 1), tokens=a.train_tokens))
        value, counted, docs = floor(chain, os.path.join(a.out, "validation.jsonl"))
        print(f"markov: order {a.order} over {a.letters} letters, alpha {a.alpha}, mean length {a.mean_length:g}; "
              f"entropy rate {entropy_rate(chain):.4f} nats/target; validation floor {value:.4f} "
              f"({docs} documents, {counted} targets)", file=sys.stderr)
        return 0

    chain = load_chain(a.chain)
    if a.cmd == "floor":
        value, counted, docs = floor(chain, a.file)
        if a.tokens is not None and a.tokens != counted:
            print(f"markov_task.py: soltrain counted {a.tokens} targets, the chain's counting gives {counted}",
                  file=sys.stderr)
        print(f"{value:.4f}")
        return 0
    value, counted, docs = floor(chain, a.file)
    lm, n = lm_score(chain, a.file)
    rate = entropy_rate(chain)
    print(f"floor {value:.6f} ({counted} targets, {docs} documents); model that knows the chain {lm:.6f} "
          f"({n} targets); entropy rate {rate:.6f}")
    return 0 if abs(lm - value) < 1e-9 and n == counted else 1


if __name__ == "__main__":
    sys.exit(main())
