//! The job's life as a pure state machine: rendezvous, running, failure policy, cancellation
//! and preemption. [`JobMachine::handle`] turns one [`Event`] into [`Action`]s; it does no I/O,
//! so every decision is unit-tested with plain values (in `job/tests.rs`). The event loop in
//! [`super::event_loop`] only moves events in and carries actions out. Whether a registration
//! belongs to the job, and what the ranks are told to start, is the [`Roster`]'s to say (the
//! same one rank 0 uses in a launch without the controller).

use super::collective_lag::{rank_list, Lag};
use super::notice::Notice;
use super::outcome::{CancelledBy, ExitInfo, Failure, FailureCause, Outcome};
use super::stop_signal::StopSignal;
use crate::events_file::RunEvent;
use shardrun_protocol::messages::{Registration, StopReason, ToWorker};
use shardrun_protocol::rendezvous::Roster;
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
    /// Only `started` of the processes were started: `problem` says why the next one (of
    /// `rank`, where known) could not be.
    LaunchFailed {
        started: Vec<(ProcId, Option<u64>)>,
        rank: Option<u64>,
        problem: String,
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
        reason: StopReason,
    },
    /// The rank reported an error; `lag`: ranks behind in the collectives at that moment;
    /// `because_of`: the peer rank its error names as the cause.
    WorkerFailed {
        conn: ConnId,
        error: String,
        lag: Option<Lag>,
        because_of: Option<u64>,
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
    /// The rank says it completed `step` optimizer steps (a heartbeat, or a step record).
    Progress {
        conn: ConnId,
        step: u64,
    },
    /// The rank heartbeats but has stayed at `step` for `secs` seconds (past the progress
    /// timeout), and so has the whole job; `lag`: the ranks behind in the collectives.
    Stalled {
        conn: ConnId,
        step: u64,
        secs: u64,
        lag: Option<Lag>,
    },
    ProcessExited {
        proc: ProcId,
        exit: ExitInfo,
    },
    /// Not every rank registered within `waited_secs` of the launch; `nodes`: the Slurm
    /// allocation's nodes (empty outside Slurm, or on one node).
    RendezvousTimeout {
        waited_secs: u64,
        nodes: Vec<String>,
    },
    /// After all processes exited, connections still open are given up on.
    DrainTimeout,
    /// SIGTERM / SIGINT / SIGHUP to the controller.
    Cancel {
        signal: StopSignal,
    },
    /// SIGUSR2: preemption or time limit ahead.
    Preempt(Notice),
    /// The run directory stopped taking the job's records (`why`: the write's error).
    RunDirectoryUnwritable {
        why: String,
    },
    /// The controller itself started signalling the workers (after the shutdown grace).
    Escalated,
    /// `waited_secs` after the ranks were asked to stop ([`Action::WatchStopping`]); `lag`:
    /// the ranks behind in the collectives, if some stood still there.
    StopOverdue {
        waited_secs: u64,
        lag: Option<Lag>,
    },
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
    /// The ranks were asked to stop or to checkpoint and stop: send [`Event::StopOverdue`]
    /// a few times while they do, so that ranks that never get there are named.
    WatchStopping,
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
    Stopped { step: u64, reason: StopReason },
    Failed,
}

/// A registered rank's connection and how far it got (its registration is in the roster).
#[derive(Debug, Clone)]
struct RankState {
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
    phase: Phase,
    roster: Roster,
    /// The ranks the roster admitted, by rank.
    ranks: BTreeMap<u64, RankState>,
    conn_rank: HashMap<ConnId, u64>,
    proc_rank: HashMap<ProcId, Option<u64>>,
    alive: BTreeSet<ProcId>,
    /// Exit statuses of ranks (local mode), kept for failures judged later.
    exits: HashMap<u64, ExitInfo>,
    launched: bool,
    failure: Option<Failure>,
    cancelled: Option<StopSignal>,
    preempting: Option<Notice>,
    /// Whether a SIGTERM or SIGUSR2 that kills a rank was Slurm's notice (the ranks are the
    /// tasks of a Slurm step), not a failure.
    signals_are_notices: bool,
    /// A rank died of such a notice before it could take it (its handlers are installed
    /// once its process has started): the job ends preempted, without a new checkpoint.
    killed_by_notice: bool,
    /// The controller itself received a notice (SIGUSR2): what killed a rank was one.
    notice_received: bool,
    /// The first signal that cancels the job the controller itself received.
    cancel_received: Option<StopSignal>,
    /// The job is cancelled under Slurm, or its run directory cannot be written: the ranks
    /// were asked to checkpoint, then stop.
    checkpoint_then_stop: bool,
    /// Why the run directory cannot be written, once the ranks were stopped for it.
    run_dir_unwritable: Option<String>,
    /// Why the ranks were asked to stop, once they were: also told to a rank that registers
    /// afterwards (it was still starting).
    stop_reason: Option<String>,
    /// The optimizer steps the job trains, where the controller told it.
    total_steps: Option<u64>,
    escalated: bool,
    /// [`Action::WatchStopping`] was asked for (once is enough).
    watching_stop: bool,
}

