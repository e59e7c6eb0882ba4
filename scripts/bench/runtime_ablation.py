#!/usr/bin/env python3
"""SiPipe ablation (issue 6, SiPipe Figure 16 style) with `trellis run`, repetitions interleaved.

For each batch size (sequences in flight), runs every variant -- all techniques on, all off
(naive PP), and each technique switched off alone -- once per repetition, cycling through
the variants so that slow phases of a shared machine hit all of them alike. Prints a
Markdown table: tokens/s of every repetition, the median, TPOT p50 median and the ratio of
medians against "all off". Also writes the raw rows as JSON (--raw FILE).

usage: scripts/bench/runtime_ablation.py --trellis build/release/launchers/trellis
         [--pp 2] [--tp 1] [--preset small] [--batches 32,64,128] [--reps 3]
         [--prompt 32] [--gen 32] [--requests-per-batch 2] [--pin-cores] [--raw out.json]
         [--model FILE.gguf|.safetensors] [--sampled] [--lock /tmp/trellis-bench.lock]
         [--trace-dir DIR]
--model runs a model file instead of the synthetic preset; --sampled replaces the greedy
synthetic workload by a prompts file of random token ids whose requests sample (temperature,
top-p, repetition and presence penalties, per-request seeds), the case where SiPipe's
decoupled sampler has the most work to take off the last stage.
--lock FILE runs every measured `trellis run` under `flock FILE` (the shared machine's
benchmark lock) and records the load average (/proc/loadavg) before and after each run in
the raw rows. Every run also records the fraction of all CPUs' time that was idle while
it ran (/proc/stat, whole machine, model load included): the table's last column. --trace-dir DIR adds, after the timed repetitions, one traced run per batch
and variant (not counted in the medians) and writes DIR/b<batch>-<variant>.json, for
scripts/bench/pipeline_bubbles.py.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

VARIANTS = [
    ("all on", []),
    ("all off (naive PP)", ["--no-cpu-sampler", "--no-tsem", "--no-sat"]),
    ("--no-cpu-sampler", ["--no-cpu-sampler"]),
    ("--no-tsem", ["--no-tsem"]),
    ("--no-sat", ["--no-sat"]),
]


def mpirun_prefix(ranks):
    cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none",
           "--mca", "btl", "self,vader,tcp", "--mca", "btl_vader_single_copy_mechanism", "none"]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    return cmd


def sampled_prompts(path, n, prompt_len, gen, vocab):
    rng = random.Random(1234)
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": i, "tokens": [rng.randrange(vocab) for _ in range(prompt_len)],
                                "sampling": {"temperature": 0.8, "top_p": 0.95, "repetition_penalty": 1.1,
                                             "presence_penalty": 0.2, "seed": i, "max_tokens": gen}}) + "\n")


def cpu_jiffies():
    """(idle, total) jiffies of all CPUs from /proc/stat (idle includes iowait)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return v[3] + v[4], sum(v[:8])


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def run_once(args, batch, flags, trace=None):
    n = batch * args.requests_per_batch
    model = ["--model", args.model] if args.model else ["--preset", args.preset]
    if args.sampled:
        path = os.path.join(tempfile.gettempdir(), f"trellis-ablation-{os.getpid()}-{n}.jsonl")
        sampled_prompts(path, n, args.prompt, args.gen, args.vocab)
        work = ["--prompts", path]
    else:
        work = ["--workload", f"n={n},in={args.prompt},out={args.gen}"]
    cmd = mpirun_prefix(args.pp * args.tp) + [
        args.trellis, "run", "--pp", str(args.pp), "--tp", str(args.tp)] + model + work + [
        "--max-seqs", str(batch), "--json"] + flags
    if args.pin_cores:
        cmd.append("--pin-cores")
    if trace:
        cmd += ["--trace", trace]
    if args.lock:
        cmd = ["flock", args.lock] + cmd
    env = dict(os.environ, TRELLIS_KERNEL_THREADS=os.environ.get("TRELLIS_KERNEL_THREADS", "1"))
    j0 = cpu_jiffies()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    j1 = cpu_jiffies()
    idle = (j1[0] - j0[0]) / max(1, j1[1] - j0[1])
    if out.returncode != 0:
        sys.exit(f"runtime_ablation: {' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    # rank 0 prints one (indented) JSON object, the summary; log lines may come before it
    text = out.stdout
    start = 0 if text.startswith("{") else text.find("\n{") + 1
    if start > 0 or text.startswith("{"):
        summary = json.JSONDecoder().raw_decode(text[start:])[0]
        summary["machine_idle_fraction"] = idle  # all CPUs, over the whole run (load included)
        return summary
    sys.exit(f"runtime_ablation: no JSON summary in the output of {' '.join(cmd)}")


def pick(summary, *path):
    v = summary
    for k in path:
        if not isinstance(v, dict) or k not in v:
            return None
        v = v[k]
    return v


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trellis", required=True)
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--batches", default="32,64,128")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--requests-per-batch", type=int, default=2)
    ap.add_argument("--pin-cores", action="store_true")
    ap.add_argument("--raw")
    ap.add_argument("--model")
    ap.add_argument("--sampled", action="store_true")
    ap.add_argument("--lock", help="flock this file around every run")
    ap.add_argument("--trace-dir", help="one extra traced run per batch and variant, written here")
    ap.add_argument("--vocab", type=int, default=8192, help="token ids of --sampled prompts stay below this")
    args = ap.parse_args()
    args.trellis = os.path.abspath(args.trellis)
    batches = [int(b) for b in args.batches.split(",")]
    rows = []
    for batch in batches:
        for rep in range(args.reps):
            for name, flags in VARIANTS:
                load_before = loadavg()
                s = run_once(args, batch, flags)
                rows.append({"batch": batch, "rep": rep, "variant": name,
                             "load_before": load_before, "load_after": loadavg(),
                             "tokens_per_s": pick(s, "throughput_tokens_per_s"),
                             "idle": s.get("machine_idle_fraction"),
                             "tpot_p50_ms": 1e3 * (pick(s, "tpot", "p50_s") or float("nan")), "summary": s})
                print(f"batch {batch} rep {rep + 1}/{args.reps} {name}: "
                      f"{rows[-1]['tokens_per_s']} tok/s (load {load_before} -> {rows[-1]['load_after']})",
                      file=sys.stderr, flush=True)
        if args.trace_dir:
            os.makedirs(args.trace_dir, exist_ok=True)
            for name, flags in VARIANTS:
                slug = name.split(" (")[0].replace(" ", "-").lstrip("-")
                path = os.path.join(args.trace_dir, f"b{batch}-{slug}.json")
                s = run_once(args, batch, flags, trace=path)
                print(f"batch {batch} traced {name}: {pick(s, 'throughput_tokens_per_s')} tok/s -> {path}",
                      file=sys.stderr, flush=True)
    if args.raw:
        with open(args.raw, "w") as f:
            json.dump(rows, f, indent=1)
    print("| batch | variant | tokens/s per repetition | median tokens/s | TPOT p50 median | vs all off "
          "| CPUs idle (median) |")
    print("|---|---|---|---|---|---|---|")
    for batch in batches:
        med = {}
        for name, _ in VARIANTS:
            sel = [r for r in rows if r["batch"] == batch and r["variant"] == name]
            tps = [r["tokens_per_s"] for r in sel if r["tokens_per_s"] is not None]
            tpot = [r["tpot_p50_ms"] for r in sel if r["tpot_p50_ms"] is not None]
            idle = [r["idle"] for r in sel if r.get("idle") is not None]
            med[name] = (statistics.median(tps) if tps else float("nan"),
                         statistics.median(tpot) if tpot else float("nan"), tps,
                         statistics.median(idle) if idle else float("nan"))
        base = med["all off (naive PP)"][0]
        for name, _ in VARIANTS:
            m, t, tps, idle = med[name]
            print(f"| {batch} | {name} | {', '.join(f'{x:.0f}' for x in tps)} | {m:.0f} | {t:.1f} ms | "
                  f"{m / base:.2f}x | {100 * idle:.0f}% |")
    loads = [float(r[k].split()[0]) for r in rows for k in ("load_before", "load_after")]
    if loads:
        print(f"\n(load average, 1 min, over the runs: {min(loads):.2f}-{max(loads):.2f})")


if __name__ == "__main__":
    main()
