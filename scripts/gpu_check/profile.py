"""scripts/gpu-check run --profile-kernels: where a GPU decode step's time goes, kernel by kernel.

Runs `trellis run --device cuda --preset P --workload n=1,in=32,out=OUT,seed=1 --json` twice
under Nsight Compute (`ncu --target-processes all --clock-control none --cache-control none
--metrics gpu__time_duration.sum --csv --print-units base`), with OUT=4 and OUT=20. ncu times
every kernel, the kernel nodes of a replayed CUDA graph one by one too, serialised (so the sum
is GPU busy time, not wall time). The two runs differ by 16 decode steps: load, prefill and the
first steps (where the graphs are captured) are common to both, so (sum over the OUT=20 run -
sum over the OUT=4 run) / 16 is per replayed decode step: microseconds and launches per step
for every kernel launched more often in the longer run (grouped by its full demangled name,
shown by its function name), the top rows in gpu-check.log, all of them in
bench-ablation.json (when the ablation ran) or bench-profile.json (when the 8-file limit
leaves room), else as one line in the log. trellis runs through a wrapper that gives it the
bundle's LD_LIBRARY_PATH, while ncu itself keeps this machine's.

ncu missing or failing is said in the log and is not a failure of the run. The CSV parser has
a self-test on synthetic output (quotes, thousands separators, units, other lines between):
  python3 -m scripts.gpu_check.profile --self-test      (from the repository root)
"""
import csv
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

METRIC = "gpu__time_duration.sum"
OUTS = (4, 20)  # tokens generated: 3 and 19 decode steps
TOP = 25
NS_PER = {"ns": 1.0, "nsecond": 1.0, "nsec": 1.0, "us": 1e3, "usecond": 1e3, "usec": 1e3, "ms": 1e6,
          "msecond": 1e6, "msec": 1e6, "s": 1e9, "second": 1e9, "sec": 1e9}


def number(text):
    """'1,234.5' -> 1234.5 (ncu's thousands separators); None for n/a or empty."""
    t = text.strip().replace(",", "").replace("\u202f", "").replace(" ", "")
    try:
        return float(t)
    except ValueError:
        return None


def preset_dtype_args(env, a, dtype=None):
    """["--preset-dtype", D] (D: `dtype`, else --preset-dtype) when this bundle's `trellis run`
    has the flag (older bundles: f32)."""
    from .run import help_has  # late: run.py imports this module
    d = dtype or a.preset_dtype
    return ["--preset-dtype", d] if d and help_has(env, "run", "--preset-dtype", top=True) else []


def parse_ncu_csv(text, metric=METRIC):
    """{kernel name: [total ns, launches]} from ncu --csv output mixed with other lines (==PROF==
    lines, the program's own output). The header is a line whose first field is "ID"; a row
    counts when it has the header's number of fields and a numeric ID. Returns (kernels,
    problems): problems names units it did not know (their values are taken as ns)."""
    kernels, problems, header = {}, set(), None
    for line in text.splitlines():
        s = line.strip()
        if not s.startswith('"') and not s[:1].isdigit() and not s.startswith("ID,"):
            continue
        try:
            fields = next(csv.reader([s]))
        except (csv.Error, StopIteration):
            continue
        if fields and fields[0] == "ID":
            header = {name: i for i, name in enumerate(fields)}
            need = ("Kernel Name", "Metric Name", "Metric Value")
            if any(n not in header for n in need):
                problems.add("CSV header without " + ", ".join(n for n in need if n not in header))
                header = None
            continue
        if header is None or len(fields) != len(header) or not fields[0].strip().isdigit():
            continue
        if fields[header["Metric Name"]] != metric:
            continue
        value = number(fields[header["Metric Value"]])
        if value is None:
            continue
        unit = fields[header["Metric Unit"]].strip() if "Metric Unit" in header else "ns"
        if unit not in NS_PER:
            problems.add(f"unit {unit!r} taken as ns")
        k = kernels.setdefault(fields[header["Kernel Name"]], [0.0, 0])
        k[0] += value * NS_PER.get(unit, 1.0)
        k[1] += 1
    return kernels, sorted(problems)


def strip_templates(s):
    out, depth = [], 0
    for ch in s:
        if ch == "<":
            depth += 1
        elif ch == ">" and depth:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out)


GENERIC = {"Kernel", "Kernel2", "device_kernel", "kernel", "elementwise_kernel", "vectorized_elementwise_kernel"}


