//! `shardrun export <run dir | checkpoint folder> [--out DIR] [--format hf|full]`: the newest
//! valid checkpoint, on the login node (no GPU, no libtorch), as
//!
//! * `hf` (the default for Llama-family models): a Hugging Face folder that
//!   `transformers.AutoModelForCausalLM.from_pretrained` loads: `config.json`, the weights
//!   (split with an index past `--max-shard-size`), the generation files of the folder the
//!   run started from, and the tokenizer the run read its text with (the spec's chat template
//!   as `chat_template.jinja`), so that `AutoTokenizer.from_pretrained` gives the same ids;
//! * `full` (the default otherwise): a full shardrun checkpoint (`model.safetensors` with
//!   PyTorch names, `optimizer.safetensors`), unit by unit.

use anyhow::{bail, Context, Result};
use shardrun_checkpoint::naming::{COMPLETE_FILE, METADATA_FILE};
use shardrun_checkpoint::{export_full, resolve, Checkpoint, StateKind, UnitLayout, Verify};
use shardrun_data::identity::tokenizer_file_changes;
use shardrun_data::tokenizer::{SpecialToken, TextTokenizer, BYTES_EOS, BYTES_EOS_TEXT};
use shardrun_data::tokenizer_files::{tokenizer_files, CHAT_TEMPLATE};
use shardrun_data::DataIdentity;
use shardrun_models::hf::config::{
    config_json, generation_config_json, saved_dtype, GENERATION_CONFIG_FILE,
};
use shardrun_models::hf::{self, FileContents, FolderFile, SaveOptions, StoredDtype};
use shardrun_protocol::config::{
    CheckpointFormat, DataConfig, DataSource, DatasetConfig, LlamaModel, ModelConfig,
    TokenizerConfig,
};
use shardrun_protocol::TrainConfig;
use std::path::{Path, PathBuf};
use std::time::Instant;

const CONFIG_FILE: &str = "train_config.json";
/// `save_pretrained`'s default `max_shard_size`, 5GB.
const DEFAULT_MAX_SHARD_SIZE: u64 = 5_000_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    /// A Hugging Face model folder (Llama-family models).
    Hf,
    /// A full shardrun checkpoint.
    Full,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportDtype {
    F32,
    Bf16,
    F16,
}

