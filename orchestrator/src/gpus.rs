//! The GPUs of this machine for a local run (`shardrun run --device cuda`): one rank per GPU,
//! each rank given its own through `CUDA_VISIBLE_DEVICES`, never more ranks than GPUs. Counted
//! without CUDA (the orchestrator does not link it): `CUDA_VISIBLE_DEVICES` when set, else the
//! NVIDIA driver's list of GPUs (or its device files).

use std::path::Path;

/// The GPUs a local run may use, as `CUDA_VISIBLE_DEVICES` entries (indices or UUIDs).
/// `visible`: the caller's `CUDA_VISIBLE_DEVICES`; `driver_gpus`: how many GPUs the driver
/// lists, when it is loaded.
pub fn visible_gpus(visible: Option<&str>, driver_gpus: Option<usize>) -> Vec<String> {
    match visible {
        // CUDA honours entries up to the first one that is not an index or a UUID.
        Some(list) => list
            .split(',')
            .map(str::trim)
            .take_while(|e| {
                e.parse::<u32>().is_ok() || e.starts_with("GPU-") || e.starts_with("MIG-")
            })
            .map(str::to_string)
            .collect(),
        None => (0..driver_gpus.unwrap_or(0))
            .map(|i| i.to_string())
            .collect(),
    }
}

/// One GPU per rank for `world` ranks on this machine, or why not. `asked`: what asked for
/// CUDA (`--device cuda`, or the spec's `resources.gpus_per_node`), as the errors name it.
pub fn assign(
    world: u64,
    visible: Option<&str>,
    driver_gpus: Option<usize>,
    host: &str,
    asked: &str,
) -> Result<Vec<String>, String> {
    let gpus = visible_gpus(visible, driver_gpus);
    let seen = match visible {
        Some(v) => format!("CUDA_VISIBLE_DEVICES={v}"),
        None => match driver_gpus {
            Some(n) => format!("the NVIDIA driver lists {n}"),
            None => "no NVIDIA driver is loaded".to_string(),
        },
    };
    if gpus.is_empty() {
        return Err(format!(
            "{asked} asks for CUDA, but this machine ({host}) has no GPU for it ({seen}): run on \
             a GPU machine, or pass --device cpu"
        ));
    }
    if world > gpus.len() as u64 {
        return Err(format!(
            "{world} ranks on CUDA ({asked}), but this machine ({host}) has {} GPU(s) ({seen}): \
             one rank per GPU, so pass --nproc {} (or fewer), or --device cpu",
            gpus.len(),
            gpus.len()
        ));
    }
    Ok(gpus.into_iter().take(world as usize).collect())
}

/// How many GPUs the loaded NVIDIA driver lists: `/proc/driver/nvidia/gpus/<bus id>/`, else
/// (containers that show no `/proc/driver/nvidia`) the `/dev/nvidia<N>` device files.
pub fn driver_gpu_count() -> Option<usize> {
    gpu_count_in(Path::new("/proc/driver/nvidia/gpus"), Path::new("/dev"))
}

fn gpu_count_in(proc_gpus: &Path, dev: &Path) -> Option<usize> {
    if let Ok(entries) = std::fs::read_dir(proc_gpus) {
        return Some(entries.flatten().count());
    }
    let devices = std::fs::read_dir(dev)
        .ok()?
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.strip_prefix("nvidia")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .count();
    (devices > 0).then_some(devices)
}

/// [`assign`] for this process's environment and machine.
pub fn for_local_run(world: u64, asked: &str) -> Result<Vec<String>, String> {
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    assign(
        world,
        visible.as_deref(),
        driver_gpu_count(),
        &shardrun_protocol::host::hostname(),
        asked,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLAG: &str = "--device cuda";

    #[test]
    fn one_gpu_per_rank_never_more_ranks_than_gpus() {
        assert_eq!(
            assign(2, None, Some(4), "h", FLAG).unwrap(),
            vec!["0".to_string(), "1".to_string()]
        );
        assert_eq!(
            assign(2, Some("3,1"), Some(4), "h", FLAG).unwrap(),
            vec!["3".to_string(), "1".to_string()]
        );
        assert_eq!(
            assign(1, Some("GPU-aa11,GPU-bb22"), None, "h", FLAG).unwrap(),
            vec!["GPU-aa11".to_string()]
        );
        let err = assign(4, Some("0,1"), Some(8), "gpu7", FLAG).unwrap_err();
        assert!(
            err.contains("4 ranks on CUDA (--device cuda)")
                && err.contains("gpu7")
                && err.contains("--nproc 2"),
            "{err}"
        );
        let err = assign(3, None, Some(2), "h", FLAG).unwrap_err();
        assert!(err.contains("the NVIDIA driver lists 2"), "{err}");
    }

    #[test]
    fn gpus_are_counted_from_the_driver_else_from_the_device_files() {
        let dir = tempfile::tempdir().unwrap();
        let (proc_gpus, dev) = (dir.path().join("gpus"), dir.path().join("dev"));
        std::fs::create_dir_all(&dev).unwrap();
        for name in [
            "nvidia0",
            "nvidia1",
            "nvidiactl",
            "nvidia-uvm",
            "nvidia-caps",
            "null",
        ] {
            std::fs::write(dev.join(name), "").unwrap();
        }
        assert_eq!(gpu_count_in(&proc_gpus, &dev), Some(2));
        for bus in ["0000:17:00.0", "0000:65:00.0", "0000:ca:00.0"] {
            std::fs::create_dir_all(proc_gpus.join(bus)).unwrap();
        }
        assert_eq!(gpu_count_in(&proc_gpus, &dev), Some(3));
        let empty = dir.path().join("empty");
        std::fs::create_dir_all(&empty).unwrap();
        assert_eq!(gpu_count_in(&dir.path().join("none"), &empty), None);
    }

    #[test]
    fn no_gpu_is_one_clear_error_naming_the_machine() {
        for (visible, driver) in [
            (None, None),
            (Some(""), Some(2)),
            (Some("NoDevFiles"), None),
        ] {
            let err = assign(1, visible, driver, "login3", FLAG).unwrap_err();
            assert!(
                err.starts_with(
                    "--device cuda asks for CUDA, but this machine (login3) has no GPU"
                ) && err.contains("--device cpu"),
                "{err}"
            );
        }
    }

    #[test]
    fn errors_name_the_spec_field_that_asked_for_cuda() {
        let asked = "`resources.gpus_per_node: 2` in job.yaml";
        let err = assign(2, None, None, "vm", asked).unwrap_err();
        assert!(
            err.starts_with(
                "`resources.gpus_per_node: 2` in job.yaml asks for CUDA, but this machine (vm) \
                 has no GPU"
            ),
            "{err}"
        );
        assert!(!err.contains("device: cuda"), "{err}");
        let err = assign(2, None, Some(1), "vm", asked).unwrap_err();
        assert!(
            err.starts_with("2 ranks on CUDA (`resources.gpus_per_node: 2` in job.yaml)"),
            "{err}"
        );
    }
}
