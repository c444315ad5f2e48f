//! Control plane and data plane, two ranks on two threads over real sockets: control values
//! travel on the control communicator (the CPU ring every job has); the data communicator
//! (NCCL on GPUs) refuses anything the FSDP engine did not send, on every backend. Checkpoint
//! restore once broadcast its choice of checkpoint as a CPU tensor over the data world, which
//! NCCL rejects: every multi-GPU job with checkpoints failed before step 1, and CPU tests
//! could not see it.

mod common;

use common::*;
use shardrun_protocol::config::ShardingStrategy;
use shardrun_worker::collectives::{CommError, Comms, Communicator, ReduceOp, Work};
use shardrun_worker::control;
use shardrun_worker::fsdp::ProcessGroups;
use tch::Tensor;

/// What checkpoint restore used to do: rank 0's choice (a code and a step) broadcast as a CPU
/// f32 tensor over the given communicator.
fn broadcast_choice_over(comm: &dyn Communicator, step: u64) -> Result<u64, CommError> {
    let message = Tensor::from_slice(&[1.0f32, step as f32]);
    if comm.world_size() > 1 {
        comm.broadcast(&message, 0)?.wait()?;
    }
    Ok(Vec::<f32>::try_from(&message).expect("two floats")[1] as u64)
}

#[test]
fn a_control_value_on_the_data_communicator_is_refused_on_every_rank() {
    tch::set_num_threads(1);
    let outcomes = ranks_in_threads(2, |rank, comms| {
        let groups = ProcessGroups::for_strategy(comms, ShardingStrategy::FullShard, None).unwrap();
        let mine = if rank == 0 { 41 } else { 0 };
        // FULL_SHARD's shard group is the data world.
        let on_data = broadcast_choice_over(groups.shard.as_ref(), mine);
        let on_control = broadcast_choice_over(groups.control.as_ref(), mine);
        let agreed = control::broadcast(groups.control.as_ref(), &[mine as f64 + 1.0], 0);
        let barrier = groups.shard.barrier();
        (on_data, on_control, agreed, barrier)
    });
    for (rank, (on_data, on_control, agreed, barrier)) in outcomes.into_iter().enumerate() {
        let err = on_data.expect_err("the data communicator must refuse a control value");
        assert!(
            err.to_string().contains("ProcessGroups::control"),
            "rank {rank}: {err}"
        );
        assert!(barrier.is_err(), "rank {rank}: a barrier on the data plane");
        assert_eq!(on_control.unwrap(), 41, "rank {rank}");
        assert_eq!(agreed.unwrap(), vec![42.0], "rank {rank}");
    }
}

#[test]
fn hybrid_groups_have_a_control_shard_group_beside_the_data_groups() {
    tch::set_num_threads(1);
    let sizes = ranks_in_threads(4, |_, comms| {
        let groups =
            ProcessGroups::for_strategy(comms, ShardingStrategy::HybridShard, Some(2)).unwrap();
        // Full-format checkpoints gather CPU shards over the control shard group.
        let rank = groups.control_shard.rank();
        let full = Tensor::zeros([4], (tch::Kind::Float, tch::Device::Cpu));
        groups
            .control_shard
            .all_gather(&Tensor::from_slice(&[rank as f32, 10.0]), &full)
            .unwrap()
            .wait()
            .unwrap();
        groups.leave_together().unwrap();
        (
            groups.shard.world_size(),
            groups.replicate.world_size(),
            Vec::<f32>::try_from(&full).unwrap(),
        )
    });
    for (shard, replicate, gathered) in sizes {
        assert_eq!((shard, replicate), (2, 2));
        assert_eq!(gathered, vec![0.0, 10.0, 1.0, 10.0]);
    }
}

/// The data world as the process groups see it, counting its clean ends. The groups only
/// split it and end it: a tensor sent over it (rather than over a group) fails the test.
struct CountsFinish {
    inner: Box<dyn Communicator>,
    finished: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

fn not_over_the_world() -> Result<Work, CommError> {
    unreachable!("the process groups send no tensor over the data world itself")
}

impl Communicator for CountsFinish {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }
    fn all_gather(&self, _: &Tensor, _: &Tensor) -> Result<Work, CommError> {
        not_over_the_world()
    }
    fn reduce_scatter(&self, _: &Tensor, _: &Tensor, _: ReduceOp) -> Result<Work, CommError> {
        not_over_the_world()
    }
    fn all_reduce(&self, _: &Tensor, _: ReduceOp) -> Result<Work, CommError> {
        not_over_the_world()
    }
    fn broadcast(&self, _: &Tensor, _: usize) -> Result<Work, CommError> {
        not_over_the_world()
    }
    fn barrier(&self) -> Result<(), CommError> {
        not_over_the_world().map(|_| ())
    }
    /// The groups split from it are the inner communicator's: their ends are not counted.
    fn new_subgroup(&self, ranks: &[usize]) -> Result<Box<dyn Communicator>, CommError> {
        self.inner.new_subgroup(ranks)
    }
    fn finish(&self) -> Result<(), CommError> {
        self.finished
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.finish()
    }
}

#[test]
fn the_data_world_ends_cleanly_once_and_hybrid_shard_ends_it_as_soon_as_it_is_split() {
    tch::set_num_threads(1);
    for (strategy, at_split) in [
        (ShardingStrategy::FullShard, 0),
        (ShardingStrategy::NoShard, 0),
        (ShardingStrategy::HybridShard, 1),
    ] {
        let counts = ranks_in_threads(4, |_, comms| {
            let finished = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let comms = Comms {
                control: comms.control,
                data: Box::new(CountsFinish {
                    inner: comms.data,
                    finished: finished.clone(),
                }),
            };
            let groups = ProcessGroups::for_strategy(comms, strategy, Some(2)).unwrap();
            let split = finished.load(std::sync::atomic::Ordering::SeqCst);
            groups.leave_together().unwrap();
            (split, finished.load(std::sync::atomic::Ordering::SeqCst))
        });
        // Its NCCL buffers would otherwise sit idle all job long beside the two groups'.
        assert_eq!(counts, vec![(at_split, 1); 4], "{strategy:?}");
    }
}
