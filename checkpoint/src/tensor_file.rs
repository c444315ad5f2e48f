//! safetensors files written as a stream (tensor after tensor, so nothing needs the whole
//! model in memory) with the sha256 computed on the way and an fsync at the end, and read
//! back by byte ranges so a rank reads only the parts it needs.
//!
//! The header is built and parsed by the `safetensors` crate; only the streaming is ours
//! (the crate's writer takes every tensor up front and neither hashes nor fsyncs).

use crate::error::{CheckpointError, Result};
use safetensors::tensor::{Dtype, Metadata, TensorInfo};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Size of the little-endian header length that starts every safetensors file.
const HEADER_LEN_BYTES: u64 = 8;
/// safetensors refuses larger headers; so do we, before allocating.
const MAX_HEADER_BYTES: u64 = 100_000_000;
const IO_BUFFER_BYTES: usize = 8 << 20;
/// Tensors at least this large are hashed on a second thread while being written.
const PARALLEL_HASH_BYTES: usize = 4 << 20;

/// A tensor to be written: all checkpoint tensors are fp32.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub shape: Vec<u64>,
}

impl TensorSpec {
    pub fn new(name: impl Into<String>, shape: Vec<u64>) -> Self {
        TensorSpec {
            name: name.into(),
            shape,
        }
    }

    fn byte_len(&self) -> u64 {
        self.shape.iter().product::<u64>() * 4
    }
}

/// What the metadata records about a written file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileDigest {
    pub size: u64,
    pub sha256: String,
}

/// Writes one safetensors file tensor by tensor, in the order given at creation.
pub struct TensorFileWriter {
    path: PathBuf,
    out: BufWriter<File>,
    hasher: Sha256,
    specs: Vec<TensorSpec>,
    next: usize,
    size: u64,
    /// When the file was created: the write phase's duration in the diagnostics.
    created: std::time::Instant,
}

impl TensorFileWriter {
    pub fn create(path: &Path, specs: Vec<TensorSpec>) -> Result<Self> {
        let mut offset = 0usize;
        let infos = specs
            .iter()
            .map(|s| {
                let len = s.byte_len() as usize;
                let info = TensorInfo {
                    dtype: Dtype::F32,
                    shape: s.shape.iter().map(|&d| d as usize).collect(),
                    data_offsets: (offset, offset + len),
                };
                offset += len;
                (s.name.clone(), info)
            })
            .collect();
        let metadata = Metadata::new(None, infos).map_err(|e| {
            CheckpointError::malformed(path, format!("cannot build the safetensors header: {e}"))
        })?;
        let mut header = serde_json::to_vec(&metadata).map_err(|e| {
            CheckpointError::malformed(path, format!("cannot encode the safetensors header: {e}"))
        })?;
        // The format asks for an 8-byte aligned data section; pad the JSON with spaces.
        header.resize(header.len().next_multiple_of(8), b' ');

        let file = File::create(path).map_err(CheckpointError::io(path, "cannot create"))?;
        let mut writer = TensorFileWriter {
            path: path.to_owned(),
            out: BufWriter::with_capacity(IO_BUFFER_BYTES, file),
            hasher: Sha256::new(),
            specs,
            next: 0,
            size: 0,
            created: std::time::Instant::now(),
        };
        writer.put(&(header.len() as u64).to_le_bytes())?;
        writer.put(&header)?;
        Ok(writer)
    }

    /// The next tensor's data, as little-endian f32 bytes.
    pub fn write_tensor(&mut self, name: &str, bytes: &[u8]) -> Result<()> {
        let Some(spec) = self.specs.get(self.next) else {
            return Err(CheckpointError::malformed(
                &self.path,
                format!("{name} written after the last tensor"),
            ));
        };
        if spec.name != name || spec.byte_len() != bytes.len() as u64 {
            return Err(CheckpointError::malformed(
                &self.path,
                format!(
                    "expected tensor {} of {} bytes next, got {name} of {} bytes",
                    spec.name,
                    spec.byte_len(),
                    bytes.len()
                ),
            ));
        }
        self.next += 1;
        if bytes.len() < PARALLEL_HASH_BYTES {
            return self.put(bytes);
        }
        // Large tensors: hash on another core while this one copies into the page cache,
        // and ask the kernel to start writing back now rather than all at the final fsync.
        let mut hasher = std::mem::take(&mut self.hasher);
        let written = std::thread::scope(|scope| {
            let hashing = scope.spawn(move || {
                hasher.update(bytes);
                hasher
            });
            let written = self.out.write_all(bytes).and_then(|()| self.out.flush());
            self.hasher = hashing.join().expect("hashing thread does not panic");
            written
        });
        written.map_err(CheckpointError::io(&self.path, "cannot write"))?;
        self.size += bytes.len() as u64;
        start_writeback(self.out.get_ref());
        Ok(())
    }

    fn put(&mut self, bytes: &[u8]) -> Result<()> {
        self.hasher.update(bytes);
        self.size += bytes.len() as u64;
        self.out
            .write_all(bytes)
            .map_err(CheckpointError::io(&self.path, "cannot write"))
    }

