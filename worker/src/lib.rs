//! `shardrun-worker`: one process per rank of an FSDP (ZeRO-3) training job.
//!
//! * [`launch`]: who am I (rank, world, local rank) from the controller, Slurm or torchrun env.
//! * [`report`]: where log lines and metrics go ([`report::Reporter`]).
//! * [`collectives`]: all-gather / reduce-scatter / all-reduce / broadcast over NCCL or CPU sockets.

pub mod collectives;
pub mod launch;
pub mod report;
pub mod controller_client;
