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
         [--trace-dir DIR] [--device cpu|cuda] [--variants a,b] [--mpirun NAME]
         [--mpi-flags "..."] [--timeout 600] [--deadline S] [--keep-going] [--json-out FILE]
--model runs a model file instead of the synthetic preset; --sampled replaces the greedy
synthetic workload by a prompts file of random token ids whose requests sample (temperature,
top-p, repetition and presence penalties, per-request seeds), the case where SiPipe's
decoupled sampler has the most work to take off the last stage.
--lock FILE runs every measured `trellis run` under `flock FILE` (the shared machine's
benchmark lock) and records the load average (/proc/loadavg) before and after each run in
the raw rows. Every run also records the fraction of all CPUs' time that was idle while
it ran (/proc/stat, whole machine, model load included): the table's last column, and the
CPUs rank 0's log says comm.bind_cores gave the ranks and how its engine threads wait
(spinning or blocking), in a line under the table and in --json-out's "hosts".
--trace-dir DIR adds, after the timed repetitions, one traced run per batch
and variant (not counted in the medians) and writes DIR/b<batch>-<variant>.json, for
scripts/bench/pipeline_bubbles.py.

GPU stages (issue 18): --device cuda passes `--device cuda` to every `trellis run` (default
cpu) and swaps the variant list for: all on, all off (naive PP: --no-cpu-sampler --no-tsem
--no-sat --no-cuda-graphs), --no-cpu-sampler, --no-tsem and --no-cuda-graphs. --no-sat alone
is left out on cuda: between GPU stages of one host the hidden state goes through CUDA IPC
(comm.stage_handoff auto), not the host stream whose framing SAT shapes, so it would time
the same path as "all on". TRELLIS_KERNEL_THREADS=1 is set for cpu runs only. Each run gets
the environment of this script (os.environ), so a caller that wants NVIDIA MPS sets
CUDA_MPS_PIPE_DIRECTORY / CUDA_MPS_LOG_DIRECTORY before starting it.
--variants all-on,all-off,no-cpu-sampler,... picks a subset (names as in the table, lower
case, spaces as '-', without the "(naive PP)" and the leading dashes).
--mpirun NAME is the launcher (default mpirun; --allow-run-as-root is added as root, which
Open MPI's mpirun/mpiexec accept); --mpi-flags "..." replaces the flags after `-np N`
(default: --oversubscribe --bind-to none --mca btl self,vader,tcp --mca
btl_vader_single_copy_mechanism none; write --mpi-flags="--one" for a single flag).
--timeout S bounds each run (default 600; the run's process group is killed). --deadline S
starts no run after S seconds from the start and prints the table of what finished (with
per-run timeouts shortened to fit); --keep-going records a failed or timed-out run (with the
tail of its output) and goes on instead of exiting (unless no run has succeeded yet: then
the rest are not started), and exits 1 after the table. --json-out FILE writes the table's rows
(batch, variant, tokens/s of each repetition, medians, ratio against all off) and the
settings as JSON, beside the Markdown table on stdout. --run-args "..." adds arguments to every
`trellis run` (e.g. --run-args='--preset-dtype bf16': a GPU preset with bf16 weights).
"""
import argparse
import json
import math
import os
import random
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

VARIANTS = [
    ("all on", []),
    ("all off (naive PP)", ["--no-cpu-sampler", "--no-tsem", "--no-sat"]),
    ("--no-cpu-sampler", ["--no-cpu-sampler"]),
    ("--no-tsem", ["--no-tsem"]),
    ("--no-sat", ["--no-sat"]),
]
# GPU stages: no --no-sat alone (the hand-off between GPU stages of one host is CUDA IPC, not
# the host stream SAT shapes); CUDA graphs are switched off alone and in "all off".
CUDA_VARIANTS = [
    ("all on", []),
    ("all off (naive PP)", ["--no-cpu-sampler", "--no-tsem", "--no-sat", "--no-cuda-graphs"]),
    ("--no-cpu-sampler", ["--no-cpu-sampler"]),
    ("--no-tsem", ["--no-tsem"]),
    ("--no-cuda-graphs", ["--no-cuda-graphs"]),
]
BASE = "all off (naive PP)"
MPI_FLAGS = ["--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader,tcp",
             "--mca", "btl_vader_single_copy_mechanism", "none"]


class RunFailed(Exception):
    pass


def slug(name):
    """'all off (naive PP)' -> 'all-off', '--no-tsem' -> 'no-tsem' (file names, --variants)."""
    return name.split(" (")[0].replace(" ", "-").lstrip("-").lower()


def pick_variants(device, wanted):
    variants = CUDA_VARIANTS if device == "cuda" else VARIANTS
    if not wanted:
        return variants
    names = [slug(w.strip()) for w in wanted.split(",") if w.strip()]
    known = {slug(n): (n, f) for n, f in variants}
    bad = [n for n in names if n not in known]
    if bad:
        sys.exit(f"runtime_ablation: unknown --variants {','.join(bad)} for --device {device}; "
                 f"choose from {','.join(known)}")
    return [v for v in variants if slug(v[0]) in names]


def mpirun_prefix(args, ranks):
    cmd = [args.mpirun, "-np", str(ranks)] + args.mpi_flag_list
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


def tail(text, n=2000):
    return (text or "").strip()[-n:]


RUNNING = []  # the run in flight, for the signal handler


def stop_group(p):
    """SIGTERM to the run's process group (mpirun stops its ranks), then SIGKILL; (stdout, stderr)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass
        try:
            return p.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            continue
    return "", ""


def on_signal(signum, _frame):
    """SIGTERM/SIGINT to this script (a caller's timeout, Ctrl-C) also ends the run in flight,
    which sits in a process group of its own."""
    for p in RUNNING:
        stop_group(p)
    sys.exit(128 + signum)


def run_cmd(cmd, env, timeout):
    """(rc, stdout, stderr); the command runs in a process group of its own, killed whole on
    timeout (flock, mpirun and what they start), and rc is then None."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                         env=env, start_new_session=True)
    RUNNING.append(p)
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err
    except subprocess.TimeoutExpired:
        out, err = stop_group(p)
        return None, out or "", err or ""
    finally:
        RUNNING.remove(p)


def run_once(args, batch, flags, trace=None, timeout=None):
    n = batch * args.requests_per_batch
    model = ["--model", args.model] if args.model else ["--preset", args.preset]
    if args.sampled:
        path = os.path.join(tempfile.gettempdir(), f"trellis-ablation-{os.getpid()}-{n}.jsonl")
        sampled_prompts(path, n, args.prompt, args.gen, args.vocab)
        work = ["--prompts", path]
    else:
        work = ["--workload", f"n={n},in={args.prompt},out={args.gen}"]
    cmd = mpirun_prefix(args, args.pp * args.tp) + [
        args.trellis, "run", "--device", args.device, "--pp", str(args.pp), "--tp", str(args.tp)] + model + work + [
        "--max-seqs", str(batch), "--json"] + args.run_args.split() + flags
    if args.pin_cores:
        cmd.append("--pin-cores")
    if trace:
        cmd += ["--trace", trace]
    if args.lock:
        cmd = ["flock", args.lock] + cmd
    env = dict(os.environ)
    if args.device == "cpu":
        env["TRELLIS_KERNEL_THREADS"] = os.environ.get("TRELLIS_KERNEL_THREADS", "1")
    timeout = args.timeout if timeout is None else timeout
    j0 = cpu_jiffies()
    try:
        rc, stdout, stderr = run_cmd(cmd, env, timeout)
    except OSError as e:
        raise RunFailed(f"runtime_ablation: cannot run {cmd[0]}: {e}")
    j1 = cpu_jiffies()
    idle = (j1[0] - j0[0]) / max(1, j1[1] - j0[1])
    if rc != 0:
        what = f"timed out after {timeout:.0f} s" if rc is None else f"failed ({rc})"
        text = "\n".join(t for t in (tail(stdout, 1000), tail(stderr)) if t)
        raise RunFailed(f"runtime_ablation: {' '.join(cmd)} {what}:\n{text}")
    # rank 0 prints one (indented) JSON object, the summary; log lines may come before it
    text = stdout
    start = 0 if text.startswith("{") else text.find("\n{") + 1
    if start > 0 or text.startswith("{"):
        summary = json.JSONDecoder().raw_decode(text[start:])[0]
        summary["machine_idle_fraction"] = idle  # all CPUs, over the whole run (load included)
        summary.update(host_of_run(stdout + "\n" + stderr))
        return summary
    raise RunFailed(f"runtime_ablation: no JSON summary in the output of {' '.join(cmd)}:\n{tail(stdout, 1000)}")


def host_of_run(log):
    """What rank 0's log says of where the run's ranks ran: the CPUs comm.bind_cores gave them
    (None: left to the launcher) and how its engine threads wait (spinning or blocking, and
    why). Recorded per run: until 2026-11-28 a rank was bound to one CPU even on a 16-core GPU
    host, and nothing in the results showed it."""
    b = re.search(r"bound (rank 0 -> .*?) \(comm\.bind_cores", log)
    w = re.search(r"rank 0: engine threads wait by (\w+) \((.*)\)\s*$", log, re.M)
    return {"core_binding": b.group(1) if b else None, "host_waits": w.group(1) if w else None,
            "host_waits_why": w.group(2) if w else None}


def pick(summary, *path):
    v = summary
    for k in path:
        if not isinstance(v, dict) or k not in v:
            return None
        v = v[k]
    return v


def finite(x):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


def table_rows(rows, batches, variants):
    """One row per batch and variant: repetitions, medians and the ratio against all off."""
    table = []
    for batch in batches:
        med = {}
        for name, flags in variants:
            sel = [r for r in rows if r["batch"] == batch and r["variant"] == name]
            tps = [r["tokens_per_s"] for r in sel if r["tokens_per_s"] is not None]
            tpot = [r["tpot_p50_ms"] for r in sel if r["tpot_p50_ms"] is not None and not math.isnan(r["tpot_p50_ms"])]
            idle = [r["idle"] for r in sel if r.get("idle") is not None]
            med[name] = (statistics.median(tps) if tps else float("nan"),
                         statistics.median(tpot) if tpot else float("nan"), tps,
                         statistics.median(idle) if idle else float("nan"), flags)
        base = med[BASE][0] if BASE in med else float("nan")
        for name, _ in variants:
            m, t, tps, idle, flags = med[name]
            table.append({"batch": batch, "variant": name, "flags": flags, "tokens_per_s": tps,
                          "median_tokens_per_s": m, "tpot_p50_ms_median": t,
                          "vs_all_off": m / base if base and not math.isnan(base) else float("nan"),
                          "cpus_idle_median": idle})
    return table


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trellis", required=True, help="trellis binary (a bare name is looked up on PATH)")
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
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="trellis run --device (default cpu); cuda swaps --no-sat for --no-cuda-graphs")
    ap.add_argument("--variants", help="comma-separated subset, e.g. all-on,all-off,no-tsem (default all)")
    ap.add_argument("--mpirun", default="mpirun", help="MPI launcher (default mpirun)")
    ap.add_argument("--mpi-flags", help="launcher flags after -np N (default: " + " ".join(MPI_FLAGS) + ")")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per run (default 600)")
    ap.add_argument("--deadline", type=float, help="start no run after this many seconds; print what finished")
    ap.add_argument("--keep-going", action="store_true",
                    help="record a failed run and go on (exit 1 at the end) instead of exiting at once")
    ap.add_argument("--run-args", default="", help="more `trellis run` arguments for every run, e.g. "
                    "--run-args='--preset-dtype bf16'")
    ap.add_argument("--json-out", help="write the table's rows and the settings as JSON here")
    args = ap.parse_args()
    t0 = time.time()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if os.sep in args.trellis:
        args.trellis = os.path.abspath(args.trellis)
    else:
        args.trellis = shutil.which(args.trellis) or sys.exit(f"runtime_ablation: {args.trellis} is not on PATH")
    args.mpi_flag_list = MPI_FLAGS if args.mpi_flags is None else shlex.split(args.mpi_flags)
    variants = pick_variants(args.device, args.variants)
    batches = [int(b) for b in args.batches.split(",")]
    rows, failures, skipped = [], [], 0

    def attempt(batch, name, flags, trace=None):
        """run_once within the deadline; None when skipped or (with --keep-going) failed. A
        failure before any run succeeded stops every later run too (a setup that cannot start
        would fail them all, each after up to --timeout)."""
        nonlocal skipped
        timeout = args.timeout
        left = math.inf if args.deadline is None else args.deadline - (time.time() - t0)
        if left <= 0 or (failures and not rows):
            skipped += 1
            return None
        try:
            return run_once(args, batch, flags, trace=trace, timeout=min(timeout, max(left, 5.0)))
        except RunFailed as e:
            if not args.keep_going:
                sys.exit(str(e))
            failures.append({"batch": batch, "variant": name, "traced": bool(trace), "error": str(e)[-1500:]})
            print(f"batch {batch} {name}: {str(e)[-600:]}", file=sys.stderr, flush=True)
            return None

    for batch in batches:
        for rep in range(args.reps):
            for name, flags in variants:
                load_before = loadavg()
                s = attempt(batch, name, flags)
                if s is None:
                    continue
                rows.append({"batch": batch, "rep": rep, "variant": name,
                             "load_before": load_before, "load_after": loadavg(),
                             "tokens_per_s": pick(s, "throughput_tokens_per_s"),
                             "idle": s.get("machine_idle_fraction"),
                             "tpot_p50_ms": 1e3 * (pick(s, "tpot", "p50_s") or float("nan")),
                             "core_binding": s.get("core_binding"), "host_waits": s.get("host_waits"),
                             "summary": s})
                print(f"batch {batch} rep {rep + 1}/{args.reps} {name}: "
                      f"{rows[-1]['tokens_per_s']} tok/s (load {load_before} -> {rows[-1]['load_after']})",
                      file=sys.stderr, flush=True)
        if args.trace_dir:
            os.makedirs(args.trace_dir, exist_ok=True)
            for name, flags in variants:
                path = os.path.join(args.trace_dir, f"b{batch}-{slug(name)}.json")
                s = attempt(batch, name, flags, trace=path)
                if s is not None:
                    print(f"batch {batch} traced {name}: {pick(s, 'throughput_tokens_per_s')} tok/s -> {path}",
                          file=sys.stderr, flush=True)
    if args.raw:
        with open(args.raw, "w") as f:
            json.dump(rows, f, indent=1)
    table = table_rows(rows, batches, variants)
    print("| batch | variant | tokens/s per repetition | median tokens/s | TPOT p50 median | vs all off "
          "| CPUs idle (median) |")
    print("|---|---|---|---|---|---|---|")
    for r in table:
        if not r["tokens_per_s"]:
            print(f"| {r['batch']} | {r['variant']} | (no run finished) | - | - | - | - |")
            continue
        t = r["tpot_p50_ms_median"]
        ratio = f"{r['vs_all_off']:.2f}x" if not math.isnan(r["vs_all_off"]) else "n/a"
        print(f"| {r['batch']} | {r['variant']} | {', '.join(f'{x:.0f}' for x in r['tokens_per_s'])} | "
              f"{r['median_tokens_per_s']:.0f} | {t:.{2 if t < 10 else 1}f} ms | {ratio} | "
              f"{100 * r['cpus_idle_median']:.0f}% |")
    hosts = sorted({(r.get("core_binding") or "left to the launcher", r.get("host_waits") or "not logged")
                    for r in rows})
    if hosts:
        print("\n(rank 0's CPUs and engine waits over the runs: "
              + "; ".join(f"{b}, waits {w}" for b, w in hosts) + ")")
    loads = [float(r[k].split()[0]) for r in rows for k in ("load_before", "load_after")]
    if loads:
        print(f"\n(load average, 1 min, over the runs: {min(loads):.2f}-{max(loads):.2f})")
    if failures or skipped:
        why = "the first run failed" if failures and not rows else f"the --deadline of {args.deadline} s passed"
        print(f"\n({len(failures)} runs failed" + (f", {skipped} not started: {why})" if skipped else ")"))
    if args.json_out:
        settings = {k: getattr(args, k) for k in ("device", "pp", "tp", "preset", "model", "sampled", "prompt", "gen",
                                                   "requests_per_batch", "reps", "mpirun", "timeout", "deadline")}
        settings.update(batches=batches, variants=[n for n, _ in variants], mpi_flags=args.mpi_flag_list,
                        kernel_threads=os.environ.get("TRELLIS_KERNEL_THREADS", "1" if args.device == "cpu" else None),
                        mps_pipe_directory=os.environ.get("CUDA_MPS_PIPE_DIRECTORY"))
        clean = [{k: (finite(v) if isinstance(v, float) else v) for k, v in r.items()} for r in table]
        with open(args.json_out, "w") as f:
            json.dump({"settings": settings, "rows": clean, "runs": len(rows),
                       "hosts": [{"core_binding": b, "host_waits": w} for b, w in hosts], "failures": failures,
                       "not_started": skipped, "seconds": round(time.time() - t0, 1)}, f, indent=1)
            f.write("\n")
    if failures:
        sys.exit(1)  # --keep-going: the table and JSON are out, but a run failed


if __name__ == "__main__":
    main()
