"""PyTorch FSDP2 reference for shardrun's Llama benchmark: `transformers`' own
`LlamaForCausalLM` (SDPA attention), `fully_shard` per decoder layer plus the root, on gloo,
with the same synthetic data, dtype policy, AdamW (no weight decay on biases and norms, as
the worker's default) and clipping as `shardrun-worker`; on gloo over CPUs, or NCCL with one
GPU per rank (`--device cuda`, the fused AdamW).

    torchrun --nproc_per_node 2 bench/fsdp2_llama.py --dim 512 --n-layers 8 ...

Prints one JSON line (rank 0) with the median step time, tokens/s and each rank's peak RSS
(on GPUs: peak allocated and reserved device memory).
"""

import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fsdp2_reference import samples  # noqa: E402  (the worker's synthetic tokens)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--n-layers", type=int, default=8)
    p.add_argument("--n-heads", type=int, default=8)
    p.add_argument("--n-kv-heads", type=int, default=2)
    p.add_argument("--ffn-dim", type=int, default=1024)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=4, help="per rank")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
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
    config = LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.dim, intermediate_size=args.ffn_dim,
        num_hidden_layers=args.n_layers, num_attention_heads=args.n_heads,
        num_key_value_heads=args.n_kv_heads, max_position_embeddings=args.seq,
        tie_word_embeddings=False, use_cache=False)
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).to(device)
    mp = None
    if args.param_dtype == "bf16":
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    kwargs = {"mp_policy": mp} if mp else {}
    for layer in model.model.layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    params = dict(model.named_parameters())
    no_decay = [n for n in params if n.endswith("bias") or "norm" in n]
    opt = torch.optim.AdamW(
        [{"params": [p for n, p in params.items() if n not in no_decay], "weight_decay": 0.1},
         {"params": [params[n] for n in no_decay], "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True if cuda else None)

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
        logits = model(input_ids=tokens).logits
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))
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
            "impl": "pytorch-fsdp2-transformers-llama",
            "params": sum(p.numel() for p in model.parameters()),
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
