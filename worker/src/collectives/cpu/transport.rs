//! TCP links between neighbouring ranks of a ring: listening, connecting with a handshake,
//! socket tuning, frame headers and the abort message that carries a failure around the ring.
//!
//! This wire is deliberately not `shardrun_protocol::connection`'s. Its payload is tensor
//! bytes, written from and read straight into the tensors' memory: through JSON they would
//! be copied, several times larger, and converted per element on the step's critical path.
//! A frame is as large as the ring's chunk of the collective, so instead of a size limit the
//! receiver checks each 16-byte header (tag, op, kind, length) against what its own plan of
//! the same collective expects. And the links are non-blocking, many polled at once with
//! deadlines, where a control connection carries one message at a time. A connection that
//! does not open with the 32-byte hello naming the communicator and both ranks (a port
//! scanner, a stale job) is dropped.

use super::super::CommError;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

/// Socket buffers large enough to keep a few frames in flight per direction.
const SOCKET_BUFFER_BYTES: libc::c_int = 4 << 20;
const HELLO_MAGIC: &[u8; 8] = b"SRCOLL01";
pub const HEADER_BYTES: usize = 16;

/// Frame tags.
pub const TAG_DATA: u32 = 0x5344_4154;
pub const TAG_END: u32 = 0x5345_4E44;
pub const TAG_ABORT: u32 = 0x5341_4254;

/// One rank of a communicator: its rank in the job (used in messages) and its listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub rank: usize,
    pub addr: String,
}

/// A connected neighbour.
pub struct Link {
    pub stream: TcpStream,
    pub peer: Member,
}

impl Link {
    pub fn fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    pub fn error(&self, what: impl Into<String>) -> CommError {
        CommError::Peer {
            rank: self.peer.rank,
            addr: self.peer.addr.clone(),
            what: what.into(),
        }
    }

    /// Names the usual ways a dead peer shows up.
    pub fn io_error(&self, e: &io::Error) -> CommError {
        match e.kind() {
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionAborted => {
                self.error("closed the connection: it exited or was killed")
            }
            _ => self.error(format!("socket error: {e}")),
        }
    }
}

/// Where a collective listener binds, given the host the job is reached at (the controller,
/// `MASTER_ADDR`, or this rank's advertised address): loopback for a single-machine job,
/// else every interface, the listener then advertising the hostname. Binding a hostname
/// itself would listen on loopback where /etc/hosts maps it there (Debian's 127.0.1.1),
/// unreachable from other nodes.
pub fn listen_host(reached_at: &str) -> &'static str {
    let host = reached_at.trim_start_matches('[').trim_end_matches(']');
    if host == "localhost" || host == "::1" || host.starts_with("127.") {
        "127.0.0.1"
    } else {
        "0.0.0.0"
    }
}

/// Binds a listener for peers on `host` (an ephemeral port); returns it with the address
/// peers should dial.
pub fn bind(host: &str) -> Result<(TcpListener, String), CommError> {
    let listener = TcpListener::bind((host, 0)).map_err(|e| {
        CommError::Other(format!(
            "cannot listen for collective peers on {host}: {e} (is {host} an address of this \
             machine?)"
        ))
    })?;
    let port = listener
        .local_addr()
        .map_err(|e| CommError::Other(format!("listener address: {e}")))?
        .port();
    let advertised = match host {
        "0.0.0.0" | "::" | "[::]" => shardrun_protocol::host::hostname(),
        _ => host.to_string(),
    };
    let addr = if advertised.contains(':') && !advertised.starts_with('[') {
        format!("[{advertised}]:{port}")
    } else {
        format!("{advertised}:{port}")
    };
    tracing::debug!(bound = %format!("{host}:{port}"), advertised = addr, "collective listener");
    Ok((listener, addr))
}

fn hello(comm_id: u64, from: usize, to: usize) -> [u8; 32] {
    let mut h = [0u8; 32];
    h[..8].copy_from_slice(HELLO_MAGIC);
    h[8..16].copy_from_slice(&comm_id.to_le_bytes());
    h[16..24].copy_from_slice(&(from as u64).to_le_bytes());
    h[24..32].copy_from_slice(&(to as u64).to_le_bytes());
    h
}

