"""scripts/gpu-check: constants and helpers shared by pack and run (the entry point and its --help: scripts/gpu-check)."""
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


ROOT = Path(__file__).resolve().parent.parent.parent
FORMAT = 1  # MANIFEST.json format; run refuses other numbers

# Libraries expected on the GPU image: glibc, the GCC runtime (also carried as a fallback, used
# only when the image's copy is too old) and CUDA's own (NCCL, cuBLASLt, cudart come from the
# image's toolkit or PyTorch's nvidia-* wheels: NCCL alone is 218 MB).
SYSTEM_LIB = re.compile(r"^(linux-vdso|ld-linux-x86-64|lib(c|m|dl|rt|pthread|util|resolv|anl|mvec))\.so")
GCC_LIB = re.compile(r"^lib(stdc\+\+|gcc_s)\.so")
CUDA_LIB = re.compile(r"^lib(cuda|cudart|cublas|cublasLt|nccl|nvidia-ml|nvrtc|nvrtc-builtins|nvJitLink|cupti)\.so")
# An Open MPI component that needs one of these (InfiniBand, OFI, PSM, OpenSHMEM, netlink) is
# left out: no such fabric on a one-GPU machine, and their libraries would take megabytes.
HEAVY_DEP = re.compile(r"^lib(fabric|ibverbs|rdmacm|efa|psm|psm2|psm_infinipath|infinipath|nl-3|nl-route-3|oshmem|mlx5|ucc|hcoll)\.")
DEFAULT_CPU_TESTS = r"^(kernels_test|cuda_wiring_test|bench_kernels_smoke|bootstrap_test_np2)$"
GPU_NAME = re.compile(r"cuda|gpu|device", re.I)
PAYLOAD = "payload.tar.xz"


class UsageError(Exception):
    pass


def log(msg):
    print(f"gpu-check: {msg}", flush=True)


def run_text(argv, timeout=120, **kw):
    """Runs argv, returns (rc, stdout+stderr); rc 124 on timeout, 127 when it cannot start."""
    try:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout, errors="replace", **kw)
        return p.returncode, p.stdout
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return 124, out + f"\n[timed out after {timeout} s]"
    except OSError as e:
        return 127, f"cannot run {argv[0]}: {e}"


def human(n):
    return f"{n / 2**20:.1f} MiB"


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def is_elf(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def ldd(path, env=None):
    """[(soname, resolved path or None)] as ldd reports them (the loader's own line included)."""
    rc, out = run_text(["ldd", str(path)], timeout=60, env=env)
    deps = []
    for line in out.splitlines():
        line = line.strip()
        m = re.match(r"^(\S+) => (not found|(\S+) \(0x[0-9a-f]+\)|\(0x[0-9a-f]+\))", line)
        if m:
            deps.append((m.group(1), m.group(3) if m.group(3) else None if m.group(2) == "not found" else ""))
            continue
        m = re.match(r"^(/\S+) \(0x[0-9a-f]+\)$", line)
        if m:
            deps.append((os.path.basename(m.group(1)), m.group(1)))
        elif line.startswith("linux-vdso"):
            deps.append(("linux-vdso.so.1", ""))
    if rc != 0 and not deps and "not a dynamic executable" not in out:
        raise RuntimeError(f"ldd {path} failed: {out.strip()}")
    return deps


def version_needs(path):
    """{'GLIBC': (2, 34), 'GLIBCXX': (3, 4, 30), ...}: the newest symbol versions path needs."""
    rc, out = run_text(["readelf", "-V", "-W", str(path)], timeout=60)
    need = {}
    section = out.split("Version needs section", 1)
    for m in re.finditer(r"Name: (GLIBC|GLIBCXX|CXXABI|GCC)_([0-9.]+)", section[1] if len(section) > 1 else ""):
        v = tuple(int(x) for x in m.group(2).split(".") if x.isdigit())
        if v > need.get(m.group(1), ()):
            need[m.group(1)] = v
    return need


def merge_needs(a, b):
    for k, v in b.items():
        if v > a.get(k, ()):
            a[k] = v
    return a
