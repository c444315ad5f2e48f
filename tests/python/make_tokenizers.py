"""Test set-up for shardrun's data path: builds two tokenizer folders with Hugging Face
`tokenizers` and `transformers` (nothing downloaded; trained on the Python standard library's
source, which every Debian machine has), writes sample documents and chat records, and writes
what Python's `tokenizers` and `transformers` make of them (the ground truth the Rust tests
compare against). The ground truth is transformers 5's `AutoTokenizer.from_pretrained(folder)`,
what users of the trained model tokenize with.

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
  llama2/       a Llama 2 folder as the Hub has it: `tokenizer.json` with the `Prepend("▁")` +
                `Replace(" ", "▁")` normalizer, no pre-tokenizer, byte-fallback BPE, `<s>`
                added by the post-processor; `tokenizer_class: LlamaTokenizer`, `legacy: false`,
                the Llama 2 chat template; config.json `model_type: llama`. transformers 5
                rebuilds its tokenizer (no normalizer, Metaspace pre-tokenizer)
  llama2_legacy/          the same with `legacy: true`
  codellama/    a CodeLlama folder: the same plus the infilling tokens `▁<PRE>`, `▁<SUF>`,
                `▁<MID>`, `▁<EOT>`, `tokenizer_class: CodeLlamaTokenizer`
  qwen2_variants/<name>/  the byte-level BPE in folders of the Qwen2 and Qwen3 families (model
                types and tokenizer classes transformers 5 rebuilds as Qwen2Tokenizer, and
                some it uses as saved), for `qwen2` ids only
  llama_variants/<name>/  more Llama-class folders for `llama` ids only: other `legacy`,
                `add_prefix_space`, `add_eos_token` settings, and the ones transformers uses
                as saved (byte-level `tokenizer.json`, `model_type: mistral`)
  named/        the byte-level BPE with two named templates (Qwen 2.5 style), `default` in
                chat_template.jinja and `tool_use` in additional_chat_templates/ (5.x layout)
  named_legacy/ the same templates as a list in tokenizer_config.json (4.x layout)
  chatml_generation.jinja   the ChatML template with its `{% generation %}` markers
  samples/      text, code and Unicode documents (one per file) + lines.txt
  chat_<tokenizer>.jsonl   chat records
  chat_tools.jsonl, chat_assistant_first.jsonl   chat records for the named templates
  prompt_completion.jsonl  prompt/completion records
  expected.json ids per tokenizer and sample (`AutoTokenizer(text)`, also truncated to
                16 tokens); `llama`: for every Llama
                folder, transformers' ids of LLAMA_TEXTS with and without special tokens,
                and Python `tokenizers`' ids of the saved `tokenizer.json`; `qwen2`: the
                same for the Qwen2 folders and QWEN2_TEXTS; chat renders,
                ids and assistant masks (also
                with the spec's special tokens overriding the folder's, as
                `AutoTokenizer.from_pretrained(folder, bos_token=..., eos_token=...)`);
                prompt/completion ids, loss masks and whether the prompt's last token
                runs into the completion
"""

import functools
import glob
import json
import os
import re
import sys

import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast
from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES

if int(transformers.__version__.split(".")[0]) < 5:
    sys.exit(f"transformers {transformers.__version__}: the ground truth is transformers 5.x")

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
    # The Llama 2 format written into the record, leading spaces and newlines.
    {"prompt": "<s>[INST] Sum a list? [/INST]", "completion": " Use `sum(xs)`. </s>"},
    {"prompt": "  Indented prompt:", "completion": "\n  indented answer  "},
    # A prompt that ends inside what tokenizers keep as one token: the line break and the
    # indent, a word cut in two.
    {"prompt": "def double(x):\n", "completion": "    return 2 * x\n"},
    {"prompt": "Finish the word: the", "completion": "se"},
]

LINES = "first line\n\n  second line with spaces  \r\nthird: 日本語 👍\n   \nlast\n"

