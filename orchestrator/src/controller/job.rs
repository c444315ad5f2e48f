//! The job's life as a pure state machine: rendezvous, running, failure policy, cancellation
//! and preemption. [`JobMachine::handle`] turns one [`Event`] into [`Action`]s; it does no I/O,
//! so every decision is unit-tested with plain values (see the tests at the bottom). The
//! event loop in [`super::event_loop`] only moves events in and carries actions out.

use super::outcome::{ExitInfo, Failure, FailureCause, Outcome};
use crate::events_file::RunEvent;
use shardrun_protocol::messages::{PeerInfo, Registration, StartInfo, ToWorker};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// One accepted (authenticated) connection.
pub type ConnId = u64;
/// One launched process: a rank's process locally, the single `srun` under Slurm.
pub type ProcId = u64;

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Processes were started; `rank_of` maps a process to its rank where known (local mode).
    Launched {
        procs: Vec<(ProcId, Option<u64>)>,
    },
    Registered {
        conn: ConnId,
        registration: Registration,
    },
    Finished {
        conn: ConnId,
        preempted: bool,
    },
    /// The rank stopped at a step boundary on request, after optimizer step `step`.
    Stopped {
        conn: ConnId,
        step: u64,
        reason: String,
    },
    WorkerFailed {
        conn: ConnId,
        error: String,
    },
    /// The connection ended (`error`: why, if not a clean close).
    Disconnected {
        conn: ConnId,
        error: Option<String>,
    },
    /// Nothing arrived on the connection for the heartbeat timeout.
    HeartbeatLost {
        conn: ConnId,
    },
    /// The rank's heartbeats say it completed `step` optimizer steps.
    Progress {
        conn: ConnId,
        step: u64,
    },
    /// The rank heartbeats but has stayed at `step` for `secs` seconds (past the progress
    /// timeout).
    Stalled {
        conn: ConnId,
        step: u64,
        secs: u64,
    },
    ProcessExited {
        proc: ProcId,
        exit: ExitInfo,
    },
    RendezvousTimeout,
    /// After all processes exited, connections still open are given up on.
    DrainTimeout,
    /// SIGTERM / SIGINT to the controller.
    Cancel {
        signal: String,
    },
    /// SIGUSR2: preemption or time limit ahead.
    Preempt,
    /// The controller itself started signalling the workers (after the shutdown grace).
    Escalated,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Send {
        conn: ConnId,
        msg: ToWorker,
    },
    /// Drop a connection (it is not part of the job).
    Close {
        conn: ConnId,
    },
    /// A controller message for train.log and stdout.
    Say(String),
    /// Something that happened to the run, for its events record.
    Record(RunEvent),
    /// Stop the worker processes: SIGTERM after the shutdown grace period, SIGKILL after the
    /// kill grace period (`force`: SIGKILL now, e.g. a second Ctrl-C).
    StopProcesses {
        force: bool,
    },
    /// The ranks were asked to stop at their next step boundary (a cancel): give them the
    /// step-boundary timeout, then stop the processes that are left as above.
    StopAtStepBoundary,
    /// All processes exited but some connections are still open: wait a little for their
    /// last bytes, then send [`Event::DrainTimeout`].
    StartDrainTimer,
    /// The job is over; write the result and exit.
    Finish(Outcome),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Rendezvous,
    Running,
    Stopping,
    Done,
}

/// How a rank said it ended (its last message).
#[derive(Debug, Clone, PartialEq)]
enum RankEnd {
    Finished { preempted: bool },
    Stopped { step: u64, reason: String },
    Failed,
}

#[derive(Debug, Clone)]
struct RankState {
    registration: Registration,
    conn: ConnId,
    connected: bool,
    /// Optimizer steps completed, as its heartbeats last said.
    step: u64,
    end: Option<RankEnd>,
}

impl RankState {
    /// Ended by its own account: finished, preempted or stopped on request.
    fn ended_well(&self) -> bool {
        matches!(
            self.end,
            Some(RankEnd::Finished { .. } | RankEnd::Stopped { .. })
        )
    }

    /// Whether its process ending with `exit` is what its last message announced.
    fn exit_expected(&self, exit: &ExitInfo) -> bool {
        match self.end {
            Some(RankEnd::Finished { .. }) => exit.success(),
            // A stopped rank exits non-zero on purpose, and srun may kill it once another
            // stopped rank exited (--kill-on-bad-exit): it had already stopped.
            Some(RankEnd::Stopped { .. }) => true,
            _ => false,
        }
    }
}

#[derive(Debug)]
pub struct JobMachine {
    world_size: u64,
    config_hash: String,
    phase: Phase,
    ranks: BTreeMap<u64, RankState>,
    conn_rank: HashMap<ConnId, u64>,
    proc_rank: HashMap<ProcId, Option<u64>>,
    alive: BTreeSet<ProcId>,
    /// Exit statuses of ranks (local mode), kept for failures judged later.
    exits: HashMap<u64, ExitInfo>,
    launched: bool,
    failure: Option<Failure>,
    cancelled: Option<String>,
    preempting: bool,
    stop_requested: bool,
    escalated: bool,
}

