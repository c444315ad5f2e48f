//! `shardrun-worker`: one rank of an FSDP training job.
//!
//! ```text
//! shardrun-worker [--config FILE] [--metrics-file F] [--dump-params F] [--reference]
//! shardrun-worker --check-gpu
//! ```
//!
//! The config comes from `--config` or `SHARDRUN_CONFIG`; the rank from the controller, Slurm
//! or torchrun variables ([`launch::RankEnv`]). The world is joined through the controller
//! when `SHARDRUN_CONTROLLER` is set, else through `MASTER_ADDR`/`MASTER_PORT`, else it is
//! this process alone.

use anyhow::{Context, Result};
use clap::Parser;
use shardrun_protocol::config::DeviceKind;
use shardrun_protocol::config::TrainConfig;
use shardrun_protocol::messages::{Registration, StopReason};
use shardrun_protocol::{env, error_text};
use shardrun_worker::checkpointing::{Agreed, Checkpointer, CheckpointingError};
use shardrun_worker::collectives::cpu::transport::listen_host;
use shardrun_worker::collectives::{nccl, prepare, CommError, Comms};
use shardrun_worker::controller_client::{self, ClientError, ClientOptions, ControllerClient};
use shardrun_worker::fsdp::{FsdpError, ProcessGroups};
use shardrun_worker::launch::RankEnv;
use shardrun_worker::report::{Reporter, StdoutReporter};
use shardrun_worker::train::{CheckpointHook, TrainError, Trainer};
use shardrun_worker::{
    device, diagnostics, fail_fast, locked_memory, params_file, reference, stop, world,
};
use std::path::PathBuf;
use std::sync::Arc;

// jemalloc for the whole process (unprefixed `malloc`, so libtorch's tensors use it too).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's built-in options (`MALLOC_CONF` in the environment still overrides them).
/// Freed pages are kept for reuse, never returned to the OS: every step frees and allocates
/// the same tensor sizes again, and with glibc (or jemalloc's default decay) each of those
/// pages came back as a page fault plus zeroing, 12-24% of a CPU step. RSS stays at the
/// step's high-water mark instead of dropping between steps.
#[allow(non_upper_case_globals)]
#[no_mangle]
pub static malloc_conf: &u8 = &b"dirty_decay_ms:-1,muzzy_decay_ms:-1\0"[0];

/// Overrides the fp16 loss scaler's initial scale (GradScaler's `init_scale`, 2^16).
const FP16_INITIAL_SCALE: &str = "SHARDRUN_FP16_INITIAL_SCALE";

#[derive(Debug, Parser)]
#[command(
    name = "shardrun-worker",
    version,
    about = "One rank of a shardrun FSDP training job."
)]
struct Args {
    /// Resolved training config (JSON, as the orchestrator writes `train_config.json`).
    #[arg(long, env = env::CONFIG_FILE, required_unless_present = "check_gpu")]
    config: Option<PathBuf>,
    /// Append one JSON metrics record per logged step to this file (standalone runs).
    #[arg(long)]
    metrics_file: Option<PathBuf>,
    /// After training, write the final unsharded parameters (fp32 safetensors) here (rank 0).
    #[arg(long)]
    dump_params: Option<PathBuf>,
    /// Train the unsharded model in this one process instead (the equivalence ground truth).
    #[arg(long)]
    reference: bool,
    /// Report what a GPU run of this rank would use (its device, the CUDA runtime, NCCL) and
    /// exit: 0 when everything is usable.
    #[arg(long)]
    check_gpu: bool,
}

