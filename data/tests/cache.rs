//! The cache: a second run with nothing changed tokenizes nothing; editing a data file or
//! swapping the tokenizer tokenizes again into a new folder; processes preparing the same
//! data at once do the work once.

mod common;

use common::*;
use shardrun_data::{outdated, DataIdentity, Dataset, Quiet};
use shardrun_protocol::config::*;
use std::path::Path;
use std::time::Instant;

fn write_corpus(dir: &Path) -> Vec<std::path::PathBuf> {
    let a = dir.join("a.txt");
    let b = dir.join("b.txt");
    std::fs::write(&a, "def add(a, b):\n    return a + b\n".repeat(50)).unwrap();
    std::fs::write(&b, "The tokenizer runs once per data version.\n".repeat(50)).unwrap();
    vec![a, b]
}

#[test]
fn only_a_change_of_data_or_tokenizer_tokenizes_again() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let files = write_corpus(dir.path());
    let config = |tokenizer: &str| {
        dataset(
            text_files(files.clone(), TextSplit::File),
            hf(tokenizer),
            32,
            &cache,
        )
    };
    let first = Dataset::open(&config("bpe"), 0, None, 2, &Quiet).unwrap();
    assert!(first.built());

    let started = Instant::now();
    let second = Dataset::open(&config("bpe"), 0, None, 2, &Quiet).unwrap();
    let reopen = started.elapsed();
    assert!(!second.built(), "nothing changed: nothing is tokenized");
    assert_eq!(second.fingerprint(), first.fingerprint());
    // Not a timed assertion (the benchmark measures it): shown for the record.
    eprintln!(
        "reopening the prepared data took {:.1} ms",
        reopen.as_secs_f64() * 1e3
    );

    // Edit one file: a new cache folder; the old one is left as it was.
    std::fs::write(&files[1], "An edited document.\n".repeat(40)).unwrap();
    let edited = Dataset::open(&config("bpe"), 0, None, 2, &Quiet).unwrap();
    assert!(edited.built(), "an edited file is tokenized again");
    assert_ne!(edited.fingerprint(), first.fingerprint());
    assert_ne!(edited.train().corpus().dir, first.train().corpus().dir);
    assert!(first.train().corpus().dir.join("manifest.json").is_file());

    // Another tokenizer over the same files.
    let swapped = Dataset::open(&config("metaspace"), 0, None, 2, &Quiet).unwrap();
    assert!(swapped.built(), "another tokenizer tokenizes again");
    assert_ne!(swapped.fingerprint(), edited.fingerprint());

    // Back to the first tokenizer: that version is cached.
    let again = Dataset::open(&config("bpe"), 0, None, 2, &Quiet).unwrap();
    assert!(!again.built());
    assert_eq!(again.fingerprint(), edited.fingerprint());

    // Rewriting a file with the same bytes changes its times, so the key: a new folder,
    // whose files are the old folder's (linked, not tokenized again), and the same sample
    // stream a checkpoint records.
    let bytes = std::fs::read(&files[0]).unwrap();
    std::fs::write(&files[0], &bytes).unwrap();
    let said = Lines::default();
    let touched = Dataset::open(&config("bpe"), 0, None, 2, &said).unwrap();
    assert_eq!(touched.fingerprint(), edited.fingerprint());
    let (old, new) = (&edited.train().corpus().dir, &touched.train().corpus().dir);
    assert_ne!(old, new);
    let said = said.0.lock().unwrap().clone();
    assert!(
        said.iter().any(|l| l.contains("only their times changed"))
            && !said.iter().any(|l| l.starts_with("preparing")),
        "{said:?}"
    );
    let inode = |dir: &std::path::Path| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(dir.join("tokens.u32")).unwrap().ino()
    };
    assert_eq!(
        inode(old),
        inode(new),
        "the tokens are the old folder's file"
    );
    // Its manifest lists the files' times as they are now: opened again, it is found.
    let reopened = Dataset::open(&config("bpe"), 0, None, 2, &Quiet).unwrap();
    assert!(!reopened.built());
    assert_eq!(&reopened.train().corpus().dir, new);

    // A cache damaged in place (both names of its tokens at once) is not taken again: the
    // data is tokenized anew, into the same tokens as before the damage.
    let tokens = new.join("tokens.u32");
    let mut damaged = std::fs::read(&tokens).unwrap();
    damaged[0] ^= 1;
    std::fs::write(&tokens, &damaged).unwrap();
    std::fs::write(&files[0], &bytes).unwrap();
    let said = Lines::default();
    let anew = Dataset::open(&config("bpe"), 0, None, 2, &said).unwrap();
    assert_eq!(anew.fingerprint(), edited.fingerprint());
    let said = said.0.lock().unwrap().clone();
    assert!(said.iter().any(|l| l.starts_with("preparing")), "{said:?}");

    // The same size but other bytes: the hashes tell them apart.
    let mut changed = bytes.clone();
    changed[0] = if changed[0] == b'x' { b'y' } else { b'x' };
    std::fs::write(&files[0], &changed).unwrap();
    let said = Lines::default();
    let rewritten = Dataset::open(&config("bpe"), 0, None, 2, &said).unwrap();
    assert!(rewritten.built());
    assert_ne!(rewritten.fingerprint(), edited.fingerprint());
    let said = said.0.lock().unwrap().clone();
    assert!(said.iter().any(|l| l.starts_with("preparing")), "{said:?}");
}