    /// Flush and fsync; every tensor must have been written.
    pub fn finish(self) -> Result<FileDigest> {
        if let Some(missing) = self.specs.get(self.next) {
            return Err(CheckpointError::malformed(
                &self.path,
                format!("finished before tensor {} was written", missing.name),
            ));
        }
        let file = self
            .out
            .into_inner()
            .map_err(|e| CheckpointError::io(&self.path, "cannot write")(e.into_error()))?;
        tracing::debug!(
            file = %self.path.display(),
            bytes = self.size,
            seconds = self.created.elapsed().as_secs_f64(),
            "checkpoint write"
        );
        let syncing = std::time::Instant::now();
        file.sync_all()
            .map_err(CheckpointError::io(&self.path, "cannot fsync"))?;
        tracing::debug!(
            file = %self.path.display(),
            seconds = syncing.elapsed().as_secs_f64(),
            "checkpoint fsync"
        );
        Ok(FileDigest {
            size: self.size,
            sha256: hex::encode(self.hasher.finalize()),
        })
    }
}

/// An open safetensors file whose header has been parsed and checked against its size.
#[derive(Debug)]
pub struct TensorFile {
    path: PathBuf,
    file: File,
    data_start: u64,
    tensors: HashMap<String, TensorInfo>,
}

impl TensorFile {
    pub fn open(path: &Path) -> Result<TensorFile> {
        let file = File::open(path).map_err(CheckpointError::io(path, "cannot open"))?;
        let size = file
            .metadata()
            .map_err(CheckpointError::io(path, "cannot stat"))?
            .len();
        let truncated = |what: String| {
            CheckpointError::malformed(
                path,
                format!("{what}: the file is truncated or not a safetensors file"),
            )
        };
        if size < HEADER_LEN_BYTES {
            return Err(truncated(format!("only {size} bytes")));
        }
        let mut len = [0u8; 8];
        file.read_exact_at(&mut len, 0)
            .map_err(CheckpointError::io(path, "cannot read"))?;
        let header_len = u64::from_le_bytes(len);
        if header_len > MAX_HEADER_BYTES || HEADER_LEN_BYTES + header_len > size {
            return Err(truncated(format!(
                "header of {header_len} bytes in a file of {size}"
            )));
        }
        let mut header = vec![0u8; header_len as usize];
        file.read_exact_at(&mut header, HEADER_LEN_BYTES)
            .map_err(CheckpointError::io(path, "cannot read"))?;
        let metadata: Metadata = serde_json::from_slice(&header).map_err(|e| {
            CheckpointError::malformed(
                path,
                format!("unreadable safetensors header ({e}): the file is corrupted"),
            )
        })?;
        let data_start = HEADER_LEN_BYTES + header_len;
        let expected = data_start + metadata.data_len() as u64;
        if expected != size {
            return Err(CheckpointError::SizeMismatch {
                path: path.to_owned(),
                expected,
                actual: size,
            });
        }
        let tensors: HashMap<String, TensorInfo> = metadata
            .tensors()
            .into_iter()
            .map(|(name, info)| (name, info.clone()))
            .collect();
        if let Some((name, info)) = tensors.iter().find(|(_, i)| i.dtype != Dtype::F32) {
            return Err(CheckpointError::malformed(
                path,
                format!(
                    "tensor {name} is {:?}; checkpoints hold F32 only",
                    info.dtype
                ),
            ));
        }
        Ok(TensorFile {
            path: path.to_owned(),
            file,
            data_start,
            tensors,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Shape of `name`, or an error naming this file if it is missing.
    pub fn shape(&self, name: &str) -> Result<Vec<u64>> {
        self.info(name)
            .map(|i| i.shape.iter().map(|&d| d as u64).collect())
    }

    fn info(&self, name: &str) -> Result<&TensorInfo> {
        self.tensors
            .get(name)
            .ok_or_else(|| CheckpointError::malformed(&self.path, format!("has no tensor {name}")))
    }

    /// Byte position in the file of element `element` of tensor `name`.
    pub fn element_position(&self, name: &str, element: u64) -> Result<u64> {
        Ok(self.data_start + self.info(name)?.data_offsets.0 as u64 + element * 4)
    }

    pub fn read_at(&self, position: u64, out: &mut [u8]) -> Result<()> {
        self.file
            .read_exact_at(out, position)
            .map_err(CheckpointError::io(&self.path, "cannot read"))
    }
}

/// Start writing dirty pages of `file` back to disk without waiting, so the final fsync has
/// little left to do (Linux `sync_file_range`; elsewhere the fsync does it all).
fn start_writeback(file: &File) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: a plain syscall on a file descriptor this `File` owns and keeps open; it
        // reads no memory of ours. A failure only means the fsync does the work.
        unsafe {
            libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = file;
}

/// Size and sha256 of a whole file, read sequentially.
pub fn digest_file(path: &Path) -> Result<FileDigest> {
    let mut file = File::open(path).map_err(CheckpointError::io(path, "cannot open"))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; IO_BUFFER_BYTES];
    let mut size = 0u64;
    loop {
        let n = file
            .read(&mut buf)
            .map_err(CheckpointError::io(path, "cannot read"))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    Ok(FileDigest {
        size,
        sha256: hex::encode(hasher.finalize()),
    })
}
