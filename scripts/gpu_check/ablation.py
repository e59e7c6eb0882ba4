"""scripts/gpu-check run --ablation: the SiPipe ablation on the GPU (issue 18), p=2 on one GPU.

Runs scripts/bench/runtime_ablation.py from this tree (the device call copies the working tree
and runs in its root; ROOT is that root, as for scripts/reference/torch_reference.py) with
`--device cuda --pp 2`: all on, all off (naive PP), and --no-cpu-sampler, --no-tsem,
--no-cuda-graphs each alone, repetitions interleaved, at each --ablation-batches. The two ranks
share the GPU under NVIDIA MPS when the machine has it (else time-sliced, and the log says
so). The Markdown table goes into gpu-check.log, the rows into bench-ablation.json (when the
8-file limit leaves room, else into the log), and every technique's gain (all on over that
technique off) is printed beside the direction SiPipe reports. Kept apart from run.py so that
file stays readable; called from its bench step.
"""
import json
import shutil
import sys
import tempfile
from pathlib import Path

from .common import ROOT
from .handoff import MPI_FLAGS, mps_start, mps_stop
from .profile import preset_dtype_args

MAX_FILES = 8  # files a device call brings back
# SiPipe (He, Zhao, Cao, arXiv 2506.22033), section 7.5 / Figure 16 (H100s, Llama 3.1 70B and
# others, batch 512): what adding each technique gave. Leaving one out here measures a
# different thing (its gain with the others on), so only the direction compares.
PAPER = {
    "--no-cpu-sampler": ("CPU sampler", "paper +16-38% over vLLM's PP"),
    "--no-tsem": ("TSEM", "paper +10-24% on top of the CPU sampler"),
    "--no-cuda-graphs": ("CUDA graphs", "not one of SiPipe's techniques"),
}
ALL_ON_PAPER = "paper: SiPipe 1.6-2.1x over vLLM's PP (which keeps its CUDA graphs; our all off has none)"


def files_back(out, a):
    """Files that this call brings back: those in OUT now, plus summary.json (written last) and
    bench-smollm2.json (written after the bench step when a model part was given)."""
    names = {p.name for p in Path(out).iterdir() if p.is_file()}
    names.add("summary.json")
    if getattr(a, "model_part", None):
        names.add("bench-smollm2.json")
    return names


def room_for(out, name, a):
    return len(files_back(out, a) | {name}) <= MAX_FILES


def put_json(rep, a, name, key, obj):
    """Writes obj as OUT/name when the 8-file limit allows it; else one log line `key {json}`."""
    if room_for(rep.out, name, a):
        (rep.out / name).write_text(json.dumps(obj, indent=1) + "\n")
        return f"{name}"
    rep.say(f"  {key} " + json.dumps(obj))
    return f"gpu-check.log ('{key}' line: no room for {name} among {MAX_FILES} files)"


def gains(result):
    """{batch: [text]}: all on vs all off, and each technique's gain = median(all on) / median(it off)."""
    by = {}
    for r in result.get("rows", []):
        by.setdefault(r["batch"], {})[r["variant"]] = r.get("median_tokens_per_s")
    out = {}
    for batch, med in by.items():
        on = med.get("all on")
        parts = []
        off = med.get("all off (naive PP)")
        if on and off:
            parts.append(f"all on vs all off {on / off:.2f}x")
        for variant, (what, paper) in PAPER.items():
            v = med.get(variant)
            if on and v:
                g = on / v
                sign = "gain" if g > 1.02 else "loss" if g < 0.98 else "flat"
                parts.append(f"{what} x{g:.2f} ({sign}; {paper})")
        out[batch] = parts
    return out


