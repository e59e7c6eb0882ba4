"""scripts/gpu-check: the SmolLM2 GGUF across several device calls (the entry point and its
--help: scripts/gpu-check).

A call carries at most 64 MiB and the GGUF is 94 MiB, so `pack` splits it into folders
.gpu-model-1 … .gpu-model-N: the last (as much as fits beside the working tree and the bundle)
is carried by the `run` call; the others (as much as fits beside the working tree alone) are
carried each by a call before it that only stashes it in the GPU machine's /tmp. Two parts while
the working tree is small; three once it has grown (docs/gpu-runs: 5 MiB by call 18). The
machine keeps /tmp while it stays warm (30 s after a call), so the calls must follow at once.
Each part names the whole file's size and SHA-256; the pieces are joined only when every part
is there and the join's SHA-256 matches. A part missing (the machine was given back between
the calls) is said, and the run goes on without SmolLM2.
"""
import hashlib
import json
import os
import shutil
from pathlib import Path

from .common import UsageError, human, log, sha256

CALL_BYTES = 64 << 20         # what one device call may carry
MARGIN_BYTES = 1 << 20        # files the working tree gains between pack and the call
MAX_STASH_PARTS = 3           # stash calls before the run call
STASH = Path(os.environ.get("TMPDIR", "/tmp")) / "trellis-gpu-check" / "model"


def split(gguf, root, tree_bytes, bundle_bytes):
    """Writes root/.gpu-model-1 … .gpu-model-N from gguf; returns the folders in order.

    The last part travels beside the tree and the bundle (the run call), every other part
    beside the tree alone (a stash call each)."""
    gguf = Path(gguf)
    size = gguf.stat().st_size
    stash_max = CALL_BYTES - tree_bytes - MARGIN_BYTES
    last_max = CALL_BYTES - tree_bytes - bundle_bytes - MARGIN_BYTES
    if last_max <= 0 or (size > last_max and stash_max <= 0):
        raise UsageError(f"{gguf} ({human(size)}) cannot travel beside a working tree of {human(tree_bytes)} "
                         f"and a bundle of {human(bundle_bytes)}: no room left in a {human(CALL_BYTES)} call")
    last = min(size, last_max)
    rest = size - last
    stash_parts = -(-rest // stash_max) if rest > 0 else 0
    if stash_parts > MAX_STASH_PARTS:
        raise UsageError(f"{gguf} ({human(size)}) would need {stash_parts} stash calls beside a working tree of "
                         f"{human(tree_bytes)} (at most {MAX_STASH_PARTS}: the machine keeps /tmp only 30 s "
                         "between calls)")
    # Stash parts share the rest evenly (each within stash_max); the run call's part is last.
    counts = [rest // stash_parts + (1 if k < rest % stash_parts else 0) for k in range(stash_parts)] + [last]
    whole = sha256(gguf)
    dirs = []
    offset = 0
    with open(gguf, "rb") as f:
        for index, count in enumerate(counts, 1):
            d = Path(root) / f".gpu-model-{index}"
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
            f.seek(offset)
            data = f.read(count)
            (d / "part").write_bytes(data)
            meta = {"name": gguf.name, "bytes": size, "sha256": whole, "index": index, "count": len(counts),
                    "offset": offset, "part_bytes": len(data), "part_sha256": hashlib.sha256(data).hexdigest()}
            (d / "PART.json").write_text(json.dumps(meta, indent=1) + "\n")
            dirs.append(d)
            offset += count
    # A part folder left from an earlier split with more parts would confuse the calls.
    for stale in sorted(Path(root).glob(".gpu-model-*")):
        if stale not in dirs and stale.name[len(".gpu-model-"):].isdigit():
            shutil.rmtree(stale, ignore_errors=True)
    sizes = ", ".join(f"{d.name} {human((d / 'part').stat().st_size)}" for d in dirs)
    log(f"model parts: {sizes} of {gguf.name}")
    return dirs


def read_part(part_dir):
    p = Path(part_dir)
    meta_file = p / "PART.json"
    if not meta_file.is_file() or not (p / "part").is_file():
        raise UsageError(f"{p} holds no PART.json and part: make it with `scripts/gpu-check pack` "
                         "and name it in the device call's carry")
    meta = json.loads(meta_file.read_text())
    for key in ("name", "bytes", "sha256", "index", "count", "offset", "part_bytes", "part_sha256"):
        if key not in meta:
            raise UsageError(f"{meta_file} lacks '{key}'")
    if (p / "part").stat().st_size != meta["part_bytes"] or sha256(p / "part") != meta["part_sha256"]:
        raise UsageError(f"{p}/part does not match its PART.json (size or SHA-256): pack it again")
    return meta


def stash(part_dir):
    """Copies a part into the machine's /tmp; returns the joined GGUF's path once every part is
    there and the join checks out, else None (and says which parts are missing)."""
    meta = read_part(part_dir)
    STASH.mkdir(parents=True, exist_ok=True)
    key = meta["sha256"][:16]
    shutil.copyfile(Path(part_dir) / "part", STASH / f"{key}.part{meta['index']}")
    log(f"stashed part {meta['index']} of {meta['count']} of {meta['name']} in {STASH}")
    return joined(meta)


def joined(meta):
    key = meta["sha256"][:16]
    target = STASH / key / meta["name"]
    if target.is_file() and target.stat().st_size == meta["bytes"]:
        return target
    parts = [STASH / f"{key}.part{i}" for i in range(1, meta["count"] + 1)]
    missing = [str(i) for i, p in enumerate(parts, 1) if not p.is_file()]
    if missing:
        log(f"model: part(s) {', '.join(missing)} of {meta['name']} are not on this machine "
            "(the earlier call's machine was given back, or it was never made): running without it")
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".joining")
    with open(tmp, "wb") as out:
        for p in parts:
            with open(p, "rb") as f:
                shutil.copyfileobj(f, out)
    if tmp.stat().st_size != meta["bytes"] or sha256(tmp) != meta["sha256"]:
        tmp.unlink()
        log(f"model: the joined {meta['name']} does not match its SHA-256: running without it")
        return None
    tmp.rename(target)
    for p in parts:
        p.unlink()
    log(f"model: {target} ({human(meta['bytes'])}, SHA-256 checked)")
    return target
