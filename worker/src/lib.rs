//! `shardrun-worker`: one process per rank of an FSDP (ZeRO-3) training job.
//!
//! * [`launch`]: who am I (rank, world, local rank) from the controller, Slurm or torchrun env.
//! * [`device`]: which GPU is mine (one per local rank); [`cuda`]: the CUDA runtime calls tch
//!   lacks (current device, streams, events, memory).
//! * [`fail_fast`]: on an error or panic, report and exit without collective teardown;
//!   [`fault`]: failures injected on purpose, to see how a job fails.
//! * [`report`]: where log lines and metrics go ([`report::Reporter`]); [`diagnostics`]:
//!   `tracing` events for whoever debugs a job (`RUST_LOG`, `logs/rank-N.debug.log`).
//! * [`rendezvous`]: torchrun-style rendezvous (`MASTER_ADDR`/`MASTER_PORT`) without a controller.
//! * [`collectives`]: all-gather / reduce-scatter / all-reduce / broadcast over NCCL or CPU sockets;
//!   [`control`]: control values agreed over the CPU communicator.
//! * [`model`]: the transformer and the MLP, plain forward code with PyTorch parameter names.
//! * [`fsdp`]: units, flat sharded parameters, gather/free/reduce per strategy.
//! * [`optim`], [`scaler`]: AdamW, fp16 loss scaling (the LR schedule is
//!   [`shardrun_protocol::schedule`], which the orchestrator reads too).
//! * [`data`]: deterministic per-rank batches (documents through `shardrun-data`);
//!   [`evaluate`]: validation loss and perplexity.
//! * [`train`]: the training loop; [`reference`]: unsharded single-process ground truth.
//! * [`controller_client`]: registration, reports and heartbeats through the shardrun controller.
//! * [`stop`]: stop requests (signals, the controller) acted on at step boundaries;
//!   [`progress`]: work done, sent with heartbeats so the controller sees a stuck rank.
//! * [`world`]: how a rank without a controller joins the world (rendezvous, then collectives).
//! * [`checkpointing`]: saves and restores through the `shardrun-checkpoint` format.
//! * [`metrics`]: memory, throughput, MFU; [`params_file`]: weights dumped as safetensors.
//! * [`host`]: the one place device values are read on the host (once per step).
//! * [`shim`]: what tch lacks, in C++ against libtorch (`worker/shim/`): storage freeing, seeded
//!   unit backward, fused AdamW, flash attention over packed documents, page-locking, memory
//!   statistics.

pub mod checkpointing;
pub mod collectives;
pub mod control;
pub mod controller_client;
pub mod cuda;
pub mod data;
pub mod device;
pub mod diagnostics;
pub mod evaluate;
pub mod fail_fast;
pub mod fault;
pub mod fsdp;
pub mod host;
pub mod launch;
pub mod locked_memory;
pub mod metrics;
pub mod model;
pub mod optim;
pub mod params_file;
pub mod progress;
pub mod reference;
pub mod rendezvous;
pub mod report;
pub mod scaler;
pub mod shim;
pub mod stop;
pub mod train;
pub mod world;