impl From<ExportDtype> for StoredDtype {
    fn from(d: ExportDtype) -> StoredDtype {
        match d {
            ExportDtype::F32 => StoredDtype::F32,
            ExportDtype::Bf16 => StoredDtype::Bf16,
            ExportDtype::F16 => StoredDtype::F16,
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// A run directory, a folder of `step-<N>/` checkpoints, or one checkpoint folder.
    pub path: PathBuf,
    /// Where to write. Default: `export/hf-step-<N>/` (hf) or `export/step-<N>/` (full) next
    /// to the checkpoints.
    #[arg(short = 'o', long, alias = "output", value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Default: `hf` for a Llama-family model, else `full`.
    #[arg(long, value_enum)]
    pub format: Option<ExportFormat>,
    /// dtype of the exported weights (hf only): default the dtype of the folder the run
    /// started from (its config.json's, else its weights'), else f32.
    #[arg(long, value_enum)]
    pub dtype: Option<ExportDtype>,
    /// Split the weights into files of at most this size (hf only), e.g. `5GB` (the
    /// default), `500MB`.
    #[arg(long, value_parser = parse_size)]
    pub max_shard_size: Option<u64>,
}

pub fn execute(args: Args) -> Result<()> {
    crate::interrupt::on_stop("the export", || {
        let removed = shardrun_models::hf::save::abandon_writes();
        (!removed.is_empty()).then(|| {
            format!(
                "what it had written is removed ({})",
                crate::interrupt::listed(&removed)
            )
        })
    })?;
    let source_path = checkpoint_location(&args.path)?;
    let found = resolve(&source_path, Verify::Checksums)?;
    for message in found.fallback_messages() {
        errln!("warning: {message}");
    }
    let source = found.checkpoint.context("no valid checkpoint found")?;
    let (run_dir, run_config) = find_run_config(&args.path, source.dir())?.unzip();
    let diverged = run_dir
        .as_deref()
        .and_then(|run| diverged_before(run, &source));
    if let Some(warning) = &diverged {
        errln!("{warning}");
    }
    let llama = match run_config.as_ref().map(|c| &c.model) {
        Some(ModelConfig::Llama(m)) => Some(m.clone()),
        _ => None,
    };
    let format = args.format.unwrap_or(if llama.is_some() {
        ExportFormat::Hf
    } else {
        ExportFormat::Full
    });
    match (format, llama) {
        (ExportFormat::Full, llama) => {
            if args.dtype.is_some() || args.max_shard_size.is_some() {
                // A Hugging Face folder is only an option for a Llama-family run.
                let or_hf = if llama.is_some() {
                    ", or export with --format hf"
                } else {
                    " (a Hugging Face folder is written for Llama-family runs only)"
                };
                bail!(
                    "--dtype and --max-shard-size shape a Hugging Face folder (--format hf); a \
                     full checkpoint keeps the training tensors as they are, one file each for \
                     model and optimizer: drop them{or_hf}"
                );
            }
            export_full_checkpoint(&source, args.out, diverged.is_some())
        }
        (ExportFormat::Hf, Some(model)) => export_hf(
            &source,
            &model,
            run_dir.as_deref().zip(run_config.as_ref()),
            &args,
            diverged.is_some(),
        ),
        (ExportFormat::Hf, None) => match run_config.as_ref().map(|c| &c.model) {
            Some(other) => bail!(
                "{}: a Hugging Face folder is written for Llama-family models, and this run \
                 trained {}; use --format full",
                source.dir().display(),
                match other {
                    ModelConfig::Transformer { .. } => "the FSDP2-example transformer",
                    ModelConfig::Mlp { .. } => "the MLP of the FSDP tutorial",
                    ModelConfig::Llama(_) => "a Llama-family model",
                }
            ),
            None => bail!(
                "{}: a Hugging Face folder is written from the run's model, described in its \
                 {CONFIG_FILE}, and there is none in {} or the folders above the checkpoint; \
                 export the checkpoint from its run directory, or use --format full",
                source.dir().display(),
                args.path.display()
            ),
        },
    }
}

/// `divergence_said`: as for [`not_finite_warning`].
/// The folders above an export's that do not exist yet, deepest first: an export that fails
/// removes those it made and left empty, so that it leaves nothing.
struct NewFolders(Vec<PathBuf>);

impl NewFolders {
    fn above(path: &Path) -> NewFolders {
        NewFolders(
            path.ancestors()
                .skip(1)
                .take_while(|dir| !dir.as_os_str().is_empty() && !dir.exists())
                .map(Path::to_path_buf)
                .collect(),
        )
    }

    fn remove_empty(&self) {
        for dir in &self.0 {
            // Fails, and keeps the folder, when something is in it.
            let _ = std::fs::remove_dir(dir);
        }
    }
}

fn export_full_checkpoint(
    source: &Checkpoint,
    out: Option<PathBuf>,
    divergence_said: bool,
) -> Result<()> {
    let meta = source.metadata();
    if meta.format == CheckpointFormat::Full {
        outln!(
            "{} is already a full checkpoint: load {} directly",
            source.dir().display(),
            source
                .dir()
                .join(shardrun_checkpoint::naming::MODEL_FILE)
                .display()
        );
        return Ok(());
    }
    let out_root = out
        .unwrap_or_else(|| checkpoints_root(source.dir()).join(shardrun_protocol::config::EXPORTS));
    refuse_existing_export(
        &out_root.join(shardrun_checkpoint::naming::step_dir_name(meta.step)),
        source,
    )?;
    let started = Instant::now();
    let new_folders = NewFolders::above(&out_root.join("step"));
    let exported = export_full(source, &out_root)
        .inspect_err(|_| new_folders.remove_empty())
        .with_context(|| {
            format!(
                "exporting {} to {}",
                source.dir().display(),
                out_root.display()
            )
        })?;
    let committed = exported.committed;
    if exported.params_not_finite > 0 {
        errln!(
            "{}",
            not_finite_warning(
                exported.params_not_finite,
                meta.layout.num_params(),
                "in its parameters",
                meta.step,
                divergence_said,
            )
        );
    }
    let seconds = started.elapsed().as_secs_f64();
    let total: u64 = committed.metadata.files.iter().map(|f| f.size).sum();
    outln!(
        "Exported step {} ({}, {}, {}) from {}",
        meta.step,
        crate::resolve::ranks_words(meta.world_size),
        meta.strategy.name(),
        parameters_in_words(meta.layout.num_params()),
        source.dir().display()
    );
    for file in &committed.metadata.files {
        outln!(
            "  {}  {:.1} MB",
            committed.dir.join(&file.name).display(),
            file.size as f64 / 1e6
        );
    }
    outln!(
        "in {seconds:.1} s ({:.0} MB/s). In PyTorch:\n  model.load_state_dict(safetensors.torch.load_file({:?}))",
        total as f64 / 1e6 / seconds.max(1e-9),
        committed.dir.join(shardrun_checkpoint::naming::MODEL_FILE)
    );
    Ok(())
}

/// Writes the checkpoint's parameters as a Hugging Face folder, one tensor in memory at a time.
/// `run`: the run's folder and its config. `divergence_said`: the run's metrics already
/// named the checkpoint to export instead of this diverged one.
fn export_hf(
    source: &Checkpoint,
    model: &LlamaModel,
    run: Option<(&Path, &TrainConfig)>,
    args: &Args,
    divergence_said: bool,
) -> Result<()> {
    let run_config = run.map(|(_, config)| config);
    if let Some((
        dir,
        TrainConfig {
            data: DataConfig::Dataset(data),
            ..
        },
    )) = run
    {
        refuse_changed_tokenizer(dir, data)?;
    }
    let started = Instant::now();
    let meta = source.metadata();
    let pretrained_config = match &model.pretrained {
        Some(dir) => {
            let path = dir.join(hf::CONFIG_FILE);
            let text = std::fs::read_to_string(&path).with_context(|| {
                format!(
                    "reading {} (the folder the run started from; its config.json and tokenizer files go into the export)",
                    path.display()
                )
            })?;
            let value = serde_json::from_str::<serde_json::Value>(&text)
                .with_context(|| format!("{} is not valid JSON", path.display()))?;
            refuse_changed_config(&value, &path, &model.architecture)?;
            Some(value)
        }
        None => None,
    };
    let dtype: StoredDtype = match args.dtype {
        Some(d) => d.into(),
        None => source_dtype(model.pretrained.as_deref(), pretrained_config.as_ref())?,
    };
    let run_tokenizer = read_run_tokenizer(run_config, model.pretrained.is_none());
    // The source folder's own config.json (every key it had: token ids, architectures...)
    // with the dtype of these weights; from scratch, one written from the architecture, with
    // the special token ids of the tokenizer the run trained with.
    let mut token_ids = None;
    let config = match pretrained_config {
        Some(mut value) => {
            let map = value
                .as_object_mut()
                .context("the source config.json is not a JSON object")?;
            set_dtype(map, dtype.torch_name());
            // The run's model, which is untied where the folder stored an output head apart
            // from a tied embedding.
            map.insert(
                "tie_word_embeddings".into(),
                model.architecture.tie_embeddings.into(),
            );
            value
        }
        None => {
            let mut value = config_json(&model.architecture, dtype.torch_name());
            token_ids = run_tokenizer
                .as_ref()
                .ok()
                .and_then(Option::as_ref)
                .and_then(|t| t.special_tokens.as_ref());
            if let (Some(tokenizer), Some(map)) = (token_ids, value.as_object_mut()) {
                // Explicitly null without a BOS: `transformers` would take 1 for an absent key.
                map.insert(
                    "bos_token_id".into(),
                    tokenizer.bos.as_ref().map(|t| t.id).into(),
                );
                map.insert("eos_token_id".into(), tokenizer.eos.id.into());
            }
            value
        }
    };
    let description = model.architecture.describe();
    let layout = source.layout();
    let tensors: Vec<(String, Vec<u64>)> = description
        .params
        .iter()
        .map(|p| (p.name.clone(), p.shape.iter().map(|&d| d as u64).collect()))
        .collect();
    for (name, shape) in &tensors {
        match layout.params().find(|(_, slot)| &slot.name == name) {
            Some((_, slot)) if &slot.shape == shape => {}
            Some((_, slot)) => bail!(
                "{}: parameter {name} has shape {:?} in the checkpoint but {shape:?} in the run's model",
                source.dir().display(),
                slot.shape
            ),
            None => bail!(
                "{}: the checkpoint has no parameter {name}; was it saved by this run?",
                source.dir().display()
            ),
        }
    }
    let out = args.out.clone().unwrap_or_else(|| {
        checkpoints_root(source.dir())
            .join(shardrun_protocol::config::EXPORTS)
            .join(format!("hf-step-{}", meta.step))
    });
    refuse_existing_export(&out, source)?;
    let new_folders = NewFolders::above(&out);
    let mut bytes = Vec::new();
    // Tensors with values that are not finite, and how many: a diverged run's weights.
    let mut not_finite: Vec<(String, usize)> = Vec::new();
    let read = |name: &str, values: &mut Vec<f32>| -> Result<(), String> {
        let (_, shape) = tensors
            .iter()
            .find(|(n, _)| n == name)
            .ok_or_else(|| format!("{name} is not a parameter"))?;
        let unit = UnitLayout::packed(name, [(name.to_string(), shape.clone())], 1)
            .map_err(|e| e.to_string())?;
        bytes.resize(unit.numel as usize * 4, 0);
        source
            .read_unit_range(StateKind::Param, &unit, 0..unit.numel, &mut bytes)
            .map_err(|e| e.to_string())?;
        let start = values.len();
        values.extend(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        );
        let bad = values[start..].iter().filter(|v| !v.is_finite()).count();
        if bad > 0 {
            not_finite.push((name.to_string(), bad));
        }
        Ok(())
    };
    let mut files = folder_files(model.pretrained.as_deref(), &run_tokenizer)?;
    // A model fine-tuned to end its turns with the spec's eos token must stop there when it
    // generates, as well as where the folder it started from stopped.
    let stops = match (&model.pretrained, spec_eos(&run_tokenizer)) {
        (Some(_), Some(eos)) => stop_at(&mut files.files, &config, eos)?,
        _ => None,
    };
    let saved = hf::save_folder(
        &out,
        &config,
        &tensors,
        read,
        &files.files,
        &SaveOptions {
            dtype,
            max_shard_bytes: args.max_shard_size.unwrap_or(DEFAULT_MAX_SHARD_SIZE),
        },
    )
    .inspect_err(|_| new_folders.remove_empty())
    .with_context(|| format!("exporting {} to {}", source.dir().display(), out.display()))?;
    let total: u64 = saved.weight_files.iter().map(|(_, size)| size).sum();
    if let Some((first, _)) = not_finite.first() {
        let values: usize = not_finite.iter().map(|(_, n)| n).sum();
        errln!(
            "{}",
            not_finite_warning(
                values as u64,
                description.num_params(),
                &format!("in {} tensor(s) from {first} on", not_finite.len()),
                meta.step,
                divergence_said,
            )
        );
    }
    outln!(
        "Exported step {} ({}, {}) from {} as a Hugging Face folder:",
        meta.step,
        parameters_in_words(description.num_params()),
        dtype.torch_name(),
        source.dir().display()
    );
    for (file, size) in &saved.weight_files {
        outln!(
            "  {}  {:.1} MB",
            saved.dir.join(file).display(),
            *size as f64 / 1e6
        );
    }
    outln!(
        "  config.json: {}, dtype {}",
        match &model.pretrained {
            Some(folder) => format!("the one of {}", folder.display()),
            None => "written from the run's architecture".into(),
        },
        dtype.torch_name()
    );
    for (origin, names) in &files.origins {
        outln!("  {origin}: {}", names.join(", "));
    }
    if files.no_tokenizer {
        outln!(
            "  no tokenizer: the run read none (synthetic or pre-tokenized data) and the folder \
             it started from has none: AutoTokenizer cannot load the export until the \
             tokenizer its tokens were made with is copied in"
        );
    }
    if let Some(tokenizer) = token_ids {
        let bos = match &tokenizer.bos {
            Some(t) => format!("bos {} (`{}`)", t.id, t.text),
            None => "no bos".into(),
        };
        outln!(
            "  token ids of the run's tokenizer in config.json and generation_config.json: {bos}, eos {} (`{}`)",
            tokenizer.eos.id,
            tokenizer.eos.text
        );
    } else if let (Some(ids), Some(eos)) = (&stops, spec_eos(&run_tokenizer)) {
        outln!(
            "  generation_config.json: generation stops at eos_token_id {ids:?}, the spec's eos_token `{}` ({}) among them",
            eos.text,
            eos.id
        );
    } else if saved.derived_generation_config {
        outln!("  generation_config.json: the token ids of config.json");
    }
    outln!(
        "in {:.1} s ({:.0} MB/s). In Python:\n  transformers.AutoModelForCausalLM.from_pretrained({:?})",
        started.elapsed().as_secs_f64(),
        total as f64 / 1e6 / started.elapsed().as_secs_f64().max(1e-9),
        saved.dir
    );
    Ok(())
}

/// The files an export holds beside config.json and the weights, and where they came from.
struct ExportFiles {
    files: Vec<FolderFile>,
    /// What each group of files is, with their names, as printed.
    origins: Vec<(String, Vec<String>)>,
    /// No tokenizer file among them, though the run's tokenizer read (it had none to give).
    no_tokenizer: bool,
}

/// The generation settings of the folder the run started from, and the tokenizer the run read
/// its text with: the spec's (with its chat template), else (synthetic or pre-tokenized data)
/// the tokenizer of the folder the run started from. A run's tokenizer that cannot be read is
/// left out, with a warning that says what the export lacks.
fn folder_files(
    pretrained: Option<&Path>,
    run_tokenizer: &Result<Option<RunTokenizer>>,
) -> Result<ExportFiles> {
    let mut files = match pretrained {
        Some(dir) => hf::tokenizer_and_generation_files(dir).with_context(|| {
            format!(
                "listing the tokenizer and generation files of {} (the folder the run started from)",
                dir.display()
            )
        })?,
        None => Vec::new(),
    };
    // A tokenizer that did not read is said in the warning below.
    let run_tokenizer_read = run_tokenizer.is_ok();
    let run_tokenizer = match run_tokenizer {
        Ok(found) => found.as_ref(),
        Err(e) => {
            // From scratch, config.json takes its token ids from the same tokenizer.
            let (token_ids, set_them) = match pretrained {
                None => (
                    " and names no bos or eos token",
                    ", and set `bos_token_id` and `eos_token_id` in its config.json",
                ),
                Some(_) => ("", ""),
            };
            errln!(
                "warning: cannot read the run's tokenizer ({e}): the export has {}{token_ids}; copy the tokenizer files in before loading it with AutoTokenizer{set_them}",
                if files.iter().any(|f| hf::is_tokenizer_file(&f.name)) {
                    "the tokenizer files of the folder the run started from"
                } else {
                    "no tokenizer files"
                }
            );
            None
        }
    };
    if run_tokenizer.is_some() {
        // The ids the model learned are the run's tokenizer's.
        files.retain(|f| !hf::is_tokenizer_file(&f.name));
    }
    let names =
        |files: &[FolderFile]| -> Vec<String> { files.iter().map(|f| f.name.clone()).collect() };
    let mut origins = Vec::new();
    if !files.is_empty() {
        origins.push(("copied from the source folder".into(), names(&files)));
    }
    let Some(tokenizer) = run_tokenizer else {
        let no_tokenizer =
            run_tokenizer_read && !files.iter().any(|f| hf::is_tokenizer_file(&f.name));
        return Ok(ExportFiles {
            files,
            origins,
            no_tokenizer,
        });
    };
    let chat_template = tokenizer.chat_template;
    let (template, own): (Vec<FolderFile>, Vec<FolderFile>) = tokenizer
        .files
        .iter()
        .cloned()
        .partition(|f| chat_template.is_some() && f.name == CHAT_TEMPLATE);
    let from = match tokenizer.config {
        TokenizerConfig::HuggingFace {
            path,
            bos_token,
            eos_token,
        } => {
            let with_tokens = match (bos_token, eos_token) {
                (Some(_), Some(_)) => ", its configs with the spec's bos_token and eos_token",
                (Some(_), None) => ", its configs with the spec's bos_token",
                (None, Some(_)) => ", its configs with the spec's eos_token",
                (None, None) => "",
            };
            format!("the run's tokenizer ({}{with_tokens})", path.display())
        }
        _ => {
            format!("the run's byte tokenizer (byte b is id b, `{BYTES_EOS_TEXT}` is {BYTES_EOS})")
        }
    };
    origins.push((from, names(&own)));
    if let Some(path) = chat_template {
        origins.push((
            format!(
                "the spec's chat template, which rendered the training records ({})",
                path.display()
            ),
            names(&template),
        ));
    }
    files.extend(own);
    files.extend(template);
    Ok(ExportFiles {
        files,
        origins,
        no_tokenizer: false,
    })
}

/// The tokenizer the run read its text with (`data.tokenizer`), as the export takes it: its
/// files (with the spec's chat template) and, for a config.json written from scratch, its
/// special tokens.
struct RunTokenizer<'a> {
    config: &'a TokenizerConfig,
    chat_template: Option<&'a Path>,
    files: Vec<FolderFile>,
    special_tokens: Option<TextTokenizer>,
}

/// The eos token the spec gave the run's tokenizer (`data.tokenizer.eos_token`), once its
/// special tokens are loaded.
fn spec_eos<'a>(run_tokenizer: &'a Result<Option<RunTokenizer>>) -> Option<&'a SpecialToken> {
    let tokenizer = run_tokenizer.as_ref().ok()?.as_ref()?;
    match tokenizer.config {
        TokenizerConfig::HuggingFace {
            eos_token: Some(_), ..
        } => tokenizer.special_tokens.as_ref().map(|t| &t.eos),
        _ => None,
    }
}

