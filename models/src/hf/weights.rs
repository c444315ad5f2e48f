//! A folder's safetensors weights: `model.safetensors`, or the files a sharded
//! `model.safetensors.index.json` names. Opening reads only headers (and file sizes, so a
//! truncated file is found before anything is loaded); [`HfWeights::check`] compares the
//! tensors with an architecture's parameters; [`HfWeights::read`] converts any element range
//! of one parameter to f32, mapping only the bytes of that range, a bounded chunk at a time. A
//! rank therefore reads exactly its own shards and never holds more than its shards plus
//! one chunk.

use super::{HfError, INDEX_FILE, SINGLE_FILE};
use crate::param::ModelDescription;
use safetensors::tensor::{Dtype, Metadata, TensorInfo};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// safetensors refuses larger headers; so do we, before allocating.
const MAX_HEADER_BYTES: u64 = 100_000_000;
/// Elements converted per mapped chunk: bounds what a read maps at once (16 MiB of f32).
const CHUNK_ELEMENTS: u64 = 4 << 20;

/// Element types the weights may be stored in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoredDtype {
    F32,
    Bf16,
    F16,
}

impl StoredDtype {
    pub fn size(self) -> u64 {
        match self {
            StoredDtype::F32 => 4,
            StoredDtype::Bf16 | StoredDtype::F16 => 2,
        }
    }

    /// As `transformers` writes it in `config.json` (`torch_dtype`).
    pub fn torch_name(self) -> &'static str {
        match self {
            StoredDtype::F32 => "float32",
            StoredDtype::Bf16 => "bfloat16",
            StoredDtype::F16 => "float16",
        }
    }

    pub fn from_torch_name(name: &str) -> Option<StoredDtype> {
        match name {
            "float32" | "float" => Some(StoredDtype::F32),
            "bfloat16" => Some(StoredDtype::Bf16),
            "float16" | "half" => Some(StoredDtype::F16),
            _ => None,
        }
    }

    pub(crate) fn safetensors(self) -> Dtype {
        match self {
            StoredDtype::F32 => Dtype::F32,
            StoredDtype::Bf16 => Dtype::BF16,
            StoredDtype::F16 => Dtype::F16,
        }
    }

    /// Little-endian bytes of this dtype → f32.
    fn decode(self, bytes: &[u8], out: &mut [f32]) {
        match self {
            StoredDtype::F32 if cfg!(target_endian = "little") => {
                // SAFETY: `out` is plain f32 memory viewed as its bytes (any bit pattern is a
                // valid f32); on a little-endian host the file's bytes are the values.
                let dst = unsafe {
                    std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), out.len() * 4)
                };
                dst.copy_from_slice(&bytes[..dst.len()]);
            }
            StoredDtype::F32 => {
                for (v, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                    *v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            StoredDtype::Bf16 => {
                for (v, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *v = half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
                }
            }
            StoredDtype::F16 => {
                for (v, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *v = half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
                }
            }
        }
    }

    /// f32 → little-endian bytes of this dtype (round to nearest even, as `tensor.to()`).
    /// Returns the value of largest magnitude among the finite `values` this dtype cannot
    /// hold (stored as infinity), if any: float16 ends at 65504.
    pub fn encode(self, values: &[f32], out: &mut Vec<u8>) -> Option<f32> {
        out.clear();
        out.reserve(values.len() * self.size() as usize);
        let mut out_of_range: Option<f32> = None;
        let mut overflowed = |v: f32, infinite: bool| {
            if infinite && v.is_finite() && out_of_range.is_none_or(|o| v.abs() > o.abs()) {
                out_of_range = Some(v);
            }
        };
        match self {
            StoredDtype::F32 => values
                .iter()
                .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
            StoredDtype::Bf16 => values.iter().for_each(|&v| {
                let stored = half::bf16::from_f32(v);
                overflowed(v, stored.is_infinite());
                out.extend_from_slice(&stored.to_bits().to_le_bytes())
            }),
            StoredDtype::F16 => values.iter().for_each(|&v| {
                let stored = half::f16::from_f32(v);
                overflowed(v, stored.is_infinite());
                out.extend_from_slice(&stored.to_bits().to_le_bytes())
            }),
        }
        out_of_range
    }
}

