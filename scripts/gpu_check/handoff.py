"""scripts/gpu-check run: the GPU communication benchmarks (issue 18), two ranks on the one GPU.

`trellis bench handoff` times one stage hand-off of a decode iteration's hidden state through
CUDA IPC against a device-to-device cudaMemcpy of the same bytes (and the host path), in the
same run. Kept apart from run.py so that file stays readable; called from its bench step.
"""
import json
import os
import shutil
import subprocess
import tempfile
import time

MPI_FLAGS = ["--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader,tcp",
             "--mca", "btl_vader_single_copy_mechanism", "none"]


def first_json_object(text):
    """The first line-spanning JSON object in text (log lines may come before it)."""
    start = text.find("{")
    while start >= 0:
        try:
            return json.loads(text[start:])
        except json.JSONDecodeError:
            try:
                obj, _ = json.JSONDecoder().raw_decode(text[start:])
                return obj
            except json.JSONDecodeError:
                start = text.find("{", start + 1)
    return None


def mps_start(env, run_logged, rep):
    """Starts NVIDIA's MPS daemon (two processes then share the GPU without time-slicing);
    returns the environment for its clients, or None when it is not there or did not start."""
    if not shutil.which("nvidia-cuda-mps-control"):
        rep.say("  MPS: nvidia-cuda-mps-control is not on this machine")
        return None
    tmp = tempfile.mkdtemp(prefix="trellis-mps-")
    menv = dict(env, CUDA_MPS_PIPE_DIRECTORY=tmp + "/pipe", CUDA_MPS_LOG_DIRECTORY=tmp + "/log")
    os.makedirs(menv["CUDA_MPS_PIPE_DIRECTORY"])
    os.makedirs(menv["CUDA_MPS_LOG_DIRECTORY"])
    rc, out, _ = run_logged(rep, ["nvidia-cuda-mps-control", "-d"], menv, 20, log=rep.log)
    if rc != 0:
        rep.say(f"  MPS: the daemon did not start (exit {rc}): {out.strip()[-200:]}")
        return None
    time.sleep(1)
    return menv


def mps_stop(menv, run_logged, rep):
    p = subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", env=menv, text=True, capture_output=True, timeout=20)
    rep.log.write(f"\n$ echo quit | nvidia-cuda-mps-control\n[exit {p.returncode}]\n{p.stdout}{p.stderr}")


def handoff_bench(rep, env, budget, a, run_logged, help_has):
    """Runs `mpiexec -n 2 trellis bench handoff` per row count, then again under MPS where the
    machine has it (two processes on one GPU are otherwise time-sliced: each switch between
    their contexts costs more than the copy); returns (summary, failed)."""
    rep.section("stage hand-off (CUDA IPC vs cudaMemcpy, 2 ranks on one GPU)")
    if not help_has(env, "handoff", "--json"):
        rep.say("  not in this build (trellis bench handoff)")
        return "not in this build", 0
    found, lines, failed = [], [], 0

    def one(rows, label, run_env):
        nonlocal failed
        argv = ["mpiexec", "-n", "2"] + MPI_FLAGS + ["trellis", "bench", "handoff", "--rows", str(rows), "--json"]
        rc, out, secs = run_logged(rep, argv, run_env, budget.cap(a.bench_timeout, a.reserve_s), log=rep.log)
        j = first_json_object(out) if rc == 0 else None
        found.append({"rows": rows, "gpu_sharing": label, "exit": rc, "seconds": round(secs, 1), "result": j,
                      "tail": None if j else out[-1500:]})
        if j is None:
            failed += 1
            lines.append(f"{label} rows={rows}: failed (exit {rc})")
            rep.say(f"  {label} rows={rows}: failed (exit {rc}):\n" + "\n".join(out.splitlines()[-8:]))
            return
        text = ", ".join(f"{k} {v:.3g}" for k, v in j.items() if isinstance(v, (int, float)) and "us" in k)
        lines.append(f"{label} rows={rows}: {text}")
        rep.say(f"  {label} rows={rows}: {text}")

    for rows in (1, 16):
        one(rows, "time-sliced", env)
    menv = mps_start(env, run_logged, rep)
    if menv is not None:
        try:
            for rows in (1, 16):
                one(rows, "mps", menv)
        finally:
            mps_stop(menv, run_logged, rep)
    # Into the log, not a file of its own: a call brings back at most 8 files.
    rep.say("  bench-handoff " + json.dumps(found))
    return "; ".join(lines), failed