# Where Llama and CodeLlama ids differ between transformers 5 and `tokenizer.json` as saved:
# leading spaces, text right after a special token, the Llama 2 chat format. (No `<FILL_ME>`:
# CodeLlama's tokenizer turns text holding it into an infilling prompt.)
LLAMA_TEXTS = [
    "",
    " ",
    "   ",
    "Hello world",
    " Hello world",
    "  two leading spaces",
    "trailing spaces  ",
    "\n",
    "\nnewline first",
    "line one\nline two\n\n  indented\n",
    "[INST] Write a loop. [/INST]",
    "<s>[INST] Write a loop. [/INST] for x in xs: pass </s>",
    "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello </s><s>[INST] Again [/INST]",
    "<s> [INST] spaced [/INST]",
    "</s>right after",
    "x</s> y",
    "<unk><s></s>",
    "▁<PRE> def f(): ▁<SUF> return 1 ▁<MID>",
    "<PRE> plain <SUF> markers <MID>",
    "日本語のテキスト 👍🏽 Café vs Cafe\u0301",
    "bytes: \x00\x01\x7f \u00ff \U0001F980 \u2603 \ufeff",
    "def fib(n):\n\treturn n if n < 2 else fib(n - 1) + fib(n - 2)  # tab\r\n",
    "ﬁ ㎏ Ω",
    "▁already▁metaspace",
]

# Where the Qwen2 class's pre-tokenizer and normalizer part from GPT-2's byte-level one:
# numbers, runs of newlines and spaces, contractions, composed characters.
QWEN2_TEXTS = LLAMA_TEXTS + [
    "12345 + 678 = 13023",
    "a\n\n\nb  c\t\td   ",
    "it's THEY'RE we'll I'd",
    " 2+2",
    "x<|im_end|>y<|endoftext|> z",
]

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

# Writes an assistant's tool calls; prints `content` where a key that is present is all it asks
# for (a `content: null` would print as `None` unless the key is dropped first, as
# `apply_chat_template` drops the keys holding null).
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
        {{- '<|im_start|>' + message.role + '\n' }}{{- message.content }}{{- '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant\n' }}
        {%- generation %}
        {%- if message.content is defined %}
            {{- message.content }}
        {%- endif %}
        {%- if message.tool_calls is defined %}
            {%- for tool_call in message.tool_calls %}
                {{- '<tool_call>\n' }}{{- tool_call.function | tojson }}{{- '\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>' }}{%- endgeneration %}
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

