#!/usr/bin/env python3
"""The variants file of bench/convergence.sh, and the report of its runs.

  convergence_report.py plan VARIANTS [--only a,b]   checks the file; prints "name<TAB>start<TAB>settings" per
                                                     variant to run (a baseline a chosen variant needs is run too)
  convergence_report.py report OUT VARIANTS [--floor F] [--seeds 42,43,44]
        reads OUT/runs/<name>/metrics.jsonl, OUT/runs/<name>.rc and .log; prints the summary table, writes it to
        OUT/summary.md and one SVG per comparison (OUT/<baseline>_vs_<variants>.svg, bench/plot_curves.py)
        --seeds: the runs are OUT/runs/<name>-s<seed>, one per seed; a variant's final eval loss is the mean
        over its seeds, shown with each seed's and the spread (max - min, as a percentage of the mean); the
        SVGs draw the mean curves (OUT/mean/<name>/metrics.jsonl: each step's loss averaged over the seeds)

A variant passes when |its final eval loss / its baseline's - 1| is within the line's tolerance (with seeds:
the means'). A variant whose run failed (soltrain refused a setting, crashed; with seeds: any of its runs) is
ERROR with soltrain's last line, and the others are still reported. Exit status of `report`: 0 when every
compared variant passes, 1 otherwise.
"""
import json
import math
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def die(msg):
    print(f"convergence_report.py: {msg}", file=sys.stderr)
    sys.exit(2)


