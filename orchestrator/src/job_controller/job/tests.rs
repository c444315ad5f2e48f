//! [`JobMachine`]'s decisions, one scenario per test, driven with plain values.

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
    launched_and_registered(JobMachine::new(2, "abc"))
}

/// The same job with its ranks the tasks of a Slurm step.
fn running_under_slurm() -> JobMachine {
    launched_and_registered(JobMachine::new(2, "abc").with_slurm_notices())
}

/// Both ranks launched, rank 0 registered (on connection 10), rank 1 not yet.
fn launched_with_rank_0_registered(mut s: JobMachine) -> JobMachine {
    s.handle(Event::Launched {
        procs: vec![(0, Some(0)), (1, Some(1))],
    });
    s.handle(Event::Registered {
        conn: 10,
        registration: reg(0),
    });
    s
}

fn launched_and_registered(s: JobMachine) -> JobMachine {
    let mut s = launched_with_rank_0_registered(s);
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

/// Rank `proc` on connection `conn` says it finished, hangs up and exits 0; returns what
/// its exit made the machine do.
fn finish_rank(s: &mut JobMachine, conn: u64, proc: u64, preempted: bool) -> Vec<Action> {
    s.handle(Event::Finished { conn, preempted });
    leave(s, conn, proc, ExitInfo::Code(0))
}

/// A rank's connection closes, then its process exits.
fn leave(s: &mut JobMachine, conn: u64, proc: u64, exit: ExitInfo) -> Vec<Action> {
    s.handle(Event::Disconnected { conn, error: None });
    s.handle(Event::ProcessExited { proc, exit })
}

/// Both ranks' connections (10 and 11) close cleanly; returns what the second close made
/// the machine do.
fn close_both(s: &mut JobMachine) -> Vec<Action> {
    s.handle(Event::Disconnected {
        conn: 10,
        error: None,
    });
    s.handle(Event::Disconnected {
        conn: 11,
        error: None,
    })
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
fn a_rendezvous_timeout_names_the_nodes_no_rank_registered_from() {
    let mut s = JobMachine::new(3, "abc");
    s.handle(Event::Launched {
        procs: vec![(0, None)],
    });
    // Rank 0 names its host in full; ranks 1 and 2 (node1) never register.
    s.handle(Event::Registered {
        conn: 10,
        registration: Registration {
            host: "node0.cluster".into(),
            world_size: 3,
            ..reg(0)
        },
    });
    let actions = s.handle(Event::RendezvousTimeout {
        waited_secs: 600,
        nodes: vec!["node0".into(), "node1".into()],
    });
    let text = said(&actions);
    assert!(
        text.contains(
            "rank(s) 1, 2 never registered within 600 s; no rank registered from node1 of the \
             allocation"
        ),
        "{text}"
    );
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
    let actions = s.handle(Event::RendezvousTimeout {
        waited_secs: 600,
        nodes: Vec::new(),
    });
    match actions.iter().find_map(|a| match a {
        Action::Say(t) => Some(t.clone()),
        _ => None,
    }) {
        Some(text) => assert!(
            text.contains("rank(s) 0, 1, 3 never registered within 600 s")
                && text.contains("SHARDRUN_RENDEZVOUS_TIMEOUT"),
            "{text}"
        ),
        None => panic!("no message"),
    }
    // Timing out after the start is meaningless.
    let mut s = running();
    assert!(s
        .handle(Event::RendezvousTimeout {
            waited_secs: 600,
            nodes: Vec::new(),
        })
        .is_empty());
}

#[test]
fn a_rank_that_cannot_be_started_fails_the_job_and_stops_the_ones_that_were() {
    // Rank 0 started and registered; rank 1's process could not be started.
    let mut s = JobMachine::new(2, "abc");
    let problem = "cannot execute the worker binary /x: No such file or directory";
    s.handle(Event::Registered {
        conn: 10,
        registration: reg(0),
    });
    let actions = s.handle(Event::LaunchFailed {
        started: vec![(0, Some(0))],
        rank: Some(1),
        problem: problem.into(),
    });
    assert!(actions.contains(&Action::Say(format!(
        "rank 1 could not be started: {problem}"
    ))));
    assert!(actions.contains(&Action::Send {
        conn: 10,
        msg: ToWorker::Shutdown {
            reason: "rank 1 failed".into()
        }
    }));
    assert!(actions.contains(&Action::StopProcesses { force: false }));
    assert!(
        failure(&actions).is_none(),
        "rank 0 still runs: {actions:?}"
    );
    let actions = leave(&mut s, 10, 0, ExitInfo::Signal(15));
    let f = failure(&actions).expect("the job failed");
    assert_eq!(
        (f.rank, f.cause),
        (
            Some(1),
            FailureCause::Launch {
                problem: problem.into()
            }
        )
    );
}

#[test]
fn a_job_none_of_whose_processes_started_fails_at_once() {
    let mut s = JobMachine::new(2, "abc");
    let actions = s.handle(Event::LaunchFailed {
        started: Vec::new(),
        rank: None,
        problem: "cannot execute `srun`: not found".into(),
    });
    let f = failure(&actions).expect("nothing is left to wait for");
    assert_eq!(
        f.describe(),
        "the job could not start its ranks: cannot execute `srun`: not found"
    );
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
    let actions = leave(&mut s, 10, 0, ExitInfo::Signal(15));
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
    leave(&mut s, 10, 1, ExitInfo::Signal(15));
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
    let actions = close_both(&mut s);
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
            signal: StopSignal::Terminate
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
        signal: StopSignal::Interrupt,
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
        signal: StopSignal::Interrupt,
    });
    assert!(actions.contains(&Action::StopProcesses { force: true }));
    // Ranks dying of the shutdown are not failures.
    s.handle(Event::Disconnected {
        conn: 10,
        error: None,
    });
    leave(&mut s, 11, 0, ExitInfo::Signal(15));
    let actions = s.handle(Event::ProcessExited {
        proc: 1,
        exit: ExitInfo::Code(3),
    });
    assert_eq!(
        actions,
        vec![Action::Finish(Outcome::Cancelled {
            by: CancelledBy::Signal(StopSignal::Interrupt),
            step: None
        })]
    );
}

