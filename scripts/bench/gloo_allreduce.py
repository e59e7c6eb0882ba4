#!/usr/bin/python3
"""torch.distributed gloo all-reduce, the peer `trellis bench comm` measures in the same run.

Runs RANKS processes on this host (torch.multiprocessing, TCP rendezvous on 127.0.0.1) and
times dist.all_reduce(SUM) of float32 tensors with the same method as trellis: per size,
REPS blocks of ITERS back-to-back all-reduces after a barrier; a block's time is the
slowest rank's; the reported time is the median block time / ITERS. Each result is checked
against the expected sum. Prints one JSON object on stdout.

usage: /usr/bin/python3 gloo_allreduce.py --ranks 4 --sizes 4096,65536 [--iters 20] [--reps 11]
"""
import argparse
import json
import os
import socket
import statistics
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, args, port, out_path):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.ranks)
    points = []
    for nbytes in args.sizes:
        n = max(1, nbytes // 4)
        t = torch.full((n,), float(rank + 1), dtype=torch.float32)
        want = float(args.ranks * (args.ranks + 1) // 2)
        iters = args.iters if nbytes < (1 << 20) else max(3, args.iters // 4)
        for _ in range(2):
            t.fill_(float(rank + 1))
            dist.all_reduce(t)
        ok = bool(torch.all(t == want))
        blocks = []
        for _ in range(args.reps):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(t)
            dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)
            blocks.append(dt.item() / iters)
        points.append({"bytes": n * 4, "seconds": statistics.median(blocks), "verified": ok})
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"peer": "gloo", "torch": torch.__version__, "ranks": args.ranks, "points": points}, f)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, required=True)
    p.add_argument("--sizes", required=True, help="comma-separated byte counts")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--reps", type=int, default=11)
    args = p.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",") if s]
    import tempfile
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "gloo.json")
        mp.spawn(worker, args=(args, free_port(), out), nprocs=args.ranks, join=True)
        with open(out) as f:
            sys.stdout.write(f.read() + "\n")


if __name__ == "__main__":
    main()
