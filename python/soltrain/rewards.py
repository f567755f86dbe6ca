"""GRPO's Python reward functions, with TRL's signature: f(prompts, completions, completion_ids, **columns) ->
list[float | None] (one per completion; None: the function does not score it), the dataset's other columns
passed by name. soltrain.GRPOTrainer calls score() in its own process; a `soltrain grpo` run from YAML starts
this file as `python3 -c <this file>` (compiled into the binary), which imports each `module.path:function` the
config names and answers JSON lines on stdin: first {"init": {"functions": [...], "paths": [...]}} (answered
"ready", or {"error": ...}), then requests {"prompts", "completions", "completion_ids", "columns"} (answered
{"rewards": [[...] per function]} or {"error": "one line"})."""
import importlib
import json
import math
import sys


class RewardError(Exception):
    """A reward function that cannot be called, raised, or returned something other than a score per completion."""


def load(spec):
    """`module.path:function` imported, or RewardError in one line."""
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise RewardError(f"reward function {spec!r}: expected module.path:function")
    try:
        fn = getattr(importlib.import_module(module), name)
    except Exception as e:  # noqa: BLE001  (any import failure is the user's to see, in one line)
        raise RewardError(f"reward function {spec}: cannot import it ({type(e).__name__}: {e})") from None
    if not callable(fn):
        raise RewardError(f"reward function {spec}: not callable")
    return fn


def score(funcs, request):
    """[(name, callable)] over one request: a list of scores per function (None kept as None)."""
    n = len(request["completions"])
    out = []
    for name, fn in funcs:
        try:
            values = fn(prompts=request["prompts"], completions=request["completions"],
                        completion_ids=request["completion_ids"], **request.get("columns", {}))
        except Exception as e:  # noqa: BLE001
            raise RewardError(f"reward function {name} raised {type(e).__name__}: {e}") from None
        try:
            values = list(values)
        except TypeError:
            raise RewardError(f"reward function {name} returned {type(values).__name__}, not a list of "
                              f"{n} numbers") from None
        if len(values) != n:
            raise RewardError(f"reward function {name} returned {len(values)} values for {n} completions")
        row = []
        for v in values:
            if v is None:
                row.append(None)
                continue
            try:
                f = float(v)
            except (TypeError, ValueError):
                raise RewardError(f"reward function {name} returned {v!r}, not a number or None") from None
            if math.isnan(f) or math.isinf(f):
                raise RewardError(f"reward function {name} returned {f}: not a finite number")
            row.append(f)
        out.append(row)
    return out


def main():
    init = json.loads(sys.stdin.readline())["init"]
    for p in init.get("paths", []):
        if p not in sys.path:
            sys.path.insert(0, p)
    try:
        funcs = [(spec, load(spec)) for spec in init["functions"]]
    except RewardError as e:
        print(json.dumps({"error": str(e)}), flush=True)
        return
    print("ready", flush=True)
    for line in sys.stdin:
        try:
            reply = {"rewards": score(funcs, json.loads(line))}
        except RewardError as e:
            reply = {"error": str(e)}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
