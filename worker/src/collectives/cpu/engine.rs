//! The state a CPU communicator's thread owns: the two ring links, reusable scratch memory,
//! the op sequence number and the sticky failure. Turns each operation into ring plans.

use super::ring::{self, Plan, RingFailure, Span};
use super::transport::{self, header, Link, Member, TAG_ABORT};
use crate::collectives::dtype::Dtype;
use crate::collectives::{CommError, CommOptions, ReduceOp};
use std::time::{Duration, Instant};
use tch::Tensor;

/// Op kinds in frame headers.
const KIND_ALL_GATHER: u32 = 1;
const KIND_REDUCE_SCATTER: u32 = 2;
const KIND_ALL_REDUCE_RS: u32 = 3;
const KIND_ALL_REDUCE_AG: u32 = 4;
const KIND_BROADCAST: u32 = 5;
const KIND_BARRIER: u32 = 6;
const KIND_EXCHANGE: u32 = 7;

/// How long a failing rank spends telling its neighbours before closing.
const ABORT_GRACE: Duration = Duration::from_secs(2);

pub enum Op {
    AllGather {
        input: Tensor,
        output: Tensor,
    },
    ReduceScatter {
        input: Tensor,
        output: Tensor,
        op: ReduceOp,
    },
    AllReduce {
        tensor: Tensor,
        op: ReduceOp,
    },
    Broadcast {
        tensor: Tensor,
        root: usize,
    },
    Barrier,
    /// Parent ranks of the caller's group, sorted.
    Subgroup {
        members: Vec<usize>,
    },
}

impl Op {
    /// The operation's name and the bytes of its (largest) tensor, for diagnostics.
    pub fn describe(&self) -> (&'static str, usize) {
        let bytes = |t: &Tensor| t.numel() * t.kind().elt_size_in_bytes();
        match self {
            Op::AllGather { output, .. } => ("all-gather", bytes(output)),
            Op::ReduceScatter { input, .. } => ("reduce-scatter", bytes(input)),
            Op::AllReduce { tensor, .. } => ("all-reduce", bytes(tensor)),
            Op::Broadcast { tensor, .. } => ("broadcast", bytes(tensor)),
            Op::Barrier => ("barrier", 0),
            Op::Subgroup { .. } => ("new-subgroup", 0),
        }
    }
}

pub enum OpOutcome {
    Done,
    /// The group's engine; `None` for a group of one.
    Subgroup(Option<Box<RingEngine>>),
}

pub struct RingEngine {
    /// Every rank of this communicator (rank in the job and listener address).
    members: Vec<Member>,
    rank: usize,
    next: Link,
    prev: Link,
    options: CommOptions,
    /// Reduce-scatter slots, as u64 so f32/f16/bf16 views are aligned.
    scratch: Vec<u64>,
    seq: u32,
    failed: Option<CommError>,
    subgroups_made: u64,
}

fn span_of(t: &Tensor) -> Span {
    Span {
        ptr: t.data_ptr().cast::<u8>(),
        len: t.numel() * t.kind().elt_size_in_bytes(),
    }
}

fn span_of_bytes(b: &mut [u8]) -> Span {
    Span {
        ptr: b.as_mut_ptr(),
        len: b.len(),
    }
}

