//! Link flags so `shardrun-worker` runs without `LD_LIBRARY_PATH` and sees CUDA:
//! * rpath to libtorch's `lib/` (torch-sys exports it as `DEP_TCH_LIBTORCH_LIB`);
//! * `--no-as-needed -ltorch`, otherwise the linker drops `libtorch_cuda.so` (nothing
//!   references it by symbol) and `Cuda::is_available()` is false on GPU machines.

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    if let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg=-L{lib}");
        println!("cargo:rustc-link-arg=-ltorch");
        println!("cargo:rustc-link-arg=-Wl,--as-needed");
    }
}