/// An error and its causes in one line, each said once.
fn said_once(error: &(dyn std::error::Error + 'static)) -> String {
    error_text::join_causes(error_text::chain(error))
}

/// The other rank a failure follows from, when a collective error in its causes names one
/// (transparent wrappers hide their inner error from `source`: each is asked).
fn peer_at_fault(error: &(dyn std::error::Error + 'static)) -> Option<usize> {
    error_text::chain(error).find_map(|cause| {
        cause
            .downcast_ref::<TrainError>()
            .and_then(TrainError::peer_at_fault)
            .or_else(|| cause.downcast_ref::<CheckpointingError>()?.peer_at_fault())
            .or_else(|| cause.downcast_ref::<FsdpError>()?.peer_at_fault())
            .or_else(|| cause.downcast_ref::<CommError>()?.peer_at_fault())
    })
}

fn main() {
    fail_fast::install_panic_hook();
    let code = match run() {
        // 0 unless stopped on request: the status says by what (see `StopReason::exit_code`).
        Ok(code) => code,
        Err(error) => {
            eprintln!("shardrun-worker: error: {}", said_once(&*error));
            fail_fast::EXIT_FAILED
        }
    };
    exit_past_library_destructors(code)
}

/// Ends the process once `run` has dropped what it made (files closed, the controller told,
/// communicators left), without the linked C++ libraries' exit-time destructors: they grew
/// a CPU rank's resident memory by 40-110 MiB past the peak its summary reported (a 5 M
/// model, 2 ranks), which `sacct`'s MaxRSS and a cgroup's memory limit would count, and
/// do nothing a finished rank needs.
fn exit_past_library_destructors(code: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: fflush(NULL) flushes every C stdio stream (NCCL_DEBUG writes to C's stdout,
    // fully buffered in a pipe); _exit then ends the process at once. What `run` made is
    // dropped; the failure reporter kept for panics holds no buffer.
    unsafe {
        libc::fflush(std::ptr::null_mut());
        libc::_exit(code)
    }
}

/// Trains; `Ok` with the exit status (0 unless stopped on request).
fn run() -> Result<i32> {
    let args = Args::parse();
    if args.check_gpu {
        device::check_gpu(RankEnv::from_env()?.local_rank).map_err(anyhow::Error::msg)?;
        return Ok(0);
    }
    let config = load_config(args.config.as_deref().unwrap_or(std::path::Path::new("")))?;
    tch::set_num_threads(i32::try_from(config.threads_per_rank.max(1)).unwrap_or(1));
    let rank_env = RankEnv::from_env()?;
    diagnostics::init(rank_env.rank);
    // Every diagnostic of this process names its rank, job and Slurm job.
    let _rank_span = tracing::info_span!(
        "rank",
        rank = rank_env.rank,
        job = config.name,
        slurm_job = std::env::var("SLURM_JOB_ID").ok().as_deref().unwrap_or("-"),
    )
    .entered();
    tracing::debug!(
        world_size = rank_env.world_size,
        local_rank = rank_env.local_rank,
        pid = std::process::id(),
        "starting"
    );

    if args.reference {
        let reporter = StdoutReporter::new(0, args.metrics_file.clone())
            .context("cannot open the metrics file")?;
        let params = reference::train_reference(&config, &reporter)?;
        if let Some(path) = &args.dump_params {
            params_file::write(path, &params)?;
        }
        return Ok(0);
    }

    // From here SIGINT and SIGTERM stop the ranks together at a step boundary (SIGTERM to a
    // Slurm task after a checkpoint), and SIGUSR2 checkpoints first.
    stop::install_signal_handlers(stop::Sigterm::from_env())
        .context("cannot install the SIGINT/SIGTERM/SIGUSR2 handlers")?;
    let Joined {
        reporter,
        comms,
        controller,
    } = connect_world(&config, &rank_env, &args)?;
    let result = train(
        config,
        comms,
        reporter,
        &rank_env,
        &args,
        controller.as_deref(),
    );
    if let (Some(controller), Err(error)) = (&controller, &result) {
        if controller.failed(&said_once(&**error), peer_at_fault(&**error)) {
            // The controller logs it for this rank: one line, not a second copy on stderr.
            return Ok(1);
        }
    }
    result
}

/// Trains to the end, to a preemption or to an agreed stop; returns the exit status.
fn train(
    config: TrainConfig,
    comms: Comms,
    reporter: Arc<dyn Reporter>,
    rank_env: &RankEnv,
    args: &Args,
    controller: Option<&ControllerClient>,
) -> Result<i32> {
    if config.device == DeviceKind::Cuda && rank_env.rank == 0 && rank_env.world_size > 1 {
        if let Ok(nccl) = nccl::library::load() {
            reporter.log(
                shardrun_protocol::messages::LogLevel::Info,
                &nccl.to_string(),
            );
        }
    }
    let groups =
        ProcessGroups::for_strategy(comms, config.fsdp.strategy, config.fsdp.shard_group_size)?;
    // The checkpoint to load is agreed before the model is built: one that holds every
    // parameter spares reading (or even having) a pretrained folder's weights.
    let mut checkpointer = Checkpointer::from_config(&config);
    let agreed = match &checkpointer {
        Some(checkpointer) => Some(
            checkpointer
                .agree(groups.control.as_ref(), reporter.as_ref())
                .with_context(|| format!("restoring from {}", checkpointer.root().display()))?,
        ),
        None => None,
    };
    let source = agreed.as_ref().and_then(Agreed::param_source);
    let mut trainer = Trainer::starting_from(config, groups, reporter, source)?;
    if let Ok(scale) = std::env::var(FP16_INITIAL_SCALE) {
        let scale: f64 = scale
            .parse()
            .ok()
            .filter(|s: &f64| s.is_finite() && *s > 0.0)
            .with_context(|| format!("{FP16_INITIAL_SCALE}={scale:?} is not a positive number"))?;
        trainer.set_initial_loss_scale(scale);
    }
    if let (Some(checkpointer), Some(agreed)) = (checkpointer.as_mut(), agreed) {
        // Named by the checkpoint agreed on: `checkpoint.from`'s is not under the run's root.
        let from = agreed
            .dir()
            .unwrap_or(checkpointer.root())
            .display()
            .to_string();
        let restored = checkpointer
            .load(agreed, &mut trainer)
            .with_context(|| format!("restoring from {from}"))?;
        if let Some(restored) = restored.filter(|r| !r.weights_only && rank_env.rank == 0) {
            trainer
                .reporter()
                .resumed(restored.step, &restored.dir.display().to_string());
        }
    }
    // A failure mid-training leaves peers inside collectives with this rank: report and
    // exit without tearing anything down (see fail_fast).
    let outcome = trainer
        .run(checkpointer.as_mut().map(|c| c as &mut dyn CheckpointHook))
        .unwrap_or_else(|error| {
            fail_fast::fail_because_of(&said_once(&error), peer_at_fault(&error))
        });
    if let Some(path) = &args.dump_params {
        // Every rank takes part in the gathers; rank 0 writes.
        let params = trainer.engine().full_parameters()?;
        if rank_env.rank == 0 {
            params_file::write(path, &params)?;
        }
    }
    // Under the controller, the last message says how this rank ended. It goes before the
    // barrier: once one rank exits non-zero, srun kills the others (--kill-on-bad-exit),
    // and their last message must already be out.
    if let Some(controller) = controller {
        match &outcome.stopped {
            Some(cause) => controller.stopped(outcome.step, cause),
            None => controller.finished(outcome.preempted),
        }
    }
    // Leave together: no rank closes its sockets while a peer may still be inside the last
    // collective; then (and only then) NCCL communicators are destroyed.
    trainer.engine().groups().leave_together()?;
    Ok(outcome.stopped.as_ref().map_or(0, StopReason::exit_code))
}

fn load_config(path: &std::path::Path) -> Result<TrainConfig> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!(
            "cannot read the config {}: pass --config or set {}",
            path.display(),
            env::CONFIG_FILE
        )
    })?;
    serde_json::from_str(&text)
        .with_context(|| format!("{} is not a valid resolved training config", path.display()))
}

