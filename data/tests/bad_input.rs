//! Bad input: each case is an error naming the file (and the record's line) with what to do,
//! `on_bad_record: skip` skips what can be skipped, and a failed preparation leaves nothing
//! in the cache folder but its lock file.

mod common;

use common::*;
use shardrun_data::packing::{Row, IGNORE};
use shardrun_data::{DataError, Dataset, Quiet};
use shardrun_protocol::config::*;
use std::path::{Path, PathBuf};

fn jsonl(files: Vec<PathBuf>) -> DataSource {
    DataSource::Jsonl {
        files,
        text: JsonlText::Field {
            field: "text".into(),
        },
    }
}

fn open(config: &DatasetConfig, vocab: Option<u64>) -> Result<Dataset, DataError> {
    Dataset::open(config, 0, vocab, 2, &Quiet)
}

/// The error of opening `config`, checked to leave no cache behind.
fn fails(config: &DatasetConfig, vocab: Option<u64>) -> String {
    let err = open(config, vocab).err().expect("must fail").to_string();
    let left = cache_entries(&config.cache_dir);
    assert!(left.is_empty(), "a failed preparation left {left:?}");
    err
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// With `on_bad_record: stop`, a bad record at the end of the data stops the preparation
/// before anything is encoded, for text as for JSONL: the 16 MB document before it, whose
/// batch would be warned of as it is encoded, is never reached.
#[test]
fn a_bad_record_at_the_end_stops_before_anything_is_encoded() {
    let dir = tempfile::tempdir().unwrap();
    let big = "word ".repeat(3_400_000);
    let first = write(dir.path(), "a.txt", &big);
    let bad = dir.path().join("b.txt");
    std::fs::write(&bad, b"fine\n\xff not text\n").unwrap();
    let first_jsonl = write(
        dir.path(),
        "a.jsonl",
        &format!("{}\n", serde_json::json!({ "text": big })),
    );
    let bad_jsonl = write(dir.path(), "b.jsonl", "{\"text\": \"ok\"}\nnot json\n");
    for (source, bad, line) in [
        (
            text_files(vec![first, bad.clone()], TextSplit::File),
            &bad,
            2,
        ),
        (jsonl(vec![first_jsonl, bad_jsonl.clone()]), &bad_jsonl, 2),
    ] {
        let config = dataset(source, TokenizerConfig::Bytes, 8, &dir.path().join("cache"));
        let said = Lines::default();
        let err = Dataset::open(&config, 0, None, 2, &said)
            .err()
            .expect("must fail")
            .to_string();
        assert!(
            err.starts_with(&format!("{}:{line}: ", bad.display())),
            "{err}"
        );
        let said = said.0.lock().unwrap().join("\n");
        assert!(!said.contains("is one document of 17.0 MB"), "{said}");
    }
}

#[test]
fn unreadable_empty_and_missing_files() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let good = write(dir.path(), "good.txt", "some text\n");

    // Running as root reads anything: a symlink loop is a file no one can read.
    let looped = dir.path().join("loop.txt");
    std::os::unix::fs::symlink(&looped, &looped).unwrap();
    let c = dataset(
        text_files(vec![good.clone(), looped.clone()], TextSplit::File),
        TokenizerConfig::Bytes,
        8,
        &cache,
    );
    let err = fails(&c, None);
    assert!(
        err.starts_with(&format!(
            "cannot read {}: Too many levels of symbolic links",
            looped.display()
        )),
        "{err}"
    );

    let empty = write(dir.path(), "empty.txt", "");
    let c = dataset(
        text_files(vec![good.clone(), empty.clone()], TextSplit::File),
        TokenizerConfig::Bytes,
        8,
        &cache,
    );
    let err = fails(&c, None);
    assert_eq!(
        err,
        format!(
            "{}: the file is empty; fix or remove it, or set `data.on_bad_record: skip` to skip bad records",
            empty.display()
        )
    );
    let mut skipping = c.clone();
    skipping.on_bad_record = OnBadRecord::Skip;
    let data = open(&skipping, None).unwrap();
    assert_eq!(data.train().corpus().manifest.skipped_records, 1);
    assert_eq!(data.train().corpus().documents(), 1);
    // The description says so, from the cache as well as when it was made.
    let warning = format!(
        "warning: 1 bad record(s) of the training data skipped (data.on_bad_record: skip): {}: the file is empty",
        empty.display()
    );
    assert!(data.summary().contains(&warning), "{:?}", data.summary());
    let cached = open(&skipping, None).unwrap();
    assert!(!cached.built());
    assert!(
        cached.summary().contains(&warning),
        "{:?}",
        cached.summary()
    );

    let c = dataset(
        text_files(vec![dir.path().join("nope/*.txt")], TextSplit::File),
        TokenizerConfig::Bytes,
        8,
        &dir.path().join("cache2"),
    );
    assert!(fails(&c, None).starts_with("no file matches"));
}

#[test]
fn a_records_file_without_records_is_a_bad_record_as_an_empty_file_is() {
    // Among files that hold records, one that holds none is named, not silently nothing.
    let dir = tempfile::tempdir().unwrap();
    let good = write(dir.path(), "good.jsonl", "{\"text\": \"one\"}\n");
    let cases = [
        (
            "empty.json",
            " [\n ]\n",
            "the file is an empty JSON array `[]`",
        ),
        (
            "blank.jsonl",
            "\u{feff}\n  \r\n\n",
            "the file holds only white space",
        ),
    ];
    for (i, (name, text, why)) in cases.into_iter().enumerate() {
        let none = write(dir.path(), name, text);
        let cache = dir.path().join(format!("cache-{i}"));
        let c = dataset(
            jsonl(vec![good.clone(), none.clone()]),
            TokenizerConfig::Bytes,
            8,
            &cache,
        );
        let err = fails(&c, None);
        assert!(
            err.starts_with(&format!("{}: {why}; ", none.display())),
            "{err}"
        );
        let mut skipping = c.clone();
        skipping.on_bad_record = OnBadRecord::Skip;
        let data = open(&skipping, None).unwrap();
        assert_eq!(data.train().corpus().manifest.skipped_records, 1);
        assert_eq!(data.train().corpus().documents(), 1);
    }
}

