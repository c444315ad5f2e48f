//! Our ids against Python's: every sample document (text, code, CJK, emoji, combining marks)
//! tokenized through the whole data path (files, cache, memory map) equals transformers 5's
//! `AutoTokenizer.from_pretrained(folder)(text)`, for a byte-level BPE and a Metaspace
//! (SentencePiece-style) tokenizer, also one whose post-processor ends every encoding with
//! `</s>`, and Llama 2 and CodeLlama folders, which transformers does not run as their
//! `tokenizer.json` says (it rebuilds them; so does shardrun); chat records
//! render exactly as `transformers`' `apply_chat_template` (with `{% generation %}` blocks,
//! named templates, conversations the assistant opens, tool calls beside `content: null`, the
//! spec's special tokens, a reasoning model's template), and the
//! loss mask covers exactly the tokens its `{% generation %}` assistant mask covers; a
//! prompt/completion record trains its completion and the end of the document.

mod common;

use common::*;
use shardrun_data::chat::{messages_of, ChatTemplate};
use shardrun_data::packing::{Row, IGNORE};
use shardrun_data::tokenizer::TextTokenizer;
use shardrun_data::{Dataset, Quiet};
use shardrun_protocol::config::*;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The fixture's tokenizer folders.
const TOKENIZERS: [&str; 6] = [
    "bpe",
    "metaspace",
    "metaspace_eos",
    "llama2",
    "llama2_legacy",
    "codellama",
];

/// `ids` + the end-of-document token, as every document is stored.
fn with_eos(mut ids: Vec<u32>, eos: u32) -> Vec<u32> {
    if ids.last() != Some(&eos) {
        ids.push(eos);
    }
    ids
}