/// Ctrl-C once every rank has done the last step: no boundary is left to stop at, and the
/// line says what the ranks go on with instead.
#[test]
fn a_cancel_after_the_last_step_says_the_run_finishes() {
    let said = |steps_done: u64| {
        let mut s = launched_and_registered(JobMachine::new(2, "abc").with_total_steps(5));
        for conn in [10, 11] {
            s.handle(Event::Progress {
                conn,
                step: steps_done,
            });
        }
        let actions = s.handle(Event::Cancel {
            signal: StopSignal::Interrupt,
        });
        actions
            .iter()
            .find_map(|a| match a {
                Action::Say(t) => Some(t.clone()),
                _ => None,
            })
            .unwrap()
    };
    assert_eq!(
        said(5),
        "received SIGINT after the last step: the ranks finish the final evaluation and \
         checkpoint, and the run ends finished (send it again to kill them now)"
    );
    assert!(
        said(4).starts_with("received SIGINT: the ranks stop at their next step boundary"),
        "{}",
        said(4)
    );
}

/// Ctrl-C while the ranks start: the one registered is told to stop, and so is the one that
/// registers afterwards (it was still loading), instead of having its connection closed
/// unexplained; both end quietly and the job ends cancelled.
#[test]
fn a_rank_that_registers_after_a_cancel_is_told_to_stop() {
    let mut s = launched_with_rank_0_registered(JobMachine::new(2, "abc"));
    let shutdown = |conn| Action::Send {
        conn,
        msg: ToWorker::Shutdown {
            reason: "the job was cancelled (SIGINT)".into(),
        },
    };
    let actions = s.handle(Event::Cancel {
        signal: StopSignal::Interrupt,
    });
    assert!(actions.contains(&shutdown(10)), "{actions:?}");
    let late = s.handle(Event::Registered {
        conn: 11,
        registration: reg(1),
    });
    assert_eq!(late, vec![shutdown(11)]);
    for (proc, conn) in [(0, 10), (1, 11)] {
        s.handle(Event::Disconnected { conn, error: None });
        let end = s.handle(Event::ProcessExited {
            proc,
            exit: ExitInfo::Code(3),
        });
        if proc == 1 {
            assert_eq!(
                end,
                vec![Action::Finish(Outcome::Cancelled {
                    by: CancelledBy::Signal(StopSignal::Interrupt),
                    step: None
                })]
            );
        }
    }
}

#[test]
fn ranks_killed_by_a_second_signal_end_the_run_at_the_step_they_had_all_completed() {
    let mut s = running();
    s.handle(Event::Progress { conn: 10, step: 7 });
    s.handle(Event::Progress { conn: 11, step: 6 });
    s.handle(Event::Cancel {
        signal: StopSignal::Interrupt,
    });
    s.handle(Event::Cancel {
        signal: StopSignal::Interrupt,
    });
    leave(&mut s, 10, 0, ExitInfo::Signal(9));
    let actions = leave(&mut s, 11, 1, ExitInfo::Signal(9));
    assert_eq!(
        actions,
        vec![Action::Finish(Outcome::Cancelled {
            by: CancelledBy::Signal(StopSignal::Interrupt),
            step: Some(6)
        })]
    );
}

#[test]
fn a_hangup_stops_at_a_step_boundary_and_a_second_one_kills_nothing() {
    let mut s = running();
    let actions = s.handle(Event::Cancel {
        signal: StopSignal::Hangup,
    });
    assert!(actions.contains(&Action::StopAtStepBoundary), "{actions:?}");
    let actions = s.handle(Event::Cancel {
        signal: StopSignal::Hangup,
    });
    assert!(actions.is_empty(), "{actions:?}");
    // A signal someone sends on purpose still does.
    let actions = s.handle(Event::Cancel {
        signal: StopSignal::Terminate,
    });
    assert!(actions.contains(&Action::StopProcesses { force: true }));
    let outcome = Outcome::Cancelled {
        by: CancelledBy::Signal(StopSignal::Hangup),
        step: Some(3),
    };
    assert_eq!(outcome.exit_code(), 129);
}

#[test]
fn a_cancel_lets_the_ranks_stop_at_a_step_boundary() {
    let mut s = running();
    let actions = s.handle(Event::Cancel {
        signal: StopSignal::Terminate,
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
            reason: StopReason::Controller {
                reason: "the job was cancelled (SIGTERM)".into(),
            },
        });
    }
    let actions = close_both(&mut s);
    let outcome = Outcome::Cancelled {
        by: CancelledBy::Signal(StopSignal::Terminate),
        step: Some(150),
    };
    assert_eq!(outcome.exit_code(), 143);
    assert_eq!(actions, vec![Action::Finish(outcome)]);
}

