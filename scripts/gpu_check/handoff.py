"""scripts/gpu-check run: the GPU communication benchmarks (issue 18), two ranks on the one GPU.

`trellis bench handoff` times one stage hand-off of a decode iteration's hidden state through
CUDA IPC against a device-to-device cudaMemcpy of the same bytes (and the host path), in the
same run. Kept apart from run.py so that file stays readable; called from its bench step.
"""
import json

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


def handoff_bench(rep, env, budget, a, run_logged, help_has):
    """Runs `mpiexec -n 2 trellis bench handoff` per row count; returns (summary, failed)."""
    rep.section("stage hand-off (CUDA IPC vs cudaMemcpy, 2 ranks on one GPU)")
    if not help_has(env, "handoff", "--json"):
        rep.say("  not in this build (trellis bench handoff)")
        return "not in this build", 0
    found, lines, failed = [], [], 0
    for rows in (1, 16):
        argv = ["mpiexec", "-n", "2"] + MPI_FLAGS + ["trellis", "bench", "handoff", "--rows", str(rows), "--json"]
        rc, out, secs = run_logged(rep, argv, env, budget.cap(a.bench_timeout, a.reserve_s), log=rep.log)
        j = first_json_object(out) if rc == 0 else None
        found.append({"rows": rows, "exit": rc, "seconds": round(secs, 1), "result": j, "tail": None if j else out[-1500:]})
        if j is None:
            failed += 1
            lines.append(f"rows={rows}: failed (exit {rc})")
            rep.say(f"  rows={rows}: failed (exit {rc}):\n" + "\n".join(out.splitlines()[-8:]))
            continue
        text = ", ".join(f"{k} {v:.3g}" for k, v in j.items() if isinstance(v, (int, float)) and "us" in k)
        lines.append(f"rows={rows}: {text}")
        rep.say(f"  rows={rows}: {text}")
    # Into the log, not a file of its own: a call brings back at most 8 files.
    rep.say("  bench-handoff " + json.dumps(found))
    return "; ".join(lines), failed
