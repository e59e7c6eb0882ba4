"""scripts/gpu-check: `run` and `check`, on the GPU machine: unpack, check, test, benchmark, summarise (the entry point and its --help: scripts/gpu-check)."""
import argparse
import datetime
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path


from .common import *  # noqa: F401,F403
from .pack import read_models_env, model_note  # noqa: F401
from .model_parts import stash
from .handoff import handoff_bench
from .ablation import ablation_bench
from .profile import profile_kernels, preset_dtype_args

# ----------------------------------------------------------------------------------------- run

class Budget:
    def __init__(self, seconds):
        self.end = time.time() + seconds

    def left(self):
        return self.end - time.time()

    def cap(self, want, reserve=0):
        return max(0.0, min(want, self.left() - reserve))


class Report:
    """Everything printed also goes to OUT/gpu-check.log; at most 8 files go back, so few files."""

    def __init__(self, out):
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.log = open(out / "gpu-check.log", "w")

    def say(self, msg=""):
        print(msg, flush=True)
        self.log.write(msg + "\n")
        self.log.flush()

    def section(self, title):
        self.say("")
        self.say(f"== {title}")


def load_bundle(bundle):
    mf = bundle / "MANIFEST.json"
    if not mf.is_file():
        raise UsageError(f"{bundle} holds no MANIFEST.json: make it with `scripts/gpu-check pack --out {bundle}` "
                         "and name it in the device call's carry")
    m = json.loads(mf.read_text())
    if m.get("format") != FORMAT:
        raise UsageError(f"{mf} has format {m.get('format')}, this script reads {FORMAT}: pack it again")
    payload = bundle / m["payload"]
    if not payload.is_file():
        raise UsageError(f"{payload} is missing (the manifest names it)")
    root = Path(os.environ.get("TMPDIR", "/tmp")) / "trellis-gpu-check" / m["payload_sha256"][:16]
    if not (root / ".complete").exists():
        if payload.stat().st_size != m["payload_bytes"] or sha256(payload) != m["payload_sha256"]:
            raise UsageError(f"{payload} does not match MANIFEST.json (size or sha256): pack it again")
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        with tarfile.open(payload, "r:xz") as tf:
            tf.extractall(root)
        (root / ".complete").write_text(m["payload_sha256"] + "\n")
    return m, root


def cuda_lib_dirs():
    """Folders holding the CUDA libraries the bundle expects (NCCL, cuBLASLt, cudart): the
    toolkit's, then PyTorch's nvidia-* wheels (the GPU image ships NCCL that way)."""
    want = ("libnccl.so.2", "libcublasLt.so.13", "libcudart.so.13")
    candidates = [Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / d for d in ("lib64", "lib", "targets/x86_64-linux/lib")]
    for sp in [Path(p) for p in sys.path if p.endswith("-packages")]:
        nv = sp / "nvidia"
        if nv.is_dir():
            candidates += sorted(nv.glob("*/lib"))
    dirs = []
    for name in want:
        for d in candidates:
            if (d / name).exists():
                if d not in dirs:
                    dirs.append(d)
                break
    return [str(d) for d in dirs]


def glibcxx_ok(need):
    """True when the image's libstdc++ provides the newest GLIBCXX version the bundle needs."""
    if "GLIBCXX" not in need:
        return True
    rc, out = run_text(["/sbin/ldconfig", "-p"], timeout=30)
    m = re.search(r"libstdc\+\+\.so\.6 \(libc6,x86-64\) => (\S+)", out)
    if not m:
        return False
    data = Path(m.group(1)).read_bytes()
    want = tuple(int(x) for x in need["GLIBCXX"].split("."))
    have = [tuple(int(x) for x in v.decode().split(".")) for v in re.findall(rb"GLIBCXX_([0-9.]+[0-9])\x00", data)]
    return any(v >= want for v in have)


