//! Framing and handshake of every shardrun control connection: a worker and the controller,
//! a client and the controller, a rank and rank 0 in a launch without the controller.
//!
//! A frame is a 4-byte big-endian length followed by that many bytes of JSON: exactly what
//! `tokio_util::codec::LengthDelimitedCodec` reads and writes with its defaults. Every
//! connection starts with a [`Hello`] from the connecting side, answered by a
//! [`HelloReply`]. Until the hello is accepted the frame limit is [`HANDSHAKE_FRAME_LIMIT`]
//! (a few KiB), so a stranger on the port can make the server hold at most that much;
//! afterwards the accepting side takes frames of up to [`FRAME_LIMIT`], and the connecting
//! side, which hears only from the server it chose, up to [`REPLY_FRAME_LIMIT`] (the start
//! message lists every rank of the job).
//!
//! The accepting side comes twice, with one check of the hello: [`accept`] for the
//! controller's tokio server and [`accept_blocking`] for rank 0's rendezvous listener, which
//! runs before any runtime exists. The connecting side is [`BlockingConnection`].

use crate::messages::{Hello, HelloReply, Role};
use crate::PROTOCOL_VERSION;
use futures::{SinkExt, StreamExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::io::{Read, Write};
use std::marker::PhantomData;
use std::net::{TcpStream as StdTcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio_util::codec::{FramedRead, FramedWrite, LengthDelimitedCodec};

/// Largest frame the accepting side takes after the handshake (a log line or a metrics
/// record is far less).
pub const FRAME_LIMIT: usize = 1 << 20;
/// Largest frame the connecting side takes from the side it connected to: the start message
/// lists every rank (about 120 bytes each), so 64 MiB holds a world of 500,000 ranks.
pub const REPLY_FRAME_LIMIT: usize = 64 << 20;
/// Largest frame accepted before the peer has proven it knows the secret.
pub const HANDSHAKE_FRAME_LIMIT: usize = 4 << 10;
/// How long a peer has to send its hello (and the controller to answer it).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("frame of {size} bytes is over the limit of {limit} bytes")]
    FrameTooLarge { size: usize, limit: usize },
    #[error("malformed message: {0}")]
    Malformed(String),
    #[error("the peer closed the connection")]
    Closed,
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error("handshake rejected: {0}")]
    Rejected(String),
    /// The TCP connection was made, but no shardrun handshake came back: another program
    /// listens on that port, or the peer is stuck.
    #[error("a program accepted the connection but gave no shardrun handshake ({0})")]
    NoHandshake(Box<ConnectionError>),
    /// The waiting side was asked to stop before anything came.
    #[error("stopped waiting: this process was asked to stop")]
    Stopped,
}

/// How often a wait that heeds a stop looks for one.
const STOP_POLL: Duration = Duration::from_millis(200);

/// Why a hello was refused; logged by the controller and sent back to the peer.
fn check_hello(hello: &Hello, secret: &str) -> Result<(), String> {
    if hello.magic != Hello::MAGIC {
        return Err("not a shardrun peer (bad magic)".into());
    }
    if hello.version != PROTOCOL_VERSION {
        return Err(format!(
            "protocol version {} is not this controller's version {PROTOCOL_VERSION}: \
             use the shardrun and shardrun-worker binaries of the same build",
            hello.version
        ));
    }
    if !constant_time_eq(hello.secret.as_bytes(), secret.as_bytes()) {
        return Err(format!(
            "wrong secret (it is in the run directory's `secret` file; ranks started without \
             the controller take it from {})",
            crate::env::SECRET
        ));
    }
    Ok(())
}

/// Compares without an early exit so the time taken says nothing about the secret.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `LengthDelimitedCodec` with the wire's parameters and the given frame limit.
pub fn codec(limit: usize) -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .big_endian()
        .length_field_length(4)
        .max_frame_length(limit)
        .new_codec()
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ConnectionError> {
    serde_json::from_slice(bytes).map_err(|e| ConnectionError::Malformed(e.to_string()))
}

fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, ConnectionError> {
    serde_json::to_vec(msg).map_err(|e| ConnectionError::Malformed(e.to_string()))
}

fn map_codec_error(err: std::io::Error) -> ConnectionError {
    // LengthDelimitedCodec reports an oversize frame as InvalidData.
    if err.kind() == std::io::ErrorKind::InvalidData {
        ConnectionError::Malformed(err.to_string())
    } else {
        ConnectionError::Io(err)
    }
}

// ---------------------------------------------------------------------------------------
// Async side (controller)

