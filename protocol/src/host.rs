//! The name other nodes of a job reach this machine by. The controller advertises it, workers
//! register with it and CPU collective listeners advertise it, so all three must read it the
//! same way (the kernel's UTS name: per network/UTS namespace, as `gethostname` gives it).

/// This machine's hostname; `localhost` if the kernel has none.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

#[cfg(test)]
mod tests {
    #[test]
    fn hostname_is_the_kernel_name() {
        let name = super::hostname();
        assert!(!name.is_empty() && !name.contains('\n'), "{name:?}");
        let kernel = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
        assert_eq!(name, kernel.trim());
    }
}