/// Every line a preparation says.
#[derive(Default)]
struct Lines(std::sync::Mutex<Vec<String>>);

impl shardrun_data::Observer for Lines {
    fn line(&self, text: &str) {
        self.0.lock().unwrap().push(text.to_string());
    }
}

/// Reports when a preparation starts waiting for the lock.
struct Waiting(std::sync::mpsc::Sender<()>);

impl shardrun_data::Observer for Waiting {
    fn line(&self, text: &str) {
        if text.starts_with("waiting for another process") {
            let _ = self.0.send(());
        }
    }
}

#[test]
fn concurrent_preparations_wait_for_the_first_and_tokenize_once() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_corpus(dir.path());
    // The cache's name does not depend on where it is: learn it from a first copy.
    let probe = dataset(
        text_files(files.clone(), TextSplit::Line),
        hf("bpe"),
        16,
        &dir.path().join("probe"),
    );
    let probed = Dataset::open(&probe, 0, None, 1, &Quiet).unwrap();
    let name = probed.train().corpus().dir.file_name().unwrap().to_owned();

    // Hold the lock as a preparing process would, start four preparations, and let go once
    // every one of them is waiting.
    let cache = dir.path().join("cache");
    std::fs::create_dir_all(&cache).unwrap();
    let lock =
        std::fs::File::create(cache.join(format!(".{}.lock", name.to_str().unwrap()))).unwrap();
    lock.lock().unwrap();
    let config = dataset(text_files(files, TextSplit::Line), hf("bpe"), 16, &cache);
    let (tx, rx) = std::sync::mpsc::channel();
    let results: Vec<(bool, String)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let waiting = Waiting(tx.clone());
                let config = &config;
                scope.spawn(move || {
                    let d = Dataset::open(config, 0, None, 1, &waiting).unwrap();
                    (d.built(), d.fingerprint().to_string())
                })
            })
            .collect();
        for _ in 0..4 {
            rx.recv().unwrap();
        }
        assert!(
            cache_entries(&cache).is_empty(),
            "nobody builds while the lock is held"
        );
        lock.unlock().unwrap();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(
        results.iter().filter(|(built, _)| *built).count(),
        1,
        "{results:?}"
    );
    assert!(results.iter().all(|(_, f)| f == probed.fingerprint()));
    assert_eq!(
        cache_entries(&cache).len(),
        1,
        "one complete folder, no leftovers"
    );
}

