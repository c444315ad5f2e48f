"""Tiny Hugging Face models made with `transformers` (nothing downloaded), and what
`transformers` and PyTorch compute on them: the ground truth of shardrun's Llama tests.

    hf_models.py make --out DIR              the test folders (see FOLDERS) + tokenizer files
    hf_models.py make-small --out DIR        a 4 M-parameter Llama with a tokenizer (the local example)
    hf_models.py make-big --out DIR --mb 500 one fp32 Llama folder of about that size
    hf_models.py make-bad --good DIR --out DIR
                                             broken copies of DIR and, in manifest.json, what
                                             each error must name
    hf_models.py logits --model DIR --ids IDS.json --out F.safetensors [--inv-freq-dtype bf16]
                                             [--documents DOCS.json] [--state-dict F]
    hf_models.py eval-loss --model DIR --records VAL.jsonl
                                             the mean loss over prompt/completion records
    hf_models.py step --model DIR --batch BATCH.json --config train_config.json --out F.safetensors
                                             one AdamW step (clipping, two parameter groups)
    hf_models.py load --model DIR            from_pretrained + fully_shard time and peak RSS

Weights are redrawn from a fixed generator at a larger scale than `transformers`' init
(std 0.02 would make every logit nearly 0 and the comparisons weak).
"""

import argparse
import json
import os
import resource
import shutil
import sys
import time

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

import transformers
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

VOCAB = 96


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "norm" in name:
                p.copy_(1.0 + 0.2 * noise)
            elif name.endswith("bias"):
                p.copy_(0.2 * noise)
            elif "embed_tokens" in name:
                p.copy_(noise)
            else:
                p.copy_(noise / p.shape[-1] ** 0.5)