#[test]
fn jsonl_records_that_are_not_json_or_lack_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let path = write(
        dir.path(),
        "d.jsonl",
        "{\"text\": \"one\"}\n{\"text\": \"two\"}\n{\"text\": \"thr\n{\"text\": \"four\"}\n",
    );
    let c = dataset(jsonl(vec![path.clone()]), TokenizerConfig::Bytes, 8, &cache);
    let err = fails(&c, None);
    assert!(
        err.starts_with(&format!("{}:3: not a JSON record (", path.display())),
        "{err}"
    );
    assert!(
        err.ends_with("or set `data.on_bad_record: skip` to skip bad records"),
        "{err}"
    );

    let mut skipping = c.clone();
    skipping.on_bad_record = OnBadRecord::Skip;
    let data = open(&skipping, None).unwrap();
    let m = &data.train().corpus().manifest;
    assert_eq!((m.documents, m.skipped_records), (3, 1));
    assert!(m.skipped_examples[0].starts_with(&format!("{}:3:", path.display())));
    // When the data then fails, the records left out are said before the error.
    let lines = Lines::default();
    let mut too_small = skipping.clone();
    too_small.validation = Some(ValidationConfig {
        held_out: HeldOut::Fraction { fraction: 0.9 },
        every_steps: None,
        max_batches: None,
    });
    assert!(Dataset::open(&too_small, 0, None, 2, &lines).is_err());
    let said = lines.0.lock().unwrap().join("\n");
    assert!(
        said.contains("warning: 1 bad record(s) of the training data skipped"),
        "{said}"
    );

    let missing = write(
        dir.path(),
        "m.jsonl",
        "{\"text\": \"ok\"}\n{\"body\": \"no text\"}\n",
    );
    let c = dataset(
        jsonl(vec![missing.clone()]),
        TokenizerConfig::Bytes,
        8,
        &dir.path().join("cache2"),
    );
    let err = fails(&c, None);
    assert!(
        err.starts_with(&format!(
            "{}:2: no field `text` in the record (it has: body)",
            missing.display()
        )),
        "{err}"
    );

    // A dotted name says what is there where it stops reaching.
    let nested = write(
        dir.path(),
        "n.jsonl",
        "{\"doc\": {\"text\": \"ok\"}}\n{\"doc\": {\"path\": \"a.py\"}, \"id\": 2}\n{\"doc\": \"flat\"}\n",
    );
    let dotted = |cache: &str| {
        dataset(
            DataSource::Jsonl {
                files: vec![nested.clone()],
                text: JsonlText::Field {
                    field: "doc.text".into(),
                },
            },
            TokenizerConfig::Bytes,
            8,
            &dir.path().join(cache),
        )
    };
    let err = fails(&dotted("cache3"), None);
    assert!(
        err.starts_with(&format!(
            "{}:2: no field `doc.text` in the record (`doc` has: path)",
            nested.display()
        )),
        "{err}"
    );
    std::fs::write(
        &nested,
        "{\"doc\": {\"text\": \"ok\"}}\n{\"doc\": \"flat\"}\n",
    )
    .unwrap();
    let err = fails(&dotted("cache4"), None);
    assert!(
        err.starts_with(&format!(
            "{}:2: no field `doc.text` in the record (`doc` is not an object)",
            nested.display()
        )),
        "{err}"
    );
    // Lacked by the first record: the string where the name stops is the one likely meant.
    std::fs::write(
        &nested,
        "{\"doc\": {\"content\": \"hello\", \"n\": 3}, \"id\": 3}\n",
    )
    .unwrap();
    let err = fails(&dotted("cache5"), None);
    assert!(
        err.contains("(`doc` has: content, n)")
            && err.contains("did you mean `field: doc.content`?"),
        "{err}"
    );
}

/// A blank text (as datasets exported with their empty rows have: wikitext's `""`) or a blank
/// completion would train nothing but the end-of-document token: a bad record, as an empty
/// text file is. An empty prompt is an unconditioned completion, and kept.
#[test]
fn blank_texts_and_completions_are_bad_records() {
    let dir = tempfile::tempdir().unwrap();
    let texts = write(
        dir.path(),
        "t.jsonl",
        "{\"text\": \"one\"}\n{\"text\": \"\"}\n{\"text\": \" \\n \"}\n{\"text\": \"four\"}\n",
    );
    let c = dataset(
        jsonl(vec![texts.clone()]),
        TokenizerConfig::Bytes,
        8,
        &dir.path().join("c1"),
    );
    let err = fails(&c, None);
    assert!(
        err.starts_with(&format!(
            "{}:2: field `text` is empty: nothing to train on",
            texts.display()
        )),
        "{err}"
    );
    let mut skipping = c.clone();
    skipping.on_bad_record = OnBadRecord::Skip;
    let data = open(&skipping, None).unwrap();
    let m = &data.train().corpus().manifest;
    assert_eq!((m.documents, m.skipped_records), (2, 2));
    // "one" and "four", each with its end-of-document token.
    assert_eq!(m.tokens, 3 + 1 + 4 + 1);

    let pairs = write(
        dir.path(),
        "p.jsonl",
        "{\"q\": \"\", \"a\": \"unprompted\"}\n{\"q\": \"asked\", \"a\": \"\"}\n",
    );
    let source = DataSource::Jsonl {
        files: vec![pairs.clone()],
        text: JsonlText::PromptCompletion {
            prompt: "q".into(),
            completion: "a".into(),
        },
    };
    let c = dataset(source, TokenizerConfig::Bytes, 16, &dir.path().join("c2"));
    let err = fails(&c, None);
    assert!(
        err.starts_with(&format!(
            "{}:2: field `a` is empty: nothing to train on",
            pairs.display()
        )),
        "{err}"
    );
}

/// Chat data from `path`, the messages in `field`, rendered by the tokenizer's template.
fn chat(path: &Path, field: &str) -> DataSource {
    DataSource::Chat {
        files: vec![path.to_path_buf()],
        messages_field: field.into(),
        chat_template: None,
        chat_template_kwargs: Default::default(),
    }
}

