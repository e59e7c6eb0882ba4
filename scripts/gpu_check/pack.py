"""scripts/gpu-check: `pack`, run here: build the cuda preset and assemble the bundle (the entry point and its --help: scripts/gpu-check)."""
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


from .common import *  # noqa: F401,F403 (the shared constants and helpers)
from .model_parts import split

# ---------------------------------------------------------------------------------------- pack

def cmake_cache(build):
    cache = {}
    for line in (build / "CMakeCache.txt").read_text(errors="replace").splitlines():
        m = re.match(r"^([A-Za-z0-9_]+):[A-Z]+=(.*)$", line)
        if m:
            cache[m.group(1)] = m.group(2)
    return cache


def configure_and_build(a, build):
    wanted = {"TRELLIS_CUDA": "ON", "TRELLIS_NATIVE": "OFF", "CMAKE_CXX_FLAGS": f"-march={a.march}",
              "TRELLIS_CUDA_ARCHITECTURES": a.cuda_arch, "TRELLIS_BUILD_TESTS": "ON",
              "TRELLIS_BUILD_BENCHMARKS": "OFF"}
    argv = ["cmake", "--preset", "cuda", "-B", str(build)] + [f"-D{k}={v}" for k, v in wanted.items()]
    if not (build / "CMakeCache.txt").exists() and shutil.which("ninja"):
        argv += ["-G", "Ninja"]
    if (build / "CMakeCache.txt").exists():
        cache = cmake_cache(build)
        if cache.get("TRELLIS_NATIVE") == "ON" or cache.get("CMAKE_CXX_FLAGS") != f"-march={a.march}":
            log(f"{build} was configured for another CPU target; configuring it for -march={a.march}")
    log(f"configure: {' '.join(argv)}")
    rc, out = run_text(argv, timeout=600, cwd=ROOT)
    if rc != 0:
        sys.exit(f"gpu-check: configure failed (exit {rc}):\n{out}")
    # Only what the carried tests run: trellis and the targets named like the chosen tests (a
    # test foo_np2 runs target foo). If a chosen test still has no command, everything is built.
    targets = build_targets(build)
    names = {t["name"] for t in query_tests(build) if test_chosen(t, a.cpu_tests)}
    wanted = sorted({"trellis"} | {n for t in names for n in (t, re.sub(r"_np[0-9]+$", "", t)) if n in targets})
    build_run(a, build, wanted)
    missing = [t["name"] for t in query_tests(build) if test_chosen(t, a.cpu_tests) and "command" not in t]
    if missing:
        log(f"tests {' '.join(missing)} name no target of their own: building everything")
        build_run(a, build, [])


def build_run(a, build, targets):
    t0 = time.time()
    argv = ["cmake", "--build", str(build), "-j", str(a.jobs)] + (["--target"] + targets if targets else [])
    log(f"build: {' '.join(argv)} (timeout {a.build_timeout} s)")
    try:
        p = subprocess.run(argv, cwd=ROOT, timeout=a.build_timeout)
    except subprocess.TimeoutExpired:
        sys.exit(f"gpu-check: the build did not finish in {a.build_timeout} s (--build-timeout)")
    if p.returncode != 0:
        sys.exit(f"gpu-check: the build failed (exit {p.returncode})")
    log(f"build done in {time.time() - t0:.0f} s")


def build_targets(build):
    rc, out = run_text(["cmake", "--build", str(build), "--target", "help"], timeout=120)
    return {m.group(1) for m in re.finditer(r"(?m)^(?:\.\.\. )?([A-Za-z0-9_.+-]+)(?::| *$)", out)}


def query_tests(build):
    rc, out = run_text(["ctest", "--test-dir", str(build), "-N", "--show-only=json-v1"], timeout=120)
    if rc != 0:
        sys.exit(f"gpu-check: ctest -N failed in {build}:\n{out}")
    return json.loads(out)["tests"]


def test_chosen(t, cpu_regex):
    labels = next((p["value"] for p in t.get("properties", []) if p["name"] == "LABELS"), [])
    return "gpu" in labels or bool(GPU_NAME.search(t["name"])) or bool(re.search(cpu_regex, t["name"]))


