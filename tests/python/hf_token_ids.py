"""The special token ids of a `shardrun export` as `transformers` reads them.

    python hf_token_ids.py tokenizer OUT_DIR
        a tiny Hugging Face tokenizer folder: words a-d, `<s>` (id 5) added by the
        post-processor as Llama's is, end of sequence `</s>` (id 6); ids other than
        LlamaConfig's defaults (1 and 2), so a missing id shows
    python hf_token_ids.py read EXPORT_DIR [TOKENIZER_DIR]
        prints JSON: the bos and eos ids of the model's config and of its generation config
        (what `generate` stops at), as `AutoModelForCausalLM.from_pretrained` loads them, the
        tokenizer's (`AutoTokenizer.from_pretrained`), and the ids `generate` returns for a
        short prompt (it runs, with the eos it was given)
    python hf_token_ids.py encode DIR TEXT
        prints JSON: the ids `AutoTokenizer.from_pretrained(DIR)` gives TEXT, its bos and eos
        ids and its chat template (a string, or the named templates)
"""

import json
import sys

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast


def make_tokenizer(out):
    vocab = {"<unk>": 0, "a": 1, "b": 2, "c": 3, "d": 4, "<s>": 5, "</s>": 6}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 5)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.save_pretrained(out)


def read(export, tokenizer_dir):
    model = AutoModelForCausalLM.from_pretrained(export)
    generation = model.generation_config
    out = {
        "config": [model.config.bos_token_id, model.config.eos_token_id],
        "generation": [generation.bos_token_id, generation.eos_token_id],
        "tokenizer": None,
    }
    if tokenizer_dir:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        out["tokenizer"] = [tokenizer.bos_token_id, tokenizer.eos_token_id]
    with torch.no_grad():
        ids = model.generate(torch.tensor([[1, 2]]), max_new_tokens=3, do_sample=False)
    out["generated"] = ids[0].tolist()
    print(json.dumps(out))


def encode(folder, text):
    tokenizer = AutoTokenizer.from_pretrained(folder)
    out = {
        "ids": tokenizer(text)["input_ids"],
        "bos": tokenizer.bos_token_id,
        "eos": tokenizer.eos_token_id,
        "chat_template": tokenizer.chat_template,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    if sys.argv[1] == "tokenizer":
        make_tokenizer(sys.argv[2])
    elif sys.argv[1] == "read":
        read(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
    elif sys.argv[1] == "encode":
        encode(sys.argv[2], sys.argv[3])
    else:
        sys.exit(f"unknown command {sys.argv[1]!r}: tokenizer, read or encode")