/// Where one tensor's bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredTensor {
    pub file: PathBuf,
    pub dtype: StoredDtype,
    pub shape: Vec<u64>,
    /// Byte position of element 0 in the file.
    pub start: u64,
}

impl StoredTensor {
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// Every tensor of a folder's weight files, by name.
#[derive(Debug)]
pub struct HfWeights {
    /// What the tensors were listed from (`model.safetensors` or the index), for messages.
    source: PathBuf,
    tensors: BTreeMap<String, StoredTensor>,
    files: HashMap<PathBuf, File>,
    /// Parameters stored under another name, found by [`HfWeights::check`]: a tied
    /// embedding whose file holds only the output head.
    stored_as: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct IndexFile {
    weight_map: BTreeMap<String, String>,
}

impl HfWeights {
    /// Reads the headers of `<dir>/model.safetensors`, or where there is none, of every file
    /// `<dir>/model.safetensors.index.json` names: the file `from_pretrained` loads when a
    /// folder has both (an index left beside a model saved again whole), so the weights
    /// trained are the ones `transformers` shows.
    pub fn open(dir: &Path) -> Result<HfWeights, HfError> {
        let index_path = dir.join(INDEX_FILE);
        let single = dir.join(SINGLE_FILE);
        if single.is_file() {
            let (file, tensors) = read_header(&single)?;
            let mut files = HashMap::new();
            files.insert(single.clone(), file);
            Ok(HfWeights {
                source: single,
                tensors,
                files,
                stored_as: BTreeMap::new(),
            })
        } else if index_path.is_file() {
            Self::open_index(dir, &index_path)
        } else if dir.join("pytorch_model.bin").is_file()
            || dir.join("pytorch_model.bin.index.json").is_file()
        {
            Err(HfError::folder(
                dir,
                "holds PyTorch pickle weights (pytorch_model.bin); shardrun reads safetensors. Convert the weights (in their own dtype) and the tokenizer once into a new folder with: python -c \"import sys, transformers as t; a, b = sys.argv[1:]; t.AutoModelForCausalLM.from_pretrained(a, torch_dtype='auto').save_pretrained(b); t.AutoTokenizer.from_pretrained(a).save_pretrained(b)\" <folder> <new folder>",
            ))
        } else {
            Err(HfError::folder(
                dir,
                format!("has no {SINGLE_FILE} and no {INDEX_FILE}: is this a Hugging Face model folder?"),
            ))
        }
    }

    fn open_index(dir: &Path, index_path: &Path) -> Result<HfWeights, HfError> {
        let text = std::fs::read_to_string(index_path).map_err(HfError::io("read", index_path))?;
        let index: IndexFile = serde_json::from_str(&text).map_err(|e| {
            HfError::folder(
                index_path,
                format!(
                    "is not a safetensors index ({e}): it needs a `weight_map` of tensor → file"
                ),
            )
        })?;
        let mut names_by_file: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (tensor, file) in &index.weight_map {
            if file.contains('/') || file.starts_with('.') {
                return Err(HfError::tensor(
                    index_path,
                    tensor,
                    format!("is mapped to \"{file}\", which is not a file of this folder"),
                ));
            }
            names_by_file.entry(file.as_str()).or_default().push(tensor);
        }
        let mut tensors = BTreeMap::new();
        let mut files = HashMap::new();
        for (file_name, listed) in names_by_file {
            let path = dir.join(file_name);
            if !path.is_file() {
                return Err(HfError::tensor(
                    index_path,
                    listed[0],
                    format!(
                        "is in {file_name} according to the index, but {} does not exist: copy the missing file",
                        path.display()
                    ),
                ));
            }
            let (file, in_file) = read_header(&path)?;
            for name in listed {
                if !in_file.contains_key(name) {
                    return Err(HfError::tensor(
                        &path,
                        name,
                        format!("is missing from the file, though {INDEX_FILE} says it is here"),
                    ));
                }
            }
            for (name, tensor) in in_file {
                if let Some(other) = tensors.get(&name).map(|t: &StoredTensor| t.file.clone()) {
                    return Err(HfError::tensor(
                        &path,
                        &name,
                        format!("is also in {}: which one is meant?", other.display()),
                    ));
                }
                tensors.insert(name, tensor);
            }
            files.insert(path, file);
        }
        Ok(HfWeights {
            source: index_path.to_path_buf(),
            tensors,
            files,
            stored_as: BTreeMap::new(),
        })
    }

