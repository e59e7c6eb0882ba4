#!/usr/bin/python3
"""Plain-PyTorch reference for trellis's Llama-family model (PyTorch 1.13 CPU, /usr/bin/python3).

It reads the same safetensors checkpoint itself (8-byte little-endian header length, JSON
header, raw bytes; single file or sharded via model.safetensors.index.json; no packages
beyond torch) and implements the forward in eager PyTorch: embedding, RMSNorm, RoPE with
Llama 3 rope_scaling (HF's rotate_half layout), grouped-query attention with a KV cache,
SwiGLU MLP, final norm, LM head (tied or untied), Qwen2 q/k/v biases.

Subcommands
  check  make tiny checkpoints with `trellis make-model`, run `trellis model-logits` at t=1
         and (with --mpirun) t=2, and compare its logits with this forward for the prefill
         of a batch of prompts of different lengths (every position) and for several
         teacher-forced decode steps. Exit 0: all match; 1: a mismatch; 77: skipped (no
         torch; exit 1 instead under TRELLIS_REQUIRE_PEERS=1).
  bench  decode tokens/s at batch 1 of PyTorch eager on a checkpoint (one JSON line), on the
         CPU or (--device cuda) a GPU, with this file's forward (--impl reference) or with
         transformers' AutoModelForCausalLM (--impl hf, where transformers is installed, e.g.
         the GPU machine); `trellis bench model` runs it in the same run as its own measurement.

Tolerances (max |trellis - torch| / max(1, max |torch|) over all logits of a case):
  F32 checkpoint, f32 weights:   1e-4   (both compute in f32; only summation order differs)
  BF16 checkpoint, bf16 weights: 1e-4   (trellis streams bf16 weights but converts them to
                                          f32 exactly and computes in f32, as torch does here
                                          after .float(); the stored values are identical)
  F16 checkpoint, f32 weights:   1e-4   (f16 values are converted to f32 exactly)
Measured differences are ~1e-6; the bound leaves room for thread-count-dependent order.
"""
import argparse
import json
import math
import mmap
import os
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import missing, missing_modules  # noqa: E402

_why = missing_modules("torch")
if _why:  # 77: CTest's "skipped"; 1 under TRELLIS_REQUIRE_PEERS=1
    sys.exit(missing(_why))
import torch  # noqa: E402

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
TOLERANCE = {"f32": 1e-4, "bf16": 1e-4, "f16": 1e-4}


# ---- checkpoint ------------------------------------------------------------------------

def read_safetensors_file(path, out):
    """Adds every tensor of one safetensors file to `out` (name -> tensor, stored dtype)."""
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    (n,) = struct.unpack("<Q", mm[:8])
    header = json.loads(mm[8:8 + n])
    base = 8 + n
    for name, e in header.items():
        if name == "__metadata__":
            continue
        begin, end = e["data_offsets"]
        dtype = DTYPES[e["dtype"]]
        count = (end - begin) // torch.tensor([], dtype=dtype).element_size()
        t = torch.frombuffer(mm, dtype=dtype, count=count, offset=base + begin) if count else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(e["shape"])


def read_checkpoint(model_dir):
    tensors = {}
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        for name in files:
            read_safetensors_file(os.path.join(model_dir, name), tensors)
    else:
        read_safetensors_file(os.path.join(model_dir, "model.safetensors"), tensors)
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    return cfg, tensors


# ---- model -----------------------------------------------------------------------------

def rope_inv_freq(cfg, head_dim):
    theta = cfg.get("rope_theta", 10000.0)
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    rs = cfg.get("rope_scaling") or {}
    if rs.get("rope_type", rs.get("type")) == "llama3":
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old / hi) & (wavelen <= old / lo)
        inv = torch.where(medium, smoothed, scaled)
    return inv


