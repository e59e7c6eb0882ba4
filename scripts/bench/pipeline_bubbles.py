#!/usr/bin/env python3
"""Pipeline bubbles per stage from a `trellis run --trace` file (issue 23.4, SiPipe §3.1).

usage: scripts/bench/pipeline_bubbles.py TRACE.json [--trim N] [--json]

For every rank, the forward thread's time over the steady-state window is split two ways:

* where it goes (by the forward thread's own spans): compute ('forward', 'lm head', with
  their layers), waiting for the upstream hidden state ('recv hidden': the hand-off),
  waiting for its input ('wait input' / 'wait schedule'), sends ('send hidden', 'send
  logits', 'send tokens'), input preparation done inline ('prepare input', --no-tsem),
  sampling done inline ('sample', 'recv logits', --no-cpu-sampler), and the rest (time
  between spans: untraced work or the thread not running);
* why (bubbles by cause): each wait and send is followed to what the thread it waits on
  was doing at the same instants, through further waits: the forward thread's 'wait input'
  to its CPU executor (lane cpu-prep: 'prepare input' = input preparation; 'wait schedule' =
  no scheduling output yet, so to rank 0's scheduler); the scheduler's 'recv tokens' to the
  last stage's sampler ('sample', 'recv logits', 'send tokens', or its untraced work =
  sampling; 'wait logits' = the last stage's forward thread); 'recv hidden' to the upstream
  stage's forward thread, a blocked 'send hidden' to the downstream one. What is found at the
  end is the cause: 'prepare input' -> prep, sampling work -> sampling, another stage's
  'forward'/'lm head' -> dependency (the stage waits for another stage's compute: the
  pipeline's data dependency, or its imbalance), a send meeting its receive -> transfer,
  scheduling, gaps and anything deeper than 8 hops -> other. The three bubbles of SiPipe
  §3.1 are then: sampling (load imbalance), prep (intra-stage), dependency + transfer
  (inter-stage: synchronisation and transmission). 'via tokens' is the part of the
  waits whose chain passes through the scheduler waiting for sampled tokens.

Steady-state window: rank 0's forward thread, from the start of its 'forward' span of the
(N+1)-th iteration to the start of that of the (N+1)-th last (N = --trim, default p, the
pipeline's fill and drain: the first p microbatches start the stages one by one, the last
p leave them one by one). Every rank is measured over this same interval, so the shares
compare; 'iterations' counts the 'forward' spans a rank starts inside it.

Bound: an iteration cannot be shorter than the busiest stage's own compute, nor than all
the work in flight (compute, preparation and sampling spans of every rank and thread)
spread over the cores (--cores, default this machine's); 'bound on removing every bubble'
is the iteration time over the larger of the two, the most any overlap technique could
gain on this run. (Spans are wall time: a preempted thread's span counts the time it
waited for a core, so on an oversubscribed machine both are overestimates of the work and
the bound is generous.)

Clocks: every span is stamped with the rank's steady clock (CLOCK_MONOTONIC), which on
Linux is one clock for all processes of a host, and the trace shifts all ranks by the same
origin; so spans of ranks on one host compare directly. Ranks on different hosts do not
(the script says so when the trace names more than one host; the cross-rank attribution is
then approximate).
"""
import argparse
import bisect
import collections
import json
import os
import re
import sys

FORWARD, CPU_PREP, SAMPLER, SCHEDULER, RELAY = range(5)
COMPUTE = {"forward", "lm head", "embed", "block", "all-reduce", "swift draft", "swift verify", "swift optimise",
           "kv moves"}
SAMPLING = {"sample", "recv logits", "swift candidates", "send tokens"}
SENDS = {"send hidden", "send logits", "send tokens"}
WHERE = ["compute", "wait hidden", "wait input", "send", "prep inline", "sampling inline", "other"]
CAUSES = ["prep", "sampling", "dependency", "transfer", "other"]
MAX_DEPTH = 8