#[test]
fn editing_a_named_chat_template_tokenizes_again() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("named");
    let templates = folder.join("additional_chat_templates");
    std::fs::create_dir_all(&templates).unwrap();
    for name in [
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    ] {
        std::fs::copy(fixture().join("named").join(name), folder.join(name)).unwrap();
    }
    let tool_use = templates.join("tool_use.jinja");
    std::fs::copy(
        fixture().join("named/additional_chat_templates/tool_use.jinja"),
        &tool_use,
    )
    .unwrap();
    let source = DataSource::Chat {
        files: vec![fixture().join("chat_tools.jsonl")],
        messages_field: "messages".into(),
        chat_template: None,
        chat_template_kwargs: Default::default(),
    };
    let tokenizer = TokenizerConfig::HuggingFace {
        path: folder,
        bos_token: None,
        eos_token: None,
    };
    let config = dataset(source, tokenizer, 64, &dir.path().join("cache"));
    let first = Dataset::open(&config, 0, None, 2, &Quiet).unwrap();
    assert!(first.built());
    assert!(!Dataset::open(&config, 0, None, 2, &Quiet).unwrap().built());

    // Only the records with tools render with it, and they change.
    let text = std::fs::read_to_string(&tool_use).unwrap();
    std::fs::write(&tool_use, text.replace("# Tools", "# Functions")).unwrap();
    let edited = Dataset::open(&config, 0, None, 2, &Quiet).unwrap();
    assert!(edited.built(), "an edited tool_use template is read again");
    assert_ne!(edited.fingerprint(), first.fingerprint());
}

#[test]
fn the_identity_of_prepared_data_is_found_without_preparing() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_corpus(dir.path());
    let training = dataset(
        text_files(vec![files[0].clone()], TextSplit::Line),
        hf("bpe"),
        16,
        &dir.path().join("cache"),
    );
    let mut config = training.clone();
    config.validation = Some(ValidationConfig {
        held_out: HeldOut::Files {
            files: vec![files[1].clone()],
        },
        every_steps: None,
        max_batches: None,
    });
    assert_eq!(
        DataIdentity::probe(&config).unwrap(),
        None,
        "nothing prepared"
    );
    Dataset::open(&training, 0, None, 1, &Quiet).unwrap();
    assert_eq!(
        DataIdentity::probe(&config).unwrap(),
        None,
        "the validation files are not prepared"
    );
    let opened = Dataset::open(&config, 0, None, 1, &Quiet).unwrap();
    let probed = DataIdentity::probe(&config).unwrap().unwrap();
    assert_eq!(&probed, opened.identity());
    assert_eq!(probed.validation.unwrap().files[0].path, files[1]);
    // The summary says which cache was made now and which was found.
    let line = |data: &Dataset, what: &str| -> String {
        data.summary()
            .iter()
            .find(|l| l.starts_with(&format!("{what}: ")))
            .unwrap_or_else(|| panic!("no {what} line: {:?}", data.summary()))
            .clone()
    };
    assert!(line(&opened, "training data").contains("(cached: "));
    assert!(line(&opened, "validation data").contains("(prepared in "));
    let again = Dataset::open(&config, 0, None, 1, &Quiet).unwrap();
    assert!(line(&again, "validation data").contains("(cached: "));
    let overlap = |data: &Dataset| {
        data.summary()
            .iter()
            .any(|l| l.contains("validation file(s) are training files too"))
    };
    assert!(!overlap(&again), "{:?}", again.summary());

    // Validation files that are training files too are said to be.
    config.validation.as_mut().unwrap().held_out = HeldOut::Files {
        files: vec![files[0].clone()],
    };
    let same = Dataset::open(&config, 0, None, 1, &Quiet).unwrap();
    assert!(overlap(&same), "{:?}", same.summary());
}

