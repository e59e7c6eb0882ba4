"""What the peer scripts share: where SmolLM2's GGUF is, and what a missing model or package means.

A missing model or package skips the check (exit 77, CTest's SKIP_RETURN_CODE), so that a
developer without the peers can still run the suite. Under TRELLIS_REQUIRE_PEERS=1 (set by
.ci/run) it is a failure instead (exit 1), with a message naming exactly what is missing:
which module, which interpreter, which file.
"""
import importlib
import os
import sys

SKIP = 77

# Module -> what installs it.
PACKAGES = {
    "tokenizers": "tokenizers (scripts/setup-peers)",
    "gguf": "gguf (scripts/setup-peers)",
    "numpy": "numpy (scripts/setup-peers)",
    "llama_cpp": "llama-cpp-python (scripts/setup-peers)",
    "jinja2": "jinja2 (scripts/setup-peers, with llama-cpp-python)",
    "openai": "openai (scripts/setup-peers)",
    "torch": "python3-torch (scripts/setup-deps; Debian's /usr/bin/python3)",
}


def required():
    """True under TRELLIS_REQUIRE_PEERS=1: a missing peer fails instead of skipping."""
    return os.environ.get("TRELLIS_REQUIRE_PEERS") == "1"


def missing(what):
    """The exit status for a missing model or peer `what`: 77 (skipped), or 1 under
    TRELLIS_REQUIRE_PEERS=1. Prints `what`."""
    if required():
        print(f"FAIL: {what} [TRELLIS_REQUIRE_PEERS=1: a missing peer is a failure, not a skip]",
              file=sys.stderr, flush=True)
        return 1
    print(f"SKIP: {what}", flush=True)
    return SKIP


def missing_modules(*names):
    """'' when this interpreter imports every module of `names`, else a message naming each
    one that fails, why, what installs it, and the interpreter."""
    gone = []
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as e:  # ImportError, or a native library that fails to load
            gone.append(f"{name} ({type(e).__name__}: {e}; package {PACKAGES.get(name, name)})")
    if not gone:
        return ""
    return f"{sys.executable} cannot import " + ", ".join(gone)


def cache_dir():
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "trellis")


def _model():
    """(path, '') or ('', what was looked at and not found)."""
    p = os.environ.get("TRELLIS_SMOLLM2_GGUF", "")
    source = f"TRELLIS_SMOLLM2_GGUF={p}"
    if not p:
        env = os.path.join(cache_dir(), "models.env")
        if not os.path.isfile(env):
            return "", f"SmolLM2 GGUF not installed: TRELLIS_SMOLLM2_GGUF is unset and {env} does not exist " \
                       "(run scripts/setup-models)"
        for line in open(env):
            if line.startswith("TRELLIS_SMOLLM2_GGUF="):
                p = line.strip().split("=", 1)[1]
        if not p:
            return "", f"SmolLM2 GGUF not installed: TRELLIS_SMOLLM2_GGUF is unset and {env} has no " \
                       "TRELLIS_SMOLLM2_GGUF= line (run scripts/setup-models)"
        source = f"{env} records TRELLIS_SMOLLM2_GGUF={p}"
    if os.path.isfile(p):
        return p, ""
    return "", f"SmolLM2 GGUF missing: {source}, which is not a file (run scripts/setup-models)"


def model_path():
    """TRELLIS_SMOLLM2_GGUF from the environment or ~/.cache/trellis/models.env, or ''."""
    return _model()[0]


def model_missing():
    """Why model_path() is '' (what was looked at), or '' when the model is there."""
    return _model()[1]