# In the manner of reasoning models' templates (Qwen3, DeepSeek-R1): the reasoning comes from
# `reasoning_content` or from a `<think>` block at the head of the content; only the answers
# after the last user question keep it (the last one always, empty if need be), so earlier
# turns render differently once a later question follows. Namespaces, reversed slices and
# Python string methods, as those templates use them.
REASONING = """{%- if date_string is defined and show_date is true %}
    {{- '<|im_start|>system\nToday is ' + date_string + '.<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(searching=true, last_question=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- if ns.searching and message.role == 'user' and not (message.content is string and message.content.startswith('<result>')) %}
        {%- set ns.searching = false %}
        {%- set ns.last_question = messages|length - 1 - loop.index0 %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if message.role == 'system' or message.role == 'user' %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set reasoning = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {{- '<|im_start|>assistant\n' }}
        {%- generation %}
        {%- if loop.index0 > ns.last_question and (loop.last or reasoning) %}
            {{- '<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' }}
        {%- endif %}
        {{- content.lstrip('\n') + '<|im_end|>' }}
        {%- endgeneration %}
        {{- '\n' }}
    {%- elif message.role == 'tool' %}
        {{- '<|im_start|>user\n<result>\n' + content + '\n</result><|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

# One question each: every turn renders as it will once later turns follow.
REASONING_ONE_QUESTION_CHATS = [
    {"messages": [
        {"role": "user", "content": "Sum a list?"},
        {"role": "assistant", "content": "<think>\nThe builtin does it.\n</think>\n\nUse `sum(xs)`."},
    ]},
    {"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2 + 2?"},
        {"role": "assistant", "reasoning_content": "\nSmall numbers.\n", "content": "4"},
    ]},
    {"messages": [
        {"role": "user", "content": "Say OK."},
        {"role": "assistant", "content": "OK"},
    ]},
    # Steps with a tool after the one question keep their reasoning.
    {"messages": [
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "reasoning_content": "Ask the tool.", "content": "Checking."},
        {"role": "tool", "content": "{\"temp\": 21}"},
        {"role": "assistant", "content": "<think>It said 21.</think>21 °C."},
    ]},
]

REASONING_KWARGS = {"date_string": "26 Jul 2024", "show_date": True}

# Several questions: earlier answers lose their reasoning once a later question follows.
REASONING_MULTI_QUESTION_CHATS = [
    {"messages": [
        {"role": "user", "content": "Sum a list?"},
        {"role": "assistant", "content": "<think>\nThe builtin.\n</think>\n\nUse `sum(xs)`."},
        {"role": "user", "content": "And a product?"},
        {"role": "assistant", "reasoning_content": "math.prod", "content": "Use `math.prod(xs)`."},
    ]},
    {"messages": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "Bye."},
    ]},
]

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

# Message content that is a number, not text, through the ways templates print content.
NUMBER_TEMPLATE = (
    "{% for m in messages %}[{{ m['content'] }}|{{ m['content'] | trim }}|{{ m['content'] | string }}]"
    "{% endfor %}"
)
NUMBER_CHATS = [
    [{"role": "assistant", "content": x}]
    for x in (1e20, 1e16, 1e15, 6.02214076e23, 1e-05, 2.5e-07, 0.0001, 3.14, -0.0, 1.0, 42, -7, 12345678901234567890)
]

# With tools `transformers` picks the `tool_use` template, without them `default`.
TOOL_CHATS = [
    {"messages": [
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": "Checking."},
        {"role": "tool", "content": "{\"temp\": 21}"},
        {"role": "assistant", "content": "21 °C."},
    ], "tools": [WEATHER_TOOL]},
    # As OpenAI-style APIs write them: `content: null` beside tool calls, `tool_calls: null`,
    # and a user turn with no text.
    {"messages": [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
        ]},
        {"role": "tool", "content": "{\"temp\": 3}"},
        {"role": "assistant", "content": "3 °C.", "tool_calls": None},
        {"role": "user", "content": None},
        {"role": "assistant", "content": "Anything else?"},
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


# ShareGPT's speakers for the roles (axolotl and LLaMA-Factory read them back so).
SHAREGPT_FROM = {"user": "human", "assistant": "gpt"}


def as_sharegpt(record):
    """The record as ShareGPT writes it: `conversations` of `{from, value}` messages."""
    out = {k: v for k, v in record.items() if k != "messages"}
    out["conversations"] = [
        {"from": SHAREGPT_FROM.get(m["role"], m["role"]), "value": m["content"]} for m in record["messages"]
    ]
    return out


def from_sharegpt(record):
    """A ShareGPT record as `{role, content}` messages: `from` the role, `value` the content
    (TRL's `maybe_convert_to_chatml`), ShareGPT's speakers as the roles they stand for."""
    roles = {v: k for k, v in SHAREGPT_FROM.items()}
    out = {k: v for k, v in record.items() if k != "conversations"}
    out["messages"] = [{"role": roles.get(m["from"], m["from"]), "content": m["value"]} for m in record["conversations"]]
    return out


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


METASPACE_SPECIAL = ["<unk>", "<s>", "</s>"]


@functools.cache
def metaspace_json():
    """A SentencePiece-style BPE, trained once: words with their leading `▁` (Metaspace
    pre-tokenizer), byte fallback over the 256 byte tokens, `<unk>`, `<s>`, `</s>` first,
    Llama's decoder; no post-processor."""
    byte_tokens = [f"<0x{i:02X}>" for i in range(256)]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=1500, special_tokens=METASPACE_SPECIAL + byte_tokens, show_progress=False
    )
    tok.train_from_iterator(training_corpus(), trainer)
    return tok.to_str()