def discover_tests(build, cpu_regex):
    chosen = []
    for t in query_tests(build):
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        labels = props.get("LABELS", [])
        if not test_chosen(t, cpu_regex):
            continue
        if "command" not in t:
            sys.exit(f"gpu-check: test {t['name']} has no command in {build} (its executable was not built)")
        chosen.append({"name": t["name"], "labels": labels, "gpu": "gpu" in labels, "command": t["command"],
                       "env": props.get("ENVIRONMENT", []), "cwd": props.get("WORKING_DIRECTORY", str(build)),
                       "timeout": float(props.get("TIMEOUT", 300)), "skip_rc": props.get("SKIP_RETURN_CODE"),
                       "pass_regex": props.get("PASS_REGULAR_EXPRESSION", []),
                       "fail_regex": props.get("FAIL_REGULAR_EXPRESSION", []),
                       "will_fail": bool(props.get("WILL_FAIL", False))})
    chosen.sort(key=lambda t: (not t["gpu"], t["name"]))
    return chosen


class Packer:
    """Collects files into a staging tree (bin/ lib/ share/ etc/) and rewrites test commands."""

    def __init__(self, stage, build, src, mpiexec, pythons):
        self.stage, self.build, self.src, self.mpiexec, self.pythons = stage, build, src, mpiexec, pythons
        self.bins = {}       # name -> source path
        self.notes = []

    def add_bin(self, src, name=None):
        src = Path(src).resolve()
        name = name or src.name
        if name in self.bins and self.bins[name] != src:
            sys.exit(f"gpu-check: two executables named {name}: {self.bins[name]} and {src}")
        self.bins[name] = src
        dst = self.stage / "bin" / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
        return dst

    def map_path(self, s, command=False):
        """A build-tree, source-tree, mpiexec or python path of a test as a placeholder."""
        if not s.startswith("/"):
            return s
        if s in (self.mpiexec, os.path.realpath(self.mpiexec)):
            return "@BUNDLE@/bin/mpiexec"
        if s in self.pythons:
            return "@PYTHON@"
        b, r = str(self.build), str(self.src)
        if s == b or s.startswith(b + "/"):
            p = Path(s)
            if p.is_file() and os.access(p, os.X_OK):
                self.add_bin(p)
                return f"@BUNDLE@/bin/{p.name}"
            if command and not p.exists():
                sys.exit(f"gpu-check: a test runs {s}, which is not built in {self.build}")
            return "@WORK@" + s[len(b):]
        if s == r or s.startswith(r + "/"):
            return "@SRC@" + s[len(r):]
        if not Path(s).exists():
            return s
        self.notes.append(f"absolute path {s} kept as is (must exist on the GPU machine)")
        return s

    def map_env(self, kv):
        k, _, v = kv.partition("=")
        return k + "=" + ":".join(self.map_path(x) for x in v.split(":"))

    def map_test(self, t):
        t = dict(t)
        t["command"] = [self.map_path(x, command=True) for x in t["command"]]
        t["env"] = [self.map_env(x) for x in t["env"]]
        t["cwd"] = self.map_path(t["cwd"])
        if t["cwd"].startswith("@BUNDLE@"):
            t["cwd"] = "@WORK@"
        return t


def ompi_paths():
    rc, out = run_text(["ompi_info", "--path", "all", "--parsable"], timeout=60)
    paths = {}
    for line in out.splitlines():
        m = re.match(r"^path:([a-z_]+):(.*)$", line)
        if m:
            paths[m.group(1)] = m.group(2)
    if "pkglibdir" not in paths:
        sys.exit(f"gpu-check: ompi_info --path all gave no pkglibdir (is openmpi-bin installed?):\n{out[:500]}")
    return paths


