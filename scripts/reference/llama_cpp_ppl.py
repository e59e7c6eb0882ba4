#!/usr/bin/env python3
"""Perplexity of a GGUF model on a text through llama.cpp (llama-cpp-python), with the same
windows as `trellis eval ppl`, and optionally trellis's own number beside it.

Windowing (llama.cpp's `llama-perplexity` convention, which trellis follows): tokenize the
whole text once (BOS only if the GGUF says add_bos_token; special-token text not parsed),
cut it into floor(N / ctx) non-overlapping windows of ctx tokens, evaluate each from an
empty KV cache (its first token replaced by BOS when the model adds BOS), and score only the
second half: logits at positions ctx/2 .. ctx-2 predict tokens ctx/2+1 .. ctx-1.
perplexity = exp(mean negative log-likelihood), log-softmax in float64.

Usage:
  llama_cpp_ppl.py --text FILE [--gguf FILE] [--ctx 512] [--max-windows N] [--threads T]
                   [--kv-f32] [--trellis 'CMD ...'] [--max-rel 0.01] [--json]
--trellis runs the given `trellis eval ppl ... --json` command line (the same --text/--ctx/
--max-windows must be in it; --model GGUF is appended when absent) and prints both; with
--max-rel the exit status is 1 when the relative difference exceeds it (or the token counts
differ). Exit 77 (skipped) without the model or llama-cpp-python (exit 1 instead under
TRELLIS_REQUIRE_PEERS=1).
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import missing, missing_modules, model_missing, model_path  # noqa: E402


def llama_ppl(a):
    import numpy as np
    import llama_cpp
    kw = {"type_k": 0, "type_v": 0} if a.kv_f32 else {}
    llm = llama_cpp.Llama(model_path=a.gguf, n_ctx=a.ctx, n_batch=a.ctx, n_ubatch=a.ctx, logits_all=True,
                          n_threads=a.threads, n_threads_batch=a.threads, verbose=False, **kw)
    text = open(a.text, "rb").read()
    # add_bos=True is llama.cpp's "add the model's special tokens": BOS only where the GGUF asks.
    toks = llm.tokenize(text, add_bos=True, special=False)
    add_bos = str(llm.metadata.get("tokenizer.ggml.add_bos_token", "false")).lower() == "true"
    n = len(toks) // a.ctx
    if n < 2:
        raise SystemExit(f"{a.text}: {len(toks)} tokens, need at least 2 x ctx = {2 * a.ctx}")
    if a.max_windows:
        n = min(n, a.max_windows)
    first = a.ctx // 2
    nll, count, per_window = 0.0, 0, []
    t0 = time.perf_counter()
    for w in range(n):
        win = list(toks[w * a.ctx:(w + 1) * a.ctx])
        if add_bos:
            win[0] = llm.token_bos()
        llm.reset()
        llm.eval(win)
        logits = np.asarray(llm.scores[:a.ctx], dtype=np.float64)[first:a.ctx - 1]
        mx = logits.max(axis=1, keepdims=True)
        lse = np.log(np.exp(logits - mx).sum(axis=1)) + mx[:, 0]
        targets = np.asarray(win[first + 1:a.ctx])
        s = float((lse - logits[np.arange(len(targets)), targets]).sum())
        nll += s
        count += len(targets)
        per_window.append(float(np.exp(s / len(targets))))
    secs = time.perf_counter() - t0
    return {"engine": "llama.cpp", "version": llama_cpp.__version__, "perplexity": float(np.exp(nll / count)),
            "mean_nll": nll / count, "tokens_scored": count, "text_tokens": len(toks), "windows": n, "ctx": a.ctx,
            "window_ppl": per_window, "eval_s": secs, "threads": a.threads,
            "kv_cache": "f32" if a.kv_f32 else "f16"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", default="")
    ap.add_argument("--text", required=True)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--max-windows", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--kv-f32", action="store_true", help="llama.cpp's KV cache in f32 (default f16)")
    ap.add_argument("--trellis", default="", help="a `trellis eval ppl ... --json` command line to compare")
    ap.add_argument("--max-rel", type=float, default=0.0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    a.gguf = a.gguf or model_path()
    if not a.gguf:
        return missing(model_missing())
    why = missing_modules("llama_cpp", "numpy")
    if why:
        return missing(why)
    ref = llama_ppl(a)
    out = {"llama.cpp": ref}
    status = 0
    if a.trellis:
        cmd = shlex.split(a.trellis)
        if "--model" not in cmd:  # the same GGUF as llama.cpp's (CTest does not know the path)
            cmd += ["--model", a.gguf]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            print(p.stdout + p.stderr, file=sys.stderr)
            return 1
        tr = json.loads(p.stdout.strip().splitlines()[-1])
        out["trellis"] = tr
        rel = tr["perplexity"] / ref["perplexity"] - 1
        out["relative_difference"] = rel
        if tr["tokens_scored"] != ref["tokens_scored"] or tr["text_tokens"] != ref["text_tokens"]:
            print(f"different token counts: trellis {tr['text_tokens']}/{tr['tokens_scored']}, llama.cpp "
                  f"{ref['text_tokens']}/{ref['tokens_scored']}", file=sys.stderr)
            status = 1
        if a.max_rel and abs(rel) > a.max_rel:
            print(f"perplexity differs by {rel:+.3%} (limit {a.max_rel:.2%})", file=sys.stderr)
            status = 1
    if a.json:
        print(json.dumps(out))
    else:
        print(f"llama.cpp {ref['version']} (KV {ref['kv_cache']}, {ref['threads']} threads): perplexity "
              f"{ref['perplexity']:.4f} over {ref['tokens_scored']} tokens ({ref['windows']} windows of {a.ctx}, "
              f"text {ref['text_tokens']} tokens) in {ref['eval_s']:.2f} s")
        if "trellis" in out:
            tr = out["trellis"]
            print(f"trellis ({tr['layout']}, {tr['dtype']}, variant {tr['variant']}): perplexity "
                  f"{tr['perplexity']:.4f} over {tr['tokens_scored']} tokens in {tr['eval_s']:.2f} s; "
                  f"difference {out['relative_difference']:+.3%}")
    return status


if __name__ == "__main__":
    sys.exit(main())
