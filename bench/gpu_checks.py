"""The checks and the table of bench/gpu.sh, on the files shardrun runs leave behind.

    gpu_checks.py trains METRICS                      losses finite, and the last below the first
    gpu_checks.py same A B [--after N] [--rtol R]     two runs' losses agree step by step
    gpu_checks.py exported CHECKPOINT CONFIG METRICS  PyTorch, given the exported weights of step
                                                      N, reproduces the worker's loss at step N+1
    gpu_checks.py hf-exported FOLDER CONFIG METRICS --step N
                                                      the same for a Llama exported as a Hugging
                                                      Face folder, with `transformers`
    gpu_checks.py table OUT [NAME]                    shardrun vs PyTorch FSDP2 on the benchmark
                                                      (OUT/bench[-NAME], OUT/pytorch[-NAME].json)
    gpu_checks.py documents DIR COUNT VOCAB MAX_LEN   COUNT documents of random ids (u16 token
                                                      files, 32..MAX_LEN ids each) into DIR
    gpu_checks.py packed-spec DIR MASK < SPEC         SPEC (a benchmark job on synthetic data)
                                                      on DIR's documents, packed whole, with
                                                      document_mask MASK
    gpu_checks.py packed-table OUT                    the packed runs with and without the mask
                                                      (OUT/packed-masked, OUT/packed-unmasked)

Exits 1 with the reason when a check fails, 3 when it cannot run here (no `transformers`).
"""

import json
import math
import os
import shutil
import statistics
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def metrics(path):
    """The step records, one per step: the controller's metrics.jsonl folds every rank's
    into one (a standalone run's file has its rank's own); evaluation lines are skipped."""
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    steps = [r for r in records if r.get("rank", 0) == 0 and "loss" in r]
    # JSON has no NaN: a diverged loss is written as null, which must compare as NaN.
    for r in steps:
        if r["loss"] is None:
            r["loss"] = float("nan")
    return steps


def field(record, *names):
    """The first of `names` a record has: step records of the controller's metrics.jsonl
    (`step_time_max_s`, `peak_memory_max_bytes`) or a rank's own (`step_time_s`, ...)."""
    for name in names:
        if record.get(name) is not None:
            return record[name]
    return None


def fail(why):
    print(f"FAIL: {why}")
    sys.exit(1)


NOT_RUN = 3


def transformers_or_not_run():
    """`transformers`, or exit NOT_RUN saying it is missing (the machine's Python, not
    shardrun, lacks it)."""
    try:
        import transformers
    except ImportError:
        print(f"transformers is not installed for {sys.executable}")
        sys.exit(NOT_RUN)
    return transformers


def trains(path):
    losses = [m["loss"] for m in metrics(path)]
    if len(losses) < 2 or not all(math.isfinite(l) for l in losses):
        fail(f"{path}: losses {losses}")
    if not losses[-1] < losses[0]:
        fail(f"{path}: the loss did not fall ({losses[0]:.4f} -> {losses[-1]:.4f})")
    print(f"ok: {len(losses)} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}")


def same(a, b, after=0, rtol=1e-3):
    la = {m["step"]: m["loss"] for m in metrics(a)}
    lb = {m["step"]: m["loss"] for m in metrics(b)}
    steps = sorted(s for s in set(la) & set(lb) if s > after)
    if not steps:
        fail(f"{a} and {b} share no step after {after}")
    # Python's max passes over a NaN that is not first: every difference is checked.
    differences = [abs(la[s] - lb[s]) / max(abs(lb[s]), 1e-12) for s in steps]
    worst = max(differences)
    if not all(math.isfinite(d) for d in differences) or worst > rtol:
        fail(f"losses differ by {worst:.2e} (relative) over steps {steps}: "
             f"{[la[s] for s in steps]} vs {[lb[s] for s in steps]}")
    print(f"ok: steps {steps[0]}-{steps[-1]} agree to {worst:.1e}")


def read_safetensors(path):
    """The tensors of a safetensors file, read with torch alone (the `safetensors` package
    need not be installed where the GPUs are): an 8-byte header length, a JSON header of
    dtype, shape and byte offsets, then the data."""
    import torch

    dtypes = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "F64": torch.float64, "I64": torch.int64, "I32": torch.int32}
    with open(path, "rb") as f:
        blob = f.read()
    (length,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + length])
    data = bytearray(blob[8 + length:])
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        start, end = entry["data_offsets"]
        flat = torch.frombuffer(data, dtype=dtypes[entry["dtype"]],
                                count=(end - start) // dtypes[entry["dtype"]].itemsize, offset=start)
        tensors[name] = flat.reshape(entry["shape"]).clone()
    return tensors


def exported(checkpoint, config_path, metrics_path, rtol=1e-3):
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
    from shardrun_model import Transformer

    with open(config_path) as f:
        config = json.load(f)
    m = config["model"]
    with open(os.path.join(checkpoint, "metadata.json")) as f:
        step = json.load(f)["step"]
    model = Transformer(m["vocab_size"], m["dim"], m["n_layers"], m["n_heads"], m["max_seq_len"])
    model.load_state_dict(read_safetensors(os.path.join(checkpoint, "model.safetensors")), strict=True)
    device = "cuda" if config["device"] == "cuda" else "cpu"
    model = model.to(device)
    tokens, targets = next_batch(config, step)
    with torch.no_grad():
        logits = model(tokens.to(device))
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.to(device).view(-1)).item()
    compare_next_loss(loss, metrics_path, step, rtol)


