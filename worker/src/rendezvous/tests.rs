//! The standalone rendezvous over real sockets: ranks as threads, rank 0 serving them.

use super::*;
use std::io::{Read, Write};

fn registration(rank: u64, world_size: u64, hash: &str) -> Registration {
    Registration {
        rank,
        local_rank: rank,
        world_size,
        host: "127.0.0.1".into(),
        pid: 1,
        device: "cpu".into(),
        config_hash: hash.into(),
        collective_addr: Some(format!("127.0.0.1:{}", 4000 + rank)),
        nccl_unique_id: (rank == 0).then(|| vec![7; 128]),
        device_error: None,
    }
}

fn config(timeout_ms: u64) -> Standalone {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    Standalone {
        master_addr: "127.0.0.1".into(),
        master_port: port,
        secret: String::new(),
        timeout: Duration::from_millis(timeout_ms),
    }
}

/// Rank 0 serving on a listener that is already bound, so that peers can connect at once.
fn rank_0_on_a_bound_port(
    secret: &str,
    world_size: u64,
) -> (
    Standalone,
    std::thread::JoinHandle<Result<StartInfo, RendezvousError>>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let config = Standalone {
        master_addr: "127.0.0.1".into(),
        master_port: listener.local_addr().unwrap().port(),
        secret: secret.into(),
        timeout: Duration::from_secs(20),
    };
    let c = config.clone();
    let rank_0 =
        std::thread::spawn(move || serve_on(listener, &c, registration(0, world_size, "h")));
    (config, rank_0)
}

/// Reads until the other side hangs up (a close with unread bytes is a reset).
fn closed_without_a_reply(mut stream: TcpStream) {
    let mut reply = Vec::new();
    match stream.read_to_end(&mut reply) {
        Ok(_) => assert!(reply.is_empty(), "{reply:?}"),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset),
    }
}

#[test]
fn every_rank_gets_the_same_start_info() {
    let config = config(20_000);
    let handles: Vec<_> = (0..3)
        .map(|r| {
            let config = config.clone();
            std::thread::spawn(move || rendezvous(&config, registration(r, 3, "h")))
        })
        .collect();
    let starts: Vec<StartInfo> = handles
        .into_iter()
        .map(|h| h.join().unwrap().unwrap())
        .collect();
    assert!(starts.iter().all(|s| s == &starts[0]));
    assert_eq!(
        starts[0].peers[2].collective_addr.as_deref(),
        Some("127.0.0.1:4002")
    );
    assert_eq!(starts[0].nccl_unique_id, Some(vec![7; 128]));
}

#[test]
fn timeout_names_the_missing_ranks() {
    let config = config(1_500);
    let c = config.clone();
    let one = std::thread::spawn(move || rendezvous(&c, registration(1, 4, "h")));
    let err = rendezvous(&config, registration(0, 4, "h")).unwrap_err();
    assert!(err.to_string().contains("[2, 3]"), "{err}");
    assert!(matches!(
        one.join().unwrap(),
        Err(RendezvousError::Rejected(_))
    ));
}

/// Another program on MASTER_PORT: one that never answers, and a web server's reply.
#[test]
fn a_program_on_the_master_port_that_is_not_rank_0_is_named_as_such() {
    for answer in [None, Some(&b"HTTP/1.0 400 Bad request\r\n\r\n"[..])] {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let config = Standalone {
            master_port: listener.local_addr().unwrap().port(),
            ..config(1_500)
        };
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for mut stream in listener.incoming().flatten() {
                let mut request = [0u8; 64];
                let _ = stream.read(&mut request);
                if let Some(answer) = answer {
                    let _ = stream.write_all(answer);
                }
                held.push(stream);
            }
        });
        let err = rendezvous(&config, registration(1, 2, "h")).unwrap_err();
        assert!(
            matches!(err, RendezvousError::NotRankZero { .. })
                && err.to_string().contains(&format!(
                    "no rank 0 answered at 127.0.0.1:{} within 1 s, and the last try reached a \
                     program that is not one",
                    config.master_port
                ))
                && err.to_string().contains("gave no shardrun handshake"),
            "{err}"
        );
    }
}

#[test]
fn a_different_config_is_refused() {
    let config = config(20_000);
    let c = config.clone();
    let one = std::thread::spawn(move || rendezvous(&c, registration(1, 2, "other")));
    let err = rendezvous(&config, registration(0, 2, "h")).unwrap_err();
    let said = "rank 1 on 127.0.0.1 (pid 1) cannot join this job: its config hash other \
                differs from the job's h (a different train_config.json?)";
    assert!(
        matches!(&err, RendezvousError::Rejected(reason) if reason == said),
        "{err}"
    );
    assert!(
        matches!(one.join().unwrap(), Err(RendezvousError::Rejected(reason)) if reason == said)
    );
}

#[test]
fn a_rank_registered_twice_stops_the_rendezvous_for_everyone() {
    let (config, rank_0) = rank_0_on_a_bound_port("", 3);
    let c = config.clone();
    let first = std::thread::spawn(move || rendezvous(&c, registration(1, 3, "h")));
    let again = rendezvous(&config, registration(1, 3, "h")).unwrap_err();
    let first = first.join().unwrap().unwrap_err();
    let rank_0 = rank_0.join().unwrap().unwrap_err();
    for err in [&again, &first, &rank_0] {
        assert!(
            matches!(err, RendezvousError::Rejected(reason)
                if reason.contains("rank 1 already registered from 127.0.0.1 pid 1")),
            "{err}"
        );
    }
}

