#!/usr/bin/env python3
"""One Markdown table from scripts/bench-serve --save-result files: a row per (request rate,
server), servers side by side under each rate. The server is the result's "label".

  scripts/bench/serve_table.py out/serve-bench/*.json
"""
import json
import math
import sys
from pathlib import Path


def rate_key(r):
    return math.inf if r == "inf" else float(r)


def main(paths):
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    rows = []
    for p in paths:
        try:
            d = json.loads(Path(p).read_text())
            rows.append(d)
        except (OSError, ValueError) as e:
            print(f"serve_table: {p}: {e}", file=sys.stderr)
            return 1
    labels = list(dict.fromkeys(d.get("label") or d.get("base_url") for d in rows))
    rows.sort(key=lambda d: (rate_key(d["request_rate"]), labels.index(d.get("label") or d.get("base_url"))))
    slos = next((d["goodput_slos_ms"] for d in rows if d.get("goodput_slos_ms")), None)
    good = "goodput (req/s)" + (" " + ", ".join(f"{k}<={v:g}ms" for k, v in slos.items()) if slos else "")
    head = ["rate (req/s)", "server", "ok/sent", "req/s", "out tok/s", "TTFT p50 (ms)", "TTFT p99 (ms)",
            "TPOT p50 (ms)", "TPOT p99 (ms)", "ITL p50 (ms)", good]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" if i < 2 else "--:" for i in range(len(head))) + "|")
    for d in rows:
        g = d.get("request_goodput")
        cells = [str(d["request_rate"]), d.get("label") or d["base_url"],
                 f"{d['completed']}/{d['completed'] + d['failed']}",
                 f"{d['request_throughput']:.2f}", f"{d['output_throughput']:.1f}",
                 f"{d['median_ttft_ms']:.0f}", f"{d['p99_ttft_ms']:.0f}",
                 f"{d['median_tpot_ms']:.1f}", f"{d['p99_tpot_ms']:.1f}", f"{d['median_itl_ms']:.1f}",
                 "-" if g is None else f"{g:.2f}"]
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
