"""Make the Hugging Face model folder of examples/llama-local.yaml: a small Llama
(LlamaForCausalLM: grouped-query attention, SwiGLU, rotary embeddings) with transformers' own
initialisation, and a byte-level BPE tokenizer (the Llama 3 kind) trained on the Python
sources every Debian machine has. Both are written with `save_pretrained`, so the folder looks
like a downloaded one: config.json, model.safetensors, generation_config.json, tokenizer.json,
tokenizer_config.json. Nothing is downloaded. Run it with the project's venv:

    ~/.cache/shardrun/venv/bin/python examples/make_code_llama.py [OUT_DIR]

OUT_DIR defaults to examples/models/code-llama. An existing folder made with the same
arguments is left as it is.
"""

import argparse
import glob
import json
import os
import sys

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"


def sources(pattern):
    files = sorted(glob.glob(pattern, recursive=True))
    if not files:
        sys.exit(f"no files match {pattern}: install python3, or pass --files")
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            yield f.read()


def train_tokenizer(pattern, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(sources(pattern), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default=os.path.join(here, "models", "code-llama"))
    parser.add_argument("--files", default="/usr/lib/python3*/**/*.py", help="the tokenizer's training text")
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--ffn", type=int, default=688)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    stamp_path = os.path.join(args.out, ".made-with.json")
    stamp = {k: v for k, v in vars(args).items() if k != "out"}
    try:
        with open(stamp_path) as f:
            if json.load(f) == stamp:
                print(f"{args.out} is already made")
                return
    except (OSError, ValueError):
        pass

    tokenizer = train_tokenizer(args.files, args.vocab_size)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.dim,
        intermediate_size=args.ffn,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    with open(stamp_path, "w") as f:
        json.dump(stamp, f)
    params = sum(p.numel() for p in model.parameters())
    print(f"wrote {args.out}: a {params / 1e6:.1f} M-parameter Llama, {len(tokenizer)} tokens")


if __name__ == "__main__":
    main()