#[test]
fn a_json_array_of_records_is_read_and_its_bad_records_named_by_line() {
    // Alpaca's `alpaca_data.json`: one array of objects, as `json.dump(indent=4)` writes it.
    let dir = tempfile::tempdir().unwrap();
    let records = [
        r#"{"instruction": "Add 2 and 2.", "output": "4"}"#,
        r#"{"instruction": "Say hi."}"#,
        r#"{"instruction": "Name a colour [red, ...].", "output": "Blue, \"sky\" blue."}"#,
    ];
    let text = format!(
        "[
    {},
    {},
    {}
]
",
        records[0], records[1], records[2]
    );
    let path = write(dir.path(), "alpaca_data.json", &text);
    let pairs = DataSource::Jsonl {
        files: vec![path.clone()],
        text: JsonlText::PromptCompletion {
            prompt: "instruction".into(),
            completion: "output".into(),
        },
    };
    let c = dataset(
        pairs.clone(),
        TokenizerConfig::Bytes,
        64,
        &dir.path().join("a"),
    );
    let err = fails(&c, None);
    assert!(
        err.starts_with(&format!(
            "{}:3: no field `output` in the record",
            path.display()
        )),
        "{err}"
    );
    let mut c = dataset(
        pairs.clone(),
        TokenizerConfig::Bytes,
        64,
        &dir.path().join("b"),
    );
    c.on_bad_record = OnBadRecord::Skip;
    let data = open(&c, None).unwrap();
    let docs = documents(data.train().corpus());
    let texts: Vec<String> = docs
        .iter()
        .map(|(tokens, _)| {
            tokens
                .iter()
                .filter(|&&t| t < 256)
                .map(|&t| t as u8 as char)
                .collect()
        })
        .collect();
    assert_eq!(
        texts,
        [
            "Add 2 and 2.4",
            r#"Name a colour [red, ...].Blue, "sky" blue."#
        ]
    );

    // A record not JSON past its first line: the file's line where.
    let broken = write(
        dir.path(),
        "broken.json",
        "[\n  {\n    \"instruction\": \"a\",\n    \"output\" \"b\"\n  }\n]\n",
    );
    let c = dataset(
        pairs.with_files(vec![broken.clone()]),
        TokenizerConfig::Bytes,
        64,
        &dir.path().join("d"),
    );
    let err = fails(&c, None);
    assert!(
        err.starts_with(&format!(
            "{}:2: not a JSON record (expected `:` at line 4, column 14)",
            broken.display()
        )),
        "{err}"
    );

    // Cut short inside the last record: named where that record starts.
    let good = format!("[\n    {},\n    {}\n]\n", records[0], records[2]);
    let cut = write(dir.path(), "cut.json", &good[..good.len() - 12]);
    let c = dataset(
        pairs.with_files(vec![cut.clone()]),
        TokenizerConfig::Bytes,
        64,
        &dir.path().join("c"),
    );
    let err = fails(&c, None);
    assert!(
        err.starts_with(&format!(
            "{}:3: the file ends inside this record of the JSON array: it is cut short; the \
             rest of the file is not read",
            cut.display()
        )),
        "{err}"
    );
}

/// Chat data whose second record answers the user with `reply` (a message as JSON), and the
/// error preparing it fails with.
fn second_chat_record_with(reply: &str) -> (tempfile::TempDir, PathBuf, String) {
    let dir = tempfile::tempdir().unwrap();
    let record = |reply: &str| {
        format!("{{\"messages\": [{{\"role\": \"user\", \"content\": \"hi\"}}, {reply}]}}\n")
    };
    let good = record("{\"role\": \"assistant\", \"content\": \"yo\"}");
    let path = write(
        dir.path(),
        "chat.jsonl",
        &format!("{good}{}", record(reply)),
    );
    let source = chat(&path, "messages");
    let c = dataset(source, hf("bpe"), 32, &dir.path().join("cache"));
    let err = fails(&c, None);
    (dir, path, err)
}

#[test]
fn chat_record_with_an_unknown_role() {
    let (_dir, path, err) = second_chat_record_with("{\"role\": \"robot\", \"content\": \"beep\"}");
    assert!(
        err.starts_with(&format!(
            "{}:2: message 2 has role `robot`; chat data takes the roles system, developer, user, assistant, tool, ipython",
            path.display()
        )),
        "{err}"
    );
}

#[test]
fn chat_message_with_its_text_under_another_key() {
    // Templates print a missing `content` as nothing; preparing must not train on it.
    let (_dir, path, err) = second_chat_record_with("{\"role\": \"assistant\", \"text\": \"yo\"}");
    assert!(
        err.starts_with(&format!(
            "{}:2: message 2 has no `content` (it has: role, text); a message holds its text in \
             `content` (ShareGPT's `value`), or is an assistant's `tool_calls`",
            path.display()
        )),
        "{err}"
    );
}

#[test]
fn skipped_records_are_named_in_file_order_whichever_step_refused_them() {
    // Line 2 reads but its template fails; line 3 does not read at all.
    let dir = tempfile::tempdir().unwrap();
    let good = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}";
    let parts = "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"hi\"}]}, {\"role\": \"assistant\", \"content\": \"yo\"}]}";
    let path = write(
        dir.path(),
        "chat.jsonl",
        &format!("{good}\n{parts}\n{{\"messages\": \n{good}\n"),
    );
    let mut c = dataset(
        chat(&path, "messages"),
        hf("bpe"),
        64,
        &dir.path().join("cache"),
    );
    c.on_bad_record = OnBadRecord::Skip;
    let data = open(&c, None).unwrap();
    let m = &data.train().corpus().manifest;
    assert_eq!((m.documents, m.skipped_records), (2, 2));
    let lines: Vec<&str> = m
        .skipped_examples
        .iter()
        .map(|e| e.strip_prefix(&format!("{}:", path.display())).unwrap())
        .collect();
    assert!(
        lines[0].starts_with("2: the chat template failed") && lines[1].starts_with("3: "),
        "{lines:?}"
    );
}

