//! `shardrun-worker`: one process per rank of an FSDP (ZeRO-3) training job.
//!
//! * [`launch`]: who am I (rank, world, local rank) from the controller, Slurm or torchrun env.
//! * [`report`]: where log lines and metrics go ([`report::Reporter`]).
//! * [`rendezvous`]: torchrun-style rendezvous (`MASTER_ADDR`/`MASTER_PORT`) without a controller.
//! * [`collectives`]: all-gather / reduce-scatter / all-reduce / broadcast over NCCL or CPU sockets.
//! * [`model`]: the transformer and the MLP, plain forward code with PyTorch parameter names.
//! * [`fsdp`]: units, flat sharded parameters, gather/free/reduce per strategy.
//! * [`optim`], [`schedule`], [`scaler`]: AdamW, the LR schedule, fp16 loss scaling.
//! * [`data`]: deterministic per-rank batches (documents through `shardrun-data`);
//!   [`evaluate`]: validation loss and perplexity.
//! * [`train`]: the training loop; [`reference`]: unsharded single-process ground truth.
//! * [`controller_client`]: registration, reports and heartbeats through the shardrun controller.
//! * [`world`]: how a rank without a controller joins the world (rendezvous, then collectives).
//! * [`checkpointing`]: saves and restores through the `shardrun-checkpoint` format.
//! * [`metrics`]: memory, throughput, MFU; [`params_file`]: weights dumped as safetensors.

pub mod checkpointing;
pub mod collectives;
pub mod controller_client;
pub mod data;
pub mod evaluate;
pub mod fsdp;
pub mod launch;
pub mod metrics;
pub mod model;
pub mod optim;
pub mod params_file;
pub mod reference;
pub mod rendezvous;
pub mod report;
pub mod scaler;
pub mod schedule;
pub mod train;
pub mod world;
