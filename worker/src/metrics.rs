//! Honest numbers for each step (torchtitan's metrics): memory as the device sees it, and
//! MFU against the right peak for the GPU model, or none when the model is unknown.
//!
//! Step times (in [`crate::train`]) run from one step's host read to the next, so on a GPU
//! they include every kernel of the step, the optimizer's included, not just the time the
//! host took to queue them.

use crate::shim::CudaMemory;
use shardrun_protocol::config::{DType, ModelConfig};
use tch::Device;

/// Peak resident set size of this process (`VmHWM`), in bytes.
pub fn peak_rss_bytes() -> u64 {
    status_kib("VmHWM:")
}

/// Resident set size of this process now (`VmRSS`), in bytes.
pub fn rss_bytes() -> u64 {
    status_kib("VmRSS:")
}

fn status_kib(field: &str) -> u64 {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map_or(0, |kib| kib * 1024)
}

/// Memory as the job cares about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Memory {
    /// CPU: peak RSS. GPU: peak bytes libtorch's allocator handed to tensors (RSS when the
    /// allocator cannot say, with `peak_reserved` `None`).
    pub peak: u64,
    /// GPU: peak bytes the allocator took from the device (what others cannot have).
    pub peak_reserved: Option<u64>,
    /// GPU: bytes in use on the device now by everyone (context, NCCL, caches, others).
    pub device_used: Option<u64>,
    pub device_total: Option<u64>,
}

impl Memory {
    pub fn of(device: Device) -> Memory {
        let Device::Cuda(index) = device else {
            return Memory {
                peak: peak_rss_bytes(),
                ..Memory::default()
            };
        };
        Memory::of_gpu(
            crate::shim::cuda_memory(index).ok(),
            crate::cuda::memory_info().ok(),
            peak_rss_bytes,
        )
    }

    /// A GPU's figures from what its allocator and the driver answered. Without the
    /// allocator's answer the peak is the process's RSS, and it is labelled so
    /// (`peak_reserved` is `None`), rather than a zero said to be allocated bytes.
    fn of_gpu(
        allocator: Option<CudaMemory>,
        device_memory: Option<(u64, u64)>,
        rss: impl FnOnce() -> u64,
    ) -> Memory {
        Memory {
            peak: allocator.map_or_else(rss, |a| a.peak_allocated),
            peak_reserved: allocator.map(|a| a.peak_reserved),
            device_used: device_memory.map(|(free, total)| total.saturating_sub(free)),
            device_total: device_memory.map(|(_, total)| total),
        }
    }
}

/// Dense peak FLOP/s of a GPU model, from its data sheet: (16-bit tensor cores, plain fp32).
/// fp32 training does not use TF32 (libtorch's default), so its peak is the fp32 one.
/// Matched against the words of the name CUDA and NVML report ("NVIDIA A100-SXM4-80GB":
/// NVIDIA, A100, SXM4, 80GB), most specific first.
const PEAKS: &[(&[&str], f64, f64)] = &[
    (&["GH200"], 989.4e12, 66.9e12),
    (&["H200", "NVL"], 835.5e12, 60.0e12),
    (&["H200"], 989.4e12, 66.9e12),
    (&["H100", "NVL"], 835.5e12, 60.0e12),
    (&["H100", "PCIE"], 756.5e12, 51.2e12),
    // H100 SXM5 ("NVIDIA H100 80GB HBM3").
    (&["H100"], 989.4e12, 66.9e12),
    // A100 SXM4 and PCIe, 40 and 80 GB: the same peaks.
    (&["A100"], 312.0e12, 19.5e12),
    (&["A800"], 312.0e12, 19.5e12),
    (&["L40S"], 362.05e12, 91.6e12),
    (&["L40"], 181.05e12, 90.5e12),
    (&["L4"], 121.0e12, 30.3e12),
    (&["A40"], 149.7e12, 37.4e12),
    (&["A10"], 125.0e12, 31.2e12),
];

/// The peak MFU is measured against, or why there is none.
#[derive(Debug, Clone, PartialEq)]
pub enum PeakFlops {
    /// The CPU: MFU is not reported.
    Cpu,
    Known {
        gpu: String,
        flops: f64,
        /// Where the figure comes from: the data sheet, or `SHARDRUN_PEAK_TFLOPS`.
        source: &'static str,
    },
    Unknown {
        gpu: String,
    },
}

