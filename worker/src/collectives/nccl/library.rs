//! Loading NCCL: the library libtorch uses, wherever it is installed.
//!
//! cudarc opens NCCL by the names `libnccl.so`, `libnccl.so.13`, ... `libnccl.so.1`, never
//! `libnccl.so.2`, the only name pip installs (`<site-packages>/nvidia/nccl/lib/`). The build
//! puts a folder with a `libnccl.so` link to the NCCL beside its libtorch on the binaries'
//! rpath (`worker/build.rs`; searched before `LD_LIBRARY_PATH`), so a worker built by
//! `scripts/setup.sh` loads libtorch's own NCCL whatever the environment (the loader sees the
//! file `libtorch_cuda.so` already loaded and returns that library). A binary run against
//! another libtorch finds a `libnccl.so` on `LD_LIBRARY_PATH`; when nothing is found, the
//! error names every place looked at and the commands that fix it.

use super::super::CommError;
use cudarc::nccl::sys;
use std::ffi::c_int;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The link folder the build put on the rpath (empty when its libtorch had no NCCL).
const BUILD_LINK_DIR: &str = env!("SHARDRUN_NCCL_LINK_DIR");

/// The oldest NCCL with everything used here (`ncclCommSplit` with `splitShare`,
/// non-blocking communicators, `ncclCommFinalize`).
const OLDEST: (u32, u32) = (2, 18);

/// The NCCL this process uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nccl {
    pub version: (u32, u32, u32),
    /// The file the library was loaded from.
    pub path: PathBuf,
    /// Set when libtorch mapped a different NCCL file than the one loaded here (two copies
    /// of NCCL in one process: harmless for shardrun's collectives, worth knowing).
    pub torch_uses: Option<PathBuf>,
}

impl std::fmt::Display for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (a, b, c) = self.version;
        write!(f, "NCCL {a}.{b}.{c} from {}", self.path.display())?;
        if let Some(other) = &self.torch_uses {
            write!(f, " (libtorch loaded {})", other.display())?;
        }
        Ok(())
    }
}

/// Loads NCCL once per process (the answer, success or the search report, is kept).
pub fn load() -> Result<&'static Nccl, CommError> {
    static LOADED: OnceLock<Result<Nccl, String>> = OnceLock::new();
    LOADED
        .get_or_init(try_load)
        .as_ref()
        .map_err(|e| CommError::Nccl(e.clone()))
}

fn try_load() -> Result<Nccl, String> {
    // SAFETY: only dlopens candidate names; `culib` below would panic where this is false.
    if !unsafe { sys::is_culib_present() } {
        return Err(not_found());
    }
    // SAFETY: the library is present (checked above); cudarc keeps it open for the process.
    let library = unsafe { sys::culib() };
    type GetVersion = unsafe extern "C" fn(*mut c_int) -> sys::ncclResult_t;
    // SAFETY: ncclGetVersion has this signature in every NCCL 2.x.
    let get_version = unsafe { library.get::<GetVersion>(b"ncclGetVersion\0") }
        .map_err(|e| format!("the NCCL library has no ncclGetVersion ({e})"))?;
    let get_version: GetVersion = *get_version;
    let mut code = 0;
    // SAFETY: a valid out-pointer.
    let status = unsafe { get_version(&mut code) };
    if status != sys::ncclResult_t::ncclSuccess {
        return Err(format!("ncclGetVersion failed: {status:?}"));
    }
    // NCCL_VERSION(X, Y, Z) = X·10000 + Y·100 + Z since 2.9.
    let code = code.max(0) as u32;
    let version = (code / 10000, code / 100 % 100, code % 100);
    let path = crate::cuda::file_of_symbol(get_version as usize)
        .unwrap_or_else(|| PathBuf::from("libnccl.so (path unknown)"));
    if (version.0, version.1) < OLDEST {
        return Err(format!(
            "{} is NCCL {}.{}.{}; shardrun needs NCCL {}.{} or newer (torch's wheels ship it as \
             nvidia-nccl-cu12/cu13)",
            path.display(),
            version.0,
            version.1,
            version.2,
            OLDEST.0,
            OLDEST.1
        ));
    }
    let torch_uses = mapped_nccl().filter(|torch| !same_file(torch, &path));
    Ok(Nccl {
        version,
        path,
        torch_uses,
    })
}

fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => a == b,
    }
}

/// Files mapped into this process whose name starts with `prefix`.
pub fn mapped(prefix: &str) -> Vec<PathBuf> {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| {
            Path::new(p)
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
        })
        .map(PathBuf::from)
        .collect();
    found.dedup();
    found
}

