#!/usr/bin/env python3
"""The best achievable eval loss of the noisy reversal task (`soltrain demo-setup --label-noise P`).

Each answer is the prompt reversed with probability 1 - P, else a uniformly random word of the same length L
(26 letters). The answer's tokens are its L letters and <|im_end|> (what the conversation template trains),
so the best any model can do on a record is -log P*(answer), with
    P*(answer) = (1 - P) * [answer == reversed prompt] + P * 26^-L
(the end token is certain once L letters are out). The eval loss is the mean over counted tokens, so the
floor is the sum of those over the validation file divided by its counted tokens. For P = 0.2 and L uniform
in 3..6 that is about 0.62 nats per token; without noise it is 0.

Usage: task_floor.py VALIDATION_JSONL LABEL_NOISE [--tokens N]
  --tokens: the counted tokens as soltrain reports them (eval_tokens in metrics.jsonl); by default each
  record counts len(answer) + 1.
"""
import argparse
import json
import math
import sys


def floor(path, noise, tokens=None):
    total_nll, counted = 0.0, 0
    with open(path) as f:
        for n, line in enumerate(f, 1):
            msgs = json.loads(line)["messages"]
            word, answer = msgs[0]["content"], msgs[1]["content"]
            p = noise * 26.0 ** -len(answer) + (1.0 - noise) * (answer == word[::-1])
            if p <= 0:
                sys.exit(f"{path}:{n}: answer {answer!r} is not the reversal of {word!r}, impossible at noise 0")
            total_nll -= math.log(p)
            counted += len(answer) + 1
    return total_nll / (tokens if tokens else counted), counted


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("validation")
    ap.add_argument("label_noise", type=float)
    ap.add_argument("--tokens", type=int, default=None)
    a = ap.parse_args()
    if not 0.0 <= a.label_noise <= 1.0:
        print(f"task_floor.py: label noise {a.label_noise} is not in [0, 1]", file=sys.stderr)
        sys.exit(2)
    value, counted = floor(a.validation, a.label_noise, a.tokens)
    if a.tokens and a.tokens != counted:
        print(f"task_floor.py: soltrain counted {a.tokens} tokens, the file's answers give {counted}", file=sys.stderr)
    print(f"{value:.4f}")


if __name__ == "__main__":
    main()
