"""The Python side of bench/data.sh: Hugging Face `tokenizers`' `encode_batch` (Rust, every
core through rayon, as `datasets.map(batched=True)` calls it), or `encode_batch_fast` (the
same without character offsets), on the same files and tokenizer as `shardrun prepare`.
Files are read first (timed apart), then encoded in batches of `--batch` documents, keeping
only the id count of each encoding (the whole corpus's Encoding objects would not fit in
memory at once).

    python tokenize_reference.py --tokenizer DIR [--fast] [--batch 1000] PATTERN...

Prints one JSON line: bytes, documents, tokens, read_s, encode_s.
"""

import argparse
import glob
import json
import os
import time

from tokenizers import Tokenizer


def files(patterns):
    """As `data.files` expands: per pattern, sorted, each file once, no folders."""
    seen, out = set(), []
    for pattern in patterns:
        for path in sorted(glob.glob(pattern, recursive=True)):
            if not os.path.isdir(path) and path not in seen:
                seen.add(path)
                out.append(path)
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--fast", action="store_true", help="encode_batch_fast")
    parser.add_argument("patterns", nargs="+")
    args = parser.parse_args()
    tok = Tokenizer.from_file(os.path.join(args.tokenizer, "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()

    started = time.perf_counter()
    texts, size = [], 0
    for path in files(args.patterns):
        with open(path, "rb") as f:
            data = f.read()
        size += len(data)
        if data:  # shardrun skips empty files (on_bad_record: skip)
            texts.append(data.decode("utf-8"))
    read_s = time.perf_counter() - started

    encode = tok.encode_batch_fast if args.fast else tok.encode_batch
    started = time.perf_counter()
    tokens = 0
    for i in range(0, len(texts), args.batch):
        tokens += sum(len(e.ids) for e in encode(texts[i : i + args.batch]))
    encode_s = time.perf_counter() - started
    print(json.dumps({"bytes": size, "documents": len(texts), "tokens": tokens,
                      "read_s": read_s, "encode_s": encode_s}))


if __name__ == "__main__":
    main()