#[test]
fn the_folders_of_killed_builds_are_removed_and_live_ones_kept() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_corpus(dir.path());
    let config = |cache: &Path| {
        dataset(
            text_files(files.clone(), TextSplit::Line),
            TokenizerConfig::Bytes,
            16,
            cache,
        )
    };
    // The cache's name does not depend on where it is: learn it from a first copy.
    let probed = Dataset::open(&config(&dir.path().join("probe")), 0, None, 1, &Quiet).unwrap();
    let name = probed.train().corpus().dir.file_name().unwrap().to_owned();
    let name = name.to_str().unwrap();

    // A process that has ended, as one killed mid-build has, and one that runs until its
    // input closes.
    let mut ended = std::process::Command::new("true").spawn().unwrap();
    ended.wait().unwrap();
    let mut running = std::process::Command::new("cat")
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let cache = dir.path().join("cache");
    let host = shardrun_protocol::host::hostname();
    let leftover = |owner: String| {
        let folder = cache.join(format!(".{name}.tmp-{owner}"));
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::write(folder.join("tokens.u32"), b"half").unwrap();
        folder
    };
    let killed = leftover(format!("{}-{host}", ended.id()));
    let unnamed_host = leftover(ended.id().to_string());
    let live = leftover(format!("{}-{host}", running.id()));
    let elsewhere = leftover(format!("{}-another-{host}", ended.id()));
    // A build of data since edited, whose key is never opened again, and a folder of
    // another program's that only looks alike.
    let edited_since = cache.join(format!(".text-0123456789abcdef.tmp-{}-{host}", ended.id()));
    std::fs::create_dir_all(&edited_since).unwrap();
    std::fs::write(edited_since.join("tokens.u32"), b"half").unwrap();
    // Written to a while ago: a build of another key is only removed once quiet.
    let written_lately = cache.join(format!(".text-fedcba9876543210.tmp-{}-{host}", ended.id()));
    std::fs::create_dir_all(&written_lately).unwrap();
    let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    for path in [edited_since.join("tokens.u32"), edited_since.clone()] {
        std::fs::File::open(&path)
            .unwrap()
            .set_modified(hour_ago)
            .unwrap();
    }
    let not_ours = cache.join(format!(".notes.tmp-{}-{host}", ended.id()));
    std::fs::create_dir_all(&not_ours).unwrap();

    let said = Lines::default();
    let prepared = Dataset::open(&config(&cache), 0, None, 1, &said).unwrap();
    assert!(prepared.built());
    assert!(!killed.exists() && !unnamed_host.exists());
    assert!(!edited_since.exists());
    assert!(
        written_lately.exists(),
        "another key's build written to lately stays"
    );
    assert!(not_ours.exists(), "only what preparations name is removed");
    let lines = said.0.lock().unwrap().clone();
    for removed in [&killed, &unnamed_host, &edited_since] {
        let line = format!(
            "removed {}, left by a preparation that was killed",
            removed.display()
        );
        assert!(lines.contains(&line), "{line:?} in {lines:?}");
    }
    assert!(live.exists(), "a live process's build is left alone");
    assert!(
        elsewhere.exists(),
        "another machine's pids say nothing here"
    );

    // Opened again from the cache: a build killed since is removed too, once its process
    // has ended.
    let killed = leftover(format!("{}-{host}", ended.id()));
    drop(running.stdin.take());
    running.wait().unwrap();
    let cached = Dataset::open(&config(&cache), 0, None, 1, &Quiet).unwrap();
    assert!(!cached.built());
    assert!(!killed.exists() && !live.exists());
    assert!(elsewhere.exists());
}

