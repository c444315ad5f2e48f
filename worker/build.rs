//! Link flags so `shardrun-worker` runs without `LD_LIBRARY_PATH`, sees CUDA and finds NCCL:
//! * rpath to libtorch's `lib/` (torch-sys exports it as `DEP_TCH_LIBTORCH_LIB`);
//! * `--no-as-needed -ltorch`, otherwise the linker drops `libtorch_cuda.so` (nothing
//!   references it by symbol) and `Cuda::is_available()` is false on GPU machines;
//! * rpath to a folder holding `libnccl.so`, a link to the NCCL this libtorch uses (see
//!   [`nccl_link`]).
//!
//! Also compiles `shim/storage_shim.cpp` (storage free/re-allocate, seeded unit backward,
//! fused AdamW, allocator statistics: what tch does not expose) against the same headers.

use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-changed=shim/storage_shim.cpp");
    let lib = std::env::var("DEP_TCH_LIBTORCH_LIB")
        .expect("torch-sys exports DEP_TCH_LIBTORCH_LIB (set LIBTORCH to the venv's torch/)");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
    println!("cargo:rustc-link-arg=-L{lib}");
    println!("cargo:rustc-link-arg=-ltorch");
    println!("cargo:rustc-link-arg=-Wl,--as-needed");
    if let Some(dir) = nccl_link(Path::new(&lib)) {
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
/// `libnccl.so.2` (next to torch, in `nvidia/nccl/lib/`). A folder in this build's output
/// with a `libnccl.so` link to that file, on the binaries' RUNPATH, lets cudarc's
/// `dlopen("libnccl.so")` find it; the loader sees that the file is the one
/// `libtorch_cuda.so` already loaded and hands back that same library. `None` when this
/// libtorch has no NCCL beside it (a CPU-only build).
fn nccl_link(torch_lib: &Path) -> Option<PathBuf> {
    let candidates = [
        torch_lib.join("../../nvidia/nccl/lib/libnccl.so.2"),
        torch_lib.join("libnccl.so.2"),
    ];
    let real = candidates
        .iter()
        .find(|p| p.is_file())?
        .canonicalize()
        .ok()?;
    println!("cargo:rerun-if-changed={}", real.display());
    let dir = PathBuf::from(std::env::var("OUT_DIR").ok()?).join("nccl");
    std::fs::create_dir_all(&dir).ok()?;
    let link = dir.join("libnccl.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&real, &link).ok()?;
    Some(dir)
}
