"""PyTorch FSDP2 reference for shardrun's benchmark: the same transformer (PyTorch's FSDP2
example model, causal attention), the same synthetic data, dtype and optimizer as
`shardrun-worker`, wrapped with `fully_shard` per block plus the root, on gloo.

    torchrun --nproc_per_node 2 bench/fsdp2_reference.py --dim 256 --n-layers 8 ...

Prints one JSON line (rank 0) with the median step time, tokens/s and each rank's peak RSS.
"""

import argparse
import json
import math
import os
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

# The model definition is shared with the checkpoint cross-check in tests/python.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from shardrun_model import Transformer  # noqa: E402

MASK = (1 << 64) - 1


def splitmix64(x: int) -> int:
    """The worker's data hash (worker/src/data.rs), so both sides train on the same tokens."""
    z = (x + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def samples(seed: int, first: int, count: int, seq_len: int, vocab: int):
    """Arithmetic token sequences with a random start and stride per sample (data.rs)."""
    rows = []
    for i in range(first, first + count):
        h = splitmix64(seed ^ splitmix64(i))
        start = h % vocab
        stride = 1 + splitmix64(h) % 7
        rows.append([(start + j * stride) % vocab for j in range(seq_len + 1)])
    t = torch.tensor(rows, dtype=torch.long)
    return t[:, :-1].contiguous(), t[:, 1:].contiguous()


def lm_loss(model, tokens, targets):
    logits = model(tokens)
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--n-layers", type=int, default=8)
    p.add_argument("--n-heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=8, help="per rank")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2, help="steps left out of the timing")
    p.add_argument("--param-dtype", choices=["f32", "bf16"], default="f32")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: NCCL, one GPU per rank (LOCAL_RANK)")
    args = p.parse_args()

    cuda = args.device == "cuda"
    torch.set_num_threads(1)
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda") if cuda else torch.device("cpu")
    torch.manual_seed(args.seed)
    model = Transformer(args.vocab, args.dim, args.n_layers, args.n_heads, args.seq).to(device)
    mp = None
    if args.param_dtype == "bf16":
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    kwargs = {"mp_policy": mp} if mp else {}
    for layer in model.layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    # On GPUs the fused AdamW, PyTorch's fastest (shardrun's engine uses the same kernel).
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, fused=True if cuda else None)

    if cuda:
        # The peak is the training's: the unsharded model built above on every GPU is gone
        # (a FSDP2 user with a large model builds it on the meta device), and shardrun
        # never holds it.
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for step in range(args.steps):
        first = step * args.batch * world + rank * args.batch
        # Made before the clock starts: in pure Python it costs more than a data loader's
        # prefetched batch would. Copying it to the device is part of the step, as in
        # shardrun's.
        tokens, targets = samples(args.seed, first, args.batch, args.seq, args.vocab)
        dist.barrier()
        start = time.perf_counter()
        tokens, targets = tokens.to(device), targets.to(device)
        loss = lm_loss(model, tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        if cuda:
            torch.cuda.synchronize()
        dist.barrier()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())

    peak = torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    reserved = torch.cuda.max_memory_reserved() if cuda else 0
    rss = torch.tensor([peak, reserved], dtype=torch.float64, device=device)
    all_rss = [torch.zeros_like(rss) for _ in range(world)]
    dist.all_gather(all_rss, rss)
    if rank == 0:
        step_time = statistics.median(times[args.warmup:])
        print(json.dumps({
            "impl": "pytorch-fsdp2",
            "step_time_s": step_time,
            "tokens_per_s": args.batch * world * args.seq / step_time,
            # Peak RSS on CPU, peak allocated device memory on GPU.
            "peak_rss_bytes": [int(t[0].item()) for t in all_rss],
            # GPU: the allocator's peak reservation (torch.cuda.max_memory_reserved).
            "peak_reserved_bytes": [int(t[1].item()) for t in all_rss],
            "first_loss": losses[0],
            "last_loss": losses[-1],
        }), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
