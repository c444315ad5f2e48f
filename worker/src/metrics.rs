//! Honest numbers for each step: throughput, MFU on GPU, memory (torchtitan's metrics).

use shardrun_protocol::config::ModelConfig;
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

/// Peak memory as the job cares about it: device memory on GPU, RSS on CPU.
pub fn peak_memory_bytes(device: Device) -> u64 {
    match device {
        Device::Cuda(index) => crate::fsdp::shim::cuda_peak_allocated(index).unwrap_or(0),
        _ => peak_rss_bytes(),
    }
}

/// Peak dense FLOP/s of the GPU for `bf16` (or fp32) work, from its name
/// (`nvidia-smi`), overridable with `SHARDRUN_PEAK_TFLOPS`. `None` when unknown.
pub fn gpu_peak_flops(low_precision: bool) -> Option<f64> {
    if let Some(tflops) = std::env::var("SHARDRUN_PEAK_TFLOPS")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
    {
        return Some(tflops * 1e12);
    }
    let output = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=name", "--format=csv,noheader"])
        .output()
        .ok()?;
    let name = String::from_utf8_lossy(&output.stdout).to_uppercase();
    // Dense tensor-core bf16 and plain fp32 peaks from the vendor data sheets (SXM parts).
    let (bf16, fp32) = if name.contains("H200") || name.contains("H100") {
        (989.4e12, 66.9e12)
    } else if name.contains("A100") {
        (312e12, 19.5e12)
    } else {
        return None;
    };
    Some(if low_precision { bf16 } else { fp32 })
}

/// Model FLOPs utilisation: achieved model FLOP/s over the device's peak, per rank.
pub fn mfu(model: &ModelConfig, seq_len: u64, tokens_per_s_per_rank: f64, peak_flops: f64) -> f64 {
    model.flops_per_token(seq_len) * tokens_per_s_per_rank / peak_flops
}

#[cfg(test)]
mod tests {
    #[test]
    fn peak_rss_is_read_from_proc() {
        let rss = super::peak_rss_bytes();
        assert!(
            rss > 1 << 20,
            "VmHWM of a running test process is above 1 MiB, got {rss}"
        );
    }
}