/// Joins the job's world: where reports go, and the world communicator.
///
/// Under a controller (`SHARDRUN_CONTROLLER`), the controller client registers (sending
/// `PendingComms::collective_addr` / `nccl_unique_id`), receives the `StartInfo`, and is the
/// `Reporter`; otherwise reports go to stderr and the metrics file.
fn connect_world(config: &TrainConfig, rank_env: &RankEnv, args: &Args) -> Result<Joined> {
    // This rank's GPU becomes the current device before anything touches CUDA or NCCL.
    let device = match config.device {
        DeviceKind::Cpu => Ok("cpu".to_string()),
        DeviceKind::Cuda => device::select_cuda(rank_env.local_rank).map(|d| d.to_string()),
    };
    if config.device == DeviceKind::Cuda {
        // Every rank raises its own limit; the first of each node says when it stays low,
        // where it matters: between nodes.
        let low = locked_memory::raise();
        let nodes: u64 = std::env::var("SLURM_STEP_NUM_NODES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(1);
        if let Some(warning) = low.filter(|_| nodes > 1 && rank_env.local_rank == 0) {
            eprintln!("shardrun-worker: warning: {warning}");
        }
    }
    if std::env::var_os(env::CONTROLLER_ADDR).is_some() {
        let (client, comms) = join_through_controller(config, rank_env, device)?;
        let report = client.clone();
        fail_fast::report_to(move |error, peer| {
            report.failed(error, peer);
        });
        return Ok(Joined {
            reporter: client.clone(),
            comms,
            controller: Some(client),
        });
    }
    let device = device.map_err(anyhow::Error::msg)?;
    let reporter: Arc<dyn Reporter> = Arc::new(
        StdoutReporter::new(rank_env.rank, args.metrics_file.clone())
            .context("cannot open the metrics file")?,
    );
    let comms = world::standalone(
        config,
        rank_env.rank,
        rank_env.local_rank,
        rank_env.world_size,
        &device,
    )?;
    Ok(Joined {
        reporter,
        comms,
        controller: None,
    })
}

/// A rank that has joined its world.
struct Joined {
    reporter: Arc<dyn Reporter>,
    comms: Comms,
    /// Set under a controller: told how the rank ended.
    controller: Option<Arc<ControllerClient>>,
}

/// Registers with the job's controller (with what the collectives prepared), waits for the
/// whole world, and builds the communicators from the controller's `StartInfo`.
///
/// A rank that cannot use its device registers saying why and exits quietly: the controller
/// fails the job once, naming the node, instead of every rank printing the same error.
fn join_through_controller(
    config: &TrainConfig,
    rank_env: &RankEnv,
    device: Result<String, String>,
) -> Result<(Arc<ControllerClient>, Comms)> {
    let (addr, secret) = controller_client::endpoint_from_env()?;
    let controller_host = addr
        .rsplit_once(':')
        .map_or(addr.as_str(), |(host, _)| host);
    let bind_host = listen_host(controller_host);
    let rank = rank_env.rank as usize;
    let prepared = match &device {
        Ok(_) => Some(prepare(
            config.device,
            rank,
            rank_env.world_size as usize,
            bind_host,
        )?),
        Err(_) => None,
    };
    let registration = Registration {
        rank: rank_env.rank,
        local_rank: rank_env.local_rank,
        world_size: rank_env.world_size,
        host: shardrun_protocol::host::hostname(),
        pid: std::process::id(),
        device: device.clone().unwrap_or_else(|_| "none".to_string()),
        device_error: device.clone().err(),
        config_hash: config.config_hash(),
        collective_addr: prepared.as_ref().and_then(|p| p.collective_addr.clone()),
        nccl_unique_id: prepared.as_ref().and_then(|p| p.nccl_unique_id.clone()),
    };
    let joined =
        controller_client::connect(&addr, &secret, registration, &ClientOptions::from_env());
    let stopped = joined.as_ref().err().and_then(stopped_before_start);
    if let (Some(code), Ok(_)) = (stopped, &device) {
        exit_past_library_destructors(code);
    }
    let (Some(prepared), Ok((client, start))) = (prepared, joined.as_ref()) else {
        if device.is_err() {
            std::process::exit(fail_fast::EXIT_FAILED);
        }
        return Err(joined.err().map_or_else(
            || anyhow::anyhow!("internal error: joined without preparing"),
            anyhow::Error::from,
        ));
    };
    let comms = prepared.connect(start, rank)?;
    Ok((client.clone(), comms))
}

/// The exit status of a rank stopped before its job started, which ends quietly: the
/// controller's shutdown (the run was cancelled, or another rank failed), or a stop signal
/// of its own, after which the controller, stopping too, closes the connection. The
/// controller says why the run ended; each rank saying it lost the connection would not.
fn stopped_before_start(error: &ClientError) -> Option<i32> {
    // A signal of its own says how it ended (128 + its number), whatever ended the wait.
    let own = match stop::process().requested() {
        Some(stop::StopRequest::Stop(reason)) => Some(reason.exit_code()),
        _ => None,
    };
    match error {
        ClientError::Stopped { .. } => own.or(Some(shardrun_protocol::messages::EXIT_STOPPED)),
        ClientError::Rendezvous { .. } | ClientError::Unreachable { .. } => own,
        ClientError::Rejected { .. }
        | ClientError::MissingEnv { .. }
        | ClientError::Secret { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardrun_protocol::connection::ConnectionError;

    #[test]
    fn a_lost_rendezvous_names_its_cause_once() {
        let lost = ClientError::Rendezvous {
            addr: "node1:5000".into(),
            source: ConnectionError::Closed,
        };
        let error = anyhow::Error::new(lost).context("cannot join the job");
        let line = said_once(&*error);
        assert_eq!(
            line,
            "cannot join the job: lost the connection to the controller at node1:5000 during \
             the rendezvous: the peer closed the connection"
        );
    }

    #[test]
    fn a_restore_that_lost_a_peer_names_it() {
        let lost = CommError::Peer {
            rank: 2,
            addr: "node2:5001".into(),
            what: "closed the connection".into(),
        };
        let restore = CheckpointingError::Fsdp(FsdpError::Comm(lost));
        let error = anyhow::Error::new(restore).context("restoring from /runs/a/checkpoints");
        assert_eq!(peer_at_fault(&*error), Some(2));
        let own = CheckpointingError::Other("no such file".into());
        assert_eq!(peer_at_fault(&own), None);
        // Ranks that learn rank 0 could not choose a checkpoint name rank 0.
        let root = anyhow::Error::new(CheckpointingError::RootFailed).context("restoring");
        assert_eq!(peer_at_fault(&*root), Some(0));
    }
}