def metaspace_bpe(out):
    tok = Tokenizer.from_str(metaspace_json())
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


def llama2_tokenizer_json():
    """tokenizer.json as Llama 2 and CodeLlama ship it (transformers 4.x wrote it from the
    SentencePiece model): `Prepend("▁")` + `Replace(" ", "▁")` normalizer, no pre-tokenizer,
    BPE with byte fallback whose vocabulary holds the 256 byte tokens, `<unk>`, `<s>`, `</s>`
    as the only added tokens, `<s>` added by the post-processor."""
    j = json.loads(metaspace_json())
    j["added_tokens"] = [
        dict(t, normalized=False) for t in j["added_tokens"] if t["content"] in METASPACE_SPECIAL
    ]
    j["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
    ]}
    j["pre_tokenizer"] = None
    bos = [{"SpecialToken": {"id": "<s>", "type_id": 0}}]
    j["post_processor"] = {
        "type": "TemplateProcessing",
        "single": bos + [{"Sequence": {"id": "A", "type_id": 0}}],
        "pair": bos + [{"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}},
    }
    return j


def added_token(content):
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": True}


def hub_folder(out, tokenizer_json, config, model_type="llama"):
    """Writes a folder by hand, as the Hub has them (transformers' own `save_pretrained` would
    write its rebuilt tokenizer instead)."""
    os.makedirs(out, exist_ok=True)
    vocab = tokenizer_json["model"]["vocab"]
    config = dict(config, added_tokens_decoder={
        str(t["id"]): added_token(t["content"]) for t in tokenizer_json["added_tokens"]
    })
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_json, f, ensure_ascii=False)
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
    if model_type is not None:
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump({"model_type": model_type, "vocab_size": len(vocab), "bos_token_id": 1, "eos_token_id": 2}, f)


LLAMA2_CONFIG = {
    "add_bos_token": True,
    "add_eos_token": False,
    "bos_token": "<s>",
    "eos_token": "</s>",
    "unk_token": "<unk>",
    "pad_token": None,
    "clean_up_tokenization_spaces": False,
    "legacy": False,
    "model_max_length": 4096,
    "padding_side": "right",
    "sp_model_kwargs": {},
    "tokenizer_class": "LlamaTokenizer",
    "chat_template": without_generation_tags(LLAMA2),
}


def llama2(out, **changes):
    hub_folder(out, llama2_tokenizer_json(), dict(LLAMA2_CONFIG, **changes))


CODE_LLAMA_TOKENS = ["▁<PRE>", "▁<SUF>", "▁<MID>", "▁<EOT>"]


def code_llama_tokenizer_json():
    """Llama 2's tokenizer.json plus CodeLlama's infilling tokens, in the vocabulary and added."""
    j = llama2_tokenizer_json()
    for token in CODE_LLAMA_TOKENS:
        token_id = len(j["model"]["vocab"])
        j["model"]["vocab"][token] = token_id
        j["added_tokens"].append(dict(added_token(token), id=token_id))
    return j


def code_llama(out, tokenizer_json=None, **changes):
    config = dict(
        LLAMA2_CONFIG,
        tokenizer_class="CodeLlamaTokenizer",
        legacy=None,
        additional_special_tokens=["▁<PRE>", "▁<MID>", "▁<SUF>", "▁<EOT>"],
        prefix_token="▁<PRE>",
        middle_token="▁<MID>",
        suffix_token="▁<SUF>",
        eot_token="▁<EOT>",
        fill_token="<FILL_ME>",
        use_default_system_prompt=False,
        **changes,
    )
    hub_folder(out, tokenizer_json or code_llama_tokenizer_json(), config)


def llama_variants(out):
    """Llama-class folders for the `llama` ids: name -> folder."""
    with_eos = code_llama_tokenizer_json()
    eos = {"SpecialToken": {"id": "</s>", "type_id": 0}}
    with_eos["post_processor"]["single"].append(eos)
    with_eos["post_processor"]["special_tokens"]["</s>"] = {"id": "</s>", "ids": [2], "tokens": ["</s>"]}
    with open(os.path.join(out, "bpe", "tokenizer.json"), encoding="utf-8") as f:
        byte_level = json.load(f)
    legacy_absent = dict(LLAMA2_CONFIG, tokenizer_class="LlamaTokenizerFast")
    legacy_absent.pop("legacy")
    variants = {
        # `legacy` absent is transformers' default (False); the `Fast` name is the same class.
        "legacy_absent": lambda d: hub_folder(d, llama2_tokenizer_json(), legacy_absent),
        "legacy_null": lambda d: llama2(d, legacy=None),
        "no_prefix_space": lambda d: llama2(d, add_prefix_space=False),
        # transformers 5 ignores `add_eos_token` when there is a tokenizer.json: the file's
        # post-processor for LlamaTokenizer, `<s> $A` for CodeLlamaTokenizer.
        "llama_eos": lambda d: hub_folder(d, with_eos, dict(LLAMA2_CONFIG, add_eos_token=True)),
        "code_llama_eos": lambda d: code_llama(d, tokenizer_json=with_eos, add_eos_token=True),
        "code_llama_no_prefix_space": lambda d: code_llama(d, add_prefix_space=False),
        "no_model_config": lambda d: hub_folder(d, llama2_tokenizer_json(), LLAMA2_CONFIG, model_type=None),
        # Used as saved: a Mistral model's folder, a byte-level (Llama 3 style) tokenizer.json.
        "mistral": lambda d: hub_folder(d, llama2_tokenizer_json(), LLAMA2_CONFIG, model_type="mistral"),
        "byte_level": lambda d: hub_folder(
            d, byte_level, dict(LLAMA2_CONFIG, tokenizer_class="LlamaTokenizerFast",
                                bos_token="<|im_start|>", eos_token="<|im_end|>", unk_token=None)),
    }
    folders = {}
    for name, build in variants.items():
        folder = os.path.join(out, "llama_variants", name)
        build(folder)
        folders[f"llama_variants/{name}"] = folder
    return folders


def qwen2_variants(out):
    """Folders of the Qwen2 and Qwen3 families around the byte-level BPE, whose pre-tokenizer
    is GPT-2's (numbers in one piece): name -> folder. transformers 5 rebuilds most of them
    with Qwen's pre-tokenizer (digits one by one) and NFC; the tests learn which from it."""
    with open(os.path.join(out, "bpe", "tokenizer.json"), encoding="utf-8") as f:
        byte_level = json.load(f)
    base = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None, "unk_token": None}
    variants = {
        "qwen2_backend": ("qwen2", {"tokenizer_class": "TokenizersBackend"}),
        "qwen2_generic": ("qwen2", {"tokenizer_class": "PreTrainedTokenizerFast"}),
        "qwen2_own_class": ("qwen2", {"tokenizer_class": "Qwen2TokenizerFast"}),
        "qwen2_no_class": ("qwen2", {}),
        "qwen2_prefix_space": ("qwen2", {"tokenizer_class": "Qwen2Tokenizer", "add_prefix_space": True}),
        "qwen2_remote_code": ("qwen2", {"tokenizer_class": "Qwen2Tokenizer",
                                        "auto_map": {"AutoTokenizer": ["tokenization.Custom", None]}}),
        "qwen2_remote_code_generic": ("qwen2", {"tokenizer_class": "PreTrainedTokenizerFast",
                                                "auto_map": {"AutoTokenizer": ["tokenization.Custom", None]}}),
        "qwen2_remote_code_no_class": ("qwen2", {"auto_map": {"AutoTokenizer": ["tokenization.Custom", None]}}),
        "qwen2_old_remote_code": ("qwen2", {"tokenizer_class": "PreTrainedTokenizerFast",
                                            "auto_map": ["tokenization.Custom", None]}),
        "qwen2_model_code_generic": ("qwen2", {"tokenizer_class": "PreTrainedTokenizerFast",
                                               "auto_map": {"AutoModel": "modeling.Custom"}}),
        "qwen3_remote_code": ("qwen3", {"tokenizer_class": "Qwen2Tokenizer",
                                        "auto_map": {"AutoTokenizer": ["tokenization.Custom", None]}}),
        "mistral_with_qwen2_class": ("mistral", {"tokenizer_class": "Qwen2Tokenizer"}),
        "internvl_no_class": ("internvl", {}),
        "qwen3_generic": ("qwen3", {"tokenizer_class": "PreTrainedTokenizerFast"}),
        "qwen3_own_class": ("qwen3", {"tokenizer_class": "Qwen2Tokenizer"}),
        "qwen3_no_class": ("qwen3", {}),
        "qwen2_moe_backend": ("qwen2_moe", {"tokenizer_class": "TokenizersBackend"}),
        "llama_with_qwen2_class": ("llama", {"tokenizer_class": "Qwen2Tokenizer"}),
    }
    folders = {}
    for name, (model_type, changes) in variants.items():
        folder = os.path.join(out, "qwen2_variants", name)
        hub_folder(folder, byte_level, dict(base, **changes), model_type=model_type)
        folders[f"qwen2_variants/{name}"] = folder
    return folders