#[test]
fn a_cancel_under_slurm_checkpoints_before_the_kill_and_ends_cancelled() {
    let cancelled = StopReason::Controller {
        reason: "the job was cancelled (SIGTERM)".into(),
    };
    let mut s = running_under_slurm();
    let actions = s.handle(Event::Cancel {
        signal: StopSignal::Terminate,
    });
    for conn in [10, 11] {
        assert!(
            actions.contains(&Action::Send {
                conn,
                msg: ToWorker::CheckpointAndStop {
                    reason: "the job was cancelled (SIGTERM)".into()
                }
            }),
            "{actions:?}"
        );
    }
    // Slurm's kill comes first; the stop timeout is for a SIGTERM no kill follows.
    assert!(actions.contains(&Action::StopAtStepBoundary), "{actions:?}");
    assert!(
        !actions.iter().any(|a| matches!(
            a,
            Action::Send {
                msg: ToWorker::Shutdown { .. },
                ..
            }
        )),
        "{actions:?}"
    );
    assert!(actions.contains(&Action::WatchStopping), "{actions:?}");
    assert!(
        s.handle(Event::Cancel {
            signal: StopSignal::Terminate
        })
        .is_empty(),
        "Slurm's SIGTERM again changes nothing"
    );
    assert!(
        s.handle(Event::Preempt(Notice::Preemption)).is_empty(),
        "nor does a notice"
    );
    // Rank 0 heard the controller; rank 1 took its own SIGTERM for a notice and no word of
    // the controller's reached it in time: the job is cancelled all the same, not requeued.
    s.handle(Event::Stopped {
        conn: 10,
        step: 150,
        reason: cancelled.clone(),
    });
    s.handle(Event::Finished {
        conn: 11,
        preempted: true,
    });
    s.handle(Event::ProcessExited {
        proc: 0,
        exit: ExitInfo::Code(3),
    });
    s.handle(Event::ProcessExited {
        proc: 1,
        exit: ExitInfo::Code(0),
    });
    let actions = close_both(&mut s);
    assert_eq!(
        actions,
        vec![Action::Finish(Outcome::Cancelled {
            by: CancelledBy::Signal(StopSignal::Terminate),
            step: Some(150),
        })]
    );

    // Every rank took Slurm's SIGTERM for a notice: still cancelled.
    let mut s = running_under_slurm();
    s.handle(Event::Cancel {
        signal: StopSignal::Terminate,
    });
    finish_rank(&mut s, 10, 0, true);
    let actions = finish_rank(&mut s, 11, 1, true);
    assert!(
        matches!(
            actions.as_slice(),
            [Action::Finish(Outcome::Cancelled {
                by: CancelledBy::Signal(StopSignal::Terminate),
                ..
            })]
        ),
        "{actions:?}"
    );
}

#[test]
fn a_rank_failing_in_a_cancels_checkpoint_stops_the_others_and_the_job_stays_cancelled() {
    let mut s = running_under_slurm();
    s.handle(Event::Cancel {
        signal: StopSignal::Terminate,
    });
    let actions = s.handle(Event::WorkerFailed {
        conn: 11,
        error: "cannot write rank-1-of-2.safetensors: No space left on device".into(),
        lag: None,
        because_of: None,
    });
    assert!(
        actions.iter().any(|a| matches!(a, Action::Say(line)
            if line.contains("No space left on device")
                && line.ends_with("the other ranks stop without the cancel's checkpoint"))),
        "{actions:?}"
    );
    assert!(
        actions.contains(&Action::Send {
            conn: 10,
            msg: ToWorker::Shutdown {
                reason: "another rank failed in the cancel's checkpoint".into()
            }
        }),
        "{actions:?}"
    );
    assert!(actions.contains(&Action::StopProcesses { force: false }));
    leave(&mut s, 11, 1, ExitInfo::Code(1));
    s.handle(Event::Stopped {
        conn: 10,
        step: 40,
        reason: StopReason::Controller {
            reason: "another rank failed in the cancel's checkpoint".into(),
        },
    });
    let actions = leave(&mut s, 10, 0, ExitInfo::Code(3));
    assert!(
        matches!(
            actions.as_slice(),
            [Action::Finish(Outcome::Cancelled {
                by: CancelledBy::Signal(StopSignal::Terminate),
                ..
            })]
        ),
        "{actions:?}"
    );
}

#[test]
fn the_time_limits_sigterm_during_a_notices_checkpoint_leaves_the_job_preempted() {
    let mut s = running_under_slurm();
    s.handle(Event::Preempt(Notice::TimeLimit));
    let actions = s.handle(Event::Cancel {
        signal: StopSignal::Terminate,
    });
    assert!(
        actions.iter().any(|a| matches!(a, Action::Say(line)
            if line.contains("while the ranks checkpoint for the notice"))),
        "{actions:?}"
    );
    assert!(
        !actions.iter().any(|a| matches!(a, Action::Send { .. })),
        "the checkpoint under way is left alone: {actions:?}"
    );
    finish_rank(&mut s, 10, 0, true);
    let actions = finish_rank(&mut s, 11, 1, true);
    assert_eq!(
        actions,
        vec![Action::Finish(Outcome::Preempted {
            notice: Notice::TimeLimit
        })]
    );
}

#[test]
fn a_sigint_during_a_cancels_checkpoint_stops_the_ranks_without_it() {
    let mut s = running_under_slurm();
    s.handle(Event::Cancel {
        signal: StopSignal::Terminate,
    });
    let actions = s.handle(Event::Cancel {
        signal: StopSignal::Interrupt,
    });
    assert!(actions.contains(&Action::StopAtStepBoundary), "{actions:?}");
    assert!(
        actions.contains(&Action::Send {
            conn: 10,
            msg: ToWorker::Shutdown {
                reason: "the job was cancelled (SIGINT)".into()
            }
        }),
        "{actions:?}"
    );
    // Outside Slurm a SIGTERM is a plain stop, as Ctrl-C.
    let actions = running().handle(Event::Cancel {
        signal: StopSignal::Terminate,
    });
    assert!(actions.contains(&Action::StopAtStepBoundary), "{actions:?}");
    // And under Slurm a SIGINT is too.
    let actions = running_under_slurm().handle(Event::Cancel {
        signal: StopSignal::Interrupt,
    });
    assert!(actions.contains(&Action::StopAtStepBoundary), "{actions:?}");
}

