//! Harness for end-to-end tests: locate the built binaries, give each test its own temp
//! directory, run commands with deadlines, poll files, and kill whole process groups.
//!
//! The binaries are the release builds next to the test executable
//! (`$CARGO_TARGET_DIR/release/`): build them first with
//! `cargo build --release -p shardrun -p shardrun-worker`.

use anyhow::{bail, Context};
use std::ffi::OsStr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The workspace root (for `slurm/`, `examples/`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// `$CARGO_TARGET_DIR/release`: the test executable lives in its `deps/`.
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("test executable folder");
    if deps.file_name() == Some(OsStr::new("deps")) {
        deps.parent().expect("target profile folder").to_path_buf()
    } else {
        deps.to_path_buf()
    }
}

/// Path of a built binary, or a panic that says how to build it.
pub fn binary(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.is_file(),
        "{} is not built; run `cargo build --release -p shardrun -p shardrun-worker` first",
        path.display()
    );
    path
}

pub fn shardrun() -> PathBuf {
    binary("shardrun")
}

/// A command for `program` that reads files as any user does: root goes without the
/// capabilities that let it read any file (through `setpriv`, from util-linux); another user
/// runs `program` itself.
pub fn without_root_read_bypass(program: impl AsRef<OsStr>) -> Command {
    // SAFETY: geteuid only reads this process's credentials.
    if unsafe { libc::geteuid() } != 0 {
        return Command::new(program);
    }
    let caps = "-dac_override,-dac_read_search";
    let mut cmd = Command::new("setpriv");
    cmd.args([
        format!("--inh-caps={caps}"),
        format!("--bounding-set={caps}"),
    ])
    .arg(program);
    cmd
}

/// A temporary directory per test, removed at the end (kept with `SHARDRUN_KEEP_TEST_DIRS=1`).
pub struct TestDir {
    dir: tempfile::TempDir,
}

impl TestDir {
    pub fn new(name: &str) -> TestDir {
        let dir = tempfile::Builder::new()
            .prefix(&format!("shardrun-{name}-"))
            .tempdir()
            .expect("create temp dir");
        TestDir { dir }
    }
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
    pub fn join(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.dir.path().join(rel)
    }
    /// Write a file relative to the test directory; returns its path.
    pub fn write(&self, rel: &str, text: &str) -> PathBuf {
        let path = self.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("create parent");
        }
        std::fs::write(&path, text).expect("write test file");
        path
    }
    /// The modification time of a file relative to the test directory.
    pub fn modified(&self, rel: &str) -> std::time::SystemTime {
        std::fs::metadata(self.join(rel))
            .and_then(|m| m.modified())
            .expect("modification time")
    }
    /// Rewrites a file relative to the test directory with `text`, modified at `modified`
    /// (as a copy that keeps times would): `text` of the size the file had at that time
    /// looks as it was, and only its contents tell it changed.
    pub fn rewrite_keeping_time(&self, rel: &str, text: &str, modified: std::time::SystemTime) {
        let path = self.write(rel, text);
        std::fs::File::options()
            .write(true)
            .open(&path)
            .and_then(|file| file.set_modified(modified))
            .expect("set the modification time");
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        if std::env::var_os("SHARDRUN_KEEP_TEST_DIRS").is_some() {
            let kept =
                std::mem::replace(&mut self.dir, tempfile::tempdir().expect("temp dir")).keep();
            eprintln!("kept test directory {}", kept.display());
        }
    }
}

/// A child in its own process group, killed with the whole group when dropped.
pub struct GroupChild {
    pub child: Child,
}

impl GroupChild {
    pub fn spawn(cmd: &mut Command) -> anyhow::Result<GroupChild> {
        let child = cmd
            .process_group(0)
            .spawn()
            .with_context(|| format!("spawning {cmd:?}"))?;
        Ok(GroupChild { child })
    }

    pub fn kill_group(&mut self) {
        // The child leads its group, so -pid names the group.
        let pid = self.child.id() as i32;
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
        let _ = self.child.wait();
    }
}

impl Drop for GroupChild {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.kill_group();
        }
    }
}