REBUILT_CLASSES = ("LlamaTokenizer", "CodeLlamaTokenizer", "Qwen2Tokenizer")


def rebuild_expectations(folder, texts):
    """transformers' ids of `texts`, with and without special tokens, and those of the saved
    tokenizer.json, so the tests can tell the folders transformers rebuilds."""
    fast = AutoTokenizer.from_pretrained(folder)
    tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    return {
        "class": type(fast).__name__,
        "rebuilt": type(fast).__name__ in REBUILT_CLASSES,
        "with_special": [fast(t)["input_ids"] for t in texts],
        "without_special": [fast(t, add_special_tokens=False)["input_ids"] for t in texts],
        "tokenizer_json": [tok.encode(t).ids for t in texts],
    }


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


def reasoning_folder(bpe, out):
    """A copy of the byte-level BPE folder with the reasoning template as model folders ship
    such templates: without `{% generation %}` markers."""
    fast = AutoTokenizer.from_pretrained(bpe)
    fast.chat_template = without_generation_tags(REASONING)
    fast.save_pretrained(out)


def renders_as_growing_prefixes(fast, messages):
    """Whether each prefix of the conversation renders as the start of the whole."""
    full = fast.apply_chat_template(messages, tokenize=False)
    return all(
        full.startswith(fast.apply_chat_template(messages[:i], tokenize=False))
        for i in range(1, len(messages))
    )


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
        # The prompt ends inside a token that also holds the completion's first characters.
        merged = any(start < len(prompt) < end for start, end in offsets)
        out.append({"ids": list(encoded["input_ids"]), "mask": mask, "merged": merged})
    return out


