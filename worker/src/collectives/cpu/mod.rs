//! CPU backend: ring collectives over TCP between worker processes.
//!
//! Each communicator owns a thread that runs its operations one after another in issue order
//! (so a caller can overlap compute with the next unit's all-gather and wait later). A
//! failure (dead neighbour, timeout, out-of-step peer) is sent as an abort message to both
//! neighbours, which pass it on, and then every socket is closed: every rank of the ring
//! errors out naming the rank that failed, and every later operation returns that error.

mod engine;
mod reduce;
mod ring;
pub mod transport;

pub use transport::Member;

use super::dtype::{check, check_pair};
use super::{subgroup_members, CommError, Communicator, ReduceOp, SingleProcess, Work};
use crate::collectives::CommOptions;
use engine::{Op, OpOutcome, RingEngine};
use std::net::TcpListener;
use std::sync::mpsc;
use std::time::Instant;
use tch::{Device, Tensor};

pub struct CpuCommunicator {
    rank: usize,
    size: usize,
    jobs: mpsc::Sender<Job>,
}

struct Job {
    op: Op,
    done: mpsc::Sender<Result<OpOutcome, CommError>>,
}

impl CpuCommunicator {
    /// Connects the ring: dials the next rank, accepts the previous one on `listener`.
    /// `members` lists every rank's listener address, indexed by rank.
    pub fn connect(
        listener: TcpListener,
        members: Vec<Member>,
        rank: usize,
        options: CommOptions,
    ) -> Result<CpuCommunicator, CommError> {
        let n = members.len();
        if n < 2 || rank >= n {
            return Err(CommError::Invalid(format!(
                "a ring of {n} with rank {rank}"
            )));
        }
        let deadline = Instant::now() + options.timeout;
        let (next, prev) = (&members[(rank + 1) % n], &members[(rank + n - 1) % n]);
        tracing::debug!(
            ranks = n,
            next = next.rank,
            next_addr = next.addr,
            prev = prev.rank,
            "connecting the ring"
        );
        let next = transport::dial(next, members[rank].rank, 0, deadline)?;
        let prev = transport::accept(&listener, prev, members[rank].rank, 0, deadline)?;
        tracing::debug!(ranks = n, "ring connected");
        Self::spawn(RingEngine::new(members, rank, next, prev, options))
    }

    fn spawn(engine: RingEngine) -> Result<CpuCommunicator, CommError> {
        let (rank, size) = (engine.rank(), engine.size());
        let (jobs, queue) = mpsc::channel::<Job>();
        let mut engine = engine;
        let span = tracing::Span::current();
        std::thread::Builder::new()
            .name(format!("collectives-r{rank}"))
            .spawn(move || {
                let _span = span.enter();
                // Ends when the communicator is dropped; dropping the engine closes its sockets.
                while let Ok(job) = queue.recv() {
                    let (collective, bytes) = job.op.describe();
                    let started = tracing::enabled!(tracing::Level::TRACE).then(Instant::now);
                    let result = engine.execute(job.op);
                    if let Some(started) = started {
                        tracing::trace!(
                            collective,
                            bytes,
                            ranks = size,
                            seconds = started.elapsed().as_secs_f64(),
                            ok = result.is_ok(),
                            "collective done"
                        );
                    }
                    let _ = job.done.send(result);
                }
            })
            .map(|_| CpuCommunicator { rank, size, jobs })
            .map_err(|e| CommError::Other(format!("cannot start the collectives thread: {e}")))
    }

    fn submit(&self, op: Op) -> Result<mpsc::Receiver<Result<OpOutcome, CommError>>, CommError> {
        if tracing::enabled!(tracing::Level::TRACE) {
            let (collective, bytes) = op.describe();
            tracing::trace!(collective, bytes, ranks = self.size, "collective issued");
        }
        let (done, result) = mpsc::channel();
        self.jobs
            .send(Job { op, done })
            .map_err(|_| CommError::Other("the collectives thread has stopped".to_string()))?;
        Ok(result)
    }

