#!/usr/bin/env python3
"""scripts/bench/pipeline_bubbles.py on two hand-made p=2 traces whose bubbles are known.

Each trace repeats a 10 ms cycle 12 times, with the spans trellis writes (same names, lanes
and process names). Case "on" is the shape of all techniques on (CPU executor, sampler
thread); case "off" the shape of naive PP (inline preparation and sampling, a blocking send
that waits for the next stage to finish sampling). The expected numbers are worked out in
the comments from the spans.
usage: pipeline_bubbles_test.py REPO_ROOT
"""
import json
import os
import subprocess
import sys
import tempfile

FWD, PREP, SAMPLER, SCHED = 0, 1, 2, 3


def trace(spans):
    ev = []
    for r in (0, 1):
        ev.append({"ph": "M", "name": "process_name", "pid": r, "tid": 0,
                   "args": {"name": f"rank {r} · stage {r} · tp 0 · vm"}})
    for rank, tid, name, a, b, it in spans:
        e = {"ph": "X", "name": name, "cat": "x", "pid": rank, "tid": tid, "ts": a * 1e3, "dur": (b - a) * 1e3}
        if it is not None:
            e["args"] = {"iteration": it}
        ev.append(e)
    return {"traceEvents": ev}


def case_on():
    s = []
    for i in range(12):
        c = 10.0 * i
        # rank 0: forward 6, send 0.5, then waits for its input 3.5
        s += [(0, FWD, "forward", c, c + 6, i), (0, FWD, "block", c + 1, c + 2, i),
              (0, FWD, "send hidden", c + 6, c + 6.5, i), (0, FWD, "wait input", c + 6.5, c + 10, None),
              # its CPU executor waits for the schedule until 8.5, then prepares until 10
              (0, PREP, "wait schedule", c + 6.5, c + 8.5, None), (0, PREP, "prepare input", c + 8.5, c + 10, i + 1),
              # the scheduler waits for tokens until 8.4, schedules until 8.5, then is idle
              (0, SCHED, "recv tokens", c + 5, c + 8.4, i), (0, SCHED, "schedule", c + 8.4, c + 8.5, i + 2),
              # rank 1: hidden state from 0 to 1 (rank 0 computing), forward 6, LM head 1, wait input 2
              (1, FWD, "recv hidden", c, c + 1, i), (1, FWD, "forward", c + 1, c + 7, i),
              (1, FWD, "lm head", c + 7, c + 8, i), (1, FWD, "wait input", c + 8, c + 10, None),
              (1, PREP, "prepare input", c + 8, c + 9, i + 1), (1, PREP, "wait schedule", c + 9, c + 10, None),
              # the sampler waits for logits until 7 (rank 1's forward), samples 7 to 8.4
              (1, SAMPLER, "wait logits", c, c + 7, i), (1, SAMPLER, "sample", c + 7, c + 8.4, i)]
    # rank 0's wait input [6.5, 10): [6.5, 8.4) tokens: [6.5, 7) rank 1 computing (dependency
    # 0.5), [7, 8.4) sampling 1.4; [8.4, 8.5) scheduling (other 0.1); [8.5, 10) prep 1.5.
    # Its send [6, 6.5): rank 1 computing (dependency 0.5).
    # rank 1's recv hidden [0, 1): rank 0 computing (dependency 1); wait input [8, 9) prep 1,
    # [9, 10) the scheduler idle (other 1).
    return trace(s), {
        0: {"where": {"compute": 6, "send": 0.5, "wait input": 3.5}, "via_tokens": 1.9,
            "cause": {"prep": 1.5, "sampling": 1.4, "dependency": 1.0, "other": 0.1}},
        1: {"where": {"compute": 7, "wait hidden": 1, "wait input": 2}, "via_tokens": 0,
            "cause": {"prep": 1, "dependency": 1, "other": 1}}}


