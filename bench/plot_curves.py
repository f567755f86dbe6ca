#!/usr/bin/env python3
"""Side-by-side loss curves of several soltrain runs as one SVG, with the standard library only (the GPU
machine has no matplotlib).

Two panels, eval loss and train loss against the step, one line per run, a legend and axes. The loss axis
is logarithmic: the runs compared end within a few percent of each other near a floor, which a linear axis
from the first step's loss would flatten into one line. An optional dashed line marks the task's floor.

Usage: plot_curves.py --out FILE.svg [--title T] [--floor LOSS] LABEL=RUN_DIR/metrics.jsonl ...
"""
import argparse
import html
import json
import math
import os
import sys

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
PANEL_W, PANEL_H, MARGIN_L, MARGIN_T, GAP = 420, 300, 60, 50, 80


def read_metrics(path):
    """(eval points, train points) as lists of (step, loss); lines that are not numbers are skipped."""
    evals, train = [], []
    with open(path) as f:
        for line in f:
            try:
                j = json.loads(line)
            except json.JSONDecodeError:
                continue  # a run cut short mid-line
            for key, out in (("eval_loss", evals), ("loss", train)):
                v = j.get(key)
                if isinstance(v, (int, float)) and math.isfinite(v) and v > 0:
                    out.append((j.get("step", 0), float(v)))
    return evals, train


def nice_ticks_log(lo, hi):
    if hi / lo < 20:  # under ~one decade 1-2-5 leaves one tick or none: evenly spaced values instead
        return nice_ticks_lin(lo, hi)
    ticks = []
    for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1):
        for m in (1, 2, 5):
            t = m * 10.0**k
            if lo <= t <= hi:
                ticks.append(t)
    return ticks or [lo, hi]


def nice_ticks_lin(lo, hi, n=5):
    span = hi - lo or 1.0
    step = 10 ** math.floor(math.log10(span / n))
    for m in (1, 2, 5, 10):
        if span / (m * step) <= n:
            step *= m
            break
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


def fmt(v):
    return f"{v:g}" if abs(v) >= 0.01 else f"{v:.0e}"


def panel(runs, which, title, x0, floor):
    """SVG elements of one panel; `which` is 0 (eval) or 1 (train)."""
    pts = [p for r in runs for p in r[which]]
    out = [f'<text x="{x0 + PANEL_W / 2}" y="{MARGIN_T - 12}" text-anchor="middle" font-size="14">{title}</text>',
           f'<rect x="{x0}" y="{MARGIN_T}" width="{PANEL_W}" height="{PANEL_H}" fill="none" stroke="#333"/>']
    if not pts:
        out.append(f'<text x="{x0 + PANEL_W / 2}" y="{MARGIN_T + PANEL_H / 2}" text-anchor="middle">no data</text>')
        return out
    xs, ys = [p[0] for p in pts], [p[1] for p in pts] + ([floor] if floor else [])
    xlo, xhi = min(xs), max(xs)
    xhi = xhi if xhi > xlo else xlo + 1
    ylo, yhi = min(ys) / 1.05, max(ys) * 1.05
    sx = lambda x: x0 + (x - xlo) / (xhi - xlo) * PANEL_W
    sy = lambda y: MARGIN_T + PANEL_H - (math.log(y) - math.log(ylo)) / (math.log(yhi) - math.log(ylo)) * PANEL_H
    for t in nice_ticks_log(ylo, yhi):
        y = sy(t)
        out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + PANEL_W}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{fmt(t)}</text>')
    for t in nice_ticks_lin(xlo, xhi):
        x = sx(t)
        out.append(f'<line x1="{x:.1f}" y1="{MARGIN_T}" x2="{x:.1f}" y2="{MARGIN_T + PANEL_H}" stroke="#eee"/>')
        out.append(f'<text x="{x:.1f}" y="{MARGIN_T + PANEL_H + 16}" text-anchor="middle" font-size="11">{t:g}</text>')
    out.append(f'<text x="{x0 + PANEL_W / 2}" y="{MARGIN_T + PANEL_H + 34}" text-anchor="middle" font-size="12">step</text>')
    out.append(f'<text x="{x0 - 44}" y="{MARGIN_T + PANEL_H / 2}" font-size="12" text-anchor="middle" '
               f'transform="rotate(-90 {x0 - 44} {MARGIN_T + PANEL_H / 2})">loss (log scale)</text>')
    if floor:
        y = sy(floor)
        out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + PANEL_W}" y2="{y:.1f}" stroke="#555" stroke-dasharray="5,4"/>')
        out.append(f'<text x="{x0 + PANEL_W - 4}" y="{y - 4:.1f}" text-anchor="end" font-size="10">floor {floor:.3f}</text>')
    for i, r in enumerate(runs):
        series = sorted(r[which])
        if not series:
            continue
        c = COLORS[i % len(COLORS)]
        d = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in series)
        out.append(f'<polyline points="{d}" fill="none" stroke="{c}" stroke-width="1.5"/>')
        if which == 0:  # evaluations are sparse: mark them
            out += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{c}"/>' for x, y in series]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--title", default="")
    ap.add_argument("--floor", type=float, default=None)
    ap.add_argument("runs", nargs="+", metavar="LABEL=METRICS_JSONL")
    a = ap.parse_args()
    runs = []
    for spec in a.runs:
        label, sep, path = spec.partition("=")
        if not sep or not label:
            print(f"plot_curves.py: {spec!r}: expected LABEL=path/to/metrics.jsonl", file=sys.stderr)
            sys.exit(2)
        evals, train = read_metrics(path) if os.path.exists(path) else ([], [])
        runs.append((evals, train, label))
    width = MARGIN_L + 2 * PANEL_W + GAP + 20
    legend_y = MARGIN_T + PANEL_H + 56
    height = legend_y + 18 * len(runs) + 10
    body = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif">',
            f'<rect width="{width}" height="{height}" fill="white"/>',
            f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="15" font-weight="bold">{html.escape(a.title)}</text>']
    body += panel(runs, 0, "eval loss", MARGIN_L, a.floor)
    body += panel(runs, 1, "train loss", MARGIN_L + PANEL_W + GAP, None)
    for i, (evals, _, label) in enumerate(runs):
        y = legend_y + 18 * i
        c = COLORS[i % len(COLORS)]
        note = f" (final eval {evals[-1][1]:.4f} at step {evals[-1][0]})" if evals else " (no metrics)"
        body.append(f'<line x1="{MARGIN_L}" y1="{y}" x2="{MARGIN_L + 24}" y2="{y}" stroke="{c}" stroke-width="3"/>')
        body.append(f'<text x="{MARGIN_L + 30}" y="{y + 4}" font-size="12">{html.escape(label)}{note}</text>')
    body.append("</svg>")
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:  # staged, then renamed: never a half-written picture
        f.write("\n".join(body) + "\n")
    os.replace(tmp, a.out)


if __name__ == "__main__":
    main()
