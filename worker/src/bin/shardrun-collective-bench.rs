//! `shardrun-collective-bench`: runs the collectives across real processes, for tests,
//! benchmarks and the NCCL self-test on a GPU machine.
//!
//! Every rank is one process; rank and world come from the usual env (`RANK`/`WORLD_SIZE`,
//! Slurm's, or the controller's) and ranks meet through `MASTER_ADDR`/`MASTER_PORT`:
//!
//! ```text
//! MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 RANK=0 WORLD_SIZE=2 shardrun-collective-bench check &
//! MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 RANK=1 WORLD_SIZE=2 shardrun-collective-bench check
//! shardrun-collective-bench --device cuda check        # NCCL self-test, world size 1
//! ```
//! On CUDA the communicator is always NCCL, a one-rank one at world size 1 (training needs
//! none there). One GPU checks that NCCL loads, that a non-blocking communicator is created
//! and finalized, and the ordering by streams and events; NCCL copies a one-rank collective
//! straight onto the stream, so its kernels, transports and launch thread need two GPUs.
//! * `check`: every collective on several sizes and dtypes, results compared exactly;
//! * `bench`: all-gather / reduce-scatter / all-reduce bandwidth, one JSON line per op;
//! * `soak`: all-reduce in a loop until an error (used by the dead-peer test).

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use shardrun_protocol::config::DeviceKind;
use shardrun_protocol::messages::{PeerInfo, Registration, StartInfo};
use shardrun_worker::collectives::nccl::{self, NcclCommunicator};
use shardrun_worker::collectives::{self, hybrid_groups, Communicator, ReduceOp, Work};
use shardrun_worker::launch::RankEnv;
use shardrun_worker::rendezvous::{rendezvous, Standalone};
use std::io::Write;
use std::time::{Duration, Instant};
use tch::{Device, Kind, Tensor};

#[derive(Parser)]
#[command(about = "Run shardrun's collectives across processes: check, bench or soak")]
struct Args {
    #[arg(long, value_enum, default_value = "cpu")]
    device: DeviceArg,
    /// Address this rank's CPU collective listener binds to (and peers dial).
    #[arg(long, default_value = "127.0.0.1")]
    bind_host: String,
    /// Seconds without progress before a collective (or the rendezvous) fails.
    #[arg(long, default_value_t = 120)]
    timeout_s: u64,
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Clone, Copy, ValueEnum)]
enum DeviceArg {
    Cpu,
    Cuda,
}

#[derive(Subcommand)]
enum Mode {
    /// Every collective on several sizes and dtypes, compared with exact expected values.
    Check,
    /// Bandwidth of all-gather, reduce-scatter and all-reduce on one buffer size.
    Bench {
        /// Size of the full buffer (all-gather output, reduce-scatter input) in MiB.
        #[arg(long, default_value_t = 64)]
        mib: usize,
        #[arg(long, default_value_t = 3)]
        warmup: usize,
        #[arg(long, default_value_t = 10)]
        iters: usize,
        #[arg(long, value_enum, default_value = "f32")]
        dtype: DtypeArg,
    },
    /// All-reduce in a loop until an error; prints `ready` after the first one and `inside`
    /// as it enters the second (from then on it is in the loop until a peer fails).
    Soak,
}

#[derive(Clone, Copy, ValueEnum)]
enum DtypeArg {
    F32,
    Bf16,
}