/// The NCCL libtorch loaded at start-up (`libtorch_cuda.so` needs `libnccl.so.2`).
pub fn mapped_nccl() -> Option<PathBuf> {
    mapped("libnccl.so").into_iter().next()
}

/// Where pip puts NCCL relative to the libtorch this process loaded:
/// `<site-packages>/torch/lib/libtorch_cpu.so` -> `<site-packages>/nvidia/nccl/lib/libnccl.so.2`.
pub fn pip_nccl() -> Option<PathBuf> {
    let torch_lib = mapped("libtorch_cpu.so")
        .into_iter()
        .next()?
        .parent()?
        .to_path_buf();
    let candidate = torch_lib.join("../../nvidia/nccl/lib/libnccl.so.2");
    candidate
        .exists()
        .then(|| candidate.canonicalize().unwrap_or(candidate))
}

/// The search report: names tried, folders searched, libtorch's NCCL, and the fix.
fn not_found() -> String {
    let names = cudarc::get_lib_name_candidates("nccl");
    let mut text = format!(
        "cannot load NCCL. Tried the names {} in:",
        names
            .iter()
            .filter(|n| n.starts_with("libnccl.so"))
            .cloned()
            .collect::<Vec<_>>()
            .join(", ")
    );
    if BUILD_LINK_DIR.is_empty() {
        text.push_str(
            "\n  - no link folder: this worker was built against a libtorch without NCCL beside it",
        );
    } else {
        let link = Path::new(BUILD_LINK_DIR).join("libnccl.so");
        let state = match std::fs::metadata(&link) {
            Ok(_) => "present".to_string(),
            Err(_) => format!(
                "missing or dangling (its target was {})",
                std::fs::read_link(&link)
                    .map(|t| t.display().to_string())
                    .unwrap_or_else(|_| "unknown".into())
            ),
        };
        text.push_str(&format!(
            "\n  - the build's link folder {BUILD_LINK_DIR} (on the rpath): {state}"
        ));
    }
    match std::env::var("LD_LIBRARY_PATH") {
        Ok(dirs) if !dirs.is_empty() => {
            text.push_str(&format!("\n  - LD_LIBRARY_PATH: {dirs}"));
        }
        _ => text.push_str("\n  - LD_LIBRARY_PATH: not set"),
    }
    text.push_str("\n  - the system's library folders (ld.so.cache)");
    let torch_nccl = mapped_nccl().or_else(pip_nccl);
    let dir = "~/.cache/shardrun/nccl";
    match torch_nccl {
        Some(found) => text.push_str(&format!(
            "\nlibtorch's NCCL is {}. Fix: rebuild the worker against this libtorch \
             (scripts/setup.sh), or link it under a name cudarc opens: mkdir -p {dir} && \
             ln -sf {} {dir}/libnccl.so && export LD_LIBRARY_PATH={dir}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}",
            found.display(),
            found.display()
        )),
        None => text.push_str(
            "\nlibtorch loaded no NCCL and there is none in <site-packages>/nvidia/nccl/lib \
             beside it. Fix: install PyTorch's CUDA wheel (it brings nvidia-nccl-cu13) into \
             the venv the worker was built with, or put a libnccl.so on LD_LIBRARY_PATH",
        ),
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_the_nccl_beside_libtorch_without_any_environment() {
        // The venv's torch wheel is a CUDA build: libtorch_cuda.so loaded pip's libnccl.so.2.
        let Some(pip) = pip_nccl() else {
            panic!(
                "no libnccl.so.2 beside the loaded libtorch: install torch's CUDA wheel \
                 (scripts/setup.sh does) to run this test"
            );
        };
        let nccl = load().unwrap_or_else(|e| panic!("{e}"));
        assert!(same_file(&nccl.path, &pip), "{nccl} vs {}", pip.display());
        assert_eq!(nccl.torch_uses, None, "{nccl}");
        assert_eq!((nccl.version.0, nccl.version.1), (2, 28), "{nccl}");
    }

    #[test]
    fn the_search_report_names_places_and_the_fix() {
        let text = not_found();
        assert!(text.contains("libnccl.so.13"), "{text}");
        assert!(text.contains("LD_LIBRARY_PATH"), "{text}");
        assert!(text.contains(BUILD_LINK_DIR), "{text}");
        if let Some(pip) = pip_nccl() {
            assert!(text.contains(&pip.display().to_string()), "{text}");
        }
    }
}
