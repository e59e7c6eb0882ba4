#!/usr/bin/env python3
"""Checks trellis's tokenizer against independent implementations on the same GGUF file.

Peers:
  hf     Hugging Face `tokenizers` (Rust), built from the GGUF vocabulary and merges read by
         llama.cpp's own `gguf` package, with SmolLM2's pre-tokenizer (individual digits,
         then byte-level with the GPT-2 regex) and the control tokens as special tokens;
  llama  llama.cpp's tokenizer through llama-cpp-python (vocab_only load).

Usage:
  llama_cpp_tokenize.py [--gguf FILE] --strings strings.json --trellis-tool PATH [--peer hf|llama|all]
The trellis tool is run as `PATH FILE strings.json` and prints one JSON list of id lists.
Exit status: 0 when every available peer gives identical ids, 1 on a mismatch, 77 when no
peer or the model is available (CTest reports it as skipped). Under TRELLIS_REQUIRE_PEERS=1
(CI) every requested peer and the model must be there: a missing one is exit 1, named.
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import SKIP, missing, missing_modules, model_missing, model_path, required  # noqa: E402,F401


def gguf_vocab(path):
    import gguf  # llama.cpp's gguf-py
    r = gguf.GGUFReader(path)

    def strings(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    def ints(key):
        f = r.fields[key]
        return [int(f.parts[i][0]) for i in f.data]

    pre = bytes(r.fields["tokenizer.ggml.pre"].parts[r.fields["tokenizer.ggml.pre"].data[0]]).decode()
    return strings("tokenizer.ggml.tokens"), strings("tokenizer.ggml.merges"), ints("tokenizer.ggml.token_type"), pre


def hf_encoder(path):
    if importlib.util.find_spec("tokenizers") is None or importlib.util.find_spec("gguf") is None:
        return None
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    tokens, merges, types, pre = gguf_vocab(path)
    if pre not in ("smollm", "starcoder", "refact"):
        print(f"hf peer: pre-tokenizer {pre!r} not modelled here", file=sys.stderr)
        return None
    vocab = {t: i for i, t in reversed(list(enumerate(tokens)))}
    bpe = models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges])
    tk = Tokenizer(bpe)
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t, ty in zip(tokens, types) if ty in (3, 4)])
    return lambda s: tk.encode(s, add_special_tokens=False).ids


def llama_encoder(path):
    if importlib.util.find_spec("llama_cpp") is None:
        return None
    import llama_cpp
    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    return lambda s: llm.tokenize(s.encode("utf-8"), add_bos=False, special=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=model_path())
    ap.add_argument("--strings", required=True)
    ap.add_argument("--trellis-tool", required=True)
    ap.add_argument("--peer", default="all", choices=["hf", "llama", "all"])
    a = ap.parse_args()
    if not a.gguf:
        return missing(model_missing())
    strings = json.load(open(a.strings, encoding="utf-8"))
    ours = json.loads(subprocess.run([a.trellis_tool, a.gguf, a.strings], check=True,
                                     capture_output=True).stdout)
    assert len(ours) == len(strings)
    peers, absent = {}, {}
    if a.peer in ("hf", "all"):
        why = missing_modules("tokenizers", "gguf")
        enc = None if why else hf_encoder(a.gguf)
        if enc is None:
            absent["hf tokenizers"] = why or "its pre-tokenizer is not modelled here"
        else:
            peers["hf tokenizers"] = enc
    if a.peer in ("llama", "all"):
        why = missing_modules("llama_cpp")
        if why:
            absent["llama.cpp"] = why
        else:
            peers["llama.cpp"] = llama_encoder(a.gguf)
    if absent and (required() or not peers):
        return missing("; ".join(f"peer {k}: {v}" for k, v in absent.items()))
    for k, v in absent.items():
        print(f"not compared with {k}: {v}")
    bad = 0
    for name, enc in peers.items():
        mism = [(i, s) for i, s in enumerate(strings) if enc(s) != ours[i]]
        print(f"{name}: {len(strings) - len(mism)}/{len(strings)} strings give identical ids")
        for i, s in mism[:10]:
            print(f"  MISMATCH {s!r}\n    trellis {ours[i]}\n    {name} {enc(s)}")
        bad += len(mism)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