#[test]
fn sharegpt_messages_from_a_speaker_without_a_role_are_named() {
    // Tool-calling ShareGPT sets (glaive, ToolBench) write `observation` and `function_call`:
    // no role a chat template knows.
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "sharegpt.jsonl",
        "{\"conversations\": [{\"from\": \"human\", \"value\": \"hi\"}, {\"from\": \"gpt\", \"value\": \"yo\"}]}\n\
         {\"conversations\": [{\"from\": \"human\", \"value\": \"hi\"}, {\"from\": \"observation\", \"value\": \"{}\"}]}\n",
    );
    let source = chat(&path, "conversations");
    let c = dataset(source, hf("bpe"), 32, &dir.path().join("cache"));
    let err = fails(&c, None);
    assert!(
        err.starts_with(&format!(
            "{}:2: message 2 is from `observation`; chat data takes ShareGPT's `from` human, gpt \
             (read as user, assistant) and the roles system, developer, user, assistant, tool, ipython \
             (any case)",
            path.display()
        )),
        "{err}"
    );
    // Read with the default field: the record's fields, and the one meant.
    let c = dataset(
        chat(&path, "messages"),
        hf("bpe"),
        32,
        &dir.path().join("default-field"),
    );
    let err = fails(&c, None);
    assert!(
        err.starts_with(&format!(
            "{}:1: no field `messages` (the messages) in the record, nor `prompt` and \
             `completion` lists of messages (it has: conversations)",
            path.display()
        )) && err.contains("did you mean `messages_field: conversations`?"),
        "{err}"
    );
    // Every record skipped: the fix names how chat records are read.
    let only_bad = write(
        dir.path(),
        "observations.jsonl",
        "{\"conversations\": [{\"from\": \"observation\", \"value\": \"{}\"}]}\n",
    );
    let mut c = dataset(
        chat(&only_bad, "conversations"),
        hf("bpe"),
        32,
        &dir.path().join("cache"),
    );
    c.on_bad_record = OnBadRecord::Skip;
    let err = fails(&c, None);
    assert!(
        err.ends_with(
            "check `data.files` and how documents are read (`messages_field`, the messages' roles)"
        ),
        "{err}"
    );
}

#[test]
fn a_completion_merged_into_the_generation_prompts_last_token_is_counted() {
    // The generation prompt ends in a space, and the byte-level tokenizer writes a space
    // with the word after it: ` return` holds the prompt's last character.
    let dir = tempfile::tempdir().unwrap();
    let template = write(
        dir.path(),
        "spaced.jinja",
        "{% for m in messages %}{{ m.role + ': ' + m.content + '\\n' }}{% endfor %}\
         {% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}",
    );
    let pairs = write(
        dir.path(),
        "pairs.jsonl",
        "{\"prompt\": [{\"role\": \"user\", \"content\": \"f?\"}], \"completion\": [{\"role\": \"assistant\", \"content\": \"return x\"}]}\n",
    );
    let source = DataSource::Chat {
        files: vec![pairs.clone()],
        messages_field: "messages".into(),
        chat_template: Some(template),
        chat_template_kwargs: Default::default(),
    };
    let c = dataset(source, hf("bpe"), 64, &dir.path().join("cache"));
    let data = open(&c, None).unwrap();
    let manifest = &data.train().corpus().manifest;
    assert_eq!(manifest.merged_boundaries, 1);
    assert_eq!(
        manifest.first_merged_boundary,
        Some((format!("{}:1", pairs.display()), " return".to_string()))
    );
}

#[test]
fn chats_that_never_train_the_end_of_document_token_are_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "chat.jsonl",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}\n",
    );
    // The folder's ChatML template ends a turn with <|im_end|>, its eos: trained.
    let own = dataset(
        chat(&path, "messages"),
        hf("bpe"),
        64,
        &dir.path().join("a"),
    );
    let data = open(&own, None).unwrap();
    assert_eq!(data.train().corpus().manifest.untrained_eos, None);
    // What the loss holds is said in the data's words.
    assert!(
        data.summary()
            .iter()
            .any(|l| l.contains("% of them in the loss (the assistant's turns), ")),
        "{:?}",
        data.summary()
    );
    // Another eos: appended after the turn's end, and not trained.
    let other = TokenizerConfig::HuggingFace {
        path: fixture().join("bpe"),
        bos_token: None,
        eos_token: Some("<|endoftext|>".into()),
    };
    let c = dataset(chat(&path, "messages"), other, 64, &dir.path().join("b"));
    let data = open(&c, None).unwrap();
    let warning = |data: &Dataset| {
        data.summary()
            .iter()
            .find(|l| l.starts_with("warning: no conversation"))
            .cloned()
            .unwrap_or_else(|| panic!("no warning in {:?}", data.summary()))
    };
    let text = warning(&data);
    assert!(
        text.starts_with(
            "warning: no conversation of the training data trains the end-of-document token \"<|endoftext|>\": \
             the chat template ends assistant turns with \"<|im_end|>\""
        ) && text.contains("set `tokenizer.eos_token: \"<|im_end|>\"`"),
        "the template's own end of turn is named: {text}"
    );
    // A prompt-completion record trains the newline after the turn's end too: still the
    // end of turn is what its training ends with.
    let pairs = write(
        dir.path(),
        "pairs.jsonl",
        "{\"prompt\": [{\"role\": \"user\", \"content\": \"hi\"}], \"completion\": [{\"role\": \"assistant\", \"content\": \"yo\"}]}\n",
    );
    let other = TokenizerConfig::HuggingFace {
        path: fixture().join("bpe"),
        bos_token: None,
        eos_token: Some("<|endoftext|>".into()),
    };
    let c = dataset(
        chat(&pairs, "messages"),
        other,
        64,
        &dir.path().join("pairs"),
    );
    let text = warning(&open(&c, None).unwrap());
    assert!(
        text.contains("the chat template ends assistant turns with \"<|im_end|>\""),
        "{text}"
    );
    // A `{% generation %}` block around the content alone trains no end of turn at all.
    let template = write(
        dir.path(),
        "content_only.jinja",
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' %}\
         {% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}\
         <|im_end|>\n{% endfor %}",
    );
    let source = DataSource::Chat {
        files: vec![path.clone()],
        messages_field: "messages".into(),
        chat_template: Some(template),
        chat_template_kwargs: Default::default(),
    };
    let c = dataset(source, hf("bpe"), 64, &dir.path().join("c"));
    let text = warning(&open(&c, None).unwrap());
    assert!(
        text.starts_with(&format!(
            "warning: no conversation of the training data trains the end-of-document token \"<|im_end|>\", \
             nor any other special token: what trains of each assistant turn ends in text (the first: {}:1)",
            path.display()
        )) && text.contains("inside the block"),
        "{text}"
    );
}

