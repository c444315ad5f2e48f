"""Test set-up for shardrun's data path: builds two tokenizer folders with Hugging Face
`tokenizers` and `transformers` (nothing downloaded; trained on the Python standard library's
source, which every Debian machine has), writes sample documents and chat records, and writes
what Python's `tokenizers` and `transformers` make of them (the ground truth the Rust tests
compare against).

    python make_tokenizers.py OUT_DIR

OUT_DIR/
  bpe/          byte-level BPE (GPT-2 / Llama 3 / Qwen style), ChatML template in
                chat_template.jinja (transformers 5.x layout), eos `<|im_end|>`
  metaspace/    SentencePiece-style BPE (Metaspace, byte fallback, `<s>` added by the
                post-processor: Llama 2 style), Llama 2 chat template inside
                tokenizer_config.json (transformers 4.x layout)
  metaspace_config_eos/   the same with the end of sequence only in config.json
  metaspace_eos/          the same saved with `add_bos_token` and `add_eos_token` (Llama 2
                          with add_eos_token: the post-processor writes `<s> $A </s>`)
  named/        the byte-level BPE with two named templates (Qwen 2.5 style), `default` in
                chat_template.jinja and `tool_use` in additional_chat_templates/ (5.x layout)
  named_legacy/ the same templates as a list in tokenizer_config.json (4.x layout)
  chatml_generation.jinja   the ChatML template with its `{% generation %}` markers
  samples/      text, code and Unicode documents (one per file) + lines.txt
  chat_<tokenizer>.jsonl   chat records
  chat_tools.jsonl, chat_assistant_first.jsonl   chat records for the named templates
  prompt_completion.jsonl  prompt/completion records
  expected.json ids per tokenizer and sample; chat renders, ids and assistant masks (also
                with the spec's special tokens overriding the folder's, as
                `AutoTokenizer.from_pretrained(folder, bos_token=..., eos_token=...)`);
                prompt/completion ids and loss masks
"""

import glob
import json
import os
import re
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

SAMPLES = {
    "prose.txt": (
        "The quick brown fox doesn't jump; it's 3.14159 times faster than 1,000,000 snails.\n"
        "  Leading spaces,\ttabs,   runs of spaces.\n\n\nAnd blank lines.\n"
    ),
    "code.py": (
        "def fib(n: int) -> int:\n"
        "    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
        "    a, b = 0, 1\n"
        "    for _ in range(n):\n"
        "\ta, b = b, a + b  # tab-indented\n"
        "    return a\r\n"
        "print(f\"{fib(10)=}\")\n"
    ),
    "cjk.txt": "日本語のテキストと中文文本，以及한국어 텍스트。全角ＡＢＣ１２３！\n",
    "emoji.txt": "Family 👩‍👩‍👧‍👦, flag 🇯🇵, thumbs 👍🏽, heart ❤️, keycap 1️⃣ and 🦀🐍.\n",
    "combining.txt": (
        "Cafe\u0301 vs Caf\u00e9; Z\u0338\u0322\u034ea\u0335l\u0334g\u0337o; "
        "नमस्ते दुनिया; مرحبا بالعالم; สวัสดีชาวโลก; Ǆ ﬁ ㎏ Ω.\n"
    ),
    "special.txt": "Text that mentions <|im_end|> and </s> as plain words.\n",
}

PROMPT_COMPLETIONS = [
    {"prompt": "Question: what is 2+2?\n", "completion": "Answer: 4."},
    {"prompt": "Übersetze: cat →", "completion": " Katze 🐈"},
]

LINES = "first line\n\n  second line with spaces  \r\nthird: 日本語 👍\n   \nlast\n"