impl PeakFlops {
    /// For training in `dtype` on `device`; `SHARDRUN_PEAK_TFLOPS` overrides the table.
    pub fn of(device: Device, dtype: DType) -> PeakFlops {
        let Device::Cuda(index) = device else {
            return PeakFlops::Cpu;
        };
        let gpu = crate::cuda::device_name(index).unwrap_or_else(|_| "unknown GPU".into());
        let overridden = std::env::var("SHARDRUN_PEAK_TFLOPS")
            .ok()
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|v| v.is_finite() && *v > 0.0);
        match (overridden, peak_for(&gpu, dtype)) {
            (Some(tflops), _) => PeakFlops::Known {
                gpu,
                flops: tflops * 1e12,
                source: "SHARDRUN_PEAK_TFLOPS",
            },
            (None, Some(flops)) => PeakFlops::Known {
                gpu,
                flops,
                source: "the data sheet's dense peak",
            },
            (None, None) => PeakFlops::Unknown { gpu },
        }
    }

    pub fn flops(&self) -> Option<f64> {
        match self {
            PeakFlops::Known { flops, .. } => Some(*flops),
            _ => None,
        }
    }

    /// A line for the log saying what MFU means here (none on the CPU).
    pub fn note(&self) -> Option<String> {
        match self {
            PeakFlops::Cpu => None,
            PeakFlops::Known { gpu, flops, source } => Some(format!(
                "MFU is against {:.1} TFLOPS per {gpu} ({source})",
                flops / 1e12
            )),
            PeakFlops::Unknown { gpu } => Some(format!(
                "MFU is not reported: no peak FLOP/s known for {gpu} (set SHARDRUN_PEAK_TFLOPS \
                 to its dense peak for this dtype)"
            )),
        }
    }
}

/// The data-sheet peak of the GPU named `name` for `dtype`, if known.
pub fn peak_for(name: &str, dtype: DType) -> Option<f64> {
    let upper = name.to_uppercase();
    let words: Vec<&str> = upper
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    let (_, tensor, fp32) = PEAKS
        .iter()
        .find(|(wanted, _, _)| wanted.iter().all(|w| words.contains(w)))?;
    Some(match dtype {
        DType::F32 => *fp32,
        DType::Bf16 | DType::F16 => *tensor,
    })
}

/// Model FLOPs utilisation: achieved model FLOP/s over the device's peak, per rank.
pub fn mfu(model: &ModelConfig, seq_len: u64, tokens_per_s_per_rank: f64, peak_flops: f64) -> f64 {
    model.flops_per_token(seq_len) * tokens_per_s_per_rank / peak_flops
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_without_allocator_figures_reports_its_rss_as_rss() {
        let allocator = CudaMemory {
            allocated: 1,
            peak_allocated: 2,
            reserved: 3,
            peak_reserved: 4,
        };
        let known = Memory::of_gpu(Some(allocator), Some((6, 10)), || 99);
        assert_eq!(
            (known.peak, known.peak_reserved, known.device_used),
            (2, Some(4), Some(4))
        );
        let unknown = Memory::of_gpu(None, None, || 99);
        assert_eq!((unknown.peak, unknown.peak_reserved), (99, None));
    }

    #[test]
    fn peak_rss_is_read_from_proc() {
        let rss = peak_rss_bytes();
        assert!(
            rss > 1 << 20,
            "VmHWM of a running test process is above 1 MiB, got {rss}"
        );
    }

    /// Names as `nvidia-smi --query-gpu=name` prints them on each product.
    #[test]
    fn each_gpu_model_gets_its_own_peak() {
        let table: &[(&str, DType, Option<f64>)] = &[
            ("NVIDIA H100 80GB HBM3", DType::Bf16, Some(989.4e12)),
            ("NVIDIA H100 80GB HBM3", DType::F32, Some(66.9e12)),
            ("NVIDIA H100 PCIe", DType::Bf16, Some(756.5e12)),
            ("NVIDIA H100 NVL", DType::F16, Some(835.5e12)),
            ("NVIDIA H200", DType::Bf16, Some(989.4e12)),
            ("NVIDIA H200 NVL", DType::Bf16, Some(835.5e12)),
            ("NVIDIA GH200 480GB", DType::Bf16, Some(989.4e12)),
            ("NVIDIA A100-SXM4-80GB", DType::Bf16, Some(312e12)),
            ("NVIDIA A100-SXM4-40GB", DType::F32, Some(19.5e12)),
            ("NVIDIA A100-PCIE-40GB", DType::Bf16, Some(312e12)),
            ("NVIDIA A100 80GB PCIe", DType::Bf16, Some(312e12)),
            ("NVIDIA L40S", DType::Bf16, Some(362.05e12)),
            ("NVIDIA L40", DType::Bf16, Some(181.05e12)),
            ("NVIDIA L4", DType::Bf16, Some(121e12)),
            ("NVIDIA A10G", DType::Bf16, None),
            ("NVIDIA A10", DType::Bf16, Some(125e12)),
            ("NVIDIA GeForce RTX 4090", DType::Bf16, None),
            ("Tesla V100-SXM2-32GB", DType::Bf16, None),
        ];
        for (name, dtype, want) in table {
            assert_eq!(peak_for(name, *dtype), *want, "{name} {dtype:?}");
        }
    }

    #[test]
    fn the_cpu_has_no_mfu() {
        let peak = PeakFlops::of(Device::Cpu, DType::Bf16);
        assert_eq!((peak.flops(), peak.note()), (None, None));
    }
}
