#!/usr/bin/env python3
"""Draws the Chrome traces of `--trace-file` (one JSON file per rank) as one SVG timeline: a row
per rank and track (step, micro-batch A, micro-batch B, communication thread), a box per span,
colored by kind, so the README can show what overlapped.

Usage: trace_svg.py OUT.svg TRACE.json [TRACE.rank1.json ...] [--from-ms A --to-ms B]
"""

import argparse
import html
import json

COLORS = {"attn": "#6a9fd8", "experts": "#e8a23c", "shared": "#c98bdb", "mlp": "#e8a23c",
          "dispatch": "#4cb87a", "combine": "#2e8b57", "ep_": "#d9534f", "step": "#999999",
          "agree": "#555555", "embed": "#bbbbbb", "output": "#bbbbbb", "moe_route": "#f0d060"}


def color(name):
    for key, c in COLORS.items():
        if key in name:
            return c
    return "#cccccc"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--from-ms", type=float, default=None)
    ap.add_argument("--to-ms", type=float, default=None)
    a = ap.parse_args()
    rows = []  # (label, [(ts, dur, name)])
    for path in a.traces:
        events = json.load(open(path))["traceEvents"]
        names = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
        pid = next((e["args"]["name"] for e in events if e.get("name") == "process_name"), path)
        for tid in sorted(names):
            spans = [(e["ts"] / 1000, e["dur"] / 1000, e["name"]) for e in events
                     if e["ph"] == "X" and e["tid"] == tid]
            rows.append((f"{pid}: {names[tid]}", spans))
    t0 = a.from_ms if a.from_ms is not None else min(s[0] for _, sp in rows for s in sp)
    t1 = a.to_ms if a.to_ms is not None else max(s[0] + s[1] for _, sp in rows for s in sp)
    width, label_w, row_h = 1200, 250, 26
    scale = (width - label_w - 10) / (t1 - t0)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{row_h * len(rows) + 40}" '
           'font-family="sans-serif" font-size="11">',
           f'<rect width="100%" height="100%" fill="white"/>']
    for i, (label, spans) in enumerate(rows):
        y = 10 + i * row_h
        out.append(f'<text x="5" y="{y + 16}">{html.escape(label)}</text>')
        for ts, dur, name in spans:
            if ts + dur < t0 or ts > t1:
                continue
            x = label_w + (max(ts, t0) - t0) * scale
            w = max(1.0, (min(ts + dur, t1) - max(ts, t0)) * scale)
            out.append(f'<rect x="{x:.1f}" y="{y + 3}" width="{w:.1f}" height="{row_h - 8}" '
                       f'fill="{color(name)}" stroke="white" stroke-width="0.5">'
                       f'<title>{html.escape(name)} {dur:.3f} ms</title></rect>')
    y = 10 + len(rows) * row_h + 14
    out.append(f'<text x="{label_w}" y="{y}">{t0:.1f} ms</text>')
    out.append(f'<text x="{width - 80}" y="{y}">{t1:.1f} ms</text>')
    out.append("</svg>")
    with open(a.out, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
