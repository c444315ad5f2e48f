//! Writing a Hugging Face folder that `from_pretrained` loads: `config.json`, the weights as
//! `model.safetensors` (or, past `max_shard_bytes`, `model-0000i-of-0000n.safetensors` with a
//! `model.safetensors.index.json`, as `save_pretrained` splits them), and the tokenizer and
//! generation files the caller gives (without a `generation_config.json` among them, one
//! derived from `config.json`'s token ids, as `save_pretrained` writes it).
//! Tensors are streamed one at a time, so nothing holds the whole model. The folder is
//! written under a temporary name, fsynced, and renamed into place: an interrupted export
//! leaves no half folder.

use super::config::{generation_config_json, GENERATION_CONFIG_FILE};
use super::weights::StoredDtype;
use super::{HfError, CONFIG_FILE, INDEX_FILE, SINGLE_FILE};
use crate::partial::PartialFolders;
use safetensors::tensor::{Metadata, TensorInfo};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaveOptions {
    pub dtype: StoredDtype,
    /// Split the weights into files of at most this many bytes (a larger tensor gets a file
    /// of its own), as `save_pretrained(max_shard_size=...)`.
    pub max_shard_bytes: u64,
}

/// What was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedFolder {
    pub dir: PathBuf,
    /// Weight files with their sizes.
    pub weight_files: Vec<(String, u64)>,
    /// Whether `generation_config.json` was written from `config.json`'s token ids (none was
    /// given).
    pub derived_generation_config: bool,
}

/// A file of the folder besides `config.json` and the weights.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FolderFile {
    /// Its path in the folder (`tokenizer.json`, `additional_chat_templates/tool_use.jinja`).
    pub name: String,
    pub contents: FileContents,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileContents {
    /// A copy of this file.
    CopyOf(PathBuf),
    Bytes(Vec<u8>),
}

impl FolderFile {
    pub fn copy_of(name: impl Into<String>, path: impl Into<PathBuf>) -> FolderFile {
        FolderFile {
            name: name.into(),
            contents: FileContents::CopyOf(path.into()),
        }
    }

    pub fn bytes(name: impl Into<String>, bytes: impl Into<Vec<u8>>) -> FolderFile {
        FolderFile {
            name: name.into(),
            contents: FileContents::Bytes(bytes.into()),
        }
    }
}

/// Where `transformers` 5.x saves the chat templates other than `default`, as `NAME.jinja`.
pub const ADDITIONAL_CHAT_TEMPLATES: &str = "additional_chat_templates";

/// Whether a file of a model folder belongs to its tokenizer (chat templates included).
pub fn is_tokenizer_file(name: &str) -> bool {
    name.starts_with("tokenizer")
        || name.ends_with(".jinja")
        || name.ends_with(".tiktoken")
        || name.starts_with(&format!("{ADDITIONAL_CHAT_TEMPLATES}/"))
        || matches!(
            name,
            "special_tokens_map.json"
                | "added_tokens.json"
                | "vocab.json"
                | "vocab.txt"
                | "merges.txt"
                | "chat_template.json"
                | "preprocessor_config.json"
        )
}

