//! A model folder of PyTorch pickle weights (`pytorch_model.bin`) is refused with a command
//! that converts it: run as told, with the project's `transformers`, it gives a folder
//! shardrun reads, holding the same weights in their own dtype and the tokenizer.

mod hf_common;

use hf_common::*;
use shardrun_models::hf::{self, HfWeights};
use std::process::Command;

#[test]
fn the_conversion_told_for_pickle_weights_keeps_the_weights_their_dtype_and_tokenizer() {
    let source = folder("llama-sharded-bf16");
    let work = tempfile::tempdir().unwrap();
    let pickle = work.path().join("pickle");
    std::fs::create_dir(&pickle).unwrap();
    for entry in std::fs::read_dir(&source).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.contains("safetensors") {
            std::fs::copy(&path, pickle.join(&name)).unwrap();
        }
    }
    // The same tensors pickled by PyTorch, as older folders hold them.
    let pickled = Command::new(python())
        .args([
            "-c",
            "import glob, os, sys, torch; from safetensors.torch import load_file\n\
             state = {}\n\
             for f in glob.glob(os.path.join(sys.argv[1], '*.safetensors')): state.update(load_file(f))\n\
             torch.save(state, os.path.join(sys.argv[2], 'pytorch_model.bin'))",
        ])
        .arg(&source)
        .arg(&pickle)
        .status()
        .unwrap();
    assert!(pickled.success());

    let told = hf::open_folder(&pickle)
        .expect_err("pickle weights are refused")
        .to_string();
    let command = told
        .split_once("python -c \"")
        .and_then(|(_, rest)| rest.split_once("\" <folder> <new folder>"))
        .map(|(command, _)| command)
        .unwrap_or_else(|| panic!("no command in: {told}"));
    let converted = work.path().join("converted");
    let out = Command::new(python())
        .args(["-c", command])
        .arg(&pickle)
        .arg(&converted)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{command}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    hf::open_folder(&converted).unwrap_or_else(|e| panic!("the converted folder: {e}"));
    let (was, now) = (
        HfWeights::open(&source).unwrap(),
        HfWeights::open(&converted).unwrap(),
    );
    assert_eq!(now.main_dtype(), Some(hf::StoredDtype::Bf16));
    assert_eq!(
        now.tensors().keys().collect::<Vec<_>>(),
        was.tensors().keys().collect::<Vec<_>>()
    );
    for (name, tensor) in was.tensors() {
        let numel = tensor.numel();
        let read = |weights: &HfWeights| {
            let mut values = vec![0f32; numel as usize];
            weights.read(name, 0..numel, &mut values).unwrap();
            values
        };
        let (a, b) = (read(&was), read(&now));
        assert_eq!(max_abs_difference(name, &b, &a), 0.0, "{name}");
    }
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        assert!(
            converted.join(file).is_file(),
            "{file} is not in the converted folder"
        );
    }
}
