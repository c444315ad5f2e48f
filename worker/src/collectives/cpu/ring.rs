//! Ring algorithms as streams of frames, and the loop that moves them.
//!
//! Every rank sends a stream of frames to the next rank and receives one from the previous
//! rank at the same time (full duplex, one non-blocking loop, no extra thread). A plan says
//! which bytes each frame carries and what the receiver does with it; dependencies let a
//! frame be forwarded as soon as the frame it depends on arrived, so reduction and forwarding
//! overlap the transfer (pipelining at frame granularity):
//! * all-gather: N-1 segments stream around the ring; segment j sent = segment j-1 received.
//! * reduce-scatter: the partial sum of a segment travels N-1 hops; each rank adds its own
//!   part of a frame when it arrives and forwards it; the last hop lands on its owner.
//! * broadcast: the root's frames travel the chain root -> root+1 -> ... -> root-1.
//!
//! Each data frame has a 16-byte header (tag, op sequence number, op kind, length) so a rank
//! that issued a different collective than its neighbour gets an error, not garbage. The last
//! frame of an op is followed by an END header: a receiver completes an op only after it, so a
//! sender that fails mid-frame can pad the frame and send an ABORT instead, never letting a
//! neighbour finish an op on padding.

use super::reduce::reduce;
use super::transport::{
    decode_abort, header, parse_header, poll, read_exact_until, Link, HEADER_BYTES, TAG_ABORT,
    TAG_DATA, TAG_END,
};
use crate::collectives::dtype::Dtype;
use crate::collectives::{CommError, ReduceOp};
use std::io::{self, IoSlice, Read, Write};
use std::time::{Duration, Instant};

/// Bytes per frame: big enough that headers and syscalls cost nothing, small enough that
/// forwarding starts early and the reduce-scatter scratch slots stay cache-friendly.
pub const FRAME_BYTES: usize = 512 << 10;
/// Largest abort message accepted from a neighbour.
const MAX_ABORT_BYTES: u32 = 64 << 10;

/// A byte range of a live buffer (a tensor's storage or the engine's scratch).
#[derive(Debug, Clone, Copy)]
pub struct Span {
    pub ptr: *mut u8,
    pub len: usize,
}

impl Span {
    pub fn at(self, offset: usize, len: usize) -> Span {
        debug_assert!(offset + len <= self.len);
        // SAFETY: in bounds of the same allocation (checked above in debug builds; callers
        // compute offsets from lengths they own).
        Span {
            ptr: unsafe { self.ptr.add(offset) },
            len,
        }
    }

    /// Splits into frames of at most [`FRAME_BYTES`]; always at least one frame, so an empty
    /// op still exchanges headers (and is checked against the neighbour's).
    fn frames(self) -> impl Iterator<Item = Span> {
        let count = self.len.div_ceil(FRAME_BYTES).max(1);
        (0..count).map(move |i| {
            let start = i * FRAME_BYTES;
            self.at(start, (self.len - start).min(FRAME_BYTES))
        })
    }
}

pub struct SendFrame {
    pub span: Span,
    /// Received frames that must be processed before this one can go.
    pub after_recv: usize,
}

pub struct RecvFrame {
    pub span: Span,
    /// Frames that must have been sent before this one may land (its bytes are reused).
    pub after_send: usize,
    pub then: OnRecv,
}

pub enum OnRecv {
    Nothing,
    /// `dst = dst ⊕ src`, then divided.
    Reduce {
        dst: Span,
        src: Span,
        divisor: Option<f32>,
    },
    /// `dst = base ⊕ src`, then divided (`dst` and `base` do not overlap).
    ReduceFrom {
        dst: Span,
        base: Span,
        src: Span,
        divisor: Option<f32>,
    },
}

pub struct Plan {
    pub sends: Vec<SendFrame>,
    pub recvs: Vec<RecvFrame>,
    pub dtype: Dtype,
    pub op: ReduceOp,
}

fn ring_index(i: isize, n: usize) -> usize {
    i.rem_euclid(n as isize) as usize
}