impl JobMachine {
    pub fn new(world_size: u64, config_hash: impl Into<String>) -> Self {
        JobMachine {
            world_size,
            config_hash: config_hash.into(),
            phase: Phase::Rendezvous,
            ranks: BTreeMap::new(),
            conn_rank: HashMap::new(),
            proc_rank: HashMap::new(),
            alive: BTreeSet::new(),
            exits: HashMap::new(),
            launched: false,
            failure: None,
            cancelled: None,
            preempting: false,
            stop_requested: false,
            escalated: false,
        }
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The last step every registered rank had completed, as their heartbeats said.
    pub fn steps_done(&self) -> Option<u64> {
        self.ranks.values().map(|r| r.step).min()
    }

    /// Host and pid of a registered rank, for messages.
    pub fn registration(&self, rank: u64) -> Option<&Registration> {
        self.ranks.get(&rank).map(|r| &r.registration)
    }

    pub fn handle(&mut self, event: Event) -> Vec<Action> {
        let mut out = Vec::new();
        if self.phase == Phase::Done {
            return out;
        }
        match event {
            Event::Launched { procs } => {
                self.launched = true;
                for (proc, rank) in procs {
                    self.proc_rank.insert(proc, rank);
                    self.alive.insert(proc);
                }
            }
            Event::Registered { conn, registration } => {
                self.on_register(conn, registration, &mut out)
            }
            Event::Finished { conn, preempted } => {
                self.set_end(conn, RankEnd::Finished { preempted });
            }
            Event::Stopped { conn, step, reason } => {
                self.set_end(conn, RankEnd::Stopped { step, reason });
            }
            Event::WorkerFailed { conn, error } => {
                self.set_end(conn, RankEnd::Failed);
                if let Some(rank) = self.conn_rank.get(&conn).copied() {
                    self.fail(
                        self.failure_of(rank, FailureCause::Reported { error }),
                        &mut out,
                    );
                }
            }
            Event::Disconnected { conn, error } => {
                let Some(rank) = self.conn_rank.remove(&conn) else {
                    return out;
                };
                let Some(r) = self.ranks.get_mut(&rank) else {
                    return out;
                };
                r.connected = false;
                if r.end.is_none() && !matches!(self.phase, Phase::Stopping) {
                    let exit = self.exits.get(&rank).cloned();
                    let mut failure = match (&exit, error) {
                        (Some(e), None) if e.success() => {
                            self.failure_of(rank, FailureCause::ExitedWithoutFinishing)
                        }
                        (_, error) => {
                            let why =
                                error.unwrap_or_else(|| "closed without finishing".to_string());
                            self.failure_of(rank, FailureCause::ConnectionLost { why })
                        }
                    };
                    failure.exit = exit;
                    self.fail(failure, &mut out);
                }
            }
            Event::HeartbeatLost { conn } => {
                if let Some(rank) = self.conn_rank.get(&conn).copied() {
                    if self.ranks.get(&rank).is_some_and(|r| r.end.is_none()) {
                        self.fail(self.failure_of(rank, FailureCause::HeartbeatLost), &mut out);
                    }
                }
            }
            Event::Progress { conn, step } => {
                if let Some(r) = self
                    .conn_rank
                    .get(&conn)
                    .and_then(|rank| self.ranks.get_mut(rank))
                {
                    r.step = step;
                }
            }
            Event::Stalled { conn, step, secs } => {
                if let Some(rank) = self.conn_rank.get(&conn).copied() {
                    if self.ranks.get(&rank).is_some_and(|r| r.end.is_none()) {
                        let others = self.steps_of_others(rank);
                        self.fail(
                            self.failure_of(rank, FailureCause::Stalled { step, secs, others }),
                            &mut out,
                        );
                    }
                }
            }
            Event::ProcessExited { proc, exit } => self.on_exit(proc, exit, &mut out),
            Event::RendezvousTimeout => {
                if self.phase == Phase::Rendezvous {
                    let missing: Vec<u64> = (0..self.world_size)
                        .filter(|r| !self.ranks.contains_key(r))
                        .collect();
                    self.fail(
                        Failure::job(FailureCause::RendezvousTimeout { missing }),
                        &mut out,
                    );
                }
            }
            Event::DrainTimeout => {
                if self.alive.is_empty() {
                    self.finish(&mut out);
                }
            }
            Event::Cancel { signal } => {
                if self.stop_requested {
                    out.push(Action::Say(format!(
                        "{signal} again: killing the workers now"
                    )));
                    out.push(Action::StopProcesses { force: true });
                } else {
                    out.push(Action::Say(format!(
                        "received {signal}: the ranks stop at their next step boundary (send it \
                         again to kill them now)"
                    )));
                    self.cancelled.get_or_insert(signal.clone());
                    self.stop(&format!("the job was cancelled ({signal})"), &mut out);
                }
            }
            Event::Escalated => {
                self.escalated = true;
                // One line for each rank that is killed rather than stopped, saying so.
                for r in self
                    .ranks
                    .values()
                    .filter(|r| r.connected && r.end.is_none())
                {
                    let reg = &r.registration;
                    out.push(Action::Say(format!(
                        "rank {} on {} (pid {}) did not stop in time: killing it",
                        reg.rank, reg.host, reg.pid
                    )));
                }
            }
            Event::Preempt => {
                if !self.preempting && self.failure.is_none() && self.cancelled.is_none() {
                    self.preempting = true;
                    out.push(Action::Say(
                        "preemption requested: the workers checkpoint at the next step boundary and exit"
                            .into(),
                    ));
                    out.push(Action::Record(RunEvent::PreemptRequested));
                    if self.phase == Phase::Running {
                        for r in self.ranks.values().filter(|r| r.connected) {
                            out.push(Action::Send {
                                conn: r.conn,
                                msg: ToWorker::Preempt,
                            });
                        }
                    }
                }
            }
        }
        self.check_done(&mut out);
        out
    }

    fn on_register(&mut self, conn: ConnId, reg: Registration, out: &mut Vec<Action>) {
        if self.phase == Phase::Stopping {
            // The job is failing already (often: every rank of a node has the same problem).
            out.push(Action::Close { conn });
            return;
        }
        if self.phase != Phase::Rendezvous {
            out.push(Action::Say(format!(
                "rank {} ({}, pid {}) registered after the rendezvous closed; ignoring it",
                reg.rank, reg.host, reg.pid
            )));
            out.push(Action::Close { conn });
            return;
        }
        if let Some(problem) = &reg.device_error {
            out.push(Action::Close { conn });
            let failure = Failure {
                rank: Some(reg.rank),
                host: Some(reg.host.clone()),
                pid: Some(reg.pid),
                cause: FailureCause::Device {
                    problem: problem.clone(),
                },
                exit: None,
            };
            self.fail(failure, out);
            return;
        }
        let problem = if reg.world_size != self.world_size {
            Some(format!(
                "it was started with world size {} but the job has {}",
                reg.world_size, self.world_size
            ))
        } else if reg.rank >= self.world_size {
            Some(format!(
                "rank {} is not a rank of a world of {}",
                reg.rank, self.world_size
            ))
        } else if reg.config_hash != self.config_hash {
            Some(format!(
                "its config hash {} differs from the job's {} (a different train_config.json?)",
                reg.config_hash, self.config_hash
            ))
        } else if let Some(other) = self.ranks.get(&reg.rank) {
            Some(format!(
                "rank {} already registered from {} pid {} (two processes with one rank: check \
                 the launcher's SLURM_PROCID / SHARDRUN_RANK)",
                reg.rank, other.registration.host, other.registration.pid
            ))
        } else {
            None
        };
        let rank = reg.rank;
        if let Some(problem) = problem {
            out.push(Action::Close { conn });
            let failure = Failure {
                rank: Some(rank),
                host: Some(reg.host.clone()),
                pid: Some(reg.pid),
                cause: FailureCause::Inconsistent { problem },
                exit: None,
            };
            self.fail(failure, out);
            return;
        }
        self.conn_rank.insert(conn, rank);
        self.ranks.insert(
            rank,
            RankState {
                registration: reg,
                conn,
                connected: true,
                end: None,
                step: 0,
            },
        );
        if self.ranks.len() as u64 == self.world_size {
            self.start(out);
        }
    }

    fn start(&mut self, out: &mut Vec<Action>) {
        self.phase = Phase::Running;
        let peers: Vec<PeerInfo> = self
            .ranks
            .values()
            .map(|r| PeerInfo {
                rank: r.registration.rank,
                local_rank: r.registration.local_rank,
                host: r.registration.host.clone(),
                collective_addr: r.registration.collective_addr.clone(),
            })
            .collect();
        let nccl_unique_id = self
            .ranks
            .get(&0)
            .and_then(|r| r.registration.nccl_unique_id.clone());
        let info = StartInfo {
            world_size: self.world_size,
            peers,
            nccl_unique_id,
        };
        let hosts: BTreeSet<&str> = self
            .ranks
            .values()
            .map(|r| r.registration.host.as_str())
            .collect();
        out.push(Action::Say(format!(
            "all {} ranks registered on {} host(s) ({}): starting",
            self.world_size,
            hosts.len(),
            hosts.into_iter().collect::<Vec<_>>().join(", ")
        )));
        for r in self.ranks.values() {
            out.push(Action::Send {
                conn: r.conn,
                msg: ToWorker::Start(info.clone()),
            });
            if self.preempting {
                out.push(Action::Send {
                    conn: r.conn,
                    msg: ToWorker::Preempt,
                });
            }
        }
    }

    fn on_exit(&mut self, proc: ProcId, exit: ExitInfo, out: &mut Vec<Action>) {
        if !self.alive.remove(&proc) {
            return;
        }
        let rank = self.proc_rank.get(&proc).copied().flatten();
        if let Some(rank) = rank {
            self.exits.insert(rank, exit.clone());
        }
        // A rank whose connection dropped first gets its exit status attached afterwards.
        if let (Some(f), Some(rank)) = (&mut self.failure, rank) {
            if f.rank == Some(rank) && f.exit.is_none() {
                f.exit = Some(exit.clone());
            }
        }
        if self.phase == Phase::Stopping {
            self.maybe_blame_killed_rank(rank, &exit, out);
            return;
        }
        let as_announced = match rank {
            Some(rank) => self
                .ranks
                .get(&rank)
                .is_some_and(|r| r.exit_expected(&exit)),
            None => {
                self.ranks.len() as u64 == self.world_size
                    && self.ranks.values().all(|r| r.ended_well())
                    && (exit.success()
                        || self
                            .ranks
                            .values()
                            .any(|r| matches!(r.end, Some(RankEnd::Stopped { .. }))))
            }
        };
        if as_announced {
            return;
        }
        // A clean exit (or a stop's) can overtake the last messages still queued in the
        // socket: the rank's (or, under srun, any rank's) connection closing decides instead.
        let still_reading = match rank {
            Some(rank) => self.ranks.get(&rank).is_some_and(|r| r.connected),
            None => self.ranks.values().any(|r| r.connected && r.end.is_none()),
        };
        if (exit.success() || exit.is_stop_status()) && still_reading {
            return;
        }
        let cause = if exit.success() {
            FailureCause::ExitedWithoutFinishing
        } else {
            FailureCause::Exited
        };
        let mut failure = match rank {
            Some(rank) => self.failure_of(rank, cause),
            None => Failure::job(cause),
        };
        failure.exit = Some(exit);
        if rank.is_none() {
            // Under srun the process is the whole step: name a rank that did not finish.
            if let Some(r) = self
                .ranks
                .values()
                .find(|r| r.end.is_none() && !r.connected)
            {
                failure.rank = Some(r.registration.rank);
                failure.host = Some(r.registration.host.clone());
                failure.pid = Some(r.registration.pid);
            }
        }
        self.fail(failure, out);
    }

    /// A rank reporting an error is often a consequence: its peer was killed and the
    /// collective broke. If another rank then turns out to have died of a signal the
    /// controller did not send, that rank is the cause and the failure names it instead.
    fn maybe_blame_killed_rank(
        &mut self,
        rank: Option<u64>,
        exit: &ExitInfo,
        out: &mut Vec<Action>,
    ) {
        let (Some(rank), ExitInfo::Signal(_)) = (rank, exit) else {
            return;
        };
        let Some(current) = &self.failure else { return };
        if self.escalated
            || current.rank == Some(rank)
            || !matches!(current.cause, FailureCause::Reported { .. })
        {
            return;
        }
        let mut cause = self.failure_of(rank, FailureCause::Exited);
        cause.exit = Some(exit.clone());
        out.push(Action::Say(format!(
            "{} (the cause of the failure above)",
            cause.describe()
        )));
        self.failure = Some(cause);
    }

    /// "ranks 0-2 at step 12, rank 3 at step 11": where the ranks other than `rank` are.
    fn steps_of_others(&self, rank: u64) -> String {
        let mut by_step: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for (r, state) in &self.ranks {
            if *r != rank {
                by_step.entry(state.step).or_default().push(*r);
            }
        }
        by_step
            .iter()
            .map(|(step, ranks)| {
                let list = ranks
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(", ");
                let noun = if ranks.len() == 1 { "rank" } else { "ranks" };
                format!("{noun} {list} at step {step}")
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn failure_of(&self, rank: u64, cause: FailureCause) -> Failure {
        let reg = self.ranks.get(&rank).map(|r| &r.registration);
        Failure {
            rank: Some(rank),
            host: reg.map(|r| r.host.clone()),
            pid: reg.map(|r| r.pid),
            cause,
            exit: None,
        }
    }

    fn fail(&mut self, failure: Failure, out: &mut Vec<Action>) {
        if self.failure.is_some() || self.cancelled.is_some() {
            return;
        }
        out.push(Action::Say(failure.describe()));
        let reason = match failure.rank {
            Some(rank) => format!("rank {rank} failed"),
            None => "the job failed".to_string(),
        };
        self.failure = Some(failure);
        self.stop(&reason, out);
    }

    fn stop(&mut self, reason: &str, out: &mut Vec<Action>) {
        if self.stop_requested {
            return;
        }
        self.stop_requested = true;
        let was_running = self.phase == Phase::Running;
        self.phase = Phase::Stopping;
        for r in self
            .ranks
            .values()
            .filter(|r| r.connected && r.end.is_none())
        {
            out.push(Action::Send {
                conn: r.conn,
                msg: ToWorker::Shutdown {
                    reason: reason.to_string(),
                },
            });
        }
        // After a failure the others are likely blocked in a collective with the dead rank:
        // they get the short grace. A cancelled job's ranks can finish their step.
        out.push(if self.failure.is_none() && was_running {
            Action::StopAtStepBoundary
        } else {
            Action::StopProcesses { force: false }
        });
    }

    fn set_end(&mut self, conn: ConnId, end: RankEnd) {
        if let Some(rank) = self.conn_rank.get(&conn).copied() {
            if let Some(r) = self.ranks.get_mut(&rank) {
                r.end.get_or_insert(end);
            }
        }
    }

    fn check_done(&mut self, out: &mut Vec<Action>) {
        if !self.launched || !self.alive.is_empty() || self.phase == Phase::Done {
            return;
        }
        if self.conn_rank.is_empty() {
            self.finish(out);
        } else if !out.contains(&Action::StartDrainTimer) {
            out.push(Action::StartDrainTimer);
        }
    }

    fn finish(&mut self, out: &mut Vec<Action>) {
        self.phase = Phase::Done;
        let all_ended = self.ranks.len() as u64 == self.world_size
            && self.ranks.values().all(|r| r.ended_well());
        // The ranks agree on the step to stop after; the first one that names its own
        // cause (not "another rank was asked") says who asked.
        let stopped: Vec<(u64, u64, &str)> = self
            .ranks
            .values()
            .filter_map(|r| match &r.end {
                Some(RankEnd::Stopped { step, reason }) => {
                    Some((r.registration.rank, *step, reason.as_str()))
                }
                _ => None,
            })
            .collect();
        let step = stopped.iter().map(|(_, step, _)| *step).min();
        // A cancel that came during the last step finds the ranks finished: the run is.
        let completed = all_ended && stopped.is_empty();
        let outcome = if let Some(f) = self.failure.take() {
            Outcome::Failed(f)
        } else if let Some(by) = self.cancelled.take().filter(|_| !completed) {
            Outcome::Cancelled { by, step }
        } else if all_ended && !stopped.is_empty() {
            let by = stopped
                .iter()
                .find(|(_, _, reason)| !reason.starts_with("another rank"))
                .map(|(rank, _, reason)| format!("{reason} to rank {rank}"))
                .unwrap_or_else(|| "a request to the ranks".to_string());
            Outcome::Cancelled { by, step }
        } else if all_ended
            && self
                .ranks
                .values()
                .any(|r| r.end == Some(RankEnd::Finished { preempted: true }))
        {
            Outcome::Preempted
        } else if all_ended {
            Outcome::Succeeded
        } else {
            Outcome::Failed(Failure::job(FailureCause::ExitedWithoutFinishing))
        };
        out.push(Action::Finish(outcome));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(rank: u64) -> Registration {
        Registration {
            rank,
            local_rank: rank,
            world_size: 2,
            host: format!("node{rank}"),
            pid: 100 + rank as u32,
            device: "cpu".into(),
            config_hash: "abc".into(),
            collective_addr: Some(format!("node{rank}:9{rank}")),
            nccl_unique_id: None,
            device_error: None,
        }
    }

    /// A two-rank local job, launched and fully registered (connections 10 and 11).
    fn running() -> JobMachine {
        let mut s = JobMachine::new(2, "abc");
        s.handle(Event::Launched {
            procs: vec![(0, Some(0)), (1, Some(1))],
        });
        s.handle(Event::Registered {
            conn: 10,
            registration: reg(0),
        });
        let actions = s.handle(Event::Registered {
            conn: 11,
            registration: reg(1),
        });
        assert_eq!(
            actions
                .iter()
                .filter(|a| matches!(a, Action::Send { .. }))
                .count(),
            2
        );
        s
    }

    fn failure(actions: &[Action]) -> Option<Failure> {
        actions.iter().find_map(|a| match a {
            Action::Finish(Outcome::Failed(f)) => Some(f.clone()),
            _ => None,
        })
    }

    #[test]
    fn start_goes_to_every_rank_once_all_registered() {
        let mut s = JobMachine::new(2, "abc");
        s.handle(Event::Launched {
            procs: vec![(0, Some(0)), (1, Some(1))],
        });
        assert!(s
            .handle(Event::Registered {
                conn: 11,
                registration: reg(1)
            })
            .iter()
            .all(|a| !matches!(a, Action::Send { .. })));
        let actions = s.handle(Event::Registered {
            conn: 10,
            registration: reg(0),
        });
        let starts: Vec<_> = actions
            .iter()
            .filter_map(|a| match a {
                Action::Send {
                    conn,
                    msg: ToWorker::Start(info),
                } => Some((*conn, info.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(starts.len(), 2);
        let info = &starts[0].1;
        assert_eq!(
            info.peers.iter().map(|p| p.rank).collect::<Vec<_>>(),
            vec![0, 1]
        );
        assert_eq!(info.peers[1].collective_addr.as_deref(), Some("node1:91"));
        assert_eq!(s.phase(), Phase::Running);
    }

    #[test]
    fn duplicate_rank_and_mismatched_hash_fail_the_job() {
        let mut s = JobMachine::new(2, "abc");
        s.handle(Event::Launched {
            procs: vec![(0, None)],
        });
        s.handle(Event::Registered {
            conn: 1,
            registration: reg(0),
        });
        let actions = s.handle(Event::Registered {
            conn: 2,
            registration: reg(0),
        });
        assert!(actions.contains(&Action::Close { conn: 2 }));
        assert!(actions.contains(&Action::StopProcesses { force: false }));
        assert!(matches!(s.phase(), Phase::Stopping));

        let mut s = JobMachine::new(2, "abc");
        let mut bad = reg(1);
        bad.config_hash = "zzz".into();
        let actions = s.handle(Event::Registered {
            conn: 2,
            registration: bad,
        });
        let said = actions.iter().find_map(|a| match a {
            Action::Say(t) => Some(t.clone()),
            _ => None,
        });
        assert!(said.unwrap().contains("config hash zzz"));
    }

    #[test]
    fn rendezvous_timeout_names_missing_ranks() {
        let mut s = JobMachine::new(4, "abc");
        s.handle(Event::Launched {
            procs: vec![(0, None)],
        });
        let mut r = reg(2);
        r.world_size = 4;
        s.handle(Event::Registered {
            conn: 1,
            registration: r,
        });
        let actions = s.handle(Event::RendezvousTimeout);
        match actions.iter().find_map(|a| match a {
            Action::Say(t) => Some(t.clone()),
            _ => None,
        }) {
            Some(text) => assert!(text.contains("0, 1, 3"), "{text}"),
            None => panic!("no message"),
        }
        // Timing out after the start is meaningless.
        let mut s = running();
        assert!(s.handle(Event::RendezvousTimeout).is_empty());
    }

    #[test]
    fn killed_rank_stops_the_others_and_fails_with_its_signal() {
        let mut s = running();
        let actions = s.handle(Event::Disconnected {
            conn: 11,
            error: None,
        });
        assert!(actions.contains(&Action::Send {
            conn: 10,
            msg: ToWorker::Shutdown {
                reason: "rank 1 failed".into()
            }
        }));
        assert!(actions.contains(&Action::StopProcesses { force: false }));
        assert!(s
            .handle(Event::ProcessExited {
                proc: 1,
                exit: ExitInfo::Signal(9)
            })
            .is_empty());
        s.handle(Event::Disconnected {
            conn: 10,
            error: None,
        });
        let actions = s.handle(Event::ProcessExited {
            proc: 0,
            exit: ExitInfo::Signal(15),
        });
        let f = failure(&actions).expect("job failed");
        assert_eq!(
            (f.rank, f.host.as_deref(), f.exit),
            (Some(1), Some("node1"), Some(ExitInfo::Signal(9)))
        );
    }

    #[test]
    fn exit_before_disconnect_is_also_a_failure() {
        let mut s = running();
        let actions = s.handle(Event::ProcessExited {
            proc: 0,
            exit: ExitInfo::Code(1),
        });
        assert!(actions.contains(&Action::StopProcesses { force: false }));
        s.handle(Event::Disconnected {
            conn: 10,
            error: None,
        });
        s.handle(Event::ProcessExited {
            proc: 1,
            exit: ExitInfo::Signal(15),
        });
        let actions = s.handle(Event::Disconnected {
            conn: 11,
            error: None,
        });
        let f = failure(&actions).unwrap();
        assert_eq!((f.rank, f.exit), (Some(0), Some(ExitInfo::Code(1))));
    }

    #[test]
    fn clean_exit_before_the_last_messages_are_read_is_not_a_failure() {
        let mut s = running();
        for (conn, proc) in [(10, 0), (11, 1)] {
            let actions = s.handle(Event::ProcessExited {
                proc,
                exit: ExitInfo::Code(0),
            });
            assert!(
                actions.iter().all(|a| !matches!(a, Action::Say(_))),
                "{actions:?}"
            );
            s.handle(Event::Finished {
                conn,
                preempted: false,
            });
        }
        s.handle(Event::Disconnected {
            conn: 10,
            error: None,
        });
        let actions = s.handle(Event::Disconnected {
            conn: 11,
            error: None,
        });
        assert_eq!(actions, vec![Action::Finish(Outcome::Succeeded)]);
        // Without the Finished message the connection's end is the failure.
        let mut s = running();
        s.handle(Event::ProcessExited {
            proc: 1,
            exit: ExitInfo::Code(0),
        });
        let actions = s.handle(Event::Disconnected {
            conn: 11,
            error: None,
        });
        assert!(actions
            .iter()
            .any(|a| matches!(a, Action::Say(t) if t.contains("exited without reporting"))));
    }

    #[test]
    fn clean_run_succeeds_after_every_process_and_connection_ended() {
        let mut s = running();
        for (conn, proc) in [(10, 0), (11, 1)] {
            s.handle(Event::Finished {
                conn,
                preempted: false,
            });
            assert!(s
                .handle(Event::ProcessExited {
                    proc,
                    exit: ExitInfo::Code(0)
                })
                .iter()
                .all(|a| !matches!(a, Action::Finish(_))));
        }
        let actions = s.handle(Event::Disconnected {
            conn: 10,
            error: None,
        });
        assert!(actions.contains(&Action::StartDrainTimer));
        let actions = s.handle(Event::Disconnected {
            conn: 11,
            error: None,
        });
        assert_eq!(actions, vec![Action::Finish(Outcome::Succeeded)]);
        assert!(s
            .handle(Event::Cancel {
                signal: "SIGTERM".into()
            })
            .is_empty());
    }

    #[test]
    fn srun_step_exit_without_finished_names_the_lost_rank() {
        let mut s = JobMachine::new(2, "abc");
        s.handle(Event::Launched {
            procs: vec![(7, None)],
        });
        s.handle(Event::Registered {
            conn: 10,
            registration: reg(0),
        });
        s.handle(Event::Registered {
            conn: 11,
            registration: reg(1),
        });
        s.handle(Event::Finished {
            conn: 10,
            preempted: false,
        });
        s.handle(Event::Disconnected {
            conn: 10,
            error: None,
        });
        let actions = s.handle(Event::Disconnected {
            conn: 11,
            error: Some("reset".into()),
        });
        assert!(actions
            .iter()
            .any(|a| matches!(a, Action::Say(t) if t.contains("rank 1"))));
        let actions = s.handle(Event::ProcessExited {
            proc: 7,
            exit: ExitInfo::Code(137),
        });
        let f = failure(&actions).unwrap();
        assert_eq!(f.rank, Some(1));
    }

    #[test]
    fn cancel_shuts_down_then_second_signal_forces() {
        let mut s = running();
        let actions = s.handle(Event::Cancel {
            signal: "SIGINT".into(),
        });
        assert_eq!(
            actions
                .iter()
                .filter(|a| matches!(
                    a,
                    Action::Send {
                        msg: ToWorker::Shutdown { .. },
                        ..
                    }
                ))
                .count(),
            2
        );
        let actions = s.handle(Event::Cancel {
            signal: "SIGINT".into(),
        });
        assert!(actions.contains(&Action::StopProcesses { force: true }));
        // Ranks dying of the shutdown are not failures.
        s.handle(Event::Disconnected {
            conn: 10,
            error: None,
        });
        s.handle(Event::Disconnected {
            conn: 11,
            error: None,
        });
        s.handle(Event::ProcessExited {
            proc: 0,
            exit: ExitInfo::Signal(15),
        });
        let actions = s.handle(Event::ProcessExited {
            proc: 1,
            exit: ExitInfo::Code(3),
        });
        assert_eq!(
            actions,
            vec![Action::Finish(Outcome::Cancelled {
                by: "SIGINT".into(),
                step: None
            })]
        );
    }

    #[test]
    fn a_cancel_lets_the_ranks_stop_at_a_step_boundary() {
        let mut s = running();
        let actions = s.handle(Event::Cancel {
            signal: "SIGTERM".into(),
        });
        assert!(actions.contains(&Action::StopAtStepBoundary), "{actions:?}");
        // Each rank stops after the agreed step, exits with a stop status, possibly before
        // its message is read.
        for (conn, proc) in [(10, 0), (11, 1)] {
            assert!(s
                .handle(Event::ProcessExited {
                    proc,
                    exit: ExitInfo::Code(3),
                })
                .iter()
                .all(|a| !matches!(a, Action::Say(_))));
            s.handle(Event::Stopped {
                conn,
                step: 150,
                reason: "the job was cancelled (SIGTERM)".into(),
            });
        }
        s.handle(Event::Disconnected {
            conn: 10,
            error: None,
        });
        let actions = s.handle(Event::Disconnected {
            conn: 11,
            error: None,
        });
        let outcome = Outcome::Cancelled {
            by: "SIGTERM".into(),
            step: Some(150),
        };
        assert_eq!(outcome.exit_code(), 143);
        assert_eq!(actions, vec![Action::Finish(outcome)]);
    }

    #[test]
    fn a_cancel_during_the_last_step_finds_the_run_finished() {
        let mut s = running();
        s.handle(Event::Cancel {
            signal: "SIGINT".into(),
        });
        for (conn, proc) in [(10, 0), (11, 1)] {
            s.handle(Event::Finished {
                conn,
                preempted: false,
            });
            s.handle(Event::Disconnected { conn, error: None });
            let actions = s.handle(Event::ProcessExited {
                proc,
                exit: ExitInfo::Code(0),
            });
            if proc == 1 {
                assert_eq!(actions, vec![Action::Finish(Outcome::Succeeded)]);
            }
        }
    }

    #[test]
    fn ranks_stopped_by_their_own_signal_end_the_job_cancelled_not_failed() {
        let mut s = running();
        s.handle(Event::Stopped {
            conn: 11,
            step: 7,
            reason: "SIGTERM".into(),
        });
        s.handle(Event::Stopped {
            conn: 10,
            step: 7,
            reason: "another rank was asked to stop".into(),
        });
        assert!(s
            .handle(Event::ProcessExited {
                proc: 1,
                exit: ExitInfo::Code(143),
            })
            .is_empty());
        s.handle(Event::ProcessExited {
            proc: 0,
            exit: ExitInfo::Code(3),
        });
        s.handle(Event::Disconnected {
            conn: 10,
            error: None,
        });
        let actions = s.handle(Event::Disconnected {
            conn: 11,
            error: None,
        });
        assert_eq!(
            actions,
            vec![Action::Finish(Outcome::Cancelled {
                by: "SIGTERM to rank 1".into(),
                step: Some(7)
            })]
        );
    }

    #[test]
    fn ranks_that_do_not_stop_in_time_are_named_when_killed() {
        let mut s = running();
        s.handle(Event::Cancel {
            signal: "SIGINT".into(),
        });
        s.handle(Event::Stopped {
            conn: 10,
            step: 3,
            reason: "the job was cancelled (SIGINT)".into(),
        });
        let said: Vec<String> = s
            .handle(Event::Escalated)
            .into_iter()
            .filter_map(|a| match a {
                Action::Say(t) => Some(t),
                _ => None,
            })
            .collect();
        assert_eq!(
            said,
            vec!["rank 1 on node1 (pid 101) did not stop in time: killing it".to_string()]
        );
    }

    #[test]
    fn preemption_asks_every_rank_and_ends_preempted() {
        let mut s = running();
        let actions = s.handle(Event::Preempt);
        assert!(actions.contains(&Action::Send {
            conn: 10,
            msg: ToWorker::Preempt
        }));
        assert!(actions.contains(&Action::Send {
            conn: 11,
            msg: ToWorker::Preempt
        }));
        assert!(
            s.handle(Event::Preempt).is_empty(),
            "a second signal changes nothing"
        );
        for (conn, proc) in [(10, 0), (11, 1)] {
            s.handle(Event::Finished {
                conn,
                preempted: true,
            });
            s.handle(Event::Disconnected { conn, error: None });
            let actions = s.handle(Event::ProcessExited {
                proc,
                exit: ExitInfo::Code(0),
            });
            if proc == 1 {
                assert_eq!(actions, vec![Action::Finish(Outcome::Preempted)]);
            }
        }
    }

    #[test]
    fn preemption_during_rendezvous_is_delivered_with_start() {
        let mut s = JobMachine::new(2, "abc");
        s.handle(Event::Launched {
            procs: vec![(0, Some(0)), (1, Some(1))],
        });
        s.handle(Event::Registered {
            conn: 10,
            registration: reg(0),
        });
        assert!(s
            .handle(Event::Preempt)
            .iter()
            .all(|a| !matches!(a, Action::Send { .. })));
        let actions = s.handle(Event::Registered {
            conn: 11,
            registration: reg(1),
        });
        assert!(actions.contains(&Action::Send {
            conn: 11,
            msg: ToWorker::Preempt
        }));
    }

    #[test]
    fn a_killed_peer_is_blamed_over_the_rank_that_reported_the_broken_collective() {
        let mut s = running();
        s.handle(Event::WorkerFailed {
            conn: 10,
            error: "peer rank 1 closed".into(),
        });
        s.handle(Event::Disconnected {
            conn: 11,
            error: None,
        });
        s.handle(Event::ProcessExited {
            proc: 1,
            exit: ExitInfo::Signal(9),
        });
        s.handle(Event::Disconnected {
            conn: 10,
            error: None,
        });
        let actions = s.handle(Event::ProcessExited {
            proc: 0,
            exit: ExitInfo::Code(1),
        });
        assert_eq!(failure(&actions).unwrap().rank, Some(1));
        // Once the controller signals the ranks itself, signals prove nothing.
        let mut s = running();
        s.handle(Event::WorkerFailed {
            conn: 10,
            error: "out of memory".into(),
        });
        s.handle(Event::Escalated);
        s.handle(Event::Disconnected {
            conn: 11,
            error: None,
        });
        s.handle(Event::ProcessExited {
            proc: 1,
            exit: ExitInfo::Signal(15),
        });
        s.handle(Event::Disconnected {
            conn: 10,
            error: None,
        });
        let actions = s.handle(Event::ProcessExited {
            proc: 0,
            exit: ExitInfo::Code(1),
        });
        assert_eq!(failure(&actions).unwrap().rank, Some(0));
    }

    #[test]
    fn heartbeat_loss_and_reported_errors_fail_the_job() {
        let mut s = running();
        let actions = s.handle(Event::HeartbeatLost { conn: 10 });
        assert!(actions
            .iter()
            .any(|a| matches!(a, Action::Say(t) if t.contains("heartbeat"))));
        let mut s = running();
        let actions = s.handle(Event::WorkerFailed {
            conn: 11,
            error: "out of memory".into(),
        });
        assert!(actions
            .iter()
            .any(|a| matches!(a, Action::Say(t) if t.contains("out of memory"))));
    }

    #[test]
    fn a_node_without_a_usable_gpu_fails_the_job_once_before_it_starts() {
        let mut s = JobMachine::new(2, "abc");
        s.handle(Event::Launched {
            procs: vec![(0, Some(0)), (1, Some(1))],
        });
        let problem = "node node0: `device: cuda`, but no NVIDIA driver is loaded on this node";
        let bad = |rank| Registration {
            device_error: Some(problem.into()),
            ..reg(rank)
        };
        let first = s.handle(Event::Registered {
            conn: 10,
            registration: bad(0),
        });
        let says: Vec<&String> = first
            .iter()
            .filter_map(|a| match a {
                Action::Say(t) => Some(t),
                _ => None,
            })
            .collect();
        assert_eq!(says.len(), 1, "{first:?}");
        assert!(
            says[0].contains("rank 0 on node0") && says[0].contains("cannot use its device"),
            "{}",
            says[0]
        );
        assert!(says[0].contains(problem));
        assert!(!first.iter().any(|a| matches!(
            a,
            Action::Send {
                msg: ToWorker::Start(_),
                ..
            }
        )));
        // The other rank of the node has the same problem: closed, nothing said again.
        let second = s.handle(Event::Registered {
            conn: 11,
            registration: bad(1),
        });
        assert_eq!(second, vec![Action::Close { conn: 11 }]);
        s.handle(Event::ProcessExited {
            proc: 0,
            exit: ExitInfo::Code(1),
        });
        let end = s.handle(Event::ProcessExited {
            proc: 1,
            exit: ExitInfo::Code(1),
        });
        let f = failure(&end).expect("the job failed");
        assert_eq!(f.rank, Some(0));
        assert!(matches!(f.cause, FailureCause::Device { .. }));
    }

    #[test]
    fn a_rank_that_stops_making_progress_is_named_with_where_the_others_are() {
        let mut s = running();
        for (conn, step) in [(10, 7), (11, 6)] {
            assert!(s.handle(Event::Progress { conn, step }).is_empty());
        }
        let actions = s.handle(Event::Stalled {
            conn: 11,
            step: 6,
            secs: 1800,
        });
        let text = actions
            .iter()
            .find_map(|a| match a {
                Action::Say(t) => Some(t.clone()),
                _ => None,
            })
            .expect("the failure is said");
        assert!(text.starts_with("rank 1 on node1"), "{text}");
        assert!(
            text.contains("no progress for 1800 s") && text.contains("rank 0 at step 7"),
            "{text}"
        );
        assert!(actions.iter().any(|a| matches!(
            a,
            Action::Send {
                msg: ToWorker::Shutdown { .. },
                ..
            }
        )));
    }
}