/// Add `eos` to the ids generation stops at (`eos_token_id` of the generation config the
/// export would hold: the source folder's, else the one derived from `config`), as a list
/// beside the ids there already. The ids, or `None` when `eos` was among them.
fn stop_at(
    files: &mut Vec<FolderFile>,
    config: &serde_json::Value,
    eos: &SpecialToken,
) -> Result<Option<Vec<u64>>> {
    let at = files.iter().position(|f| f.name == GENERATION_CONFIG_FILE);
    let mut generation = match at.map(|i| &files[i].contents) {
        Some(FileContents::CopyOf(path)) => serde_json::from_slice(
            &std::fs::read(path).with_context(|| format!("reading {}", path.display()))?,
        )
        .with_context(|| format!("{} is not valid JSON", path.display()))?,
        Some(FileContents::Bytes(bytes)) => serde_json::from_slice(bytes)?,
        None => generation_config_json(config).unwrap_or_else(|| serde_json::json!({})),
    };
    let map = generation
        .as_object_mut()
        .context("generation_config.json is not a JSON object")?;
    let mut ids: Vec<u64> = match map.get("eos_token_id") {
        Some(serde_json::Value::Array(ids)) => ids.iter().filter_map(|v| v.as_u64()).collect(),
        Some(id) => id.as_u64().into_iter().collect(),
        None => Vec::new(),
    };
    if ids.contains(&u64::from(eos.id)) {
        return Ok(None);
    }
    ids.push(eos.id.into());
    let listed = match ids.as_slice() {
        [id] => serde_json::json!(id),
        _ => serde_json::json!(ids),
    };
    map.insert("eos_token_id".into(), listed);
    let mut bytes = serde_json::to_vec_pretty(&generation)?;
    bytes.push(b'\n');
    let file = FolderFile {
        name: GENERATION_CONFIG_FILE.into(),
        contents: FileContents::Bytes(bytes),
    };
    match at {
        Some(i) => files[i] = file,
        None => files.push(file),
    }
    Ok(Some(ids))
}