class Reference:
    def __init__(self, model_dir, dtype=torch.float32, device="cpu"):
        cfg, t = read_checkpoint(model_dir)
        self.cfg, self.dtype, self.device = cfg, dtype, torch.device(device)
        self.h = cfg["hidden_size"]
        self.nh = cfg["num_attention_heads"]
        self.nkv = cfg.get("num_key_value_heads", self.nh)
        self.hd = cfg.get("head_dim") or self.h // self.nh
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.w = {k: v.to(device=self.device, dtype=dtype) for k, v in t.items()}
        if "lm_head.weight" not in self.w:
            self.w["lm_head.weight"] = self.w["model.embed_tokens.weight"]
        self.inv_freq = rope_inv_freq(cfg, self.hd).to(self.device)

    def rms_norm(self, x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(self.dtype) * w

    def rope(self, x, pos):  # x: [n, heads, hd]
        ang = pos.to(torch.float64)[:, None] * self.inv_freq[None, :]
        cos = torch.cat([ang.cos(), ang.cos()], -1).to(self.dtype)[:, None, :]
        sin = torch.cat([ang.sin(), ang.sin()], -1).to(self.dtype)[:, None, :]
        half = self.hd // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], -1)
        return x * cos + rot * sin

    def linear(self, x, name, bias=False):
        y = x @ self.w[name + ".weight"].t()
        if bias and (name + ".bias") in self.w:
            y = y + self.w[name + ".bias"]
        return y

    def forward(self, tokens, start, cache):
        """Logits [n, vocab] for `tokens` at positions start.., appending to `cache` (a list
        of per-layer [k, v] tensors [kv_heads, len, hd], filled on first use)."""
        n = len(tokens)
        pos = torch.arange(start, start + n, device=self.device)
        x = self.w["model.embed_tokens.weight"][torch.tensor(tokens, device=self.device)]
        for l in range(self.cfg["num_hidden_layers"]):
            p = f"model.layers.{l}."
            h = self.rms_norm(x, self.w[p + "input_layernorm.weight"])
            q = self.rope(self.linear(h, p + "self_attn.q_proj", True).view(n, self.nh, self.hd), pos)
            k = self.rope(self.linear(h, p + "self_attn.k_proj", True).view(n, self.nkv, self.hd), pos)
            v = self.linear(h, p + "self_attn.v_proj", True).view(n, self.nkv, self.hd)
            if len(cache) <= l:
                cache.append([k.transpose(0, 1), v.transpose(0, 1)])
            else:
                cache[l][0] = torch.cat([cache[l][0], k.transpose(0, 1)], 1)
                cache[l][1] = torch.cat([cache[l][1], v.transpose(0, 1)], 1)
            rep = self.nh // self.nkv
            K = cache[l][0].repeat_interleave(rep, 0)  # [nh, len, hd]
            V = cache[l][1].repeat_interleave(rep, 0)
            s = (q.transpose(0, 1) @ K.transpose(1, 2)) / math.sqrt(self.hd)  # [nh, n, len]
            total = K.shape[1]
            mask = torch.arange(total, device=self.device)[None, :] > (pos[:, None])  # key position > query position
            s = s.masked_fill(mask[None], float("-inf"))
            a = torch.softmax(s.float(), -1).to(self.dtype) @ V  # [nh, n, hd]
            x = x + self.linear(a.transpose(0, 1).reshape(n, self.nh * self.hd), p + "self_attn.o_proj")
            h = self.rms_norm(x, self.w[p + "post_attention_layernorm.weight"])
            g = self.linear(h, p + "mlp.gate_proj")
            u = self.linear(h, p + "mlp.up_proj")
            x = x + self.linear(torch.nn.functional.silu(g) * u, p + "mlp.down_proj")
        x = self.rms_norm(x, self.w["model.norm.weight"])
        return (x @ self.w["lm_head.weight"].t()).float()


# ---- check -----------------------------------------------------------------------------

CASES = [  # (preset, stored dtype, trellis --weights)
    ("tiny", "f32", "auto"),
    ("tiny", "bf16", "auto"),
    ("tiny", "f16", "auto"),
    ("tiny-qwen2", "bf16", "auto"),
    ("tiny-qwen2", "f32", "auto"),
]
PROMPTS = [[(i * 37 + 5 + 101 * s) % 300 for i in range(n)] for s, n in enumerate([7, 3, 12])]
DECODE = [[(11 * k + 29 * s + 1) % 300 for k in range(4)] for s in range(3)]


def run(cmd, env=None):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"command failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}")
    return r.stdout


def trellis_logits(args, model_dir, weights, tp, prefix):
    lists = lambda ls: ";".join(",".join(map(str, l)) for l in ls)
    cmd = [args.trellis, "model-logits", "--model", model_dir, "--weights", weights,
           "--prompts", lists(PROMPTS), "--decode", lists(DECODE), "--out", prefix]
    if tp > 1:
        cmd = args.mpirun.split() + ["-np", str(tp)] + cmd
    run(cmd)
    with open(prefix + ".json") as f:
        meta = json.load(f)
    with open(prefix + ".f32", "rb") as f:
        raw = bytearray(f.read())
    return meta, torch.frombuffer(raw, dtype=torch.float32).view(-1, meta["vocab"])


def torch_logits(model_dir):
    ref = Reference(model_dir, torch.float32)
    prefill, caches = [], []
    for p in PROMPTS:
        cache = []
        prefill.append(ref.forward(p, 0, cache))
        caches.append(cache)
    rows = [torch.cat(prefill, 0)]
    for k in range(len(DECODE[0])):
        step = [ref.forward([DECODE[s][k]], len(PROMPTS[s]) + k, caches[s]) for s in range(len(PROMPTS))]
        rows.append(torch.cat(step, 0))
    return torch.cat(rows, 0)


