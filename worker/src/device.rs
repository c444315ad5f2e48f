//! One device per local rank, chosen from what the launcher gave the rank and made the
//! current CUDA device before anything else touches CUDA (NCCL binds its communicator to the
//! current device; libtorch allocates there).
//!
//! | launch | `CUDA_VISIBLE_DEVICES` of a rank | its device |
//! | --- | --- | --- |
//! | `shardrun run --device cuda`, `srun --gpus-per-task=1` | one GPU (index or UUID) | that one (0) |
//! | `srun --gres=gpu:N`, torchrun on a node | the node's N GPUs | local rank |
//! | nothing set | unset: every GPU of the node | local rank |
//!
//! The local rank is the controller's `SHARDRUN_LOCAL_RANK`, Slurm's `SLURM_LOCALID` or
//! torchrun's `LOCAL_RANK` ([`crate::launch::RankEnv`]).

use crate::cuda;
use std::sync::OnceLock;

/// What the launcher made visible to this rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Visible {
    /// `CUDA_VISIBLE_DEVICES` unset: every GPU of the node.
    All,
    /// The entries CUDA honours, in order (indices, `GPU-…` or `MIG-…` UUIDs); CUDA stops at
    /// the first entry that is none of these, and so does this list. Empty: no GPU.
    List(Vec<String>),
}

impl Visible {
    pub fn parse(value: Option<&str>) -> Visible {
        let Some(value) = value else {
            return Visible::All;
        };
        let entries = value
            .split(',')
            .map(str::trim)
            .take_while(|e| {
                e.parse::<u32>().is_ok() || e.starts_with("GPU-") || e.starts_with("MIG-")
            })
            .map(str::to_string)
            .collect();
        Visible::List(entries)
    }

    fn describe(&self, raw: Option<&str>) -> String {
        match (self, raw) {
            (Visible::All, _) => "CUDA_VISIBLE_DEVICES unset".to_string(),
            (_, Some(raw)) => format!("CUDA_VISIBLE_DEVICES={raw}"),
            (_, None) => String::new(),
        }
    }
}

/// Which visible device a rank uses: its only one, or the one at its local rank.
/// `count` is the number of devices CUDA reports (after `CUDA_VISIBLE_DEVICES`).
pub fn choose(
    visible: &Visible,
    raw: Option<&str>,
    local_rank: u64,
    count: usize,
) -> Result<usize, String> {
    let seen = visible.describe(raw);
    if count == 0 {
        return Err(match visible {
            Visible::List(l) if l.is_empty() => {
                format!("no GPU is visible to this rank ({seen}): the launcher gave it none")
            }
            _ => format!("CUDA reports no device ({seen})"),
        });
    }
    // A rank given exactly one GPU (per-task binding) uses it, whatever its local rank.
    if matches!(visible, Visible::List(l) if l.len() == 1) {
        return Ok(0);
    }
    let local = usize::try_from(local_rank).unwrap_or(usize::MAX);
    if local < count {
        return Ok(local);
    }
    Err(format!(
        "local rank {local_rank} needs a GPU of its own but only {count} GPU(s) are visible ({seen}): start \
         at most {count} ranks per node, or give each rank one GPU (srun --gpus-per-task=1)"
    ))
}

/// The device this process trains on, once chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chosen {
    pub index: usize,
    pub name: String,
    /// How it was given (`CUDA_VISIBLE_DEVICES=…`, local rank), for the registration.
    pub given: String,
}

impl std::fmt::Display for Chosen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cuda:{} ({}; {})", self.index, self.name, self.given)
    }
}

static CHOSEN: OnceLock<Chosen> = OnceLock::new();

