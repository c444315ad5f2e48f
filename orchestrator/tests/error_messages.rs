//! What `shardrun plan` prints for each kind of mistake in a job spec, exactly: where (file,
//! line, column, field), why, the line of the file with the column marked, and the fix, each
//! said once.

mod common;
use common::{shardrun, spec_dir};
use std::path::Path;

const VALID: &str = "name: t
training:
  model: { kind: transformer, vocab_size: 128, dim: 64, n_layers: 2, n_heads: 4, max_seq_len: 16 }
  steps: 2
  total_batch_size: 4
  batch_size_per_device: 2
";

/// `shardrun plan job.yaml --set <sets>...` run in `dir`; returns (exit code, stdout, stderr).
fn plan_in(dir: &Path, sets: &[&str]) -> (i32, String, String) {
    let mut args = vec!["plan", "job.yaml"];
    for set in sets {
        args.extend(["--set", set]);
    }
    let out = shardrun(dir, &args);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// `shardrun plan job.yaml` on `yaml`, run where `job.yaml` is; returns (exit code, stderr).
fn plan(yaml: &str) -> (i32, String) {
    let dir = spec_dir("job.yaml", yaml);
    let (code, _, stderr) = plan_in(dir.path(), &[]);
    (code, stderr)
}

fn assert_error(yaml: &str, expected: &str) {
    let (code, stderr) = plan(yaml);
    assert_eq!(stderr, expected, "stderr was:\n{stderr}");
    assert_ne!(code, 0);
}

#[test]
fn a_valid_spec_prints_no_error() {
    let (code, stderr) = plan(VALID);
    assert_eq!((code, stderr.as_str()), (0, ""));
}

#[test]
fn unreadable_file() {
    let out = shardrun(Path::new("."), &["plan", "/nonexistent/job.yaml"]);
    assert_eq!(
        String::from_utf8(out.stderr).unwrap(),
        "error: /nonexistent/job.yaml: cannot read the file: No such file or directory (os error 2)\n  \
         fix: check the path; `shardrun plan examples/demo.yaml` shows a working spec\n"
    );
}

#[test]
fn a_model_folder_given_for_the_spec_says_how_a_spec_names_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("llama")).unwrap();
    std::fs::write(dir.path().join("llama/config.json"), "{}").unwrap();
    // The spec line names the folder absolutely: spec paths are relative to the spec.
    let folder = dir.path().join("llama");
    for command in ["plan", "run", "sweep"] {
        let out = shardrun(dir.path(), &[command, "llama"]);
        let takes = match command {
            "sweep" => "takes a sweep's spec (a YAML file with a `sweep:` section)",
            _ => "takes a job spec (a YAML file) or a run directory",
        };
        assert_eq!(
            String::from_utf8(out.stderr).unwrap(),
            format!(
                "error: llama is a folder without a job.yaml, and not a run directory: \
                 `shardrun {command}` {takes}. It looks like a Hugging Face model folder: a \
                 spec trains it with\n    training:\n      model: {{kind: hf, path: {}}}\n  \
                 (examples/llama-finetune.yaml is a whole one)\n  fix: `shardrun {command} \
                 <your spec>.yaml`; `shardrun plan examples/demo.yaml` shows a working spec\n",
                folder.display()
            )
        );
        assert_ne!(out.status.code(), Some(0));
    }
}

#[test]
fn logs_of_a_folder_that_is_not_a_run_says_so() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("notes")).unwrap();
    std::fs::write(dir.path().join("notes/todo.txt"), "x").unwrap();
    // Followed too: such a folder is not a run still being written.
    for args in [&["logs", "notes"][..], &["logs", "-f", "notes"]] {
        let out = shardrun(dir.path(), args);
        assert_eq!(
            String::from_utf8(out.stderr).unwrap(),
            "error: notes is not a run directory (no manifest.json), and holds no train.log\n  \
             fix: give a run directory, as `shardrun submit` and `shardrun run` print it; \
             `shardrun status` lists those under runs/ (`shardrun status <folder>` under \
             another)\n"
        );
        assert_eq!(out.status.code(), Some(1));
    }
}