/// A cache file damaged in place, its size unchanged (bit rot, a partial copy over it), is
/// found by the hash its manifest recorded, with and without a loss mask; the intact cache
/// passes.
#[test]
fn a_cache_damaged_in_place_fails_its_content_check() {
    let dir = tempfile::tempdir().unwrap();
    let texts = dir.path().join("t.jsonl");
    let pairs = dir.path().join("p.jsonl");
    std::fs::write(&texts, "{\"text\": \"one two\"}\n{\"text\": \"three\"}\n").unwrap();
    std::fs::write(
        &pairs,
        "{\"q\": \"ask\", \"a\": \"answer\"}\n{\"q\": \"more\", \"a\": \"yes\"}\n",
    )
    .unwrap();
    let sources = [
        DataSource::Jsonl {
            files: vec![texts],
            text: JsonlText::Field {
                field: "text".into(),
            },
        },
        DataSource::Jsonl {
            files: vec![pairs],
            text: JsonlText::PromptCompletion {
                prompt: "q".into(),
                completion: "a".into(),
            },
        },
    ];
    for (i, source) in sources.into_iter().enumerate() {
        let config = dataset(
            source,
            TokenizerConfig::Bytes,
            4,
            &dir.path().join(format!("cache{i}")),
        );
        let data = Dataset::open(&config, 0, None, 2, &Quiet).unwrap();
        data.verify_content().expect("the cache as written");
        let corpus = data.train().corpus();
        assert_eq!(corpus.manifest.loss_mask, i == 1);
        let tokens = corpus.dir.join("tokens.u32");
        let mut bytes = std::fs::read(&tokens).unwrap();
        bytes[4] ^= 0x01;
        std::fs::write(&tokens, &bytes).unwrap();
        let again = Dataset::open(&config, 0, None, 2, &Quiet).unwrap();
        let err = again.verify_content().unwrap_err().to_string();
        assert!(
            err.contains("its files hash to") && err.contains("remove the folder"),
            "{err}"
        );
    }
}

/// A cache file cut short or removed by hand: opening the cache names the file and what to
/// do, before anything is read from it.
#[test]
fn a_cache_file_cut_short_or_removed_is_named_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_corpus(dir.path());
    let source = DataSource::Text {
        files,
        split: TextSplit::Line,
    };
    let config = dataset(
        source,
        TokenizerConfig::Bytes,
        16,
        &dir.path().join("cache"),
    );
    let data = Dataset::open(&config, 0, None, 2, &Quiet).unwrap();
    let tokens = data.train().corpus().dir.join("tokens.u32");
    drop(data);

    let bytes = std::fs::read(&tokens).unwrap();
    std::fs::write(&tokens, &bytes[..bytes.len() / 2]).unwrap();
    let err = Dataset::open(&config, 0, None, 2, &Quiet)
        .err()
        .expect("a cut cache opens")
        .to_string();
    assert!(
        err.contains("tokens.u32")
            && err.contains(&format!("is {} bytes", bytes.len() / 2))
            && err.contains("remove the cache folder"),
        "{err}"
    );

    std::fs::remove_file(&tokens).unwrap();
    let err = Dataset::open(&config, 0, None, 2, &Quiet)
        .err()
        .expect("a cache without its tokens opens")
        .to_string();
    assert!(
        err.contains("tokens.u32")
            && err.contains("is missing")
            && err.contains("remove the cache folder"),
        "{err}"
    );

    // Token files are read in place: one gone after its data was prepared is not the
    // cache's to fix.
    let bin = dir.path().join("train.bin");
    std::fs::write(&bin, [1u16, 2, 3, 4].map(u16::to_le_bytes).concat()).unwrap();
    let config = dataset(
        DataSource::Tokens {
            files: vec![bin.clone()],
            dtype: TokenDtype::U16,
        },
        TokenizerConfig::PreTokenized,
        2,
        &dir.path().join("cache"),
    );
    let data = Dataset::open(&config, 0, None, 2, &Quiet).unwrap();
    let corpus = data.train().corpus();
    let (folder, manifest) = (corpus.dir.clone(), corpus.manifest.clone());
    drop(data);
    std::fs::remove_file(&bin).unwrap();
    let err = shardrun_data::corpus::Corpus::open(&folder, manifest)
        .err()
        .expect("a corpus without its token file opens")
        .to_string();
    assert!(
        err.starts_with(&format!("{}: is missing", bin.display()))
            && err.contains("run again")
            && !err.contains("cache folder"),
        "{err}"
    );
}