def case_off():
    s = []
    for i in range(12):
        c = 10.0 * i
        # rank 0: forward 6; the send blocks 3 (rank 1 receives only at 8.6); it waits for
        # the schedule 0.4 and prepares inline 0.6
        s += [(0, FWD, "forward", c, c + 6, i), (0, FWD, "send hidden", c + 6, c + 9, i),
              (0, FWD, "wait schedule", c + 9, c + 9.4, None), (0, FWD, "prepare input", c + 9.4, c + 10, i + 1),
              (0, SCHED, "recv tokens", c + 0.5, c + 7.6, i), (0, SCHED, "schedule", c + 7.6, c + 7.7, i + 2),
              # rank 1: forward 5 (from the cycle before), LM head 2, inline sampling 1.5,
              # tokens sent 0.1, waits for the schedule 0.4, prepares 0.6, receives 0.4
              (1, FWD, "forward", c - 1, c + 4, i), (1, FWD, "lm head", c + 4, c + 6, i),
              (1, FWD, "sample", c + 6, c + 7.5, i), (1, FWD, "send tokens", c + 7.5, c + 7.6, i),
              (1, FWD, "wait schedule", c + 7.6, c + 8, None), (1, FWD, "prepare input", c + 8, c + 8.6, i + 1),
              (1, FWD, "recv hidden", c + 8.6, c + 9, i + 1)]
    # rank 0's send [6, 9): rank 1 samples [6, 7.6) (sampling 1.6 with the tokens' send),
    # waits for the schedule [7.6, 8): scheduling 0.1 + scheduler idle 0.3 (other 0.4),
    # prepares [8, 8.6) (prep 0.6), receives [8.6, 9) (transfer 0.4). Its wait schedule
    # [9, 9.4): scheduler idle (other 0.4); its own preparation 0.6 (prep).
    # rank 1: inline sampling 1.5; the tokens' send 0.1 (transfer); wait schedule 0.4 (other);
    # inline preparation 0.6 (prep); recv hidden [8.6, 9): rank 0 sending (transfer 0.4).
    return trace(s), {
        0: {"where": {"compute": 6, "send": 3, "wait input": 0.4, "prep inline": 0.6}, "via_tokens": 0,
            "cause": {"sampling": 1.6, "other": 0.8, "prep": 1.2, "transfer": 0.4}},
        1: {"where": {"compute": 7, "sampling inline": 1.5, "send": 0.1, "wait input": 0.4, "prep inline": 0.6,
                      "wait hidden": 0.4}, "via_tokens": 0,
            "cause": {"sampling": 1.5, "transfer": 0.5, "other": 0.4, "prep": 0.6}}}


def check(root, name, doc, want):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(doc, f)
    try:
        out = subprocess.run([sys.executable, os.path.join(root, "scripts/bench/pipeline_bubbles.py"), f.name,
                              "--json"], capture_output=True, text=True, check=True).stdout
        table = subprocess.run([sys.executable, os.path.join(root, "scripts/bench/pipeline_bubbles.py"), f.name],
                               capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(f.name)
    res = json.loads(out)
    bad = []
    assert res["window"]["trim"] == 2 and res["pp"] == 2, res["window"]
    for row in res["ranks"]:
        w = want[row["rank"]]
        n = row["iterations"]
        if n != 7:
            bad.append(f"rank {row['rank']}: {n} iterations in the window, expected 7")
        per = lambda v: 1e3 * v / n  # ms per iteration
        if abs(1e3 * row["wall_s"] / n - 10) > 1e-6:
            bad.append(f"rank {row['rank']}: {1e3 * row['wall_s'] / n} ms per iteration, expected 10")
        for k, v in row["where_s"].items():
            if abs(per(v) - w["where"].get(k, 0)) > 1e-6:
                bad.append(f"{name} rank {row['rank']} where {k}: {per(v):.4f} ms, expected {w['where'].get(k, 0)}")
        for k, v in row["cause_s"].items():
            if abs(per(v) - w["cause"].get(k, 0)) > 1e-6:
                bad.append(f"{name} rank {row['rank']} cause {k}: {per(v):.4f} ms, expected {w['cause'].get(k, 0)}")
        if abs(per(row["via_tokens_s"]) - w["via_tokens"]) > 1e-6:
            bad.append(f"{name} rank {row['rank']} via tokens: {per(row['via_tokens_s']):.4f}, expected {w['via_tokens']}")
    if "| 0 (0) | 7 |" not in table:
        bad.append(f"{name}: table lacks the rank 0 row:\n{table}")
    return bad


def check_refusals(root):
    """Bad traces end with exit 1 and one line naming the file and the fault, no traceback."""
    bad = []
    cases = [("missing", None, "cannot read"), ("not JSON", '{"traceEvents": [', "is not JSON"),
             ("no list", '{"other": 1}', "no 'traceEvents' list"), ("no spans", '{"traceEvents": []}', "no spans"),
             ("span without ts", '[{"ph": "X", "name": "forward", "pid": 0, "tid": 0}]', "lacks a field")]
    for name, text, want in cases:
        path = os.path.join(tempfile.gettempdir(), f"pipeline-bubbles-bad-{os.getpid()}.json")
        if text is not None:
            with open(path, "w") as f:
                f.write(text)
        try:
            r = subprocess.run([sys.executable, os.path.join(root, "scripts/bench/pipeline_bubbles.py"), path],
                               capture_output=True, text=True)
        finally:
            if os.path.exists(path):
                os.unlink(path)
        if r.returncode != 1 or want not in r.stderr or path not in r.stderr or "Traceback" in r.stderr:
            bad.append(f"bad trace '{name}': exit {r.returncode}, stderr {r.stderr.strip()!r} (wanted '{want}' and the path)")
    return bad


def main():
    root = sys.argv[1]
    bad = check(root, "on", *case_on()) + check(root, "off", *case_off()) + check_refusals(root)
    if bad:
        sys.exit("pipeline_bubbles_test: FAILED\n" + "\n".join(bad))
    print("pipeline_bubbles_test: both cases attribute as expected; bad traces refused by name")


if __name__ == "__main__":
    main()
