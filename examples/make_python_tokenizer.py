"""Make the tokenizer of examples/python-code.yaml: a byte-level BPE (the GPT-2 / Llama 3
kind) trained on the Python sources every Debian machine has, saved as a Hugging Face
tokenizer folder (tokenizer.json, tokenizer_config.json) the way `transformers` saves one.
Nothing is downloaded. Run it with the project's venv (it has `tokenizers` and
`transformers`):

    ~/.cache/shardrun/venv/bin/python examples/make_python_tokenizer.py [OUT_DIR] [--vocab-size N]

OUT_DIR defaults to examples/python-tokenizer (next to this script), N to 4096.
"""

import argparse
import glob
import os
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast


def sources():
    files = sorted(glob.glob("/usr/lib/python3*/**/*.py", recursive=True))
    if not files:
        sys.exit("no Python sources under /usr/lib/python3*: install python3")
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            yield f.read()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default=os.path.join(os.path.dirname(__file__), "python-tokenizer"))
    parser.add_argument("--vocab-size", type=int, default=4096)
    args = parser.parse_args()
    out = args.out
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=args.vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(sources(), trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(out)
    print(f"wrote {out} ({tok.get_vocab_size()} tokens)")


if __name__ == "__main__":
    main()