/// Chooses this rank's GPU and makes it the current device; every later call returns the
/// same choice. The error names the node and says what the rank was given.
pub fn select_cuda(local_rank: u64) -> Result<&'static Chosen, String> {
    if let Some(chosen) = CHOSEN.get() {
        return Ok(chosen);
    }
    let host = shardrun_protocol::host::hostname();
    let raw = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let visible = Visible::parse(raw.as_deref());
    let problem = |why: String| format!("node {host}: the job trains on CUDA, but {why}");
    if !cuda::runtime_present() || !tch::Cuda::is_available() {
        // Containers that pass GPUs through without /proc/driver/nvidia still have the
        // control device.
        let driver_loaded = ["/proc/driver/nvidia/version", "/dev/nvidiactl"]
            .iter()
            .any(|p| std::path::Path::new(p).exists());
        // CUDA's own words for it ("driver too old", ...), which libtorch's check drops.
        let cuda_says = || match cuda::device_count() {
            Ok(n) => format!("CUDA counts {n} device(s)"),
            Err(e) => e.to_string(),
        };
        let why = if !cuda::runtime_present() {
            "this libtorch has no CUDA runtime (a CPU build?)".to_string()
        } else if !driver_loaded {
            format!(
                "no NVIDIA driver is loaded on this node ({}; {}): run on a GPU node, or \
                 train on CPUs (`resources.gpus_per_node: 0`; `shardrun run --device cpu`)",
                visible.describe(raw.as_deref()),
                cuda_says()
            )
        } else {
            format!(
                "libtorch sees no usable CUDA device ({}; driver {}; {}): libtorch's CUDA 13 \
                 needs driver 580 or newer, and GPUs of compute capability 7.5 or newer; \
                 check them and that the GPUs are not hidden",
                visible.describe(raw.as_deref()),
                driver_version().unwrap_or_else(|| "unknown".into()),
                cuda_says()
            )
        };
        return Err(problem(why));
    }
    let count = cuda::device_count().map_err(|e| problem(e.to_string()))?;
    let index = choose(&visible, raw.as_deref(), local_rank, count).map_err(problem)?;
    cuda::set_device(index).map_err(|e| problem(e.to_string()))?;
    let name = cuda::device_name(index).unwrap_or_else(|_| "unknown GPU".into());
    let given = format!(
        "{}, local rank {local_rank}",
        visible.describe(raw.as_deref())
    );
    Ok(CHOSEN.get_or_init(|| Chosen { index, name, given }))
}

/// The chosen GPU, if [`select_cuda`] ran.
pub fn chosen() -> Option<&'static Chosen> {
    CHOSEN.get()
}

/// `shardrun-worker --check-gpu`: what a rank would use on a GPU run (libtorch, the CUDA
/// runtime, NCCL, its device), one line each on stdout; an error when the device or NCCL is
/// unusable.
pub fn check_gpu(local_rank: u64) -> Result<(), String> {
    use crate::collectives::nccl::library;
    let torch_lib = library::mapped("libtorch_cpu.so")
        .into_iter()
        .next()
        .and_then(|p| p.parent().map(|d| d.display().to_string()))
        .unwrap_or_else(|| "unknown".into());
    println!("libtorch: {torch_lib}");
    match cuda::runtime_file() {
        Some(path) => println!("cuda runtime: {}", path.display()),
        None => println!("cuda runtime: not loadable (a CPU build of libtorch?)"),
    }
    println!(
        "nvidia driver: {}",
        driver_version().unwrap_or_else(|| "none loaded on this node".into())
    );
    let nccl = library::load();
    match &nccl {
        Ok(nccl) => println!("nccl: {nccl}"),
        Err(e) => println!("nccl: {e}"),
    }
    let device = select_cuda(local_rank);
    match &device {
        Ok(chosen) => {
            println!("device: {chosen}");
            if let Ok((free, total)) = cuda::memory_info() {
                let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
                println!("memory: {:.1} GiB free of {:.1} GiB", gib(free), gib(total));
            }
        }
        Err(e) => println!("device: {e}"),
    }
    match (nccl, device) {
        (Ok(_), Ok(_)) => Ok(()),
        (Err(e), _) => Err(e.to_string()),
        (_, Err(e)) => Err(e),
    }
}

/// The loaded NVIDIA driver's version, and the newest CUDA it supports where the runtime
/// says: `535.104.05 (CUDA 12.2 at most)`.
fn driver_version() -> Option<String> {
    let text = std::fs::read_to_string("/proc/driver/nvidia/version").ok()?;
    let version = driver_version_in(&text)?;
    Some(match cuda::driver_cuda_version() {
        Some(cuda) => format!("{version} (CUDA {cuda} at most)"),
        None => version.to_string(),
    })
}