/// A folder without runs: what to do depends on what it is. A sweep's folder whose first
/// `shardrun sweep` stopped before any point (its `arrays/` record only) is swept again.
#[test]
fn status_of_a_folder_without_runs_says_how_runs_get_there() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("empty")).unwrap();
    std::fs::create_dir_all(dir.path().join("sweep/arrays")).unwrap();
    for (folder, fix) in [
        (
            "empty",
            "pass a run directory or run root, or create a run with `shardrun submit job.yaml`",
        ),
        (
            "sweep",
            "it is a sweep's folder without points yet: run `shardrun sweep` on the sweep's \
             spec (again, if it stopped)",
        ),
    ] {
        let out = shardrun(dir.path(), &["status", folder]);
        assert_eq!(
            String::from_utf8(out.stderr).unwrap(),
            format!("error: no run directories at {folder}\n  fix: {fix}\n")
        );
        assert_eq!(out.status.code(), Some(4));
    }
}

#[test]
fn plot_refuses_an_output_it_cannot_draw_before_reading_anything() {
    let dir = tempfile::tempdir().unwrap();
    let out = shardrun(dir.path(), &["plot", "runs/none", "-o", "curves.jpg"]);
    assert_eq!(
        String::from_utf8(out.stderr).unwrap(),
        "error: cannot tell the format of curves.jpg: name it .svg or .png\n"
    );
    assert!(!dir.path().join("curves.jpg").exists());
}

#[test]
fn malformed_yaml() {
    assert_error(
        "name: t\n  bad: indent\n",
        "\
error: job.yaml:2:6: not valid YAML: mapping values are not allowed in this context
  |
2 |   bad: indent
  |      ^
  fix: check indentation (spaces only) and quoting around this position
",
    );
}

#[test]
fn unknown_field() {
    assert_error(
        &VALID.replace("  steps: 2\n", "  steps: 2\n  optimizer:\n    lrr: 0.1\n"),
        "\
error: job.yaml:6:5: field `training.optimizer`: unknown key `training.optimizer.lrr`
  |
6 |     lrr: 0.1
  |     ^^^
  fix: did you mean `lr`?
",
    );
}

#[test]
fn missing_field() {
    assert_error(
        &VALID.replace("  steps: 2\n", ""),
        "\
error: job.yaml:3:3: field `training`: required key `training.steps` is missing
  |
3 |   model: { kind: transformer, vocab_size: 128, dim: 64, n_layers: 2, n_heads: 4, max_seq_len: 16 }
  |   ^
  fix: add `steps:` here; docs/job-spec.md lists every key with its default
",
    );
}

#[test]
fn wrong_value() {
    assert_error(
        &VALID.replace("steps: 2", "steps: many"),
        "\
error: job.yaml:4:10: field `training.steps`: invalid type: string \"many\", expected a whole number (0 or more)
  |
4 |   steps: many
  |          ^^^^
  fix: write a whole number (0 or more) here
",
    );
}