/// `shardrun <args>` run in `dir` to completion, with a deadline (past it, the test fails).
pub fn shardrun_in(dir: &Path, args: &[&str], deadline: Duration) -> Output {
    run_with_deadline(
        Command::new(shardrun()).current_dir(dir).args(args),
        deadline,
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// Run a command to completion with a deadline; past it the process group is killed and
/// this is an error. Output is captured.
pub fn run_with_deadline(cmd: &mut Command, deadline: Duration) -> anyhow::Result<Output> {
    let description = format!("{cmd:?}");
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = GroupChild::spawn(cmd)?;
    let pipes = PipeReader::start(&mut child.child);
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.child.try_wait()? {
            break status;
        }
        if start.elapsed() > deadline {
            child.kill_group();
            bail!("{description} did not finish within {deadline:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (stdout, stderr) = pipes.join();
    Ok(Output {
        status,
        stdout,
        stderr,
    })
}

/// Reads a child's piped stdout and stderr (those not taken yet) on threads, so that a
/// chatty child cannot block on a full pipe.
pub struct PipeReader {
    stdout: Option<std::thread::JoinHandle<Vec<u8>>>,
    stderr: Option<std::thread::JoinHandle<Vec<u8>>>,
}

impl PipeReader {
    pub fn start(child: &mut Child) -> PipeReader {
        fn read_all(
            mut pipe: impl std::io::Read + Send + 'static,
        ) -> std::thread::JoinHandle<Vec<u8>> {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let _ = pipe.read_to_end(&mut buf);
                buf
            })
        }
        PipeReader {
            stdout: child.stdout.take().map(read_all),
            stderr: child.stderr.take().map(read_all),
        }
    }

    /// What the child wrote to (stdout, stderr), once it has closed them.
    pub fn join(self) -> (Vec<u8>, Vec<u8>) {
        let read = |handle: Option<std::thread::JoinHandle<Vec<u8>>>| {
            handle
                .map(|h| h.join().unwrap_or_default())
                .unwrap_or_default()
        };
        (read(self.stdout), read(self.stderr))
    }
}

/// Poll `probe` until it returns `Some`, or fail after `deadline` naming `what`.
pub fn wait_for<T>(
    what: &str,
    deadline: Duration,
    mut probe: impl FnMut() -> Option<T>,
) -> anyhow::Result<T> {
    let start = Instant::now();
    loop {
        if let Some(value) = probe() {
            return Ok(value);
        }
        if start.elapsed() > deadline {
            bail!("timed out after {deadline:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Wait until `path` exists and its contents satisfy `pred`; returns the contents.
pub fn wait_for_file(
    path: &Path,
    deadline: Duration,
    pred: impl Fn(&str) -> bool,
) -> anyhow::Result<String> {
    wait_for(&format!("{}", path.display()), deadline, || {
        std::fs::read_to_string(path).ok().filter(|text| pred(text))
    })
}

pub fn stdout_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn stderr_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A Slurm cluster of `slurm/start.sh` that the tests start, named in the one list of test
/// clusters (`slurm/test-clusters.txt`, or `$SHARDRUN_TEST_CLUSTERS`) that `scripts/test.sh`
/// also reads to stop every one of them when it exits. Starting is idempotent and a cluster is
/// left running for the next test binary.
pub struct SlurmCluster {
    pub name: String,
    pub state_dir: PathBuf,
}

impl SlurmCluster {
    /// The single-node cluster (`default`; `SHARDRUN_SLURM_DIR` and `SHARDRUN_SLURM_PORT`
    /// move it).
    pub fn start() -> anyhow::Result<SlurmCluster> {
        Self::start_named("default")
    }

    /// A cluster with slurmdbd + MariaDB (so `sacct` works, and `sacctmgr` limits apply), in
    /// its own state folder and on its own ports so it runs beside the default one.
    pub fn start_with_accounting() -> anyhow::Result<SlurmCluster> {
        Self::start_named("accounting")
    }

    /// A cluster of two nodes: this host (`<host>`) and a network + UTS namespace behind a
    /// veth pair (`<host>-n2`), in its own state folder and on its own ports. Jobs spanning
    /// both cross two real network stacks, as on two machines (`slurm/start.sh --nodes 2`).
    pub fn start_two_nodes() -> anyhow::Result<SlurmCluster> {
        Self::start_named("two-nodes")
    }

    /// A single-node cluster whose `MaxArraySize` is 10 (array indices 0-9), as a site with
    /// small limits: sweeps must split into several arrays.
    pub fn start_small_arrays() -> anyhow::Result<SlurmCluster> {
        Self::start_named("small-arrays")
    }

    /// Start the cluster `name` of the list (`slurm/test-clusters.sh start NAME`).
    pub fn start_named(name: &str) -> anyhow::Result<SlurmCluster> {
        let script = repo_root().join("slurm/test-clusters.sh");
        let output = run_with_deadline(
            Command::new(&script).args(["start", name]),
            Duration::from_secs(600),
        )?;
        if !output.status.success() {
            bail!(
                "{} start {name} failed:\n{}{}",
                script.display(),
                stdout_of(&output),
                stderr_of(&output)
            );
        }
        let state_dir = stdout_of(&output)
            .lines()
            .last()
            .map(|l| PathBuf::from(l.trim()))
            .filter(|p| p.is_absolute())
            .with_context(|| {
                format!("{} start {name} printed no state folder", script.display())
            })?;
        Ok(SlurmCluster {
            name: name.to_string(),
            state_dir,
        })
    }

    pub fn slurm_conf(&self) -> PathBuf {
        self.state_dir.join("etc/slurm.conf")
    }

    /// A command that talks to this cluster.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new(program);
        cmd.env("SLURM_CONF", self.slurm_conf());
        cmd
    }

    /// `shardrun <args>` against this cluster, run in `cwd`, with a deadline.
    pub fn shardrun(&self, cwd: &Path, args: &[&str]) -> anyhow::Result<Output> {
        self.shardrun_with_env(cwd, args, &[])
    }

    /// [`Self::shardrun`] with extra environment (`sbatch` passes it on to the job).
    pub fn shardrun_with_env(
        &self,
        cwd: &Path,
        args: &[&str],
        envs: &[(&str, String)],
    ) -> anyhow::Result<Output> {
        let mut cmd = self.command(shardrun());
        cmd.current_dir(cwd)
            .args(args)
            .envs(envs.iter().map(|(k, v)| (*k, v.as_str())));
        run_with_deadline(&mut cmd, Duration::from_secs(60))
    }

    /// Waits until Slurm no longer lists job `job_id` (a test that ends before its job does
    /// would have the job write into the test's removed folder, leaving it behind).
    pub fn wait_until_gone(&self, job_id: &str, deadline: Duration) {
        wait_for("the Slurm job to leave the queue", deadline, || {
            let out = run_with_deadline(
                self.command("squeue")
                    .args(["--noheader", "--format=%i", "--jobs", job_id]),
                Duration::from_secs(30),
            )
            .ok()?;
            // squeue refuses a job id it has forgotten: gone too.
            let listed =
                out.status.success() && !String::from_utf8_lossy(&out.stdout).trim().is_empty();
            (!listed).then_some(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
    }

    /// `shardrun submit <args>` against this cluster, run in `cwd`, which must succeed and
    /// submit a job: what it printed. Otherwise it panics with submit's stderr and stdout, so
    /// a test fails at the submit that went wrong rather than later, waiting for a job.
    pub fn submit(&self, cwd: &Path, args: &[&str]) -> Submitted {
        self.submit_with_env(cwd, args, &[])
    }

    /// [`Self::submit`] with extra environment (`sbatch` passes it on to the job).
    pub fn submit_with_env(&self, cwd: &Path, args: &[&str], envs: &[(&str, String)]) -> Submitted {
        let command = [&["submit"], args].concat();
        let out = self
            .shardrun_with_env(cwd, &command, envs)
            .unwrap_or_else(|e| panic!("{e:#}"));
        let (stdout, stderr) = (stdout_of(&out), stderr_of(&out));
        let shown = command.join(" ");
        assert!(
            out.status.success(),
            "shardrun {shown} failed ({}):\n{stderr}{stdout}",
            out.status
        );
        let job_id = submitted_job_id(&stdout)
            .unwrap_or_else(|| panic!("shardrun {shown} printed no job id:\n{stderr}{stdout}"));
        Submitted { stdout, job_id }
    }
}

/// What a successful `shardrun submit` printed.
pub struct Submitted {
    /// All of its stdout: the "Submitted" line, the run directory, how to follow the job.
    pub stdout: String,
    /// The Slurm job id it submitted.
    pub job_id: String,
}

/// This machine's hostname, read as the controller and workers read it to advertise it.
pub use shardrun_protocol::host::hostname;

/// Parse the Slurm job id out of `shardrun submit`'s "Submitted <name> as Slurm job <id>".
pub fn submitted_job_id(stdout: &str) -> Option<String> {
    stdout.lines().find_map(|l| {
        l.split(" as Slurm job ")
            .nth(1)
            .map(|id| id.trim().to_string())
    })
}

/// The runs of `shardrun status --json`'s document (empty when it does not parse).
pub fn status_runs(document: &str) -> Vec<serde_json::Value> {
    serde_json::from_str::<serde_json::Value>(document)
        .ok()
        .and_then(|v| v["runs"].as_array().cloned())
        .unwrap_or_default()
}

/// `shardrun status --json` → (name, state) pairs.
pub fn states(document: &str) -> Vec<(String, String)> {
    status_runs(document)
        .iter()
        .map(|v| {
            (
                v["name"].as_str().unwrap_or("").to_string(),
                v["state"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

pub mod figure;
pub mod jobs;