def chat_expectations(fast, template_with_tags, chats, **kwargs):
    """What `fast.apply_chat_template` makes of each record with the template it picks; the
    assistant mask comes from the same template with its `{% generation %}` markers
    (`template_with_tags`: the template, or a dict of them by name). `kwargs` go to every
    call, as the template's further variables."""
    out = []
    for record in chats:
        messages, tools = record["messages"], record.get("tools")
        if isinstance(template_with_tags, dict):
            picked = fast.get_chat_template(None, tools)
            (name,) = [n for n, t in template_with_tags.items() if without_generation_tags(t) == picked]
            tagged = template_with_tags[name]
        else:
            tagged = template_with_tags
        assert fast.apply_chat_template(messages, tools=tools, tokenize=False, **kwargs) == \
            fast.apply_chat_template(messages, tools=tools, tokenize=False, **kwargs,
                                     chat_template=without_generation_tags(tagged)), \
            "the folder's template is the tagged one without its markers"
        text = fast.apply_chat_template(
            messages, tools=tools, tokenize=False, chat_template=tagged, **kwargs
        )
        plain = fast.apply_chat_template(
            messages, tools=tools, tokenize=False, **kwargs,
            chat_template=without_generation_tags(tagged),
        )
        assert text == plain, "the markers must not change the rendering"
        encoded = fast.apply_chat_template(
            messages,
            tools=tools,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
            **kwargs,
            chat_template=tagged,
        )
        out.append(
            {
                "text": text,
                "ids": list(encoded["input_ids"]),
                "assistant_mask": list(encoded["assistant_masks"]),
                # Whether the chat already ends with the end-of-document token (whitespace
                # after it aside): nothing need end it again in a packed sequence.
                "ends_with_eos": text.rstrip().endswith(fast.eos_token),
            }
        )
    return out


