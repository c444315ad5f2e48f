//! Named fp32 tensors in a safetensors file: final weights dumped by a run (sharded or
//! reference) so tests and people can compare them.

use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tch::{Kind, Tensor};

#[derive(Debug, thiserror::Error)]
pub enum ParamsFileError {
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a valid safetensors file: {reason}")]
    Format { path: PathBuf, reason: String },
}

/// One tensor read back: shape and row-major values.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedValues {
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
}

/// Writes `tensors` (any float dtype, stored as f32) to `path`, atomically (temp + rename).
pub fn write(path: &Path, tensors: &[(String, Tensor)]) -> Result<(), ParamsFileError> {
    let format = |reason: String| ParamsFileError::Format {
        path: path.to_path_buf(),
        reason,
    };
    let buffers: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(name, t)| {
            let t = t
                .to_kind(Kind::Float)
                .to_device(tch::Device::Cpu)
                .contiguous();
            let values = Vec::<f32>::try_from(&t.view([-1])).map_err(|e| format(e.to_string()))?;
            let shape = t.size().iter().map(|&d| d as usize).collect();
            Ok((
                name.clone(),
                shape,
                values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            ))
        })
        .collect::<Result<_, ParamsFileError>>()?;
    let views = buffers
        .iter()
        .map(|(name, shape, bytes)| {
            TensorView::new(Dtype::F32, shape.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| format(e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let bytes = safetensors::serialize(views, None).map_err(|e| format(e.to_string()))?;
    let tmp = path.with_extension("tmp");
    let write_err = |source| ParamsFileError::Write {
        path: path.to_path_buf(),
        source,
    };
    std::fs::write(&tmp, bytes).map_err(write_err)?;
    std::fs::rename(&tmp, path).map_err(write_err)
}

/// Reads every tensor of a file written by [`write`].
pub fn read(path: &Path) -> Result<BTreeMap<String, NamedValues>, ParamsFileError> {
    let bytes = std::fs::read(path).map_err(|source| ParamsFileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let format = |reason: String| ParamsFileError::Format {
        path: path.to_path_buf(),
        reason,
    };
    let file = SafeTensors::deserialize(&bytes).map_err(|e| format(e.to_string()))?;
    let mut out = BTreeMap::new();
    for (name, view) in file.tensors() {
        if view.dtype() != Dtype::F32 {
            return Err(format(format!(
                "{name} is {:?}, expected F32",
                view.dtype()
            )));
        }
        let values = view
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        out.insert(
            name,
            NamedValues {
                shape: view.shape().to_vec(),
                values,
            },
        );
    }
    Ok(out)
}