/// A corpus of two files under `dir/data` and the spec of its byte-tokenized cache under
/// `dir/cache`: (data folder, files, cache folder, spec).
fn corpus_and_cache(
    dir: &Path,
) -> (
    std::path::PathBuf,
    Vec<std::path::PathBuf>,
    std::path::PathBuf,
    DatasetConfig,
) {
    let data_dir = dir.join("data");
    std::fs::create_dir_all(&data_dir).unwrap();
    let files = write_corpus(&data_dir);
    let cache = dir.join("cache");
    let config = dataset(
        text_files(files.clone(), TextSplit::Line),
        TokenizerConfig::Bytes,
        16,
        &cache,
    );
    (data_dir, files, cache, config)
}

/// The cache folder a preparation of `config` reads.
fn folder_of(config: &DatasetConfig) -> std::path::PathBuf {
    let data = Dataset::open(config, 0, None, 2, &Quiet).unwrap();
    data.train().corpus().dir.clone()
}

/// Lock files of data no folder holds (a failed or killed preparation's) are removed, unless
/// held or of a folder or build that is there.
#[test]
fn lock_files_of_data_no_folder_holds_are_removed_unless_held() {
    let dir = tempfile::tempdir().unwrap();
    let (_, _, cache, config) = corpus_and_cache(dir.path());
    let prepared = folder_of(&config);
    let name = prepared.file_name().unwrap().to_str().unwrap().to_string();
    let lock = |key: &str| {
        let path = cache.join(format!(".{key}.lock"));
        std::fs::write(&path, "").unwrap();
        path
    };
    let of_folder = cache.join(format!(".{name}.lock"));
    assert!(of_folder.is_file());
    let orphan = lock("text-0123456789abcdef");
    let building = lock("text-1111111111111111");
    std::fs::create_dir(cache.join(".text-1111111111111111.tmp-1-host")).unwrap();
    let held = lock("text-2222222222222222");
    let holder = std::fs::File::open(&held).unwrap();
    holder.lock().unwrap();
    let not_ours = lock("notes");

    assert_eq!(outdated::remove_orphan_locks(&cache), 1);
    assert!(!orphan.exists());
    for kept in [&of_folder, &building, &held, &not_ours] {
        assert!(kept.exists(), "{}", kept.display());
    }
    drop(holder);
    assert_eq!(outdated::remove_orphan_locks(&cache), 1);
    assert!(!held.exists());
}

