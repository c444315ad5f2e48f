"""Side-by-side benchmark: shardrun-worker vs PyTorch FSDP2 on the same model, data, dtype
and machine (2 ranks × 1 thread, CPU, gloo for PyTorch, shardrun's socket ring for us).

Run through bench/fsdp.sh, which builds the worker and picks the venv's python. Prints a
markdown table with step time, tokens/s and peak RSS per rank, and the ratios ours/PyTorch
(targets: step time <= 0.9, peak RSS <= 0.8).
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

CONFIGS = [
    # name, vocab, dim, layers, heads, seq, batch/rank, param dtype
    ("dim256-L8-fp32", 8192, 256, 8, 8, 256, 8, "f32"),
    ("dim256-L8-bf16", 8192, 256, 8, 8, 256, 8, "bf16"),
    ("dim64-L4-fp32", 1024, 64, 4, 4, 64, 8, "f32"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_config(vocab, dim, layers, heads, seq, batch, dtype, steps, world):
    return {
        "name": "bench",
        "model": {"kind": "transformer", "vocab_size": vocab, "dim": dim, "n_layers": layers, "n_heads": heads, "max_seq_len": seq},
        "data": {"kind": "synthetic", "seq_len": seq},
        "steps": steps,
        "seed": 0,
        "batch": {"total_batch_size": batch * world, "batch_size_per_device": batch, "world_size": world, "grad_accum_steps": 1},
        "optimizer": {"lr": 3e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1, "grad_clip": 1.0},
        "schedule": {"warmup_steps": 0, "decay": "constant", "min_lr_ratio": 1.0},
        "fsdp": {
            "strategy": "FULL_SHARD",
            "wrap": {"kind": "block"},
            "mixed_precision": {"param_dtype": dtype, "reduce_dtype": "f32", "buffer_dtype": dtype},
            "activation_checkpointing": False,
            "prefetch": True,
            "max_gathers_in_flight": 2,
            "shard_group_size": None,
        },
        "checkpoint": {"dir": None, "interval_steps": None, "interval_minutes": None, "keep": 1, "format": "sharded", "resume": False, "from": None},
        "device": "cpu",
        "threads_per_rank": 1,
        "log_every": 1,
    }


def run_ours(worker, cfg, steps, warmup, world, tmp):
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
            sys.exit(f"shardrun-worker rank {rank} failed:\n{err}")
    records = [[json.loads(l) for l in open(mf)] for mf in metric_files]
    times = [r["step_time_s"] for r in records[0]][warmup:]
    step_time = statistics.median(times)
    seq, batch = cfg["data"]["seq_len"], cfg["batch"]["total_batch_size"]
    return {
        "step_time_s": step_time,
        "tokens_per_s": batch * seq / step_time,
        "peak_rss_bytes": [r[-1]["peak_memory_bytes"] for r in records],
        "first_loss": records[0][0]["loss"],
        "last_loss": records[0][-1]["loss"],
    }


def run_pytorch(python, name, vocab, dim, layers, heads, seq, batch, dtype, steps, warmup):
    cmd = [python, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           os.path.join(HERE, "fsdp2_reference.py"), "--vocab", str(vocab), "--dim", str(dim),
           "--n-layers", str(layers), "--n-heads", str(heads), "--seq", str(seq), "--batch", str(batch),
           "--steps", str(steps), "--warmup", str(warmup), "--param-dtype", dtype]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # gloo on this machine now and then aborts a rank ("terminate called without an active
    # exception"), sometimes after the result was printed: keep a printed result, else retry.
    for attempt in range(3):
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
        if lines:
            return json.loads(lines[-1])
        print(f"PyTorch FSDP2 reference failed on {name} (attempt {attempt + 1}):\n{out.stderr[-2000:]}",
              file=sys.stderr, flush=True)
    sys.exit(f"PyTorch FSDP2 reference failed 3 times on {name}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--worker", required=True)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--only", help="run only configs whose name contains this")
    p.add_argument("--rounds", type=int, default=2,
                   help="alternate ours/PyTorch this many times per config and keep each side's best "
                        "median (evens out load from other processes on a shared machine)")
    args = p.parse_args()
    world = 2
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, vocab, dim, layers, heads, seq, batch, dtype in CONFIGS:
            if args.only and args.only not in name:
                continue
            cfg = train_config(vocab, dim, layers, heads, seq, batch, dtype, args.steps, world)
            ours_runs, theirs_runs = [], []
            for _ in range(args.rounds):
                ours_runs.append(run_ours(args.worker, cfg, args.steps, args.warmup, world, tmp))
                theirs_runs.append(run_pytorch(sys.executable, name, vocab, dim, layers, heads, seq, batch, dtype,
                                               args.steps, args.warmup))
            ours = min(ours_runs, key=lambda r: r["step_time_s"])
            theirs = min(theirs_runs, key=lambda r: r["step_time_s"])
            rows.append((name, ours, theirs))
            print(f"{name}: ours {json.dumps(ours)}\n{name}: pytorch {json.dumps(theirs)}", file=sys.stderr, flush=True)
    mib = lambda b: max(b) / 2**20
    print("| config | shardrun step | FSDP2 step | step ratio | shardrun tok/s | FSDP2 tok/s | shardrun peak RSS/rank | FSDP2 peak RSS/rank | RSS ratio | loss first→last (ours / FSDP2) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, o, t in rows:
        print(f"| {name} | {o['step_time_s']:.3f} s | {t['step_time_s']:.3f} s | {o['step_time_s'] / t['step_time_s']:.2f} "
              f"| {o['tokens_per_s']:,.0f} | {t['tokens_per_s']:,.0f} | {mib(o['peak_rss_bytes']):,.0f} MiB "
              f"| {mib(t['peak_rss_bytes']):,.0f} MiB | {mib(o['peak_rss_bytes']) / mib(t['peak_rss_bytes']):.2f} "
              f"| {o['first_loss']:.3f}→{o['last_loss']:.3f} / {t['first_loss']:.3f}→{t['last_loss']:.3f} |")


if __name__ == "__main__":
    main()