def parse_variants(path):
    """[{name, start, baseline, within (fraction or None), settings}] in file order."""
    if not os.path.exists(path):
        die(f"{path}: no such variants file")
    variants, names = [], set()
    with open(path) as f:
        for n, line in enumerate(f, 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            where = f"{path}:{n}"
            if len(words) < 4:
                die(f"{where}: expected 'name start baseline within settings...', got {line.strip()!r}")
            name, start, baseline, within, settings = words[0], words[1], words[2], words[3], words[4:]
            if name in names:
                die(f"{where}: variant {name} given twice")
            if start not in ("init", "base"):
                die(f"{where}: start {start!r}: expected init or base")
            if (baseline == "-") != (within == "-"):
                die(f"{where}: baseline and within go together ('-' for both, or a name and a percentage)")
            tol = None
            if within != "-":
                try:
                    tol = float(within.rstrip("%")) / 100.0
                except ValueError:
                    die(f"{where}: within {within!r}: expected a percentage such as 2%")
                if baseline not in names:
                    die(f"{where}: baseline {baseline} is not a variant listed above this line")
            for s in settings:
                if "=" not in s or s.startswith("="):
                    die(f"{where}: setting {s!r}: expected key=value")
            names.add(name)
            variants.append(dict(name=name, start=start, baseline=None if baseline == "-" else baseline,
                                 within=tol, settings=settings))
    if not variants:
        die(f"{path}: no variants")
    return variants


def select(variants, only):
    if not only:
        return variants
    by_name = {v["name"]: v for v in variants}
    wanted = set()
    for name in only.split(","):
        if name not in by_name:
            die(f"--only {name}: not in the variants file (it has {', '.join(by_name)})")
        wanted.add(name)
        if by_name[name]["baseline"]:
            wanted.add(by_name[name]["baseline"])  # a comparison needs its baseline
    return [v for v in variants if v["name"] in wanted]


def read_run(out, name):
    """(status, final eval loss, final eval step, final train loss, note)."""
    run = os.path.join(out, "runs", name)
    rc_file, log = run + ".rc", run + ".log"
    if not os.path.exists(rc_file):
        return "NOT RUN", None, None, None, ""
    rc = open(rc_file).read().strip()
    if rc != "0":
        last = ""
        if os.path.exists(log):
            lines = [l.strip() for l in open(log, errors="replace") if l.strip()]
            last = lines[-1] if lines else ""
        return "ERROR", None, None, None, f"exit {rc}: {last}"
    evals, train = [], []
    path = os.path.join(run, "metrics.jsonl")
    if os.path.exists(path):
        for line in open(path):
            try:
                j = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(j.get("eval_loss"), (int, float)):
                evals.append((j["step"], j["eval_loss"]))
            elif isinstance(j.get("loss"), (int, float)):
                train.append((j["step"], j["loss"]))
    if not evals:
        return "ERROR", None, None, None, "no eval_loss in metrics.jsonl"
    step, loss = max(evals)
    return "OK", loss, step, (max(train)[1] if train else None), ""


def read_curves(path):
    """{step: eval loss}, {step: train loss} of one metrics.jsonl."""
    evals, train = {}, {}
    for line in open(path):
        try:
            j = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(j.get("eval_loss"), (int, float)):
            evals[j["step"]] = j["eval_loss"]
        elif isinstance(j.get("loss"), (int, float)):
            train[j["step"]] = j["loss"]
    return evals, train


def read_seeds(out, name, seeds):
    """read_run's tuple over runs/<name>-s<seed> for every seed (means of the losses; ERROR or NOT RUN when one
    run is), plus the per-seed final eval losses; writes OUT/mean/<name>/metrics.jsonl, the mean curves."""
    per = [(seed, read_run(out, f"{name}-s{seed}")) for seed in seeds]
    mean_file = os.path.join(out, "mean", name, "metrics.jsonl")
    if os.path.exists(mean_file):
        os.remove(mean_file)  # an earlier invocation's: not to be drawn for a run that failed this time
    if all(r[0] == "NOT RUN" for _, r in per):
        return ("NOT RUN", None, None, None, ""), []
    for seed, r in per:
        if r[0] != "OK":
            return (r[0] if r[0] != "NOT RUN" else "ERROR", None, None, None, f"seed {seed}: {r[4] or r[0]}"), []
    steps = {r[2] for _, r in per}
    loss = sum(r[1] for _, r in per) / len(per)
    trains = [r[3] for _, r in per if r[3] is not None]
    note = "" if len(steps) == 1 else f"the seeds' last evals are at steps {sorted(steps)}"
    # The mean curves: the steps every seed logged, each loss averaged.
    curves = [read_curves(os.path.join(out, "runs", f"{name}-s{seed}", "metrics.jsonl")) for seed in seeds]
    os.makedirs(os.path.dirname(mean_file), exist_ok=True)
    with open(mean_file, "w") as f:
        for which, key in ((1, "loss"), (0, "eval_loss")):
            common = set.intersection(*(set(c[which]) for c in curves))
            for step in sorted(common):
                f.write(json.dumps({"step": step, key: sum(c[which][step] for c in curves) / len(curves)}) + "\n")
    return ("OK", loss, max(steps), sum(trains) / len(trains) if trains else None, note), [r[1] for _, r in per]


def report(out, variants_path, floor, seeds=None):
    variants = parse_variants(variants_path)
    per_seed = {}
    if seeds:
        runs = {}
        for v in variants:
            runs[v["name"]], per_seed[v["name"]] = read_seeds(out, v["name"], seeds)
    else:
        runs = {v["name"]: read_run(out, v["name"]) for v in variants}
    variants = [v for v in variants if runs[v["name"]][0] != "NOT RUN"]
    rows, all_pass = [], True
    for v in variants:
        status, loss, step, train, note = runs[v["name"]]
        rel, verdict, criterion = "", "", ""
        if v["baseline"]:
            criterion = f"within {v['within'] * 100:g}% of {v['baseline']}"
            base = runs[v["baseline"]]
            if status != "OK":
                verdict = "ERROR"
            elif base[0] != "OK":
                verdict, note = "NO BASELINE", f"{v['baseline']}: {base[0]} {base[4]}".strip()
            else:
                r = loss / base[1] - 1.0
                rel = f"{r * 100:+.2f}%"
                verdict = "PASS" if abs(r) <= v["within"] + 1e-12 else "FAIL"
                if base[2] != step:
                    note = f"baseline's last eval is at step {base[2]}, this one's at {step}"
            all_pass &= verdict == "PASS"
        elif status != "OK":
            verdict = "ERROR"
        fmt = lambda x: f"{x:.4f}" if isinstance(x, float) and math.isfinite(x) else "-"
        row = [v["name"], " ".join(v["settings"]) or "-", fmt(loss), str(step or "-"), fmt(train), rel or "-",
               criterion or "baseline", verdict or "-", note.replace("|", "/")]
        if seeds:
            losses = per_seed[v["name"]]
            spread = (f"{(max(losses) - min(losses)) / loss * 100:.2f}%" if losses else "-")
            row[3:3] = [" / ".join(fmt(x) for x in losses) or "-", spread]
        rows.append(row)
    head = ["variant", "settings", "final eval loss", "at step", "final train loss", "vs baseline", "criterion",
            "result", "note"]
    if seeds:
        head[2] = f"final eval loss (mean of {len(seeds)})"
        head[3:3] = [f"seeds {', '.join(str(x) for x in seeds)}", "seed spread"]
        head[7] = "vs baseline (means)"
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]
    floor_line = (f"Task floor (the best achievable eval loss on the validation file): {floor:.4f}"
                  if floor is not None else "Task floor: not computed")
    text = "\n".join(lines)
    if seeds:
        spreads = [f"{r[0]} {r[4]}" for r, v in zip(rows, variants) if not v["baseline"] and r[4] != "-"]
        if spreads:
            floor_line += "\nSeed spread of the baselines (max - min over the seeds, of the mean): " + ", ".join(spreads)
    print(text)
    print(floor_line)

    svgs = []
    groups = {}  # (baseline, tolerance) -> members: one picture per criterion
    for v in variants:
        if v["baseline"]:
            groups.setdefault((v["baseline"], v["within"]), []).append(v["name"])
    for (base, tol), members in groups.items():
        svg = os.path.join(out, f"{base}_vs_{'_'.join(members)}.svg")
        title = f"{' and '.join(members)} vs {base} (criterion: final eval loss within {tol * 100:g}%)"
        if seeds:
            title = f"{title}, means of {len(seeds)} seeds"
        args = [sys.executable, os.path.join(HERE, "plot_curves.py"), "--out", svg, "--title", title]
        if floor is not None:
            args += ["--floor", str(floor)]
        where = (lambda n: os.path.join(out, "mean", n, "metrics.jsonl")) if seeds else (
            lambda n: os.path.join(out, "runs", n, "metrics.jsonl"))
        names = [n for n in [base] + members if os.path.exists(where(n))]
        if not names:
            continue
        args += [f"{n}={where(n)}" for n in names]
        subprocess.run(args, check=True)
        svgs.append(os.path.basename(svg))

    md = ["# Convergence of the precision variants", "",
          f"Runs under `{os.path.abspath(out)}`; variants from `{variants_path}`.", "", floor_line, "", text, ""]
    md += [f"![{s}]({s})" for s in svgs]
    tmp = os.path.join(out, "summary.md.tmp")
    with open(tmp, "w") as f:
        f.write("\n".join(md) + "\n")
    os.replace(tmp, os.path.join(out, "summary.md"))
    print(f"written: {os.path.join(out, 'summary.md')}" + "".join(f", {s}" for s in svgs))
    return 0 if all_pass else 1


def main():
    a = sys.argv[1:]
    if a[:1] == ["plan"] and len(a) in (2, 4) and (len(a) == 2 or a[2] == "--only"):
        for v in select(parse_variants(a[1]), a[3] if len(a) == 4 else ""):
            print("\t".join([v["name"], v["start"], " ".join(v["settings"])]))
        return 0
    if a[:1] == ["report"] and len(a) >= 3:
        opts, rest = {}, a[3:]
        while len(rest) >= 2 and rest[0] in ("--floor", "--seeds") and rest[0] not in opts:
            opts[rest[0]], rest = rest[1], rest[2:]
        if not rest:
            seeds = None
            if "--seeds" in opts:
                try:
                    seeds = [int(x) for x in opts["--seeds"].split(",")]
                except ValueError:
                    die(f"--seeds {opts['--seeds']}: expected whole numbers separated by commas")
            return report(a[1], a[2], float(opts["--floor"]) if "--floor" in opts else None, seeds)
    die("usage: plan VARIANTS [--only a,b] | report OUT VARIANTS [--floor F] [--seeds 42,43,44]")


if __name__ == "__main__":
    sys.exit(main())