/// The run's tokenizer, read once; `None` without one (synthetic or pre-tokenized data).
/// `special_tokens`: load it for its special tokens too (it is whenever the spec names an eos
/// token, which the export's generation config stops at).
fn read_run_tokenizer(
    run_config: Option<&TrainConfig>,
    special_tokens: bool,
) -> Result<Option<RunTokenizer<'_>>> {
    let Some(DataConfig::Dataset(data)) = run_config.map(|c| &c.data) else {
        return Ok(None);
    };
    let chat_template = match &data.source {
        DataSource::Chat { chat_template, .. } => chat_template.as_deref(),
        _ => None,
    };
    let Some(files) = tokenizer_files(&data.tokenizer, chat_template)? else {
        return Ok(None);
    };
    let names_eos = matches!(
        data.tokenizer,
        TokenizerConfig::HuggingFace {
            eos_token: Some(_),
            ..
        }
    );
    let special_tokens = (special_tokens || names_eos)
        .then(|| TextTokenizer::load(&data.tokenizer))
        .transpose()?;
    Ok(Some(RunTokenizer {
        config: &data.tokenizer,
        chat_template,
        files,
        special_tokens,
    }))
}

/// Writes the exported weights' dtype into a source config under the key its transformers
/// version uses: `torch_dtype` in a 4.x config that has only that, else `dtype` (5.x, which
/// also reads `torch_dtype`: one written beside it is kept in step).
fn set_dtype(config: &mut serde_json::Map<String, serde_json::Value>, torch_name: &str) {
    let legacy_only = config.contains_key("torch_dtype") && !config.contains_key("dtype");
    if !legacy_only {
        config.insert("dtype".into(), torch_name.into());
    }
    if config.contains_key("torch_dtype") {
        config.insert("torch_dtype".into(), torch_name.into());
    }
}