/// Every edit of the data leaves the folder of its earlier version, which no preparation
/// opens again: found by its changed or removed file, and removed with its lock.
#[test]
fn the_folders_of_edited_or_removed_files_are_outdated_and_removable() {
    let dir = tempfile::tempdir().unwrap();
    let (data_dir, files, cache, config) = corpus_and_cache(dir.path());
    let first = folder_of(&config);
    assert!(
        outdated::find(&cache).is_empty(),
        "its files are as they were"
    );

    // An edit that changes the size.
    let size = std::fs::metadata(&files[0]).unwrap().len();
    let mut text = std::fs::read_to_string(&files[0]).unwrap();
    text.push_str("x = 1\n");
    std::fs::write(&files[0], &text).unwrap();
    let second = folder_of(&config);
    let found = outdated::find(&cache);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].dir, first);
    assert_eq!(
        found[0].why,
        format!(
            "{}: changed, {size} → {} bytes",
            files[0].display(),
            size + 6
        )
    );
    let held: u64 = std::fs::read_dir(&first)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert_eq!(found[0].bytes, held, "nothing of it is linked elsewhere");

    // An edit in place at the same size, its time set back by a second: found by the time.
    // Preparing it again finds the same bytes and links the files: removing frees the
    // manifest only.
    let modified = std::fs::metadata(&files[1]).unwrap().modified().unwrap();
    let file = std::fs::File::options()
        .write(true)
        .open(&files[1])
        .unwrap();
    file.set_modified(modified - std::time::Duration::from_secs(1))
        .unwrap();
    // Until it is prepared again, its folder holds what those bytes tokenize to, which the
    // next preparation links: not outdated.
    assert_eq!(outdated::find(&cache).len(), 1);
    let third = folder_of(&config);
    assert_ne!(third, second);
    let found = outdated::find(&cache);
    assert_eq!(found.len(), 2, "{found:?}");
    assert_eq!(found[1].dir, second);
    assert_eq!(
        found[1].why,
        format!("{}: modified since", files[1].display())
    );
    let manifest = std::fs::metadata(second.join("manifest.json"))
        .unwrap()
        .len();
    assert_eq!(found[1].bytes, manifest);

    for folder in &found {
        outdated::remove(folder).unwrap();
    }
    // Another process's removal of the same folders got there first: nothing to do.
    outdated::remove(&found[0]).unwrap();
    let lock = cache.join(format!(
        ".{}.lock",
        first.file_name().unwrap().to_string_lossy()
    ));
    assert!(!first.exists() && !second.exists() && !lock.exists());
    assert!(outdated::find(&cache).is_empty());
    // The current folder is whole: its tokens were links to the removed one's.
    let data = Dataset::open(&config, 0, None, 2, &Quiet).unwrap();
    assert_eq!(data.train().corpus().dir, third);
    data.verify_content()
        .expect("the linked files outlive the folder they came from");

    // A removed file outdates the folder built from it.
    std::fs::remove_file(&files[1]).unwrap();
    let found = outdated::find(&cache);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].why, format!("{}: removed", files[1].display()));
    // Not when its folder is gone too: a mount this machine lacks is not a removal.
    let moved = dir.path().join("elsewhere");
    std::fs::rename(&data_dir, &moved).unwrap();
    assert!(outdated::find(&cache).is_empty());
    std::fs::rename(&moved, &data_dir).unwrap();

    // A removal killed midway leaves a hidden folder, removed later by the next one (here,
    // that of a process that has ended).
    let mut ended = std::process::Command::new("true").spawn().unwrap();
    ended.wait().unwrap();
    let host = shardrun_protocol::host::hostname().replace(['/', '\0'], "_");
    let left = cache.join(format!(".text-0.removing-{}-{host}", ended.id()));
    std::fs::create_dir_all(left.join("inside")).unwrap();
    let live = cache.join(format!(".text-1.removing-{}-{host}", std::process::id()));
    std::fs::create_dir_all(&live).unwrap();
    assert_eq!(outdated::remove_interrupted(&cache), 1);
    assert!(!left.exists() && live.exists());
}

/// A folder prepared again after a `touch` links its files to the older one's; an edit then
/// outdates both, and removing the two frees the linked files: counted once, to the folder
/// whose removal frees them.
#[test]
fn files_linked_between_outdated_folders_are_counted_as_freed_once() {
    let dir = tempfile::tempdir().unwrap();
    let (_, files, cache, config) = corpus_and_cache(dir.path());
    let first = folder_of(&config);
    let file = std::fs::File::options()
        .write(true)
        .open(&files[1])
        .unwrap();
    let modified = file.metadata().unwrap().modified().unwrap();
    file.set_modified(modified + std::time::Duration::from_secs(1))
        .unwrap();
    let second = folder_of(&config);
    let mut text = std::fs::read_to_string(&files[0]).unwrap();
    text.push_str("x = 1\n");
    std::fs::write(&files[0], &text).unwrap();
    folder_of(&config);

    let found = outdated::find(&cache);
    assert_eq!(
        found.iter().map(|o| &o.dir).collect::<Vec<_>>(),
        [&first, &second]
    );
    // What removing both frees: every file of the two folders once (by its inode).
    use std::os::unix::fs::MetadataExt;
    let mut inodes = std::collections::HashMap::new();
    for folder in [&first, &second] {
        for entry in std::fs::read_dir(folder).unwrap() {
            let meta = entry.unwrap().metadata().unwrap();
            inodes.insert(meta.ino(), meta.len());
        }
    }
    let linked = inodes.len() < 2 * std::fs::read_dir(&first).unwrap().count();
    assert!(linked, "the second folder links the first one's files");
    let on_disk: u64 = inodes.values().sum();
    assert_eq!(found[0].bytes + found[1].bytes, on_disk, "{found:?}");
    let tokens = std::fs::metadata(second.join("tokens.u32")).unwrap().len();
    assert!(found[1].bytes > tokens, "{found:?}");
}