class Lane:
    """A thread's spans flattened into non-overlapping segments (innermost span wins)."""

    def __init__(self, spans):
        spans = sorted(spans, key=lambda s: (s[0], -s[1]))
        segs, stack, cur = [], [], None

        def emit(a, b, name):
            if b > a:
                segs.append((a, b, name))

        eps = 1e-9  # timestamps are microseconds with ns decimals: adjacent spans may overlap by rounding
        for a, b, name in spans:
            # Close what ended before this span starts, and what it outlives (not its parent:
            # spans on one thread nest or follow each other; an overlap is rounding).
            while stack and (stack[-1][1] <= a + eps or b > stack[-1][1] + eps):
                top = stack.pop()
                end = min(top[1], a) if top[1] > a else top[1]
                emit(cur, end, top[2])
                cur = max(cur, end)
            if stack:
                emit(cur, a, stack[-1][2])
                b = min(b, stack[-1][1])  # a child never outlives its parent
            stack.append((a, b, name))
            cur = a if cur is None else max(cur, a)
        while stack:
            top = stack.pop()
            emit(cur, top[1], top[2])
            cur = top[1]
        self.segs = segs
        self.starts = [s[0] for s in segs]

    def pieces(self, a, b):
        """(start, end, name) covering [a, b); name None where no span is open."""
        out, t = [], a
        i = max(0, bisect.bisect_right(self.starts, a) - 1)
        while i < len(self.segs) and self.segs[i][0] < b:
            s0, s1, name = self.segs[i]
            if s1 > t:
                if s0 > t:
                    out.append((t, min(s0, b), None))
                out.append((max(s0, t), min(s1, b), name))
                t = min(s1, b)
            i += 1
        if t < b:
            out.append((t, b, None))
        return [p for p in out if p[1] > p[0]]

    def empty(self):
        return not self.segs


class Trace:
    def __init__(self, events):
        self.label = {}
        spans = collections.defaultdict(list)
        for e in events:
            if e.get("ph") == "M" and e.get("name") == "process_name":
                self.label[e["pid"]] = e["args"]["name"]
            elif e.get("ph") == "X":
                a = float(e["ts"]) * 1e-6
                spans[(e["pid"], e["tid"])].append((a, a + float(e["dur"]) * 1e-6, e["name"]))
                if e["name"] == "forward" and e["tid"] == FORWARD:
                    it = (e.get("args") or {}).get("iteration")
                    self.fwd_starts.setdefault(e["pid"], []).append((a, it))
        self.lanes = {k: Lane(v) for k, v in spans.items()}
        self.ranks = sorted({pid for pid, _ in spans} | set(self.label))
        self.pos = {}  # rank -> (stage, tp, host)
        for r in self.ranks:
            m = re.match(r"rank (\d+) · stage (\d+) · tp (\d+)(?: · (.*))?", self.label.get(r, ""))
            self.pos[r] = (int(m.group(2)), int(m.group(3)), m.group(4) or "") if m else (r, 0, "")
        self.pp = max(s for s, _, _ in self.pos.values()) + 1
        self.at = {(s, k): r for r, (s, k, _) in self.pos.items()}
        last = [r for r in self.ranks if self.pos[r][0] == self.pp - 1]
        with_sampler = [r for r in last if not self.lane(r, SAMPLER).empty()]
        self.sampler_rank = (with_sampler or last or [0])[0]
        self.hosts = sorted({h for _, _, h in self.pos.values()})

    fwd_starts = None

    def lane(self, rank, lane):
        return self.lanes.get((rank, lane)) or Lane([])

    def neighbour(self, rank, step):
        s, k, _ = self.pos[rank]
        return self.at.get((s + step, k))


class BadTrace(Exception):
    pass


def load(path):
    """The trace at path; BadTrace naming the file and what is wrong with it."""
    Trace.fwd_starts = {}
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as e:
        raise BadTrace(f"cannot read {path}: {e.strerror}")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadTrace(f"{path} is not JSON: {e}")
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise BadTrace(f"{path}: no 'traceEvents' list (write one with `trellis run ... --trace FILE`)")
    if not any(isinstance(e, dict) and e.get("ph") == "X" for e in events):
        raise BadTrace(f"{path}: no spans (events with ph 'X'): nothing to measure")
    try:
        t = Trace(events)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise BadTrace(f"{path}: an event lacks a field or has a wrong type ({type(e).__name__}: {e}); "
                       "expected the Chrome trace `trellis run --trace` writes")
    if not t.fwd_starts:
        raise BadTrace(f"{path}: no 'forward' spans on any rank's forward thread: nothing to measure")
    return t