#[test]
fn a_cancel_during_the_last_step_finds_the_run_finished() {
    let mut s = running();
    s.handle(Event::Cancel {
        signal: StopSignal::Interrupt,
    });
    finish_rank(&mut s, 10, 0, false);
    let actions = finish_rank(&mut s, 11, 1, false);
    assert_eq!(actions, vec![Action::Finish(Outcome::Succeeded)]);
}

#[test]
fn ranks_stopped_by_their_own_signal_end_the_job_cancelled_not_failed() {
    let mut s = running();
    s.handle(Event::Stopped {
        conn: 11,
        step: 7,
        reason: StopReason::Signal {
            signal: libc::SIGTERM,
        },
    });
    s.handle(Event::Stopped {
        conn: 10,
        step: 7,
        reason: StopReason::Peer,
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
    let actions = close_both(&mut s);
    let outcome = Outcome::Cancelled {
        by: CancelledBy::Rank {
            rank: 1,
            reason: StopReason::Signal {
                signal: libc::SIGTERM,
            },
        },
        step: Some(7),
    };
    assert_eq!(actions, vec![Action::Finish(outcome.clone())]);
    // The rank that was signalled, not the one that followed it, and the shell's status.
    assert_eq!(
        serde_json::to_value(&outcome).unwrap()["by"],
        "SIGTERM to rank 1"
    );
    assert_eq!(outcome.exit_code(), 143);
}

#[test]
fn ranks_stopped_where_training_diverged_fail_the_job_not_cancel_it() {
    let mut s = running();
    let diverged = StopReason::Diverged {
        step: 5,
        what: "the loss is NaN".to_string(),
    };
    for (conn, proc) in [(10, 0), (11, 1)] {
        s.handle(Event::Stopped {
            conn,
            step: 5,
            reason: diverged.clone(),
        });
        s.handle(Event::ProcessExited {
            proc,
            exit: ExitInfo::Code(3),
        });
    }
    let actions = close_both(&mut s);
    let outcome = Outcome::Failed(Failure::job(FailureCause::Diverged {
        step: 5,
        what: "the loss is NaN".to_string(),
    }));
    assert_eq!(actions, vec![Action::Finish(outcome.clone())]);
    assert_eq!(outcome.exit_code(), 1);
    let json = serde_json::to_value(&outcome).unwrap();
    assert_eq!(
        (
            &json["status"],
            &json["cause"]["kind"],
            &json["cause"]["step"]
        ),
        (&"failed".into(), &"diverged".into(), &5.into())
    );
}

#[test]
fn ranks_that_all_followed_another_rank_end_cancelled_by_a_request() {
    let mut s = running();
    for (conn, proc) in [(10, 0), (11, 1)] {
        s.handle(Event::Stopped {
            conn,
            step: 4,
            reason: StopReason::Peer,
        });
        s.handle(Event::ProcessExited {
            proc,
            exit: ExitInfo::Code(3),
        });
    }
    let actions = close_both(&mut s);
    let outcome = Outcome::Cancelled {
        by: CancelledBy::Request,
        step: Some(4),
    };
    assert_eq!(outcome.exit_code(), 130);
    assert_eq!(actions, vec![Action::Finish(outcome)]);
}

#[test]
fn ranks_that_do_not_stop_in_time_are_named_when_killed() {
    let mut s = running();
    s.handle(Event::Cancel {
        signal: StopSignal::Interrupt,
    });
    s.handle(Event::Stopped {
        conn: 10,
        step: 3,
        reason: StopReason::Controller {
            reason: "the job was cancelled (SIGINT)".into(),
        },
    });
    let said = all_said(s.handle(Event::Escalated));
    assert_eq!(
        said,
        vec!["rank 1 on node1 (pid 101) did not stop in time: killing it".to_string()]
    );
}

#[test]
fn ranks_slow_to_stop_are_named_with_the_rank_the_others_wait_for() {
    let mut s = running();
    for conn in [10, 11] {
        s.handle(Event::Progress { conn, step: 6 });
    }
    let actions = s.handle(Event::Cancel {
        signal: StopSignal::Terminate,
    });
    assert_eq!(
        actions
            .iter()
            .filter(|a| **a == Action::WatchStopping)
            .count(),
        1,
        "{actions:?}"
    );
    s.handle(Event::Stopped {
        conn: 10,
        step: 6,
        reason: StopReason::Controller {
            reason: "the job was cancelled (SIGTERM)".into(),
        },
    });
    let said = all_said(s.handle(Event::StopOverdue {
        waited_secs: 10,
        lag: behind(1, 40),
    }));
    assert_eq!(
        said,
        vec![
            "10 s after they were asked to stop, rank(s) 1 have not yet reached a step boundary \
             (rank 1 at step 6, as their heartbeats last said); rank 1 entered 40 collectives and \
             no more for 60 s while the other ranks entered 41: the others wait for it \
             (logs/rank-1.log)"
                .to_string()
        ]
    );
    // Once every rank stopped, nothing more is said.
    s.handle(Event::Stopped {
        conn: 11,
        step: 6,
        reason: StopReason::Peer,
    });
    assert!(says_nothing(&s.handle(Event::StopOverdue {
        waited_secs: 30,
        lag: None,
    })));
}

#[test]
fn ranks_slow_to_checkpoint_for_a_notice_are_named() {
    let mut s = running();
    s.handle(Event::Progress { conn: 10, step: 8 });
    s.handle(Event::Progress { conn: 11, step: 7 });
    let actions = s.handle(Event::Preempt(Notice::TimeLimit));
    assert!(actions.contains(&Action::WatchStopping), "{actions:?}");
    let said = said(&s.handle(Event::StopOverdue {
        waited_secs: 30,
        lag: None,
    }));
    assert_eq!(
        said,
        "30 s after they were asked to checkpoint and stop, rank(s) 0-1 have not stopped yet \
         (rank 1 at step 7; rank 0 at step 8, as their heartbeats last said; a rank past its \
         step boundary may still be writing the checkpoint)"
    );
}

#[test]
fn a_second_signal_names_each_rank_it_kills_and_why() {
    let mut s = running();
    s.handle(Event::Cancel {
        signal: StopSignal::Interrupt,
    });
    let said = all_said(s.handle(Event::Cancel {
        signal: StopSignal::Interrupt,
    }));
    assert_eq!(
        said,
        vec![
            "SIGINT again: killing the workers now".to_string(),
            "rank 0 on node0 (pid 100) has not stopped yet: killing it now (SIGINT again)"
                .to_string(),
            "rank 1 on node1 (pid 101) has not stopped yet: killing it now (SIGINT again)"
                .to_string(),
        ]
    );
}

#[test]
fn preemption_asks_every_rank_and_ends_preempted() {
    let mut s = running();
    let actions = s.handle(Event::Preempt(Notice::TimeLimit));
    assert!(actions.contains(&Action::Say(
        "the job's time limit is near (SIGUSR2): the workers checkpoint at the next step \
         boundary and exit"
            .into()
    )));
    assert!(actions.contains(&Action::Send {
        conn: 10,
        msg: ToWorker::Preempt
    }));
    assert!(actions.contains(&Action::Send {
        conn: 11,
        msg: ToWorker::Preempt
    }));
    assert!(
        s.handle(Event::Preempt(Notice::Preemption)).is_empty(),
        "a second signal changes nothing"
    );
    finish_rank(&mut s, 10, 0, true);
    let actions = finish_rank(&mut s, 11, 1, true);
    let notice = Notice::TimeLimit;
    assert_eq!(actions, vec![Action::Finish(Outcome::Preempted { notice })]);
}

#[test]
fn preemption_during_rendezvous_is_delivered_with_start() {
    let mut s = launched_with_rank_0_registered(JobMachine::new(2, "abc"));
    assert!(s
        .handle(Event::Preempt(Notice::Preemption))
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
    report(&mut s, 10, "peer rank 1 closed", None);
    leave(&mut s, 11, 1, ExitInfo::Signal(9));
    let actions = leave(&mut s, 10, 0, ExitInfo::Code(1));
    assert_eq!(failure(&actions).unwrap().rank, Some(1));
    // Once the controller signals the ranks itself, signals prove nothing.
    let mut s = running();
    report(&mut s, 10, "out of memory", None);
    s.handle(Event::Escalated);
    leave(&mut s, 11, 1, ExitInfo::Signal(15));
    let actions = leave(&mut s, 10, 0, ExitInfo::Code(1));
    assert_eq!(failure(&actions).unwrap().rank, Some(0));
}

/// The rank on `conn` reports `error`, following from `because_of`'s, with no rank behind.
fn report(
    s: &mut JobMachine,
    conn: ConnId,
    error: impl Into<String>,
    because_of: Option<u64>,
) -> Vec<Action> {
    s.handle(Event::WorkerFailed {
        conn,
        error: error.into(),
        lag: None,
        because_of,
    })
}

/// Rank 0 reports that its collective broke because rank 1 closed the connection.
fn peer_broke_the_collective(s: &mut JobMachine) -> Vec<Action> {
    report(
        s,
        10,
        "peer rank 1 (node1:91) closed the connection: it exited or was killed",
        Some(1),
    )
}

/// Rank 1 reports its own error.
fn rank_1_fails_on_its_own(s: &mut JobMachine) -> Vec<Action> {
    report(s, 11, "injected failure", None)
}

#[test]
fn a_rank_whose_report_is_overtaken_by_its_peers_is_still_the_one_blamed() {
    let mut s = running();
    assert!(said(&peer_broke_the_collective(&mut s)).starts_with("rank 0 on node0"));
    let actions = rank_1_fails_on_its_own(&mut s);
    assert_eq!(
        said(&actions),
        "rank 1 on node1 (pid 101) failed: injected failure (the cause of the failure above)"
    );
    leave(&mut s, 10, 0, ExitInfo::Code(1));
    let f = failure(&leave(&mut s, 11, 1, ExitInfo::Code(1))).unwrap();
    assert_eq!(f.rank, Some(1));
    assert_eq!(f.exit, Some(ExitInfo::Code(1)));
    assert_eq!(
        f.cause,
        FailureCause::Reported {
            error: "injected failure".into()
        }
    );
}

#[test]
fn the_named_rank_exiting_failed_without_a_report_is_blamed() {
    let mut s = running();
    peer_broke_the_collective(&mut s);
    let actions = leave(&mut s, 11, 1, ExitInfo::Code(2));
    assert_eq!(
        said(&actions),
        "rank 1 on node1 (pid 101) died with exit code 2 (the cause of the failure above)"
    );
    let f = failure(&leave(&mut s, 10, 0, ExitInfo::Code(1))).unwrap();
    assert_eq!((f.rank, f.exit), (Some(1), Some(ExitInfo::Code(2))));
    // A rank the report did not name is not blamed for a failing exit (the controller's
    // shutdown may be why).
    let mut s = running();
    report(&mut s, 10, "out of memory", None);
    leave(&mut s, 11, 1, ExitInfo::Code(2));
    let f = failure(&leave(&mut s, 10, 0, ExitInfo::Code(1))).unwrap();
    assert_eq!(f.rank, Some(0));
}

#[test]
fn under_srun_the_named_rank_hanging_up_without_a_report_is_blamed() {
    // One srun step for both ranks: no exit status of rank 1's own will come.
    let mut s = JobMachine::new(2, "abc");
    s.handle(Event::Launched {
        procs: vec![(0, None)],
    });
    for rank in 0..2 {
        s.handle(Event::Registered {
            conn: 10 + rank,
            registration: reg(rank),
        });
    }
    peer_broke_the_collective(&mut s);
    let text = said(&s.handle(Event::Disconnected {
        conn: 11,
        error: None,
    }));
    assert!(
        text.starts_with("rank 1 on node1 (pid 101)")
            && text.ends_with("(the cause of the failure above)"),
        "{text}"
    );
    s.handle(Event::Disconnected {
        conn: 10,
        error: None,
    });
    let f = failure(&s.handle(Event::ProcessExited {
        proc: 0,
        exit: ExitInfo::Code(1),
    }))
    .unwrap();
    assert_eq!(f.rank, Some(1));
}

#[test]
fn a_rank_that_reports_first_stays_blamed_when_its_peer_reports_the_broken_collective() {
    let mut s = running();
    rank_1_fails_on_its_own(&mut s);
    assert!(says_nothing(&peer_broke_the_collective(&mut s)));
    leave(&mut s, 10, 0, ExitInfo::Code(1));
    assert_eq!(
        failure(&leave(&mut s, 11, 1, ExitInfo::Code(1)))
            .unwrap()
            .rank,
        Some(1)
    );
}

#[test]
fn a_later_report_replaces_the_failure_only_from_the_rank_it_names_and_not_naming_it_back() {
    // Rank 2's error names rank 1; rank 0's own later error changes nothing, and rank 1's,
    // naming rank 2 back, does not turn the blame around: the first report names both.
    let mut s = JobMachine::new(3, "abc");
    s.handle(Event::Launched {
        procs: vec![(0, Some(0)), (1, Some(1)), (2, Some(2))],
    });
    for rank in 0..3 {
        s.handle(Event::Registered {
            conn: 10 + rank,
            registration: Registration {
                world_size: 3,
                ..reg(rank)
            },
        });
    }
    let fail = |s: &mut JobMachine, rank: u64, because_of: Option<u64>| {
        report(s, 10 + rank, format!("error of rank {rank}"), because_of)
    };
    fail(&mut s, 2, Some(1));
    assert!(says_nothing(&fail(&mut s, 0, None)), "rank 0 was not named");
    assert!(
        says_nothing(&fail(&mut s, 1, Some(2))),
        "rank 1 names rank 2 back"
    );
    for rank in 0..3 {
        s.handle(Event::Disconnected {
            conn: 10 + rank,
            error: None,
        });
    }
    for rank in 0..2 {
        s.handle(Event::ProcessExited {
            proc: rank,
            exit: ExitInfo::Code(1),
        });
    }
    let actions = s.handle(Event::ProcessExited {
        proc: 2,
        exit: ExitInfo::Code(1),
    });
    assert_eq!(failure(&actions).unwrap().rank, Some(2));
}

#[test]
fn heartbeat_loss_and_reported_errors_fail_the_job() {
    let mut s = running();
    let actions = s.handle(Event::HeartbeatLost { conn: 10 });
    assert!(actions
        .iter()
        .any(|a| matches!(a, Action::Say(t) if t.contains("heartbeat"))));
    let mut s = running();
    let actions = report(&mut s, 11, "out of memory", None);
    assert!(actions
        .iter()
        .any(|a| matches!(a, Action::Say(t) if t.contains("out of memory"))));
}

#[test]
fn every_rank_of_a_host_going_silent_is_said_to_be_a_lost_host() {
    // Four ranks, two a host, under srun (one process): ranks 2 and 3 share node1.
    let mut s = JobMachine::new(4, "abc");
    s.handle(Event::Launched {
        procs: vec![(0, None)],
    });
    for rank in 0..4 {
        let registration = Registration {
            local_rank: rank % 2,
            world_size: 4,
            host: format!("node{}", rank / 2),
            ..reg(rank)
        };
        s.handle(Event::Registered {
            conn: 10 + rank,
            registration,
        });
    }
    let first = said(&s.handle(Event::HeartbeatLost { conn: 12 }));
    assert!(
        first.starts_with("rank 2 on node1") && first.contains("hung or frozen process?"),
        "{first}"
    );
    let second = all_said(s.handle(Event::HeartbeatLost { conn: 13 }));
    assert_eq!(
        second,
        vec![
            "rank 3 on node1 stopped sending heartbeats too: every rank of node1 is silent, the \
             host or its network is likely lost"
                .to_string()
        ]
    );
    // Another host's rank going silent afterwards is no news about node1.
    assert!(says_nothing(&s.handle(Event::HeartbeatLost { conn: 10 })));
    let f = failure(&s.handle(Event::ProcessExited {
        proc: 0,
        exit: ExitInfo::Code(1),
    }))
    .or_else(|| failure(&s.handle(Event::DrainTimeout)))
    .expect("the job fails");
    assert_eq!(f.rank, Some(2));
    assert_eq!(
        f.cause,
        FailureCause::HeartbeatLost {
            same_host: vec![3],
            whole_host: true,
            stopped: false,
        }
    );
    assert!(
        f.describe().contains(
            "stopped sending heartbeats, and so did rank(s) 3 on the same host, every rank \
             there: the host or its network is likely lost"
        ),
        "{}",
        f.describe()
    );
}

#[test]
fn some_ranks_of_a_host_going_silent_are_not_said_to_be_a_lost_host() {
    // Three ranks on node0: two go silent, one does not.
    let mut s = JobMachine::new(3, "abc");
    s.handle(Event::Launched {
        procs: vec![(0, None)],
    });
    for rank in 0..3 {
        let registration = Registration {
            local_rank: rank,
            world_size: 3,
            host: "node0".into(),
            ..reg(rank)
        };
        s.handle(Event::Registered {
            conn: 10 + rank,
            registration,
        });
    }
    s.handle(Event::HeartbeatLost { conn: 10 });
    let said = all_said(s.handle(Event::HeartbeatLost { conn: 11 }));
    assert_eq!(
        said,
        vec!["rank 1 on node0 stopped sending heartbeats too".to_string()]
    );
}

#[test]
fn a_node_without_a_usable_gpu_fails_the_job_once_before_it_starts() {
    let mut s = JobMachine::new(2, "abc");
    s.handle(Event::Launched {
        procs: vec![(0, Some(0)), (1, Some(1))],
    });
    let problem = "node node0: the job trains on CUDA, but no NVIDIA driver is loaded on this node";
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
    // The other rank of the node has the same problem: told the job stops, nothing said
    // again.
    let second = s.handle(Event::Registered {
        conn: 11,
        registration: bad(1),
    });
    assert_eq!(
        second,
        vec![Action::Send {
            conn: 11,
            msg: ToWorker::Shutdown {
                reason: "rank 0 failed".into()
            }
        }]
    );
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
        lag: None,
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

/// Rank `rank` entered `entered` collectives and no more for a minute; the other entered 41.
fn behind(rank: u64, entered: u64) -> Option<Lag> {
    Some(Lag {
        ranks: vec![rank],
        entered,
        others_entered: (41, 41),
        still_secs: 60,
    })
}

/// Everything the machine said, in order.
fn all_said(actions: Vec<Action>) -> Vec<String> {
    actions
        .into_iter()
        .filter_map(|a| match a {
            Action::Say(t) => Some(t),
            _ => None,
        })
        .collect()
}

/// Whether the machine said nothing.
fn says_nothing(actions: &[Action]) -> bool {
    !actions.iter().any(|a| matches!(a, Action::Say(_)))
}

/// What the machine said first.
fn said(actions: &[Action]) -> String {
    actions
        .iter()
        .find_map(|a| match a {
            Action::Say(t) => Some(t.clone()),
            _ => None,
        })
        .expect("something is said")
}

#[test]
fn a_stalled_job_is_blamed_on_the_rank_the_others_wait_for() {
    // Rank 0's heartbeat noticed the job standing still first, but rank 1 never entered the
    // collective rank 0 sits in.
    let mut s = running();
    for conn in [10, 11] {
        s.handle(Event::Progress { conn, step: 6 });
    }
    let actions = s.handle(Event::Stalled {
        conn: 10,
        step: 6,
        secs: 60,
        lag: behind(1, 40),
    });
    let text = said(&actions);
    assert!(
        text.starts_with("rank 1 on node1") && text.contains("they wait for it"),
        "{text}"
    );
    assert!(
        !text.contains("blocked in a collective or in I/O?"),
        "{text}"
    );
    leave(&mut s, 10, 0, ExitInfo::Signal(15));
    let f = failure(&leave(&mut s, 11, 1, ExitInfo::Signal(15))).unwrap();
    assert_eq!((f.rank, f.lag.map(|l| l.entered)), (Some(1), Some(40)));
}

#[test]
fn a_collective_timeout_names_the_rank_that_never_joined() {
    // Rank 0's collective times out: its error is the failure, and rank 1 (behind) is named.
    let mut s = running();
    let actions = s.handle(Event::WorkerFailed {
        conn: 10,
        error: "NCCL all_gather did not complete within 300 s".into(),
        lag: behind(1, 40),
        because_of: None,
    });
    let text = said(&actions);
    assert!(
        text.starts_with("rank 0 on node0")
            && text.contains("within 300 s; rank 1 entered 40 collectives")
            && text.contains("logs/rank-1.log"),
        "{text}"
    );
    // A rank behind alone that reports its own error is not said to be waited for.
    let mut s = running();
    let actions = s.handle(Event::WorkerFailed {
        conn: 11,
        error: "out of memory".into(),
        lag: behind(1, 40),
        because_of: None,
    });
    assert!(
        !said(&actions).contains("collectives"),
        "{}",
        said(&actions)
    );
}

/// The srun step of a two-rank Slurm job (process 0, no rank of its own), rank 0 registered,
/// dies with `exit` while rank 1 is still starting.
fn srun_step_dies_while_starting(s: JobMachine, exit: ExitInfo) -> (JobMachine, Vec<Action>) {
    let mut s = s;
    s.handle(Event::Launched {
        procs: vec![(0, None)],
    });
    s.handle(Event::Registered {
        conn: 10,
        registration: reg(0),
    });
    let mut actions = s.handle(Event::ProcessExited { proc: 0, exit });
    actions.extend(s.handle(Event::Disconnected {
        conn: 10,
        error: None,
    }));
    (s, actions)
}

#[test]
fn a_rank_slurm_terminates_before_it_takes_the_notice_ends_the_job_preempted() {
    // srun reports tasks killed by SIGTERM as 143; a process of its own, as the signal.
    for exit in [ExitInfo::Code(143), ExitInfo::Signal(libc::SIGUSR2)] {
        let slurm = JobMachine::new(2, "abc").with_slurm_notices();
        let (_, actions) = srun_step_dies_while_starting(slurm, exit);
        assert!(
            actions.iter().any(|a| matches!(a, Action::Say(line)
                if line.contains("before it could take the notice (preemption notice (SIGUSR2))"))),
            "{exit}: {actions:?}"
        );
        assert!(
            actions.contains(&Action::Finish(Outcome::Preempted {
                notice: Notice::Preemption
            })),
            "{exit}: {actions:?}"
        );
    }
    // Outside Slurm (local ranks) the same death is a failure.
    let (_, actions) =
        srun_step_dies_while_starting(JobMachine::new(2, "abc"), ExitInfo::Code(143));
    assert!(failure(&actions).is_some(), "{actions:?}");
    // And under Slurm a death by another signal is one too.
    let slurm = JobMachine::new(2, "abc").with_slurm_notices();
    let (_, actions) = srun_step_dies_while_starting(slurm, ExitInfo::Code(137));
    assert!(failure(&actions).is_some(), "{actions:?}");
}

#[test]
fn a_rank_ended_by_scancels_sigterm_is_a_cancel_once_the_controller_gets_its_own() {
    // scancel signals the batch script and the ranks at once: a rank that SIGTERM ends while
    // it starts was taken for a notice, until the controller's own SIGTERM says otherwise.
    let mut s = JobMachine::new(2, "abc").with_slurm_notices();
    s.handle(Event::Launched {
        procs: vec![(0, Some(0)), (1, Some(1))],
    });
    s.handle(Event::Registered {
        conn: 10,
        registration: reg(0),
    });
    s.handle(Event::ProcessExited {
        proc: 0,
        exit: ExitInfo::Signal(libc::SIGTERM),
    });
    let actions = s.handle(Event::Cancel {
        signal: StopSignal::Terminate,
    });
    assert!(
        actions.iter().any(|a| matches!(a, Action::Say(line)
            if line.contains("the job is cancelled, not preempted"))),
        "{actions:?}"
    );
    let mut actions = s.handle(Event::ProcessExited {
        proc: 1,
        exit: ExitInfo::Signal(libc::SIGTERM),
    });
    actions.extend(s.handle(Event::Disconnected {
        conn: 10,
        error: None,
    }));
    assert!(
        actions.iter().any(|a| matches!(
            a,
            Action::Finish(Outcome::Cancelled {
                by: CancelledBy::Signal(StopSignal::Terminate),
                ..
            })
        )),
        "{actions:?}"
    );

    // The controller's own notice (SIGUSR2) confirms a preemption instead.
    let mut s = JobMachine::new(2, "abc").with_slurm_notices();
    s.handle(Event::Launched {
        procs: vec![(0, Some(0)), (1, Some(1))],
    });
    s.handle(Event::Preempt(Notice::Preemption));
    s.handle(Event::ProcessExited {
        proc: 0,
        exit: ExitInfo::Signal(libc::SIGTERM),
    });
    s.handle(Event::Cancel {
        signal: StopSignal::Terminate,
    });
    let actions = s.handle(Event::ProcessExited {
        proc: 1,
        exit: ExitInfo::Signal(libc::SIGTERM),
    });
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::Finish(Outcome::Preempted { .. }))),
        "{actions:?}"
    );
}

#[test]
fn a_run_directory_that_cannot_be_written_stops_the_ranks_with_a_checkpoint_and_fails_the_job() {
    let mut s = running();
    let actions = s.handle(Event::RunDirectoryUnwritable {
        why: "No space left on device (os error 28)".into(),
    });
    assert!(
        matches!(&actions[0], Action::Say(line) if line.contains("No space left on device")
            && line.contains("the ranks checkpoint at their next step boundary and stop")),
        "{actions:?}"
    );
    for conn in [10, 11] {
        assert!(
            actions.contains(&Action::Send {
                conn,
                msg: ToWorker::CheckpointAndStop {
                    reason: "the run directory cannot be written".into()
                }
            }),
            "{actions:?}"
        );
    }
    assert!(actions.contains(&Action::StopAtStepBoundary), "{actions:?}");
    assert!(actions.contains(&Action::WatchStopping), "{actions:?}");
    // Said and asked once; a notice meanwhile finds the checkpoint under way.
    assert!(s
        .handle(Event::RunDirectoryUnwritable {
            why: "again".into()
        })
        .is_empty());
    assert!(s.handle(Event::Preempt(Notice::TimeLimit)).is_empty());

    for (conn, proc) in [(10, 0), (11, 1)] {
        s.handle(Event::Stopped {
            conn,
            step: 57,
            reason: StopReason::Controller {
                reason: "the run directory cannot be written".into(),
            },
        });
        s.handle(Event::ProcessExited {
            proc,
            exit: ExitInfo::Code(shardrun_protocol::messages::EXIT_STOPPED),
        });
    }
    let failed = failure(&close_both(&mut s)).expect("the job fails");
    assert_eq!(failed.rank, None);
    assert_eq!(
        failed.cause,
        FailureCause::RunDirectoryUnwritable {
            why: "No space left on device (os error 28)".into()
        }
    );
    assert!(
        failed
            .describe()
            .starts_with("the job stopped: its run directory cannot be written (No space"),
        "{}",
        failed.describe()
    );
}

#[test]
fn a_run_directory_that_cannot_be_written_changes_no_stop_under_way_and_no_finished_run() {
    let full = || Event::RunDirectoryUnwritable {
        why: "No space left on device (os error 28)".into(),
    };
    // Before the ranks start, nothing has trained to be saved: the job fails at once.
    let mut s = JobMachine::new(2, "abc");
    s.handle(Event::Launched {
        procs: vec![(0, Some(0)), (1, Some(1))],
    });
    let actions = s.handle(full());
    assert!(
        actions.iter().any(|a| matches!(a, Action::Say(line)
            if line.starts_with("the job stopped: its run directory cannot be written"))),
        "{actions:?}"
    );
    assert!(
        actions.contains(&Action::StopProcesses { force: false }),
        "{actions:?}"
    );

    // A cancel, a notice or a failure already stops the ranks their own way.
    for first in [
        Event::Cancel {
            signal: StopSignal::Interrupt,
        },
        Event::Preempt(Notice::Preemption),
        Event::WorkerFailed {
            conn: 10,
            error: "boom".into(),
            lag: None,
            because_of: None,
        },
    ] {
        let mut s = running();
        s.handle(first.clone());
        let said = s.handle(full());
        assert!(
            matches!(said.as_slice(), [Action::Say(line)]
                if line.contains("lines and metrics from here on are not recorded")),
            "after {first:?}: {said:?}"
        );
    }

    // Ranks that finished their last step before the request: the run is complete.
    let mut s = running();
    s.handle(full());
    finish_rank(&mut s, 10, 0, false);
    let actions = finish_rank(&mut s, 11, 1, false);
    assert_eq!(actions, vec![Action::Finish(Outcome::Succeeded)]);
}