/// Dials `peer` until it answers or `deadline`, then introduces itself.
pub fn dial(peer: &Member, me: usize, comm_id: u64, deadline: Instant) -> Result<Link, CommError> {
    let timeout_error = |last: &str| CommError::Peer {
        rank: peer.rank,
        addr: peer.addr.clone(),
        what: format!("could not be reached before the timeout ({last})"),
    };
    let mut last = String::from("no attempt");
    let mut attempt = 0u64;
    loop {
        attempt += 1;
        let addrs = peer.addr.to_socket_addrs().map_err(|e| CommError::Peer {
            rank: peer.rank,
            addr: peer.addr.clone(),
            what: format!("address does not resolve: {e}"),
        })?;
        for addr in addrs {
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1));
            match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(5))) {
                Ok(mut stream) => {
                    stream
                        .set_write_timeout(Some(Duration::from_secs(10)))
                        .and_then(|()| stream.write_all(&hello(comm_id, me, peer.rank)))
                        .map_err(|e| CommError::Peer {
                            rank: peer.rank,
                            addr: peer.addr.clone(),
                            what: format!("handshake failed: {e}"),
                        })?;
                    let link = Link {
                        stream,
                        peer: peer.clone(),
                    };
                    tune(&link)?;
                    tracing::debug!(peer = peer.rank, %addr, attempt, "connected to peer");
                    return Ok(link);
                }
                Err(e) => last = e.to_string(),
            }
        }
        // The first failure and then every few seconds: a peer that is slow to start
        // should not fill the log.
        if attempt == 1 || attempt.is_multiple_of(100) {
            tracing::debug!(
                peer = peer.rank,
                addr = peer.addr,
                attempt,
                error = last,
                "peer not reachable yet; retrying"
            );
        }
        if Instant::now() >= deadline {
            return Err(timeout_error(&last));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Accepts `peer`'s connection on `listener`; connections that do not introduce themselves
/// as `peer` of this communicator (port scanners, stale jobs) are dropped.
pub fn accept(
    listener: &TcpListener,
    peer: &Member,
    me: usize,
    comm_id: u64,
    deadline: Instant,
) -> Result<Link, CommError> {
    listener
        .set_nonblocking(true)
        .map_err(|e| CommError::Other(format!("listener: {e}")))?;
    let expected = hello(comm_id, peer.rank, me);
    loop {
        match listener.accept() {
            Ok((mut stream, from)) => {
                let mut got = [0u8; 32];
                let ok = stream.set_nonblocking(false).is_ok()
                    && stream
                        .set_read_timeout(Some(Duration::from_secs(5)))
                        .is_ok()
                    && stream.read_exact(&mut got).is_ok()
                    && got == expected;
                if ok {
                    let link = Link {
                        stream,
                        peer: peer.clone(),
                    };
                    tune(&link)?;
                    tracing::debug!(peer = peer.rank, from = %from, "accepted peer");
                    return Ok(link);
                }
                tracing::debug!(from = %from, expected = peer.rank, "dropped a connection that is not the expected peer");
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(CommError::Peer {
                        rank: peer.rank,
                        addr: peer.addr.clone(),
                        what: "did not connect before the timeout".to_string(),
                    });
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(CommError::Other(format!("accepting a peer: {e}"))),
        }
    }
}

/// No Nagle delay, big buffers, non-blocking (the ring loop polls).
fn tune(link: &Link) -> Result<(), CommError> {
    let s = &link.stream;
    let fail = |e: io::Error| link.error(format!("socket setup: {e}"));
    s.set_nodelay(true).map_err(fail)?;
    s.set_read_timeout(None).map_err(fail)?;
    s.set_write_timeout(None).map_err(fail)?;
    for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
        // SAFETY: a valid socket fd and a pointer to a c_int of the size passed.
        let rc = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&SOCKET_BUFFER_BYTES as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(fail(io::Error::last_os_error()));
        }
    }
    s.set_nonblocking(true).map_err(fail)
}

