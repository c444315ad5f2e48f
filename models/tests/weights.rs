//! A folder written by `save_folder` reads back through `HfWeights` range by range, in each
//! stored dtype, across the chunks a read maps one at a time and across index files.

use serde_json::json;
use shardrun_models::hf::{save_folder, HfWeights, SaveOptions, StoredDtype};

fn value(name: &str, i: u64) -> f32 {
    // Exactly representable in f16 and bf16 for the small ones, varied for the big one.
    let base = if name == "big" {
        (i % 256) as f32 / 8.0
    } else {
        i as f32
    };
    base - 3.0
}

#[test]
fn ranges_read_back_in_every_dtype_and_split() {
    let tensors = vec![
        ("a".to_string(), vec![3, 5]),
        ("big".to_string(), vec![5_000_001]),
        ("b".to_string(), vec![7]),
    ];
    for (dtype, max_shard_bytes) in [
        (StoredDtype::F32, u64::MAX),
        (StoredDtype::Bf16, 1_000),
        (StoredDtype::F16, 50),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("m");
        let saved = save_folder(
            &dir,
            &json!({"model_type": "llama"}),
            &tensors,
            |name, out| {
                let n: u64 = tensors
                    .iter()
                    .find(|(t, _)| t == name)
                    .unwrap()
                    .1
                    .iter()
                    .product();
                out.extend((0..n).map(|i| value(name, i)));
                Ok(())
            },
            &[],
            &SaveOptions {
                dtype,
                max_shard_bytes,
            },
        )
        .unwrap();
        let split = saved.weight_files.len() > 1;
        assert_eq!(split, max_shard_bytes != u64::MAX, "{dtype:?}");
        let weights = HfWeights::open(&dir).unwrap();
        assert_eq!(weights.main_dtype(), Some(dtype));
        for (name, range) in [
            ("a", 0..15),
            ("a", 4..9),
            ("b", 6..7),
            ("big", 0..5_000_001),
            ("big", 4_194_300..4_194_310),
            ("big", 123..4_500_000),
        ] {
            let mut out = vec![0.0; (range.end - range.start) as usize];
            weights.read(name, range.clone(), &mut out).unwrap();
            for (k, v) in out.iter().enumerate() {
                assert_eq!(
                    *v,
                    value(name, range.start + k as u64),
                    "{dtype:?} {name}[{}]",
                    range.start + k as u64
                );
            }
        }
        let mut out = vec![0.0; 2];
        let err = weights.read("b", 6..8, &mut out).unwrap_err().to_string();
        assert!(err.contains("tensor `b`"), "{err}");
    }
}

#[test]
fn a_value_float16_cannot_hold_is_refused_and_no_folder_is_left() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    let tensors = vec![("embed".to_string(), vec![4])];
    let save = |dtype| {
        save_folder(
            &dir,
            &json!({"model_type": "llama"}),
            &tensors,
            |_, out| {
                out.extend([0.5, -1.0e6, 7.0e4, 2.0]);
                Ok(())
            },
            &[],
            &SaveOptions {
                dtype,
                max_shard_bytes: u64::MAX,
            },
        )
    };
    let err = save(StoredDtype::F16).unwrap_err().to_string();
    assert!(
        err.contains("`embed`")
            && err.contains("holds -1e6, past the largest float16 value")
            && err.contains("export with `--dtype bf16`"),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0, "{err}");
    // bfloat16 has float32's range.
    save(StoredDtype::Bf16).unwrap();
    let mut out = vec![0.0; 4];
    HfWeights::open(&dir)
        .unwrap()
        .read("embed", 0..4, &mut out)
        .unwrap();
    assert_eq!(out, [0.5, -999424.0, 70144.0, 2.0]);
}

#[test]
fn what_a_killed_export_left_is_removed_by_the_next_one() {
    let tmp = tempfile::tempdir().unwrap();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let host = host.trim();
    // A pid no process has (past the kernel's pid_max), and one that is alive (init's).
    let dead = format!(".m.partial-{host}-4294967295");
    let old_build = ".m.partial-4294967294".to_string();
    let alive = format!(".m.partial-{host}-1");
    let other_machine = ".m.partial-elsewhere-4294967295".to_string();
    let other_export = format!(".n.partial-{host}-4294967295");
    // With lock files: one still held (a live export whose pid this machine cannot see, as
    // from another container) stays, one free (its process gone, on any machine) goes.
    let held = format!(".m.partial-{host}-4294967293");
    let freed = ".m.partial-elsewhere-7".to_string();
    for left in [
        &dead,
        &old_build,
        &alive,
        &other_machine,
        &other_export,
        &held,
        &freed,
    ] {
        std::fs::create_dir_all(tmp.path().join(left).join("half")).unwrap();
    }
    let lock = |name: &str| std::fs::File::create(tmp.path().join(format!("{name}.lock"))).unwrap();
    let holder = lock(&held);
    holder.try_lock().unwrap();
    drop(lock(&freed));
    save_folder(
        &tmp.path().join("m"),
        &json!({"model_type": "llama"}),
        &[("w".to_string(), vec![2])],
        |_, out| {
            out.extend([1.0, 2.0]);
            Ok(())
        },
        &[],
        &SaveOptions {
            dtype: StoredDtype::F32,
            max_shard_bytes: u64::MAX,
        },
    )
    .unwrap();
    let mut left: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    let held_lock = format!("{held}.lock");
    let mut expected = vec![
        alive,
        other_machine,
        other_export,
        held,
        held_lock,
        "m".to_string(),
    ];
    expected.sort();
    assert_eq!(left, expected);
}

/// Tokenizer and generation files copied into a saved folder get this user's default mode,
/// not their source's: a read-only shared model folder would otherwise give a folder whose
/// owner cannot `save_pretrained` over its files.
#[test]
fn copied_files_are_written_with_the_default_mode_not_the_sources() {
    use shardrun_models::hf::FolderFile;
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let source = tmp.path().join("tokenizer.json");
    std::fs::write(&source, "{\"version\": \"1.0\"}").unwrap();
    std::fs::set_permissions(&source, std::fs::Permissions::from_mode(0o444)).unwrap();
    let out = tmp.path().join("m");
    save_folder(
        &out,
        &json!({"model_type": "llama"}),
        &[("w".to_string(), vec![2])],
        |_, out| {
            out.extend([1.0, 2.0]);
            Ok(())
        },
        &[FolderFile::copy_of("tokenizer.json", &source)],
        &SaveOptions {
            dtype: StoredDtype::F32,
            max_shard_bytes: u64::MAX,
        },
    )
    .unwrap();
    let copy = out.join("tokenizer.json");
    assert_eq!(
        std::fs::read(&copy).unwrap(),
        std::fs::read(&source).unwrap()
    );
    let mode = |path: &std::path::Path| std::fs::metadata(path).unwrap().permissions().mode();
    assert_eq!(mode(&copy) & 0o777, mode(&out.join("config.json")) & 0o777);
    assert_ne!(mode(&copy) & 0o200, 0, "{:o}", mode(&copy));
}