def explain(tr, rank, lane, a, b, depth, via, out, came=None):
    """Adds to out[(cause, via)] the seconds of [a, b) by what (rank, lane) was doing; came:
    'recv' or 'send' when this is the peer of a hand-off that reached here."""
    if b <= a:
        return
    if depth > MAX_DEPTH or rank is None:
        out[("other", via)] += b - a
        return
    for p0, p1, name in tr.lane(rank, lane).pieces(a, b):
        d = p1 - p0
        if name is None:
            out[("sampling" if lane == SAMPLER else "other", via)] += d
        elif name in COMPUTE:
            out[("dependency", via)] += d
        elif name == "prepare input":
            out[("prep", via)] += d
        elif name in SAMPLING:
            out[("sampling", via)] += d
        elif name == "wait input" and lane == FORWARD:
            prep = tr.lane(rank, CPU_PREP)
            if prep.empty():
                explain(tr, 0, SCHEDULER, p0, p1, depth + 1, via, out)
            else:
                explain(tr, rank, CPU_PREP, p0, p1, depth + 1, via, out)
        elif name == "wait schedule":
            explain(tr, 0, SCHEDULER, p0, p1, depth + 1, via, out)
        elif name == "recv tokens":
            sl = SAMPLER if not tr.lane(tr.sampler_rank, SAMPLER).empty() else FORWARD
            explain(tr, tr.sampler_rank, sl, p0, p1, depth + 1, "tokens", out)
        elif name == "wait logits":
            explain(tr, rank, FORWARD, p0, p1, depth + 1, via, out)
        elif name == "recv hidden":
            if came == "send":  # the sender's peer is receiving: the transfer itself
                out[("transfer", via)] += d
            else:
                explain(tr, tr.neighbour(rank, -1), FORWARD, p0, p1, depth + 1, via, out, "recv")
        elif name in ("send hidden", "send logits"):
            if came == "recv":
                out[("transfer", via)] += d
            else:
                explain(tr, tr.neighbour(rank, +1), FORWARD, p0, p1, depth + 1, via, out, "send")
        else:  # 'schedule', the CPU executor's 'wait input' (no free buffer), 'relay', unknown
            out[("other", via)] += d


def analyse(tr, trim=None, cores=None):
    starts = sorted(tr.fwd_starts.get(0, []))
    trim = tr.pp if trim is None else trim
    if len(starts) < 2 * trim + 2:
        sys.exit(f"pipeline_bubbles: rank 0 ran {len(starts)} forwards, too few for a window trimmed by {trim}")
    t0, t1 = starts[trim][0], starts[-1 - trim][0]
    rows = []
    for r in tr.ranks:
        where = collections.Counter()
        cause = collections.Counter()
        for p0, p1, name in tr.lane(r, FORWARD).pieces(t0, t1):
            d = p1 - p0
            if name is None:
                where["other"] += d
                cause[("other", "")] += d
            elif name in COMPUTE:
                where["compute"] += d
            elif name == "prepare input":
                where["prep inline"] += d
                cause[("prep", "")] += d
            elif name in ("sample", "recv logits", "swift candidates"):
                where["sampling inline"] += d
                cause[("sampling", "")] += d
            elif name in SENDS:
                where["send"] += d
                if name == "send tokens":
                    cause[("transfer", "")] += d
                else:
                    explain(tr, r, FORWARD, p0, p1, 0, "", cause)
            elif name == "recv hidden":
                where["wait hidden"] += d
                explain(tr, r, FORWARD, p0, p1, 0, "", cause)
            elif name in ("wait input", "wait schedule"):
                where["wait input"] += d
                explain(tr, r, FORWARD, p0, p1, 0, "", cause)
            else:
                where["other"] += d
                cause[("other", "")] += d
        iters = sum(1 for a, _ in tr.fwd_starts.get(r, []) if t0 <= a < t1)
        side = {"prepare input (cpu-prep thread)": sum(p1 - p0 for p0, p1, n in tr.lane(r, CPU_PREP).pieces(t0, t1)
                                                      if n == "prepare input"),
                "sampling (sampler thread)": sum(p1 - p0 for p0, p1, n in tr.lane(r, SAMPLER).pieces(t0, t1)
                                                 if n in SAMPLING)}
        s, k, host = tr.pos[r]
        by_cause = {c: sum(v for (cc, _), v in cause.items() if cc == c) for c in CAUSES}
        rows.append({"rank": r, "stage": s, "tp": k, "host": host, "iterations": iters,
                     "wall_s": t1 - t0, "where_s": {w: where.get(w, 0.0) for w in WHERE},
                     "cause_s": by_cause, "via_tokens_s": sum(v for (_, via), v in cause.items() if via == "tokens"),
                     "other_threads_s": side})
    # Work in flight over the window, all ranks and threads: compute, preparation, sampling.
    # Spans are wall time, so on an oversubscribed machine a span also counts the time its
    # thread sat preempted; a sum at or above the cores in use means they had nothing idle.
    work = 0.0
    for (r, lane), ln in tr.lanes.items():
        for p0, p1, n in ln.pieces(t0, t1):
            if n in COMPUTE or n == "prepare input" or (n in SAMPLING and n != "send tokens"):
                work += p1 - p0
    # What removing every bubble could give at most: an iteration is no shorter than the
    # busiest stage's own compute (the forward thread's 'forward' + 'lm head'), nor than all
    # the work in flight spread over the cores.
    wall = t1 - t0
    busiest = max(r["where_s"]["compute"] for r in rows)
    cores = cores or os.cpu_count() or 1
    bound = {"busiest_stage_compute": wall / busiest if busiest > 0 else float("inf"),
             "cores": cores, "work_over_cores": wall / (work / cores) if work > 0 else float("inf")}
    bound["any_bubble_removal_at_most"] = min(bound["busiest_stage_compute"], bound["work_over_cores"])
    return {"work_threads": work / (t1 - t0), "bound": bound,
            "window": {"start_s": t0, "end_s": t1, "trim": trim, "rank0_iterations": len(starts) - 2 * trim - 1},
            "pp": tr.pp, "hosts": tr.hosts, "sampler_rank": tr.sampler_rank,
            "clock": "one host: comparable across ranks" if len(tr.hosts) <= 1 else
                     "several hosts: cross-rank attribution approximate", "ranks": rows}


