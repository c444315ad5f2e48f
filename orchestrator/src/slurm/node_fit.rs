//! What a job's script asks of each node against what `sinfo` says the partition's nodes
//! have, for a job `sbatch --test-only` refused. Such a job may still be one Slurm would
//! queue: `--test-only` counts drained and down nodes as missing, where a plain sbatch waits
//! for them ([`waits_for`]). Else it is refused, and people are told which of their asks no
//! node meets ([`shortfall`]): Slurm's "Requested node configuration is not available"
//! does not say.

/// What a job's script asks for (its `#SBATCH` lines).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRequest {
    pub nodes: u64,
    pub cpus_per_node: u64,
    pub mem_mb_per_node: Option<u64>,
    pub gpus_per_node: u64,
    /// The GPUs' type where `--gres=gpu:<type>:<count>` names one.
    pub gpu_type: Option<String>,
    /// `--partition` (a comma-separated list), or the cluster's default.
    pub partitions: Option<Vec<String>>,
}

impl NodeRequest {
    /// From the `#SBATCH` lines at the top of a script (Slurm reads them up to the first
    /// command).
    pub fn of_script(script: &str) -> NodeRequest {
        let mut options = std::collections::HashMap::new();
        for line in script.lines().skip_while(|l| l.starts_with("#!")) {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let Some(option) = line.strip_prefix("#SBATCH") else {
                if line.starts_with('#') {
                    continue;
                }
                break;
            };
            if let Some((key, value)) = option.trim().split_once('=') {
                options.insert(key.to_string(), value.trim().to_string());
            }
        }
        let number = |key: &str, default: u64| {
            options
                .get(key)
                .and_then(|v| v.parse().ok())
                .unwrap_or(default)
        };
        let gres = options.get("--gres").map_or("", String::as_str);
        let gpu_type = gres
            .split(',')
            .find_map(|g| Some(GpuGres::parse(g)?.kind?.to_string()));
        NodeRequest {
            nodes: number("--nodes", 1),
            cpus_per_node: number("--ntasks-per-node", 1) * number("--cpus-per-task", 1),
            mem_mb_per_node: options
                .get("--mem")
                .and_then(|m| super::parse::parse_memory_size(m)),
            gpus_per_node: gpu_count(gres, None),
            gpu_type,
            partitions: options
                .get("--partition")
                .map(|p| p.split(',').map(str::to_string).collect()),
        }
    }
}

/// One node of one partition, as `sinfo --Node --format=%N|%P|%t|%c|%m|%G` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    pub partition: String,
    pub default_partition: bool,
    pub state: String,
    pub cpus: u64,
    pub mem_mb: u64,
    /// Its generic resources as sinfo writes them (`gpu:a100:4(S:0-1)`, `(null)`).
    pub gres: String,
}

/// The `--format` [`parse_sinfo`] reads.
pub const SINFO_FORMAT: &str = "--format=%N|%P|%t|%c|%m|%G";

pub fn parse_sinfo(text: &str) -> Vec<NodeInfo> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.trim().split('|').collect();
            let [name, partition, state, cpus, mem, gres] = fields.as_slice() else {
                return None;
            };
            Some(NodeInfo {
                name: name.to_string(),
                partition: partition.trim_end_matches('*').to_string(),
                default_partition: partition.ends_with('*'),
                state: state.to_string(),
                cpus: cpus.parse().ok()?,
                mem_mb: mem.parse().ok()?,
                gres: gres.to_string(),
            })
        })
        .collect()
}

impl NodeInfo {
    /// Drained, down, in maintenance or failed: no job starts there until it is back.
    pub fn out_of_service(&self) -> bool {
        // Flags after the state (`*` not responding, `~` powered off, ...) aside.
        let state = self
            .state
            .trim_end_matches(['*', '~', '#', '!', '%', '$', '@', '^', '-']);
        matches!(
            state,
            "drain" | "drng" | "drained" | "down" | "maint" | "fail" | "failg" | "inval"
        )
    }

    fn in_partition(&self, request: &NodeRequest) -> bool {
        match &request.partitions {
            Some(names) => names.contains(&self.partition),
            None => self.default_partition,
        }
    }

    fn meets(&self, request: &NodeRequest) -> bool {
        self.in_partition(request)
            && self.cpus >= request.cpus_per_node
            && request.mem_mb_per_node.is_none_or(|mem| self.mem_mb >= mem)
            && gpu_count(&self.gres, request.gpu_type.as_deref()) >= request.gpus_per_node
    }
}

/// `nodes` by name, each once: sinfo lists a node once per partition it is in.
fn distinct<'a>(nodes: impl Iterator<Item = &'a NodeInfo>) -> Vec<&'a NodeInfo> {
    let mut nodes: Vec<&NodeInfo> = nodes.collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    nodes.dedup_by(|a, b| a.name == b.name);
    nodes
}