/// The dtype of the folder the run started from: its config.json's (`dtype`, `torch_dtype`),
/// else the one most of its weights are stored in; f32 from scratch.
fn source_dtype(
    pretrained: Option<&Path>,
    config: Option<&serde_json::Value>,
) -> Result<StoredDtype> {
    let saved = config.and_then(saved_dtype);
    if let Some(dtype) = saved.and_then(StoredDtype::from_torch_name) {
        return Ok(dtype);
    }
    let dtype = match pretrained {
        None => StoredDtype::F32,
        Some(dir) => {
            let weights = hf::HfWeights::open(dir).with_context(|| {
                format!(
                    "reading the weights of {} (the folder the run started from) for their dtype; give --dtype",
                    dir.display()
                )
            })?;
            weights.main_dtype().unwrap_or(StoredDtype::F32)
        }
    };
    // float64 or a float8 in config.json: transformers loads it, an export does not write it.
    if let Some(name) = saved {
        errln!(
            "warning: config.json's dtype {name} is not one an export writes (bfloat16, \
             float16, float32): exporting in {}, the dtype most of the weights are stored in; \
             give --dtype to choose",
            dtype.torch_name()
        );
    }
    Ok(dtype)
}

/// `5GB`, `500MB`, `10KiB` or plain bytes, as `save_pretrained(max_shard_size=...)` reads.
fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size like 5GB or 500MB"))?;
    let scale = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1.0,
        "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "KIB" => 1024.0,
        "MIB" => 1024.0 * 1024.0,
        "GIB" => 1024.0 * 1024.0 * 1024.0,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?}: use B, KB, MB, GB, KiB, MiB or GiB"
            ))
        }
    };
    let bytes = number * scale;
    if bytes < 1.0 {
        return Err(format!("{text:?} is not a positive size"));
    }
    Ok(bytes as u64)
}