/// Receiving half of an accepted connection, yielding messages of type `In`.
pub struct AsyncReceiver<In, R = OwnedReadHalf> {
    frames: FramedRead<R, LengthDelimitedCodec>,
    _msg: PhantomData<fn() -> In>,
}

impl<In: DeserializeOwned, R: AsyncRead + Unpin> AsyncReceiver<In, R> {
    /// The next message; `Ok(None)` when the peer closed the connection cleanly.
    pub async fn recv(&mut self) -> Result<Option<In>, ConnectionError> {
        match self.frames.next().await {
            None => Ok(None),
            Some(Err(e)) => Err(map_codec_error(e)),
            Some(Ok(bytes)) => decode(&bytes).map(Some),
        }
    }
}

/// Sending half of an accepted connection, taking messages of type `Out`.
pub struct AsyncSender<Out, W = OwnedWriteHalf> {
    frames: FramedWrite<W, LengthDelimitedCodec>,
    _msg: PhantomData<fn(Out)>,
}

impl<Out: Serialize, W: AsyncWrite + Unpin> AsyncSender<Out, W> {
    pub async fn send(&mut self, msg: &Out) -> Result<(), ConnectionError> {
        let bytes = encode(msg)?;
        self.frames
            .send(bytes::Bytes::from(bytes))
            .await
            .map_err(map_codec_error)
    }
}

/// Controller side of the handshake: reads the peer's [`Hello`] within `timeout`, answers
/// it, and on success returns the peer's role and the typed halves of the connection.
/// A rejected peer gets a [`HelloReply::Rejected`] (best effort) and an error describing why.
pub async fn accept<In, Out>(
    stream: TcpStream,
    secret: &str,
    timeout: Duration,
) -> Result<(Role, AsyncReceiver<In>, AsyncSender<Out>), ConnectionError> {
    let (read, write) = stream.into_split();
    let mut frames = FramedRead::new(read, codec(HANDSHAKE_FRAME_LIMIT));
    let mut out = FramedWrite::new(write, codec(REPLY_FRAME_LIMIT));
    let first = tokio::time::timeout(timeout, frames.next())
        .await
        .map_err(|_| ConnectionError::Timeout(timeout))?;
    let bytes = match first {
        None => return Err(ConnectionError::Closed),
        Some(Err(e)) => return Err(map_codec_error(e)),
        Some(Ok(bytes)) => bytes,
    };
    let hello: Hello = decode(&bytes)?;
    let verdict = check_hello(&hello, secret);
    let reply = match &verdict {
        Ok(()) => HelloReply::Accepted,
        Err(reason) => HelloReply::Rejected {
            reason: reason.clone(),
        },
    };
    let reply_bytes = encode(&reply)?;
    let sent = tokio::time::timeout(timeout, out.send(bytes::Bytes::from(reply_bytes))).await;
    if let Err(reason) = verdict {
        return Err(ConnectionError::Rejected(reason));
    }
    sent.map_err(|_| ConnectionError::Timeout(timeout))?
        .map_err(map_codec_error)?;
    frames.decoder_mut().set_max_frame_length(FRAME_LIMIT);
    Ok((
        hello.role,
        AsyncReceiver {
            frames,
            _msg: PhantomData,
        },
        AsyncSender {
            frames: out,
            _msg: PhantomData,
        },
    ))
}

// ---------------------------------------------------------------------------------------
// Blocking side (workers, clients, load generators, rank 0's rendezvous)

/// [`accept`] without a runtime: reads the peer's [`Hello`] within `timeout` (in all, however
/// slowly it trickles in), answers it, and on success returns the peer's role and the
/// connection. A rejected peer gets a [`HelloReply::Rejected`] (best effort) and an error
/// describing why.
pub fn accept_blocking(
    stream: StdTcpStream,
    secret: &str,
    timeout: Duration,
) -> Result<(Role, BlockingConnection), ConnectionError> {
    let deadline = Instant::now() + timeout;
    stream.set_nonblocking(false)?;
    stream.set_nodelay(true)?;
    stream.set_write_timeout(Some(timeout))?;
    let mut conn = BlockingConnection {
        stream,
        limits: Limits::ACCEPTING,
    };
    let hello: Hello = conn.recv_until(HANDSHAKE_FRAME_LIMIT, deadline, timeout, &|| false)?;
    let verdict = check_hello(&hello, secret);
    let reply = match &verdict {
        Ok(()) => HelloReply::Accepted,
        Err(reason) => HelloReply::Rejected {
            reason: reason.clone(),
        },
    };
    let sent = conn.send(&reply);
    if let Err(reason) = verdict {
        return Err(ConnectionError::Rejected(reason));
    }
    sent?;
    conn.stream.set_read_timeout(None)?;
    conn.stream.set_write_timeout(None)?;
    Ok((hello.role, conn))
}