#[test]
fn chat_data_with_no_token_in_the_loss_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "chat.jsonl",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"no answer here\"}]}\n\
         {\"messages\": [{\"role\": \"user\", \"content\": \"none here either\"}]}\n",
    );
    let c = dataset(
        chat(&path, "messages"),
        hf("bpe"),
        64,
        &dir.path().join("cache"),
    );
    let err = fails(&c, None);
    assert!(
        err.contains(&format!(
            "no token of the training data is in the loss: none of its 2 record(s) has a token \
             to train on (the first: {}:1)",
            path.display()
        )) && err.contains("give conversations an assistant turn"),
        "{err}"
    );
    // The records skipped are said too: often they are where the answers were.
    let skipping_path = write(
        dir.path(),
        "skipping.jsonl",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"no answer here\"}]}\n\
         {\"messages\": [{\"role\": \"robot\", \"content\": \"beep\"}]}\n",
    );
    let mut skipping = dataset(
        chat(&skipping_path, "messages"),
        hf("bpe"),
        64,
        &dir.path().join("cache"),
    );
    skipping.on_bad_record = OnBadRecord::Skip;
    let err = fails(&skipping, None);
    assert!(
        err.contains(&format!(
            "(the first: {0}:1, 1 bad record(s) skipped, the first {0}:2: message 1 has role",
            skipping_path.display()
        )),
        "{err}"
    );
    assert!(
        !dir.path().join("cache").exists()
            || std::fs::read_dir(dir.path().join("cache"))
                .unwrap()
                .all(|e| e.unwrap().file_name().to_string_lossy().ends_with(".lock")),
        "no cache is left behind, only the lock"
    );
}

#[test]
fn a_conversation_without_an_assistant_turn_is_said_to_train_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "chat.jsonl",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}\n\
         {\"messages\": [{\"role\": \"user\", \"content\": \"no answer here\"}]}\n\
         {\"messages\": [{\"role\": \"system\", \"content\": \"be brief\"}, {\"role\": \"user\", \"content\": \"and none here\"}]}\n",
    );
    let source = chat(&path, "messages");
    let c = dataset(source, hf("bpe"), 64, &dir.path().join("cache"));
    let data = open(&c, None).unwrap();
    assert_eq!(data.train().corpus().manifest.untrained_documents, 2);
    let warning = format!(
        "warning: 2 record(s) of the training data have no token in the loss (the first: {}:2)",
        path.display()
    );
    assert!(
        data.summary().iter().any(|l| l.starts_with(&warning)),
        "{:?}",
        data.summary()
    );
}

#[test]
fn a_document_longer_than_a_sequence_when_documents_stay_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "lines.txt",
        "short\nshort too\nthis line is far too long\nok\n",
    );
    let mut c = dataset(
        text_files(vec![path.clone()], TextSplit::Line),
        TokenizerConfig::Bytes,
        12,
        &dir.path().join("cache"),
    );
    c.packing = Packing::WholeDocuments;
    let err = open(&c, None).err().unwrap().to_string();
    assert!(
        err.starts_with(&format!(
            "{}:3: a document of 26 tokens does not fit a sequence of 12 (packing: whole_documents)",
            path.display()
        )),
        "{err}"
    );
    assert!(
        err.contains("set `data.truncate: true` to keep its first 12 tokens"),
        "{err}"
    );
    c.on_bad_record = OnBadRecord::Skip;
    let data = open(&c, None).unwrap();
    assert_eq!(data.train().left_out.documents, 1);
    assert!(data
        .summary()
        .iter()
        .any(|l| l.contains("1 document(s) longer than seq_len 12 left out")));
    assert_eq!(data.train().tokens(), 6 + 10 + 3);

    // Truncated instead, whatever `on_bad_record` says: its first 12 bytes stay, the other
    // 14 are counted as dropped.
    c.on_bad_record = OnBadRecord::Stop;
    c.truncate = true;
    c.document_mask = true;
    let data = open(&c, None).unwrap();
    let train = data.train();
    assert_eq!(train.left_out.documents, 0);
    assert_eq!((train.truncated.documents, train.truncated.tokens), (1, 14));
    assert_eq!((train.documents(), train.tokens()), (4, 6 + 10 + 12 + 3));
    assert!(
        data.summary().iter().any(|l| l
            == &format!(
                "training data: 1 document(s) longer than seq_len 12 cut to their first 12 \
                 tokens (data.truncate): 14 tokens dropped (the first: {}:3, 26 tokens)",
                path.display()
            )),
        "{:?}",
        data.summary()
    );
    // Best-fit: 12 alone, 10, then 6 + 3; in the order of their first documents, the
    // truncated line is the third sequence, alone in it.
    let (mut inputs, mut targets, mut positions, mut documents) =
        ([0i64; 12], [0i64; 12], [0i64; 12], [0i64; 12]);
    train.fill(
        2,
        Row {
            inputs: &mut inputs,
            targets: &mut targets,
            positions: Some(&mut positions),
            documents: Some(&mut documents),
        },
    );
    let kept: Vec<i64> = b"this line is".iter().map(|&b| i64::from(b)).collect();
    assert_eq!(inputs.to_vec(), kept);
    assert_eq!(
        targets[..11],
        kept[1..],
        "the next token while there is one kept"
    );
    assert_eq!(targets[11], IGNORE, "none after the last kept token");
    assert_eq!(positions.to_vec(), (0..12).collect::<Vec<i64>>());
    assert_eq!(documents, [0; 12]);
    assert_ne!(
        data.fingerprint(),
        {
            c.truncate = false;
            c.on_bad_record = OnBadRecord::Skip;
            open(&c, None).unwrap().fingerprint().to_string()
        },
        "other sequences, another fingerprint"
    );

    // Every document too long, and left out: the set makes no sequence, and says why.
    let only_long = write(dir.path(), "long.txt", "this line is far too long\n");
    c.source = text_files(vec![only_long], TextSplit::Line);
    let err = open(&c, None).err().unwrap().to_string();
    assert!(
        err.contains("the training data makes no sequence: all 1 of its document(s) are longer than seq_len 12 and were left out")
            && err.contains("set `data.truncate: true`"),
        "{err}"
    );
}

