//! 1,000 hostile connections against a running job: random bytes, truncated frames, a 1 GiB
//! length prefix, a wrong secret, a wrong version, silence. The job finishes as if nothing
//! happened, and the controller's memory stays bounded.

use shardrun_e2e::jobs::*;
use shardrun_e2e::*;
use shardrun_protocol::connection::encode_frame;
use shardrun_protocol::messages::{Hello, Role};
use shardrun_protocol::PROTOCOL_VERSION;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

fn hello(secret: &str, version: u32) -> Vec<u8> {
    encode_frame(&Hello {
        magic: Hello::MAGIC.into(),
        version,
        role: Role::Worker,
        secret: secret.into(),
    })
    .unwrap()
}

/// One hostile connection of kind `i % 7`; whether it got through to the controller.
fn attack(addr: &str, i: u64) -> bool {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    let payload: Vec<u8> = match i % 7 {
        // Random bytes (an LCG is random enough for garbage).
        0 => (0..512u64)
            .map(|k| ((k * 6364136223846793005 + i * 1442695040888963407) >> 33) as u8)
            .collect(),
        // Truncated frame: announces 100 bytes, sends 10, hangs up.
        1 => [&100u32.to_be_bytes()[..], b"{\"magic\":"].concat(),
        // 1 GiB length prefix.
        2 => [&(1u32 << 30).to_be_bytes()[..], b"xxxxxxxx"].concat(),
        3 => hello("not-the-secret", PROTOCOL_VERSION),
        4 => hello("not-the-secret", PROTOCOL_VERSION + 7),
        // A well-formed frame that is not a hello.
        5 => encode_frame(&serde_json::json!({"Log": {"text": "hi"}})).unwrap(),
        // Nothing at all (the handshake timeout handles it); close soon.
        _ => Vec::new(),
    };
    let _ = s.write_all(&payload);
    let mut sink = [0u8; 256];
    let _ = s.read(&mut sink);
    true
}

#[test]
fn hostile_connections_do_not_disturb_the_job() {
    let dir = TestDir::new("hostile");
    let steps = 500u64;
    let spec = dir.write("tiny.yaml", &tiny_mlp_spec("hostile", steps, 2));
    let envs = [
        ("SHARDRUN_WORKER_BIN", simrank()),
        ("SIMRANK_STEP_MS", "30".to_string()),
        ("SIMRANK_LINES_PER_STEP", "5".to_string()),
    ];
    let (mut job, run) = spawn_local_run(&dir, &spec, &["--nproc", "2"], &envs, |_| {});
    let controller_pid = job.child.id();
    let addr = wait_for_file(&run.join("controller.addr"), Duration::from_secs(30), |t| {
        t.ends_with('\n')
    })
    .unwrap()
    .trim()
    .to_string();
    wait_for("the job to start", Duration::from_secs(30), || {
        (!metric_steps(&run, 0).is_empty()).then_some(())
    })
    .unwrap();
    let baseline = rss_kib(controller_pid).expect("controller RSS");

    let mut peak = baseline;
    let attackers: Vec<_> = (0..8u64)
        .map(|t| {
            let addr = addr.clone();
            std::thread::spawn(move || (0..125u64).filter(|k| attack(&addr, t * 125 + k)).count())
        })
        .collect();
    while attackers.iter().any(|a| !a.is_finished()) {
        peak = peak.max(rss_kib(controller_pid).unwrap_or(0));
        std::thread::sleep(Duration::from_millis(20));
    }
    let connected: usize = attackers.into_iter().map(|a| a.join().unwrap()).sum();
    // The job trains for about 15 s, twice as long as the attack takes: nearly all of them
    // reached the controller.
    assert!(
        connected >= 900,
        "only {connected} of 1,000 attacks connected"
    );

    let (status, stdout) = finish(&mut job, &run, Duration::from_secs(60));
    assert!(status.success(), "{stdout}");
    assert_eq!(result_json(&run)["status"], "succeeded");
    for rank in 0..2 {
        assert_eq!(metric_steps(&run, rank), (1..=steps).collect::<Vec<_>>());
    }
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    assert!(
        log.contains("refused a connection"),
        "rejections are logged"
    );
    assert!(log.contains("more connection(s)"), "and summarised");
    // The last count, however the flood ended between two counts, is of every connection.
    let in_all = log.lines().rev().find_map(|line| {
        line.split(" in all")
            .next()?
            .rsplit('(')
            .next()?
            .parse()
            .ok()
    });
    assert_eq!(in_all, Some(connected), "{log}");
    assert!(
        log.lines().count() < 2 * (steps as usize * 6) + 100,
        "rejections do not flood train.log"
    );
    // Bounded: 256 pending handshakes × 4 KiB plus task overhead is far below this.
    let growth_mib = (peak.saturating_sub(baseline)) / 1024;
    assert!(
        growth_mib < 64,
        "controller RSS grew by {growth_mib} MiB under attack (baseline {} MiB)",
        baseline / 1024
    );
}