def make_env(m, root, scratch):
    env = dict(os.environ)
    lib = [str(root / "lib")]
    if not glibcxx_ok(m["needs"]):
        lib.append(str(root / "lib" / "fallback"))
    lib += cuda_lib_dirs()
    orig_ld = env.get("LD_LIBRARY_PATH", "")
    env["LD_LIBRARY_PATH"] = ":".join(lib + ([orig_ld] if orig_ld else []))
    env["PATH"] = str(root / "bin") + ":" + env.get("PATH", "/usr/bin:/bin")
    # Open MPI finds its components, help texts and defaults by these rather than by /usr.
    env.update({"OPAL_PREFIX": str(root), "OPAL_EXEC_PREFIX": str(root), "OPAL_BINDIR": str(root / "bin"),
                "OPAL_LIBDIR": str(root / "lib"), "OPAL_PKGLIBDIR": str(root / "lib" / "openmpi3"),
                "OPAL_DATADIR": str(root / "share"), "OPAL_PKGDATADIR": str(root / "share" / "openmpi"),
                "OPAL_SYSCONFDIR": str(root / "etc"),
                "OMPI_MCA_mca_base_param_files": str(root / "etc" / "openmpi-mca-params.conf"),
                "PMIX_MCA_mca_base_component_path": str(root / "lib" / "pmix"),
                "PMIX_PREFIX": str(root), "PMIX_PKGLIBDIR": str(root / "lib" / "pmix"),
                "PMIX_PKGDATADIR": str(root / "share" / "pmix"), "PMIX_SYSCONFDIR": str(root / "etc"),
                "UCX_MODULE_DIR": str(root / "lib" / "ucx"), "HWLOC_PLUGINS_PATH": str(root / "lib" / "hwloc"),
                "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    # A Python that trellis starts (the PyTorch peer) gets the image's own libraries back.
    shim = scratch / "bin" / "python3-host"
    shim.parent.mkdir(parents=True, exist_ok=True)
    shim.write_text(f"#!/bin/sh\nLD_LIBRARY_PATH='{orig_ld}'; export LD_LIBRARY_PATH\n"
                    f"[ -n \"$LD_LIBRARY_PATH\" ] || unset LD_LIBRARY_PATH\nexec '{sys.executable}' \"$@\"\n")
    shim.chmod(0o755)
    return env, shim


def check_libs(root, env, say):
    """ldd every ELF of the bundle under env; a library that resolves outside the bundle and
    is not expected on a CUDA image, or not at all, would be missing on the GPU machine."""
    problems, outside = [], {}
    for f in sorted(p for p in root.rglob("*") if p.is_file() and is_elf(p)):
        rel = f.relative_to(root)
        for name, path in ldd(f, env=env):
            if SYSTEM_LIB.match(name) or GCC_LIB.match(name):
                continue
            if path is None:
                problems.append(f"{rel}: {name} not found")
            elif path and not path.startswith(str(root) + "/"):
                if CUDA_LIB.match(name):
                    outside.setdefault(name, path)
                else:
                    problems.append(f"{rel}: {name} resolves to {path}, outside the bundle")
    for name, path in sorted(outside.items()):
        say(f"  {name:24s} {path} (CUDA, from this machine)")
    return problems


def glibc_problem(needs):
    have = os.confstr("CS_GNU_LIBC_VERSION") or ""  # "glibc 2.36"
    m = re.search(r"([0-9]+)\.([0-9]+)", have)
    want = needs.get("GLIBC")
    if not m or not want:
        return None
    if tuple(int(x) for x in m.groups()) < tuple(int(x) for x in want.split(".")[:2]):
        return f"this machine's {have} is older than the glibc {want} the bundle needs (pack on an older system)"
    return None


def cpu_ok(march):
    flags = set()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        return True, ""
    need = {"x86-64-v3": {"avx2", "fma", "bmi2", "movbe"},
            "x86-64-v4": {"avx2", "fma", "bmi2", "avx512f", "avx512bw", "avx512vl", "avx512dq"}}.get(march, set())
    miss = sorted(need - flags)
    return not miss, " ".join(miss)


def host_problems(m):
    problems = []
    ok, miss = cpu_ok(m["march"])
    if not ok:
        problems.append(f"this CPU lacks {miss}, which -march={m['march']} needs")
    g = glibc_problem(m["needs"])
    if g:
        problems.append(g)
    return problems


def run_logged(rep, argv, env, timeout, cwd=None, log=None):
    """Runs argv in its own process group (mpirun's ranks die with it on timeout)."""
    t0 = time.time()
    if timeout <= 1:
        return 124, "[no time left in the budget]", 0.0
    try:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                             start_new_session=True, text=True, errors="replace")
    except OSError as e:
        return 127, f"cannot run {argv[0]}: {e}", 0.0
    try:
        out, _ = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            out, _ = p.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
        out = (out or "") + f"\n[timed out after {timeout:.0f} s]"
        rc = 124
    if log is not None:
        log.write(f"\n$ {' '.join(argv)}\n[exit {rc}, {time.time() - t0:.1f} s]\n{out}")
        log.flush()
    return rc, out, time.time() - t0


def subst(s, bundle_root, work, python):
    return (s.replace("@BUNDLE@", str(bundle_root)).replace("@SRC@", str(ROOT))
            .replace("@WORK@", str(work)).replace("@PYTHON@", python))


def run_tests(rep, m, root, env, shim, scratch, budget, a, gpu_present):
    rows = []
    tlog = open(rep.out / "tests.log", "w")
    for t in m["tests"]:
        if a.tests and not re.search(a.tests, t["name"]):
            continue
        work = scratch / "work" / t["name"]
        work.mkdir(parents=True, exist_ok=True)
        argv = [subst(x, root, work, str(shim)) for x in t["command"]]
        tenv = dict(env)
        for kv in t["env"]:
            k, _, v = subst(kv, root, work, str(shim)).partition("=")
            tenv[k] = v
        cwd = subst(t["cwd"], root, work, str(shim))
        Path(cwd).mkdir(parents=True, exist_ok=True)
        timeout = budget.cap(min(t["timeout"], a.test_timeout), reserve=a.reserve_s)
        rc, out, secs = run_logged(rep, argv, tenv, timeout, cwd=cwd, log=tlog)
        result = "fail"
        if rc == 124:
            result = "timeout"
        elif t["skip_rc"] is not None and rc == int(t["skip_rc"]):
            result = "skip"
        elif t["pass_regex"]:
            # CMake's regular expressions let '.' match a newline too; Python's needs DOTALL.
            result = "pass" if any(re.search(r, out, re.DOTALL) for r in t["pass_regex"]) else "fail"
        else:
            result = "pass" if (rc == 0) != t["will_fail"] else "fail"
        if result == "pass" and any(re.search(r, out, re.DOTALL) for r in t["fail_regex"]):
            result = "fail"
        reason = ""
        if result == "skip":
            reason = next((ln.strip() for ln in out.splitlines() if "no CUDA" in ln or "skip" in ln.lower()), "")
            if gpu_present and t["gpu"]:
                result, reason = "fail", "skipped although nvidia-smi shows a GPU: " + reason
        elif result != "pass":
            reason = f"exit {rc}: " + " | ".join(out.strip().splitlines()[-3:])[:300]
        rows.append((t["name"], "gpu" if t["gpu"] else ",".join(t["labels"]), result, secs, reason))
        rep.say(f"  {t['name']:32s} {result:8s} {secs:7.1f} s  {reason[:160]}")
    tlog.close()
    return rows


def help_has(env, sub, flag, top=False):
    rc, out = run_text(["trellis"] + ([] if top else ["bench"]) + [sub, "--help"], timeout=30, env=env)
    return rc == 0 and flag in out


def decode_runs(rep, env, scratch, budget, a, gpu_present):
    """`trellis run` on a synthetic model: GPU at batch 1 and 16, each with CUDA graphs (the
    default) and without (--no-cuda-graphs, the ablation), interleaved; the CPU at batch 1
    without a GPU. Decode speed is 1 / median TPOT (batch 1) and generated tokens / wall
    (batch 16). The batch-1 graph run leaves its timeline (trace-cuda-b1.json)."""
    # The CPU run is the stand-in where there is no GPU (it checks the script); on a GPU
    # machine its host CPU is not ours to report and the time is better spent on the GPU.
    # Batch 1 with graphs also without run.graph_prefill (the next step's graph filled only once
    # its tokens are there), twice each, interleaved: the prefill's gain from one lease.
    dt = a.preset_dtype
    # And without kernels.graph_one_copy (a copy node per staged input, as before).
    runs = ([("cuda", 1, 128, True, dt), ("cuda", 1, 128, "noprefill", dt), ("cuda", 1, 128, "copyeach", dt),
             ("cuda", 1, 128, False, dt),
             ("cuda", 1, 128, True, dt), ("cuda", 1, 128, "noprefill", dt), ("cuda", 1, 128, "copyeach", dt),
             ("cuda", 16, 64, True, dt), ("cuda", 16, 64, False, dt)]
            if gpu_present else [("cpu", 1, 32, False, dt)])
    # --decode-also-dtype: batch 1 with and without graphs in another weight dtype too (the
    # same kernels at another weight read, e.g. f32 to compare with calls before bf16).
    if gpu_present and a.decode_also_dtype and a.decode_also_dtype != a.preset_dtype:
        runs += [("cuda", 1, 128, True, a.decode_also_dtype), ("cuda", 1, 128, False, a.decode_also_dtype)]
    found, parts = [], [] if gpu_present else ["cuda: no GPU"]
    traced = False
    for device, n, out_tokens, graphs, dtype in runs:
        prefill = graphs is True
        argv = ["trellis"] + {"noprefill": ["--set", "run.graph_prefill=false"],
                              "copyeach": ["--set", "kernels.graph_one_copy=false"]}.get(graphs, [])
        argv += ["run", "--device", device, "--preset", a.decode_preset,
                 "--workload", f"n={n},in=32,out={out_tokens},seed=1", "--json"] + a.decode_args.split()
        argv += preset_dtype_args(env, a, dtype)
        if device == "cuda" and not graphs:
            argv.append("--no-cuda-graphs")
        if n == 1 and (prefill or device == "cpu") and dtype == a.preset_dtype and not traced:
            argv += ["--trace", str(rep.out / f"trace-{device}-b1.json")]
            traced = True
        rc, out, secs = run_logged(rep, argv, env, budget.cap(a.bench_timeout, a.reserve_s), log=rep.log)
        j = first_json(out) if rc == 0 else None
        label = f"{device}{'' if device == 'cpu' else (' graphs' if graphs else ' eager')} b={n}"
        if graphs in ("noprefill", "copyeach"):
            label += {"noprefill": " no-prefill", "copyeach": " copy-each"}[graphs]
        if dtype != a.preset_dtype:
            label += f" {dtype}"
        row = {"device": device, "cuda_graphs": bool(graphs), "graph_prefill": prefill or graphs == "copyeach",
               "graph_one_copy": graphs != "copyeach", "batch": n, "out": out_tokens, "dtype": dtype, "exit": rc,
               "seconds": round(secs, 1)}
        m = re.search(r"cuda graphs: ([0-9]+) captured, ([0-9]+) replays", out)
        if m:
            row.update(graphs_captured=int(m.group(1)), graph_replays=int(m.group(2)))
        mp = re.search(r"([0-9]+) of the replays filled while the step before ran \(([0-9]+) fills guessed wrong\)", out)
        if mp:
            row.update(replays_filled_ahead=int(mp.group(1)), fills_guessed_wrong=int(mp.group(2)))
        if j and j.get("tpot", {}).get("p50_s"):
            row.update(tpot_p50_s=j["tpot"]["p50_s"], throughput_tokens_per_s=j.get("throughput_tokens_per_s"),
                       ttft_p50_s=j.get("ttft", {}).get("p50_s"), load_s=j.get("startup", {}).get("load_s"))
            speed = (f"{1 / j['tpot']['p50_s']:.1f} tok/s (TPOT p50 {1e3 * j['tpot']['p50_s']:.2f} ms)" if n == 1
                     else f"{j.get('throughput_tokens_per_s', 0):.0f} tok/s generated")
            parts.append(f"{label} {speed}" + (f" [{m.group(2)} replays]" if m else ""))
        else:
            reason = " | ".join(out.strip().splitlines()[-2:])[:200]
            row["error"] = reason
            parts.append(f"{label} exit {rc}")
        rep.say(f"  {label:18s}: " + (parts[-1] if "error" not in row else f"exit {rc}: {row['error']}"))
        found.append(row)
    (rep.out / "bench-decode.json").write_text(json.dumps({"preset": a.decode_preset, "preset_dtype": a.preset_dtype, "runs": found}, indent=1) + "\n")
    failed = sum(1 for r in found if "error" in r)
    return f"{a.decode_preset}: " + "; ".join(parts), failed


def torch_cuda(shim):
    """PyTorch's version when the image's python3 has a CUDA-enabled torch that sees a GPU, else None."""
    rc, out = run_text([str(shim), "-c", "import torch; print(torch.__version__ if torch.cuda.is_available() else '')"],
                       timeout=120)
    v = out.strip().splitlines()[-1] if rc == 0 and out.strip() else ""
    return v or None


def bench_model(rep, env, shim, scratch, budget, a, gpu_present):
    """`trellis bench model` on the GPU (when it has --device) beside PyTorch eager on the same
    GPU and checkpoint (torch_reference.py from this tree: the compiled-in source path is the
    packing machine's)."""
    device = help_has(env, "model", "--device") and gpu_present
    argv = ["trellis", "bench", "model", "--preset", a.decode_preset, "--workdir", str(scratch / "bench-model"),
            "--json"] + (["--device", "cuda"] if device else [])
    script = ROOT / "scripts" / "reference" / "torch_reference.py"
    tv = torch_cuda(shim) if device and script.is_file() and not a.no_torch else None
    if tv:
        argv += ["--torch", "--python", str(shim), "--torch-script", str(script), "--torch-dtypes", "bf16",
                 "--torch-impls", "reference,hf"]
    else:
        argv += ["--no-torch"]
    rc, out, secs = run_logged(rep, argv, env, budget.cap(a.bench_timeout, a.reserve_s), log=rep.log)
    (rep.out / "bench-model.json").write_text(out)
    j = first_json(out)
    where = "GPU" if device else "CPU"
    if rc == 0 and j and "decode_tokens_per_s" in j:
        res = (f"{j['decode_tokens_per_s']:.1f} tok/s on the {where}, {a.decode_preset}, "
               f"{100 * j.get('fraction_of_read_limit', 0):.0f}% of the read limit "
               f"({j.get('read_GBps_median', 0):.0f} GB/s)")
        for t in j.get("torch", []):
            res += (f"; PyTorch {t.get('torch_version', '?')} eager {t.get('impl', 'reference')} {t.get('dtype', '?')} "
                    + (f"{t['decode_tokens_per_s']:.1f} tok/s" if "decode_tokens_per_s" in t
                       else f"failed: {str(t.get('error', '?'))[:120]}"))
        if not tv:
            res += "; PyTorch not run" + ("" if device else " (no GPU)")
    else:
        res = f"failed (exit {rc}, {secs:.0f} s; see bench-model.json)"
        rep.say("\n".join(out.splitlines()[-15:]))
    rep.say("  bench model: " + res)
    return res


def smollm2_bench(rep, env, shim, scratch, budget, a, model):
    """SmolLM2 on the GPU: greedy decode at batch 1 with and without CUDA graphs, then `bench
    model` on the same weights converted to a safetensors directory (`trellis convert`, bf16)
    beside PyTorch eager on that directory. One JSON file (at most 8 files come back)."""
    found = {"model": str(model), "runs": []}
    for graphs in (True, False):
        argv = ["trellis", "run", "--device", "cuda", "--model", str(model), "--workload", "n=1,in=32,out=128,seed=1",
                "--json"] + ([] if graphs else ["--no-cuda-graphs"])
        rc, out, secs = run_logged(rep, argv, env, budget.cap(a.bench_timeout, a.reserve_s), log=rep.log)
        j = first_json(out) if rc == 0 else None
        row = {"cuda_graphs": graphs, "exit": rc, "seconds": round(secs, 1)}
        if j and j.get("tpot", {}).get("p50_s"):
            row["tpot_p50_s"] = j["tpot"]["p50_s"]
        found["runs"].append(row)
        rep.say(f"  smollm2 {'graphs' if graphs else 'eager'} b=1: " +
                (f"{1 / row['tpot_p50_s']:.1f} tok/s" if "tpot_p50_s" in row else f"exit {rc}"))
    conv = scratch / "smollm2-bf16"
    rc, out, _ = run_logged(rep, ["trellis", "convert", "--model", str(model), "--out", str(conv), "--dtype", "bf16"],
                            env, budget.cap(120, a.reserve_s), log=rep.log)
    if rc == 0:
        argv = ["trellis", "bench", "model", "--device", "cuda", "--model", str(conv), "--json"]
        script = ROOT / "scripts" / "reference" / "torch_reference.py"
        if not a.no_torch and torch_cuda(shim):
            argv += ["--torch", "--python", str(shim), "--torch-script", str(script), "--torch-dtypes", "bf16",
                     "--torch-impls", "reference,hf", "--torch-steps", "16"]
        else:
            argv += ["--no-torch"]
        rc, out, _ = run_logged(rep, argv, env, budget.cap(a.bench_timeout, a.reserve_s), log=rep.log)
        found["bench_model"] = (first_json(out) if rc == 0 else None) or {"exit": rc, "tail": out[-400:]}
        j = found["bench_model"]
        rep.say("  smollm2 bench model: " + (f"{j['decode_tokens_per_s']:.1f} tok/s; " + "; ".join(
            f"PyTorch {t.get('impl')} {t.get('decode_tokens_per_s', 0):.1f}" for t in j.get("torch", []))
            if "decode_tokens_per_s" in j else f"exit {rc}"))
    else:
        found["convert"] = {"exit": rc, "tail": out[-400:]}
    (rep.out / "bench-smollm2.json").write_text(json.dumps(found, indent=1) + "\n")
    ok = all(r["exit"] == 0 for r in found["runs"]) and "decode_tokens_per_s" in found.get("bench_model", {})
    return ("ok" if ok else "failed (bench-smollm2.json)"), 0 if ok else 1


def bench(rep, env, shim, scratch, budget, a, gpu_present):
    results = {}
    rep.section("trellis bench kernels (GPU)")
    if a.skip_kernels:
        results["kernels"] = "skipped (--skip-kernels)"
        rep.say("  " + results["kernels"])
    elif help_has(env, "kernels", "--device"):
        argv = ["trellis", "bench", "kernels", "--device", "cuda", "--json"] + a.kernels_args.split()
        rc, out, secs = run_logged(rep, argv, env, budget.cap(a.bench_timeout, a.reserve_s), log=rep.log)
        (rep.out / "bench-kernels.json").write_text(out)
        results["kernels"] = f"exit {rc} in {secs:.0f} s" + ("" if rc == 0 else " (see bench-kernels.json)")
        results["_failed"] = results.get("_failed", 0) + (rc != 0 and gpu_present)
        rep.say(("\n".join(out.splitlines()[-20:])) if rc != 0 else f"  done in {secs:.0f} s: bench-kernels.json")
    else:
        results["kernels"] = "not implemented (trellis bench kernels has no --device option yet)"
        rep.say("  " + results["kernels"] + "; cuda_kernels_test's own times are in tests.log")
    rep.section("decode benchmark")
    if help_has(env, "run", "--device", top=True):
        results["decode"], failed = decode_runs(rep, env, scratch, budget, a, gpu_present)
        results["_failed"] = results.get("_failed", 0) + failed
    if not a.skip_model:
        results["bench model"] = bench_model(rep, env, shim, scratch, budget, a, gpu_present)
    results["handoff"], failed = handoff_bench(rep, env, budget, a, run_logged, help_has)
    results["_failed"] = results.get("_failed", 0) + (failed if gpu_present else 0)
    # Opt-in extras: an error inside one is reported and never costs the summary.
    if a.ablation:
        try:
            results["ablation"], failed = ablation_bench(rep, env, budget, a, run_logged, gpu_present)
        except Exception as e:  # noqa: BLE001
            results["ablation"], failed = f"crashed: {e!r}", 1
            rep.say("  " + results["ablation"])
        results["_failed"] += failed
    if a.profile_kernels:  # after the ablation: MPS is stopped again (ncu does not profile MPS clients)
        try:
            results["profile"] = profile_kernels(rep, env, budget, a, run_logged)
        except Exception as e:  # noqa: BLE001 (not counted: ncu's profile is an aid, not a check)
            results["profile"] = f"crashed: {e!r}"
            rep.say("  " + results["profile"])
    return results


def first_json(text):
    """The first JSON object in text that starts a line (trellis --json may log lines before it)."""
    for m in re.finditer(r"(?m)^\{", text):
        try:
            return json.JSONDecoder().raw_decode(text[m.start():])[0]
        except ValueError:
            continue
    return None


TRACE_DATA = re.compile(r"/(openmpi|pmix[0-9]*|ucx|hwloc)/")


def trace_check(m, root, env, scratch):
    """Runs trellis info, mpiexec -n 2 trellis info and every test under strace; returns the
    files they opened outside the bundle that the GPU machine will not have (a system library
    that the bundle also carries, one not carried, Open MPI/PMIx/UCX/hwloc data)."""
    if not shutil.which("strace"):
        return ["--trace needs strace on this machine"]
    python_dirs = tuple({sys.prefix, sys.base_prefix, "/usr/lib/python3", "/usr/local/lib/python3"})
    runs = [["trellis", "info"], ["mpiexec", "-n", "2", "--oversubscribe", "trellis", "info"]]
    for t in m["tests"]:
        work = scratch / "work" / t["name"]
        work.mkdir(parents=True, exist_ok=True)
        runs.append((t["name"], [subst(x, root, work, sys.executable) for x in t["command"]],
                     [subst(x, root, work, sys.executable) for x in t["env"]],
                     subst(t["cwd"], root, work, sys.executable)))
    leaks = {}
    for r in runs:
        name, argv, extra, cwd = (r[0], r[1], r[2], r[3]) if isinstance(r, tuple) else (" ".join(r), r, [], None)
        tenv = dict(env)
        tenv.update(kv.split("=", 1) for kv in extra)
        if cwd:
            Path(cwd).mkdir(parents=True, exist_ok=True)
        for old in scratch.glob("strace.*"):
            old.unlink()
        rc, out = run_text(["strace", "-ff", "-qq", "-e", "trace=openat,open,execve,clone,clone3,fork,vfork",
                            "-o", str(scratch / "strace")] + argv, timeout=300, env=tenv, cwd=cwd)
        print(f"  traced {name}: exit {rc}")
        for path, image in traced_opens(scratch):
            if path.startswith(str(root) + "/") or path.startswith(python_dirs):
                continue
            base = os.path.basename(path)
            foreign = not (SYSTEM_LIB.match(base) or GCC_LIB.match(base) or CUDA_LIB.match(base))
            # A library counts when a bundle program loads it; bash, grep or python load their own.
            if foreign and re.search(r"\.so(\.[0-9.]+)?$", base) and image.startswith(str(root) + "/") \
                    or TRACE_DATA.search(path) or path.startswith("/etc/openmpi"):
                leaks.setdefault(path, name)
    return [f"{name} opened {path}, which the GPU machine lacks" for path, name in sorted(leaks.items())]


def traced_opens(scratch):
    """(path, program) for every successful open in the strace -ff files, program being the
    image the process had exec'd (inherited over fork/clone); files read in pid order."""
    files = sorted(scratch.glob("strace.*"), key=lambda p: int(p.suffix[1:]))
    image, opens = {}, []
    for f in files:
        pid = int(f.suffix[1:])
        for line in f.read_text(errors="replace").splitlines():
            m = re.match(r'^execve\("([^"]+)".*\) = 0', line)
            if m:
                image[pid] = m.group(1)
                continue
            m = re.match(r"^(?:clone3?|v?fork)\(.*\) = ([0-9]+)", line)
            if m:
                image[int(m.group(1))] = image.get(pid, "")
                continue
            m = re.match(r'^(?:openat\(AT_FDCWD, |open\()"([^"]+)".*\) = [0-9]+', line)
            if m:
                opens.append((m.group(1), image.get(pid, "")))
    return opens


def cmd_check(a):
    bundle = Path(a.bundle)
    m, root = load_bundle(bundle)
    scratch = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    env, _ = make_env(m, root, scratch)
    print(f"gpu-check: LD_LIBRARY_PATH={env['LD_LIBRARY_PATH']}")
    problems = check_libs(root, env, print)
    problems += host_problems(m)
    if a.trace:
        problems += trace_check(m, root, env, scratch)
    for p in problems:
        print("  MISSING " + p)
    print(f"gpu-check: {'every library resolves into the bundle or CUDA' if not problems else f'{len(problems)} problems'}")
    shutil.rmtree(scratch, ignore_errors=True)
    return 1 if problems else 0


def cmd_run(a):
    t_start = time.time()
    budget = Budget(a.budget_s)
    out = Path(a.out or os.environ.get("OUT") or ROOT / "out" / "gpu-check")
    rep = Report(out)
    m, root = load_bundle(Path(a.bundle))
    scratch = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    env, shim = make_env(m, root, scratch)
    env["GPU_CHECK_SOURCE_DIR"] = m.get("source_dir", "")
    rep.say(f"gpu-check run: bundle {m['source']} ({m['created']}), unpacked in {root}, budget {a.budget_s} s")

    rep.section("card")
    rc, smi = run_text(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,compute_cap",
                        "--format=csv,noheader"], timeout=30)
    gpu_present = rc == 0 and smi.strip() != ""
    card = smi.strip().splitlines()[0].split(",")[0].strip() if gpu_present else "no GPU"
    rep.say(smi.strip() if gpu_present else f"no GPU: nvidia-smi {'exit ' + str(rc) if rc != 127 else 'not found'}")

    rep.section("libraries")
    problems = check_libs(root, env, rep.say)
    problems += host_problems(m)
    for p in problems:
        rep.say("  MISSING " + p)
    if not problems:
        rep.say("  every library resolves into the bundle, the system's glibc/libstdc++ or CUDA")
    fatal = [p for p in problems if p.startswith("bin/") or p.startswith("this ")]

    rep.section("trellis info")
    rc, info, _ = run_logged(rep, ["trellis", "info"], env, budget.cap(60, a.reserve_s))
    rep.say(info.rstrip())

    rows, results = [], {}
    model = None
    if a.model_part:
        rep.section("SmolLM2")
        model = stash(a.model_part)
        if model:
            env["TRELLIS_SMOLLM2_GGUF"] = str(model)  # runtime_gpu_run compares its GPU tokens with the CPU's
    if fatal:
        rep.say("gpu-check: not running tests: the bundle cannot start here (above)")
    else:
        rep.section("tests")
        rows = run_tests(rep, m, root, env, shim, scratch, budget, a, gpu_present)
        if not a.skip_bench:
            results = bench(rep, env, shim, scratch, budget, a, gpu_present)
        if model and gpu_present and not a.skip_bench:
            rep.section("SmolLM2 on the GPU")
            results["smollm2"], failed = smollm2_bench(rep, env, shim, scratch, budget, a, model)
            results["_failed"] = results.get("_failed", 0) + failed

    bench_failed = results.pop("_failed", 0)
    counts = {k: sum(1 for r in rows if r[2] == k) for k in ("pass", "skip", "fail", "timeout")}
    rep.section("summary")
    rep.say(f"  {'test':32s} {'labels':10s} {'result':8s} {'seconds':>8s}")
    for name, labels, result, secs, _ in rows:
        rep.say(f"  {name:32s} {labels[:10]:10s} {result:8s} {secs:8.1f}")
    for k, v in results.items():
        rep.say(f"  bench {k}: {v}")
    bad = counts["fail"] + counts["timeout"] + len(fatal) + bench_failed
    line = (f"gpu-check: {card} | tests {counts['pass']} pass, {counts['skip']} skip, {counts['fail']} fail, "
            f"{counts['timeout']} timeout | " + "".join(f"{k}: {v} | " for k, v in results.items())
            + f"{time.time() - t_start:.0f} s | {'OK' if not bad else 'FAILED'}")
    rep.say(line)
    summary = {"card": card, "nvidia_smi": smi.strip() if gpu_present else None, "bundle": m["source"],
               "tests": [dict(zip(("name", "labels", "result", "seconds", "reason"), r)) for r in rows],
               "bench": results, "library_problems": problems, "seconds": round(time.time() - t_start, 1),
               "ok": not bad, "line": line}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    shutil.rmtree(scratch, ignore_errors=True)
    return 0 if not bad else 1
