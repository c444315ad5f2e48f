//! Link flags so `shardrun-worker` runs without `LD_LIBRARY_PATH`, sees CUDA and finds NCCL:
//! * rpath to libtorch's `lib/` (torch-sys exports it as `DEP_TCH_LIBTORCH_LIB`);
//! * `--no-as-needed -ltorch`, otherwise the linker drops `libtorch_cuda.so` (nothing
//!   references it by symbol) and `Cuda::is_available()` is false on GPU machines;
//! * rpath to a folder holding `libnccl.so` and `libcudart.so`, links to the NCCL and the
//!   CUDA runtime this libtorch uses (see [`library_links`]);
//! * `--disable-new-dtags`: the rpath is written as DT_RPATH, which the loader searches
//!   before `LD_LIBRARY_PATH` (DT_RUNPATH comes after it), as libtorch's own libraries do.
//!   On a node where `module load cuda` put a toolkit's `libcudart.so` on `LD_LIBRARY_PATH`,
//!   cudarc would otherwise load that second CUDA runtime beside libtorch's.
//!
//! Also compiles `shim/storage_shim.cpp` (storage free/re-allocate, seeded unit backward,
//! fused AdamW, allocator statistics: what tch does not expose) against the same headers.

use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-changed=shim/storage_shim.cpp");
    let lib = std::env::var("DEP_TCH_LIBTORCH_LIB")
        .expect("torch-sys exports DEP_TCH_LIBTORCH_LIB (set LIBTORCH to the venv's torch/)");
    println!("cargo:rustc-link-arg=-Wl,--disable-new-dtags");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
    println!("cargo:rustc-link-arg=-L{lib}");
    println!("cargo:rustc-link-arg=-ltorch");
    println!("cargo:rustc-link-arg=-Wl,--as-needed");
    if let Some(dir) = library_links(Path::new(&lib)) {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
        println!("cargo:rustc-env=SHARDRUN_NCCL_LINK_DIR={}", dir.display());
    } else {
        println!("cargo:rustc-env=SHARDRUN_NCCL_LINK_DIR=");
    }

    let include = PathBuf::from(&lib)
        .parent()
        .map(|root| root.join("include"))
        .expect("libtorch lib dir has a parent");
    cc::Build::new()
        .cpp(true)
        .file("shim/storage_shim.cpp")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .flag("-std=c++17")
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .define("GLOG_USE_GLOG_EXPORT", None)
        .warnings(false)
        .compile("shardrun_shim");
}

/// cudarc opens NCCL by the names `libnccl.so`, `libnccl.so.13`, ... but pip installs it as
/// `libnccl.so.2` (next to torch, in `nvidia/nccl/lib/`), and it opens the CUDA runtime as
/// `libcudart.so` first, a name pip does not install but a CUDA toolkit does. A folder in
/// this build's output with `libnccl.so` and `libcudart.so` links to libtorch's own files, on
/// the binaries' rpath, makes cudarc's `dlopen` find those; the loader sees that each file is
/// one `libtorch_cuda.so` already loaded and hands back that same library. `None` when this
/// libtorch has no NCCL beside it (a CPU-only build).
fn library_links(torch_lib: &Path) -> Option<PathBuf> {
    let nvidia = torch_lib.join("../../nvidia");
    let nccl = first_file(&[
        nvidia.join("nccl/lib/libnccl.so.2"),
        torch_lib.join("libnccl.so.2"),
    ])?;
    // pip's CUDA 13 wheels put the runtime in `nvidia/cu13/lib`, CUDA 12's in
    // `nvidia/cuda_runtime/lib`.
    let cudart = first_file(&[
        nvidia.join("cu13/lib/libcudart.so.13"),
        nvidia.join("cuda_runtime/lib/libcudart.so.12"),
        torch_lib.join("libcudart.so.13"),
        torch_lib.join("libcudart.so.12"),
    ]);
    let dir = PathBuf::from(std::env::var("OUT_DIR").ok()?).join("nccl");
    std::fs::create_dir_all(&dir).ok()?;
    for (name, real) in [("libnccl.so", Some(nccl)), ("libcudart.so", cudart)] {
        let link = dir.join(name);
        let _ = std::fs::remove_file(&link);
        if let Some(real) = real {
            println!("cargo:rerun-if-changed={}", real.display());
            std::os::unix::fs::symlink(&real, &link).ok()?;
        }
    }
    Some(dir)
}

/// The first of `candidates` that is a file, with links resolved.
fn first_file(candidates: &[PathBuf]) -> Option<PathBuf> {
    candidates.iter().find(|p| p.is_file())?.canonicalize().ok()
}
