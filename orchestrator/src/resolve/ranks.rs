//! Ranks: nodes × ranks per node (one per GPU, or CPU ranks), the device kind, and the
//! local-mode overrides (`shardrun run --nproc N --device ...`).

use super::{defaults, Overrides, ResolveError, Section};
use shardrun_protocol::config::DeviceKind;

/// More ranks than a job can have: larger than any cluster, and far past the numbers a
/// batch split or a rank id is counted in without overflowing.
const MAX_RANKS: u64 = 1 << 24;

/// Where the ranks run, before any batch arithmetic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ranks {
    pub nodes: u64,
    pub ntasks_per_node: u64,
    /// As written in the spec (0 for CPU ranks); local overrides do not change it.
    pub gpus_per_node: u64,
    pub cpus_per_task: u64,
    pub device: DeviceKind,
    pub world_size: u64,
}

pub fn resolve_ranks(s: &Section, overrides: &Overrides) -> Result<Ranks, ResolveError> {
    let res = &s.spec().resources;
    let gpus_per_node = res.gpus_per_node.unwrap_or(0);
    let mut nodes = res.nodes.unwrap_or(defaults::NODES);
    if nodes == 0 {
        return Err(s.err("resources.nodes", "`nodes` is 0", "ask for at least 1 node"));
    }
    let mut ntasks_per_node = if gpus_per_node > 0 {
        if let Some(tasks) = res.tasks_per_node.filter(|&n| n != gpus_per_node) {
            return Err(s.err(
                "resources.tasks_per_node",
                format!("{tasks} tasks per node with {gpus_per_node} GPUs per node: GPU jobs run one rank per GPU"),
                "remove `tasks_per_node` (it is only for CPU ranks, `gpus_per_node: 0`)",
            ));
        }
        gpus_per_node
    } else {
        res.tasks_per_node.unwrap_or(defaults::TASKS_PER_NODE)
    };
    if ntasks_per_node == 0 {
        return Err(s.err(
            "resources.tasks_per_node",
            "0 tasks per node",
            "set `tasks_per_node` to the number of CPU ranks per node (at least 1)",
        ));
    }
    let mut device = if gpus_per_node > 0 {
        DeviceKind::Cuda
    } else {
        DeviceKind::Cpu
    };
    if let Some(world) = overrides.world_size {
        if world == 0 {
            return Err(s.err(
                "resources",
                "world size 0 requested",
                "pass --nproc 1 or more",
            ));
        }
        nodes = 1;
        ntasks_per_node = world;
    }
    if let Some(d) = overrides.device {
        device = d;
    }
    let cpus_per_task = res.cpus_per_task.unwrap_or(defaults::CPUS_PER_TASK);
    if cpus_per_task == 0 {
        return Err(s.err(
            "resources.cpus_per_task",
            "0 CPUs per task",
            "set `cpus_per_task: 1` or more",
        ));
    }
    let Some(world_size) = nodes
        .checked_mul(ntasks_per_node)
        .filter(|&w| w <= MAX_RANKS)
    else {
        return Err(s.err(
            "resources",
            format!(
                "{nodes} nodes × {ntasks_per_node} ranks per node is more than the {MAX_RANKS} \
                 ranks a job can have"
            ),
            "check `nodes` and `tasks_per_node` (or `gpus_per_node`)",
        ));
    };
    Ok(Ranks {
        nodes,
        ntasks_per_node,
        gpus_per_node,
        cpus_per_task,
        device,
        world_size,
    })
}

/// "1 rank", "4 ranks": a count of ranks as a sentence says it.
pub(crate) fn ranks_words(n: u64) -> String {
    match n {
        1 => "1 rank".to_string(),
        n => format!("{n} ranks"),
    }
}

/// "all 4 ranks", or "the one rank".
pub(crate) fn all_ranks_words(n: u64) -> String {
    match n {
        1 => "the one rank".to_string(),
        n => format!("all {n} ranks"),
    }
}