/// The tokenizer files of the model or tokenizer folder `dir` (its chat templates in
/// `additional_chat_templates/` included) and its `generation_config.json`: what an export
/// of a model that started from it carries along, sorted by name.
pub fn tokenizer_and_generation_files(dir: &Path) -> Result<Vec<FolderFile>, HfError> {
    let mut files = Vec::new();
    let templates = dir.join(ADDITIONAL_CHAT_TEMPLATES);
    let templates_prefix = format!("{ADDITIONAL_CHAT_TEMPLATES}/");
    for (folder, prefix) in [(dir, ""), (templates.as_path(), templates_prefix.as_str())] {
        let entries = match std::fs::read_dir(folder) {
            Ok(entries) => entries,
            Err(e) if !prefix.is_empty() && e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(HfError::io("list", folder)(e)),
        };
        for entry in entries {
            let entry = entry.map_err(HfError::io("list", folder))?;
            // Followed through symlinks: a Hugging Face cache's snapshot folder holds only
            // links into its `blobs/`.
            let is_file = entry.path().is_file();
            let Some(fname) = entry.file_name().to_str().map(|n| format!("{prefix}{n}")) else {
                continue;
            };
            if is_file && (is_tokenizer_file(&fname) || fname == GENERATION_CONFIG_FILE) {
                files.push(FolderFile::copy_of(fname, entry.path()));
            }
        }
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(files)
}

/// Writes the folder `out` (which must not exist). `tensors` are (name, shape) in file
/// order; `values(name, buf)` fills `buf` with one tensor's f32 values; `files` are the
/// folder's other files (tokenizer, chat templates, generation settings).
pub fn save_folder(
    out: &Path,
    config: &Value,
    tensors: &[(String, Vec<u64>)],
    mut values: impl FnMut(&str, &mut Vec<f32>) -> Result<(), String>,
    files: &[FolderFile],
    options: &SaveOptions,
) -> Result<SavedFolder, HfError> {
    if out.exists() {
        return Err(HfError::folder(
            out,
            "already exists: remove it or choose another --out",
        ));
    }
    let name = out
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| HfError::folder(out, "is not a folder name"))?;
    // A bare name (`--out exported`) has the empty path as its parent: the current folder.
    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(HfError::io("create", parent))?;
    remove_abandoned_partials(parent, name);
    let tmp = parent.join(format!(
        "{}{}-{}",
        partial_prefix(name),
        this_host().unwrap_or_default(),
        std::process::id()
    ));
    // Held while the folder is written: what a killed export left is told from a live one
    // by its lock, free once its process is gone, on whatever machine it ran.
    let lock_path = lock_of(&tmp);
    let lock = File::create(&lock_path).map_err(HfError::io("create", &lock_path))?;
    let _ = lock.try_lock();
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(HfError::io("remove", &tmp))?;
    }
    std::fs::create_dir(&tmp).map_err(HfError::io("create", &tmp))?;
    WRITING.add(&tmp);
    let written = write_contents(&tmp, config, tensors, &mut values, files, options)
        .and_then(|contents| sync_dir(&tmp).map(|()| contents))
        .and_then(|contents| {
            WRITING
                .rename_into_place(&tmp, out)
                .map(|()| contents)
                .map_err(HfError::io("rename into place", out))
        });
    let (weight_files, derived_generation_config) = match written {
        Ok(w) => w,
        Err(e) => {
            // Also what the writes made again after an abandon removed it (a subfolder's
            // create_dir_all).
            WRITING.forget(&tmp);
            let _ = std::fs::remove_dir_all(&tmp);
            let _ = std::fs::remove_file(&lock_path);
            return Err(e);
        }
    };
    let _ = std::fs::remove_file(&lock_path);
    sync_dir(parent)?;
    Ok(SavedFolder {
        dir: out.to_path_buf(),
        weight_files,
        derived_generation_config,
    })
}

/// The partial folders this process is writing, for [`abandon_writes`].
static WRITING: PartialFolders = PartialFolders::new();

/// Removes the partial folders (and their lock files) this process is writing, for a process
/// about to end without unwinding (Ctrl-C during an export): otherwise a hidden folder as big
/// as the model stays until the next export to the same place. Returns them.
pub fn abandon_writes() -> Vec<PathBuf> {
    abandon_writes_where(|_| true)
}

fn abandon_writes_where(which: impl Fn(&Path) -> bool) -> Vec<PathBuf> {
    let abandoned = WRITING.abandon_where(which);
    for path in &abandoned {
        let _ = std::fs::remove_file(lock_of(path));
    }
    abandoned
}

/// An export is written under `.<name>.partial-<host>-<pid>` and renamed when complete.
fn partial_prefix(name: &str) -> String {
    format!(".{name}.partial-")
}

/// The lock file of the partial folder `tmp`, beside it.
fn lock_of(tmp: &Path) -> PathBuf {
    let mut name = tmp.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

/// The kernel's hostname: a shared file system sees exports from several machines.
fn this_host() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
}

/// Removes what exports to `name` killed before their rename left in `parent`. An export
/// holds a lock on its folder's lock file while it writes: a folder whose lock can be taken
/// is abandoned. Where the file system has no locks (or the folder none, from an older
/// build), a folder of this machine whose process is gone is. Anything else stays: it is
/// hidden and never taken for an export.
fn remove_abandoned_partials(parent: &Path, name: &str) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    let prefix = partial_prefix(name);
    let host = this_host();
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(owner) = file_name.to_str().and_then(|n| n.strip_prefix(&prefix)) else {
            continue;
        };
        if owner.ends_with(".lock") {
            continue;
        }
        let folder = entry.path();
        let lock_path = lock_of(&folder);
        let abandoned = match File::options().write(true).open(&lock_path) {
            Ok(lock) => match lock.try_lock() {
                Ok(()) => true,
                Err(std::fs::TryLockError::WouldBlock) => false,
                Err(std::fs::TryLockError::Error(_)) => process_gone(owner, host.as_deref()),
            },
            Err(_) => process_gone(owner, host.as_deref()),
        };
        if abandoned {
            let _ = std::fs::remove_dir_all(&folder);
            let _ = std::fs::remove_file(&lock_path);
        }
    }
}