#[test]
fn truncated_examples_count_what_leaves_the_loss_and_warn_of_those_left_with_none() {
    let dir = tempfile::tempdir().unwrap();
    let record = |prompt: &str, completion: &str| {
        format!("{{\"prompt\": \"{prompt}\", \"completion\": \"{completion}\"}}\n")
    };
    // 20 + 4 + the end of the document: the prompt alone fills the sequence. 1 + 26 + 1: the
    // completion is cut. 2 + 2 + 1 fits.
    let train = write(
        dir.path(),
        "train.jsonl",
        &[
            record(&"p".repeat(20), "done"),
            record("q", "answer is long enough here"),
            record("hi", "yo"),
        ]
        .concat(),
    );
    let held = write(
        dir.path(),
        "held.jsonl",
        &record("validate", "this completion runs long"),
    );
    let mut c = dataset(
        DataSource::Jsonl {
            files: vec![train],
            text: JsonlText::PromptCompletion {
                prompt: "prompt".into(),
                completion: "completion".into(),
            },
        },
        TokenizerConfig::Bytes,
        12,
        &dir.path().join("cache"),
    );
    c.packing = Packing::WholeDocuments;
    c.truncate = true;
    c.validation = Some(ValidationConfig {
        held_out: HeldOut::Files { files: vec![held] },
        every_steps: None,
        max_batches: None,
    });
    let data = open(&c, None).unwrap();
    let cut = &data.train().truncated;
    // Dropped: 13 of the first (its completion and end, 5 targets), 16 of the second (all
    // completion).
    assert_eq!(
        (cut.documents, cut.tokens, cut.trained_tokens, cut.untrained),
        (2, 13 + 16, 5 + 16, 1)
    );
    let summary = data.summary();
    let has = |text: &str| summary.iter().any(|l| l.starts_with(text));
    assert!(
        has("training data: 2 document(s) longer than seq_len 12 cut to their first 12 tokens (data.truncate): 29 tokens dropped, 21 of them loss targets"),
        "{summary:?}"
    );
    assert!(
        has("warning: 1 truncated document(s) of the training data keep no token in the loss"),
        "{summary:?}"
    );
    // 8 + 25 + 1 tokens, 22 dropped: most of the validation data, said as a warning.
    let v = data.validation().unwrap();
    assert_eq!((v.truncated.documents, v.truncated.tokens), (1, 22));
    assert!(
        has("warning: validation data: 1 document(s) longer than seq_len 12 cut to their first 12 tokens")
            && summary.iter().any(|l| l.ends_with("most of the validation data is dropped: raise seq_len, or use `packing: stream` (documents continue into the next sequence)")),
        "{summary:?}"
    );
}

#[test]
fn token_ids_beyond_the_vocabulary() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    // Bytes are ids 0..=255 and the end of a document is 256: with a vocabulary of 200 the
    // first id beyond it ends line 1 (and line 2's `é` is 195, 169).
    let path = write(dir.path(), "t.txt", "plain ascii\ncaf\u{e9}\n");
    let c = dataset(
        text_files(vec![path.clone()], TextSplit::Line),
        TokenizerConfig::Bytes,
        8,
        &cache,
    );
    let err = open(&c, Some(200)).err().unwrap().to_string();
    assert!(
        err.starts_with(&format!(
            "{}:1: token id 256 is outside the model's vocabulary (vocab_size 200)",
            path.display()
        )),
        "{err}"
    );
    assert!(err.contains("it is token 12 of that document"), "{err}");
    assert!(
        err.contains("give the model at least 257 ids (its `vocab_size`;"),
        "{err}"
    );

    // Pre-tokenized: u16 ids checked against the model too, and a file that is not whole ids.
    let bin = dir.path().join("train.bin");
    std::fs::write(
        &bin,
        [1u16, 2, 50_000, 3]
            .iter()
            .flat_map(|t| t.to_le_bytes())
            .collect::<Vec<u8>>(),
    )
    .unwrap();
    let tokens = |files| DataSource::Tokens {
        files,
        dtype: TokenDtype::U16,
    };
    let c = dataset(
        tokens(vec![bin.clone()]),
        TokenizerConfig::PreTokenized,
        2,
        &cache,
    );
    let err = open(&c, Some(32_000)).err().unwrap().to_string();
    assert!(
        err.starts_with(&format!(
            "{}: token id 50000 is outside the model's vocabulary (vocab_size 32000)",
            bin.display()
        )),
        "{err}"
    );
    assert!(open(&c, Some(50_001)).is_ok());

    // u32 ids past 65,535 (Qwen's 151,936-id vocabulary): read back as they are.
    let big = dir.path().join("big.bin");
    let ids = [7u32, 151_935, 128_000, 65_536];
    std::fs::write(
        &big,
        ids.iter()
            .flat_map(|t| t.to_le_bytes())
            .collect::<Vec<u8>>(),
    )
    .unwrap();
    let c = dataset(
        DataSource::Tokens {
            files: vec![big],
            dtype: TokenDtype::U32,
        },
        TokenizerConfig::PreTokenized,
        3,
        &dir.path().join("cache3"),
    );
    let data = open(&c, Some(151_936)).unwrap();
    assert_eq!(data.samples_per_epoch(), 2);
    let batch = data.training_batch(0, 2);
    let mut seen: Vec<i64> = batch.inputs.iter().copied().filter(|&t| t != 0).collect();
    seen.sort();
    assert_eq!(seen, [7, 65_536, 128_000, 151_935]);
    let err = open(&c, Some(151_935)).err().unwrap().to_string();
    assert!(
        err.contains("token id 151935 is outside the model's vocabulary (vocab_size 151935)"),
        "{err}"
    );
    let odd = write(dir.path(), "odd.bin", "abc");
    let c = dataset(
        tokens(vec![odd.clone()]),
        TokenizerConfig::PreTokenized,
        2,
        &dir.path().join("cache2"),
    );
    let err = fails(&c, None);
    assert!(
        err.starts_with(&format!(
            "{}: its size (3 bytes) is not a whole number of 2-byte ids",
            odd.display()
        )),
        "{err}"
    );
}