/// The fixture's sample documents, by file name.
fn sample_names(expected: &serde_json::Value) -> Vec<String> {
    expected["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

/// The files of the sample documents, one document each.
fn sample_files(samples: &[String]) -> Vec<PathBuf> {
    samples
        .iter()
        .map(|s| fixture().join("samples").join(s))
        .collect()
}

#[test]
fn token_ids_equal_transformers_on_text_code_and_unicode() {
    let expected = expected();
    let samples = sample_names(&expected);
    for name in TOKENIZERS {
        let want = &expected["tokenizers"][name];
        let eos = want["eos_id"].as_u64().unwrap() as u32;
        let cache = tempfile::tempdir().unwrap();

        let config = dataset(
            text_files(sample_files(&samples), TextSplit::File),
            hf(name),
            64,
            cache.path(),
        );
        let data = Dataset::open(&config, 0, None, 2, &Quiet).unwrap();
        let docs = documents(data.train().corpus());
        assert_eq!(docs.len(), samples.len());
        for (sample, (tokens, mask)) in samples.iter().zip(&docs) {
            let python = with_eos(ids(&want["samples"][sample]), eos);
            assert_eq!(tokens, &python, "{name}: {sample}");
            assert!(
                mask.iter().all(|&m| m),
                "{name}: {sample}: text trains in full"
            );
        }

        let config = dataset(
            text_files(vec![fixture().join("lines.txt")], TextSplit::Line),
            hf(name),
            64,
            cache.path(),
        );
        let data = Dataset::open(&config, 0, None, 2, &Quiet).unwrap();
        let docs = documents(data.train().corpus());
        let lines = want["lines"].as_array().unwrap();
        assert_eq!(
            docs.len(),
            lines.len(),
            "{name}: one document per non-blank line"
        );
        for (i, ((tokens, _), line)) in docs.iter().zip(lines).enumerate() {
            assert_eq!(
                tokens,
                &with_eos(ids(line), eos),
                "{name}: line document {i}"
            );
        }
    }
}

/// `max_length` the fixture truncated its samples to.
const TRUNCATED_TO: usize = 16;

#[test]
fn truncated_documents_are_what_transformers_truncation_keeps() {
    let expected = expected();
    let samples = sample_names(&expected);
    for name in TOKENIZERS {
        let want = &expected["tokenizers"][name];
        let eos = want["eos_id"].as_u64().unwrap() as u32;
        let cache = tempfile::tempdir().unwrap();
        let mut config = dataset(
            text_files(sample_files(&samples), TextSplit::File),
            hf(name),
            TRUNCATED_TO as u64,
            cache.path(),
        );
        config.packing = Packing::WholeDocuments;
        config.truncate = true;
        let data = Dataset::open(&config, 0, None, 2, &Quiet).unwrap();

        // A truncated document fills a sequence by itself.
        let packed = data.train();
        let rows: Vec<(Vec<u32>, Vec<i64>)> = (0..packed.sequences())
            .map(|k| {
                let (mut inputs, mut targets) =
                    (vec![0i64; TRUNCATED_TO], vec![0i64; TRUNCATED_TO]);
                packed.fill(
                    k,
                    Row {
                        inputs: &mut inputs,
                        targets: &mut targets,
                        positions: None,
                        documents: None,
                    },
                );
                (inputs.iter().map(|&t| t as u32).collect(), targets)
            })
            .collect();

        let mut cut = 0;
        for sample in &samples {
            let whole = with_eos(ids(&want["samples"][sample]), eos);
            if whole.len() <= TRUNCATED_TO {
                continue;
            }
            cut += 1;
            let python = ids(&want["truncated"][sample]);
            let (tokens, targets) = rows
                .iter()
                .find(|(tokens, _)| tokens[..] == whole[..TRUNCATED_TO])
                .unwrap_or_else(|| panic!("{name}: {sample}: its first {TRUNCATED_TO} tokens"));
            if python.last() == Some(&eos) {
                // A post-processor that ends every encoding with `</s>` keeps it through
                // transformers' truncation; keeping the start (TRL's keep_start) cuts it.
                assert_eq!(
                    tokens[..TRUNCATED_TO - 1],
                    python[..TRUNCATED_TO - 1],
                    "{name}: {sample}"
                );
            } else {
                assert_eq!(tokens, &python, "{name}: {sample}");
            }
            // As transformers' labels for the truncated ids: the next token, none after the
            // last kept one.
            let shifted: Vec<i64> = tokens[1..].iter().map(|&t| i64::from(t)).collect();
            assert_eq!(targets[..TRUNCATED_TO - 1], shifted[..], "{name}: {sample}");
            assert_eq!(targets[TRUNCATED_TO - 1], IGNORE, "{name}: {sample}");
        }
        assert!(
            cut >= 3,
            "{name}: only {cut} samples longer than {TRUNCATED_TO} tokens"
        );
        assert_eq!(packed.truncated.documents, cut);
        assert!(
            data.summary().iter().any(|l| l.contains(&format!(
                "training data: {cut} document(s) longer than seq_len {TRUNCATED_TO} cut to their first {TRUNCATED_TO} tokens"
            ))),
            "{name}: {:?}",
            data.summary()
        );
    }
}

#[test]
fn end_of_document_comes_from_the_tokenizer_or_the_model_config() {
    let eos = |folder: &str| TextTokenizer::load(&hf(folder)).unwrap().eos;
    let bpe = eos("bpe");
    assert_eq!(
        (bpe.text.as_str(), bpe.source.as_str()),
        ("<|im_end|>", "tokenizer_config.json")
    );
    let llama = eos("metaspace");
    assert_eq!((llama.id, llama.text.as_str()), (2, "</s>"));
    // Not in tokenizer_config.json: the model's config.json names it by id.
    let from_config = eos("metaspace_config_eos");
    assert_eq!(
        (
            from_config.id,
            from_config.text.as_str(),
            from_config.source.as_str()
        ),
        (2, "</s>", "config.json")
    );
    let overridden = TextTokenizer::load(&TokenizerConfig::HuggingFace {
        path: fixture().join("bpe"),
        bos_token: None,
        eos_token: Some("<|endoftext|>".into()),
    })
    .unwrap()
    .eos;
    assert_eq!(
        (overridden.id, overridden.text.as_str()),
        (0, "<|endoftext|>")
    );
}

#[test]
fn chat_renders_as_transformers_and_the_mask_is_the_assistant_tokens() {
    let expected = expected();
    for name in TOKENIZERS {
        let want = &expected["tokenizers"][name];
        let eos = want["eos_id"].as_u64().unwrap() as u32;
        let chats = want["chats"].as_array().unwrap();
        let records = fixture().join(format!("chat_{name}.jsonl"));

        // The rendering itself, message for message.
        let tokenizer = TextTokenizer::load(&hf(name)).unwrap();
        let template = ChatTemplate::load(&tokenizer, None).unwrap();
        let lines = std::fs::read_to_string(&records).unwrap();
        for (line, chat) in lines.lines().zip(chats) {
            let record: minijinja::Value = serde_json::from_str(line).unwrap();
            let messages = messages_of(&record, "messages").unwrap();
            let tools = record.get_attr("tools").ok().filter(|t| !t.is_undefined());
            assert_eq!(
                template
                    .render_with_tools(&messages, tools.as_ref(), false)
                    .unwrap(),
                chat["text"].as_str().unwrap(),
                "{name}: rendering"
            );
        }

        // Through the data path: ids and loss mask.
        let docs = chat_documents(records, hf(name), None);
        assert_like_python(name, &docs, chats, eos);
    }
}

/// Message content that is a number prints as Jinja in Python prints it (`1e+20`, `1e-05`),
/// through `string` and `trim` too: the tokens trained on are the ones transformers makes.
#[test]
fn numbers_in_messages_render_as_transformers_renders_them() {
    let expected = expected();
    let numbers = &expected["numbers"];
    let tokens = BTreeMap::from([("eos_token".to_string(), "</s>".to_string())]);
    let template = ChatTemplate::from_source(
        "numbers.jinja".into(),
        numbers["template"].as_str().unwrap().into(),
        &tokens,
    )
    .unwrap();
    let renderings = numbers["renderings"].as_array().unwrap();
    assert!(renderings.len() > 10);
    for rendering in renderings {
        let record = serde_json::json!({ "messages": rendering["messages"] });
        let record: minijinja::Value = serde_json::from_value(record).unwrap();
        let messages = messages_of(&record, "messages").unwrap();
        assert_eq!(
            template.render_with_tools(&messages, None, false).unwrap(),
            rendering["text"].as_str().unwrap(),
            "{}",
            rendering["messages"]
        );
    }
}

#[test]
fn sharegpt_conversations_train_as_their_role_and_content_form() {
    // The same conversations as `chat_<tokenizer>.jsonl`, as `conversations` of
    // `{"from": "human" | "gpt" | "system", "value": ...}`.
    assert_chat_records_like_python("chat_sharegpt.jsonl", "conversations", "chats");
    // The same records as one indented JSON array, as ShareGPT dumps (and `datasets`' JSON
    // files that are not JSON Lines) hold them.
    assert_chat_records_like_python("chat_sharegpt.json", "conversations", "chats");
}

#[test]
fn prompt_completion_conversations_train_the_completion_as_trl_does() {
    // The conversations of `chat_<tokenizer>.jsonl` as `{"prompt": [...], "completion":
    // [<the last message>]}`: trained on all that follows the prompt with its generation
    // prompt, the end of turn and the newline after it too.
    assert_chat_records_like_python(
        "chat_prompt_completion.jsonl",
        "messages",
        "prompt_completion_chats",
    );
}

/// The chat records of the fixture's `file`, read with `messages_field` through the data
/// path with a ChatML and a Llama 2 tokenizer folder, are the fixture's `expectations` of it.
fn assert_chat_records_like_python(file: &str, messages_field: &str, expectations: &str) {
    let expected = expected();
    for name in ["bpe", "llama2"] {
        let source = DataSource::Chat {
            files: vec![fixture().join(file)],
            messages_field: messages_field.into(),
            chat_template: None,
            chat_template_kwargs: BTreeMap::new(),
        };
        let docs = source_documents(source, hf(name));
        let want = &expected["tokenizers"][name];
        let eos = want["eos_id"].as_u64().unwrap() as u32;
        assert_like_python(
            &format!("{name} {file}"),
            &docs,
            want[expectations].as_array().unwrap(),
            eos,
        );
    }
}

/// Every record of `records` through the data path: its tokens and loss mask.
fn chat_documents(
    records: PathBuf,
    tokenizer: TokenizerConfig,
    chat_template: Option<PathBuf>,
) -> Vec<(Vec<u32>, Vec<bool>)> {
    chat_documents_with_kwargs(records, tokenizer, chat_template, BTreeMap::new())
}

/// [`chat_documents`] with further variables for the template.
fn chat_documents_with_kwargs(
    records: PathBuf,
    tokenizer: TokenizerConfig,
    chat_template: Option<PathBuf>,
    chat_template_kwargs: BTreeMap<String, serde_json::Value>,
) -> Vec<(Vec<u32>, Vec<bool>)> {
    let source = DataSource::Chat {
        files: vec![records],
        messages_field: "messages".into(),
        chat_template,
        chat_template_kwargs,
    };
    source_documents(source, tokenizer)
}

/// Every record of `source` through the data path: its tokens and loss mask.
fn source_documents(source: DataSource, tokenizer: TokenizerConfig) -> Vec<(Vec<u32>, Vec<bool>)> {
    let cache = tempfile::tempdir().unwrap();
    let data = Dataset::open(
        &dataset(source, tokenizer, 64, cache.path()),
        0,
        None,
        2,
        &Quiet,
    )
    .unwrap();
    documents(data.train().corpus())
}

/// The documents hold `transformers`' ids, each followed by the end-of-document token (not
/// trained on) unless the chat already ends with it (whitespace after it aside), and train
/// on its assistant mask.
fn assert_like_python(
    what: &str,
    docs: &[(Vec<u32>, Vec<bool>)],
    chats: &[serde_json::Value],
    eos: u32,
) {
    assert_eq!(docs.len(), chats.len(), "{what}");
    for (i, ((tokens, mask), chat)) in docs.iter().zip(chats).enumerate() {
        let python = ids(&chat["ids"]);
        let python_mask: Vec<bool> = chat["assistant_mask"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m.as_u64() == Some(1))
            .collect();
        assert!(
            python_mask.iter().any(|&m| m),
            "the record has assistant tokens"
        );
        let appended = tokens.len() - python.len();
        assert_eq!(
            &tokens[..python.len()],
            python.as_slice(),
            "{what}: chat {i} ids"
        );
        assert_eq!(
            &mask[..python.len()],
            python_mask.as_slice(),
            "{what}: chat {i} mask"
        );
        if chat["ends_with_eos"].as_bool().unwrap() {
            assert_eq!(appended, 0, "{what}: chat {i} ends with eos already");
        } else {
            assert_eq!(
                appended, 1,
                "{what}: chat {i} gets the end-of-document token"
            );
            assert_eq!((tokens.last(), mask.last()), (Some(&eos), Some(&false)));
        }
    }
}

#[test]
fn generation_blocks_render_their_body() {
    // The ChatML template as TRL's assistant-only loss asks for it: with its markers.
    let expected = expected();
    let want = &expected["tokenizers"]["bpe"];
    let docs = chat_documents(
        fixture().join("chat_bpe.jsonl"),
        hf("bpe"),
        Some(fixture().join("chatml_generation.jinja")),
    );
    assert_like_python(
        "{% generation %}",
        &docs,
        want["chats"].as_array().unwrap(),
        want["eos_id"].as_u64().unwrap() as u32,
    );
}

#[test]
fn a_reasoning_template_renders_and_masks_as_transformers() {
    // The folder's template, without blocks, on conversations of one question (each turn
    // renders as it will once later turns follow), and the same template with blocks (as
    // TRL's assistant-only loss asks for it) on those and on conversations of several
    // questions, whose earlier answers lose their reasoning.
    let expected = expected();
    let eos = expected["tokenizers"]["bpe"]["eos_id"].as_u64().unwrap() as u32;
    let want = |name: &str| expected["reasoning"][name].as_array().unwrap().clone();
    let one_question = fixture().join("chat_reasoning_one_question.jsonl");
    let multi_question = fixture().join("chat_reasoning_multi_question.jsonl");
    let with_blocks = Some(fixture().join("reasoning_generation.jinja"));
    assert_like_python(
        "the folder's template",
        &chat_documents(one_question.clone(), hf("reasoning"), None),
        &want("one_question"),
        eos,
    );
    assert_like_python(
        "with blocks, one question",
        &chat_documents(one_question, hf("reasoning"), with_blocks.clone()),
        &want("one_question"),
        eos,
    );
    assert_like_python(
        "with blocks, several questions",
        &chat_documents(multi_question, hf("reasoning"), with_blocks),
        &want("multi_question"),
        eos,
    );
}

#[test]
fn chat_template_kwargs_reach_the_template_as_apply_chat_template_passes_them() {
    let expected = expected();
    let eos = expected["tokenizers"]["bpe"]["eos_id"].as_u64().unwrap() as u32;
    let want = &expected["reasoning"]["kwargs"];
    let kwargs: BTreeMap<String, serde_json::Value> =
        serde_json::from_value(want["kwargs"].clone()).unwrap();
    let docs = chat_documents_with_kwargs(
        fixture().join("chat_reasoning_one_question.jsonl"),
        hf("reasoning"),
        None,
        kwargs,
    );
    assert_like_python("kwargs", &docs, want["chats"].as_array().unwrap(), eos);
    // The fixture tells the cases apart: without them the template writes no date.
    assert_ne!(
        want["chats"][0]["ids"],
        expected["reasoning"]["one_question"][0]["ids"]
    );
}

#[test]
fn a_template_that_drops_earlier_reasoning_is_refused_with_what_to_give_instead() {
    let records = fixture().join("chat_reasoning_multi_question.jsonl");
    let cache = tempfile::tempdir().unwrap();
    let source = DataSource::Chat {
        files: vec![records.clone()],
        messages_field: "messages".into(),
        chat_template: None,
        chat_template_kwargs: Default::default(),
    };
    let config = dataset(source, hf("reasoning"), 64, cache.path());
    let err = Dataset::open(&config, 0, None, 2, &Quiet)
        .err()
        .expect("must be refused")
        .to_string();
    assert!(
        err.starts_with(&format!(
            "{}:1: the chat template renders message 2 differently once later messages follow",
            records.display()
        )),
        "{err}"
    );
    assert!(
        err.contains("`data.chat_template`") && err.contains("{% generation %}"),
        "{err}"
    );
}

#[test]
fn a_conversation_the_assistant_opens_renders_and_masks_as_transformers() {
    let expected = expected();
    let eos = expected["tokenizers"]["bpe"]["eos_id"].as_u64().unwrap() as u32;
    for folder in ["named", "named_legacy"] {
        let docs = chat_documents(
            fixture().join("chat_assistant_first.jsonl"),
            hf(folder),
            None,
        );
        let chats = expected["named"][folder]["assistant_first"]
            .as_array()
            .unwrap();
        assert_like_python(folder, &docs, chats, eos);
    }
}

#[test]
fn records_with_tools_take_the_tool_use_template() {
    // The transformers 5.x layout (chat_template.jinja and additional_chat_templates/) and
    // the 4.x one (a list in tokenizer_config.json).
    let expected = expected();
    let eos = expected["tokenizers"]["bpe"]["eos_id"].as_u64().unwrap() as u32;
    for folder in ["named", "named_legacy"] {
        let chats = expected["named"][folder]["tools"].as_array().unwrap();
        let tokenizer = TextTokenizer::load(&hf(folder)).unwrap();
        let template = ChatTemplate::load(&tokenizer, None).unwrap();
        let lines = std::fs::read_to_string(fixture().join("chat_tools.jsonl")).unwrap();
        for (line, chat) in lines.lines().zip(chats) {
            let record: minijinja::Value = serde_json::from_str(line).unwrap();
            let messages = messages_of(&record, "messages").unwrap();
            let tools = record.get_attr("tools").ok().filter(|t| !t.is_undefined());
            assert_eq!(
                template
                    .render_with_tools(&messages, tools.as_ref(), false)
                    .unwrap(),
                chat["text"].as_str().unwrap(),
                "{folder}: rendering"
            );
        }
        let docs = chat_documents(fixture().join("chat_tools.jsonl"), hf(folder), None);
        assert_like_python(folder, &docs, chats, eos);
    }
}

#[test]
fn spec_special_tokens_reach_the_chat_template() {
    // The Llama 2 template writes `bos_token` and `eos_token`: the spec's, as
    // `AutoTokenizer.from_pretrained(folder, bos_token=..., eos_token=...)` renders them.
    let expected = expected();
    let want = &expected["overrides"];
    let text = |key: &str| Some(want[key].as_str().unwrap().to_string());
    let tokenizer = TokenizerConfig::HuggingFace {
        path: fixture().join("metaspace"),
        bos_token: text("bos_token"),
        eos_token: text("eos_token"),
    };
    let docs = chat_documents(fixture().join("chat_metaspace.jsonl"), tokenizer, None);
    assert_like_python(
        "overridden special tokens",
        &docs,
        want["chats"].as_array().unwrap(),
        want["eos_id"].as_u64().unwrap() as u32,
    );
}

#[test]
fn prompt_completion_trains_the_completion_and_the_end_of_document() {
    let expected = expected();
    let mut merged_anywhere = 0;
    for name in TOKENIZERS {
        let want = &expected["tokenizers"][name];
        let eos = want["eos_id"].as_u64().unwrap() as u32;
        let records = want["prompt_completion"].as_array().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let source = DataSource::Jsonl {
            files: vec![fixture().join("prompt_completion.jsonl")],
            text: JsonlText::PromptCompletion {
                prompt: "prompt".into(),
                completion: "completion".into(),
            },
        };
        let data = Dataset::open(
            &dataset(source, hf(name), 64, cache.path()),
            0,
            None,
            2,
            &Quiet,
        )
        .unwrap();
        let docs = documents(data.train().corpus());
        assert_eq!(docs.len(), records.len());
        for (i, ((tokens, mask), record)) in docs.iter().zip(records).enumerate() {
            let python = ids(&record["ids"]);
            let mut python_mask: Vec<bool> = record["mask"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m.as_u64() == Some(1))
                .collect();
            let want_tokens = with_eos(python.clone(), eos);
            if want_tokens.len() > python.len() {
                python_mask.push(true);
            }
            assert_eq!(tokens, &want_tokens, "{name}: record {i} ids");
            assert_eq!(mask, &python_mask, "{name}: record {i} mask");
            assert_eq!(tokens.last(), Some(&eos));
            assert_eq!(mask.last(), Some(&true), "{name}: the model learns to stop");
        }
        // Records whose prompt ends inside a token running into the completion, as
        // transformers' offsets tell them: counted, and the data log warns.
        let merged = records.iter().filter(|r| r["merged"] == true).count() as u64;
        let manifest = &data.train().corpus().manifest;
        assert_eq!(manifest.merged_boundaries, merged, "{name}");
        let warned = data
            .summary()
            .iter()
            .any(|l| l.starts_with(&format!("warning: in {merged} prompt/completion record(s)")));
        assert_eq!(warned, merged > 0, "{name}: {:?}", data.summary());
        merged_anywhere += merged;
    }
    assert!(
        merged_anywhere > 0,
        "some tokenizer merges a prompt's end into its completion"
    );
}

#[test]
fn llama_and_code_llama_ids_are_those_of_transformers_rebuilt_tokenizer() {
    // transformers 5 drops the `Prepend` + `Replace` normalizer of a Llama 2 or CodeLlama
    // `tokenizer.json` for a Metaspace pre-tokenizer (leading spaces, text after `<s>` and
    // `</s>`, `[INST]`), follows `legacy` and `add_prefix_space`, gives CodeLlama `<s> $A`
    // whatever `add_eos_token` says, and uses byte-level and Mistral folders as saved.
    let folders = ids_equal_transformers_for_every_folder(&expected()["llama"]);
    assert!(folders >= 12);
}

#[test]
fn qwen2_family_ids_are_those_of_transformers_rebuilt_tokenizer() {
    // transformers 5 builds the tokenizer of Qwen2 folders (any class named) and of Qwen3
    // folders naming the Qwen2 class or none with Qwen's pre-tokenizer and NFC, so a
    // GPT-2-style `tokenizer.json` gives other ids there (numbers digit by digit, runs of
    // newlines, composed characters); it uses the file as saved where the folder names the
    // generic class outside `qwen2`.
    let expected = expected();
    let folders = ids_equal_transformers_for_every_folder(&expected["qwen2"]);
    assert!(folders >= 18);
    // The model types transformers gives the Qwen2 class are the ones shardrun rebuilds for.
    let model_types: Vec<&str> = expected["qwen2"]["model_types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(
        model_types,
        shardrun_data::rebuild::QWEN2_TOKENIZER_MODELS.to_vec()
    );
}

/// For every folder of a group of the fixture (`llama`, `qwen2`): the ids of its texts with
/// and without special tokens (and with offsets) are transformers', and the folder is said to
/// be rebuilt exactly where transformers' ids are not those of its `tokenizer.json` as saved.
/// Returns how many folders there were.
fn ids_equal_transformers_for_every_folder(group: &serde_json::Value) -> usize {
    let texts: Vec<&str> = group["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let folders = group["folders"].as_object().unwrap();
    for (folder, want) in folders {
        let tokenizer = TextTokenizer::load(&hf(folder)).unwrap();
        let rebuilt = want["rebuilt"].as_bool().unwrap();
        let class = want["class"].as_str().unwrap();
        for (i, text) in texts.iter().enumerate() {
            for (special, key) in [(true, "with_special"), (false, "without_special")] {
                let python = ids(&want[key][i]);
                assert_eq!(
                    tokenizer.encode(text, special, false).unwrap().ids,
                    python,
                    "{folder} ({class}): {text:?}, special tokens {special}"
                );
                let with_offsets = tokenizer.encode(text, special, true).unwrap();
                assert_eq!(with_offsets.ids, python, "{folder}: {text:?} with offsets");
            }
        }
        // The fixture tells the cases apart: transformers' ids are not those of the saved
        // tokenizer.json exactly where it rebuilds the tokenizer.
        let differing = (0..texts.len())
            .filter(|&i| want["with_special"][i] != want["tokenizer_json"][i])
            .count();
        assert_eq!(rebuilt, differing > 0, "{folder}: {differing} texts differ");
        assert_eq!(
            rebuilt,
            tokenizer
                .description
                .contains("built as transformers 5 builds"),
            "{folder}: {}",
            tokenizer.description
        );
    }
    folders.len()
}

#[test]
fn code_llama_adds_the_spec_bos_token_as_transformers_does() {
    // `AutoTokenizer.from_pretrained(folder, bos_token=...)`: CodeLlama's rebuilt
    // post-processor adds the token given; LlamaTokenizer keeps the one its file adds.
    let expected = expected();
    let want = &expected["llama"]["overrides"];
    let text = |key: &str| Some(want[key].as_str().unwrap().to_string());
    for (folder, python) in want["folders"].as_object().unwrap() {
        let tokenizer = TextTokenizer::load(&TokenizerConfig::HuggingFace {
            path: fixture().join(folder),
            bos_token: text("bos_token"),
            eos_token: text("eos_token"),
        })
        .unwrap();
        for (i, text) in expected["llama"]["texts"]
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
        {
            let text = text.as_str().unwrap();
            assert_eq!(
                tokenizer.encode(text, true, false).unwrap().ids,
                ids(&python[i]),
                "{folder}: {text:?}"
            );
        }
    }
}