/// All-gather over `segs` (indexed by rank; this rank's own segment already filled).
pub fn all_gather(segs: &[Span], rank: usize, dtype: Dtype) -> Plan {
    let n = segs.len();
    let mut plan = Plan {
        sends: vec![],
        recvs: vec![],
        dtype,
        op: ReduceOp::Sum,
    };
    let mut recv_starts = vec![];
    for j in 0..n - 1 {
        // Segment j sent is the one received as segment j-1 (or our own for j = 0).
        let seg = segs[ring_index(rank as isize - j as isize, n)];
        for (i, span) in seg.frames().enumerate() {
            let after_recv = if j == 0 {
                0
            } else {
                recv_starts[j - 1] + i + 1
            };
            plan.sends.push(SendFrame { span, after_recv });
        }
        recv_starts.push(plan.recvs.len());
        let seg = segs[ring_index(rank as isize - j as isize - 1, n)];
        for span in seg.frames() {
            plan.recvs.push(RecvFrame {
                span,
                after_send: 0,
                then: OnRecv::Nothing,
            });
        }
    }
    plan
}

/// Reduce-scatter of `input` segments (indexed by rank) into `output`, this rank's segment.
/// `output_is_own`: `output` is `input[rank]` itself (in place, e.g. all-reduce); otherwise
/// they do not overlap. `scratch` holds two slots of the largest segment.
pub fn reduce_scatter(
    input: &[Span],
    output: Span,
    output_is_own: bool,
    scratch: Span,
    rank: usize,
    dtype: Dtype,
    op: ReduceOp,
) -> Plan {
    let n = input.len();
    let slot_bytes = input.iter().map(|s| s.len).max().unwrap_or(0);
    debug_assert!(scratch.len >= slot_bytes * 2.min(n - 1));
    let divisor = (op == ReduceOp::Avg).then_some(n as f32);
    let mut plan = Plan {
        sends: vec![],
        recvs: vec![],
        dtype,
        op,
    };
    // Index of the first send frame of each send segment, and of each recv segment.
    let mut send_starts = vec![];
    let mut recv_starts = vec![];
    for j in 0..n - 1 {
        // Send segment j: our own input (j = 0) or the partial sum received as segment j-1,
        // which sits in slot (j-1) % 2 and belongs to the same tensor segment.
        let seg_index = ring_index(rank as isize - 1 - j as isize, n);
        let seg_len = input[seg_index].len;
        send_starts.push(plan.sends.len());
        if j == 0 {
            plan.sends
                .extend(input[seg_index].frames().map(|span| SendFrame {
                    span,
                    after_recv: 0,
                }));
        } else {
            let slot = scratch.at((j - 1) % 2 * slot_bytes, seg_len);
            let first = recv_starts[j - 1];
            plan.sends
                .extend(slot.frames().enumerate().map(|(i, span)| SendFrame {
                    span,
                    after_recv: first + i + 1,
                }));
        }
        // Receive segment j: the partial sum of tensor segment (rank - 2 - j) into slot j % 2.
        let seg_index = ring_index(rank as isize - 2 - j as isize, n);
        let own = input[seg_index];
        let slot = scratch.at(j % 2 * slot_bytes, own.len);
        let last = j == n - 2;
        recv_starts.push(plan.recvs.len());
        let reused_by = (j >= 2).then(|| (send_starts[j - 1], send_starts[j] - send_starts[j - 1]));
        for (i, span) in slot.frames().enumerate() {
            let offset = i * FRAME_BYTES;
            let own_frame = own.at(offset, span.len);
            // The slot held segment j-2, forwarded as send segment j-1: wait for that frame.
            let after_send = reused_by.map_or(0, |(start, count)| start + i.min(count - 1) + 1);
            let then = if !last {
                OnRecv::Reduce {
                    dst: span,
                    src: own_frame,
                    divisor: None,
                }
            } else if output_is_own {
                OnRecv::Reduce {
                    dst: own_frame,
                    src: span,
                    divisor,
                }
            } else {
                let dst = output.at(offset, span.len);
                OnRecv::ReduceFrom {
                    dst,
                    base: own_frame,
                    src: span,
                    divisor,
                }
            };
            plan.recvs.push(RecvFrame {
                span,
                after_send,
                then,
            });
        }
    }
    plan
}