#[test]
fn a_field_the_first_record_lacks_is_answered_with_the_fields_it_has() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "d.jsonl",
        "{\"txt\": \"one\", \"id\": 1}\n{\"txt\": \"two\", \"id\": 2}\n",
    );
    // Likely every record lacks it: skipping them would leave nothing, so the fix is the
    // field's name.
    let c = dataset(
        jsonl(vec![path.clone()]),
        TokenizerConfig::Bytes,
        8,
        &dir.path().join("c1"),
    );
    assert_eq!(
        fails(&c, None),
        format!(
            "{}:1: no field `text` in the record (it has: id, txt); `data.field: text` (its \
             default) names a field the first record does not have, so likely no record has \
             it: did you mean `field: txt`?",
            path.display()
        )
    );
    let prompts = DataSource::Jsonl {
        files: vec![path.clone()],
        text: JsonlText::PromptCompletion {
            prompt: "txt".into(),
            completion: "answer".into(),
        },
    };
    let c = dataset(prompts, TokenizerConfig::Bytes, 8, &dir.path().join("c2"));
    assert!(
        fails(&c, None).ends_with(
            "`data.completion_field: answer` names a field the first record does not have, so \
             likely no record has it: set it to the field that holds the completion"
        ),
        "{}",
        fails(&c, None)
    );
    // Skipped anyway, the records leave nothing, and the first one says why.
    let mut skipping = dataset(
        jsonl(vec![path.clone()]),
        TokenizerConfig::Bytes,
        8,
        &dir.path().join("c3"),
    );
    skipping.on_bad_record = OnBadRecord::Skip;
    let err = fails(&skipping, None);
    assert!(
        err.contains(&format!(
            "2 bad record(s) skipped, the first {}:1: no field `text` in the record (it has: id, txt)",
            path.display()
        )),
        "{err}"
    );
    // A later record without the field is one bad record among good ones: skipping stays
    // the way out.
    let later = write(
        dir.path(),
        "later.jsonl",
        "{\"text\": \"one\"}\n{\"txt\": \"two\"}\n",
    );
    let c = dataset(
        jsonl(vec![later]),
        TokenizerConfig::Bytes,
        8,
        &dir.path().join("c4"),
    );
    assert!(
        fails(&c, None).ends_with("or set `data.on_bad_record: skip` to skip bad records"),
        "{}",
        fails(&c, None)
    );
}

#[test]
fn a_fraction_that_rounds_to_every_document_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<PathBuf> = (0..5)
        .map(|i| write(dir.path(), &format!("{i}.txt"), &"text ".repeat(i + 1)))
        .collect();
    let mut c = dataset(
        text_files(files, TextSplit::File),
        TokenizerConfig::Bytes,
        8,
        &dir.path().join("cache"),
    );
    c.validation = Some(ValidationConfig {
        held_out: HeldOut::Fraction { fraction: 0.95 },
        every_steps: None,
        max_batches: None,
    });
    let error = open(&c, None).err().expect("must fail").to_string();
    assert!(
        error.contains(
            "holding out 0.95 of 5 document(s) (5 of them, the nearest whole number) leaves none to train on"
        ),
        "{error}"
    );
    // Half of 5 holds out 3 (2.5 rounds up), whatever the seed.
    c.validation.as_mut().unwrap().held_out = HeldOut::Fraction { fraction: 0.5 };
    let data = open(&c, None).unwrap();
    assert_eq!(data.train().set().documents, 2);
}

#[test]
fn the_description_counts_the_documents_trained_on_per_split() {
    let dir = tempfile::tempdir().unwrap();
    // Prompts and completions of many lengths, so that each split has its own share of
    // tokens in the loss; record 7 is too long for a sequence of 64.
    let records: Vec<(String, String)> = (0..24)
        .map(|i| {
            let completion = if i == 6 { 200 } else { 2 + (i * 7) % 30 };
            (
                format!("q{i}? {}", "p".repeat(i % 5)),
                "a".repeat(completion),
            )
        })
        .collect();
    let lines: String = records
        .iter()
        .map(|(p, c)| format!("{{\"p\": \"{p}\", \"c\": \"{c}\"}}\n"))
        .collect();
    let path = write(dir.path(), "qa.jsonl", &lines);
    let source = DataSource::Jsonl {
        files: vec![path.clone()],
        text: JsonlText::PromptCompletion {
            prompt: "p".into(),
            completion: "c".into(),
        },
    };
    let mut c = dataset(
        source,
        TokenizerConfig::Bytes,
        64,
        &dir.path().join("cache"),
    );
    c.packing = Packing::WholeDocuments;
    c.on_bad_record = OnBadRecord::Skip;
    c.validation = Some(ValidationConfig {
        held_out: HeldOut::Fraction { fraction: 0.25 },
        every_steps: None,
        max_batches: None,
    });
    let data = open(&c, None).unwrap();
    let thousands = shardrun_data::dataset::thousands;
    // Bytes, then the end-of-document token; the completion and that token are trained.
    let counts =
        |record: &(String, String)| (record.0.len() + record.1.len() + 1, record.1.len() + 1);
    let splits = [
        ("training data:", data.train()),
        (
            "validation data (held-out documents):",
            data.validation().unwrap(),
        ),
    ];
    let mut left_out = None;
    for (what, packed) in splits {
        let (mut documents, mut tokens, mut trained) = (0, 0, 0);
        for d in packed.set().document_ids() {
            let line = packed.corpus().origin(d).line;
            let (n, t) = counts(&records[line as usize - 1]);
            if n > 64 {
                left_out = Some((what, line, n));
                continue;
            }
            documents += 1;
            tokens += n;
            trained += t;
        }
        let want = format!(
            "{what} {documents} document(s), {} tokens, {:.0}% of them in the loss (the completions), {} sequence(s)",
            thousands(tokens as u64),
            100.0 * trained as f64 / tokens as f64,
            packed.sequences()
        );
        assert!(
            data.summary().iter().any(|l| l.starts_with(&want)),
            "{want}\n{:?}",
            data.summary()
        );
    }
    let (what, line, tokens) = left_out.expect("record 7 is in one of the splits");
    assert_eq!(line, 7);
    let what = if what == "training data:" {
        "training data"
    } else {
        "validation data"
    };
    let warning = format!(
        "warning: 1 document(s) longer than seq_len 64 left out of the {what} \
         (data.on_bad_record: skip; the first: {}:7, {tokens} tokens; `data.truncate: true` \
         keeps their first 64 tokens instead)",
        path.display()
    );
    assert!(
        data.summary().contains(&warning),
        "{warning}\n{:?}",
        data.summary()
    );
}