/// A blocking connection to the controller. Every [`BlockingConnection::send`] writes one
/// whole frame with a single `write_all` before returning, so the data has reached the
/// kernel even if the process dies right after.
pub struct BlockingConnection {
    stream: StdTcpStream,
    /// Largest frame [`BlockingConnection::recv`] takes, and the largest the other side
    /// takes from [`BlockingConnection::send`]: on the connecting side [`REPLY_FRAME_LIMIT`]
    /// and [`FRAME_LIMIT`], on the accepting side the other way round.
    limits: Limits,
}

#[derive(Debug, Clone, Copy)]
struct Limits {
    recv: usize,
    send: usize,
}

impl Limits {
    const CONNECTING: Limits = Limits {
        recv: REPLY_FRAME_LIMIT,
        send: FRAME_LIMIT,
    };
    const ACCEPTING: Limits = Limits {
        recv: FRAME_LIMIT,
        send: REPLY_FRAME_LIMIT,
    };
}

impl BlockingConnection {
    /// Connects to `addr` (`host:port`), presents `secret` and waits for the verdict.
    pub fn connect(
        addr: &str,
        role: Role,
        secret: &str,
        timeout: Duration,
    ) -> Result<BlockingConnection, ConnectionError> {
        Self::connect_unless(addr, role, secret, timeout, || false)
    }