def check(args):
    work = args.workdir or tempfile.mkdtemp(prefix="trellis_torchref_")
    failures = 0
    tps = [1, 2] if args.mpirun else [1]
    print(f"torch {torch.__version__}; cases: {len(CASES)} x t in {tps}; workdir {work}")
    n_prefill = sum(len(p) for p in PROMPTS)
    for preset, dtype, weights in CASES:
        model_dir = os.path.join(work, f"{preset}-{dtype}")
        run([args.trellis, "make-model", "--preset", preset, "--dtype", dtype, "--seed", "5", "--out", model_dir])
        ref = torch_logits(model_dir)
        scale = max(1.0, ref.abs().max().item())
        for tp in tps:
            meta, got = trellis_logits(args, model_dir, weights, tp, os.path.join(work, f"{preset}-{dtype}-t{tp}"))
            if got.shape != ref.shape:
                print(f"FAIL {preset} {dtype} t={tp}: shape {tuple(got.shape)} vs torch {tuple(ref.shape)}")
                failures += 1
                continue
            d_pre = (got[:n_prefill] - ref[:n_prefill]).abs().max().item() / scale
            d_dec = (got[n_prefill:] - ref[n_prefill:]).abs().max().item() / scale
            tol = TOLERANCE[dtype]
            ok = d_pre <= tol and d_dec <= tol and torch.isfinite(got).all().item()
            failures += 0 if ok else 1
            print(f"{'ok  ' if ok else 'FAIL'} {preset:<11} {dtype:<4} weights={meta['weights']:<4} t={tp}: "
                  f"prefill {d_pre:.2e}, decode {d_dec:.2e} (tolerance {tol:.0e}, |logits| <= {scale:.2f})")
    return 1 if failures else 0


# ---- bench -----------------------------------------------------------------------------

class HfPeer:
    """Hugging Face transformers' own Llama (AutoModelForCausalLM) on the same checkpoint: the
    eager PyTorch implementation most users know, with its KV cache (DynamicCache)."""

    def __init__(self, model_dir, dtype, device):
        from transformers import AutoModelForCausalLM  # only this peer needs transformers
        try:
            self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
        except TypeError:  # transformers < 4.56 names it torch_dtype
            self.model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=dtype)
        self.model.to(device).eval()
        self.device = device
        self.past = None

    def forward(self, tokens, start, cache):
        ids = torch.tensor([tokens], device=self.device)
        out = self.model(input_ids=ids, past_key_values=self.past, use_cache=True)
        self.past = out.past_key_values
        return out.logits[0].float()


def bench(args):
    torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"torch_reference: --device cuda, but this torch {torch.__version__} sees no CUDA GPU", file=sys.stderr)
        return 2
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    ref = HfPeer(args.model, dtype, args.device) if args.impl == "hf" else Reference(args.model, dtype, args.device)
    sync()
    load_s = time.perf_counter() - t0
    vocab = json.load(open(os.path.join(args.model, "config.json")))["vocab_size"]
    prompt = [(i * 37 + 5) % vocab for i in range(args.prompt)]
    steps = []
    with torch.no_grad():
        cache = []
        logits = ref.forward(prompt, 0, cache)
        pos = len(prompt)
        for _ in range(args.steps + 1):  # the first step is a warm-up
            nxt = int(logits[-1].argmax())  # (on CUDA this waits for the step before)
            t0 = time.perf_counter()
            logits = ref.forward([nxt], pos, cache)
            sync()
            steps.append(time.perf_counter() - t0)
            pos += 1
    steps = sorted(steps[1:])
    med = steps[len(steps) // 2]
    version = torch.__version__
    if args.impl == "hf":
        import transformers
        version += f", transformers {transformers.__version__}"
    print(json.dumps({"decode_tokens_per_s": 1.0 / med, "median_step_s": med, "steps": args.steps,
                      "dtype": args.dtype, "impl": args.impl, "threads": torch.get_num_threads(),
                      "torch_version": version, "load_s": load_s, "device": args.device,
                      "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None}))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("--trellis", required=True)
    c.add_argument("--mpirun", default="", help="mpirun command and flags for the t=2 runs (omit: t=1 only)")
    c.add_argument("--workdir", default="")
    b = sub.add_parser("bench")
    b.add_argument("--model", required=True)
    b.add_argument("--prompt", type=int, default=16)
    b.add_argument("--steps", type=int, default=8)
    b.add_argument("--threads", type=int, default=os.cpu_count())
    b.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    b.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    b.add_argument("--impl", choices=["reference", "hf"], default="reference",
                   help="reference: this file's eager Llama; hf: transformers' AutoModelForCausalLM")
    a = ap.parse_args()
    return check(a) if a.cmd == "check" else bench(a)


if __name__ == "__main__":
    sys.exit(main())