/// The nodes out of service the job waits for, as `node (state)`, when enough nodes of its
/// partition meet its request only with them back; `None` when the request is beyond the
/// partition even so (a plain sbatch refuses that too), or when enough nodes in service meet
/// it (the refusal is for something else: a constraint, a limit, an account).
pub fn waits_for(request: &NodeRequest, nodes: &[NodeInfo]) -> Option<Vec<String>> {
    let meeting = distinct(nodes.iter().filter(|n| n.meets(request)));
    let in_service = meeting.iter().filter(|n| !n.out_of_service()).count() as u64;
    if (meeting.len() as u64) < request.nodes || in_service >= request.nodes {
        return None;
    }
    Some(
        meeting
            .iter()
            .filter(|n| n.out_of_service())
            .map(|n| format!("{} ({})", n.name, n.state))
            .collect(),
    )
}

/// Why no `request.nodes` nodes of the job's partition could ever hold it, one reason a
/// line and each naming the spec field to change; `None` when enough nodes have what each is
/// asked for (the refusal is then for something sinfo does not show: a constraint, a limit,
/// an account) or the partition has no nodes (sbatch names the partition itself).
pub fn shortfall(request: &NodeRequest, nodes: &[NodeInfo]) -> Option<Vec<String>> {
    let partition = distinct(nodes.iter().filter(|n| n.in_partition(request)));
    let first = partition.first()?;
    let name = match &request.partitions {
        Some(names) => format!("partition {}", names.join(",")),
        None => format!("partition {} (the default)", first.partition),
    };
    let mut reasons = Vec::new();
    let kind = request.gpu_type.as_deref();
    let most_gpus = partition
        .iter()
        .map(|n| gpu_count(&n.gres, kind))
        .max()
        .unwrap_or(0);
    if request.gpus_per_node > most_gpus {
        let of_kind = kind.map(|k| format!(" of type {k}")).unwrap_or_default();
        reasons.push(format!(
            "each node is asked for {} GPU(s){of_kind} (resources.gpus_per_node): no node of \
             {name} has more than {most_gpus}",
            request.gpus_per_node
        ));
    }
    let most_cpus = partition.iter().map(|n| n.cpus).max().unwrap_or(0);
    if request.cpus_per_node > most_cpus {
        reasons.push(format!(
            "each node is asked for {} CPUs (its tasks times resources.cpus_per_task): no node \
             of {name} has more than {most_cpus}",
            request.cpus_per_node
        ));
    }
    let most_mem = partition.iter().map(|n| n.mem_mb).max().unwrap_or(0);
    if let Some(mem) = request.mem_mb_per_node.filter(|&mem| mem > most_mem) {
        reasons.push(format!(
            "each node is asked for {mem} MB of memory (resources.mem): no node of {name} has \
             more than {most_mem} MB"
        ));
    }
    if reasons.is_empty() {
        let meeting = partition.iter().filter(|n| n.meets(request)).count() as u64;
        if meeting < request.nodes {
            reasons.push(format!(
                "the job asks for {} nodes (resources.nodes): only {meeting} node(s) of {name} \
                 have what each is asked for",
                request.nodes
            ));
        }
    }
    (!reasons.is_empty()).then_some(reasons)
}

/// One `gpu` entry of a GRES string: `gpu:4`, `gpu:a100:4(S:0-1)`.
struct GpuGres<'a> {
    kind: Option<&'a str>,
    count: u64,
}

impl GpuGres<'_> {
    fn parse(entry: &str) -> Option<GpuGres<'_>> {
        let entry = entry.split('(').next().unwrap_or(entry);
        match entry.split(':').collect::<Vec<_>>().as_slice() {
            ["gpu", count] => Some(GpuGres {
                kind: None,
                count: count.parse().ok()?,
            }),
            ["gpu", kind, count] => Some(GpuGres {
                kind: Some(kind),
                count: count.parse().ok()?,
            }),
            _ => None,
        }
    }
}