fn main() {
    let args = Args::parse();
    let rank = RankEnv::from_env().map(|e| e.rank).unwrap_or(0);
    if let Err(e) = run(args) {
        eprintln!("rank {rank}: error: {e:#}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<()> {
    tch::set_num_threads(1);
    let env = RankEnv::from_env()?;
    let (rank, world) = (env.rank as usize, env.world_size as usize);
    let (kind, device) = match args.device {
        DeviceArg::Cpu => (DeviceKind::Cpu, Device::Cpu),
        DeviceArg::Cuda => {
            let chosen =
                shardrun_worker::device::select_cuda(env.local_rank).map_err(anyhow::Error::msg)?;
            eprintln!(
                "rank {rank}: {chosen}; {}",
                nccl::library::load().map_err(anyhow::Error::from)?
            );
            (DeviceKind::Cuda, Device::Cuda(chosen.index))
        }
    };
    let options = collectives::CommOptions {
        timeout: Duration::from_secs(args.timeout_s),
        ..collectives::CommOptions::from_env()?
    };
    if world == 1 && matches!(args.device, DeviceArg::Cuda) {
        let id = nccl::new_unique_id()?;
        let comm = NcclCommunicator::new(&id, 0, 1, &options)?;
        let result = execute(&args.mode, &comm, device);
        if result.is_ok() {
            comm.finish()?;
        }
        return result;
    }
    let prepared =
        collectives::prepare(kind, rank, world, &args.bind_host)?.with_options(options.clone());
    let start = if world == 1 {
        StartInfo {
            world_size: 1,
            peers: vec![PeerInfo {
                rank: 0,
                local_rank: 0,
                host: args.bind_host.clone(),
                collective_addr: prepared.collective_addr.clone(),
            }],
            nccl_unique_id: prepared.nccl_unique_id.clone(),
        }
    } else {
        let config = Standalone::from_env(options.timeout)?
            .context("a multi-rank run needs MASTER_ADDR and MASTER_PORT for the rendezvous")?;
        let me = Registration {
            rank: rank as u64,
            local_rank: env.local_rank,
            world_size: world as u64,
            host: args.bind_host.clone(),
            pid: std::process::id(),
            device: format!("{kind:?}"),
            config_hash: "collective-bench".into(),
            collective_addr: prepared.collective_addr.clone(),
            nccl_unique_id: prepared.nccl_unique_id.clone(),
            device_error: None,
        };
        rendezvous(&config, me)?
    };
    let comms = prepared.connect(&start, rank)?;
    let result = execute(&args.mode, comms.data.as_ref(), device);
    if result.is_ok() {
        comms.control.barrier()?;
        comms.data.finish()?;
    }
    result
}

fn execute(mode: &Mode, comm: &dyn Communicator, device: Device) -> Result<()> {
    match *mode {
        Mode::Check => check(comm, device),
        Mode::Bench {
            mib,
            warmup,
            iters,
            dtype,
        } => {
            let (kind, label) = match dtype {
                DtypeArg::F32 => (Kind::Float, "f32"),
                DtypeArg::Bf16 => (Kind::BFloat16, "bf16"),
            };
            bench(comm, device, mib << 20, warmup, iters, (kind, label))
        }
        Mode::Soak => soak(comm, device),
    }
}

/// Fails unless `got` equals `want` exactly (or within `rel` relative error).
fn expect(what: &str, got: &Tensor, want: &Tensor, rel: f64) -> Result<()> {
    let got = got.to_device(Device::Cpu).to_kind(Kind::Double);
    let want = want.to_device(Device::Cpu).to_kind(Kind::Double);
    if got.size() != want.size() {
        bail!("{what}: shape {:?}, expected {:?}", got.size(), want.size());
    }
    if got.numel() == 0 {
        return Ok(());
    }
    let err = (&got - &want).abs() - want.abs() * rel;
    let worst = err.argmax(None, false).int64_value(&[]);
    if err.double_value(&[worst]) > 0.0 {
        bail!(
            "{what}: element {worst} is {}, expected {}",
            got.double_value(&[worst]),
            want.double_value(&[worst])
        );
    }
    Ok(())
}

fn ramp(n: usize, modulo: i64, device: Device) -> Tensor {
    Tensor::arange(n as i64, (Kind::Int64, device))
        .remainder(modulo)
        .to_kind(Kind::Double)
}

fn check(comm: &dyn Communicator, device: Device) -> Result<()> {
    let (r, n) = (comm.rank(), comm.world_size());
    let (rf, nf) = (r as f64, n as f64);
    let mut ops = 0;
    // All-gather, out of place and in place; bf16 on values it holds exactly.
    for (numel, kind) in [
        (0, Kind::Float),
        (1, Kind::Float),
        (7, Kind::Float),
        (100_003, Kind::Float),
        (1_001, Kind::BFloat16),
    ] {
        let input = (ramp(numel, 251, device) + rf).to_kind(kind);
        let output = Tensor::zeros([(n * numel) as i64], (kind, device));
        comm.all_gather(&input, &output)?.wait()?;
        // What each rank sent, rounded as it was (bf16 holds integers above 256 inexactly).
        let want = Tensor::cat(
            &(0..n)
                .map(|q| (ramp(numel, 251, device) + q as f64).to_kind(kind))
                .collect::<Vec<_>>(),
            0,
        );
        expect(&format!("all_gather {numel} {kind:?}"), &output, &want, 0.0)?;
        let in_place = Tensor::zeros([(n * numel) as i64], (kind, device));
        let mine = in_place.narrow(0, (r * numel) as i64, numel as i64);
        mine.shallow_clone().copy_(&input);
        comm.all_gather(&mine, &in_place)?.wait()?;
        expect(
            &format!("in-place all_gather {numel} {kind:?}"),
            &in_place,
            &want,
            0.0,
        )?;
        ops += 2;
    }
    // Reduce-scatter: sums of integers are exact in f32; averages are checked to rounding,
    // which NCCL may do once per rank (it scales each input by 1/n before summing).
    let sum_ranks = nf * (nf + 1.0) / 2.0;
    let avg_rel = 2.0 * nf * f64::from(f32::EPSILON);
    for m in [1usize, 5, 262_147] {
        let base = ramp(n * m, 97, device) + 1.0;
        let input = (&base * (rf + 1.0)).to_kind(Kind::Float);
        let own = base.narrow(0, (r * m) as i64, m as i64);
        for (op, want, rel) in [
            (ReduceOp::Sum, &own * sum_ranks, 0.0),
            (ReduceOp::Max, &own * nf, 0.0),
            (ReduceOp::Avg, &own * (sum_ranks / nf), avg_rel),
        ] {
            let output = Tensor::zeros([m as i64], (Kind::Float, device));
            comm.reduce_scatter(&input, &output, op)?.wait()?;
            expect(&format!("reduce_scatter {m} {op:?}"), &output, &want, rel)?;
            ops += 1;
        }
        let in_place = input.copy();
        let out = in_place.narrow(0, (r * m) as i64, m as i64);
        comm.reduce_scatter(&in_place, &out, ReduceOp::Sum)?
            .wait()?;
        expect(
            &format!("in-place reduce_scatter {m}"),
            &out,
            &(&own * sum_ranks),
            0.0,
        )?;
        ops += 1;
    }
    // In 16-bit floats on sums that stay at most 4.5 × world size (exact in bf16 up to 56
    // ranks, whatever order NCCL adds in): each rank adds its own offset.
    let offsets: f64 = (0..n).map(|q| (q % 4) as f64).sum();
    for kind in [Kind::BFloat16, Kind::Half] {
        let m = 3_001;
        let base = ramp(n * m, 4, device);
        let input = (&base + (r % 4) as f64).to_kind(kind);
        let output = Tensor::zeros([m as i64], (kind, device));
        comm.reduce_scatter(&input, &output, ReduceOp::Sum)?
            .wait()?;
        let want = base.narrow(0, (r * m) as i64, m as i64) * nf + offsets;
        expect(&format!("reduce_scatter {kind:?}"), &output, &want, 0.0)?;
        ops += 1;
    }
    // All-reduce on sizes the world size does not divide.
    for numel in [1usize, 3, 1_000_003] {
        let base = ramp(numel, 89, device);
        for (op, want, rel) in [
            (ReduceOp::Sum, &base * nf + nf * (nf - 1.0) / 2.0, 0.0),
            (ReduceOp::Max, &base + (nf - 1.0), 0.0),
            (ReduceOp::Avg, &base + (nf - 1.0) / 2.0, avg_rel),
        ] {
            let t = (&base + rf).to_kind(Kind::Float);
            comm.all_reduce(&t, op)?.wait()?;
            expect(&format!("all_reduce {numel} {op:?}"), &t, &want, rel)?;
            ops += 1;
        }
    }
    let t = (ramp(5_003, 4, device) + (r % 4) as f64).to_kind(Kind::Half);
    comm.all_reduce(&t, ReduceOp::Sum)?.wait()?;
    expect(
        "all_reduce f16",
        &t,
        &(ramp(5_003, 4, device) * nf + offsets),
        0.0,
    )?;
    // Broadcast from every root.
    for root in 0..n {
        let want = ramp(700_001, 113, device) + root as f64;
        let t = if r == root {
            want.to_kind(Kind::Float)
        } else {
            Tensor::zeros([700_001], (Kind::Float, device))
        };
        comm.broadcast(&t, root)?.wait()?;
        expect(&format!("broadcast from {root}"), &t, &want, 0.0)?;
        ops += 1;
    }
    // Asynchronous: several ops in flight, waited on afterwards, complete in issue order.
    let a_in = (ramp(10_000, 251, device) + rf).to_kind(Kind::Float);
    let a_out = Tensor::zeros([(n * 10_000) as i64], (Kind::Float, device));
    let b = Tensor::ones([123_457], (Kind::Float, device));
    let c = Tensor::full([77], rf, (Kind::Float, device));
    let works: Vec<Work> = vec![
        comm.all_gather(&a_in, &a_out)?,
        comm.all_reduce(&b, ReduceOp::Sum)?,
        comm.all_reduce(&c, ReduceOp::Max)?,
    ];
    for w in works {
        w.wait()?;
    }
    let want = Tensor::cat(
        &(0..n)
            .map(|q| ramp(10_000, 251, device) + q as f64)
            .collect::<Vec<_>>(),
        0,
    );
    expect("async all_gather", &a_out, &want, 0.0)?;
    expect(
        "async all_reduce sum",
        &b,
        &(Tensor::ones([123_457], (Kind::Double, device)) * nf),
        0.0,
    )?;
    expect(
        "async all_reduce max",
        &c,
        &Tensor::full([77], nf - 1.0, (Kind::Double, device)),
        0.0,
    )?;
    for _ in 0..3 {
        comm.barrier()?;
    }
    ops += 6;
    // Sub-groups: HYBRID_SHARD's shard and replicate groups where the world splits in two.
    if n.is_multiple_of(2) {
        let (shard, replicate) = hybrid_groups(r, n, 2)?;
        for (name, group) in [("shard", shard), ("replicate", replicate)] {
            let sub = comm.new_subgroup(&group)?;
            let t = Tensor::full([1_001], rf + 1.0, (Kind::Float, device));
            sub.all_reduce(&t, ReduceOp::Sum)?.wait()?;
            let want: f64 = group.iter().map(|&q| q as f64 + 1.0).sum();
            expect(
                &format!("{name} group {group:?} all_reduce"),
                &t,
                &Tensor::full([1_001], want, (Kind::Double, device)),
                0.0,
            )?;
            let out = Tensor::zeros([(group.len() * 5) as i64], (Kind::Float, device));
            sub.all_gather(&Tensor::full([5], rf, (Kind::Float, device)), &out)?
                .wait()?;
            let want = Tensor::cat(
                &group
                    .iter()
                    .map(|&q| Tensor::full([5], q as f64, (Kind::Double, device)))
                    .collect::<Vec<_>>(),
                0,
            );
            expect(&format!("{name} group all_gather"), &out, &want, 0.0)?;
            leave_together(comm, sub)?;
            ops += 2;
        }
    } else {
        // Odd worlds: a pair and singletons, the singleton groups being world-size-1.
        let group = if r < 2 && n >= 2 { vec![0, 1] } else { vec![r] };
        let sub = comm.new_subgroup(&group)?;
        let t = Tensor::full([9], 1.0, (Kind::Float, device));
        sub.all_reduce(&t, ReduceOp::Sum)?.wait()?;
        expect(
            "odd-world subgroup all_reduce",
            &t,
            &Tensor::full([9], group.len() as f64, (Kind::Double, device)),
            0.0,
        )?;
        leave_together(comm, sub)?;
        ops += 1;
    }
    // The parent still works after making sub-groups.
    let t = Tensor::ones([33], (Kind::Float, device));
    comm.all_reduce(&t, ReduceOp::Sum)?.wait()?;
    expect(
        "all_reduce after subgroups",
        &t,
        &Tensor::full([33], nf, (Kind::Double, device)),
        0.0,
    )?;
    println!("rank {r} of {n}: check passed ({} ops)", ops + 1);
    Ok(())
}

/// A sub-group's clean end, as training ends its groups: every rank arrives, then the
/// sub-group is finalized (its sends flushed) before it is destroyed. Dropped unfinished, it
/// would be aborted while a peer on another node may still be receiving from it.
fn leave_together(world: &dyn Communicator, sub: Box<dyn Communicator>) -> Result<()> {
    world.barrier()?;
    sub.finish()?;
    Ok(())
}

fn synchronize(device: Device) {
    if let Device::Cuda(i) = device {
        tch::Cuda::synchronize(i as i64);
    }
}

/// Issues one collective of the benchmark.
type IssueOp<'a> = dyn Fn() -> Result<Work, collectives::CommError> + 'a;

fn bench(
    comm: &dyn Communicator,
    device: Device,
    bytes: usize,
    warmup: usize,
    iters: usize,
    (kind, label): (Kind, &str),
) -> Result<()> {
    let (r, n) = (comm.rank(), comm.world_size());
    let elems = bytes / kind.elt_size_in_bytes() / n * n;
    let full = Tensor::ones([elems as i64], (kind, device));
    let part = Tensor::ones([(elems / n) as i64], (kind, device));
    let ops: [(&str, Box<IssueOp>); 3] = [
        ("all_gather", Box::new(|| comm.all_gather(&part, &full))),
        (
            "reduce_scatter",
            Box::new(|| comm.reduce_scatter(&full, &part, ReduceOp::Sum)),
        ),
        (
            "all_reduce",
            Box::new(|| comm.all_reduce(&full, ReduceOp::Sum)),
        ),
    ];
    for (name, op) in ops {
        let mut times = Vec::with_capacity(iters);
        for i in 0..warmup + iters {
            comm.barrier()?;
            synchronize(device);
            let t0 = Instant::now();
            op()?.wait()?;
            synchronize(device);
            if i >= warmup {
                times.push(t0.elapsed().as_secs_f64());
            }
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        let size = (elems * kind.elt_size_in_bytes()) as f64;
        // nccl-tests' conventions: algbw = size / time; busbw scales by the ring traffic.
        let algbw = size / median / 1e9;
        let factor = if name == "all_reduce" { 2.0 } else { 1.0 } * (n as f64 - 1.0) / n as f64;
        if r == 0 {
            println!(
                "{{\"backend\":\"shardrun\",\"device\":\"{device:?}\",\"op\":\"{name}\",\"world_size\":{n},\"dtype\":\"{label}\",\"bytes\":{},\"iters\":{iters},\"median_s\":{median:.6},\"min_s\":{:.6},\"algbw_gbps\":{algbw:.3},\"busbw_gbps\":{:.3}}}",
                size as u64,
                times[0],
                algbw * factor
            );
        }
    }
    Ok(())
}

fn soak(comm: &dyn Communicator, device: Device) -> Result<()> {
    let n = comm.world_size() as f64;
    let t = Tensor::ones([4 << 20], (Kind::Float, device));
    for i in 0u64.. {
        let _ = t.shallow_clone().fill_(1.0);
        if i == 1 {
            println!("inside");
            std::io::stdout().flush()?;
        }
        comm.all_reduce(&t, ReduceOp::Sum)?.wait()?;
        if t.double_value(&[12_345]) != n {
            bail!("soak all_reduce {i} gave a wrong sum");
        }
        if i == 0 {
            println!("ready");
            std::io::stdout().flush()?;
        }
    }
    Ok(())
}