#[test]
fn strangers_are_refused_and_the_ranks_still_meet() {
    let (config, rank_0) = rank_0_on_a_bound_port("s3cret", 3);
    let master = config.master();
    // Sends nothing while the ranks meet: handshakes run side by side.
    let silent = TcpStream::connect(&master).unwrap();
    // Garbage, and a frame too large for a hello: no reply, the connection is closed.
    for bytes in [&b"GET / HTTP/1.1\r\n\r\n"[..], &(1u32 << 30).to_be_bytes()] {
        let mut stranger = TcpStream::connect(&master).unwrap();
        stranger.write_all(bytes).unwrap();
        closed_without_a_reply(stranger);
    }
    // A hello with the wrong secret is told why.
    let wrong = BlockingConnection::connect(&master, Role::Worker, "nope", HANDSHAKE_TIMEOUT)
        .err()
        .unwrap();
    assert!(
        matches!(&wrong, ConnectionError::Rejected(reason) if reason.contains("wrong secret")),
        "{wrong}"
    );
    // So is a rank started with another secret.
    let other_secret = Standalone {
        secret: "another".into(),
        ..config.clone()
    };
    let refused = rendezvous(&other_secret, registration(2, 3, "h")).unwrap_err();
    assert!(
        matches!(&refused, RendezvousError::Refused { reason, .. } if reason.contains("wrong secret")),
        "{refused}"
    );
    assert!(refused.to_string().contains(env::SECRET), "{refused}");
    // A client with the secret that does not register.
    let mut client =
        BlockingConnection::connect(&master, Role::Client, "s3cret", HANDSHAKE_TIMEOUT).unwrap();
    assert!(matches!(
        client.recv::<ToWorker>(),
        Err(ConnectionError::Closed)
    ));
    // A rank's hello followed by something else than its registration.
    let mut chatty =
        BlockingConnection::connect(&master, Role::Worker, "s3cret", HANDSHAKE_TIMEOUT).unwrap();
    chatty
        .send(&FromWorker::Heartbeat {
            step: 0,
            work: 0,
            collectives: 0,
        })
        .unwrap();
    assert!(matches!(
        chatty.recv::<ToWorker>(),
        Err(ConnectionError::Closed)
    ));

    let ranks: Vec<_> = (1..3)
        .map(|r| {
            let config = config.clone();
            std::thread::spawn(move || rendezvous(&config, registration(r, 3, "h")))
        })
        .collect();
    let start = rank_0.join().unwrap().unwrap();
    for rank in ranks {
        assert_eq!(rank.join().unwrap().unwrap(), start);
    }
    assert_eq!(start.peers.len(), 3);
    drop(silent);
}

/// The rank's side of the standalone rendezvous is a controller's worker: the controller's
/// own acceptor reads its hello and registration and starts it.
#[tokio::test]
async fn a_rank_speaks_the_controllers_wire() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = Standalone {
        master_addr: "127.0.0.1".into(),
        master_port: listener.local_addr().unwrap().port(),
        secret: "s3cret".into(),
        timeout: Duration::from_secs(20),
    };
    let me = registration(1, 2, "h");
    let sent = me.clone();
    let rank = std::thread::spawn(move || rendezvous(&config, sent));
    let (stream, _) = listener.accept().await.unwrap();
    let (role, mut rx, mut tx) =
        connection::accept::<FromWorker, ToWorker>(stream, "s3cret", HANDSHAKE_TIMEOUT)
            .await
            .unwrap();
    assert_eq!(role, Role::Worker);
    assert_eq!(rx.recv().await.unwrap(), Some(FromWorker::Register(me)));
    let mut roster = Roster::new(2, "h");
    roster.admit(registration(0, 2, "h")).unwrap();
    roster.admit(registration(1, 2, "h")).unwrap();
    let start = roster.start_info().unwrap();
    tx.send(&ToWorker::Start(start.clone())).await.unwrap();
    assert_eq!(rank.join().unwrap().unwrap(), start);
}

#[test]
fn under_torchrun_rank_0_serves_on_the_port_after_its_agents_store() {
    let table = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            pairs
                .iter()
                .find(|(name, _)| *name == k)
                .map(|(_, v)| v.to_string())
        }
    };
    let port = |pairs| {
        Standalone::from_lookup(table(pairs), Duration::from_secs(1))
            .unwrap()
            .unwrap()
            .master_port
    };
    let by_hand: &[(&str, &str)] = &[("MASTER_ADDR", "10.0.0.1"), ("MASTER_PORT", "29500")];
    assert_eq!(port(by_hand), 29500);
    let torchrun: &[(&str, &str)] = &[
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "29500"),
        ("TORCHELASTIC_USE_AGENT_STORE", "True"),
    ];
    assert_eq!(port(torchrun), 29501);
    let last: &[(&str, &str)] = &[
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "65535"),
        ("TORCHELASTIC_USE_AGENT_STORE", "True"),
    ];
    let err = Standalone::from_lookup(table(last), Duration::from_secs(1)).unwrap_err();
    assert!(err.to_string().contains("lower --master-port"), "{err}");
}