pub fn header(tag: u32, seq: u32, kind: u32, len: u32) -> [u8; HEADER_BYTES] {
    let mut h = [0u8; HEADER_BYTES];
    for (i, v) in [tag, seq, kind, len].into_iter().enumerate() {
        h[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
    }
    h
}

pub fn parse_header(h: &[u8; HEADER_BYTES]) -> [u32; 4] {
    let word = |i: usize| u32::from_le_bytes([h[i * 4], h[i * 4 + 1], h[i * 4 + 2], h[i * 4 + 3]]);
    [word(0), word(1), word(2), word(3)]
}

/// Waits for `fd` to be ready for `events`, up to `timeout`. Returns the revents.
pub fn poll_one(fd: RawFd, events: libc::c_short, timeout: Duration) -> io::Result<libc::c_short> {
    let mut fds = [libc::pollfd {
        fd,
        events,
        revents: 0,
    }];
    poll(&mut fds, timeout)?;
    Ok(fds[0].revents)
}

pub fn poll(fds: &mut [libc::pollfd], timeout: Duration) -> io::Result<usize> {
    let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
    // SAFETY: `fds` is a valid, exclusively borrowed array of pollfd of the length passed.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(rc as usize)
}

/// Reads exactly `buf` from a non-blocking link, or fails at `deadline`.
pub fn read_exact_until(
    link: &mut Link,
    buf: &mut [u8],
    deadline: Instant,
) -> Result<(), CommError> {
    let mut done = 0;
    while done < buf.len() {
        match link.stream.read(&mut buf[done..]) {
            Ok(0) => return Err(link.io_error(&io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(link.error("sent a partial message and went silent"));
                }
                poll_one(link.fd(), libc::POLLIN, left).map_err(|e| link.io_error(&e))?;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(link.io_error(&e)),
        }
    }
    Ok(())
}

/// Best effort: writes `buf` to a non-blocking link until done or `deadline`.
pub fn write_all_until(link: &mut Link, buf: &[u8], deadline: Instant) -> bool {
    let mut done = 0;
    while done < buf.len() {
        match link.stream.write(&buf[done..]) {
            Ok(0) => return false,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() || poll_one(link.fd(), libc::POLLOUT, left).is_err() {
                    return false;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    true
}

pub fn close(link: &Link) {
    let _ = link.stream.shutdown(Shutdown::Both);
}

/// The failure an abort frame carries, so every rank names the rank that actually failed,
/// not just the neighbour that closed on it.
pub fn encode_abort(err: &CommError) -> Vec<u8> {
    let fields: Vec<String> = match err {
        CommError::Peer { rank, addr, what } => {
            vec!["peer".into(), rank.to_string(), addr.clone(), what.clone()]
        }
        CommError::Timeout { rank, secs } => {
            vec!["timeout".into(), rank.to_string(), secs.to_string()]
        }
        other => vec!["other".into(), other.to_string()],
    };
    fields.join("\n").into_bytes()
}

pub fn decode_abort(payload: &[u8], from: &Link) -> CommError {
    let text = String::from_utf8_lossy(payload);
    let fields: Vec<&str> = text.splitn(4, '\n').collect();
    let via = from.peer.rank;
    match fields.as_slice() {
        ["peer", rank, addr, what] => match rank.parse() {
            // The first rank to see the failure says so; those that only pass it on do not.
            Ok(rank) if what.contains("(reported by rank") => CommError::Peer {
                rank,
                addr: addr.to_string(),
                what: what.to_string(),
            },
            Ok(rank) => CommError::Peer {
                rank,
                addr: addr.to_string(),
                what: format!("{what} (reported by rank {via})"),
            },
            Err(_) => from.error(format!("sent a malformed abort: {text}")),
        },
        ["timeout", rank, secs] => match (rank.parse(), secs.parse()) {
            (Ok(rank), Ok(secs)) => CommError::Timeout { rank, secs },
            _ => from.error(format!("sent a malformed abort: {text}")),
        },
        ["other", what] => CommError::Other(format!("rank {via} failed: {what}")),
        _ => from.error(format!("failed: {text}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listeners_bind_loopback_only_for_loopback_jobs() {
        assert_eq!(listen_host("127.0.0.1"), "127.0.0.1");
        assert_eq!(listen_host("localhost"), "127.0.0.1");
        assert_eq!(listen_host("[::1]"), "127.0.0.1");
        assert_eq!(listen_host("gpu-node-7"), "0.0.0.0");
        assert_eq!(listen_host("10.1.2.3"), "0.0.0.0");
    }

    #[test]
    fn strangers_on_the_port_are_dropped_and_the_peer_is_accepted() {
        let (listener, addr) = bind("127.0.0.1").unwrap();
        let me = Member {
            rank: 0,
            addr: addr.clone(),
        };
        let peer = Member {
            rank: 1,
            addr: "127.0.0.1:1".into(),
        };
        let dialer = std::thread::spawn(move || {
            let mut garbage = TcpStream::connect(&addr).unwrap();
            garbage
                .write_all(b"GET / HTTP/1.0\r\n\r\n and more than 32 bytes of it")
                .unwrap();
            let mut wrong_job = TcpStream::connect(&addr).unwrap();
            wrong_job.write_all(&hello(99, 1, 0)).unwrap();
            dial(&me, 1, 7, Instant::now() + Duration::from_secs(10)).map(|_| ())
        });
        let link = accept(
            &listener,
            &peer,
            0,
            7,
            Instant::now() + Duration::from_secs(10),
        );
        assert_eq!(link.unwrap().peer.rank, 1);
        dialer.join().unwrap().unwrap();
    }

    #[test]
    fn accept_times_out_naming_the_peer() {
        let (listener, _) = bind("127.0.0.1").unwrap();
        let peer = Member {
            rank: 3,
            addr: "10.0.0.3:4000".into(),
        };
        let err = accept(
            &listener,
            &peer,
            0,
            0,
            Instant::now() + Duration::from_millis(200),
        )
        .err()
        .unwrap();
        assert!(
            err.to_string().contains("peer rank 3 (10.0.0.3:4000)"),
            "{err}"
        );
    }

    #[test]
    fn abort_messages_round_trip() {
        let (listener, addr) = bind("127.0.0.1").unwrap();
        let stream = TcpStream::connect(&addr).unwrap();
        drop(listener);
        let link = Link {
            stream,
            peer: Member {
                rank: 5,
                addr: addr.clone(),
            },
        };
        let dead = CommError::Peer {
            rank: 2,
            addr: "h:1".into(),
            what: "closed".into(),
        };
        let got = decode_abort(&encode_abort(&dead), &link);
        assert_eq!(
            got.to_string(),
            "peer rank 2 (h:1) closed (reported by rank 5)"
        );
        let timeout = CommError::Timeout { rank: 4, secs: 9 };
        assert_eq!(decode_abort(&encode_abort(&timeout), &link), timeout);
    }
}