impl RingEngine {
    pub fn new(
        members: Vec<Member>,
        rank: usize,
        next: Link,
        prev: Link,
        options: CommOptions,
    ) -> RingEngine {
        RingEngine {
            members,
            rank,
            next,
            prev,
            options,
            scratch: vec![],
            seq: 0,
            failed: None,
            subgroups_made: 0,
        }
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn size(&self) -> usize {
        self.members.len()
    }

    pub fn execute(&mut self, op: Op) -> Result<OpOutcome, CommError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let n = self.size();
        match op {
            Op::AllGather { input, output } => {
                let dtype = Dtype::of(&input, "input")?;
                let out = span_of(&output);
                let seg = input.numel() * dtype.size();
                let own = out.at(self.rank * seg, seg);
                let inp = span_of(&input);
                if inp.ptr != own.ptr {
                    // SAFETY: both spans are live tensors of `seg` bytes that do not overlap
                    // (checked when the op was issued).
                    unsafe { std::ptr::copy_nonoverlapping(inp.ptr, own.ptr, seg) };
                }
                let segs: Vec<Span> = (0..n).map(|r| out.at(r * seg, seg)).collect();
                self.run(&ring::all_gather(&segs, self.rank, dtype), KIND_ALL_GATHER)?;
            }
            Op::ReduceScatter { input, output, op } => {
                let dtype = Dtype::of(&input, "input")?;
                let (inp, out) = (span_of(&input), span_of(&output));
                let segs: Vec<Span> = (0..n).map(|r| inp.at(r * out.len, out.len)).collect();
                let in_place = out.ptr == segs[self.rank].ptr;
                let scratch = self.scratch(out.len);
                let plan =
                    ring::reduce_scatter(&segs, out, in_place, scratch, self.rank, dtype, op);
                self.run(&plan, KIND_REDUCE_SCATTER)?;
            }
            Op::AllReduce { tensor, op } => {
                let dtype = Dtype::of(&tensor, "tensor")?;
                let data = span_of(&tensor);
                // Segments as even as elements allow: sizes may differ by one element.
                let (base, extra) = (tensor.numel() / n, tensor.numel() % n);
                let mut segs = Vec::with_capacity(n);
                let mut offset = 0;
                for r in 0..n {
                    let len = (base + usize::from(r < extra)) * dtype.size();
                    segs.push(data.at(offset, len));
                    offset += len;
                }
                let own = segs[self.rank];
                let scratch = self.scratch((base + usize::from(extra > 0)) * dtype.size());
                let plan = ring::reduce_scatter(&segs, own, true, scratch, self.rank, dtype, op);
                self.run(&plan, KIND_ALL_REDUCE_RS)?;
                self.run(
                    &ring::all_gather(&segs, self.rank, dtype),
                    KIND_ALL_REDUCE_AG,
                )?;
            }
            Op::Broadcast { tensor, root } => {
                let dtype = Dtype::of(&tensor, "tensor")?;
                self.run(
                    &ring::broadcast(span_of(&tensor), self.rank, root, n, dtype),
                    KIND_BROADCAST,
                )?;
            }
            Op::Barrier => {
                // Having received a byte from every rank means every rank has arrived.
                let mut bytes = vec![1u8; n];
                let data = span_of_bytes(&mut bytes);
                let segs: Vec<Span> = (0..n).map(|r| data.at(r, 1)).collect();
                self.run(
                    &ring::all_gather(&segs, self.rank, Dtype::F32),
                    KIND_BARRIER,
                )?;
            }
            Op::Subgroup { members } => return self.subgroup(&members).map(OpOutcome::Subgroup),
        }
        Ok(OpOutcome::Done)
    }

    /// Two slots of `slot_bytes`, reused across ops.
    fn scratch(&mut self, slot_bytes: usize) -> Span {
        let words = (2 * slot_bytes).div_ceil(8);
        if self.scratch.len() < words {
            self.scratch.resize(words, 0);
        }
        Span {
            ptr: self.scratch.as_mut_ptr().cast::<u8>(),
            len: words * 8,
        }
    }

    fn run(&mut self, plan: &Plan, kind: u32) -> Result<(), CommError> {
        self.seq = self.seq.wrapping_add(1);
        let result = ring::run(
            &mut self.next,
            &mut self.prev,
            plan,
            self.seq,
            kind,
            self.options.timeout,
        );
        result.map_err(|failure| self.fail(failure))
    }

    /// Tells both neighbours why this rank gives up, then closes the ring for good.
    fn fail(&mut self, failure: RingFailure) -> CommError {
        let RingFailure {
            error,
            unfinished_frame,
        } = failure;
        let payload = transport::encode_abort(&error);
        let mut abort = header(TAG_ABORT, self.seq, 0, payload.len() as u32).to_vec();
        abort.extend_from_slice(&payload);
        let deadline = Instant::now() + ABORT_GRACE;
        // Finish the frame in flight so the abort starts on a frame boundary.
        let mut forward = unfinished_frame;
        forward.extend_from_slice(&abort);
        transport::write_all_until(&mut self.next, &forward, deadline);
        // Backwards, the previous rank only ever reads aborts from us.
        transport::write_all_until(&mut self.prev, &abort, deadline);
        transport::close(&self.next);
        transport::close(&self.prev);
        self.failed = Some(error.clone());
        error
    }