impl JobMachine {
    pub fn new(world_size: u64, config_hash: impl Into<String>) -> Self {
        JobMachine {
            phase: Phase::Rendezvous,
            roster: Roster::new(world_size, config_hash),
            ranks: BTreeMap::new(),
            conn_rank: HashMap::new(),
            proc_rank: HashMap::new(),
            alive: BTreeSet::new(),
            exits: HashMap::new(),
            launched: false,
            failure: None,
            cancelled: None,
            preempting: None,
            signals_are_notices: false,
            killed_by_notice: false,
            notice_received: false,
            cancel_received: None,
            checkpoint_then_stop: false,
            run_dir_unwritable: None,
            stop_reason: None,
            total_steps: None,
            escalated: false,
            watching_stop: false,
        }
    }

    /// The ranks are tasks of a Slurm step: a SIGTERM or SIGUSR2 that kills one is Slurm's
    /// preemption (or time-limit) notice arriving before the rank could take it.
    pub fn with_slurm_notices(mut self) -> Self {
        self.signals_are_notices = true;
        self
    }

    /// The job trains `steps` optimizer steps: a stop once every rank has done them finds
    /// no step boundary left, and is said so.
    pub fn with_total_steps(mut self, steps: u64) -> Self {
        self.total_steps = Some(steps);
        self
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Whether the controller itself received a notice (SIGUSR2, or Slurm's requeue).
    pub fn notice_received(&self) -> bool {
        self.notice_received
    }

    /// The first signal that cancels the job the controller itself received.
    pub fn cancel_received(&self) -> Option<StopSignal> {
        self.cancel_received
    }

    /// The last step every registered rank had completed, as their heartbeats said.
    pub fn steps_done(&self) -> Option<u64> {
        self.ranks.values().map(|r| r.step).min()
    }

    /// Host and pid of a registered rank, for messages.
    pub fn registration(&self, rank: u64) -> Option<&Registration> {
        self.roster.get(rank)
    }

    pub fn handle(&mut self, event: Event) -> Vec<Action> {
        let mut out = Vec::new();
        if self.phase == Phase::Done {
            return out;
        }
        match event {
            Event::Launched { procs } => self.on_launch(procs),
            Event::LaunchFailed {
                started,
                rank,
                problem,
            } => {
                self.on_launch(started);
                let mut failure = Failure::job(FailureCause::Launch { problem });
                failure.rank = rank;
                self.fail(failure, &mut out);
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
            Event::WorkerFailed {
                conn,
                error,
                lag,
                because_of,
            } => {
                self.set_end(conn, RankEnd::Failed);
                if let Some(rank) = self.conn_rank.get(&conn).copied() {
                    let mut failure = self.failure_of(rank, FailureCause::Reported { error });
                    // Behind alone, the rank's own error says why.
                    failure.lag = lag.filter(|lag| lag.ranks != [rank]);
                    failure.follows = because_of.filter(|&peer| peer != rank);
                    match &self.failure {
                        None => self.fail(failure, &mut out),
                        // Connections are read concurrently: a peer's report of the broken
                        // collective can overtake the report of the rank that broke it. (Two
                        // ranks that name each other: the first report stands.)
                        Some(current)
                            if current.follows == Some(rank) && failure.follows != current.rank =>
                        {
                            failure.exit = self.exits.get(&rank).cloned();
                            self.blame_instead(failure, &mut out);
                        }
                        Some(_) => {}
                    }
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
                let unreported = r.end.is_none();
                // Under srun no process is the rank's own, so no exit status will say more:
                // the rank a reported failure named as its cause, hanging up without a
                // report of its own, died, and is the cause (else a killed rank's peer,
                // whose report came first, is blamed).
                let own_process = self.proc_rank.values().any(|&p| p == Some(rank));
                let named_as_cause = self.failure.as_ref().is_some_and(|current| {
                    current.follows == Some(rank)
                        && current.rank != Some(rank)
                        && matches!(current.cause, FailureCause::Reported { .. })
                });
                if unreported && !own_process && named_as_cause {
                    let why = error
                        .clone()
                        .unwrap_or_else(|| "closed without a report of its own".to_string());
                    let cause = self.failure_of(rank, FailureCause::ConnectionLost { why });
                    self.blame_instead(cause, &mut out);
                    return out;
                }
                let Some(r) = self.ranks.get_mut(&rank) else {
                    return out;
                };
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
                        self.heartbeat_lost(rank, &mut out);
                    }
                }
            }
            Event::Progress { conn, step } => {
                if let Some(r) = self
                    .conn_rank
                    .get(&conn)
                    .and_then(|rank| self.ranks.get_mut(rank))
                {
                    // Heartbeats and step records travel apart: keep the furthest.
                    r.step = r.step.max(step);
                }
            }
            Event::Stalled {
                conn,
                step,
                secs,
                lag,
            } => {
                if let Some(rank) = self.conn_rank.get(&conn).copied() {
                    if self.ranks.get(&rank).is_some_and(|r| r.end.is_none()) {
                        // The whole job stands still: name a rank the others wait for, if
                        // the collective counts tell one.
                        let (rank, step) = match lag.as_ref().and_then(|lag| self.culprit(lag)) {
                            Some(behind) if behind != rank => (behind, self.ranks[&behind].step),
                            _ => (rank, step),
                        };
                        let others = self.steps_of_others(rank);
                        let mut failure =
                            self.failure_of(rank, FailureCause::Stalled { step, secs, others });
                        failure.lag = lag;
                        self.fail(failure, &mut out);
                    }
                }
            }
            Event::ProcessExited { proc, exit } => self.on_exit(proc, exit, &mut out),
            Event::RendezvousTimeout { waited_secs, nodes } => {
                if self.phase == Phase::Rendezvous {
                    let missing = self.roster.missing();
                    let registered: BTreeSet<&str> = self
                        .roster
                        .registrations()
                        .map(|r| r.host.as_str())
                        .collect();
                    // A node none of whose ranks got through: they did not start there, or
                    // cannot reach the controller (a network, an interface, a firewall).
                    // Hosts may name themselves by their full name (`node1.cluster`).
                    let same = |node: &str, host: &str| {
                        let within = |short: &str, long: &str| {
                            long.strip_prefix(short)
                                .is_some_and(|rest| rest.starts_with('.'))
                        };
                        node == host || within(node, host) || within(host, node)
                    };
                    let silent_nodes = nodes
                        .into_iter()
                        .filter(|node| !registered.iter().any(|host| same(node, host)))
                        .collect();
                    self.fail(
                        Failure::job(FailureCause::RendezvousTimeout {
                            missing,
                            waited_secs,
                            silent_nodes,
                        }),
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
                let first_signal = self.cancel_received.is_none();
                self.cancel_received.get_or_insert(signal);
                let again_kills = signal.again_kills();
                let slurm_terminate = self.signals_are_notices
                    && signal == StopSignal::Terminate
                    && self.phase == Phase::Running
                    && self.stop_reason.is_none();
                if self.killed_by_notice && !self.notice_received && self.cancelled.is_none() {
                    // The signal that ended a starting rank was taken for a notice; the
                    // controller's own says what it was: a cancel (`scancel` signals the
                    // batch script and the ranks at once). The ranks are stopping already.
                    self.killed_by_notice = false;
                    self.preempting = None;
                    self.cancelled = Some(signal);
                    out.push(Action::Say(format!(
                        "received {signal}: the job is cancelled, not preempted"
                    )));
                } else if slurm_terminate && self.checkpoint_then_stop {
                    // Slurm's, again: its kill follows by itself, and the checkpoint goes on.
                } else if slurm_terminate && self.preempting.is_some() {
                    // The ranks checkpoint for a notice already (the time limit's SIGTERM can
                    // come while they write): they finish, and the job ends as the notice
                    // said, requeued.
                    if first_signal {
                        out.push(Action::Say(format!(
                            "received {signal} while the ranks checkpoint for the notice: they \
                             finish it and stop (SIGINT to stop them without it)"
                        )));
                    }
                } else if self.stop_reason.is_some() {
                    if again_kills {
                        out.push(Action::Say(format!(
                            "{signal} again: killing the workers now"
                        )));
                        // Said here, not on `Escalated`: the ranks are killed by request,
                        // not for running past a timeout.
                        self.escalated = true;
                        self.say_killed(
                            |rank| {
                                format!(
                                    "{rank} has not stopped yet: killing it now ({signal} again)"
                                )
                            },
                            &mut out,
                        );
                        out.push(Action::StopProcesses { force: true });
                    }
                } else if slurm_terminate {
                    // Slurm kills the job KillWait (30 s by default) after this SIGTERM, as it
                    // does a preempted one, and the ranks cannot tell the two apart (they
                    // get it too): saving for both makes what a cancel leaves one thing.
                    out.push(Action::Say(format!(
                        "received {signal}: the ranks checkpoint at their next step boundary \
                         and stop, before Slurm's kill (SIGINT to stop them without one)"
                    )));
                    self.cancelled.get_or_insert(signal);
                    self.checkpoint_then_stop = true;
                    let reason = format!("the job was cancelled ({signal})");
                    self.tell_ranks_still_going(ToWorker::CheckpointAndStop { reason }, &mut out);
                    // Where no kill of Slurm's follows (`scancel --batch`, a `kill` of the
                    // controller), a rank that never gets there is still killed.
                    out.push(Action::StopAtStepBoundary);
                    self.watch_stopping(&mut out);
                } else {
                    let to_kill = if again_kills {
                        "send it again"
                    } else if self.checkpoint_then_stop || self.preempting.is_some() {
                        // A SIGTERM now leaves the checkpoint under way going on.
                        "SIGINT"
                    } else {
                        "SIGTERM or SIGINT"
                    };
                    let past_the_last_step = self.phase == Phase::Running
                        && self.total_steps.is_some()
                        && self.steps_done() == self.total_steps;
                    out.push(Action::Say(if past_the_last_step {
                        // No step boundary is left: what follows the last step goes on.
                        format!(
                            "received {signal} after the last step: the ranks finish the final \
                             evaluation and checkpoint, and the run ends finished ({to_kill} to \
                             kill them now)"
                        )
                    } else {
                        format!(
                            "received {signal}: the ranks stop at their next step boundary \
                             ({to_kill} to kill them now)"
                        )
                    }));
                    self.cancelled.get_or_insert(signal);
                    self.stop(&format!("the job was cancelled ({signal})"), &mut out);
                }
            }
            Event::Escalated => {
                self.escalated = true;
                self.say_killed(
                    |rank| format!("{rank} did not stop in time: killing it"),
                    &mut out,
                );
            }
            Event::StopOverdue { waited_secs, lag } => {
                if let Some(line) = self.not_stopped(waited_secs, lag.as_ref()) {
                    out.push(Action::Say(line));
                }
            }
            Event::Preempt(notice) => {
                self.notice_received = true;
                // Ranks checkpointing to stop already (a run directory that cannot be
                // written) save the same checkpoint for the notice.
                let taken = self.preempting.is_some()
                    || self.failure.is_some()
                    || self.cancelled.is_some()
                    || self.checkpoint_then_stop;
                if !taken {
                    self.preempting = Some(notice);
                    out.push(Action::Say(format!(
                        "{}: the workers checkpoint at the next step boundary and exit",
                        notice.announced()
                    )));
                    out.push(Action::Record(RunEvent::PreemptRequested { notice }));
                    if self.phase == Phase::Running {
                        for r in self.ranks.values().filter(|r| r.connected) {
                            out.push(Action::Send {
                                conn: r.conn,
                                msg: ToWorker::Preempt,
                            });
                        }
                        self.watch_stopping(&mut out);
                    }
                }
            }
            Event::RunDirectoryUnwritable { why } => self.on_run_dir_unwritable(why, &mut out),
        }
        self.check_done(&mut out);
        out
    }

    /// Training on with nothing recorded would lose every step from here (and the run's
    /// end): the ranks checkpoint at their next step boundary and stop, and the job fails
    /// saying why. A stop already under way (a failure, a cancel, a notice) goes on as it is.
    fn on_run_dir_unwritable(&mut self, why: String, out: &mut Vec<Action>) {
        let stopping = self.failure.is_some()
            || self.cancelled.is_some()
            || self.preempting.is_some()
            || self.checkpoint_then_stop
            || self.stop_reason.is_some();
        if self.run_dir_unwritable.is_some() {
            return;
        }
        if stopping || matches!(self.phase, Phase::Stopping | Phase::Done) {
            // Said all the same: what is missing from the records must not go unmentioned.
            out.push(Action::Say(format!(
                "cannot write the run directory's logs ({why}; is the disk full?): lines and \
                 metrics from here on are not recorded"
            )));
            return;
        }
        match self.phase {
            // Nothing trained yet: nothing to save.
            Phase::Rendezvous => {
                self.fail(
                    Failure::job(FailureCause::RunDirectoryUnwritable { why }),
                    out,
                );
            }
            Phase::Running => {
                out.push(Action::Say(format!(
                    "cannot write the run directory's logs ({why}; is the disk full?): the \
                     ranks checkpoint at their next step boundary and stop, so that no step \
                     goes unrecorded"
                )));
                self.run_dir_unwritable = Some(why);
                self.checkpoint_then_stop = true;
                self.tell_ranks_still_going(
                    ToWorker::CheckpointAndStop {
                        reason: "the run directory cannot be written".into(),
                    },
                    out,
                );
                out.push(Action::StopAtStepBoundary);
                self.watch_stopping(out);
            }
            Phase::Stopping | Phase::Done => unreachable!("returned above"),
        }
    }

    /// One line for each rank that is killed rather than stopped, saying so: `line` words it
    /// from `rank R on HOST (pid P)`.
    fn say_killed(&self, line: impl Fn(&str) -> String, out: &mut Vec<Action>) {
        let killed = self
            .ranks
            .iter()
            .filter(|(_, r)| r.connected && r.end.is_none())
            .filter_map(|(&rank, _)| self.roster.get(rank));
        for reg in killed {
            let rank = format!("rank {} on {} (pid {})", reg.rank, reg.host, reg.pid);
            out.push(Action::Say(line(&rank)));
        }
    }

    fn on_launch(&mut self, procs: Vec<(ProcId, Option<u64>)>) {
        self.launched = true;
        for (proc, rank) in procs {
            self.proc_rank.insert(proc, rank);
            self.alive.insert(proc);
        }
    }

    fn on_register(&mut self, conn: ConnId, reg: Registration, out: &mut Vec<Action>) {
        if self.phase == Phase::Stopping {
            // The job is stopping already (cancelled, or failing: often every rank of a node
            // has the same problem) while this rank was still starting: it is told so, and
            // ends quietly, as the ranks asked before it do; the job's end says why.
            let reason = self.stop_reason.clone().unwrap_or_default();
            out.push(Action::Send {
                conn,
                msg: ToWorker::Shutdown { reason },
            });
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
                lag: None,
                follows: None,
            };
            self.fail(failure, out);
            return;
        }
        let (rank, host, pid) = (reg.rank, reg.host.clone(), reg.pid);
        if let Err(refusal) = self.roster.admit(reg) {
            out.push(Action::Close { conn });
            let failure = Failure {
                rank: Some(rank),
                host: Some(host),
                pid: Some(pid),
                cause: FailureCause::Inconsistent {
                    problem: refusal.to_string(),
                },
                exit: None,
                lag: None,
                follows: None,
            };
            self.fail(failure, out);
            return;
        }
        self.conn_rank.insert(conn, rank);
        self.ranks.insert(
            rank,
            RankState {
                conn,
                connected: true,
                end: None,
                step: 0,
            },
        );
        self.start(out);
    }

    /// Sends every rank the start once the roster is complete.
    fn start(&mut self, out: &mut Vec<Action>) {
        let Some(info) = self.roster.start_info() else {
            return;
        };
        self.phase = Phase::Running;
        let hosts: BTreeSet<&str> = self
            .roster
            .registrations()
            .map(|r| r.host.as_str())
            .collect();
        out.push(Action::Say(format!(
            "{} registered on {} host(s) ({}): starting",
            crate::resolve::all_ranks_words(info.world_size),
            hosts.len(),
            hosts.into_iter().collect::<Vec<_>>().join(", ")
        )));
        for r in self.ranks.values() {
            out.push(Action::Send {
                conn: r.conn,
                msg: ToWorker::Start(info.clone()),
            });
            if self.preempting.is_some() {
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
            self.exits.insert(rank, exit);
        }
        // A rank whose connection dropped first gets its exit status attached afterwards.
        if let (Some(f), Some(rank)) = (&mut self.failure, rank) {
            if f.rank == Some(rank) && f.exit.is_none() {
                f.exit = Some(exit);
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
                self.roster.is_complete()
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
        if self.signals_are_notices
            && exit.is_notice_signal()
            && self.failure.is_none()
            && self.cancelled.is_none()
        {
            let notice = *self.preempting.get_or_insert(Notice::Preemption);
            self.killed_by_notice = true;
            let who = rank.and_then(|rank| self.roster.get(rank)).map_or_else(
                || "the ranks".to_string(),
                |r| format!("rank {} on {}", r.rank, r.host),
            );
            out.push(Action::Say(format!(
                "{who} ended on {exit} before it could take the notice ({}): the job stops \
                 as preempted, to resume from its newest checkpoint",
                notice.announced()
            )));
            self.stop("the job is preempted", out);
            self.check_done(out);
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
            if let Some(lost) = self
                .ranks
                .iter()
                .find(|(_, r)| r.end.is_none() && !r.connected)
                .and_then(|(&rank, _)| self.roster.get(rank))
            {
                failure.rank = Some(lost.rank);
                failure.host = Some(lost.host.clone());
                failure.pid = Some(lost.pid);
            }
        }
        self.fail(failure, out);
    }

    /// A rank reporting an error is often a consequence: its peer was killed and the
    /// collective broke. If another rank then turns out to have died of a signal the
    /// controller did not send, or the rank the report named exits failing without a
    /// report of its own, that rank is the cause and the failure names it instead.
    fn maybe_blame_killed_rank(
        &mut self,
        rank: Option<u64>,
        exit: &ExitInfo,
        out: &mut Vec<Action>,
    ) {
        let Some(rank) = rank else { return };
        let killed = matches!(exit, ExitInfo::Signal(_)) && !self.escalated;
        let Some(current) = &self.failure else { return };
        let named_and_failed = current.follows == Some(rank)
            && !exit.success()
            && self.ranks.get(&rank).is_some_and(|r| r.end.is_none());
        if !killed && !named_and_failed {
            return;
        }
        if current.rank == Some(rank) || !matches!(current.cause, FailureCause::Reported { .. }) {
            return;
        }
        let mut cause = self.failure_of(rank, FailureCause::Exited);
        cause.exit = Some(*exit);
        self.blame_instead(cause, out);
    }

    /// Replaces the failure said so far with `cause`, which it turned out to follow from.
    fn blame_instead(&mut self, cause: Failure, out: &mut Vec<Action>) {
        out.push(Action::Say(format!(
            "{} (the cause of the failure above)",
            cause.describe()
        )));
        self.failure = Some(cause);
    }

    /// The rank of `lag` a stalled job is blamed on: the first of the ranks behind that is
    /// still running.
    fn culprit(&self, lag: &Lag) -> Option<u64> {
        lag.ranks
            .iter()
            .copied()
            .find(|rank| self.ranks.get(rank).is_some_and(|r| r.end.is_none()))
    }

    /// "ranks 0-2 at step 12; rank 3 at step 11": where the ranks other than `rank` are.
    fn steps_of_others(&self, rank: u64) -> String {
        self.steps_of(|r, _| r != rank)
    }

    /// Where the ranks `which` picks stand, by their heartbeats: `ranks 0-2 at step 6; rank 3
    /// at step 7`.
    fn steps_of(&self, which: impl Fn(u64, &RankState) -> bool) -> String {
        let mut by_step: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for (&r, state) in &self.ranks {
            if which(r, state) {
                by_step.entry(state.step).or_default().push(r);
            }
        }
        by_step
            .iter()
            .map(|(step, ranks)| {
                let noun = if ranks.len() == 1 { "rank" } else { "ranks" };
                format!("{noun} {} at step {step}", rank_list(ranks))
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn failure_of(&self, rank: u64, cause: FailureCause) -> Failure {
        let reg = self.roster.get(rank);
        Failure {
            rank: Some(rank),
            host: reg.map(|r| r.host.clone()),
            pid: reg.map(|r| r.pid),
            cause,
            exit: None,
            lag: None,
            follows: None,
        }
    }

    /// `rank` went silent: the job fails, or, when it failed already because another rank
    /// of the same host went silent, that rank is added to the failure and said; once every
    /// rank of the host is silent, as a lost host or network more than hung processes.
    fn heartbeat_lost(&mut self, rank: u64, out: &mut Vec<Action>) {
        let host = self.roster.get(rank).map(|r| r.host.clone());
        let ranks_of_host = self
            .roster
            .registrations()
            .filter(|r| Some(&r.host) == host.as_ref())
            .count();
        if let Some(Failure {
            host: failed_host,
            rank: Some(first),
            cause:
                FailureCause::HeartbeatLost {
                    same_host,
                    whole_host,
                    ..
                },
            ..
        }) = &mut self.failure
        {
            if host.is_some() && *failed_host == host && *first != rank {
                same_host.push(rank);
                *whole_host = same_host.len() + 1 == ranks_of_host;
                let host = host.unwrap_or_default();
                out.push(Action::Say(if *whole_host {
                    format!(
                        "rank {rank} on {host} stopped sending heartbeats too: every rank of \
                         {host} is silent, the host or its network is likely lost"
                    )
                } else {
                    format!("rank {rank} on {host} stopped sending heartbeats too")
                }));
            }
            return;
        }
        let stopped = self
            .roster
            .get(rank)
            .is_some_and(|r| worker_is_stopped(r.pid));
        let cause = FailureCause::HeartbeatLost {
            same_host: Vec::new(),
            whole_host: false,
            stopped,
        };
        self.fail(self.failure_of(rank, cause), out);
    }

    fn fail(&mut self, failure: Failure, out: &mut Vec<Action>) {
        if self.failure.is_some() {
            return;
        }
        if self.cancelled.is_some() {
            // A rank that fails in a cancel's checkpoint leaves the others waiting for it in
            // the save's collectives: say so and stop them (the job stays cancelled).
            if self.checkpoint_then_stop && self.stop_reason.is_none() {
                out.push(Action::Say(format!(
                    "{}; the other ranks stop without the cancel's checkpoint",
                    failure.describe()
                )));
                self.stop_with_grace(
                    "another rank failed in the cancel's checkpoint",
                    Grace::Short,
                    out,
                );
            }
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
        // After a failure the others are likely blocked in a collective with the dead rank:
        // they get the short grace. A cancelled job's ranks can finish their step.
        let grace = match self.failure {
            Some(_) => Grace::Short,
            None => Grace::StepBoundary,
        };
        self.stop_with_grace(reason, grace, out);
    }

    /// Asks every rank still going to stop for `reason`, once; ranks that were not running
    /// yet get the short grace whatever `grace` says.
    fn stop_with_grace(&mut self, reason: &str, grace: Grace, out: &mut Vec<Action>) {
        if self.stop_reason.is_some() {
            return;
        }
        self.stop_reason = Some(reason.to_string());
        let was_running = self.phase == Phase::Running;
        self.phase = Phase::Stopping;
        self.tell_ranks_still_going(
            ToWorker::Shutdown {
                reason: reason.to_string(),
            },
            out,
        );
        if grace == Grace::StepBoundary && was_running {
            out.push(Action::StopAtStepBoundary);
            self.watch_stopping(out);
        } else {
            out.push(Action::StopProcesses { force: false });
        }
    }

    /// Sends `msg` to every rank still connected that has not ended.
    fn tell_ranks_still_going(&self, msg: ToWorker, out: &mut Vec<Action>) {
        for r in self
            .ranks
            .values()
            .filter(|r| r.connected && r.end.is_none())
        {
            out.push(Action::Send {
                conn: r.conn,
                msg: msg.clone(),
            });
        }
    }

    fn watch_stopping(&mut self, out: &mut Vec<Action>) {
        if !self.watching_stop {
            self.watching_stop = true;
            out.push(Action::WatchStopping);
        }
    }

    /// The ranks asked to stop that have not, `waited_secs` after the request: where each
    /// stands and, when some stand still outside a collective the others wait in, which.
    /// `None` once every rank has stopped (or the job is failing: its report names ranks).
    fn not_stopped(&self, waited_secs: u64, lag: Option<&Lag>) -> Option<String> {
        if self.failure.is_some() || self.escalated {
            return None;
        }
        let going = |_: u64, r: &RankState| r.connected && r.end.is_none();
        let ranks: Vec<u64> = self
            .ranks
            .iter()
            .filter(|(&rank, r)| going(rank, r))
            .map(|(&rank, _)| rank)
            .collect();
        if ranks.is_empty() {
            return None;
        }
        let at = self.steps_of(going);
        let ranks_text = rank_list(&ranks);
        let checkpointing =
            self.checkpoint_then_stop || (self.preempting.is_some() && self.cancelled.is_none());
        let mut line = if checkpointing {
            // Past their boundary they write the checkpoint, which may take a while.
            format!(
                "{waited_secs} s after they were asked to checkpoint and stop, rank(s) \
                 {ranks_text} have not stopped yet ({at}, as their heartbeats last said; a \
                 rank past its step boundary may still be writing the checkpoint)"
            )
        } else {
            format!(
                "{waited_secs} s after they were asked to stop, rank(s) {ranks_text} have not \
                 yet reached a step boundary ({at}, as their heartbeats last said)"
            )
        };
        if let Some(lag) = lag.filter(|lag| lag.ranks.iter().all(|r| ranks.contains(r))) {
            line.push_str(&format!("; {}", lag.describe(None)));
        }
        Some(line)
    }

    fn set_end(&mut self, conn: ConnId, end: RankEnd) {
        if let Some(rank) = self.conn_rank.get(&conn).copied() {
            if let Some(r) = self.ranks.get_mut(&rank) {
                r.end.get_or_insert(end);
            }
        }
    }

    fn check_done(&mut self, out: &mut Vec<Action>) {
        if !self.launched || self.phase == Phase::Done {
            return;
        }
        if !self.alive.is_empty() {
            // Slurm requeueing the job kills its batch script KillWait seconds after the
            // SIGTERM, while srun waits two seconds longer for its step: waiting for srun
            // would leave the run's end unrecorded. Once every rank has said it is done and
            // hung up, the end is known.
            let requeued = self.preempting == Some(Notice::SlurmRequeue);
            if requeued
                && self.roster.is_complete()
                && self.conn_rank.is_empty()
                && self.ranks.values().all(|r| r.ended_well())
            {
                self.finish(out);
            }
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
        let all_ended = self.roster.is_complete() && self.ranks.values().all(|r| r.ended_well());
        // The ranks agree on the step to stop after; the first one that names its own
        // cause (not another rank's request) says who asked.
        let stopped: Vec<(u64, u64, &StopReason)> = self
            .ranks
            .iter()
            .filter_map(|(&rank, r)| match &r.end {
                Some(RankEnd::Stopped { step, reason }) => Some((rank, *step, reason)),
                _ => None,
            })
            .collect();
        // Ranks killed before a step boundary (a second Ctrl-C) named none: the step they
        // had all completed, as their heartbeats said, is where the run stands.
        let step = stopped
            .iter()
            .map(|(_, step, _)| *step)
            .min()
            .or_else(|| self.steps_done().filter(|&done| done > 0));
        // A cancel that came during the last step finds the ranks finished: the run is. Ranks
        // that checkpointed for a notice have not: a cancel's own SIGTERM may reach them as
        // one before the controller's word.
        let completed = all_ended
            && self
                .ranks
                .values()
                .all(|r| r.end == Some(RankEnd::Finished { preempted: false }));
        let outcome = if let Some(f) = self.failure.take() {
            Outcome::Failed(f)
        } else if self.killed_by_notice && self.cancelled.is_none() {
            Outcome::Preempted {
                notice: self.preempting.unwrap_or(Notice::Preemption),
            }
        } else if let Some(signal) = self.cancelled.take().filter(|_| !completed) {
            Outcome::Cancelled {
                by: CancelledBy::Signal(signal),
                step,
            }
        } else if let Some(why) = self.run_dir_unwritable.take().filter(|_| !completed) {
            Outcome::Failed(Failure::job(FailureCause::RunDirectoryUnwritable { why }))
        } else if let Some((step, what)) = stopped.iter().find_map(|(_, _, reason)| match reason {
            StopReason::Diverged { step, what } => Some((*step, what.clone())),
            _ => None,
        }) {
            // Not a cancel: the job asked for this end, and it is a failed run.
            Outcome::Failed(Failure::job(FailureCause::Diverged { step, what }))
        } else if all_ended && !stopped.is_empty() {
            let by = stopped
                .iter()
                .find(|(_, _, reason)| **reason != StopReason::Peer)
                .map(|(rank, _, reason)| CancelledBy::Rank {
                    rank: *rank,
                    reason: (*reason).clone(),
                })
                .unwrap_or(CancelledBy::Request);
            Outcome::Cancelled { by, step }
        } else if all_ended
            && self
                .ranks
                .values()
                .any(|r| r.end == Some(RankEnd::Finished { preempted: true }))
        {
            // Without a notice of its own, the ranks took Slurm's: its SIGTERM to them at
            // the start of a preemption's grace time.
            Outcome::Preempted {
                notice: self.preempting.unwrap_or(Notice::Preemption),
            }
        } else if all_ended {
            Outcome::Succeeded
        } else {
            Outcome::Failed(Failure::job(FailureCause::ExitedWithoutFinishing))
        };
        out.push(Action::Finish(outcome));
    }
}

/// How long ranks asked to stop get before they are killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Grace {
    /// Up to the next step boundary (`--stop-timeout`).
    StepBoundary,
    /// The shutdown grace: they are likely blocked with a dead rank.
    Short,
}

/// Whether `pid` is a worker of this host in the stopped state (`T` in `/proc/<pid>/stat`):
/// a SIGSTOP or a Ctrl-Z, not a hang. The name is checked because a rank on another node has
/// a pid that means another process here, or none.
fn worker_is_stopped(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // `pid (comm) state ...`: the name may hold spaces and parentheses, the state follows
    // its last `)`.
    let Some((name, rest)) = stat.rsplit_once(')') else {
        return false;
    };
    name.contains("(shardrun-worke") && rest.trim_start().starts_with('T')
}

#[cfg(test)]
mod tests;