def add_mpi(pk, stage):
    """mpirun/orted, the MCA components without heavy fabric deps, PMIx, help files, params."""
    paths = ompi_paths()
    orterun = Path(os.path.realpath(shutil.which("orterun") or pk.mpiexec))
    for name in ("mpiexec", "mpirun"):
        pk.add_bin(orterun, name)
    pk.add_bin(Path(paths.get("bindir", "/usr/bin")) / "orted")
    plugins = [(Path(paths["pkglibdir"]), stage / "lib" / "openmpi3")]
    libpmix = [p for n, p in ldd(Path(paths["pkglibdir"]) / "mca_pmix_ext3x.so") if n.startswith("libpmix.so")]
    if libpmix and libpmix[0]:
        pmix_dir = Path(os.path.realpath(libpmix[0])).parent
        plugins.append((pmix_dir / "pmix", stage / "lib" / "pmix"))
        help_dir = pmix_dir.parent / "share" / "pmix"
        if help_dir.is_dir():
            shutil.copytree(help_dir, stage / "share" / "pmix", dirs_exist_ok=True)
    ucs = [p for n, p in ldd(pk.stage / "bin" / "trellis") if n.startswith("libucs.so")]
    if ucs and ucs[0]:
        # Only the cross-memory-attach transport: posix/sysv shared memory is built into libuct,
        # and the InfiniBand modules need rdma-core.
        plugins.append((Path(os.path.realpath(ucs[0])).parent / "ucx", stage / "lib" / "ucx", r"^libuct_cma\.so\.\d+$"))
    plugins.append((Path("/usr/lib/x86_64-linux-gnu/hwloc"), stage / "lib" / "hwloc", r"^hwloc_pci\.so$"))
    skipped = []
    for entry in plugins:
        src, dst = entry[0], entry[1]
        pattern = entry[2] if len(entry) > 2 else r"\.so$"
        if not src.is_dir():
            continue
        dst.mkdir(parents=True, exist_ok=True)
        for f in sorted(src.iterdir()):
            if not re.search(pattern, f.name) or not f.is_file():
                continue
            heavy = [n for n, _ in ldd(f) if HEAVY_DEP.match(n)]
            if heavy:
                skipped.append(f"{f.name} ({', '.join(heavy)})")
                continue
            shutil.copy2(f, dst / f.name, follow_symlinks=True)
    help_dir = Path(paths.get("pkgdatadir", "/usr/share/openmpi"))
    if help_dir.is_dir():
        shutil.copytree(help_dir, stage / "share" / "openmpi", dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("*.pc", "*wrapper-data.txt", "amca-param-sets"))
    conf = Path(paths.get("sysconfdir", "/etc/openmpi")) / "openmpi-mca-params.conf"
    (stage / "etc").mkdir(exist_ok=True)
    if conf.exists():
        shutil.copy2(conf, stage / "etc" / conf.name)
    return skipped


def collect_libs(stage):
    """Copies every library that an ELF file of the stage needs and the GPU image lacks into lib/."""
    lib, fallback = stage / "lib", stage / "lib" / "fallback"
    lib.mkdir(exist_ok=True)
    expected, missing_here = set(), set()
    elves = [p for p in stage.rglob("*") if p.is_file() and is_elf(p)]
    for f in elves:
        for name, path in ldd(f):
            if path is None:
                if CUDA_LIB.match(name) or SYSTEM_LIB.match(name):
                    expected.add(name)
                else:
                    missing_here.add(f"{name} (needed by {f.relative_to(stage)})")
                continue
            if not path or SYSTEM_LIB.match(name) or CUDA_LIB.match(name):
                expected.add(name)
                continue
            dst = (fallback if GCC_LIB.match(name) else lib) / name
            if GCC_LIB.match(name):
                expected.add(name)
            if not dst.exists():
                dst.parent.mkdir(exist_ok=True)
                shutil.copy2(path, dst, follow_symlinks=True)
    if missing_here:
        sys.exit("gpu-check: libraries not found here either:\n  " + "\n  ".join(sorted(missing_here)))
    return sorted(expected)


def strip_all(stage):
    if not shutil.which("strip"):
        return
    for p in stage.rglob("*"):
        if p.is_file() and is_elf(p):
            mode = p.stat().st_mode
            p.chmod(mode | 0o200)
            run_text(["strip", "--strip-unneeded", str(p)], timeout=120)
            p.chmod(mode)