def as_prompt_completion(record):
    """The record as TRL's conversational prompt-completion: its last message the completion."""
    out = {k: v for k, v in record.items() if k != "messages"}
    out["prompt"], out["completion"] = record["messages"][:-1], record["messages"][-1:]
    return out


def prompt_completion_chat_expectations(fast, records):
    """What TRL's SFTTrainer makes of conversational prompt-completion records (its
    completion-only loss): the ids of prompt and completion together, trained from where the
    prompt's ids, rendered with the generation prompt, end."""
    out = []
    for record in records:
        tools = record.get("tools")
        messages = record["prompt"] + record["completion"]
        prompt_ids = fast.apply_chat_template(
            record["prompt"], tools=tools, add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
        ids = fast.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True)["input_ids"]
        assert ids[: len(prompt_ids)] == prompt_ids, "the prompt's ids start those of the whole"
        text = fast.apply_chat_template(messages, tools=tools, tokenize=False)
        out.append(
            {
                "ids": list(ids),
                "assistant_mask": [0] * len(prompt_ids) + [1] * (len(ids) - len(prompt_ids)),
                "ends_with_eos": text.rstrip().endswith(fast.eos_token),
            }
        )
    return out


# `max_length` of the truncated samples.
TRUNCATED_TO = 16


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
        "llama2": (llama2, LLAMA2),
        "llama2_legacy": (lambda folder: llama2(folder, legacy=True), LLAMA2),
        "codellama": (code_llama, LLAMA2),
    }
    for name, (build, template) in builders.items():
        folder = os.path.join(out, name)
        build(folder)
        # What a user's transformers makes of the saved folder is the ground truth.
        fast = AutoTokenizer.from_pretrained(folder)
        with open(os.path.join(out, f"chat_{name}.jsonl"), "w", encoding="utf-8") as f:
            for record in CHATS:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
        expected["tokenizers"][name] = {
            "eos_id": fast.convert_tokens_to_ids(fast.eos_token),
            "samples": {s: fast(SAMPLES[s])["input_ids"] for s in sorted(SAMPLES)},
            "truncated": {
                s: fast(SAMPLES[s], truncation=True, max_length=TRUNCATED_TO)["input_ids"] for s in sorted(SAMPLES)
            },
            "lines": [fast(l)["input_ids"] for l in line_docs],
            "chats": chat_expectations(fast, template, CHATS),
            "prompt_completion_chats": prompt_completion_chat_expectations(
                fast, [as_prompt_completion(r) for r in CHATS]
            ),
            "prompt_completion": prompt_completion_expectations(fast, PROMPT_COMPLETIONS),
        }
    without_eos_in_tokenizer_config(os.path.join(out, "metaspace"), os.path.join(out, "metaspace_config_eos"))

    # The same conversations as TRL's conversational prompt-completion records.
    with open(os.path.join(out, "chat_prompt_completion.jsonl"), "w", encoding="utf-8") as f:
        for record in CHATS:
            f.write(json.dumps(as_prompt_completion(record), ensure_ascii=False) + "\n")

    # The same conversations in ShareGPT's form: read back, they are `CHATS`, so
    # their ids and masks are those above.
    with open(os.path.join(out, "chat_sharegpt.jsonl"), "w", encoding="utf-8") as f:
        for record in CHATS:
            assert from_sharegpt(as_sharegpt(record)) == record
            f.write(json.dumps(as_sharegpt(record), ensure_ascii=False) + "\n")
    # And as ShareGPT dumps hold them: one JSON array, indented, as `json.dump` writes it.
    with open(os.path.join(out, "chat_sharegpt.json"), "w", encoding="utf-8") as f:
        json.dump([as_sharegpt(record) for record in CHATS], f, ensure_ascii=False, indent=2)

    # The spec's special tokens stand in for the folder's, in the template too.
    overrides = {"bos_token": "</s>", "eos_token": "<unk>"}
    fast = AutoTokenizer.from_pretrained(os.path.join(out, "metaspace"), **overrides)
    expected["overrides"] = {
        **overrides,
        "eos_id": fast.convert_tokens_to_ids(fast.eos_token),
        "chats": chat_expectations(fast, LLAMA2, CHATS),
    }

    llama_folders = {name: os.path.join(out, name) for name in ("llama2", "llama2_legacy", "codellama")}
    llama_folders.update(llama_variants(out))
    expected["llama"] = {
        "texts": LLAMA_TEXTS,
        "folders": {name: rebuild_expectations(folder, LLAMA_TEXTS) for name, folder in llama_folders.items()},
    }
    expected["qwen2"] = {
        "model_types": sorted(
            model_type
            for model_type, name in TOKENIZER_MAPPING_NAMES.items()
            if name and name.removesuffix("Fast") == "Qwen2Tokenizer"
        ),
        "texts": QWEN2_TEXTS,
        "folders": {
            name: rebuild_expectations(folder, QWEN2_TEXTS) for name, folder in qwen2_variants(out).items()
        },
    }
    # The spec's special tokens: CodeLlama's rebuilt post-processor adds the bos_token given.
    expected["llama"]["overrides"] = {**overrides, "folders": {}}
    for name in ("llama2", "codellama"):
        fast = AutoTokenizer.from_pretrained(llama_folders[name], **overrides)
        expected["llama"]["overrides"]["folders"][name] = [fast(t)["input_ids"] for t in LLAMA_TEXTS]

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
    reasoning = os.path.join(out, "reasoning")
    reasoning_folder(os.path.join(out, "bpe"), reasoning)
    with open(os.path.join(out, "reasoning_generation.jinja"), "w", encoding="utf-8") as f:
        f.write(REASONING)
    fast = AutoTokenizer.from_pretrained(reasoning)
    expected["reasoning"] = {}
    for name, records, growing in (
        ("one_question", REASONING_ONE_QUESTION_CHATS, True),
        ("multi_question", REASONING_MULTI_QUESTION_CHATS, False),
    ):
        for record in records:
            assert renders_as_growing_prefixes(fast, record["messages"]) == growing, record
        with open(os.path.join(out, f"chat_reasoning_{name}.jsonl"), "w", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
        expected["reasoning"][name] = chat_expectations(fast, REASONING, records)
    # `apply_chat_template(messages, **kwargs)`: further variables of the template.
    expected["reasoning"]["kwargs"] = {
        "kwargs": REASONING_KWARGS,
        "chats": chat_expectations(fast, REASONING, REASONING_ONE_QUESTION_CHATS, **REASONING_KWARGS),
    }
    # Numbers where text is expected (a JSONL answer written as a number): printed, and
    # through `string` and `trim`, as Jinja in Python writes them.
    fast = AutoTokenizer.from_pretrained(os.path.join(out, "bpe"))
    expected["numbers"] = {
        "template": NUMBER_TEMPLATE,
        "renderings": [
            {
                "messages": messages,
                "text": fast.apply_chat_template(messages, chat_template=NUMBER_TEMPLATE, tokenize=False),
            }
            for messages in NUMBER_CHATS
        ],
    }
    with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