/// The version in `/proc/driver/nvidia/version`'s first line: the first word of digits and
/// dots (`... x86_64 Kernel Module  535.104.05  Sat Aug 19 ...`; the open module's line,
/// `... Open Kernel Module for x86_64  570.195.03  Release Build ...`, has more words).
fn driver_version_in(text: &str) -> Option<&str> {
    text.lines()
        .next()?
        .split_whitespace()
        .find(|word| word.contains('.') && word.chars().all(|c| c.is_ascii_digit() || c == '.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What launched the rank, CUDA_VISIBLE_DEVICES, local rank, devices CUDA reports,
    /// expected device or the start of the error.
    type Launch<'a> = (&'a str, Option<&'a str>, u64, usize, Result<usize, &'a str>);

    #[test]
    fn the_driver_version_is_read_from_both_kernel_modules_lines() {
        let proprietary = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 \
                           01:15:15 UTC 2023\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n";
        assert_eq!(driver_version_in(proprietary), Some("535.104.05"));
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.195.03  Release \
                    Build  (dvs-builder@U16-I3-B13-4-3)  Thu Sep 25 02:08:14 UTC 2025\n";
        assert_eq!(driver_version_in(open), Some("570.195.03"));
        let arm = "NVRM version: NVIDIA UNIX aarch64 Kernel Module  580.65.06  Sun Jul 27 2025\n";
        assert_eq!(driver_version_in(arm), Some("580.65.06"));
        assert_eq!(driver_version_in(""), None);
    }

    #[test]
    fn the_device_of_each_launch() {
        let table: &[Launch] = &[
            // Slurm --gpus-per-task=1: each task sees its own GPU only.
            ("srun --gpus-per-task=1, task 3", Some("3"), 3, 1, Ok(0)),
            ("srun --gpus-per-task=1, task 0", Some("0"), 0, 1, Ok(0)),
            // Slurm --gres=gpu:4 only: every task of the node sees all four.
            ("srun --gres=gpu:4, task 2", Some("0,1,2,3"), 2, 4, Ok(2)),
            ("srun --gres=gpu:2, local id 1", Some("4,5"), 1, 2, Ok(1)),
            // torchrun: LOCAL_RANK, all GPUs visible.
            ("torchrun LOCAL_RANK=3", None, 3, 8, Ok(3)),
            ("torchrun LOCAL_RANK=0, one GPU", None, 0, 1, Ok(0)),
            ("torchrun LOCAL_RANK=1, one GPU", None, 1, 1, Err("local rank 1 needs a GPU of its own but only 1 GPU(s) are visible")),
            // UUID lists.
            (
                "UUIDs, local rank 1",
                Some("GPU-8f6e1a2b-0000-1111-2222-333344445555,GPU-0b1c2d3e-4444-5555-6666-777788889999"),
                1,
                2,
                Ok(1),
            ),
            ("one MIG slice", Some("MIG-5c3d6a9e-1f2e-4d3c-b4a5-968778695a4b"), 2, 1, Ok(0)),
            // More ranks than GPUs on the node.
            ("4 ranks on 2 GPUs", Some("0,1"), 2, 2, Err("local rank 2 needs a GPU of its own but only 2 GPU(s) are visible (CUDA_VISIBLE_DEVICES=0,1)")),
            ("9 ranks, 8 GPUs", None, 8, 8, Err("local rank 8 needs a GPU of its own but only 8 GPU(s) are visible (CUDA_VISIBLE_DEVICES unset)")),
            // No GPU.
            ("no GPU given", Some(""), 0, 0, Err("no GPU is visible to this rank (CUDA_VISIBLE_DEVICES=)")),
            ("Slurm without GPUs", Some("NoDevFiles"), 0, 0, Err("no GPU is visible to this rank")),
            ("a machine without GPUs", None, 0, 0, Err("CUDA reports no device (CUDA_VISIBLE_DEVICES unset)")),
        ];
        for (launch, cvd, local, count, want) in table {
            let visible = Visible::parse(*cvd);
            let got = choose(&visible, *cvd, *local, *count);
            match (want, &got) {
                (Ok(w), Ok(g)) => assert_eq!(w, g, "{launch}"),
                (Err(w), Err(g)) => assert!(g.starts_with(w), "{launch}: {g}"),
                _ => panic!("{launch}: expected {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn visible_lists_stop_where_cuda_stops() {
        assert_eq!(Visible::parse(None), Visible::All);
        assert_eq!(
            Visible::parse(Some("2, 0,GPU-ab")),
            Visible::List(vec!["2".into(), "0".into(), "GPU-ab".into()])
        );
        assert_eq!(
            Visible::parse(Some("1,x,3")),
            Visible::List(vec!["1".into()])
        );
        assert_eq!(Visible::parse(Some("-1")), Visible::List(vec![]));
    }

    #[test]
    fn without_a_gpu_the_error_names_the_node() {
        if tch::Cuda::is_available() {
            // On a GPU (bench/gpu.sh runs the unit tests there) the first device is taken.
            select_cuda(0).unwrap();
            return;
        }
        let err = select_cuda(0).unwrap_err();
        let host = shardrun_protocol::host::hostname();
        assert!(
            err.starts_with(&format!("node {host}: the job trains on CUDA, but ")),
            "{err}"
        );
    }
}