/// Whether the process named by `<host>-<pid>` (a bare pid from builds that named no host) is
/// one of this machine's that has ended; `false` when that cannot be told.
fn process_gone(owner: &str, host: Option<&str>) -> bool {
    let Some(host) = host else {
        return false;
    };
    let (from, pid) = owner.rsplit_once('-').unwrap_or((host, owner));
    from == host
        && pid.parse::<u32>().is_ok_and(|pid| {
            pid != std::process::id() && !Path::new("/proc").join(pid.to_string()).exists()
        })
}

type Contents = (Vec<(String, u64)>, bool);
/// Fills the buffer with one tensor's f32 values, by name.
type Values<'a> = dyn FnMut(&str, &mut Vec<f32>) -> Result<(), String> + 'a;

fn write_contents(
    dir: &Path,
    config: &Value,
    tensors: &[(String, Vec<u64>)],
    values: &mut Values,
    files: &[FolderFile],
    options: &SaveOptions,
) -> Result<Contents, HfError> {
    let elt = options.dtype.size();
    let bytes_of = |shape: &[u64]| shape.iter().product::<u64>() * elt;
    // Greedy split in order, as save_pretrained does.
    let mut groups: Vec<Vec<usize>> = vec![Vec::new()];
    let mut group_bytes = 0;
    for (i, (_, shape)) in tensors.iter().enumerate() {
        let b = bytes_of(shape);
        if group_bytes > 0 && group_bytes + b > options.max_shard_bytes {
            groups.push(Vec::new());
            group_bytes = 0;
        }
        groups.last_mut().expect("one group").push(i);
        group_bytes += b;
    }
    let n = groups.len();
    let file_name = |g: usize| {
        if n == 1 {
            SINGLE_FILE.to_string()
        } else {
            format!("model-{:05}-of-{n:05}.safetensors", g + 1)
        }
    };
    let mut weight_files = Vec::new();
    let mut weight_map = BTreeMap::new();
    let mut f32_buf = Vec::new();
    let mut byte_buf = Vec::new();
    for (g, members) in groups.iter().enumerate() {
        let fname = file_name(g);
        let path = dir.join(&fname);
        let mut offset = 0usize;
        let mut infos = Vec::new();
        for &i in members {
            let (tname, shape) = &tensors[i];
            let len = bytes_of(shape) as usize;
            infos.push((
                tname.clone(),
                TensorInfo {
                    dtype: options.dtype.safetensors(),
                    shape: shape.iter().map(|&d| d as usize).collect(),
                    data_offsets: (offset, offset + len),
                },
            ));
            offset += len;
            weight_map.insert(tname.clone(), fname.clone());
        }
        let mut meta = HashMap::new();
        meta.insert("format".to_string(), "pt".to_string());
        let metadata = Metadata::new(Some(meta), infos)
            .map_err(|e| HfError::folder(&path, format!("cannot build the header: {e}")))?;
        let mut header = serde_json::to_vec(&metadata)
            .map_err(|e| HfError::folder(&path, format!("cannot encode the header: {e}")))?;
        header.resize(header.len().next_multiple_of(8), b' ');
        let file = File::create(&path).map_err(HfError::io("create", &path))?;
        let mut w = BufWriter::with_capacity(8 << 20, file);
        let io = HfError::io("write", &path);
        let put = |w: &mut BufWriter<File>, bytes: &[u8]| w.write_all(bytes);
        put(&mut w, &(header.len() as u64).to_le_bytes())
            .and_then(|()| put(&mut w, &header))
            .map_err(io)?;
        // Data in the header's offset order, which is the order tensors were listed in.
        for &i in members {
            let (tname, shape) = &tensors[i];
            let numel = shape.iter().product::<u64>() as usize;
            f32_buf.clear();
            values(tname, &mut f32_buf).map_err(|why| HfError::tensor(&path, tname, why))?;
            if f32_buf.len() != numel {
                return Err(HfError::tensor(
                    &path,
                    tname,
                    format!("{} values given for {numel} elements", f32_buf.len()),
                ));
            }
            if let Some(value) = options.dtype.encode(&f32_buf, &mut byte_buf) {
                return Err(HfError::tensor(
                    &path,
                    tname,
                    format!(
                        "holds {value:e}, past the largest {} value: it would be stored as \
                         infinity; export with {}",
                        options.dtype.torch_name(),
                        match options.dtype {
                            StoredDtype::F16 => "`--dtype bf16` (float32's range) or `--dtype f32`",
                            _ => "`--dtype f32`",
                        }
                    ),
                ));
            }
            put(&mut w, &byte_buf).map_err(HfError::io("write", &path))?;
        }
        let file = w
            .into_inner()
            .map_err(|e| HfError::io("write", &path)(e.into_error()))?;
        file.sync_all().map_err(HfError::io("fsync", &path))?;
        let size = file.metadata().map_err(HfError::io("stat", &path))?.len();
        weight_files.push((fname, size));
    }
    if n > 1 {
        let total: u64 = tensors.iter().map(|(_, s)| bytes_of(s)).sum();
        let index = json!({ "metadata": { "total_size": total }, "weight_map": weight_map });
        write_json(&dir.join(INDEX_FILE), &index)?;
    }
    write_json(&dir.join(CONFIG_FILE), config)?;
    let mut subfolders = BTreeSet::new();
    for file in files {
        let to = dir.join(&file.name);
        if let Some(parent) = to.parent().filter(|p| *p != dir) {
            std::fs::create_dir_all(parent).map_err(HfError::io("create", parent))?;
            subfolders.insert(parent.to_path_buf());
        }
        match &file.contents {
            FileContents::CopyOf(from) => {
                // The contents, not the mode (`fs::copy` keeps a read-only source's, and the
                // folder's owner could not `save_pretrained` over it).
                let mut source = File::open(from).map_err(HfError::io("open", from))?;
                let mut copy = File::create(&to).map_err(HfError::io("create", &to))?;
                std::io::copy(&mut source, &mut copy).map_err(HfError::io("copy", from))?;
                copy.sync_all().map_err(HfError::io("fsync", &to))?;
            }
            FileContents::Bytes(bytes) => write_file(&to, bytes)?,
        }
    }
    for folder in &subfolders {
        sync_dir(folder)?;
    }
    // As `save_pretrained`: a generative model's folder holds its generation settings, and
    // without a file of its own they follow from the config's token ids.
    let mut derived = false;
    if !files.iter().any(|f| f.name == GENERATION_CONFIG_FILE) {
        if let Some(generation) = generation_config_json(config) {
            write_json(&dir.join(GENERATION_CONFIG_FILE), &generation)?;
            derived = true;
        }
    }
    Ok((weight_files, derived))
}