def save_tokenizer(out):
    """A word-level tokenizer over tokens t0..t95 (tokenizer.json, tokenizer_config.json,
    a chat template), like the files a real model folder carries."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="t1", eos_token="t2", unk_token="t0")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    fast.save_pretrained(out)


def to_4x_dialect(folder):
    """Rewrite config.json as transformers 4.x writes it: rope_theta + rope_scaling, torch_dtype."""
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        c = json.load(f)
    rope = c.pop("rope_parameters", None) or {}
    c["rope_theta"] = rope.pop("rope_theta", 10000.0)
    c["rope_scaling"] = rope if rope.get("rope_type", "default") != "default" else None
    if "dtype" in c:
        c["torch_dtype"] = c.pop("dtype")
    with open(path, "w") as f:
        json.dump(c, f, indent=2)


def build(kind, **kw):
    cls, cfg = {"llama": (LlamaForCausalLM, LlamaConfig), "mistral": (MistralForCausalLM, MistralConfig),
                "qwen2": (Qwen2ForCausalLM, Qwen2Config), "qwen3": (Qwen3ForCausalLM, Qwen3Config)}[kind]
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  rms_norm_eps=1e-5)
    common.update(kw)
    return cls(cfg(**common))


# name: (model type, config overrides, dtype, max shard size, 4.x dialect)
FOLDERS = {
    "llama-gqa": ("llama", dict(tie_word_embeddings=False, pad_token_id=0), torch.float32, None, False),
    "llama-tied-llama3": ("llama", dict(
        tie_word_embeddings=True, head_dim=16, attention_bias=True, mlp_bias=True,
        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position_embeddings=16)),
        torch.float32, None, True),
    "qwen2-bias": ("qwen2", dict(num_key_value_heads=1, rope_parameters=dict(rope_type="default", rope_theta=1e6),
                                 tie_word_embeddings=False), torch.float32, None, False),
    # Qwen3: q/k norms per head, head_dim apart from hidden_size / heads, tied as the small ones;
    # YaRN as its model card extends the context (a ramp that mixes kept and scaled frequencies).
    "qwen3-qk-norm-yarn": ("qwen3", dict(num_key_value_heads=1, head_dim=16, tie_word_embeddings=True,
                                         max_position_embeddings=128,
                                         rope_parameters=dict(rope_type="yarn", rope_theta=1e6, factor=2.0,
                                                              original_max_position_embeddings=64)),
                           torch.float32, None, False),
    "mistral": ("mistral", dict(sliding_window=64, rope_parameters=dict(rope_type="linear", factor=2.0, rope_theta=10000.0)),
                torch.float32, None, False),
    "llama-sharded-bf16": ("llama", dict(tie_word_embeddings=False, num_hidden_layers=3), torch.bfloat16, "20KB", False),
}


def cmd_make(args):
    for i, (name, (kind, kw, dtype, shard, old)) in enumerate(FOLDERS.items()):
        out = os.path.join(args.out, name)
        model = build(kind, **kw)
        randomize(model, seed=100 + i)
        model = model.to(dtype)
        if shard:
            model.save_pretrained(out, max_shard_size=shard)
        else:
            model.save_pretrained(out)
        save_tokenizer(out)
        if old:
            to_4x_dialect(out)
    print(json.dumps(sorted(FOLDERS)))


def cmd_make_small(args):
    model = build("llama", vocab_size=VOCAB, hidden_size=256, intermediate_size=688, num_hidden_layers=6,
                  num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512)
    randomize(model, seed=7)
    model.save_pretrained(args.out)
    save_tokenizer(args.out)
    print(json.dumps({"params": sum(p.numel() for p in model.parameters())}))


def cmd_make_big(args):
    # ~4 bytes per parameter: choose the layer count for the size asked.
    vocab, dim, ffn = 32000, 1024, 2816
    per_layer = 2 * dim * dim + 2 * dim * 256 + 3 * dim * ffn + 2 * dim
    fixed = 2 * vocab * dim + dim
    layers = max(1, round((args.mb * 1e6 / 4 - fixed) / per_layer))
    config = LlamaConfig(vocab_size=vocab, hidden_size=dim, intermediate_size=ffn, num_hidden_layers=layers,
                         num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=512,
                         tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(args.out)
    size = sum(os.path.getsize(os.path.join(args.out, f)) for f in os.listdir(args.out))
    print(json.dumps({"layers": layers, "bytes": size, "params": sum(p.numel() for p in model.parameters())}))


def rewrite_config(folder, **changes):
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        c = json.load(f)
    for k, v in changes.items():
        if v is None:
            c.pop(k, None)
        else:
            c[k] = v
    with open(path, "w") as f:
        json.dump(c, f, indent=2)


def cmd_make_bad(args):
    """Broken copies of a single-file fp32 Llama folder; manifest: folder -> substrings the
    error must contain (the tensor or key, and the file)."""
    good = args.good
    manifest = {}

    def copy(name):
        out = os.path.join(args.out, name)
        shutil.copytree(good, out)
        return out

    weights = lambda d: os.path.join(d, "model.safetensors")
    tensors = load_file(weights(good))
    victim = "model.layers.1.mlp.up_proj.weight"

    d = copy("missing-tensor")
    save_file({k: v for k, v in tensors.items() if k != victim}, weights(d), metadata={"format": "pt"})
    manifest["missing-tensor"] = [victim, "model.safetensors"]

    d = copy("extra-tensor")
    save_file(dict(tensors, **{"model.layers.0.mlp.extra.weight": torch.zeros(3, 3)}), weights(d), metadata={"format": "pt"})
    manifest["extra-tensor"] = ["model.layers.0.mlp.extra.weight", "model.safetensors"]

    d = copy("misshaped-tensor")
    save_file(dict(tensors, **{victim: tensors[victim][:, :-1].contiguous()}), weights(d), metadata={"format": "pt"})
    manifest["misshaped-tensor"] = [victim, "model.safetensors"]

    d = copy("config-disagrees")
    rewrite_config(d, intermediate_size=48)
    manifest["config-disagrees"] = ["model.layers.0.mlp.gate_proj.weight", "model.safetensors", "config.json"]

    d = copy("truncated")
    size = os.path.getsize(weights(d))
    with open(weights(d), "r+b") as f:
        f.truncate(size - 1000)
    manifest["truncated"] = ["truncated", "model.safetensors"]

    d = copy("unknown-model-type")
    rewrite_config(d, model_type="gpt_neox")
    manifest["unknown-model-type"] = ["model_type", "config.json", "gpt_neox"]

    d = copy("unsupported-rope")
    rewrite_config(d, rope_parameters={"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4,
                                       "rope_theta": 10000.0})
    manifest["unsupported-rope"] = ["rope_parameters.rope_type", "config.json", "longrope"]

    d = copy("sliding-window")
    rewrite_config(d, model_type="mistral", sliding_window=8)
    manifest["sliding-window"] = ["sliding_window", "8"]

    d = copy("int8-tensor")
    save_file(dict(tensors, **{victim: tensors[victim].to(torch.int8)}), weights(d), metadata={"format": "pt"})
    manifest["int8-tensor"] = [victim, "model.safetensors", "I8"]

    # A sharded folder whose index names a file that is not there.
    d = os.path.join(args.out, "index-missing-file")
    shutil.copytree(good, d)
    os.remove(weights(d))
    names = sorted(tensors)
    half = len(names) // 2
    save_file({k: tensors[k] for k in names[:half]}, os.path.join(d, "model-00001-of-00002.safetensors"), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: ("model-00001-of-00002.safetensors" if i < half else "model-00002-of-00002.safetensors")
                                            for i, k in enumerate(names)}}
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f)
    manifest["index-missing-file"] = [names[half], "model-00002-of-00002.safetensors"]

    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    print(json.dumps(manifest))


def load(folder):
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    return model


def cmd_logits(args):
    model = load(args.model)
    if args.state_dict:
        # A shardrun full checkpoint's model.safetensors: a state dict with the model's own names.
        model.load_state_dict(load_file(args.state_dict), strict=True)
    if args.inv_freq_dtype:
        rotary = model.model.rotary_emb
        rotary.inv_freq = rotary.inv_freq.to(getattr(torch, args.inv_freq_dtype))
    with open(args.ids) as f:
        ids = torch.tensor(json.load(f), dtype=torch.int64)
    with torch.no_grad():
        if args.documents:
            # Packed rows as the worker sees them, computed here one document at a time with
            # positions from 0: what a block-diagonal causal mask must reproduce.
            with open(args.documents) as f:
                docs = torch.tensor(json.load(f), dtype=torch.int64)
            rows = []
            for row, doc_row in zip(ids, docs):
                pieces = []
                for d in torch.unique_consecutive(doc_row):
                    tokens = row[doc_row == d].unsqueeze(0)
                    pieces.append(model(tokens).logits[0])
                rows.append(torch.cat(pieces))
            logits = torch.stack(rows)
        else:
            logits = model(ids).logits
    save_file({"logits": logits.float().contiguous()}, args.out)
    print(json.dumps({"shape": list(logits.shape), "max_abs": logits.abs().max().item()}))


def cmd_eval_loss(args):
    """The mean next-token loss over prompt/completion records, each computed alone as TRL's
    SFT does: the prompt's tokens are no targets; the completion's and the end-of-document
    token appended to it are. Also the number of those targets."""
    from transformers import AutoTokenizer

    model = load(args.model)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    loss_sum, targets = 0.0, 0
    with open(args.records) as f:
        for line in f:
            record = json.loads(line)
            prompt = tokenizer(record["prompt"])["input_ids"]
            completion = tokenizer(record["completion"], add_special_tokens=False)["input_ids"]
            completion.append(tokenizer.eos_token_id)
            ids = torch.tensor([prompt + completion])
            labels = torch.tensor([-100] * len(prompt) + completion)
            with torch.no_grad():
                logits = model(ids).logits[0].float()
            loss_sum += F.cross_entropy(logits[:-1], labels[1:], reduction="sum").item()
            targets += int((labels[1:] != -100).sum())
    print(json.dumps({"loss": loss_sum / targets, "targets": targets}))


def cmd_step(args):
    """One optimizer step as PyTorch does it: mean cross-entropy over the global batch,
    clip_grad_norm_, torch.optim.AdamW with biases and norms in a no-decay group (as
    transformers' Trainer groups them)."""
    with open(args.config) as f:
        cfg = json.load(f)
    opt = cfg["optimizer"]
    model = load(args.model)
    model.train()
    with open(args.batch) as f:
        batch = json.load(f)
    inputs = torch.tensor(batch["inputs"], dtype=torch.int64)
    targets = torch.tensor(batch["targets"], dtype=torch.int64)
    logits = model(inputs).logits
    loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))
    loss.backward()
    params = dict(model.named_parameters())
    no_decay = [n for n in params if n.endswith("bias") or "norm" in n]
    decay = [n for n in params if n not in no_decay]
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), opt["grad_clip"] or float("inf"))
    optimizer = torch.optim.AdamW(
        [{"params": [params[n] for n in decay], "weight_decay": opt["weight_decay"]},
         {"params": [params[n] for n in no_decay], "weight_decay": 0.0}],
        lr=opt["lr"], betas=(opt["beta1"], opt["beta2"]), eps=opt["eps"], foreach=False)
    optimizer.step()
    # Tied weights appear once, under the name the worker uses too.
    save_file({n: p.detach().contiguous() for n, p in model.named_parameters()}, args.out)
    print(json.dumps({"loss": loss.item(), "grad_norm": grad_norm.item(), "no_decay": no_decay}))