/// The run's `train_config.json`, and the folder that holds it: `path` (a run directory) or a
/// folder above the checkpoint (`<run>/checkpoints/step-N`).
fn find_run_config(path: &Path, checkpoint_dir: &Path) -> Result<Option<(PathBuf, TrainConfig)>> {
    let candidates = std::iter::once(path).chain(checkpoint_dir.ancestors().take(4));
    for dir in candidates {
        let config_path = dir.join(CONFIG_FILE);
        if config_path.is_file() {
            let text = std::fs::read(&config_path)
                .with_context(|| format!("reading {}", config_path.display()))?;
            let config: TrainConfig = serde_json::from_slice(&text).with_context(|| {
                format!("{} is not a valid training config", config_path.display())
            })?;
            return Ok(Some((dir.to_path_buf(), config)));
        }
    }
    Ok(None)
}

/// The export copies the run's tokenizer files as they are now, which must still be the
/// files the run tokenized its data with (`data.json` records their hashes): others would
/// give the exported model ids other than those it learned.
fn refuse_changed_tokenizer(run_dir: &Path, data: &DatasetConfig) -> Result<()> {
    let recorded = run_dir.join(crate::rundir::DATA_IDENTITY_FILE);
    let Some(trained_with) = std::fs::read(&recorded)
        .ok()
        .and_then(|bytes| serde_json::from_slice::<DataIdentity>(&bytes).ok())
        .map(|identity| identity.training.tokenizer_files)
        .filter(|files| !files.is_empty())
    else {
        // Synthetic or pre-tokenized data, or a run from before the hashes were recorded.
        return Ok(());
    };
    // When they cannot be read now, reading the tokenizer for the export says why.
    let Ok(now) = shardrun_data::prepare::tokenizer_file_hashes(data) else {
        return Ok(());
    };
    // The model's own config.json is compared with the trained model apart, and neither it
    // nor the generation settings decide the ids.
    let ids_from = |files: Vec<(String, String)>| -> Vec<(String, String)> {
        files
            .into_iter()
            .filter(|(name, _)| !matches!(name.as_str(), "config.json" | "generation_config.json"))
            .collect()
    };
    let changed = tokenizer_file_changes(&ids_from(trained_with), &ids_from(now));
    if changed.is_empty() {
        return Ok(());
    }
    let tokenizer = match &data.tokenizer {
        TokenizerConfig::HuggingFace { path, .. } => path.display().to_string(),
        _ => "the run's tokenizer".to_string(),
    };
    bail!(
        "the tokenizer files of {tokenizer} have changed since the run tokenized its data \
         with them ({}; hashes recorded in {}): the export, which copies them, would read text \
         into other ids than those the model learned; put the files back as they were, or \
         export with --format full and pair the weights with the tokenizer they were trained \
         with yourself",
        changed.join(", "),
        recorded.display()
    )
}

/// The folder the run started from is copied into the export with its config.json, which
/// must still describe the model the run trained (a folder reused for another revision
/// would export these weights with another architecture, and load as a wrong model).
fn refuse_changed_config(
    value: &serde_json::Value,
    path: &Path,
    trained: &shardrun_protocol::config::LlamaConfig,
) -> Result<()> {
    let mut now = hf::config::parse_config(value, path).with_context(|| {
        format!(
            "{} (the folder the run started from) no longer reads as a model's config",
            path.display()
        )
    })?;
    // Whether the head is tied is the run's (its weights may have untied it).
    now.tie_embeddings = trained.tie_embeddings;
    if &now == trained {
        return Ok(());
    }
    let changed: Vec<String> = shardrun_protocol::config_diff::differences(
        &serde_json::to_value(trained)?,
        &serde_json::to_value(&now)?,
    )
    .into_iter()
    .map(|(key, was, is)| {
        use shardrun_protocol::config_diff::shown;
        format!("{key}: {} → {}", shown(&was), shown(&is))
    })
    .collect();
    bail!(
        "{} has changed since the run started from it ({}): the export, which copies it, would \
         describe another model than the one trained; put the file back as it was (the run \
         recorded its model in train_config.json), or export with --format full",
        path.display(),
        changed.join(", ")
    )
}