def next_batch(config, step):
    """The global batch of step `step + 1`: the worker's synthetic tokens and targets."""
    sys.path.insert(0, HERE)
    from fsdp2_reference import samples

    batch = config["batch"]
    global_batch = batch["batch_size_per_device"] * batch["world_size"]
    vocab = config["model"].get("vocab_size") or config["model"]["architecture"]["vocab_size"]
    return samples(config["seed"], step * global_batch, global_batch, config["data"]["seq_len"], vocab)


def compare_next_loss(loss, metrics_path, step, rtol):
    worker = {r["step"]: r["loss"] for r in metrics(metrics_path)}.get(step + 1)
    if worker is None:
        fail(f"{metrics_path} has no step {step + 1}")
    diff = abs(loss - worker) / abs(worker)
    if not diff <= rtol:
        fail(f"PyTorch's loss from the step-{step} weights is {loss:.6f}, the worker's {worker:.6f}")
    print(f"ok: PyTorch {loss:.6f} vs worker {worker:.6f} at step {step + 1} ({diff:.1e})")


def hf_exported(folder, config_path, metrics_path, step, rtol=1e-3):
    """`transformers` loads the Hugging Face folder exported from the step-`step` checkpoint
    and computes the loss of the next step's batch, which must be the worker's."""
    transformers = transformers_or_not_run()
    import torch
    import torch.nn.functional as F

    with open(config_path) as f:
        config = json.load(f)
    device = "cuda" if config["device"] == "cuda" else "cpu"
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device)
    tokens, targets = next_batch(config, step)
    with torch.no_grad():
        logits = model(input_ids=tokens.to(device)).logits
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.to(device).view(-1)).item()
    compare_next_loss(loss, metrics_path, step, rtol)


def steady_figures(run_dir):
    """A shardrun run's step records and its figures after 5 warm-up steps: median step time
    (the slowest rank's) and tokens/s, median trained tokens/s and MFU (None where not
    recorded), peak allocated and reserved bytes."""
    ours = metrics(os.path.join(run_dir, "metrics.jsonl"))
    steady = [m for m in ours if m["step"] > 5] or ours
    median_of = lambda name: (statistics.median(v) if (v := [m[name] for m in steady
                                                              if m.get(name) is not None]) else None)
    return ours, {
        "step_time_s": statistics.median(field(m, "step_time_max_s", "step_time_s") for m in steady),
        "tokens_per_s": median_of("tokens_per_s"),
        "trained_tokens_per_s": median_of("trained_tokens_per_s"),
        "mfu": median_of("mfu"),
        "peak": max(field(m, "peak_memory_max_bytes", "peak_memory_bytes") for m in ours),
        "reserved": max((field(m, "peak_reserved_max_bytes", "peak_reserved_bytes") or 0) for m in ours),
    }


