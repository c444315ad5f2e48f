//! Link flags so `shardrun-worker` runs without `LD_LIBRARY_PATH` and sees CUDA:
//! * rpath to libtorch's `lib/` (torch-sys exports it as `DEP_TCH_LIBTORCH_LIB`);
//! * `--no-as-needed -ltorch`, otherwise the linker drops `libtorch_cuda.so` (nothing
//!   references it by symbol) and `Cuda::is_available()` is false on GPU machines.
//!
//! Also compiles `shim/storage_shim.cpp` (storage free/re-allocate and seeded unit backward,
//! which tch does not expose) against the same libtorch headers.

use std::path::PathBuf;

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