def ablation_bench(rep, env, budget, a, run_logged, gpu_present=True):
    """Returns (one-line summary, failed): failed counts the runs that failed (1 when the script
    itself did not produce its table)."""
    rep.section("SiPipe ablation on the GPU (runtime_ablation.py --device cuda --pp 2, issue 18)")
    script = ROOT / "scripts" / "bench" / "runtime_ablation.py"
    trellis = shutil.which("trellis", path=env.get("PATH"))
    if not gpu_present:
        rep.say("  not run: no GPU")
        return "not run (no GPU)", 0
    if not script.is_file() or not trellis or not shutil.which("mpiexec", path=env.get("PATH")):
        why = f"{script} is missing" if not script.is_file() else "trellis or mpiexec is not on the bundle's PATH"
        rep.say(f"  not run: {why}")
        return f"not run ({why})", 1
    cap = budget.cap(a.ablation_timeout, a.reserve_s)
    if cap < 60:
        rep.say(f"  not run: {cap:.0f} s left in the budget (60 s needed at least)")
        return f"not run ({cap:.0f} s left in the budget)", 0
    tmp = Path(tempfile.mkdtemp(prefix="trellis-ablation-"))
    json_out = tmp / "ablation.json"
    argv = [sys.executable, str(script), "--trellis", trellis, "--device", "cuda", "--pp", "2", "--tp", "1",
            "--preset", a.decode_preset, "--batches", a.ablation_batches, "--reps", str(a.ablation_reps),
            "--requests-per-batch", "2", "--prompt", "32", "--gen", str(a.ablation_gen),
            "--mpirun", "mpiexec", "--mpi-flags=" + " ".join(MPI_FLAGS),
            # a healthy run takes seconds (llama-1b loads in ~2 s); one that hangs must not eat the budget
            "--timeout", str(int(min(90, cap / 2))), "--deadline", str(int(cap - 20)), "--keep-going",
            "--json-out", str(json_out)]
    argv += ["--run-args=" + " ".join(preset_dtype_args(env, a))] if preset_dtype_args(env, a) else []
    menv = mps_start(env, run_logged, rep)
    sharing = "mps" if menv is not None else "time-sliced"
    if menv is None:
        rep.say("  MPS unavailable: the two ranks share the GPU time-sliced (each context switch costs more "
                "than a hand-off; the gains below are then not SiPipe's setting)")
    try:
        rc, out, secs = run_logged(rep, argv, menv or env, cap, log=rep.log)
    finally:
        if menv is not None:
            mps_stop(menv, run_logged, rep)
    try:
        result = json.loads(json_out.read_text())
    except (OSError, ValueError):
        result = None
    shutil.rmtree(tmp, ignore_errors=True)
    table = "\n".join(ln for ln in out.splitlines() if ln.startswith("|") or ln.startswith("("))
    rep.say(f"  gpu sharing: {sharing}; {secs:.0f} s, exit {rc}")
    rep.say(table if table else "\n".join(out.splitlines()[-15:]))
    found = {"gpu_sharing": sharing, "command": argv[1:], "exit": rc, "seconds": round(secs, 1), "result": result,
             "tail": None if result and rc == 0 else out[-3000:]}
    if result is None:
        where = put_json(rep, a, "bench-ablation.json", "bench-ablation", found)
        return f"{sharing}: failed (exit {rc}; {where})", 1
    g = gains(result)
    found["gains"] = {str(b): parts for b, parts in g.items()}
    found["paper_all_on"] = ALL_ON_PAPER
    for batch, parts in g.items():
        rep.say(f"  b={batch}: " + "; ".join(parts))
    rep.say(f"  ({ALL_ON_PAPER})")
    where = put_json(rep, a, "bench-ablation.json", "bench-ablation", found)
    failed = len(result.get("failures", []))
    note = (f", {failed} runs failed" if failed else "") + (
        f", {result['not_started']} not started (deadline)" if result.get("not_started") else "")
    line = f"{sharing}{note}; " + " | ".join(f"b={b}: " + ", ".join(p.split(' (')[0] for p in parts)
                                              for b, parts in g.items()) + f" ({where})"
    return line, failed


def merge_into_ablation(rep, key, obj):
    """Adds obj under key to OUT/bench-ablation.json when that file exists; True when it did."""
    path = rep.out / "bench-ablation.json"
    if not path.is_file():
        return False
    try:
        d = json.loads(path.read_text())
    except ValueError:
        return False
    d[key] = obj
    path.write_text(json.dumps(d, indent=1) + "\n")
    return True