def table(out, name=""):
    suffix = f"-{name}" if name else ""
    ours, f = steady_figures(os.path.join(out, f"bench{suffix}"))
    step, tps, mfu, peak, reserved = f["step_time_s"], f["tokens_per_s"], f["mfu"], f["peak"], f["reserved"]
    with open(os.path.join(out, f"pytorch{suffix}.json")) as f:
        ref = json.loads([l for l in f.read().splitlines() if l.startswith("{")][-1])
    ref_peak = max(ref["peak_rss_bytes"])
    ref_reserved = max(ref.get("peak_reserved_bytes", [0]))
    gib = 2**30
    fmt = lambda x: "n/a" if x is None else f"{x:.1%}"
    ref_mfu = None if mfu is None else mfu * ref["tokens_per_s"] / tps
    rows = [
        ("", "shardrun", "PyTorch FSDP2", "ratio"),
        ("step time (median)", f"{step:.4f} s", f"{ref['step_time_s']:.4f} s", f"{step / ref['step_time_s']:.2f}"),
        ("tokens/s", f"{tps:,.0f}", f"{ref['tokens_per_s']:,.0f}", f"{tps / ref['tokens_per_s']:.2f}"),
        ("MFU", fmt(mfu), fmt(ref_mfu), ""),
        ("peak allocated", f"{peak / gib:.2f} GiB", f"{ref_peak / gib:.2f} GiB", f"{peak / ref_peak:.2f}"),
        ("peak reserved", f"{reserved / gib:.2f} GiB", f"{ref_reserved / gib:.2f} GiB",
         f"{reserved / ref_reserved:.2f}" if ref_reserved else ""),
        # A sanity check, not a comparison: the initialisations and LR schedules differ.
        ("loss first -> last (both fall)", f"{ours[0]['loss']:.4f} -> {ours[-1]['loss']:.4f}",
         f"{ref['first_loss']:.4f} -> {ref['last_loss']:.4f}", ""),
    ]
    for row in rows:
        print("| " + " | ".join(row) + " |")
    if len(ref["peak_rss_bytes"]) == 1:
        # One rank per side: what is compared is one GPU's training, not sharding's cost.
        print("\nOne GPU: shardrun issues no collectives at world size 1; PyTorch FSDP2 still "
              "copies into its one-rank all-gather and reduce-scatter.")
    with open(os.path.join(out, f"summary{suffix}.json"), "w") as f:
        json.dump({"shardrun": {"step_time_s": step, "tokens_per_s": tps, "mfu": mfu,
                                "peak_allocated_bytes": peak, "peak_reserved_bytes": reserved},
                   "pytorch_fsdp2": ref}, f, indent=2)


def documents(folder, count, vocab, max_len):
    """`count` token files of 32..`max_len` random ids below `vocab` (never 0, so none reads
    as a u32 file), seeded: the same documents on every machine."""
    import random

    rng = random.Random(0)
    # Another size's documents (a CPU try-out before a GPU run) must not join the glob.
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    total = 0
    for i in range(count):
        n = rng.randint(32, max_len)
        ids = [rng.randrange(1, vocab) for _ in range(n)]
        with open(os.path.join(folder, f"doc-{i:05d}.bin"), "wb") as f:
            f.write(struct.pack(f"<{n}H", *ids))
        total += n
    print(f"ok: {count} documents, {total:,} ids")


def packed_spec(folder, mask):
    """The benchmark spec on standard input, its synthetic data replaced by `folder`'s
    documents packed whole into sequences."""
    spec = sys.stdin.read()
    synthetic = "    kind: synthetic\n"
    if synthetic not in spec or mask not in ("true", "false"):
        fail("packed-spec takes a spec with `kind: synthetic` data and a mask of true or false")
    print(spec.replace(synthetic, (
        "    kind: tokens\n"
        f"    files: [{folder}/*.bin]\n"
        f"    cache_dir: {folder}/cache\n"
        "    packing: whole_documents\n"
        f"    document_mask: {mask}\n")), end="")


def packed_table(out):
    rows = [("document_mask", "step time (median)", "tokens/s", "trained tokens/s",
             "peak allocated", "peak reserved")]
    gib = 2**30
    for name, mask in (("packed-masked", "true"), ("packed-unmasked", "false")):
        _, f = steady_figures(os.path.join(out, name))
        trained = f["trained_tokens_per_s"]
        rows.append((mask, f"{f['step_time_s']:.4f} s", f"{f['tokens_per_s']:,.0f}",
                     f"{trained:,.0f}" if trained else "n/a",
                     f"{f['peak'] / gib:.2f} GiB", f"{f['reserved'] / gib:.2f} GiB"))
    for i, row in enumerate(rows):
        print("| " + " | ".join(row) + " |")
        if i == 0:
            print("|" + " --- |" * len(row))


def main(argv):
    if len(argv) < 2:
        fail(__doc__)
    cmd, args = argv[1], argv[2:]
    options = {}
    rest = []
    i = 0
    while i < len(args):
        if args[i].startswith("--"):
            options[args[i][2:]] = float(args[i + 1])
            i += 2
        else:
            rest.append(args[i])
            i += 1
    if cmd == "trains":
        trains(*rest)
    elif cmd == "same":
        same(*rest, after=int(options.get("after", 0)), rtol=options.get("rtol", 1e-3))
    elif cmd == "exported":
        exported(*rest, rtol=options.get("rtol", 1e-3))
    elif cmd == "hf-exported":
        hf_exported(*rest, step=int(options["step"]), rtol=options.get("rtol", 1e-3))
    elif cmd == "table":
        table(*rest)
    elif cmd == "documents":
        documents(rest[0], int(rest[1]), int(rest[2]), int(rest[3]))
    elif cmd == "packed-spec":
        packed_spec(*rest)
    elif cmd == "packed-table":
        packed_table(*rest)
    else:
        fail(f"unknown check {cmd}")


if __name__ == "__main__":
    main(sys.argv)