fn write_json(path: &Path, value: &Value) -> Result<(), HfError> {
    let mut text = serde_json::to_string_pretty(value).expect("JSON values serialize");
    text.push('\n');
    write_file(path, text.as_bytes())
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), HfError> {
    let mut file = File::create(path).map_err(HfError::io("create", path))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(HfError::io("write", path))
}

fn sync_dir(dir: &Path) -> Result<(), HfError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(HfError::io("fsync", dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A folder abandoned while it is written (Ctrl-C during an export) is removed with its lock
    /// file at once, and never renamed into place: the export that was writing it fails.
    #[test]
    fn an_abandoned_export_is_removed_and_never_renamed_into_place() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("m");
        let (reached, wait) = std::sync::mpsc::channel();
        let (go_on, resume) = std::sync::mpsc::channel::<()>();
        let writer = std::thread::spawn({
            let out = out.clone();
            move || {
                save_folder(
                    &out,
                    &json!({"model_type": "llama"}),
                    &[("w".to_string(), vec![2])],
                    |_, values| {
                        // Mid-write: the test abandons the folder now.
                        reached.send(()).unwrap();
                        resume.recv().unwrap();
                        values.extend([1.0, 2.0]);
                        Ok(())
                    },
                    &[],
                    &SaveOptions {
                        dtype: StoredDtype::F32,
                        max_shard_bytes: u64::MAX,
                    },
                )
            }
        });
        wait.recv().unwrap();
        let abandoned = abandon_writes_where(|p| p.starts_with(tmp.path()));
        assert_eq!(abandoned.len(), 1, "{abandoned:?}");
        assert!(
            abandoned[0]
                .file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(".m.partial-"),
            "{abandoned:?}"
        );
        go_on.send(()).unwrap();
        // It fails writing into the removed folder, or at the rename.
        writer.join().unwrap().unwrap_err();
        assert!(!out.exists() && !abandoned[0].exists());
        let locks: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".lock"))
            .collect();
        assert!(locks.is_empty(), "{locks:?}");
    }
}