CHATML = """{%- if tools %}
    {{- '<|im_start|>system\n# Tools\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' }}{{- tool | tojson }}
    {%- endfor %}
    {{- '\n</tools><|im_end|>\n' }}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'].strip() %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set system_message = 'You are a helpful assistant.' %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- '<|im_start|>system\\n' + system_message + '<|im_end|>\\n' }}
{%- for message in loop_messages %}
    {%- if message['role'] not in ['user', 'assistant'] %}
        {{- raise_exception('Only user and assistant roles are supported after the system message') }}
    {%- endif %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'assistant' %}
        {%- set content = message['content'] %}
        {%- if content.startswith('<think>') %}
            {%- set content = content.split('</think>')[-1] %}
        {%- endif %}
        {{- '<|im_start|>assistant\\n' }}{% generation %}{{ content.strip() + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}
    {%- else %}
        {{- '<|im_start|>user\\n' + message['content'].strip() + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

LLAMA2 = """{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = '<<SYS>>\\n' + messages[0]['content'].strip() + '\\n<</SYS>>\\n\\n' %}{% else %}{% set loop_messages = messages %}{% set system_message = '' %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 %}{% set content = system_message + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{% generation %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endgeneration %}{% endif %}{% endfor %}"""

# Qwen 2.5 style: reads messages[0] unguarded, takes any order of roles. `default` ignores
# tools, `tool_use` lists them in the system turn.
NAMED_DEFAULT = """{%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
{%- else %}
    {{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant\n' }}
        {%- generation %}{{- message.content + '<|im_end|>' }}{%- endgeneration %}
        {{- '\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

NAMED_TOOL_USE = """{{- '<|im_start|>system\n' }}
{%- if messages[0]['role'] == 'system' %}
    {{- messages[0]['content'] }}
{%- else %}
    {{- 'You are a helpful assistant.' }}
{%- endif %}
{{- '\n\n# Tools\n<tools>' }}
{%- for tool in tools %}
    {{- '\n' }}{{- tool | tojson }}
{%- endfor %}
{{- '\n</tools><|im_end|>\n' }}
{%- for message in messages %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant\n' }}
        {%- generation %}{{- message.content + '<|im_end|>' }}{%- endgeneration %}
        {{- '\n' }}
    {%- elif message.role == 'tool' %}
        {{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

NAMED = {"default": NAMED_DEFAULT, "tool_use": NAMED_TOOL_USE}

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather",
    "description": "Weather at a place, \"now\"\n(cached 5 min)",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "default": 1, "scale": 0.5}},
                   "required": ["city"]},
}}

CHATS = [
    {"messages": [
        {"role": "system", "content": "  You write Python.  "},
        {"role": "user", "content": "Sum a list?"},
        {"role": "assistant", "content": "Use `sum(xs)`; it's O(n). 👍"},
        {"role": "user", "content": "And in 日本語?"},
        {"role": "assistant", "content": "<think>translate</think>  合計は sum(xs) です。  "},
    ]},
    {"messages": [
        {"role": "user", "content": "Say nothing but OK."},
        {"role": "assistant", "content": "OK"},
    ]},
    # Tool definitions are rendered with `tojson` (Python's json.dumps, key order kept).
    {"messages": [
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": "Let me check: get_weather(\"Zürich\")"},
    ], "tools": [WEATHER_TOOL]},
]

# With tools `transformers` picks the `tool_use` template, without them `default`.
TOOL_CHATS = [
    {"messages": [
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": "Checking."},
        {"role": "tool", "content": "{\"temp\": 21}"},
        {"role": "assistant", "content": "21 °C."},
    ], "tools": [WEATHER_TOOL]},
    {"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
    ]},
    {"messages": [
        {"role": "user", "content": "Any tools?"},
        {"role": "assistant", "content": "None offered."},
    ], "tools": []},
]

# Conversations the assistant opens (a greeting, a proactive message).
ASSISTANT_FIRST_CHATS = [
    {"messages": [
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Sum a list?"},
        {"role": "assistant", "content": "Use `sum(xs)`."},
    ]},
    {"messages": [{"role": "assistant", "content": "Only me."}]},
]


def without_generation_tags(template):
    """The template as a model folder ships it: no `{% generation %}` markers (few real
    templates have them; transformers needs them for its assistant mask, shardrun does not)."""
    return re.sub(r"\{%-?\s*(end)?generation\s*-?%\}", "", template)


def training_corpus():
    files = sorted(glob.glob("/usr/lib/python3.11/*.py"))[:200]
    if not files:
        sys.exit("the Python standard library sources (/usr/lib/python3.11/*.py) are missing")
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            yield f.read()
    for _ in range(20):
        yield from SAMPLES.values()


def byte_level_bpe(out):
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=1500,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_corpus(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    fast.chat_template = without_generation_tags(CHATML)
    fast.save_pretrained(out)


def metaspace_bpe(out):
    special = ["<unk>", "<s>", "</s>"]
    byte_tokens = [f"<0x{i:02X}>" for i in range(256)]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=1500, special_tokens=special + byte_tokens, show_progress=False
    )
    tok.train_from_iterator(training_corpus(), trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", unk_token="<unk>")
    fast.save_pretrained(out)
    # The transformers 4.x layout: the template inside tokenizer_config.json, special tokens
    # as AddedToken objects, the model's config.json next to it.
    config_path = os.path.join(out, "tokenizer_config.json")
    with open(config_path) as f:
        config = json.load(f)
    config["chat_template"] = without_generation_tags(LLAMA2)
    for key, text in (("bos_token", "<s>"), ("eos_token", "</s>"), ("unk_token", "<unk>")):
        config[key] = {"__type": "AddedToken", "content": text, "lstrip": False,
                       "normalized": False, "rstrip": False, "single_word": False}
    with open(config_path, "w") as f:
        json.dump(config, f, indent=2)
    for name in ("chat_template.jinja", "special_tokens_map.json"):
        if os.path.exists(os.path.join(out, name)):
            os.remove(os.path.join(out, name))
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({"model_type": "llama", "bos_token_id": 1, "eos_token_id": 2}, f)


def without_eos_in_tokenizer_config(source, out):
    """A copy of `source` whose end of sequence is only in the model's config.json."""
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(source):
        with open(os.path.join(source, name), "rb") as f:
            data = f.read()
        if name == "tokenizer_config.json":
            config = json.loads(data)
            config.pop("eos_token", None)
            config.pop("chat_template", None)
            data = json.dumps(config, indent=2).encode()
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


def named_templates(bpe, out, jinja_files):
    """A copy of the byte-level BPE folder with the named templates, as transformers 5.x saves
    them (`jinja_files`) or as 4.x did (a list in tokenizer_config.json)."""
    fast = AutoTokenizer.from_pretrained(bpe)
    fast.chat_template = {name: without_generation_tags(t) for name, t in NAMED.items()}
    fast.save_pretrained(out, save_jinja_files=jinja_files)


def llama2_with_eos(source, out):
    """`source` saved as a Llama 2 folder with `add_eos_token`: every encoding ends with `</s>`."""
    fast = AutoTokenizer.from_pretrained(source, add_bos_token=True, add_eos_token=True)
    fast.save_pretrained(out)


def prompt_completion_expectations(fast, records):
    """transformers' ids of `prompt + completion`, and the loss mask: the tokens holding any
    character of the completion, and the tokens after the last one with text (what the
    post-processor appends: the end of the document, which TRL trains)."""
    out = []
    for record in records:
        prompt, text = record["prompt"], record["prompt"] + record["completion"]
        encoded = fast(text, return_offsets_mapping=True)
        offsets = encoded["offset_mapping"]
        mask = [int(end > start and end > len(prompt)) for start, end in offsets]
        with_text = [i for i, (start, end) in enumerate(offsets) if end > start]
        for i in range(with_text[-1] + 1, len(mask)):
            mask[i] = 1
        out.append({"ids": list(encoded["input_ids"]), "mask": mask})
    return out


def chat_expectations(fast, template_with_tags, chats):
    """What `fast.apply_chat_template` makes of each record with the template it picks; the
    assistant mask comes from the same template with its `{% generation %}` markers
    (`template_with_tags`: the template, or a dict of them by name)."""
    out = []
    for record in chats:
        messages, tools = record["messages"], record.get("tools")
        if isinstance(template_with_tags, dict):
            picked = fast.get_chat_template(None, tools)
            (name,) = [n for n, t in template_with_tags.items() if without_generation_tags(t) == picked]
            tagged = template_with_tags[name]
        else:
            tagged = template_with_tags
        assert fast.apply_chat_template(messages, tools=tools, tokenize=False) == \
            fast.apply_chat_template(messages, tools=tools, tokenize=False,
                                     chat_template=without_generation_tags(tagged)), \
            "the folder's template is the tagged one without its markers"
        text = fast.apply_chat_template(
            messages, tools=tools, tokenize=False, chat_template=tagged
        )
        plain = fast.apply_chat_template(
            messages, tools=tools, tokenize=False,
            chat_template=without_generation_tags(tagged),
        )
        assert text == plain, "the markers must not change the rendering"
        encoded = fast.apply_chat_template(
            messages,
            tools=tools,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
            chat_template=tagged,
        )
        out.append(
            {
                "text": text,
                "ids": list(encoded["input_ids"]),
                "assistant_mask": list(encoded["assistant_masks"]),
            }
        )
    return out


def main():
    out = sys.argv[1]
    os.makedirs(os.path.join(out, "samples"), exist_ok=True)
    for name, text in SAMPLES.items():
        with open(os.path.join(out, "samples", name), "w", encoding="utf-8", newline="") as f:
            f.write(text)
    with open(os.path.join(out, "lines.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(LINES)
    line_docs = [l.rstrip("\r") for l in LINES.split("\n")]
    line_docs = [l for l in line_docs if l.strip()]

    expected = {"samples": sorted(SAMPLES), "lines": line_docs, "tokenizers": {}}
    with open(os.path.join(out, "prompt_completion.jsonl"), "w", encoding="utf-8") as f:
        for record in PROMPT_COMPLETIONS:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    builders = {
        "bpe": (byte_level_bpe, CHATML),
        "metaspace": (metaspace_bpe, LLAMA2),
        "metaspace_eos": (lambda folder: llama2_with_eos(os.path.join(out, "metaspace"), folder), LLAMA2),
    }
    for name, (build, template) in builders.items():
        folder = os.path.join(out, name)
        build(folder)
        # What a user's transformers makes of the saved folder is the ground truth.
        fast = AutoTokenizer.from_pretrained(folder)
        # The ground truth for plain text: Python `tokenizers` on the saved file.
        tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        with open(os.path.join(out, f"chat_{name}.jsonl"), "w", encoding="utf-8") as f:
            for record in CHATS:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
        expected["tokenizers"][name] = {
            "eos_id": fast.convert_tokens_to_ids(fast.eos_token),
            "samples": {s: tok.encode(SAMPLES[s]).ids for s in sorted(SAMPLES)},
            "lines": [tok.encode(l).ids for l in line_docs],
            "chats": chat_expectations(fast, template, CHATS),
            "prompt_completion": prompt_completion_expectations(fast, PROMPT_COMPLETIONS),
        }
    without_eos_in_tokenizer_config(os.path.join(out, "metaspace"), os.path.join(out, "metaspace_config_eos"))

    # The spec's special tokens stand in for the folder's, in the template too.
    overrides = {"bos_token": "</s>", "eos_token": "<unk>"}
    fast = AutoTokenizer.from_pretrained(os.path.join(out, "metaspace"), **overrides)
    expected["overrides"] = {
        **overrides,
        "eos_id": fast.convert_tokens_to_ids(fast.eos_token),
        "chats": chat_expectations(fast, LLAMA2, CHATS),
    }

    with open(os.path.join(out, "chatml_generation.jinja"), "w", encoding="utf-8") as f:
        f.write(CHATML)
    for name, records in (("tools", TOOL_CHATS), ("assistant_first", ASSISTANT_FIRST_CHATS)):
        with open(os.path.join(out, f"chat_{name}.jsonl"), "w", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
    expected["named"] = {}
    for folder, jinja_files in (("named", True), ("named_legacy", False)):
        named_templates(os.path.join(out, "bpe"), os.path.join(out, folder), jinja_files)
        fast = AutoTokenizer.from_pretrained(os.path.join(out, folder))
        assert isinstance(fast.chat_template, dict)
        expected["named"][folder] = {
            "tools": chat_expectations(fast, NAMED, TOOL_CHATS),
            "assistant_first": chat_expectations(fast, NAMED, ASSISTANT_FIRST_CHATS),
        }
    with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
