//! `shardrun export <run dir | checkpoint folder> [--out DIR]`: the newest valid sharded
//! checkpoint becomes a full one (`model.safetensors` with PyTorch names, loadable by
//! `safetensors.torch.load_file` + `load_state_dict`), unit by unit, on the login node:
//! no GPU, no libtorch.

use anyhow::{bail, Context, Result};
use shardrun_checkpoint::naming::{COMPLETE_FILE, METADATA_FILE};
use shardrun_checkpoint::{export_full, resolve, Verify};
use shardrun_protocol::config::CheckpointFormat;
use shardrun_protocol::TrainConfig;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// A run directory, a folder of `step-<N>/` checkpoints, or one checkpoint folder.
    pub path: PathBuf,
    /// Where to put the full checkpoint (as `<DIR>/step-<N>/`). Default: `export/` next to
    /// the checkpoints.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

pub fn execute(args: Args) -> Result<()> {
    let source_path = checkpoint_location(&args.path)?;
    let found = resolve(&source_path, Verify::Checksums)?;
    for message in found.fallback_messages() {
        eprintln!("warning: {message}");
    }
    let source = found.checkpoint.context("no valid checkpoint found")?;
    let meta = source.metadata();
    if meta.format == CheckpointFormat::Full {
        println!(
            "{} is already a full checkpoint: load {} directly",
            source.dir().display(),
            source
                .dir()
                .join(shardrun_checkpoint::naming::MODEL_FILE)
                .display()
        );
        return Ok(());
    }
    let out_root = match args.out {
        Some(out) => out,
        None => checkpoints_root(source.dir()).join("export"),
    };

    let started = Instant::now();
    let committed = export_full(&source, &out_root).with_context(|| {
        format!(
            "exporting {} to {}",
            source.dir().display(),
            out_root.display()
        )
    })?;
    let seconds = started.elapsed().as_secs_f64();
    let total: u64 = committed.metadata.files.iter().map(|f| f.size).sum();
    println!(
        "Exported step {} ({} ranks, {:?}, {:.1} M parameters) from {}",
        meta.step,
        meta.world_size,
        meta.strategy,
        meta.layout.num_params() as f64 / 1e6,
        source.dir().display()
    );
    for file in &committed.metadata.files {
        println!(
            "  {}  {:.1} MB",
            committed.dir.join(&file.name).display(),
            file.size as f64 / 1e6
        );
    }
    println!(
        "in {seconds:.1} s ({:.0} MB/s). In PyTorch:\n  model.load_state_dict(safetensors.torch.load_file({:?}))",
        total as f64 / 1e6 / seconds.max(1e-9),
        committed.dir.join(shardrun_checkpoint::naming::MODEL_FILE)
    );
    Ok(())
}

/// What the user pointed at, as a path [`resolve`] understands: a checkpoint folder, a folder
/// of them, or a run directory (its config's checkpoint dir, else `<run dir>/checkpoints`).
fn checkpoint_location(path: &Path) -> Result<PathBuf> {
    if !path.exists() {
        bail!(
            "{} does not exist. Give a run directory (as printed by `shardrun submit`), a checkpoint folder, or one step-<N>/ folder",
            path.display()
        );
    }
    if path.join(COMPLETE_FILE).exists()
        || path.join(METADATA_FILE).exists()
        || has_step_folders(path)?
    {
        return Ok(path.to_owned());
    }
    let config_path = path.join("train_config.json");
    if config_path.exists() {
        let text = std::fs::read(&config_path)
            .with_context(|| format!("reading {}", config_path.display()))?;
        let config: TrainConfig = serde_json::from_slice(&text)
            .with_context(|| format!("{} is not a valid training config", config_path.display()))?;
        if let Some(dir) = config.checkpoint.dir {
            return Ok(if dir.is_relative() {
                path.join(dir)
            } else {
                dir
            });
        }
    }
    let default = path.join("checkpoints");
    if default.is_dir() {
        return Ok(default);
    }
    bail!(
        "no checkpoints under {}: it is not a checkpoint folder and has no checkpoints/ folder. Does the job spec enable `checkpoint.dir`, and has the run saved one yet?",
        path.display()
    )
}

fn has_step_folders(path: &Path) -> Result<bool> {
    Ok(path.is_dir()
        && !shardrun_checkpoint::naming::list_entries(path)
            .with_context(|| format!("listing {}", path.display()))?
            .is_empty())
}

/// The folder that holds `step-<N>/` folders.
fn checkpoints_root(checkpoint_dir: &Path) -> PathBuf {
    checkpoint_dir
        .parent()
        .map(Path::to_owned)
        .unwrap_or_else(|| PathBuf::from("."))
}
