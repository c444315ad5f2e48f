"""Peak memory during training as the layer count grows (4, 8, 16, 32 layers), FULL_SHARD
with activation checkpointing on 2 CPU ranks × 1 thread: a model whose gradients dominate its
activations (dim 512, vocab 1024, one sequence of 128 tokens per rank).

What it shows: the peak beyond the state at rest (fp32 parameter, gradient and AdamW shards,
which grow with the model divided by the ranks) stays a few units' worth as the model grows,
instead of growing with the whole model's unsharded gradient. `--compare-worker` runs
another build of the worker (e.g. one from before bounded gradient buffers) on the same
configs, and `--shardrun` adds the plan's predicted peak.

Peak memory per rank is the larger rank's `VmHWM` from the metrics records, minus the peak of
the same job with a tiny model (the process's baseline: libtorch, threads, sockets). Run
through bench/memory.sh.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile

LAYERS = [4, 8, 16, 32]
DIM, VOCAB, HEADS, SEQ, BATCH = 512, 1024, 8, 128, 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model(layers, dim=DIM, vocab=VOCAB, heads=HEADS):
    return {"kind": "transformer", "vocab_size": vocab, "dim": dim, "n_layers": layers,
            "n_heads": heads, "max_seq_len": SEQ}


def train_config(m, steps, world):
    return {
        "name": "memory",
        "model": m,
        "data": {"kind": "synthetic", "seq_len": SEQ},
        "steps": steps,
        "seed": 0,
        "batch": {"total_batch_size": BATCH * world, "batch_size_per_device": BATCH, "world_size": world,
                  "grad_accum_steps": 1},
        "optimizer": {"lr": 3e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1, "grad_clip": 1.0},
        "schedule": {"warmup_steps": 0, "decay": "constant", "min_lr_ratio": 1.0},
        "fsdp": {
            "strategy": "FULL_SHARD",
            "wrap": {"kind": "block"},
            "mixed_precision": {"param_dtype": "f32", "reduce_dtype": "f32", "buffer_dtype": "f32"},
            "activation_checkpointing": True,
            "prefetch": True,
            "max_gathers_in_flight": 2,
            "shard_group_size": None,
        },
        "checkpoint": {"dir": None, "interval_steps": None, "interval_minutes": None, "keep": 1,
                       "format": "sharded", "resume": False, "from": None},
        "device": "cpu",
        "threads_per_rank": 1,
        "log_every": 1,
    }


def run(worker, cfg, world, tmp):
    """Peak memory and model state per rank (the larger rank's) of one run."""
    path = os.path.join(tmp, "config.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    port = free_port()
    procs, metric_files = [], []
    for rank in range(world):
        mf = os.path.join(tmp, f"metrics{rank}.jsonl")
        if os.path.exists(mf):
            os.remove(mf)
        metric_files.append(mf)
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        env.pop("SHARDRUN_CONTROLLER", None)
        procs.append(subprocess.Popen([worker, "--config", path, "--metrics-file", mf], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    for rank, p in enumerate(procs):
        _, err = p.communicate()
        if p.returncode != 0:
            sys.exit(f"{worker} rank {rank} failed:\n{err}")
    records = [[json.loads(l) for l in open(mf)] for mf in metric_files]
    return (max(max(r["peak_memory_bytes"] for r in rank) for rank in records),
            max(max(r["model_state_bytes"] for r in rank) for rank in records))


def planned_peak(shardrun, m, world, tmp):
    spec = os.path.join(tmp, "job.yaml")
    with open(spec, "w") as f:
        f.write(f"name: memory\nresources: {{ tasks_per_node: {world} }}\ntraining:\n"
                f"  model: {json.dumps(m)}\n  data: {{ kind: synthetic, seq_len: {SEQ} }}\n  steps: 2\n"
                f"  total_batch_size: {BATCH * world}\n  batch_size_per_device: {BATCH}\n"
                f"  fsdp: {{ strategy: FULL_SHARD, activation_checkpointing: true }}\n")
    out = subprocess.run([shardrun, "plan", "--json", spec], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["memory"]["chosen"]["peak"]


def params(m):
    d, v, l = m["dim"], m["vocab_size"], m["n_layers"]
    block = 4 * d * d + (d * 4 * d + 4 * d + 4 * d * d + d) + 4 * d
    return v * d + m["max_seq_len"] * d + l * block + 2 * d + d * v


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--worker", required=True)
    p.add_argument("--compare-worker", help="another shardrun-worker build to run on the same configs")
    p.add_argument("--shardrun", help="the shardrun binary, for the plan's predicted peak")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--layers", type=int, nargs="*", default=LAYERS)
    args = p.parse_args()
    world = 2
    mib = lambda b: b / 2**20
    workers = [("this build", args.worker)] + ([("compared", args.compare_worker)] if args.compare_worker else [])
    with tempfile.TemporaryDirectory() as tmp:
        tiny = model(1, dim=8, vocab=16, heads=2)
        baseline = {name: run(w, train_config(tiny, args.steps, world), world, tmp)[0] for name, w in workers}
        print(f"baseline peak RSS/rank: {', '.join(f'{n} {mib(b):.0f} MiB' for n, b in baseline.items())}",
              file=sys.stderr, flush=True)
        header = ["layers", "parameters", "whole model's fp32 gradient", "state at rest/rank"]
        for name, _ in workers:
            header += [f"peak/rank ({name})", f"peak − state ({name})"]
        if args.shardrun:
            header.append("planned peak/rank")
        print("| " + " | ".join(header) + " |")
        print("|" + " --- |" * len(header), flush=True)
        for layers in args.layers:
            m = model(layers)
            n = params(m)
            row = [str(layers), f"{n / 1e6:.1f} M", f"{mib(4 * n):.0f} MiB"]
            cells = []
            state = None
            for name, w in workers:
                peak, state_bytes = run(w, train_config(m, args.steps, world), world, tmp)
                state = state if state is not None else state_bytes
                peak -= baseline[name]
                cells += [f"{mib(peak):.0f} MiB", f"{mib(peak - state_bytes):.0f} MiB"]
                print(f"{layers} layers, {name}: peak {mib(peak):.1f} MiB above baseline, state {mib(state_bytes):.1f} MiB",
                      file=sys.stderr, flush=True)
            row.append(f"{mib(state):.0f} MiB")
            row += cells
            if args.shardrun:
                row.append(f"{mib(planned_peak(args.shardrun, m, world, tmp)):.0f} MiB")
            print("| " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