def cmd_load(args):
    """from_pretrained + fully_shard on each rank (run under torchrun): the PyTorch side of the
    loading benchmark."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    started = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    dist.barrier()
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    peaks = [None] * dist.get_world_size()
    dist.all_gather_object(peaks, peak)
    if rank == 0:
        print(json.dumps({"seconds": seconds, "peak_rss_bytes": peaks}))
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("make")
    s.add_argument("--out", required=True)
    s = sub.add_parser("make-small")
    s.add_argument("--out", required=True)
    s = sub.add_parser("make-big")
    s.add_argument("--out", required=True)
    s.add_argument("--mb", type=float, default=500)
    s = sub.add_parser("make-bad")
    s.add_argument("--good", required=True)
    s.add_argument("--out", required=True)
    s = sub.add_parser("logits")
    s.add_argument("--model", required=True)
    s.add_argument("--ids", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--inv-freq-dtype")
    s.add_argument("--state-dict", help="load these weights (strict) over the folder's")
    s.add_argument("--documents")
    s = sub.add_parser("eval-loss")
    s.add_argument("--model", required=True)
    s.add_argument("--records", required=True)
    s = sub.add_parser("step")
    s.add_argument("--model", required=True)
    s.add_argument("--batch", required=True)
    s.add_argument("--config", required=True)
    s.add_argument("--out", required=True)
    s = sub.add_parser("load")
    s.add_argument("--model", required=True)
    args = p.parse_args()
    torch.manual_seed(0)
    {"make": cmd_make, "make-small": cmd_make_small, "make-big": cmd_make_big, "make-bad": cmd_make_bad, "logits": cmd_logits,
     "eval-loss": cmd_eval_loss, "step": cmd_step, "load": cmd_load}[args.cmd](args)


if __name__ == "__main__":
    main()