def table(res):
    def cell(v, row):
        n = max(1, row["iterations"])
        return f"{1e3 * v / n:.2f} ({100 * v / row['wall_s']:.0f}%)"

    lines = [f"window: {1e3 * (res['window']['end_s'] - res['window']['start_s']):.0f} ms, rank 0's iterations "
             f"{res['window']['trim']}..last-{res['window']['trim']} ({res['window']['rank0_iterations']}); "
             f"clock: {res['clock']}",
             f"threads working (compute, preparation, sampling spans of all ranks per second of wall): "
             f"{res['work_threads']:.2f}",
             f"bound on removing every bubble: x{res['bound']['any_bubble_removal_at_most']:.2f} (wall / busiest "
             f"stage's compute: x{res['bound']['busiest_stage_compute']:.2f}; wall / (work / {res['bound']['cores']} "
             f"cores): x{res['bound']['work_over_cores']:.2f})", "",
             "Forward thread, where the time goes (ms/iteration and % of wall):", "",
             "| stage (rank) | iterations | busy % | " + " | ".join(WHERE[1:]) + " | of the waits: via tokens |",
             "|---|---|---|" + "---|" * (len(WHERE) - 1) + "---|"]
    for r in res["ranks"]:
        w = r["where_s"]
        lines.append(f"| {r['stage']} ({r['rank']}) | {r['iterations']} | {100 * w['compute'] / r['wall_s']:.0f}% | "
                     + " | ".join(cell(w[k], r) for k in WHERE[1:]) + f" | {cell(r['via_tokens_s'], r)} |")
    lines += ["", "Bubbles by cause (ms/iteration and % of wall; busy + these = 100%):", "",
              "| stage (rank) | ms/iteration | compute | " + " | ".join(CAUSES) +
              " | cpu-prep thread preparing | sampler thread sampling |",
              "|---|---|---|" + "---|" * len(CAUSES) + "---|---|"]
    for r in res["ranks"]:
        n = max(1, r["iterations"])
        lines.append(f"| {r['stage']} ({r['rank']}) | {1e3 * r['wall_s'] / n:.2f} | {cell(r['where_s']['compute'], r)} | "
                     + " | ".join(cell(r["cause_s"][c], r) for c in CAUSES) + " | "
                     + " | ".join(cell(v, r) for v in r["other_threads_s"].values()) + " |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--trim", type=int, help="iterations left out at each end (default: p)")
    ap.add_argument("--json", action="store_true", help="print the numbers as JSON")
    ap.add_argument("--cores", type=int, help="cores the run had (default: this machine's)")
    args = ap.parse_args()
    try:
        tr = load(args.trace)
    except BadTrace as e:
        sys.exit(f"pipeline_bubbles: {e}")
    res = analyse(tr, args.trim, args.cores)
    print(json.dumps(res, indent=1) if args.json else table(res))


if __name__ == "__main__":
    main()