/// Broadcast of `data` from `root` along the chain root -> root+1 -> ...
pub fn broadcast(data: Span, rank: usize, root: usize, n: usize, dtype: Dtype) -> Plan {
    let mut plan = Plan {
        sends: vec![],
        recvs: vec![],
        dtype,
        op: ReduceOp::Sum,
    };
    let receives = rank != root;
    let forwards = (rank + 1) % n != root;
    for (i, span) in data.frames().enumerate() {
        if receives {
            plan.recvs.push(RecvFrame {
                span,
                after_send: 0,
                then: OnRecv::Nothing,
            });
        }
        if forwards {
            plan.sends.push(SendFrame {
                span,
                after_recv: if receives { i + 1 } else { 0 },
            });
        }
    }
    plan
}

/// A failure inside [`run`], with the bytes the sender still owes its frame in flight so
/// the caller can finish it before the abort message.
pub struct RingFailure {
    pub error: CommError,
    pub unfinished_frame: Vec<u8>,
}

/// Moves one plan's frames over the ring. `kind` and `seq` identify the op in headers.
pub fn run(
    next: &mut Link,
    prev: &mut Link,
    plan: &Plan,
    seq: u32,
    kind: u32,
    timeout: Duration,
) -> Result<(), RingFailure> {
    let mut sender = Sender {
        frame: 0,
        offset: 0,
    };
    let mut receiver = Receiver {
        frame: 0,
        offset: 0,
        header: [0; HEADER_BYTES],
        end_seen: false,
    };
    let fail = |error: CommError, sender: &Sender| RingFailure {
        error,
        unfinished_frame: sender.unfinished(plan, seq, kind),
    };
    let mut last_progress = Instant::now();
    loop {
        let send_done = sender.frame == plan.sends.len();
        let recv_done =
            receiver.frame == plan.recvs.len() && (plan.recvs.is_empty() || receiver.end_seen);
        if send_done && recv_done {
            return Ok(());
        }
        let can_send = !send_done && receiver.frame >= plan.sends[sender.frame].after_recv;
        let can_recv = !recv_done
            && (receiver.frame == plan.recvs.len()
                || sender.frame >= plan.recvs[receiver.frame].after_send);
        let mut moved = false;
        if can_send {
            moved |= sender
                .step(next, plan, seq, kind)
                .map_err(|e| fail(e, &sender))?;
        }
        if can_recv {
            moved |= receiver
                .step(prev, plan, seq, kind)
                .map_err(|e| fail(e, &sender))?;
        }
        if moved {
            last_progress = Instant::now();
            continue;
        }
        if !can_send && !can_recv {
            let e = CommError::Other("internal error: ring plan cannot make progress".into());
            return Err(fail(e, &sender));
        }
        let waited = last_progress.elapsed();
        if waited >= timeout {
            let rank = if can_recv {
                prev.peer.rank
            } else {
                next.peer.rank
            };
            return Err(fail(
                CommError::Timeout {
                    rank,
                    secs: timeout.as_secs(),
                },
                &sender,
            ));
        }
        // The next rank never writes to us except to abort, and its socket turns readable on
        // EOF: watching it catches a dead successor even while we only receive. Once all our
        // frames are out it may legitimately finish the op and close, so stop watching then.
        // (fd -1: poll ignores the entry, including hang-ups we are not waiting for.)
        let mut fds = [
            libc::pollfd {
                fd: if send_done { -1 } else { next.fd() },
                events: libc::POLLIN | if can_send { libc::POLLOUT } else { 0 },
                revents: 0,
            },
            libc::pollfd {
                fd: if can_recv { prev.fd() } else { -1 },
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        poll(&mut fds, (timeout - waited).min(Duration::from_secs(1)))
            .map_err(|e| fail(CommError::Other(format!("poll: {e}")), &sender))?;
        if fds[0].revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
            check_reverse(next).map_err(|e| fail(e, &sender))?;
        }
    }
}

/// Reads what the next rank wrote back: only an EOF or an abort can be there.
fn check_reverse(next: &mut Link) -> Result<(), CommError> {
    let mut h = [0u8; HEADER_BYTES];
    match next.stream.read(&mut h[..1]) {
        Ok(0) => Err(next.io_error(&io::ErrorKind::UnexpectedEof.into())),
        Ok(_) => {
            let deadline = Instant::now() + Duration::from_secs(2);
            read_exact_until(next, &mut h[1..], deadline)?;
            let [tag, _, _, len] = parse_header(&h);
            if tag != TAG_ABORT {
                return Err(next.error("wrote on the ring against the protocol"));
            }
            Err(read_abort(next, len)?)
        }
        Err(e)
            if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted =>
        {
            Ok(())
        }
        Err(e) => Err(next.io_error(&e)),
    }
}

fn read_abort(link: &mut Link, len: u32) -> Result<CommError, CommError> {
    if len > MAX_ABORT_BYTES {
        return Err(link.error("sent an oversized abort message"));
    }
    let mut payload = vec![0u8; len as usize];
    read_exact_until(link, &mut payload, Instant::now() + Duration::from_secs(2))?;
    Ok(decode_abort(&payload, link))
}

struct Sender {
    frame: usize,
    /// Bytes of the current frame (header, payload, END trailer if last) already written.
    offset: usize,
}

impl Sender {
    fn frame_bytes(&self, plan: &Plan) -> usize {
        let last = self.frame + 1 == plan.sends.len();
        HEADER_BYTES + plan.sends[self.frame].span.len + if last { HEADER_BYTES } else { 0 }
    }

    /// The rest of a half-written frame: zeros up to the end of the payload (the receiver
    /// never completes an op without the END header, which the abort replaces), or the rest
    /// of the END header when only that was missing (all data arrived: let the op complete).
    fn unfinished(&self, plan: &Plan, seq: u32, kind: u32) -> Vec<u8> {
        if self.frame >= plan.sends.len() || self.offset == 0 {
            return vec![];
        }
        let payload_end = HEADER_BYTES + plan.sends[self.frame].span.len;
        if self.offset < payload_end {
            vec![0; payload_end - self.offset]
        } else {
            header(TAG_END, seq, kind, 0)[self.offset - payload_end..].to_vec()
        }
    }

    /// Writes as much of the current frame as the socket takes; true if anything moved.
    fn step(
        &mut self,
        next: &mut Link,
        plan: &Plan,
        seq: u32,
        kind: u32,
    ) -> Result<bool, CommError> {
        let span = plan.sends[self.frame].span;
        let head = header(TAG_DATA, seq, kind, span.len as u32);
        let trailer = header(TAG_END, seq, kind, 0);
        let last = self.frame + 1 == plan.sends.len();
        // SAFETY: the span lies in a buffer kept alive for the op (a tensor the job holds or
        // the engine's scratch); nothing writes these bytes while the frame is being sent
        // (the plan's dependencies order writes before sends).
        let payload = unsafe { std::slice::from_raw_parts(span.ptr, span.len) };
        let parts: [&[u8]; 3] = [&head, payload, if last { &trailer } else { &[] }];
        let mut skip = self.offset;
        let mut slices = Vec::with_capacity(3);
        for part in parts {
            if skip >= part.len() {
                skip -= part.len();
            } else {
                slices.push(IoSlice::new(&part[skip..]));
                skip = 0;
            }
        }
        match next.stream.write_vectored(&slices) {
            Ok(0) => Err(next.io_error(&io::ErrorKind::BrokenPipe.into())),
            Ok(n) => {
                self.offset += n;
                if self.offset == self.frame_bytes(plan) {
                    self.frame += 1;
                    self.offset = 0;
                }
                Ok(true)
            }
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock
                    || e.kind() == io::ErrorKind::Interrupted =>
            {
                Ok(false)
            }
            Err(e) => Err(next.io_error(&e)),
        }
    }
}

struct Receiver {
    frame: usize,
    /// Bytes of the current frame's header then payload already read.
    offset: usize,
    header: [u8; HEADER_BYTES],
    end_seen: bool,
}

impl Receiver {
    fn step(
        &mut self,
        prev: &mut Link,
        plan: &Plan,
        seq: u32,
        kind: u32,
    ) -> Result<bool, CommError> {
        let mut moved = false;
        // Loop while data is there: one readable event often holds several frames.
        loop {
            let expecting_end = self.frame == plan.recvs.len();
            if expecting_end && self.end_seen {
                return Ok(moved);
            }
            let in_header = self.offset < HEADER_BYTES;
            let result = if in_header {
                prev.stream.read(&mut self.header[self.offset..])
            } else {
                let span = plan.recvs[self.frame].span;
                let done = self.offset - HEADER_BYTES;
                // SAFETY: the span lies in a live buffer of the op; no other reference to these
                // bytes exists while they are being received (dependencies order the reuse).
                let buf =
                    unsafe { std::slice::from_raw_parts_mut(span.ptr.add(done), span.len - done) };
                prev.stream.read(buf)
            };
            let n = match result {
                Ok(0) => return Err(prev.io_error(&io::ErrorKind::UnexpectedEof.into())),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(moved),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(prev.io_error(&e)),
            };
            moved = true;
            self.offset += n;
            if in_header && self.offset == HEADER_BYTES {
                let expected_len = if expecting_end {
                    0
                } else {
                    plan.recvs[self.frame].span.len
                };
                let expected_tag = if expecting_end { TAG_END } else { TAG_DATA };
                let [tag, got_seq, got_kind, len] = parse_header(&self.header);
                if tag == TAG_ABORT {
                    return Err(read_abort(prev, len)?);
                }
                if tag != expected_tag
                    || got_seq != seq
                    || got_kind != kind
                    || len as usize != expected_len
                {
                    return Err(prev.error(format!(
                        "is out of step: it sent frame (tag {tag:#x}, op #{got_seq} kind {got_kind}, \
                         {len} bytes) where this rank expected (tag {expected_tag:#x}, op #{seq} \
                         kind {kind}, {expected_len} bytes); every rank must issue the same \
                         collectives with the same sizes in the same order"
                    )));
                }
                if expecting_end {
                    self.end_seen = true;
                    return Ok(true);
                }
            }
            if !in_header || self.offset == HEADER_BYTES {
                let frame = &plan.recvs[self.frame];
                if self.offset == HEADER_BYTES + frame.span.len {
                    apply(&frame.then, plan)?;
                    self.frame += 1;
                    self.offset = 0;
                    // Let the caller forward what just arrived before reading more.
                    return Ok(true);
                }
            }
        }
    }
}

fn apply(then: &OnRecv, plan: &Plan) -> Result<(), CommError> {
    // SAFETY (both arms): spans of live buffers of the op; `dst` never overlaps `src` or
    // `base` (plans pair scratch with tensor bytes, or disjoint tensor ranges), and nothing
    // else touches them during the call.
    match *then {
        OnRecv::Nothing => Ok(()),
        OnRecv::Reduce { dst, src, divisor } => {
            let (d, s) = unsafe {
                (
                    std::slice::from_raw_parts_mut(dst.ptr, dst.len),
                    std::slice::from_raw_parts(src.ptr, src.len),
                )
            };
            reduce(d, s, plan.dtype, plan.op, divisor)
        }
        OnRecv::ReduceFrom {
            dst,
            base,
            src,
            divisor,
        } => {
            let (d, b, s) = unsafe {
                (
                    std::slice::from_raw_parts_mut(dst.ptr, dst.len),
                    std::slice::from_raw_parts(base.ptr, base.len),
                    std::slice::from_raw_parts(src.ptr, src.len),
                )
            };
            d.copy_from_slice(b);
            reduce(d, s, plan.dtype, plan.op, divisor)
        }
    }
}