#[test]
fn u32_ids_read_as_u16_are_refused_with_the_dtype_to_set() {
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<u32> = (0..300).map(|i| 100 + i * 37 % 5000).collect();
    let bytes = |width: usize| -> Vec<u8> {
        ids.iter()
            .flat_map(|&t| t.to_le_bytes()[..width].to_vec())
            .collect()
    };
    let wide = dir.path().join("train32.bin");
    std::fs::write(&wide, bytes(4)).unwrap();
    let narrow = dir.path().join("val16.bin");
    std::fs::write(&narrow, bytes(2)).unwrap();
    let tokens = |files, dtype| DataSource::Tokens { files, dtype };
    let refused = format!(
        "{}: it looks like a file of u32 ids, not u16: read as u16 ids, every second one of its \
         first 600 is 0 (the high half of a u32 id below 65,536); set `data.dtype: u32`",
        wide.display()
    );
    for policy in [OnBadRecord::Stop, OnBadRecord::Skip] {
        let mut c = dataset(
            tokens(vec![wide.clone()], TokenDtype::U16),
            TokenizerConfig::PreTokenized,
            16,
            &dir.path().join(format!("cache-{policy:?}")),
        );
        c.on_bad_record = policy;
        assert_eq!(fails(&c, None), refused, "{policy:?}");
        // Validation files are read with the same dtype.
        c.source = tokens(vec![narrow.clone()], TokenDtype::U16);
        c.validation = Some(ValidationConfig {
            held_out: HeldOut::Files {
                files: vec![wide.clone()],
            },
            every_steps: None,
            max_batches: None,
        });
        let err = open(&c, None).err().expect("must fail").to_string();
        assert_eq!(err, refused, "{policy:?}");
    }
    // Each read as what it is.
    let c = dataset(
        tokens(vec![wide.clone()], TokenDtype::U32),
        TokenizerConfig::PreTokenized,
        16,
        &dir.path().join("cache"),
    );
    let data = open(&c, None).unwrap();
    assert_eq!(data.train().corpus().tokens(), 300);
    let c = dataset(
        tokens(vec![narrow.clone()], TokenDtype::U16),
        TokenizerConfig::PreTokenized,
        16,
        &dir.path().join("cache"),
    );
    assert_eq!(open(&c, None).unwrap().train().corpus().tokens(), 300);
}

#[test]
fn a_field_no_record_has_is_answered_with_the_one_likely_meant_when_skipping_too() {
    let dir = tempfile::tempdir().unwrap();
    let flat = write(
        dir.path(),
        "flat.jsonl",
        &(0..40)
            .map(|i| format!("{{\"id\": {i}, \"text\": \"t{i}\", \"prompt\": \"p\", \"completion\": \"c\"}}\n"))
            .collect::<String>(),
    );
    let nested = write(
        dir.path(),
        "nested.jsonl",
        "{\"meta\": {\"text\": \"one\", \"n\": 1}}\n{\"meta\": {\"text\": \"two\", \"n\": 2}}\n",
    );
    let field = |path: &PathBuf, name: &str| DataSource::Jsonl {
        files: vec![path.clone()],
        text: JsonlText::Field { field: name.into() },
    };
    let prompts = |prompt: &str| DataSource::Jsonl {
        files: vec![flat.clone()],
        text: JsonlText::PromptCompletion {
            prompt: prompt.into(),
            completion: "completion".into(),
        },
    };
    let cases = [
        (field(&flat, "txt"), "`field: text`", 40),
        (prompts("promt"), "`prompt_field: prompt`", 40),
        (field(&nested, "text"), "`field: meta.text`", 2),
    ];
    for (i, (source, meant, records)) in cases.into_iter().enumerate() {
        let mut c = dataset(
            source,
            TokenizerConfig::Bytes,
            8,
            &dir.path().join(format!("stop{i}")),
        );
        let err = fails(&c, None);
        assert!(err.ends_with(&format!("did you mean {meant}?")), "{err}");
        c.on_bad_record = OnBadRecord::Skip;
        c.cache_dir = dir.path().join(format!("skip{i}"));
        let err = fails(&c, None);
        assert!(
            err.contains(&format!("{records} bad record(s) skipped, the first ")),
            "{err}"
        );
        let key = &meant[1..meant.find(':').unwrap()];
        assert!(
            err.ends_with(&format!(
                "`data.{key}` names a field no record has: did you mean {meant}?"
            )),
            "{err}"
        );
    }
    // The object named holds the text one level down.
    let c = dataset(
        field(&nested, "meta"),
        TokenizerConfig::Bytes,
        8,
        &dir.path().join("object"),
    );
    let err = fails(&c, None);
    assert!(
        err.starts_with(&format!(
            "{}:1: field `meta` is an object, not a string (it has: n, text; `meta.text` names \
             its longest string)",
            nested.display()
        )),
        "{err}"
    );
    // Records skipped for different reasons: no one field to name.
    let mixed = write(
        dir.path(),
        "mixed.jsonl",
        "{\"text\": 1}\n{\"body\": \"b\"}\n",
    );
    let mut c = dataset(
        field(&mixed, "text"),
        TokenizerConfig::Bytes,
        8,
        &dir.path().join("mixed"),
    );
    c.on_bad_record = OnBadRecord::Skip;
    let err = fails(&c, None);
    assert!(
        err.ends_with(
            "check `data.files` and how documents are read (`field`, or `prompt_field` and \
             `completion_field`)"
        ),
        "{err}"
    );
}

#[test]
fn an_eos_token_the_tokenizer_lacks_is_refused_with_the_tokens_it_has() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "docs.txt", "some text\n");
    let missing = TokenizerConfig::HuggingFace {
        path: fixture().join("bpe"),
        bos_token: None,
        eos_token: Some("</s>".into()),
    };
    let source = text_files(vec![path], TextSplit::File);
    let c = dataset(source, missing, 64, dir.path());
    let err = open(&c, None)
        .err()
        .expect("an eos token it lacks")
        .to_string();
    assert!(
        err.contains("data.tokenizer.eos_token names `</s>`, but the tokenizer has no such token; its special tokens: ")
            && err.contains("`<|im_end|>`"),
        "{err}"
    );
}

#[test]
fn a_compressed_file_is_refused_as_the_wrong_file_even_when_skipping() {
    let dir = tempfile::tempdir().unwrap();
    // A gzip header and deflated bytes: what `gzip docs.jsonl` leaves.
    let path = dir.path().join("docs.jsonl.gz");
    std::fs::write(
        &path,
        [
            0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0xab, 0x56,
        ],
    )
    .unwrap();
    for (split, on_bad_record) in [
        (TextSplit::Line, OnBadRecord::Stop),
        (TextSplit::File, OnBadRecord::Skip),
    ] {
        let mut c = dataset(
            text_files(vec![path.clone()], split),
            TokenizerConfig::Bytes,
            64,
            dir.path(),
        );
        c.on_bad_record = on_bad_record;
        let err = open(&c, None).err().expect("a gzip file").to_string();
        assert!(
            err.contains("docs.jsonl.gz")
                && err.contains(": the file is gzip-compressed, not text; decompress it first"),
            "{err}"
        );
    }
}