/// GPUs in a GRES string (`gpu:4`, `gpu:a100:4(S:0-1)`, `gpu:2,mps:100`; 0 for `(null)`),
/// of `kind` only when one is given.
fn gpu_count(gres: &str, kind: Option<&str>) -> u64 {
    gres.split(',')
        .filter_map(GpuGres::parse)
        .filter(|g| kind.is_none() || g.kind == kind)
        .map(|g| g.count)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRIPT: &str = "#!/bin/bash\n#SBATCH --job-name=t\n#SBATCH --nodes=2\n\
        #SBATCH --ntasks-per-node=4\n#SBATCH --cpus-per-task=2\n#SBATCH --gres=gpu:4\n\
        #SBATCH --mem=64G\n\nset -e\n#SBATCH --partition=ignored\n";

    /// Two GPU nodes of `gpu` (the default), one drained; a CPU node of `cpu`.
    const SINFO: &str = "g1|gpu*|idle|16|256000|gpu:a100:4(S:0-1)\n\
        g2|gpu*|drain|16|256000|gpu:a100:4(S:0-1)\n\
        c1|cpu|idle|64|512000|(null)\n";

    #[test]
    fn a_script_says_what_it_asks_of_each_node() {
        assert_eq!(
            NodeRequest::of_script(SCRIPT),
            NodeRequest {
                nodes: 2,
                cpus_per_node: 8,
                mem_mb_per_node: Some(65536),
                gpus_per_node: 4,
                gpu_type: None,
                partitions: None,
            }
        );
        let typed = SCRIPT.replace("gpu:4", "gpu:h100:4");
        let request = NodeRequest::of_script(&typed);
        assert_eq!(
            (request.gpus_per_node, request.gpu_type.as_deref()),
            (4, Some("h100"))
        );
        assert_eq!(gpu_count("gpu:2,mps:100", None), 2);
        assert_eq!(gpu_count("(null)", None), 0);
        let mixed = "gpu:a100:4(S:0),gpu:h100:2(S:1)";
        assert_eq!(gpu_count(mixed, None), 6);
        assert_eq!(gpu_count(mixed, Some("h100")), 2);
        assert_eq!(gpu_count("gpu:4", Some("h100")), 0);
    }

    #[test]
    fn a_job_waits_for_drained_nodes_only_when_they_would_meet_it() {
        let nodes = parse_sinfo(SINFO);
        assert_eq!(nodes.len(), 3);
        let request = NodeRequest::of_script(SCRIPT);
        assert_eq!(
            waits_for(&request, &nodes),
            Some(vec!["g2 (drain)".to_string()])
        );
        // Beyond every node of the partition, drained or not: refused.
        let huge = NodeRequest {
            mem_mb_per_node: Some(921600),
            ..request.clone()
        };
        assert_eq!(waits_for(&huge, &nodes), None);
        let three = NodeRequest {
            nodes: 3,
            ..request.clone()
        };
        assert_eq!(waits_for(&three, &nodes), None);
        // One node, and one in service meets it: the refusal is for something else.
        let one = NodeRequest {
            nodes: 1,
            ..request.clone()
        };
        assert_eq!(waits_for(&one, &nodes), None);
        // Another partition's nodes do not count.
        let cpu = NodeRequest {
            partitions: Some(vec!["cpu".into()]),
            gpus_per_node: 0,
            nodes: 2,
            ..request
        };
        assert_eq!(waits_for(&cpu, &nodes), None);
        // GPUs of another type do not count.
        let h100 = NodeRequest {
            gpu_type: Some("h100".into()),
            ..NodeRequest::of_script(SCRIPT)
        };
        assert_eq!(waits_for(&h100, &nodes), None);
    }

    #[test]
    fn a_refusal_names_each_ask_no_node_of_the_partition_meets() {
        let nodes = parse_sinfo(SINFO);
        let request = NodeRequest::of_script(SCRIPT);
        assert_eq!(shortfall(&request, &nodes), None, "two nodes meet it");
        let too_much = NodeRequest {
            gpus_per_node: 8,
            cpus_per_node: 32,
            mem_mb_per_node: Some(921600),
            ..request.clone()
        };
        assert_eq!(
            shortfall(&too_much, &nodes).unwrap(),
            [
                "each node is asked for 8 GPU(s) (resources.gpus_per_node): no node of \
                 partition gpu (the default) has more than 4",
                "each node is asked for 32 CPUs (its tasks times resources.cpus_per_task): no \
                 node of partition gpu (the default) has more than 16",
                "each node is asked for 921600 MB of memory (resources.mem): no node of \
                 partition gpu (the default) has more than 256000 MB",
            ]
        );
        // GPUs of a type count only where the node has that type.
        let h100 = NodeRequest {
            gpu_type: Some("h100".into()),
            ..request.clone()
        };
        assert_eq!(
            shortfall(&h100, &nodes).unwrap(),
            [
                "each node is asked for 4 GPU(s) of type h100 (resources.gpus_per_node): no node \
              of partition gpu (the default) has more than 0"
            ]
        );
        // Each node would do, but there are not enough of them.
        let three = NodeRequest {
            nodes: 3,
            ..request.clone()
        };
        assert_eq!(
            shortfall(&three, &nodes).unwrap(),
            [
                "the job asks for 3 nodes (resources.nodes): only 2 node(s) of partition gpu \
              (the default) have what each is asked for"
            ]
        );
        // The CPU partition has no GPU at all; a partition sinfo does not list is sbatch's.
        let cpu = NodeRequest {
            partitions: Some(vec!["cpu".into()]),
            ..request.clone()
        };
        assert_eq!(
            shortfall(&cpu, &nodes).unwrap()[0],
            "each node is asked for 4 GPU(s) (resources.gpus_per_node): no node of partition \
             cpu has more than 0"
        );
        let unknown = NodeRequest {
            partitions: Some(vec!["nowhere".into()]),
            ..request
        };
        assert_eq!(shortfall(&unknown, &nodes), None);
    }
}