    /// [`BlockingConnection::connect`] that gives up waiting for the verdict, with
    /// [`ConnectionError::Stopped`], once `stopped` says so (a rank told to stop while a
    /// program that is not rank 0 holds its port and says nothing).
    pub fn connect_unless(
        addr: &str,
        role: Role,
        secret: &str,
        timeout: Duration,
        stopped: impl Fn() -> bool,
    ) -> Result<BlockingConnection, ConnectionError> {
        let mut last_err = None;
        let mut stream = None;
        for sock in addr.to_socket_addrs()? {
            match connect_within(sock, timeout, &stopped) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(ConnectionError::Stopped) => return Err(ConnectionError::Stopped),
                Err(e) => last_err = Some(e),
            }
        }
        let stream = match (stream, last_err) {
            (Some(s), _) => s,
            (None, Some(e)) => return Err(e),
            (None, None) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "the address resolves to nothing",
                )
                .into())
            }
        };
        stream.set_nodelay(true)?;
        let mut conn = BlockingConnection {
            stream,
            limits: Limits::CONNECTING,
        };
        let mut hello = || -> Result<HelloReply, ConnectionError> {
            conn.send(&Hello {
                magic: Hello::MAGIC.into(),
                version: PROTOCOL_VERSION,
                role,
                secret: secret.into(),
            })?;
            conn.recv_until(
                HANDSHAKE_FRAME_LIMIT,
                Instant::now() + timeout,
                timeout,
                &stopped,
            )
        };
        let reply = hello().map_err(|e| match e {
            ConnectionError::Stopped => e,
            e => ConnectionError::NoHandshake(Box::new(e)),
        })?;
        conn.stream.set_read_timeout(None)?;
        match reply {
            HelloReply::Accepted => Ok(conn),
            HelloReply::Rejected { reason } => Err(ConnectionError::Rejected(reason)),
        }
    }

    /// A second handle on the same socket (e.g. for a reader thread).
    pub fn try_clone(&self) -> Result<BlockingConnection, ConnectionError> {
        Ok(BlockingConnection {
            stream: self.stream.try_clone()?,
            limits: self.limits,
        })
    }

    /// Waits until something can be read (or the peer closed), looking for a stop every
    /// [`STOP_POLL`]: `Timeout` at `deadline`, `Stopped` once `stopped` says so. Reads nothing;
    /// leaves a short read timeout set.
    pub fn readable_before(
        &self,
        deadline: Instant,
        stopped: impl Fn() -> bool,
    ) -> Result<(), ConnectionError> {
        let started = Instant::now();
        loop {
            if stopped() {
                return Err(ConnectionError::Stopped);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ConnectionError::Timeout(started.elapsed()));
            }
            let wait = left.min(STOP_POLL).max(Duration::from_millis(1));
            self.stream.set_read_timeout(Some(wait))?;
            match self.stream.peek(&mut [0u8; 1]) {
                // A byte, or the end of the stream, which the read then reports.
                Ok(_) => return Ok(()),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock
                            | std::io::ErrorKind::TimedOut
                            | std::io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> Result<(), ConnectionError> {
        Ok(self.stream.set_read_timeout(timeout)?)
    }

    /// `false` lets the kernel coalesce small frames written while earlier ones are
    /// unacknowledged (Nagle): for one-way streams where a write should cost a copy, not a
    /// trip through the network stack. Frames are in the kernel either way once written.
    pub fn set_nodelay(&self, nodelay: bool) -> Result<(), ConnectionError> {
        Ok(self.stream.set_nodelay(nodelay)?)
    }

    pub fn send<T: Serialize>(&mut self, msg: &T) -> Result<(), ConnectionError> {
        let frame = encode_frame_within(msg, self.limits.send)?;
        self.stream.write_all(&frame)?;
        Ok(())
    }

    /// Writes an already encoded frame (see [`encode_frame`]).
    pub fn send_frame(&mut self, frame: &[u8]) -> Result<(), ConnectionError> {
        self.stream.write_all(frame)?;
        Ok(())
    }

    pub fn recv<T: DeserializeOwned>(&mut self) -> Result<T, ConnectionError> {
        self.recv_limited(self.limits.recv)
    }

    fn recv_limited<T: DeserializeOwned>(&mut self, limit: usize) -> Result<T, ConnectionError> {
        let mut len = [0u8; 4];
        read_exact_or_closed(&mut self.stream, &mut len)?;
        let size = u32::from_be_bytes(len) as usize;
        if size > limit {
            return Err(ConnectionError::FrameTooLarge { size, limit });
        }
        let mut buf = vec![0u8; size];
        read_exact_or_closed(&mut self.stream, &mut buf)?;
        decode(&buf)
    }

    /// One message, all of it read `within` that long (`Timeout`), giving up with `Stopped`
    /// once `stopped` says so: a peer that sent part of a message and then went silent
    /// holds a rank told to stop no longer than [`STOP_POLL`]. Leaves a read timeout set.
    pub fn recv_unless<T: DeserializeOwned>(
        &mut self,
        within: Duration,
        stopped: impl Fn() -> bool,
    ) -> Result<T, ConnectionError> {
        let limit = self.limits.recv;
        self.recv_until(limit, Instant::now() + within, within, &stopped)
    }

    /// One message of at most `limit` bytes, all of it read before `deadline` (reported as
    /// `timeout`), looking for a stop every [`STOP_POLL`].
    fn recv_until<T: DeserializeOwned>(
        &mut self,
        limit: usize,
        deadline: Instant,
        timeout: Duration,
        stopped: &dyn Fn() -> bool,
    ) -> Result<T, ConnectionError> {
        let mut len = [0u8; 4];
        read_exact_until(&mut self.stream, &mut len, deadline, timeout, stopped)?;
        let size = u32::from_be_bytes(len) as usize;
        if size > limit {
            return Err(ConnectionError::FrameTooLarge { size, limit });
        }
        let mut buf = vec![0u8; size];
        read_exact_until(&mut self.stream, &mut buf, deadline, timeout, stopped)?;
        decode(&buf)
    }

    pub fn shutdown(&self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

/// One frame (length prefix + JSON) ready for a single `write_all`, from a connecting side
/// (a worker, a client): at most [`FRAME_LIMIT`] bytes, what the accepting side takes.
pub fn encode_frame<T: Serialize>(msg: &T) -> Result<Vec<u8>, ConnectionError> {
    encode_frame_within(msg, FRAME_LIMIT)
}

fn encode_frame_within<T: Serialize>(msg: &T, limit: usize) -> Result<Vec<u8>, ConnectionError> {
    let mut frame = vec![0u8; 4];
    serde_json::to_writer(&mut frame, msg)
        .map_err(|e| ConnectionError::Malformed(e.to_string()))?;
    let size = frame.len() - 4;
    if size > limit {
        return Err(ConnectionError::FrameTooLarge { size, limit });
    }
    frame[..4].copy_from_slice(&(size as u32).to_be_bytes());
    Ok(frame)
}

fn read_exact_or_closed(stream: &mut StdTcpStream, buf: &mut [u8]) -> Result<(), ConnectionError> {
    match stream.read_exact(buf) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(ConnectionError::Closed),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            Err(ConnectionError::Timeout(
                stream.read_timeout().ok().flatten().unwrap_or_default(),
            ))
        }
        Err(e) => Err(e.into()),
    }
}

/// `read_exact` that gives up at `deadline` (reported as the whole `timeout`), so a peer
/// sending a byte now and then cannot hold the reader longer than that, and with `Stopped`
/// once `stopped` says so, looked at every [`STOP_POLL`].
fn read_exact_until(
    stream: &mut StdTcpStream,
    buf: &mut [u8],
    deadline: Instant,
    timeout: Duration,
    stopped: &dyn Fn() -> bool,
) -> Result<(), ConnectionError> {
    let mut filled = 0;
    while filled < buf.len() {
        if stopped() {
            return Err(ConnectionError::Stopped);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ConnectionError::Timeout(timeout));
        }
        stream.set_read_timeout(Some(left.min(STOP_POLL).max(Duration::from_millis(1))))?;
        match stream.read(&mut buf[filled..]) {
            Ok(0) => return Err(ConnectionError::Closed),
            Ok(n) => filled += n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// `TcpStream::connect_timeout` that gives up with `Stopped` once `stopped` says so, looked
/// at every [`STOP_POLL`]: an address that drops packets holds a rank told to stop no longer
/// than that. The attempt goes on in a thread of its own, which its timeout ends.
fn connect_within(
    sock: std::net::SocketAddr,
    timeout: Duration,
    stopped: &dyn Fn() -> bool,
) -> Result<StdTcpStream, ConnectionError> {
    if stopped() {
        return Err(ConnectionError::Stopped);
    }
    let (done, attempt) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("connect".into())
        .spawn(move || {
            let _ = done.send(StdTcpStream::connect_timeout(&sock, timeout));
        })?;
    loop {
        match attempt.recv_timeout(STOP_POLL) {
            Ok(connected) => return Ok(connected?),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) if stopped() => {
                return Err(ConnectionError::Stopped)
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(std::io::Error::other("the connecting thread ended").into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::{FromWorker, LogLevel, LogLine, ToWorker};
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    const SECRET: &str = "s3cret";

    async fn listener() -> (TcpListener, String) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        (l, addr)
    }

    type Accepted =
        Result<(Role, AsyncReceiver<FromWorker>, AsyncSender<ToWorker>), ConnectionError>;

    async fn accept_one(l: &TcpListener) -> Accepted {
        let (s, _) = l.accept().await.unwrap();
        accept::<FromWorker, ToWorker>(s, SECRET, Duration::from_secs(2)).await
    }

    #[tokio::test]
    async fn blocking_worker_talks_to_async_controller() {
        let (l, addr) = listener().await;
        let worker = std::thread::spawn(move || {
            let mut c =
                BlockingConnection::connect(&addr, Role::Worker, SECRET, Duration::from_secs(2))
                    .unwrap();
            c.send(&FromWorker::Log(LogLine {
                level: LogLevel::Info,
                time: 1.5,
                text: "hello ünïcode".into(),
            }))
            .unwrap();
            let reply: ToWorker = c.recv().unwrap();
            assert_eq!(reply, ToWorker::Preempt);
        });
        let (role, mut rx, mut tx) = accept_one(&l).await.unwrap();
        assert_eq!(role, Role::Worker);
        match rx.recv().await.unwrap() {
            Some(FromWorker::Log(line)) => assert_eq!(line.text, "hello ünïcode"),
            other => panic!("unexpected {other:?}"),
        }
        tx.send(&ToWorker::Preempt).await.unwrap();
        worker.join().unwrap();
        assert!(rx.recv().await.unwrap().is_none());
    }

    /// The start message of a world of `ranks` ranks (more than [`FRAME_LIMIT`] past 9,000).
    fn start_of(ranks: u64) -> ToWorker {
        ToWorker::Start(crate::messages::StartInfo {
            world_size: ranks,
            peers: (0..ranks)
                .map(|rank| crate::messages::PeerInfo {
                    rank,
                    local_rank: rank % 8,
                    host: format!("gpu-node-{:05}.cluster.example.org", rank / 8),
                    collective_addr: Some(format!(
                        "10.{}.{}.{}:29400",
                        rank >> 16,
                        (rank >> 8) & 255,
                        rank & 255
                    )),
                })
                .collect(),
            nccl_unique_id: Some(vec![7; 128]),
        })
    }

    #[tokio::test]
    async fn the_start_of_a_large_world_reaches_every_rank_while_ranks_stay_bounded() {
        // 20,000 ranks: a start message of about 2.4 MB, past the ranks' own frame limit.
        let start = start_of(20_000);
        assert!(serde_json::to_vec(&start).unwrap().len() > 2 * FRAME_LIMIT);
        let oversize = FromWorker::Log(LogLine {
            level: LogLevel::Info,
            time: 0.0,
            text: "x".repeat(FRAME_LIMIT),
        });
        let (l, addr) = listener().await;
        let expected = start.clone();
        let worker = std::thread::spawn(move || {
            let mut c =
                BlockingConnection::connect(&addr, Role::Worker, SECRET, Duration::from_secs(2))
                    .unwrap();
            assert_eq!(c.recv::<ToWorker>().unwrap(), expected);
            // A rank may not send the controller a frame past its limit: refused here,
            // before it is written (the connection stays usable).
            assert!(matches!(
                c.send(&oversize),
                Err(ConnectionError::FrameTooLarge {
                    limit: FRAME_LIMIT,
                    ..
                })
            ));
            c.send(&FromWorker::Heartbeat {
                step: 1,
                work: 2,
                collectives: 3,
            })
            .unwrap();
            // And a peer that announces one anyway is cut off.
            c.send_frame(&(2 * FRAME_LIMIT as u32).to_be_bytes())
                .unwrap();
        });
        let (_, mut rx, mut tx) = accept_one(&l).await.unwrap();
        tx.send(&start).await.unwrap();
        assert_eq!(
            rx.recv().await.unwrap(),
            Some(FromWorker::Heartbeat {
                step: 1,
                work: 2,
                collectives: 3,
            })
        );
        assert!(matches!(
            rx.recv().await,
            Err(ConnectionError::Malformed(_))
        ));
        worker.join().unwrap();

        // Rank 0's rendezvous without a controller (the blocking accepting side) likewise.
        let expected = start.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let (_, mut conn) = accept_blocking_one(SECRET, Duration::from_secs(2), move |addr| {
            let mut c =
                BlockingConnection::connect(&addr, Role::Worker, SECRET, Duration::from_secs(2))
                    .unwrap();
            c.send_frame(&(2 * FRAME_LIMIT as u32).to_be_bytes())
                .unwrap();
            tx.send(c).unwrap();
        })
        .unwrap();
        let mut rank = rx.recv().unwrap();
        assert!(matches!(
            conn.recv::<FromWorker>(),
            Err(ConnectionError::FrameTooLarge {
                limit: FRAME_LIMIT,
                ..
            })
        ));
        // Read while it is written: 2.4 MB need not fit in the socket's buffers.
        let reader = std::thread::spawn(move || rank.recv::<ToWorker>().unwrap());
        conn.send(&start).unwrap();
        assert_eq!(reader.join().unwrap(), expected);
    }

    #[tokio::test]
    async fn wrong_secret_and_version_are_rejected_with_a_reason() {
        let (l, addr) = listener().await;
        let a = addr.clone();
        let client = std::thread::spawn(move || {
            BlockingConnection::connect(&a, Role::Worker, "nope", Duration::from_secs(2))
                .err()
                .unwrap()
                .to_string()
        });
        assert!(matches!(
            accept_one(&l).await,
            Err(ConnectionError::Rejected(_))
        ));
        assert!(client.join().unwrap().contains("wrong secret"));

        let client = tokio::spawn(async move {
            let mut s = TcpStream::connect(&addr).await.unwrap();
            let hello = Hello {
                magic: Hello::MAGIC.into(),
                version: PROTOCOL_VERSION + 1,
                role: Role::Worker,
                secret: SECRET.into(),
            };
            let frame = encode_frame(&hello).unwrap();
            s.write_all(&frame).await.unwrap();
        });
        match accept_one(&l).await {
            Err(ConnectionError::Rejected(reason)) => assert!(reason.contains("version")),
            other => panic!("unexpected {:?}", other.err()),
        }
        client.await.unwrap();
    }

    #[tokio::test]
    async fn oversize_length_prefix_is_refused_without_allocating() {
        let (l, addr) = listener().await;
        // The peer keeps its end open until the verdict, so the refusal is the size's.
        let (judged, verdict) = tokio::sync::oneshot::channel::<()>();
        let peer = tokio::spawn(async move {
            let mut s = TcpStream::connect(&addr).await.unwrap();
            s.write_all(&(1u32 << 30).to_be_bytes()).await.unwrap();
            s.write_all(b"xxxx").await.unwrap();
            let _ = verdict.await;
        });
        match accept_one(&l).await {
            // tokio-util's LengthDelimitedCodecError, before any buffer of that size.
            Err(ConnectionError::Malformed(why)) => assert_eq!(why, "frame size too big"),
            other => panic!("unexpected {:?}", other.err()),
        }
        let _ = judged.send(());
        peer.await.unwrap();
    }

    #[tokio::test]
    async fn garbage_truncation_and_silence_are_errors() {
        let (l, addr) = listener().await;
        let a = addr.clone();
        tokio::spawn(async move {
            let mut s = TcpStream::connect(&a).await.unwrap();
            s.write_all(&[0, 0, 0, 5, b'{', b'x', 0xff, 1, 2])
                .await
                .unwrap();
        });
        assert!(matches!(
            accept_one(&l).await,
            Err(ConnectionError::Malformed(_))
        ));
        let a = addr.clone();
        tokio::spawn(async move {
            let mut s = TcpStream::connect(&a).await.unwrap();
            s.write_all(&[0, 0, 0, 100, b'{']).await.unwrap();
        });
        assert!(accept_one(&l).await.is_err());
        let _silent = TcpStream::connect(&addr).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        let r = accept::<FromWorker, ToWorker>(s, SECRET, Duration::from_millis(100)).await;
        assert!(matches!(r, Err(ConnectionError::Timeout(_))));
    }

    /// A blocking listener and the peer that dials it, accepted with `secret`.
    fn accept_blocking_one(
        secret: &str,
        timeout: Duration,
        peer: impl FnOnce(String) + Send + 'static,
    ) -> Result<(Role, BlockingConnection), ConnectionError> {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let peer = std::thread::spawn(move || peer(addr));
        let (stream, _) = l.accept().unwrap();
        let accepted = accept_blocking(stream, secret, timeout);
        peer.join().unwrap();
        accepted
    }

    #[test]
    fn blocking_accept_talks_to_the_blocking_connection() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let worker = std::thread::spawn(move || {
            let mut c =
                BlockingConnection::connect(&addr, Role::Worker, SECRET, Duration::from_secs(2))
                    .unwrap();
            c.send(&FromWorker::Heartbeat {
                step: 3,
                work: 7,
                collectives: 9,
            })
            .unwrap();
            c.recv::<ToWorker>().unwrap()
        });
        let (stream, _) = l.accept().unwrap();
        let (role, mut conn) = accept_blocking(stream, SECRET, Duration::from_secs(2)).unwrap();
        assert_eq!(role, Role::Worker);
        assert_eq!(
            conn.recv::<FromWorker>().unwrap(),
            FromWorker::Heartbeat {
                step: 3,
                work: 7,
                collectives: 9,
            }
        );
        conn.send(&ToWorker::Preempt).unwrap();
        assert_eq!(worker.join().unwrap(), ToWorker::Preempt);
    }

    #[test]
    fn blocking_accept_refuses_what_the_async_accept_refuses() {
        let (tx, rx) = std::sync::mpsc::channel();
        let refused = accept_blocking_one(SECRET, Duration::from_secs(2), move |addr| {
            let err =
                BlockingConnection::connect(&addr, Role::Worker, "nope", Duration::from_secs(2))
                    .err()
                    .unwrap();
            tx.send(err.to_string()).unwrap();
        });
        match refused {
            Err(ConnectionError::Rejected(reason)) => assert!(reason.contains("wrong secret")),
            other => panic!("unexpected {:?}", other.err()),
        }
        let told = rx.recv().unwrap();
        assert!(
            told.contains("wrong secret") && told.contains(crate::env::SECRET),
            "{told}"
        );

        let refused = accept_blocking_one(SECRET, Duration::from_secs(2), |addr| {
            let mut s = StdTcpStream::connect(addr).unwrap();
            let hello = Hello {
                magic: Hello::MAGIC.into(),
                version: PROTOCOL_VERSION + 1,
                role: Role::Worker,
                secret: SECRET.into(),
            };
            s.write_all(&encode_frame(&hello).unwrap()).unwrap();
        });
        match refused {
            Err(ConnectionError::Rejected(reason)) => assert!(reason.contains("version")),
            other => panic!("unexpected {:?}", other.err()),
        }
    }

    /// A peer that answers the hello with part of a message and then says nothing holds a
    /// process told to stop for one look at the stop, not the whole handshake timeout.
    #[test]
    fn a_stop_ends_the_wait_for_the_rest_of_a_message() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let sent = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (done, hold) = std::sync::mpsc::channel::<()>();
        let peer = {
            let sent = sent.clone();
            std::thread::spawn(move || {
                let (mut s, _) = listener.accept().unwrap();
                // Two of the four bytes of a length prefix.
                s.write_all(&[0, 0]).unwrap();
                sent.store(true, std::sync::atomic::Ordering::SeqCst);
                let _ = hold.recv();
            })
        };
        // Stopped from the third look after the part was sent: the first looks let the read
        // take the part and then block for the rest.
        let looks = std::sync::atomic::AtomicU32::new(0);
        let outcome = BlockingConnection::connect_unless(
            &addr,
            Role::Worker,
            SECRET,
            Duration::from_secs(60),
            || {
                sent.load(std::sync::atomic::Ordering::SeqCst)
                    && looks.fetch_add(1, std::sync::atomic::Ordering::SeqCst) >= 2
            },
        );
        assert!(
            matches!(outcome, Err(ConnectionError::Stopped)),
            "{:?}",
            outcome.err()
        );
        drop(done);
        peer.join().unwrap();

        // The same after the handshake, reading a message.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let sent = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let sent = sent.clone();
            std::thread::spawn(move || {
                let mut conn = BlockingConnection::connect(
                    &addr,
                    Role::Worker,
                    SECRET,
                    Duration::from_secs(2),
                )
                .unwrap();
                conn.recv_unless::<ToWorker>(Duration::from_secs(60), || {
                    sent.load(std::sync::atomic::Ordering::SeqCst)
                })
            })
        };
        let (stream, _) = listener.accept().unwrap();
        let (_, mut conn) = accept_blocking(stream, SECRET, Duration::from_secs(2)).unwrap();
        conn.send_frame(&[0, 0, 0, 9, b'{']).unwrap();
        sent.store(true, std::sync::atomic::Ordering::SeqCst);
        let outcome = reader.join().unwrap();
        assert!(
            matches!(outcome, Err(ConnectionError::Stopped)),
            "{:?}",
            outcome.err()
        );
    }

    /// A connection attempt nothing answers (here a listener whose queue is full, so the
    /// kernel drops the attempt's packets) ends at the first look at a stop.
    #[test]
    fn a_stop_ends_a_connection_attempt_nothing_answers() {
        use std::os::fd::AsRawFd;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        // SAFETY: listen on a socket this test owns; a backlog of 0 queues one connection.
        assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 0) }, 0);
        let addr = listener.local_addr().unwrap();
        let _queued = StdTcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
        let looks = std::sync::atomic::AtomicU32::new(0);
        let outcome = BlockingConnection::connect_unless(
            &addr.to_string(),
            Role::Worker,
            SECRET,
            Duration::from_secs(60),
            // Not stopped when the attempt starts, stopped at the next look.
            || looks.fetch_add(1, std::sync::atomic::Ordering::SeqCst) > 0,
        );
        assert!(
            matches!(outcome, Err(ConnectionError::Stopped)),
            "{:?}",
            outcome.err()
        );
    }

    #[test]
    fn blocking_accept_bounds_strangers_in_size_and_time() {
        let write = |bytes: &'static [u8]| {
            move |addr: String| {
                let mut s = StdTcpStream::connect(addr).unwrap();
                s.write_all(bytes).unwrap();
            }
        };
        let timeout = Duration::from_secs(2);
        assert!(matches!(
            accept_blocking_one(SECRET, timeout, write(&[0x40, 0, 0, 0, b'x'])),
            Err(ConnectionError::FrameTooLarge {
                size: 0x4000_0000,
                limit: HANDSHAKE_FRAME_LIMIT
            })
        ));
        assert!(matches!(
            accept_blocking_one(
                SECRET,
                timeout,
                write(&[0, 0, 0, 5, b'{', b'x', 0xff, 1, 2])
            ),
            Err(ConnectionError::Malformed(_))
        ));
        assert!(matches!(
            accept_blocking_one(SECRET, timeout, write(&[0, 0, 0, 100, b'{'])),
            Err(ConnectionError::Closed)
        ));
        // A peer that sends part of a frame and then nothing (keeping the connection open
        // until the listener hangs up) is cut off at the deadline.
        let slow = accept_blocking_one(SECRET, Duration::from_millis(200), |addr| {
            let mut s = StdTcpStream::connect(addr).unwrap();
            s.write_all(&[0, 0, 0, 9, b'{']).unwrap();
            let _ = s.read(&mut [0u8; 1]);
        })
        .err();
        assert!(
            matches!(slow, Some(ConnectionError::Timeout(_))),
            "{slow:?}"
        );
    }

    #[test]
    fn frames_match_length_delimited_codec() {
        use bytes::BytesMut;
        use tokio_util::codec::Decoder;
        let frame = encode_frame(&ToWorker::Preempt).unwrap();
        let mut buf = BytesMut::from(&frame[..]);
        let payload = codec(FRAME_LIMIT).decode(&mut buf).unwrap().unwrap();
        assert_eq!(decode::<ToWorker>(&payload).unwrap(), ToWorker::Preempt);
    }
}