    pub fn tensors(&self) -> &BTreeMap<String, StoredTensor> {
        &self.tensors
    }

    pub fn get(&self, name: &str) -> Option<&StoredTensor> {
        self.tensors.get(name)
    }

    /// Total bytes of all tensors on disk.
    pub fn total_bytes(&self) -> u64 {
        self.tensors
            .values()
            .map(|t| t.numel() * t.dtype.size())
            .sum()
    }

    /// The dtype most tensors are stored in.
    pub fn main_dtype(&self) -> Option<StoredDtype> {
        let mut counts: Vec<(StoredDtype, u64)> = Vec::new();
        for t in self.tensors.values() {
            match counts.iter_mut().find(|(d, _)| *d == t.dtype) {
                Some((_, n)) => *n += t.numel(),
                None => counts.push((t.dtype, t.numel())),
            }
        }
        counts.into_iter().max_by_key(|(_, n)| *n).map(|(d, _)| d)
    }

    /// Checks that the stored tensors are exactly `model`'s parameters with the same shapes,
    /// as `from_pretrained` loads them. Accepted, and returned as notes: a tied parameter
    /// stored only under its alias (`lm_head.weight` without `model.embed_tokens.weight`),
    /// which [`HfWeights::read`] then reads from there, as `transformers` ties to whichever
    /// of the two the file has; the alias stored beside its parameter (not read: whether the
    /// two agree is the caller's question, see [`super::open_folder`]); rotary `inv_freq`
    /// buffers of old checkpoints.
    pub fn check(&mut self, model: &ModelDescription, dir: &Path) -> Result<Vec<String>, HfError> {
        let config = dir.join(super::CONFIG_FILE);
        let mut notes = Vec::new();
        self.stored_as.clear();
        for p in &model.params {
            let t = match self.tensors.get(&p.name) {
                Some(t) => t,
                None => {
                    let alias = model
                        .tied
                        .iter()
                        .find(|t| t.param == p.name)
                        .and_then(|t| self.tensors.get_key_value(&t.alias));
                    let Some((alias, t)) = alias else {
                        let why = if p.name == crate::llama::LM_HEAD {
                            format!(
                                "is missing: {} says tie_word_embeddings: false (or leaves it out). If the output head is the token embedding, set it to true",
                                config.display()
                            )
                        } else {
                            format!(
                                "is missing: {} describes a model with this parameter. Is the folder complete, and is config.json the one of these weights?",
                                config.display()
                            )
                        };
                        return Err(HfError::tensor(&self.source, &p.name, why));
                    };
                    notes.push(format!(
                        "{} read from {alias} in {}: the model ties them (tie_word_embeddings) and the file stores only {alias}",
                        p.name,
                        t.file.display()
                    ));
                    self.stored_as.insert(p.name.clone(), alias.clone());
                    t
                }
            };
            let expected: Vec<u64> = p.shape.iter().map(|&d| d as u64).collect();
            if t.shape != expected {
                return Err(HfError::tensor(
                    &t.file,
                    &p.name,
                    format!(
                        "has shape {:?} but {} implies {expected:?}: the config does not describe these weights",
                        t.shape,
                        config.display()
                    ),
                ));
            }
        }
        for (name, t) in &self.tensors {
            if model.param(name).is_some() || self.stored_as.values().any(|s| s == name) {
                continue;
            }
            if model.tied.iter().any(|tied| &tied.alias == name) {
                notes.push(format!(
                    "{name} in {} ignored: the model ties it to the token embedding (tie_word_embeddings)",
                    t.file.display()
                ));
            } else if name.ends_with("rotary_emb.inv_freq") {
                notes.push(format!(
                    "{name} in {} ignored: rotary frequencies are computed from config.json",
                    t.file.display()
                ));
            } else {
                return Err(HfError::tensor(
                    &t.file,
                    name,
                    format!(
                        "is not a parameter of the model {} describes: is config.json the one of these weights?",
                        config.display()
                    ),
                ));
            }
        }
        Ok(notes)
    }