def short_name(full):
    """The function name of a demangled kernel signature: 'void ns::gemv<bf16, 8>(const T*, int)'
    -> 'gemv'; a generic wrapper (cutlass::Kernel2<...>) keeps its first template argument."""
    s = full.replace("(anonymous namespace)", "{anon}")
    depth, cut = 0, len(s)
    for i, ch in enumerate(s):  # the first '(' outside template arguments opens the parameters
        if ch == "<":
            depth += 1
        elif ch == ">" and depth:
            depth -= 1
        elif ch == "(" and depth == 0 and i > 0:
            cut = i
            break
    head = s[:cut].strip()
    bare = strip_templates(head).strip()
    bare = bare.split()[-1] if bare.split() else bare  # drop the return type
    name = bare.split("::")[-1] or head
    at = head.rfind(name + "<")  # its own template arguments, not a return type's (enable_if<...>)
    if name in GENERIC and at >= 0:
        depth, first = 0, []
        for ch in head[at + len(name) + 1:]:  # the first template argument
            if depth == 0 and ch in ",>":
                break
            depth += (ch == "<") - (ch == ">")
            first.append(ch)
        name = f"{name}<{strip_templates(''.join(first)).strip().split('::')[-1][:48]}>"
    return name[:60]


def per_step(short_run, long_run, steps):
    """Rows (full name, µs per step, launches per step) of the kernels launched more often in
    the longer run, largest time first; their totals; and the net µs per step of the kernels
    launched as often in both (load, prefill: run-to-run noise, left out of the rows)."""
    rows, same = [], 0.0
    for name in set(short_run) | set(long_run):
        t0, c0 = short_run.get(name, (0.0, 0))
        t1, c1 = long_run.get(name, (0.0, 0))
        if c1 == c0:
            same += (t1 - t0) / steps / 1e3
            continue
        rows.append((name, (t1 - t0) / steps / 1e3, (c1 - c0) / steps))
    rows.sort(key=lambda r: -r[1])
    return rows, sum(r[1] for r in rows), sum(r[2] for r in rows), same


def table_lines(rows, total_us, total_launches, top=TOP):
    lines = [f"  {'kernel':60s} {'us/step':>9s} {'share':>6s} {'launches':>8s} {'us/launch':>9s}"]
    seen = {}
    for name, us, n in rows[:top]:
        short = short_name(name)
        seen[short] = seen.get(short, 0) + 1
        label = short if seen[short] == 1 else f"{short} [{seen[short]}]"
        share = 100 * us / total_us if total_us else 0.0
        lines.append(f"  {label[:60]:60s} {us:9.2f} {share:5.1f}% {n:8.2f} {us / n if n else 0:9.2f}")
    if len(rows) > top:
        rest = rows[top:]
        us, n = sum(r[1] for r in rest), sum(r[2] for r in rest)
        share = 100 * us / total_us if total_us else 0.0
        lines.append(f"  {'(' + str(len(rest)) + ' more kernels)':60s} {us:9.2f} {share:5.1f}% {n:8.2f}")
    lines.append(f"  {'total per decode step':60s} {total_us:9.2f} {100.0 if total_us else 0:5.1f}% "
                 f"{total_launches:8.2f}")
    return lines


def decode_tpot(out):
    """TPOT p50 (µs) of the batch-1 CUDA-graph decode run in OUT/bench-decode.json, if any."""
    try:
        runs = json.loads((Path(out) / "bench-decode.json").read_text())["runs"]
        r = next(r for r in runs if r.get("device") == "cuda" and r.get("batch") == 1 and r.get("cuda_graphs"))
        return 1e6 * r["tpot_p50_s"]
    except (OSError, ValueError, KeyError, StopIteration, TypeError):
        return None


