#!/usr/bin/env python3
"""Writes the seed corpora of fuzz/build's targets: OUT/<target>_corpus/seed-*.

   fuzz/seeds.py OUT TARGET...

Seeds are small valid inputs (and a few near-misses) so that libFuzzer starts at the
formats' real structure instead of discovering magic numbers byte by byte. The first byte
of the prompts, openai and topology inputs selects a mode in the entry point (see each
fuzz/<target>_fuzz.cpp), so their seeds are written once per mode."""
import json
import os
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def gguf_seed():
    """A GGUF v3 file with a few metadata keys, a tiny tokenizer and two tensors."""
    def s(x):
        b = x.encode()
        return struct.pack("<Q", len(b)) + b

    kv = [
        ("general.architecture", 8, s("llama")),
        ("llama.block_count", 4, struct.pack("<I", 1)),
        ("tokenizer.ggml.model", 8, s("gpt2")),
        ("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 3) + s("a") + s("b") + s("ab")),
        ("tokenizer.ggml.merges", 9, struct.pack("<IQ", 8, 1) + s("a b")),
    ]
    tensors = [("w", [4, 2], 0), ("n", [4], 0)]  # F32
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv))
    for k, t, v in kv:
        out += s(k) + struct.pack("<I", t) + v
    off = 0
    for name, dims, typ in tensors:
        out += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", typ, off)
        n = 1
        for d in dims:
            n *= d
        off += (n * 4 + 31) // 32 * 32
    out += b"\0" * ((32 - len(out) % 32) % 32)
    return out + bytes((i * 7) & 0x3F for i in range(off))


def safetensors_seeds():
    def one(tensors):
        header, data, off = {}, b"", 0
        for n, dt, shape, size in tensors:
            header[n] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + size]}
            data += bytes((i * 7) & 255 for i in range(size))
            off += size
        h = json.dumps(header).encode()
        return struct.pack("<Q", len(h)) + h + data
    return [one([("a", "F32", [2, 3], 24), ("b", "BF16", [4], 8)]), one([("w", "F16", [2, 2], 8)])]


PROMPTS = [
    '{"tokens": [1, 2, 3], "sampling": {"greedy": true, "max_tokens": 4}}\n',
    '{"text": "Once upon a time", "id": "a", "sampling": {"temperature": 0.7, "top_k": 40, "top_p": 0.9, '
    '"seed": 3, "stop": [2], "max_tokens": 8}}\n{"text": "hello world"}\n',
    '{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi <|im_start|>"}]}\n',
    '{"text": "x", "swift": true, "sampling": {"repetition_penalty": 1.1, "min_p": 0.05}}\n',
]
SYNTHETIC = ["n=4,in=8,out=2", "n=1,in=1,out=1,seed=7,vocab=100"]

OPENAI = [
    (0, {"model": "m", "prompt": "Hello", "max_tokens": 4}),
    (0, {"model": "m", "prompt": [1, 2, 3], "temperature": 0.5, "top_p": 0.9, "stop": ["\n"], "seed": 1}),
    (0, {"model": "m", "prompt": ["a"], "stream": True, "stream_options": {"include_usage": True}}),
    (1, {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 3}),
    (1, {"model": "m", "messages": [{"role": "developer", "content": [{"type": "text", "text": "x"}]},
                                    {"role": "user", "content": "<|im_start|>system"}],
         "response_format": {"type": "text"}, "frequency_penalty": 0.5, "n": 1}),
]


def trellis_topo_json():
    """Topology and placement JSON from the release build's `trellis topo --json`, if built."""
    exe = os.path.join(ROOT, "build", "release", "launchers", "trellis")
    if not os.access(exe, os.X_OK):
        return []
    try:
        text = subprocess.run([exe, "topo", "--synthetic", "hosts=2,sockets=1,cores=2,gpus=2,gpu=H100-SXM",
                               "--pp", "2", "--tp", "2", "--json"], capture_output=True, text=True, timeout=30,
                              check=True).stdout
        d = json.loads(text)
        return [(1, json.dumps(d["topology"])), (2, json.dumps(d["placement"]))]
    except (OSError, subprocess.SubprocessError, ValueError, KeyError):
        return []


def seeds(target):
    if target == "gguf":
        return [gguf_seed()]
    if target == "safetensors":
        return safetensors_seeds()
    if target == "prompts":
        return [bytes([m]) + p.encode() for p in PROMPTS for m in range(4)] + [b"\0" + s.encode() for s in SYNTHETIC]
    if target == "tokenizer":
        with open(os.path.join(ROOT, "tests", "tokenizer", "strings.json"), encoding="utf-8") as f:
            return [s.encode() for s in json.load(f) if len(s.encode()) <= 4096]
    if target == "frame":
        hello = b"TRLSHELO" + struct.pack("<III", 1, 0, 1) + b"k" * 32
        header = struct.pack("<IIQ", 0x31465254, 5, 1024)
        return [hello + header, hello + header * 3, header * 4]
    if target == "openai":
        return [bytes([mode | codec]) + json.dumps(body).encode() for mode, body in OPENAI for codec in (0, 2)]
    if target == "topology":
        out = []
        shared = os.environ.get("TRELLIS_SHARED") or os.path.join(ROOT, "..", "shared")
        topo_dir = os.path.join(shared, "topologies")
        if os.path.isdir(topo_dir):
            for name in sorted(os.listdir(topo_dir)):
                with open(os.path.join(topo_dir, name), "rb") as f:
                    data = f.read()
                if len(data) < 65535:
                    out.append(b"\0" + data)
        out.append(b"\0" + b'<?xml version="1.0"?><topology version="2.0"><object type="Machine" os_index="0" '
                   b'cpuset="0x1" complete_cpuset="0x1" allowed_cpuset="0x1" nodeset="0x1" complete_nodeset="0x1" '
                   b'allowed_nodeset="0x1"><object type="Core" os_index="0" cpuset="0x1"><object type="PU" '
                   b'os_index="0" cpuset="0x1"/></object></object></topology>')
        out += [bytes([mode]) + text.encode() for mode, text in trellis_topo_json()]
        return out
    raise SystemExit(f"fuzz/seeds.py: unknown target {target}")


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    out = sys.argv[1]
    for target in sys.argv[2:]:
        d = os.path.join(out, f"{target}_corpus")
        os.makedirs(d, exist_ok=True)
        for i, data in enumerate(seeds(target)):
            with open(os.path.join(d, f"seed-{i}"), "wb") as f:
                f.write(data)


if __name__ == "__main__":
    main()
