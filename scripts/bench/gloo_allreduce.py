#!/usr/bin/python3
"""torch.distributed gloo all-reduce, the peer `trellis bench comm` measures in the same run.

Runs RANKS processes on this host (torch.multiprocessing, TCP rendezvous on 127.0.0.1), or,
with --rank and --master, one rank of a job spread over hosts (every host runs its ranks'
commands; `trellis bench comm` does this from each MPI rank), and
times dist.all_reduce(SUM) of float32 tensors with the same method as trellis: per size,
REPS blocks of ITERS back-to-back all-reduces after a barrier; a block's time is the
slowest rank's; the reported time is the median block time / ITERS. Each result is checked
against the expected sum. Prints one JSON object on stdout.

usage: /usr/bin/python3 gloo_allreduce.py --ranks 4 --sizes 4096,65536 [--iters 20] [--reps 11]
       /usr/bin/python3 gloo_allreduce.py --ranks 4 --rank R --master ADDR:PORT --sizes ...
         (rank 0 prints the JSON; gloo binds to the interface that reaches ADDR)
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


def interface_towards(addr):
    """The name of the interface this host reaches `addr` through (gloo binds to it)."""
    import subprocess

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((addr, 9))  # no packet is sent: this only picks the route
        local = s.getsockname()[0]
    for line in subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout.splitlines():
        words = line.split()
        if len(words) > 3 and words[3].split("/")[0] == local:
            return words[1]
    raise SystemExit(f"gloo_allreduce.py: no interface holds {local}, the address that reaches {addr}")


def worker(rank, args, master, out_path):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{master}", rank=rank, world_size=args.ranks)
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
        result = {"peer": "gloo", "torch": torch.__version__, "ranks": args.ranks, "points": points}
        if out_path is None:
            sys.stdout.write(json.dumps(result) + "\n")
        else:
            with open(out_path, "w") as f:
                json.dump(result, f)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, required=True)
    p.add_argument("--sizes", required=True, help="comma-separated byte counts")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--reps", type=int, default=11)
    p.add_argument("--rank", type=int, help="this process's rank of a job across hosts (needs --master)")
    p.add_argument("--master", help="ADDR:PORT of rank 0's rendezvous, reachable from every rank")
    args = p.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",") if s]
    if (args.rank is None) != (args.master is None):
        p.error("--rank and --master go together")
    if args.rank is not None:
        if not 0 <= args.rank < args.ranks:
            p.error(f"--rank {args.rank} is not in [0, {args.ranks})")
        addr = args.master.rsplit(":", 1)[0]
        os.environ.setdefault("GLOO_SOCKET_IFNAME", interface_towards(addr))
        worker(args.rank, args, args.master, None)
        return
    import tempfile
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "gloo.json")
        mp.spawn(worker, args=(args, f"127.0.0.1:{free_port()}", out), nprocs=args.ranks, join=True)
        with open(out) as f:
            sys.stdout.write(f.read() + "\n")


if __name__ == "__main__":
    main()