    /// Whether tensors `a` and `b` hold the same values, read a chunk at a time. Compared
    /// as f32 with `==`, as `torch.equal` compares a tied pair once loaded: NaN differs from
    /// itself, -0.0 equals 0.0.
    pub fn same_values(&self, a: &str, b: &str) -> Result<bool, HfError> {
        let (Some(ta), Some(tb)) = (self.tensors.get(a), self.tensors.get(b)) else {
            return Ok(false);
        };
        if ta.shape != tb.shape {
            return Ok(false);
        }
        let n = ta.numel();
        let chunk = CHUNK_ELEMENTS.min(n) as usize;
        let (mut va, mut vb) = (vec![0f32; chunk], vec![0f32; chunk]);
        let mut start = 0;
        while start < n {
            let len = CHUNK_ELEMENTS.min(n - start);
            let (va, vb) = (&mut va[..len as usize], &mut vb[..len as usize]);
            self.read(a, start..start + len, va)?;
            self.read(b, start..start + len, vb)?;
            if va != vb {
                return Ok(false);
            }
            start += len;
        }
        Ok(true)
    }

    /// Elements `range` of the flattened parameter (or stored tensor) `name`, converted to
    /// f32, into `out`.
    pub fn read(&self, name: &str, range: Range<u64>, out: &mut [f32]) -> Result<(), HfError> {
        let name = self.stored_as.get(name).map_or(name, String::as_str);
        let t = self
            .tensors
            .get(name)
            .ok_or_else(|| HfError::tensor(&self.source, name, "is not in the folder's weights"))?;
        if range.end > t.numel() || out.len() as u64 != range.end - range.start {
            return Err(HfError::tensor(
                &t.file,
                name,
                format!(
                    "elements {range:?} asked of a tensor of {} into {} values",
                    t.numel(),
                    out.len()
                ),
            ));
        }
        let file = &self.files[&t.file];
        let size = t.dtype.size();
        let mut done = 0u64;
        while done < out.len() as u64 {
            let n = CHUNK_ELEMENTS.min(out.len() as u64 - done);
            let offset = t.start + (range.start + done) * size;
            // SAFETY: a private read-only mapping of a range the header check found inside
            // the file. If another process truncated the file meanwhile, reading the mapping
            // would fault (SIGBUS) rather than return wrong values.
            let map = unsafe {
                memmap2::MmapOptions::new()
                    .offset(offset)
                    .len((n * size) as usize)
                    .map(file)
            }
            .map_err(HfError::io("map", &t.file))?;
            t.dtype
                .decode(&map, &mut out[done as usize..(done + n) as usize]);
            done += n;
        }
        Ok(())
    }
}

/// Parses one file's header and checks its size; tensors in dtypes other than f32, bf16 and
/// f16 are errors.
fn read_header(path: &Path) -> Result<(File, BTreeMap<String, StoredTensor>), HfError> {
    let file = File::open(path).map_err(HfError::io("open", path))?;
    let size = file.metadata().map_err(HfError::io("stat", path))?.len();
    let not_safetensors = |why: String| {
        HfError::folder(
            path,
            format!("{why}: the file is truncated or not a safetensors file; copy it again"),
        )
    };
    if size < 8 {
        return Err(not_safetensors(format!("only {size} bytes")));
    }
    let mut len = [0u8; 8];
    file.read_exact_at(&mut len, 0)
        .map_err(HfError::io("read", path))?;
    let header_len = u64::from_le_bytes(len);
    if header_len > MAX_HEADER_BYTES || 8 + header_len > size {
        return Err(not_safetensors(format!(
            "a header of {header_len} bytes in a file of {size}"
        )));
    }
    let mut header = vec![0u8; header_len as usize];
    file.read_exact_at(&mut header, 8)
        .map_err(HfError::io("read", path))?;
    let metadata: Metadata =
        serde_json::from_slice(&header).map_err(|e| match damaged_entry(&header) {
            Some((name, why)) => HfError::tensor(
                path,
                &name,
                format!("{why}: the file's header is damaged; copy the file again"),
            ),
            None => not_safetensors(format!("an unreadable header ({e})")),
        })?;
    let data_start = 8 + header_len;
    let expected = data_start + metadata.data_len() as u64;
    // In file order, so that the tensor a problem is reported for is always the first one.
    let mut infos: Vec<_> = metadata.tensors().into_iter().collect();
    infos.sort_by_key(|(name, info)| (info.data_offsets, name.clone()));
    if size < expected {
        let cut = infos
            .iter()
            .find(|(_, info)| data_start + info.data_offsets.1 as u64 > size);
        return Err(match cut {
            Some((name, info)) => HfError::tensor(
                path,
                name,
                format!(
                    "is cut off: its bytes end at {} but the file has {size} of the {expected} bytes its header describes. The file is truncated; copy it again",
                    data_start + info.data_offsets.1 as u64
                ),
            ),
            None => not_safetensors(format!(
                "{size} of the {expected} bytes its header describes"
            )),
        });
    }
    let mut tensors = BTreeMap::new();
    for (name, info) in infos {
        let dtype = match info.dtype {
            Dtype::F32 => StoredDtype::F32,
            Dtype::BF16 => StoredDtype::Bf16,
            Dtype::F16 => StoredDtype::F16,
            other => {
                return Err(HfError::tensor(
                    path,
                    &name,
                    format!("is stored as {other:?}; shardrun reads F32, BF16 and F16 weights"),
                ))
            }
        };
        tensors.insert(
            name,
            StoredTensor {
                file: path.to_path_buf(),
                dtype,
                shape: info.shape.iter().map(|&d| d as u64).collect(),
                start: data_start + info.data_offsets.0 as u64,
            },
        );
    }
    if size > expected {
        return Err(not_safetensors(format!(
            "{} bytes after the last tensor",
            size - expected
        )));
    }
    Ok((file, tensors))
}

/// The first tensor, in file order, whose header entry contradicts itself or the one before
/// it, and how: the safetensors crate refuses such a header without always naming the tensor.
fn damaged_entry(header: &[u8]) -> Option<(String, String)> {
    let entries: BTreeMap<String, serde_json::Value> = serde_json::from_slice(header).ok()?;
    let mut infos = Vec::new();
    for (name, entry) in entries {
        if name == "__metadata__" {
            continue;
        }
        match serde_json::from_value::<TensorInfo>(entry) {
            Ok(info) => infos.push((name, info)),
            Err(e) => return Some((name, format!("has an unreadable header entry ({e})"))),
        }
    }
    infos.sort_by_key(|(_, info)| info.data_offsets);
    let mut end = 0;
    for (name, info) in infos {
        let (start, stop) = info.data_offsets;
        if start != end {
            let before = if end == 0 {
                "the data starts at 0".to_string()
            } else {
                format!("the tensor before it ends at {end}")
            };
            return Some((
                name,
                format!("starts at byte {start} of the data, but {before}"),
            ));
        }
        if stop < start {
            return Some((
                name,
                format!("has data_offsets [{start}, {stop}], which end before they start"),
            ));
        }
        let bytes = info
            .shape
            .iter()
            .try_fold(info.dtype.bitsize(), |bits, &d| bits.checked_mul(d))
            .map(|bits| bits.div_ceil(8));
        if bytes != Some(stop - start) {
            let needs = bytes.map_or("more than can be addressed".to_string(), |b| {
                format!("{b} bytes")
            });
            return Some((
                name,
                format!(
                    "has data_offsets [{start}, {stop}] ({} bytes), but its shape {:?} in {:?} takes {needs}",
                    stop - start,
                    info.shape,
                    info.dtype
                ),
            ));
        }
        end = stop;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_past_a_dtypes_range_are_found_and_the_largest_named() {
        let out_of_range =
            |dtype: StoredDtype, values: &[f32]| dtype.encode(values, &mut Vec::new());
        let values = [
            1.0,
            65504.0,
            -7.0e4,
            65519.0,
            1.0e6,
            f32::INFINITY,
            f32::NAN,
        ];
        // 65519 still rounds to 65504; a value already infinite is not one the dtype lost.
        assert_eq!(out_of_range(StoredDtype::F16, &values), Some(1.0e6));
        assert_eq!(out_of_range(StoredDtype::F16, &values[..4]), Some(-7.0e4));
        assert_eq!(out_of_range(StoredDtype::F16, &values[..2]), None);
        assert_eq!(out_of_range(StoredDtype::Bf16, &values), None);
        assert_eq!(out_of_range(StoredDtype::Bf16, &[f32::MAX]), Some(f32::MAX));
        assert_eq!(out_of_range(StoredDtype::F32, &[f32::MAX]), None);
    }
    use safetensors::tensor::{serialize_to_file, TensorView};

    #[test]
    fn a_truncated_file_names_its_first_cut_off_tensor_in_file_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        let bytes = vec![0u8; 4 * 16];
        let names: Vec<String> = (0..8).map(|i| format!("layers.{i}.weight")).collect();
        let views: Vec<(&str, TensorView<'_>)> = names
            .iter()
            .map(|n| {
                (
                    n.as_str(),
                    TensorView::new(Dtype::F32, vec![16], &bytes).unwrap(),
                )
            })
            .collect();
        serialize_to_file(views, None, &path).unwrap();
        let size = std::fs::metadata(&path).unwrap().len();
        // Cut into the third tensor of eight (64 bytes each, stored in name order).
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(size - 5 * 64 - 10).unwrap();
        let Err(error) = read_header(&path) else {
            panic!("a truncated file was read")
        };
        let error = error.to_string();
        assert!(
            error.contains("layers.2.weight")
                && error.contains(&format!("of the {size} bytes its header describes"))
                && error.contains("truncated"),
            "{error}"
        );
    }

    #[test]
    fn a_header_whose_offsets_contradict_a_shape_names_the_tensor() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        let data = [0u8; 96];
        let header = |b_offsets: &str| {
            format!(
                r#"{{"__metadata__": {{"format": "pt"}},
                    "a": {{"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}},
                    "b": {{"dtype": "F32", "shape": [4, 4], "data_offsets": {b_offsets}}}}}"#
            )
        };
        for (b_offsets, said) in [
            (
                "[32, 40]",
                "has data_offsets [32, 40] (8 bytes), but its shape [4, 4] in F32 takes 64 bytes",
            ),
            (
                "[40, 96]",
                "starts at byte 40 of the data, but the tensor before it ends at 32",
            ),
        ] {
            let header = header(b_offsets);
            let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
            bytes.extend_from_slice(header.as_bytes());
            bytes.extend_from_slice(&data);
            std::fs::write(&path, bytes).unwrap();
            let Err(error) = read_header(&path) else {
                panic!("a damaged header was read")
            };
            let error = error.to_string();
            assert!(
                error.contains("`b`")
                    && error.contains(said)
                    && error.contains("header is damaged"),
                "{error}"
            );
        }
    }

    /// One tensor `a` of 4 values, all `value`, written to `path`.
    fn write_one(path: &Path, value: f32) {
        let bytes: Vec<u8> = [value; 4].iter().flat_map(|v| v.to_le_bytes()).collect();
        let view = TensorView::new(Dtype::F32, vec![4], &bytes).unwrap();
        serialize_to_file([("a", view)], None, path).unwrap();
    }

    #[test]
    fn a_folder_with_a_whole_file_and_an_index_is_read_from_the_whole_file_as_transformers_reads_it(
    ) {
        let dir = tempfile::tempdir().unwrap();
        let shard = "model-00001-of-00001.safetensors";
        write_one(&dir.path().join(shard), 0.0);
        std::fs::write(
            dir.path().join(INDEX_FILE),
            format!(r#"{{"metadata": {{}}, "weight_map": {{"a": "{shard}"}}}}"#),
        )
        .unwrap();
        let from_index = HfWeights::open(dir.path()).unwrap();
        assert_eq!(from_index.get("a").unwrap().file, dir.path().join(shard));
        write_one(&dir.path().join(SINGLE_FILE), 1.0);
        let weights = HfWeights::open(dir.path()).unwrap();
        assert_eq!(weights.get("a").unwrap().file, dir.path().join(SINGLE_FILE));
        let mut values = [0f32; 4];
        weights.read("a", 0..4, &mut values).unwrap();
        assert_eq!(values, [1.0; 4]);
    }
}