    /// Gathers a variable-length byte string from every rank (indexed by rank).
    fn exchange(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>, CommError> {
        let n = self.size();
        let mut lengths = vec![0u8; 8 * n];
        lengths[8 * self.rank..8 * self.rank + 8]
            .copy_from_slice(&(mine.len() as u64).to_le_bytes());
        let data = span_of_bytes(&mut lengths);
        let segs: Vec<Span> = (0..n).map(|r| data.at(8 * r, 8)).collect();
        self.run(
            &ring::all_gather(&segs, self.rank, Dtype::F32),
            KIND_EXCHANGE,
        )?;
        let lens: Vec<usize> = lengths
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as usize)
            .collect();
        let width = lens.iter().copied().max().unwrap_or(0);
        if width > 1 << 20 {
            return Err(CommError::Other(format!(
                "a peer announced a {width}-byte exchange"
            )));
        }
        let mut all = vec![0u8; width * n];
        all[width * self.rank..width * self.rank + mine.len()].copy_from_slice(mine);
        let data = span_of_bytes(&mut all);
        let segs: Vec<Span> = (0..n).map(|r| data.at(width * r, width)).collect();
        self.run(
            &ring::all_gather(&segs, self.rank, Dtype::F32),
            KIND_EXCHANGE,
        )?;
        Ok((0..n)
            .map(|r| all[width * r..width * r + lens[r]].to_vec())
            .collect())
    }

    /// Builds the ring of the caller's group (`group`: parent ranks, sorted, containing us).
    fn subgroup(&mut self, group: &[usize]) -> Result<Option<Box<RingEngine>>, CommError> {
        let me = &self.members[self.rank];
        let host = me
            .addr
            .rsplit_once(':')
            .map_or(me.addr.as_str(), |(h, _)| h);
        // Listen like the world's listener did (loopback, or every interface).
        let (listener, addr) = if group.len() > 1 {
            let (l, a) = transport::bind(transport::listen_host(host))?;
            (Some(l), a)
        } else {
            (None, String::new())
        };
        let group_text = group
            .iter()
            .map(|r| r.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let all = self.exchange(format!("{group_text}|{addr}").as_bytes())?;
        let mut group_addrs = Vec::with_capacity(group.len());
        for &r in group {
            let text = String::from_utf8_lossy(&all[r]);
            let (their_group, their_addr) = text.split_once('|').unwrap_or(("", ""));
            if their_group != group_text {
                return Err(CommError::Invalid(format!(
                    "rank {} asked for subgroup [{group_text}] but member rank {} asked for \
                     [{their_group}]: every member must pass the same group",
                    self.members[self.rank].rank, self.members[r].rank
                )));
            }
            group_addrs.push(Member {
                rank: self.members[r].rank,
                addr: their_addr.to_string(),
            });
        }
        let Some(listener) = listener else {
            return Ok(None);
        };
        self.subgroups_made += 1;
        // Distinct per group and per call, so a stray connection cannot join the wrong ring.
        let comm_id = (self.subgroups_made << 32) | (group[0] as u64 + 1);
        let g = group.len();
        let mine = group.iter().position(|&r| r == self.rank).unwrap_or(0);
        let deadline = Instant::now() + self.options.timeout;
        let me_job = self.members[self.rank].rank;
        let next = transport::dial(&group_addrs[(mine + 1) % g], me_job, comm_id, deadline)?;
        let prev = transport::accept(
            &listener,
            &group_addrs[(mine + g - 1) % g],
            me_job,
            comm_id,
            deadline,
        )?;
        Ok(Some(Box::new(RingEngine::new(
            group_addrs,
            mine,
            next,
            prev,
            self.options.clone(),
        ))))
    }
}