/// `model:` is read by its `kind` first, which hides the keys under it from serde's path:
/// the error is placed at the key or value it is about all the same.
#[test]
fn a_wrong_value_or_unknown_key_inside_the_model() {
    assert_error(
        &VALID.replace("dim: 64", "dim: wide"),
        "\
error: job.yaml:3:53: field `training.model.dim`: invalid type: string \"wide\", expected a whole number (0 or more)
  |
3 |   model: { kind: transformer, vocab_size: 128, dim: wide, n_layers: 2, n_heads: 4, max_seq_len: 16 }
  |                                                     ^^^^
  fix: write a whole number (0 or more) here
",
    );
    let llama = "  model:
    kind: llama
    vocab_size: 128
    dim: 64
    n_layers: 2
    n_heads: 4
    ffn_dim: 128
    rope_scaling: { rope_type: linear, factor: 2.0, low_freq: 1 }
";
    let spec = |model: &str| {
        VALID.replace(
            "  model: { kind: transformer, vocab_size: 128, dim: 64, n_layers: 2, n_heads: 4, max_seq_len: 16 }\n",
            model,
        )
    };
    assert_error(
        &spec(llama),
        "\
error: job.yaml:10:53: field `training.model.rope_scaling`: unknown key `training.model.rope_scaling.low_freq`
   |
10 |     rope_scaling: { rope_type: linear, factor: 2.0, low_freq: 1 }
   |                                                     ^^^^^^^^
  fix: use one of `factor`
",
    );
    // `2` is written twice, as a string once: that one is meant.
    assert_error(
        &spec(&llama.replace("factor: 2.0, low_freq: 1", "factor: \"2\"")),
        "\
error: job.yaml:10:48: field `training.model.rope_scaling.factor`: invalid type: string \"2\", expected a number
   |
10 |     rope_scaling: { rope_type: linear, factor: \"2\" }
   |                                                ^^^^
  fix: write a number here
",
    );
}

#[test]
fn heads_that_do_not_divide_the_width() {
    assert_error(
        &VALID.replace("n_heads: 4", "n_heads: 5"),
        "\
error: job.yaml:3:70: field `training.model.n_heads`: dim 64 is not divisible by 5 heads
  |
3 |   model: { kind: transformer, vocab_size: 128, dim: 64, n_layers: 2, n_heads: 5, max_seq_len: 16 }
  |                                                                      ^^^^^^^
  fix: use a number of heads that divides 64
",
    );
}

#[test]
fn a_total_batch_that_does_not_split() {
    assert_error(
        &VALID.replace("total_batch_size: 4", "total_batch_size: 5"),
        "\
error: job.yaml:5:3: field `training.total_batch_size`: total batch 5 does not split into \
per-device batches of 2 on 1 rank (`resources`; 5 / 2 is not a whole number of accumulation steps)
  |
5 |   total_batch_size: 5
  |   ^^^^^^^^^^^^^^^^
  fix: set `total_batch_size` to a multiple of 2 × 1 = 2: nearest 4 or 6; or keep it and use \
a `batch_size_per_device` of 1 or 5
",
    );
}

#[test]
fn a_total_batch_of_zero() {
    assert_error(
        &VALID.replace("total_batch_size: 4", "total_batch_size: 0"),
        "\
error: job.yaml:5:3: field `training.total_batch_size`: `total_batch_size` is 0; a step \
trains on at least 1 sample
  |
5 |   total_batch_size: 0
  |   ^^^^^^^^^^^^^^^^
  fix: set `total_batch_size` to a multiple of 2 × 1 = 2, such as 2
",
    );
}

#[test]
fn a_per_device_batch_of_zero() {
    assert_error(
        &VALID.replace("batch_size_per_device: 2", "batch_size_per_device: 0"),
        "\
error: job.yaml:6:3: field `training.batch_size_per_device`: `batch_size_per_device` is 0
  |
6 |   batch_size_per_device: 0
  |   ^^^^^^^^^^^^^^^^^^^^^
  fix: use at least 1 sample per device
",
    );
}

#[test]
fn a_model_folder_that_does_not_exist() {
    let dir = spec_dir(
        "job.yaml",
        &VALID.replace(
            "{ kind: transformer, vocab_size: 128, dim: 64, n_layers: 2, n_heads: 4, max_seq_len: 16 }",
            "{ kind: hf, path: models/tiny-lama }",
        ),
    );
    std::fs::create_dir(dir.path().join("models")).unwrap();
    let (code, _, stderr) = plan_in(dir.path(), &[]);
    let folder = dir.path().join("models/tiny-lama");
    assert_eq!(
        stderr,
        format!(
            "\
error: job.yaml:3:22: field `training.model.path`: the model folder {} does not exist
  |
3 |   model: {{ kind: hf, path: models/tiny-lama }}
  |                      ^^^^
  fix: check `training.model.path` (relative paths are relative to the job spec's folder); \
it names a Hugging Face model folder (config.json with model.safetensors or \
model.safetensors.index.json)
",
            folder.display()
        )
    );
    assert_ne!(code, 0);
}

#[test]
fn a_loss_chunk_of_zero_tokens() {
    assert_error(
        &VALID.replace(
            "  steps: 2\n",
            "  steps: 2\n  fsdp:\n    loss_chunk_tokens: 0\n",
        ),
        "\
error: job.yaml:6:5: field `training.fsdp.loss_chunk_tokens`: a chunk of 0 tokens would never \
compute the loss
  |
6 |     loss_chunk_tokens: 0
  |     ^^^^^^^^^^^^^^^^^
  fix: use 1 or more, or leave it out (as many tokens as fill 1 GiB of fp32 logits)
",
    );
}

#[test]
fn an_unknown_key_in_a_flow_map() {
    assert_error(
        &VALID.replace(
            "  steps: 2\n",
            "  steps: 2\n  fsdp: {strategy: FULL_SHARD, bogus: 1}\n",
        ),
        "\
error: job.yaml:5:32: field `training.fsdp`: unknown key `training.fsdp.bogus`
  |
5 |   fsdp: {strategy: FULL_SHARD, bogus: 1}
  |                                ^^^^^
  fix: use one of `strategy`, `wrap`, `mixed_precision`, `activation_checkpointing`, \
`prefetch`, `max_gathers_in_flight`, `shard_group_size`, `loss_chunk_tokens`
",
    );
}

#[test]
fn a_value_with_a_hash_inside_quotes_in_a_flow_map() {
    assert_error(
        &format!("{VALID}resources: {{partition: \"gpu #2\", time: \"1:00 #x\"}}\n"),
        "\
error: job.yaml:7:34: field `resources.time`: `1:00 #x` is not a Slurm time limit
  |
7 | resources: {partition: \"gpu #2\", time: \"1:00 #x\"}
  |                                  ^^^^
  fix: write `MM`, `HH:MM:SS` or `D-HH:MM:SS`, e.g. `time: \"02:00:00\"` (quoted), or `UNLIMITED`
",
    );
}

#[test]
fn a_wrong_value_given_through_an_alias() {
    assert_error(
        &VALID
            .replace("name: t\n", "name: &name t\n")
            .replace("steps: 2", "steps: *name"),
        "\
error: job.yaml:4:10: field `training.steps`: invalid type: string \"t\", expected a whole number (0 or more)
  |
4 |   steps: *name
  |          ^^^^^
  fix: write a whole number (0 or more) here
",
    );
}

#[test]
fn a_merge_key() {
    assert_error(
        &VALID.replace(
            "  steps: 2\n",
            "  steps: 2\n  optimizer: &opt {lr: 0.1}\n  schedule:\n    <<: *opt\n",
        ),
        "\
error: job.yaml:7:5: merge keys (`<<`) are not part of YAML 1.2 and not read in a job spec
  |
7 |     <<: *opt
  |     ^^
  fix: write the keys out here; an alias (`*name`) can stand for a whole value
",
    );
}

#[test]
fn two_documents_in_one_file() {
    assert_error(
        &format!("{VALID}---\nname: u\n"),
        "\
error: job.yaml:7:1: a second YAML document starts here; a job spec is one document
  |
7 | ---
  | ^^^
  fix: remove this `---` and what follows it, or move that part to a spec file of its own
",
    );
}

/// `shardrun plan job.yaml --set ...` on the valid spec; returns (exit code, stdout, stderr).
fn plan_with(sets: &[&str]) -> (i32, String, String) {
    plan_in(spec_dir("job.yaml", VALID).path(), sets)
}

#[test]
fn a_set_flag_gets_the_files_explanation_and_names_the_flag() {
    let (code, _, stderr) = plan_with(&["training.stepz=5"]);
    assert_ne!(code, 0);
    assert_eq!(
        stderr,
        "error: --set training.stepz=5: field `training`: unknown key `training.stepz`\n  \
         fix: did you mean `training.steps`?\n"
    );
    let (_, _, stderr) = plan_with(&["training.total_batch_size=5"]);
    assert_eq!(
        stderr,
        "error: --set training.total_batch_size=5: field `training.total_batch_size`: total \
         batch 5 does not split into per-device batches of 2 on 1 rank (`resources`; 5 / 2 is not a \
         whole number of accumulation steps)\n  fix: set `total_batch_size` to a multiple of 2 × 1 = 2: \
         nearest 4 or 6; or keep it and use a `batch_size_per_device` of 1 or 5\n"
    );
    let (code, stdout, stderr) = plan_with(&["training.steps=20000", "training.seed=3"]);
    assert_eq!((code, stderr.as_str()), (0, ""));
    assert!(stdout.contains("20000"), "{stdout}");
}

/// `shardrun plan job.yaml` on `yaml` in a folder that also holds `train.jsonl` and the
/// folders `tok` (the byte tokenizer as a Hugging Face folder, end of document `<eos>`) and
/// `sp` (a SentencePiece tokenizer.model only); returns (exit code, stderr with the folder
/// shown as `<dir>`).
fn plan_with_data(yaml: &str, sets: &[&str]) -> (i32, String) {
    let dir = spec_dir("job.yaml", yaml);
    std::fs::write(dir.path().join("train.jsonl"), "{\"text\": \"x\"}\n").unwrap();
    let tok = dir.path().join("tok");
    std::fs::create_dir(&tok).unwrap();
    let json = shardrun_data::tokenizer_files::bytes_tokenizer_json().unwrap();
    std::fs::write(tok.join("tokenizer.json"), json).unwrap();
    std::fs::write(
        tok.join("tokenizer_config.json"),
        r#"{"eos_token": "<eos>"}"#,
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("sp")).unwrap();
    std::fs::write(dir.path().join("sp/tokenizer.model"), "").unwrap();
    let (code, _, stderr) = plan_in(dir.path(), sets);
    let shown = std::fs::canonicalize(dir.path()).unwrap();
    (code, stderr.replace(&shown.display().to_string(), "<dir>"))
}

const WITH_DATA: &str = "name: t
training:
  model: { kind: transformer, vocab_size: 300, dim: 64, n_layers: 2, n_heads: 4, max_seq_len: 16 }
  data:
    kind: jsonl
    files: [train.jsonl]
    tokenizer: { path: tok }
  steps: 2
  total_batch_size: 4
  batch_size_per_device: 2
";

#[test]
fn data_that_is_not_there_fails_the_plan() {
    assert_eq!(plan_with_data(WITH_DATA, &[]), (0, String::new()));
    let (code, stderr) = plan_with_data(WITH_DATA, &["training.data.files=[nope.jsonl]"]);
    assert_eq!(
        (code, stderr.as_str()),
        (
            1,
            "error: --set training.data.files=[nope.jsonl]: field `training.data.files[0]`: no \
             file matches <dir>/nope.jsonl\n  fix: check the path (relative paths are relative \
             to the job spec's folder)\n"
        )
    );
    let (code, stderr) = plan_with_data(&WITH_DATA.replace("train.jsonl", "trian.jsonl"), &[]);
    assert_eq!(
        (code, stderr.as_str()),
        (
            1,
            "\
error: job.yaml:6:13: field `training.data.files[0]`: no file matches <dir>/trian.jsonl
  |
6 |     files: [trian.jsonl]
  |             ^^^^^^^^^^^
  fix: did you mean <dir>/train.jsonl?
"
        )
    );
    let (code, stderr) = plan_with_data(&WITH_DATA.replace("path: tok", "path: sp"), &[]);
    assert_eq!(
        (code, stderr.as_str()),
        (
            1,
            "\
error: job.yaml:7:18: field `training.data.tokenizer.path`: <dir>/sp holds a SentencePiece `tokenizer.model` but no `tokenizer.json`, which is what shardrun reads
  |
7 |     tokenizer: { path: sp }
  |                  ^^^^
  fix: write the folder's tokenizer.json once, with transformers (which reads a SentencePiece model with two more packages: `pip install transformers sentencepiece protobuf`): `python -c \"from transformers import AutoTokenizer; AutoTokenizer.from_pretrained('<dir>/sp').save_pretrained('<dir>/sp')\"`
"
        )
    );
    // A token the tokenizer lacks would stop the job's data preparation after the queue wait.
    let (code, stderr) = plan_with_data(WITH_DATA, &["training.data.tokenizer.eos_token=</s>"]);
    assert_eq!(
        (code, stderr.as_str()),
        (
            1,
            "error: --set training.data.tokenizer.eos_token=</s>: field \
             `training.data.tokenizer.eos_token`: the tokenizer <dir>/tok/tokenizer.json has no \
             token `</s>`; its special tokens: `<eos>`\n  fix: name one of its tokens, or remove \
             `eos_token` to take the one its folder names\n"
        )
    );
}

#[test]
fn run_with_no_rank_names_the_flag() {
    let dir = spec_dir("job.yaml", VALID);
    let out = shardrun(dir.path(), &["run", "job.yaml", "--nproc", "0"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8(out.stderr).unwrap(),
        "error: --nproc 0 would start no rank\n  fix: pass --nproc 1 or more\n"
    );
}