def tree_bytes():
    """Bytes of what the device tool sends besides carried paths: tracked + untracked-not-ignored."""
    rc, out = run_text(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"], timeout=60)
    total = 0
    for name in out.split("\0"):
        p = ROOT / name
        if name and p.is_file() and not p.is_symlink():
            total += p.stat().st_size
    return total


def exclude_from_git(out_dir):
    try:
        rel = out_dir.resolve().relative_to(ROOT)
    except ValueError:
        return
    rc, _ = run_text(["git", "-C", str(ROOT), "check-ignore", "-q", str(rel) + "/"], timeout=30)
    if rc == 0:
        return
    rc, path = run_text(["git", "-C", str(ROOT), "rev-parse", "--git-path", "info/exclude"], timeout=30)
    exclude = Path(path.strip())
    exclude = exclude if exclude.is_absolute() else ROOT / exclude
    exclude.parent.mkdir(parents=True, exist_ok=True)
    with open(exclude, "a") as f:
        f.write(f"/{rel}/\n")
    log(f"added /{rel}/ to {exclude}")


def git_describe():
    rc, head = run_text(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], timeout=30)
    rc2, dirty = run_text(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"], timeout=60)
    return head.strip() + ("-dirty" if dirty.strip() else "")


def cmd_pack(a):
    build = Path(a.build_dir).resolve()
    out_dir = Path(a.out).resolve()
    if out_dir == ROOT or out_dir in ROOT.parents:
        raise UsageError(f"--out {a.out} would hold the repository itself")
    if not a.no_build:
        configure_and_build(a, build)
    elif not (build / "CMakeCache.txt").exists():
        raise UsageError(f"--no-build but {build} is not a configured build folder")
    cache = cmake_cache(build)
    if cache.get("TRELLIS_CUDA") != "ON":
        log(f"warning: {build} is not a TRELLIS_CUDA=ON build: the GPU tests will report 'not built'")
    trellis = build / "launchers" / "trellis"
    if not trellis.exists():
        sys.exit(f"gpu-check: {trellis} is missing: build the trellis target first")
    tests = discover_tests(build, a.cpu_tests)
    if not any(t["gpu"] for t in tests):
        log("warning: no test carries the label gpu in this build")
    mpiexec = cache.get("MPIEXEC_EXECUTABLE", "/usr/bin/mpiexec")
    pythons = {cache.get("TRELLIS_SYSTEM_PYTHON", "/usr/bin/python3"), cache.get("TRELLIS_PEER_PYTHON", "")} - {""}

    stage = Path(tempfile.mkdtemp(prefix="gpu-check-stage-"))
    try:
        pk = Packer(stage, build, ROOT, mpiexec, pythons)
        pk.add_bin(trellis)
        mapped = [pk.map_test(t) for t in tests]
        skipped = add_mpi(pk, stage)
        if a.strip:
            strip_all(stage)
        expected = collect_libs(stage)
        needs = {}
        files = []
        for p in sorted(stage.rglob("*")):
            if p.is_file():
                if is_elf(p):
                    merge_needs(needs, version_needs(p))
                files.append({"path": str(p.relative_to(stage)), "bytes": p.stat().st_size})
        raw = sum(f["bytes"] for f in files)
        out_dir.mkdir(parents=True, exist_ok=True)
        exclude_from_git(out_dir)
        for old in out_dir.iterdir():
            if old.name in (PAYLOAD, "MANIFEST.json", "MANIFEST.txt") or old.name.startswith("payload"):
                old.unlink()
        payload = out_dir / PAYLOAD
        log(f"compressing {len(files)} files ({human(raw)}) into {payload}")
        t0 = time.time()
        if shutil.which("tar") and shutil.which("xz"):
            env = dict(os.environ, XZ_OPT=f"-6 -T{a.jobs}")
            rc, out = run_text(["tar", "-C", str(stage), "--owner=0", "--group=0", "-cJf", str(payload), "."],
                               timeout=600, env=env)
            if rc != 0:
                sys.exit(f"gpu-check: tar failed: {out}")
        else:
            with tarfile.open(payload, "w:xz") as tf:
                tf.add(stage, arcname=".")
        packed = payload.stat().st_size
        log(f"compressed to {human(packed)} in {time.time() - t0:.0f} s")
        rc, nvcc = run_text([cache.get("CMAKE_CUDA_COMPILER", "nvcc"), "--version"], timeout=60)
        manifest = {
            "format": FORMAT, "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "source": git_describe(), "source_dir": str(ROOT), "build_dir": str(build),
            "host": os.uname().nodename, "march": a.march, "cuda_architectures": cache.get("TRELLIS_CUDA_ARCHITECTURES"),
            "nvcc": (nvcc.strip().splitlines() or ["?"])[-1], "payload": PAYLOAD, "payload_sha256": sha256(payload),
            "payload_bytes": packed, "unpacked_bytes": raw,
            "needs": {k: ".".join(map(str, v)) for k, v in sorted(needs.items())},
            "expected_on_device": expected, "skipped_components": skipped, "notes": pk.notes,
            "model": None, "model_note": model_note(a), "tests": mapped, "files": files,
        }
        (out_dir / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
        (out_dir / "MANIFEST.txt").write_text(manifest_text(manifest))
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    tree = tree_bytes()
    bundle = sum(p.stat().st_size for p in out_dir.iterdir() if p.is_file())
    print(manifest_text(manifest), end="")
    log(f"bundle {out_dir}: {human(bundle)} (payload {human(packed)}, {human(raw)} unpacked); "
        f"working tree {human(tree)}; together {human(bundle + tree)} of the 64 MiB a call may carry")
    if bundle > a.budget_mib * 2**20:
        sys.exit(f"gpu-check: the bundle is {human(bundle)}, over --budget-mib {a.budget_mib}")
    if bundle + tree > 64 * 2**20:
        sys.exit("gpu-check: bundle + working tree exceed 64 MiB: the device tool would refuse the call")
    try:
        rel = out_dir.relative_to(ROOT)
        log(f'device call: run(command="scripts/gpu-check run --bundle {rel}", carry=["{rel}"], timeout_s=540)')
    except ValueError:
        log(f"warning: {out_dir} is outside the repository: the device tool carries only paths inside it")
    gguf = os.environ.get("TRELLIS_SMOLLM2_GGUF") or read_models_env()
    if a.model_parts and gguf and Path(gguf).is_file():
        parts = split(gguf, ROOT, tree, bundle)
        for d in parts:
            exclude_from_git(d)
        if bundle + tree + (parts[-1] / "part").stat().st_size > 64 * 2**20:
            sys.exit(f"gpu-check: bundle + working tree + the last model part ({parts[-1].name}) exceed 64 MiB")
        log(f"with SmolLM2, {len(parts)} device calls, each within 30 s of the one before (the machine keeps /tmp "
            "while warm):")
        for d in parts[:-1]:
            log(f'  run(command="scripts/gpu-check stash --part {d.name}", carry=["{d.name}"], timeout_s=60)')
        log(f'  run(command="scripts/gpu-check run --bundle .gpu-bundle --model-part {parts[-1].name}", '
            f'carry=[".gpu-bundle", "{parts[-1].name}"], timeout_s=540)')


def model_note(a):
    gguf = os.environ.get("TRELLIS_SMOLLM2_GGUF") or read_models_env()
    if gguf and Path(gguf).is_file():
        size = Path(gguf).stat().st_size
        if a.model_parts:
            return (f"SmolLM2 GGUF ({gguf}, {human(size)}) in parts beside the bundle (.gpu-model-1 …): "
                    "calls before the run stash all but the last, the run call carries the last")
        return (f"SmolLM2 GGUF ({gguf}, {human(size)}) left out (--no-model-parts): the decode runs use "
                "synthetic --preset models generated there")
    return "no SmolLM2 GGUF installed here; the decode runs use synthetic --preset models generated there"


def read_models_env():
    p = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "trellis" / "models.env"
    if p.is_file():
        for line in p.read_text().splitlines():
            if line.startswith("TRELLIS_SMOLLM2_GGUF="):
                return line.split("=", 1)[1].strip()
    return None


def manifest_text(m):
    by_dir = {}
    for f in m["files"]:
        d = f["path"].split("/")[0] if "/" not in f["path"][4:] else "/".join(f["path"].split("/")[:2])
        n, b = by_dir.get(d, (0, 0))
        by_dir[d] = (n + 1, b + f["bytes"])
    big = sorted(m["files"], key=lambda f: -f["bytes"])[:8]
    lines = [f"trellis GPU bundle, format {m['format']}, made {m['created']} from {m['source']} on {m['host']}",
             f"  CPU target -march={m['march']}, CUDA architectures {m['cuda_architectures']}, {m['nvcc']}",
             f"  payload {m['payload']}: {human(m['payload_bytes'])} compressed, {human(m['unpacked_bytes'])} unpacked",
             "  needs on the GPU machine: " + ", ".join(f"{k} >= {v}" for k, v in m["needs"].items()),
             "  expected there (not carried): " + " ".join(m["expected_on_device"]),
             "  folders: " + ", ".join(f"{d} {n} files {human(b)}" for d, (n, b) in sorted(by_dir.items())),
             "  largest: " + ", ".join(f"{f['path']} {human(f['bytes'])}" for f in big),
             "  tests: " + " ".join(t["name"] + (" [gpu]" if t["gpu"] else "") for t in m["tests"]),
             "  Open MPI/PMIx components left out: " + (", ".join(m["skipped_components"]) or "none"),
             "  model: " + m["model_note"]]
    lines += ["  note: " + n for n in m["notes"]]
    return "\n".join(lines) + "\n"
