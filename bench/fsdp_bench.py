"""Side-by-side benchmark: shardrun-worker vs PyTorch FSDP2 on the same model, data, dtype
and machine (2 ranks × 1 thread, CPU, gloo for PyTorch, shardrun's socket ring for us).

Two model families: the FSDP2-example transformer (PyTorch side: bench/fsdp2_reference.py)
and a Llama with grouped-query attention (PyTorch side: transformers' own LlamaForCausalLM,
bench/fsdp2_llama.py). `--load-mb N` also times loading an N MB Hugging Face folder on 2
ranks against from_pretrained + fully_shard.

Run through bench/fsdp.sh, which builds the worker and picks the venv's python. Prints a
markdown table with step time, tokens/s and peak RSS per rank, and the ratios ours/PyTorch
(targets: step time <= 0.8, peak RSS <= 0.8).
"""

import argparse
import json
import os
import re
import resource
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

LLAMA_CONFIGS = [
    # name, vocab, dim, layers, heads, kv heads, ffn, seq, batch/rank, param dtype (26.2 M params)
    ("llama-26M-gqa-fp32", 8192, 512, 8, 8, 2, 1024, 256, 4, "f32"),
    ("llama-26M-gqa-bf16", 8192, 512, 8, 8, 2, 1024, 256, 4, "bf16"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def llama_model(vocab, dim, layers, heads, kv_heads, ffn, seq):
    return {"kind": "llama", "pretrained": None, "architecture": {
        "model_type": "llama", "vocab_size": vocab, "dim": dim, "n_layers": layers, "n_heads": heads,
        "n_kv_heads": kv_heads, "head_dim": dim // heads, "ffn_dim": ffn, "norm_eps": 1e-6,
        "rope": {"theta": 10000.0, "scaling": {"rope_type": "default"}}, "max_position_embeddings": seq,
        "tie_embeddings": False, "qkv_bias": False, "o_proj_bias": False, "mlp_bias": False,
        "initializer_range": 0.02, "pad_token_id": None, "sliding_window": None}}


def train_config(vocab, dim, layers, heads, seq, batch, dtype, steps, world, model=None):
    # The transformer's reference decays every parameter; the Llama one leaves biases and
    # norms out, as the worker's default does.
    no_decay = ["bias", "norm"] if model else []
    return {
        "name": "bench",
        "model": model or {"kind": "transformer", "vocab_size": vocab, "dim": dim, "n_layers": layers, "n_heads": heads, "max_seq_len": seq},
        "data": {"kind": "synthetic", "seq_len": seq},
        "steps": steps,
        "seed": 0,
        "batch": {"total_batch_size": batch * world, "batch_size_per_device": batch, "world_size": world, "grad_accum_steps": 1},
        "optimizer": {"lr": 3e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1, "grad_clip": 1.0,
                      "no_weight_decay": no_decay},
        "schedule": {"warmup_steps": 0, "decay": "constant", "min_lr_ratio": 1.0},
        "fsdp": {
            "strategy": "FULL_SHARD",
            "wrap": {"kind": "block"},
            "mixed_precision": {"param_dtype": dtype, "reduce_dtype": "f32", "buffer_dtype": "f32"},
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


def children_cpu_s():
    """CPU seconds (user + system) of every waited-for descendant so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_ours(worker, cfg, steps, warmup, world, tmp):
    path = os.path.join(tmp, "config.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    port = free_port()
    procs, metric_files = [], []
    cpu_before = children_cpu_s()
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
    cpu = children_cpu_s() - cpu_before
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
        "cpu_s": cpu,
    }


def run_pytorch(python, name, script, script_args):
    cmd = [python, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           os.path.join(HERE, script)] + [str(a) for a in script_args]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # gloo on this machine now and then aborts a rank ("terminate called without an active
    # exception"), sometimes after the result was printed: keep a printed result, else retry.
    for attempt in range(3):
        cpu_before = children_cpu_s()
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
        if lines:
            return dict(json.loads(lines[-1]), cpu_s=children_cpu_s() - cpu_before)
        print(f"PyTorch FSDP2 reference failed on {name} (attempt {attempt + 1}):\n{out.stderr[-2000:]}",
              file=sys.stderr, flush=True)
    sys.exit(f"PyTorch FSDP2 reference failed 3 times on {name}")


def compare(args, name, cfg, script, script_args, world, tmp):
    """Alternate ours and PyTorch's `--rounds` times; keep each side's best median step time.
    Then each side once more with only `--warmup` steps: the CPU seconds the other steps cost
    (both processes of a side, all their threads; start-up cancels out) are a per-step figure
    that other load on the machine does not change, unlike wall-clock step time."""
    ours_runs, theirs_runs = [], []
    for _ in range(args.rounds):
        ours_runs.append(run_ours(args.worker, cfg, args.steps, args.warmup, world, tmp))
        theirs_runs.append(run_pytorch(sys.executable, name, script, script_args))
    ours = min(ours_runs, key=lambda r: r["step_time_s"])
    theirs = min(theirs_runs, key=lambda r: r["step_time_s"])
    short = args.warmup
    short_cfg = dict(cfg, steps=short)
    short_args = [a if prev != "--steps" else short for prev, a in zip([None] + script_args[:-1], script_args)]
    short_args = [0 if prev == "--warmup" else a for prev, a in zip([None] + short_args[:-1], short_args)]
    ours_short = run_ours(args.worker, short_cfg, short, 0, world, tmp)
    theirs_short = run_pytorch(sys.executable, name, script, short_args)
    full_cpu = lambda runs: statistics.median(r["cpu_s"] for r in runs)
    timed = (args.steps - args.warmup) * world
    ours["cpu_s_per_step_rank"] = (full_cpu(ours_runs) - ours_short["cpu_s"]) / timed
    theirs["cpu_s_per_step_rank"] = (full_cpu(theirs_runs) - theirs_short["cpu_s"]) / timed
    print(f"{name}: ours {json.dumps(ours)}\n{name}: pytorch {json.dumps(theirs)}", file=sys.stderr, flush=True)
    return name, ours, theirs


LOAD_LINE = re.compile(r"shards of (\d+) parameters loaded from .* in ([0-9.]+) s; resident memory ([0-9.]+) MiB before, peak ([0-9.]+) MiB while loading")


def load_benchmark(args, tmp):
    """A ~`--load-mb` fp32 Llama folder made by transformers, loaded on 2 ranks: the worker's
    shard-by-shard load vs from_pretrained + fully_shard (each rank reads the whole model).
    Alternated `--rounds` times after one warm-up read of each, so both find the files in
    the page cache."""
    folder = os.path.join(tmp, "load-folder")
    hf_models = os.path.join(HERE, "..", "tests", "python", "hf_models.py")
    made = subprocess.run([sys.executable, hf_models, "make-big", "--out", folder, "--mb", str(args.load_mb)],
                          capture_output=True, text=True, check=True)
    info = json.loads(made.stdout.strip().splitlines()[-1])
    world = 2
    model = {"kind": "llama", "pretrained": os.path.abspath(folder), "architecture": None}
    with open(os.path.join(folder, "config.json")) as f:
        c = json.load(f)
    model["architecture"] = llama_model(c["vocab_size"], c["hidden_size"], c["num_hidden_layers"],
                                        c["num_attention_heads"], c["num_key_value_heads"],
                                        c["intermediate_size"], 8)["architecture"]
    model["architecture"]["max_position_embeddings"] = c["max_position_embeddings"]
    model["architecture"]["norm_eps"] = c["rms_norm_eps"]
    cfg = train_config(c["vocab_size"], 0, 0, 0, 8, 1, "f32", 1, world, model=model)
    path = os.path.join(tmp, "load.json")
    with open(path, "w") as f:
        json.dump(cfg, f)

    def ours():
        port = free_port()
        procs = []
        for rank in range(world):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
            env.pop("SHARDRUN_CONTROLLER", None)
            procs.append(subprocess.Popen([args.worker, "--config", path], env=env, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE, text=True))
        result = {"seconds": 0.0, "peak_rss_bytes": [], "added_bytes": []}
        for rank, p in enumerate(procs):
            _, err = p.communicate()
            m = LOAD_LINE.search(err)
            if p.returncode != 0 or not m:
                sys.exit(f"shardrun-worker rank {rank} failed to load:\n{err}")
            result["seconds"] = max(result["seconds"], float(m.group(2)))
            result["peak_rss_bytes"].append(float(m.group(4)) * 2**20)
            result["added_bytes"].append((float(m.group(4)) - float(m.group(3))) * 2**20)
        return result

    def theirs():
        return run_pytorch(sys.executable, "load", os.path.join("..", "tests", "python", "hf_models.py"),
                           ["load", "--model", folder])

    ours(), theirs()  # page cache warm for both
    ours_runs, theirs_runs = [], []
    for _ in range(args.rounds):
        ours_runs.append(ours())
        theirs_runs.append(theirs())
    best = lambda runs: min(runs, key=lambda r: r["seconds"])
    return [(info, best(ours_runs), best(theirs_runs))]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--worker", required=True)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--only", help="run only configs whose name contains this")
    p.add_argument("--load-mb", type=float, default=0,
                   help="also time loading a Hugging Face folder of about this size on 2 ranks")
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
            script_args = ["--vocab", vocab, "--dim", dim, "--n-layers", layers, "--n-heads", heads, "--seq", seq,
                           "--batch", batch, "--steps", args.steps, "--warmup", args.warmup, "--param-dtype", dtype]
            rows.append(compare(args, name, cfg, "fsdp2_reference.py", script_args, world, tmp))
        for name, vocab, dim, layers, heads, kv, ffn, seq, batch, dtype in LLAMA_CONFIGS:
            if args.only and args.only not in name:
                continue
            model = llama_model(vocab, dim, layers, heads, kv, ffn, seq)
            cfg = train_config(vocab, dim, layers, heads, seq, batch, dtype, args.steps, world, model=model)
            script_args = ["--vocab", vocab, "--dim", dim, "--n-layers", layers, "--n-heads", heads,
                           "--n-kv-heads", kv, "--ffn-dim", ffn, "--seq", seq, "--batch", batch,
                           "--steps", args.steps, "--warmup", args.warmup, "--param-dtype", dtype]
            rows.append(compare(args, name, cfg, "fsdp2_llama.py", script_args, world, tmp))
        loads = load_benchmark(args, tmp) if args.load_mb else []
    mib = lambda b: max(b) / 2**20
    print(f"machine: {os.cpu_count()} CPUs; 2 ranks x 1 thread")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    print("| config | shardrun step | FSDP2 step | step ratio | CPU s/step/rank (ours / FSDP2) | CPU ratio | shardrun tok/s | FSDP2 tok/s | shardrun peak RSS/rank | FSDP2 peak RSS/rank | RSS ratio | loss first→last (ours / FSDP2) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, o, t in rows:
        oc, tc = o.get("cpu_s_per_step_rank", float("nan")), t.get("cpu_s_per_step_rank", float("nan"))
        print(f"| {name} | {o['step_time_s']:.3f} s | {t['step_time_s']:.3f} s | {o['step_time_s'] / t['step_time_s']:.2f} "
              f"| {oc:.3f} / {tc:.3f} | {oc / tc:.2f} "
              f"| {o['tokens_per_s']:,.0f} | {t['tokens_per_s']:,.0f} | {mib(o['peak_rss_bytes']):,.0f} MiB "
              f"| {mib(t['peak_rss_bytes']):,.0f} MiB | {mib(o['peak_rss_bytes']) / mib(t['peak_rss_bytes']):.2f} "
              f"| {o['first_loss']:.3f}→{o['last_loss']:.3f} / {t['first_loss']:.3f}→{t['last_loss']:.3f} |")
    for info, o, t in loads:
        print(f"\nLoading a {info['bytes'] / 1e6:,.0f} MB fp32 Llama folder ({info['params'] / 1e6:.0f} M parameters) on 2 ranks:\n")
        print("| | shardrun (own shards, mapped ranges) | from_pretrained + fully_shard | ratio |")
        print("| --- | --- | --- | --- |")
        print(f"| time | {o['seconds']:.2f} s | {t['seconds']:.2f} s | {o['seconds'] / t['seconds']:.2f} |")
        print(f"| peak RSS per rank | {mib(o['peak_rss_bytes']):,.0f} MiB | {mib(t['peak_rss_bytes']):,.0f} MiB "
              f"| {mib(o['peak_rss_bytes']) / mib(t['peak_rss_bytes']):.2f} |")
        print(f"| memory loading added per rank | {mib(o['added_bytes']):,.0f} MiB | | |")


if __name__ == "__main__":
    main()

