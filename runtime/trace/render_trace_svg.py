#!/usr/bin/env python3
"""Renders a window of a `trellis run --trace` file as an SVG timeline (standard library only),
one row per rank and thread, coloured by category, so docs can show the pipeline bubbles.

  render_trace_svg.py TRACE.json OUT.svg [--from FRACTION] [--span FRACTION] [--title TEXT]
"""
import argparse
import json

COLORS = {"forward": "#4c78a8", "block": "#72b7b2", "all-reduce": "#f58518", "send": "#e45756",
          "recv": "#ff9da6", "sample": "#54a24b", "prep": "#b279a2", "wait": "#dddddd",
          "schedule": "#9d755d"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--from", dest="start", type=float, default=0.4)
    ap.add_argument("--span", type=float, default=0.15)
    ap.add_argument("--title", default="")
    a = ap.parse_args()
    ev = json.load(open(a.trace))["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    procs = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    xs = [e for e in ev if e["ph"] == "X"]
    t_end = max(e["ts"] + e["dur"] for e in xs)
    t0, t1 = a.start * t_end, (a.start + a.span) * t_end
    rows = sorted({(e["pid"], e["tid"]) for e in xs})
    W, left, rh, top = 1100, 230, 16, 30
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{top + rh * len(rows) + 40}" '
           f'font-family="sans-serif" font-size="11">',
           f'<text x="4" y="16" font-size="13">{a.title} — {(t1 - t0) / 1000:.1f} ms window</text>']
    for i, (pid, tid) in enumerate(rows):
        y = top + i * rh
        out.append(f'<text x="4" y="{y + 12}">{procs.get(pid, pid).split(" · ")[0]} · {procs.get(pid, "").split(" · ")[1] if " · " in procs.get(pid, "") else ""} · {names.get((pid, tid), tid)}</text>')
        out.append(f'<rect x="{left}" y="{y}" width="{W - left - 10}" height="{rh - 2}" fill="#f7f7f7"/>')
        for e in xs:
            if (e["pid"], e["tid"]) != (pid, tid) or e["ts"] + e["dur"] < t0 or e["ts"] > t1:
                continue
            s, f = max(e["ts"], t0), min(e["ts"] + e["dur"], t1)
            x = left + (s - t0) / (t1 - t0) * (W - left - 10)
            w = max(0.5, (f - s) / (t1 - t0) * (W - left - 10))
            inset = 3 if e["cat"] in ("block", "all-reduce") else 0
            out.append(f'<rect x="{x:.1f}" y="{y + inset}" width="{w:.1f}" height="{rh - 2 - 2 * inset}" '
                       f'fill="{COLORS.get(e["cat"], "#999")}"><title>{e["name"]} {e["dur"]:.0f} us</title></rect>')
    y = top + len(rows) * rh + 20
    x = left
    for cat, col in COLORS.items():
        out.append(f'<rect x="{x}" y="{y - 10}" width="12" height="12" fill="{col}"/><text x="{x + 16}" y="{y}">{cat}</text>')
        x += 90
    out.append("</svg>")
    open(a.out, "w").write("\n".join(out))


if __name__ == "__main__":
    main()