def profile_kernels(rep, env, budget, a, run_logged):
    """Returns a one-line summary; never counts as a failure (ncu is an extra, not the product)."""
    from .ablation import merge_into_ablation, put_json
    rep.section("where a GPU decode step's time goes (ncu, per kernel, batch 1)")
    ncu = shutil.which("ncu", path=env.get("PATH"))  # the bundle's bin, then this machine's PATH
    trellis = shutil.which("trellis", path=env.get("PATH"))
    if not ncu or not trellis:
        why = "ncu is not on PATH" if not ncu else "trellis is not on the bundle's PATH"
        rep.say(f"  not run: {why}")
        return f"not run ({why})"
    # ncu itself runs with this machine's libraries; trellis gets the bundle's through a wrapper
    # (ncu follows the exec: it profiles every process it starts).
    tmp = Path(tempfile.mkdtemp(prefix="trellis-ncu-"))
    wrapper = tmp / "trellis"
    wrapper.write_text("#!/bin/sh\nLD_LIBRARY_PATH='" + env.get("LD_LIBRARY_PATH", "") +
                       "'; export LD_LIBRARY_PATH\nexec '" + trellis + "' \"$@\"\n")
    wrapper.chmod(0o755)
    nenv = dict(env)
    if os.environ.get("LD_LIBRARY_PATH"):
        nenv["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]
    else:
        nenv.pop("LD_LIBRARY_PATH", None)
    runs, found = {}, {"preset": a.decode_preset, "metric": METRIC, "runs": []}
    for out_tokens in OUTS:
        if budget.cap(a.profile_timeout, a.reserve_s) < 30:
            rep.say(f"  not run (out={out_tokens}): less than 30 s left in the budget")
            shutil.rmtree(tmp, ignore_errors=True)
            return "not run (budget spent)"
        # --cache-control none: no L2 flush before each kernel, as in a real step, where a kernel
        # reads what the one before it wrote (ncu flushes by default).
        argv = [ncu, "--target-processes", "all", "--clock-control", "none", "--cache-control", "none",
                "--metrics", METRIC, "--csv", "--print-units", "base",
                str(wrapper), "run", "--device", "cuda", "--preset", a.decode_preset,
                "--workload", f"n=1,in=32,out={out_tokens},seed=1", "--json"] + preset_dtype_args(env, a)
        rc, out, secs = run_logged(rep, argv, nenv, budget.cap(a.profile_timeout, a.reserve_s), log=None)
        kernels, problems = parse_ncu_csv(out)
        launches = sum(k[1] for k in kernels.values())
        found["runs"].append({"out": out_tokens, "exit": rc, "seconds": round(secs, 1), "kernel_launches": launches,
                              "gpu_ms": round(sum(k[0] for k in kernels.values()) / 1e6, 3), "problems": problems})
        rep.log.write(f"\n$ {' '.join(argv)}\n[exit {rc}, {secs:.1f} s, {len(kernels)} kernel names, "
                      f"{launches} launches; CSV rows not copied here]\n"
                      + "\n".join(ln for ln in out.splitlines() if not ln.startswith('"'))[-3000:] + "\n")
        rep.say(f"  out={out_tokens}: exit {rc}, {secs:.0f} s, {launches} kernels timed"
                + (f" ({'; '.join(problems)})" if problems else ""))
        if rc != 0 or not kernels:
            tail = "\n".join(out.strip().splitlines()[-8:])
            rep.say(f"  ncu {'failed' if rc else 'timed no kernel'}: (not counted as a failure of this run)\n{tail}")
            shutil.rmtree(tmp, ignore_errors=True)
            return f"ncu failed at out={out_tokens} (exit {rc}); see gpu-check.log"
        runs[out_tokens] = kernels
    shutil.rmtree(tmp, ignore_errors=True)
    steps = OUTS[1] - OUTS[0]
    rows, total_us, total_n, same_us = per_step(runs[OUTS[0]], runs[OUTS[1]], steps)
    for line in table_lines(rows, total_us, total_n):
        rep.say(line)
    tpot = decode_tpot(rep.out)
    if tpot:
        rep.say(f"  GPU busy {total_us:.0f} us of the {tpot:.0f} us TPOT p50 measured without ncu above "
                f"(batch 1, CUDA graphs): {100 * total_us / tpot:.0f}%")
    found.update(steps=steps, per_step={"gpu_us": round(total_us, 2), "launches": round(total_n, 2),
                                        "tpot_p50_us_without_ncu": tpot,
                                        "same_count_kernels_us": round(same_us, 3)},
                 kernels=[{"name": n, "short": short_name(n), "us_per_step": round(us, 3),
                           "launches_per_step": round(c, 3)} for n, us, c in rows])
    if merge_into_ablation(rep, "profile", found):
        where = "bench-ablation.json (\"profile\")"
    else:
        where = put_json(rep, a, "bench-profile.json", "bench-profile", found)
    top = ", ".join(f"{short_name(n)} {us:.0f}" for n, us, _ in rows[:3])
    return f"{total_us:.0f} us GPU / decode step in {total_n:.0f} kernels; top: {top} us ({where})"


# ------------------------------------------------------------------------------------ self-test

SAMPLE = '''==PROF== Connected to process 4242 (/tmp/bundle/bin/trellis)
[info] trellis run: rank 0 loads llama-1b
==PROF== Profiling "rms_norm_kernel": 0%....50%....100% - 1 pass
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","4242","trellis","127.0.0.1","void trellis::kernels::gemv_kernel<__nv_bfloat16, (int)8>(const __nv_bfloat16 *, const float *, float *, int, int)","1","7","(256, 1, 1)","(1024, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","1,234"
"1","4242","trellis","127.0.0.1","rms_norm_kernel(const float *, float *, int)","1","7","(256, 1, 1)","(1, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","2,048.5"
"1","4242","trellis","127.0.0.1","rms_norm_kernel(const float *, float *, int)","1","7","(256, 1, 1)","(1, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes.sum","byte","1,000,000"
{"throughput_tokens_per_s": 1.5, "note": "the program's own JSON, not CSV"}
"2","4242","trellis","127.0.0.1","void trellis::kernels::gemv_kernel<__nv_bfloat16, (int)8>(const __nv_bfloat16 *, const float *, float *, int, int)","1","7","(256, 1, 1)","(1024, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","1.5"
"3","4242","trellis","127.0.0.1","void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8>(Params)","1","7","(128, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","n/a"
"4","4242","trellis","127.0.0.1","void (anonymous namespace)::attn_decode<128>(float *, int)","1","7","(128, 1, 1)","(32, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","12,000"
==PROF== Disconnected from process 4242
'''


def self_test():
    k, problems = parse_ncu_csv(SAMPLE)
    gemv = "void trellis::kernels::gemv_kernel<__nv_bfloat16, (int)8>(const __nv_bfloat16 *, const float *, float *, int, int)"
    assert not problems, problems
    assert k[gemv] == [1234.0 + 1500.0, 2], k[gemv]                      # ns + us, thousands separator
    assert k["rms_norm_kernel(const float *, float *, int)"] == [2048.5, 1], k  # the dram__bytes row is not time
    assert "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8>(Params)" not in k  # n/a
    assert len(k) == 3, sorted(k)
    assert short_name(gemv) == "gemv_kernel", short_name(gemv)
    assert short_name("rms_norm_kernel(const float *, float *, int)") == "rms_norm_kernel"
    assert short_name("void (anonymous namespace)::attn_decode<128>(float *, int)") == "attn_decode"
    assert short_name("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8>(Params)") \
        == "Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64>"
    assert short_name("nvjet_hsh_128x64_64x4_1x2_h_bz_coopA_NTT") == "nvjet_hsh_128x64_64x4_1x2_h_bz_coopA_NTT"
    # cuBLAS's gemv behind an enable_if return type (seen on an H200): not the return type's argument
    assert short_name("std::enable_if<!T7, void>::type internal::kernel<int, int, float, float, 0, 1>(T13)") \
        == "kernel<int>", short_name("std::enable_if<!T7, void>::type internal::kernel<int, int, float, float, 0, 1>(T13)")
    k2, _ = parse_ncu_csv(SAMPLE + SAMPLE.replace('"0","4242"', '"9","4242"'))  # a longer run: every kernel twice
    rows, total, n, same = per_step(k, k2, 1)
    assert rows[0][0] == "void (anonymous namespace)::attn_decode<128>(float *, int)" and abs(total - (2.734 + 2.0485 + 12.0)) < 1e-9, rows
    assert n == 4 and same == 0.0, (n, same)
    rows1, total1, n1, same1 = per_step({"load": [100.0, 1], "step": [10.0, 1]}, {"load": [116.0, 1], "step": [170.0, 17]}, 16)
    assert rows1 == [("step", 0.01, 1.0)] and abs(same1 - 0.001) < 1e-12, (rows1, same1)  # 160 ns / 16 = 0.01 us
    assert parse_ncu_csv("==ERROR== ERR_NVGPUCTRPERM\n")[0] == {}
    assert parse_ncu_csv('"ID","Kernel Name"\n"0","k()"\n')[1] == ["CSV header without Metric Name, Metric Value"]
    assert number('1,234,567.25') == 1234567.25 and number("n/a") is None
    lines = table_lines(rows, total, n, top=2)
    assert lines[1].split()[0] == "attn_decode" and "total per decode step" in lines[-1], lines
    print("\n".join(lines))
    print("profile self-test: ok")


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        self_test()
    else:
        sys.exit("usage: python3 -m scripts.gpu_check.profile --self-test (the profile itself runs from "
                 "scripts/gpu-check run --profile-kernels)")
