"""PyTorch gloo reference for `bench/collectives.sh`: all-gather, reduce-scatter and
all-reduce bandwidth with the same sizes, timing and JSON lines as `shardrun-collective-bench
bench`. Launched as one process per rank with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set."""

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    elems = (args.mib << 20) // dtype.itemsize // n * n
    full = torch.ones(elems, dtype=dtype)
    part = torch.ones(elems // n, dtype=dtype)
    ops = {
        "all_gather": lambda: dist.all_gather_into_tensor(full, part),
        "reduce_scatter": lambda: dist.reduce_scatter_tensor(part, full),
        "all_reduce": lambda: dist.all_reduce(full),
    }
    for name, op in ops.items():
        times = []
        for i in range(args.warmup + args.iters):
            dist.barrier()
            t0 = time.perf_counter()
            op()
            if i >= args.warmup:
                times.append(time.perf_counter() - t0)
        times.sort()
        median = times[len(times) // 2]
        size = elems * dtype.itemsize
        algbw = size / median / 1e9
        factor = (2.0 if name == "all_reduce" else 1.0) * (n - 1) / n
        if rank == 0:
            print(json.dumps({
                "backend": "gloo", "device": "Cpu", "op": name, "world_size": n,
                "dtype": args.dtype, "bytes": size, "iters": args.iters,
                "median_s": round(median, 6), "min_s": round(times[0], 6),
                "algbw_gbps": round(algbw, 3), "busbw_gbps": round(algbw * factor, 3),
                "torch": torch.__version__,
            }), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