/// Refuses to write over `out`, saying whose export it is: one written before `source` was
/// saved is not of it (a run started over with `--force` keeps the models exported from the
/// run it replaced, whose step numbers the new run reaches again).
fn refuse_existing_export(out: &Path, source: &Checkpoint) -> Result<()> {
    let Ok(folder) = std::fs::metadata(out).or_else(|_| std::fs::symlink_metadata(out)) else {
        return Ok(());
    };
    let time = |modified: std::io::Result<std::time::SystemTime>| {
        let unix = modified
            .ok()?
            .duration_since(std::time::UNIX_EPOCH)
            .ok()?
            .as_secs_f64();
        Some(crate::job_controller::clock::format_utc(unix)[..19].to_string())
    };
    let written = time(folder.modified());
    let saved = std::fs::metadata(source.dir().join(COMPLETE_FILE))
        .or_else(|_| std::fs::metadata(source.dir().join(METADATA_FILE)))
        .map(|m| m.modified());
    let saved_after = match (folder.modified(), saved) {
        (Ok(written), Ok(Ok(saved))) => saved > written,
        _ => false,
    };
    let whose = match (written, saved_after) {
        (Some(written), true) => format!(
            ", written {written} UTC, before the checkpoint {} was saved: it is an export of \
             another checkpoint of that step (a run started over with `--force` keeps the \
             models exported from the run it replaced)",
            source.dir().display()
        ),
        (Some(written), false) => format!(", written {written} UTC"),
        (None, _) => String::new(),
    };
    bail!(
        "{} already exists{whose}\n  fix: remove it to export this checkpoint there, or choose \
         another --out",
        out.display()
    )
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
    let config_path = path.join(CONFIG_FILE);
    if config_path.exists() {
        // A run directory's config, read as the run reads it (its checkpoint folder follows
        // the directory when it was moved or copied); else the file as it is, its checkpoint
        // folder taken to be the one here of that name (a run directory without manifest).
        let config = match crate::rundir::RunDir::open(path) {
            Ok(run) => run.read_train_config()?,
            Err(_) => {
                let text = std::fs::read(&config_path)
                    .with_context(|| format!("reading {}", config_path.display()))?;
                let mut config =
                    serde_json::from_slice::<TrainConfig>(&text).with_context(|| {
                        format!("{} is not a valid training config", config_path.display())
                    })?;
                if let Some(dir) = config.checkpoint.dir.as_mut() {
                    let here = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
                    crate::rundir::follow_move(&here, None, dir);
                }
                config
            }
        };
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
    let runs = crate::slurm::find_runs(path);
    let this = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
    if !runs.is_empty() && !runs.iter().any(|run| run.path() == this) {
        let names: Vec<String> = runs
            .iter()
            .map(|run| run.path().display().to_string())
            .collect();
        let shown = match names.as_slice() {
            [one] => one.clone(),
            [first, second] => format!("{first} or {second}"),
            [first, .., last] => format!("{first}, ..., {last}"),
            [] => unreachable!("not empty"),
        };
        bail!(
            "{} holds {} run(s) (a sweep folder or a run root), and a model is exported from one run: give one of them, such as {shown} (`shardrun metrics {}` lists each one's loss and eval loss)",
            path.display(),
            runs.len(),
            crate::output::pasteable(path)
        );
    }
    if config_path.exists() {
        // A run saves when it ends too, so a run without one ended before it could.
        let ended = std::fs::read(path.join("result.json"))
            .ok()
            .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
            .and_then(|result| Some(result.get("ended")?.as_str()?.to_string()));
        // A run that ended before its controller wrote result.json (its data did not
        // prepare) has its end in the manifest.
        let manifest = crate::rundir::RunDir::open(path)
            .ok()
            .and_then(|run| run.read_manifest().ok())
            .filter(|m| m.state.is_terminal());
        match (ended, manifest) {
            (Some(ended), _) => bail!(
                "the run {} saved no checkpoint to export: it {ended} before saving one",
                path.display()
            ),
            (None, Some(manifest)) => bail!(
                "the run {} saved no checkpoint to export: it ended {} before saving one{}",
                path.display(),
                manifest.state,
                manifest
                    .error
                    .map(|error| format!(" ({error})"))
                    .unwrap_or_default()
            ),
            (None, None) => bail!(
                "the run {} has saved no checkpoint yet: it saves every \
                 `checkpoint.interval_steps` (or `interval_minutes`) and when it ends (`shardrun status {}` shows where it is)",
                path.display(),
                crate::output::pasteable(path)
            ),
        }
    }
    bail!(
        "no checkpoints under {}: it is neither a run directory nor a checkpoint folder; give a \
         run directory (with a checkpoints/ folder) or one of its checkpoints/step-N folders",
        path.display()
    )
}

fn has_step_folders(path: &Path) -> Result<bool> {
    Ok(path.is_dir()
        && !shardrun_checkpoint::naming::list_entries(path)
            .with_context(|| format!("listing {}", path.display()))?
            .is_empty())
}

/// A warning when the run of `run_dir` had diverged by the step of `checkpoint` (its
/// metrics say from which step; a blown-up loss leaves weights finite, so only they tell),
/// naming the newest checkpoint from before to export instead.
fn diverged_before(run_dir: &Path, checkpoint: &Checkpoint) -> Option<String> {
    let step = checkpoint.metadata().step;
    let run = crate::rundir::RunDir::open(run_dir).ok()?;
    let metrics = run.metrics();
    let divergence = crate::metrics_file::read(&metrics)
        .ok()?
        .diverged_from()
        .filter(|d| d.step <= step)?;
    let before = shardrun_checkpoint::naming::newest_complete_folder_before(
        &checkpoints_root(checkpoint.dir()),
        divergence.step,
    );
    Some(format!(
        "warning: {} diverged: {} from step {}, and this checkpoint is of step {step}: its \
         weights are the diverged run's\n  fix: {}",
        run_dir.display(),
        divergence.what(),
        divergence.step,
        match before {
            Some(path) => format!(
                "export the newest checkpoint from before: `shardrun export {}`",
                path.display()
            ),
            None => {
                let remedies = run.read_train_config().map_or_else(
                    |_| "a lower LR".to_string(),
                    |train| crate::metrics_file::divergence_remedies(train.optimizer.grad_clip),
                );
                // A sweep point's values are the sweep's: `--force` would train it as it was.
                let sweep_point = run
                    .read_manifest()
                    .is_ok_and(|manifest| !manifest.sweep_params.is_empty());
                match sweep_point {
                    true => format!(
                        "it has no checkpoint from before: to try it with {remedies}, change \
                         the sweep's spec and run `shardrun sweep` again (changed values are \
                         new points)"
                    ),
                    false => format!(
                        "it has no checkpoint from before: start it over (`--force`) with \
                         {remedies}"
                    ),
                }
            }
        }
    ))
}

/// The warning for an export of `values` of `total` weights that are not finite, `place`
/// saying where ("in 3 tensor(s) from ... on"). `divergence_said`: the run's metrics already
/// named the checkpoint to export instead.
fn not_finite_warning(
    values: u64,
    total: u64,
    place: &str,
    step: u64,
    divergence_said: bool,
) -> String {
    format!(
        "warning: {values} of the {total} exported weights are not finite (NaN or inf), \
         {place}: the run diverged before step {step}, and this model computes nothing \
         useful{}",
        if divergence_said {
            ""
        } else {
            "\n  fix: export a checkpoint from before it diverged (`shardrun metrics` says from \
             which step; a diverged run keeps its newest checkpoint from before): `shardrun \
             export <run>/checkpoints/step-<N>`"
        }
    )
}

/// "6,738.4 M parameters", or every digit of a model under a million ("42,624 parameters"),
/// which a tenth of a million would round to nothing.
fn parameters_in_words(n: u64) -> String {
    if n >= 1_000_000 {
        format!("{:.1} M parameters", n as f64 / 1e6)
    } else {
        format!("{} parameters", shardrun_data::dataset::thousands(n))
    }
}

/// The folder that holds `step-<N>/` folders.
fn checkpoints_root(checkpoint_dir: &Path) -> PathBuf {
    checkpoint_dir
        .parent()
        .map(Path::to_owned)
        .unwrap_or_else(|| PathBuf::from("."))
}

#[cfg(test)]
mod tests {
    use super::{checkpoint_location, parse_size, set_dtype, NewFolders};

    /// The export's config names its dtype as the source's transformers version does.
    #[test]
    fn the_dtype_is_written_under_the_key_the_source_config_uses() {
        let dtype_of = |config: serde_json::Value| {
            let mut map = config.as_object().unwrap().clone();
            set_dtype(&mut map, "bfloat16");
            serde_json::Value::Object(map)
        };
        // 4.x: torch_dtype alone.
        assert_eq!(
            dtype_of(serde_json::json!({"torch_dtype": "float32"})),
            serde_json::json!({"torch_dtype": "bfloat16"})
        );
        // 5.x, and a config that says neither.
        assert_eq!(
            dtype_of(serde_json::json!({"dtype": "float32"})),
            serde_json::json!({"dtype": "bfloat16"})
        );
        assert_eq!(
            dtype_of(serde_json::json!({})),
            serde_json::json!({"dtype": "bfloat16"})
        );
        // Both: both kept in step.
        assert_eq!(
            dtype_of(serde_json::json!({"dtype": "float32", "torch_dtype": "float32"})),
            serde_json::json!({"dtype": "bfloat16", "torch_dtype": "bfloat16"})
        );
    }

    #[test]
    fn a_folder_of_runs_is_refused_with_the_runs_to_choose_from() {
        let sweep = tempfile::tempdir().unwrap();
        for point in ["sweep-1a", "sweep-2b"] {
            let run = sweep.path().join(point);
            std::fs::create_dir(&run).unwrap();
            std::fs::write(run.join("manifest.json"), "{}").unwrap();
            std::fs::write(run.join("resolved.json"), "{}").unwrap();
        }
        let error = checkpoint_location(sweep.path()).unwrap_err().to_string();
        assert!(error.contains("holds 2 run(s) (a sweep folder"), "{error}");
        let first = sweep.path().join("sweep-1a");
        assert!(
            error.contains(&format!("such as {} or ", first.display())),
            "{error}"
        );
        // A run directory without checkpoints is told so, not taken for a folder of runs.
        let error = checkpoint_location(&first).unwrap_err().to_string();
        assert!(error.starts_with("no checkpoints under"), "{error}");
    }

    #[test]
    fn sizes_as_save_pretrained_reads_them() {
        assert_eq!(parse_size("5GB"), Ok(5_000_000_000));
        assert_eq!(parse_size("500MB"), Ok(500_000_000));
        assert_eq!(parse_size("2KiB"), Ok(2048));
        assert_eq!(parse_size("123"), Ok(123));
        assert!(parse_size("5 parsecs").is_err());
        assert!(parse_size("0").is_err());
    }

    #[test]
    fn a_failed_export_removes_the_folders_it_made_and_left_empty() {
        let root = tempfile::tempdir().unwrap();
        let out = root.path().join("a/b/c/hf");
        let made = NewFolders::above(&out);
        assert_eq!(made.0.len(), 3, "c, b and a");
        std::fs::create_dir_all(out.parent().unwrap()).unwrap();
        // Something of someone else's in `a`: kept, and `a` with it.
        std::fs::write(root.path().join("a/notes.txt"), "mine").unwrap();
        made.remove_empty();
        assert!(!root.path().join("a/b").exists());
        assert!(root.path().join("a/notes.txt").exists());
        assert!(NewFolders::above(&root.path().join("x")).0.is_empty());
    }
}