    fn enqueue(&self, op: Op) -> Result<Work, CommError> {
        let result = self.submit(op)?;
        Ok(Work::new(move || {
            result
                .recv()
                .map_err(|_| {
                    CommError::Other("the collectives thread stopped during an operation".into())
                })?
                .map(|_| ())
        }))
    }
}

/// Input and output of an all-gather or reduce-scatter either coincide where the op allows
/// it (the own segment, as NCCL's in-place variants) or do not overlap at all.
fn check_overlap(small: &Tensor, big: &Tensor, rank: usize) -> Result<(), CommError> {
    let bytes = |t: &Tensor| t.numel() * t.kind().elt_size_in_bytes();
    let (s, b) = (small.data_ptr() as usize, big.data_ptr() as usize);
    let (s_len, b_len) = (bytes(small), bytes(big));
    let disjoint = s + s_len <= b || b + b_len <= s || s_len == 0;
    if disjoint || s == b + rank * s_len {
        Ok(())
    } else {
        Err(CommError::Invalid(
            "input and output overlap: they must be disjoint, or the smaller one must be this \
             rank's segment of the larger (in place)"
                .to_string(),
        ))
    }
}

impl Communicator for CpuCommunicator {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.size
    }

    fn all_gather(&self, input: &Tensor, output: &Tensor) -> Result<Work, CommError> {
        check_pair(input, output, self.size, true, Some(Device::Cpu))?;
        check_overlap(input, output, self.rank)?;
        self.enqueue(Op::AllGather {
            input: input.shallow_clone(),
            output: output.shallow_clone(),
        })
    }

    fn reduce_scatter(
        &self,
        input: &Tensor,
        output: &Tensor,
        op: ReduceOp,
    ) -> Result<Work, CommError> {
        check_pair(input, output, self.size, false, Some(Device::Cpu))?;
        check_overlap(output, input, self.rank)?;
        self.enqueue(Op::ReduceScatter {
            input: input.shallow_clone(),
            output: output.shallow_clone(),
            op,
        })
    }

    fn all_reduce(&self, tensor: &Tensor, op: ReduceOp) -> Result<Work, CommError> {
        check(tensor, "tensor", Some(Device::Cpu))?;
        self.enqueue(Op::AllReduce {
            tensor: tensor.shallow_clone(),
            op,
        })
    }

    fn broadcast(&self, tensor: &Tensor, root: usize) -> Result<Work, CommError> {
        check(tensor, "tensor", Some(Device::Cpu))?;
        if root >= self.size {
            return Err(CommError::Invalid(format!(
                "broadcast root {root} in a world of {}",
                self.size
            )));
        }
        self.enqueue(Op::Broadcast {
            tensor: tensor.shallow_clone(),
            root,
        })
    }

    fn barrier(&self) -> Result<(), CommError> {
        self.enqueue(Op::Barrier)?.wait()
    }

    fn new_subgroup(&self, ranks: &[usize]) -> Result<Box<dyn Communicator>, CommError> {
        let (members, _) = subgroup_members(self.rank, self.size, ranks)?;
        let result = self.submit(Op::Subgroup { members })?;
        let outcome = result
            .recv()
            .map_err(|_| CommError::Other("the collectives thread stopped".to_string()))??;
        match outcome {
            OpOutcome::Subgroup(Some(engine)) => Ok(Box::new(Self::spawn(*engine)?)),
            OpOutcome::Subgroup(None) => Ok(Box::new(SingleProcess)),
            OpOutcome::Done => Err(CommError::Other("internal error: no subgroup built".into())),
        }
    }

    /// Nothing to flush: a collective completes only once all its bytes were sent and
    /// received, and the ring's sockets close when it is dropped.
    fn finish(&self) -> Result<(), CommError> {
        Ok(())
    }
}
