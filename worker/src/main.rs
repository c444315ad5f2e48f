//! `shardrun-worker` binary (placeholder until the training loop lands).

fn main() {
    eprintln!("shardrun-worker: the training loop is not available in this build yet");
    std::process::exit(2);
}
