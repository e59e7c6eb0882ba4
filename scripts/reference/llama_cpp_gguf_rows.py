#!/usr/bin/env python3
"""Checks trellis's GGUF reader against llama.cpp's own Python reader (gguf-py) on SmolLM2:
for a few tensors of each stored type, the rows trellis serves (Hugging Face names, rotary
row order of Q/K undone, dequantised to f32) must equal gguf-py's dequantisation with the
inverse of llama.cpp's converter permutation applied here independently.

Usage: llama_cpp_gguf_rows.py --tool PATH/gguf_rows_tool [--gguf FILE]
Exit: 0 equal, 1 different, 77 skipped (no model or no gguf/numpy; exit 1 instead under
TRELLIS_REQUIRE_PEERS=1).
"""
import argparse
import json
import subprocess
import sys

from peers import missing, missing_modules, model_missing, model_path


def unpermute(w, n_head):
    # llama.cpp's convert_hf_to_gguf permute(): w.reshape(n_head, 2, d/2, in).swapaxes(1, 2).
    # Its inverse: view GGUF rows as (n_head, d/2, 2, in), swap back, flatten.
    rows, cols = w.shape
    return w.reshape(n_head, rows // n_head // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=model_path())
    ap.add_argument("--tool", required=True)
    a = ap.parse_args()
    if not a.gguf:
        return missing(model_missing())
    why = missing_modules("gguf", "numpy")
    if why:
        return missing(why)
    import numpy as np
    import gguf
    from gguf.quants import dequantize
    r = gguf.GGUFReader(a.gguf)
    field = lambda k: r.fields[k].parts[r.fields[k].data[0]][0]
    n_head, n_kv = int(field("llama.attention.head_count")), int(field("llama.attention.head_count_kv"))
    tensors = {t.name: t for t in r.tensors}
    cases = [  # (gguf name, HF name, heads to un-permute or 0, rows to compare)
        ("token_embd.weight", "model.embed_tokens.weight", 0, (1000, 1040)),
        ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight", n_head, (0, 576)),
        ("blk.7.attn_k.weight", "model.layers.7.self_attn.k_proj.weight", n_kv, (0, 192)),
        ("blk.29.ffn_down.weight", "model.layers.29.mlp.down_proj.weight", 0, (100, 140)),
        ("blk.3.attn_norm.weight", "model.layers.3.input_layernorm.weight", 0, (0, 1)),
        ("output_norm.weight", "model.norm.weight", 0, (0, 1)),
    ]
    bad = 0
    for gname, hname, heads, (r0, r1) in cases:
        t = tensors[gname]
        ref = dequantize(t.data, t.tensor_type).astype(np.float32)
        ref = ref.reshape(-1, int(t.shape[0]))  # rows of ne[0]
        if heads:
            ref = unpermute(ref, heads)
        out = json.loads(subprocess.run([a.tool, a.gguf, hname, str(r0), str(r1)], check=True,
                                        capture_output=True).stdout)
        got = np.array(out["values"], dtype=np.float32).reshape(r1 - r0, -1)
        diff = float(np.max(np.abs(got - ref[r0:r1])))
        ok = diff <= 1e-6 * max(1.0, float(np.max(np.abs(ref[r0:r1]))))
        print(f"{hname:45s} {out['dtype']:5s} rows [{r0},{r1}) max |trellis - gguf-py| = {diff:.3g} "
              f"{'ok' if ok else 'DIFFERENT'}")
        bad += not ok
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
