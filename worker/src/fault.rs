//! Injected failures, to see how a job fails: `SHARDRUN_INJECT_FAILURE=<rank>:<step>` makes
//! that rank fail with an error when it starts optimizer step `<step>` (counted from 1),
//! `<rank>:<step>:panic` makes it panic there, `<rank>:<step>:hang` makes it block there for
//! good (its heartbeats go on, as in a rank stuck in I/O), while the other ranks go on into
//! the step's collectives; `<rank>:<step>:hold` makes it take [`HELD_BYTES`] more memory
//! there and keep it, as a leak would, and train on (to see one rank's peak reported for
//! the job); `<rank>:<step>:slow` makes it sleep [`SLOW_BY`] in every step from there on, as
//! a rank on a slower or busier machine (a straggler). Unset, it does nothing; a malformed
//! value is an error before training.

/// The variable that asks for an injected failure.
pub const VAR: &str = "SHARDRUN_INJECT_FAILURE";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum How {
    Error,
    Panic,
    Hang,
    Hold,
    Slow,
}

/// What `slow` adds to each of the rank's steps.
pub const SLOW_BY: std::time::Duration = std::time::Duration::from_millis(100);

/// What `hold` takes: 128 MiB, written so that it is resident.
pub const HELD_BYTES: usize = 128 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Injected {
    pub rank: u64,
    pub step: u64,
    pub how: How,
}

impl Injected {
    pub fn from_env() -> Result<Option<Injected>, String> {
        match std::env::var(VAR) {
            Ok(text) => Self::parse(&text).map(Some),
            Err(_) => Ok(None),
        }
    }

    pub fn parse(text: &str) -> Result<Injected, String> {
        let bad = || {
            format!(
                "{VAR}={text:?}: expected <rank>:<step>, or <rank>:<step>: and one of panic, hang, \
                 hold, slow"
            )
        };
        let mut parts = text.trim().split(':');
        let rank = parts.next().and_then(|r| r.parse().ok()).ok_or_else(bad)?;
        let step = parts
            .next()
            .and_then(|s| s.parse().ok())
            .filter(|&s| s > 0)
            .ok_or_else(bad)?;
        let how = match parts.next() {
            None | Some("error") => How::Error,
            Some("panic") => How::Panic,
            Some("hang") => How::Hang,
            Some("hold") => How::Hold,
            Some("slow") => How::Slow,
            Some(_) => return Err(bad()),
        };
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(Injected { rank, step, how })
    }

    /// Fails (or panics, or never returns) when `rank` starts `step` (1-based) and this is
    /// the chosen pair; slows every step of the rank from the chosen one.
    pub fn check(&self, rank: u64, step: u64) -> Result<(), String> {
        if self.how == How::Slow && rank == self.rank && step >= self.step {
            std::thread::sleep(SLOW_BY);
            return Ok(());
        }
        if (rank, step) != (self.rank, self.step) {
            return Ok(());
        }
        let what = format!("injected failure of rank {rank} at step {step} ({VAR})");
        match self.how {
            How::Error => Err(what),
            How::Panic => panic!("{what}"),
            How::Hang => loop {
                // Blocked for good, like a rank stuck in a read; only a signal ends it.
                std::thread::park();
            },
            How::Hold => {
                // Seen by nothing, the allocation would be optimised away.
                std::hint::black_box(Vec::leak(vec![1u8; HELD_BYTES]));
                Ok(())
            }
            How::Slow => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_fires_once() {
        let f = Injected::parse("1:3").unwrap();
        assert_eq!((f.rank, f.step, f.how), (1, 3, How::Error));
        assert!(f.check(1, 2).is_ok() && f.check(0, 3).is_ok());
        assert!(f.check(1, 3).unwrap_err().contains("rank 1 at step 3"));
        assert_eq!(Injected::parse("0:1:panic").unwrap().how, How::Panic);
        assert_eq!(Injected::parse("2:5:hang").unwrap().how, How::Hang);
        assert_eq!(Injected::parse("2:5:hold").unwrap().how, How::Hold);
        let slow = Injected::parse("1:3:slow").unwrap();
        assert_eq!(slow.how, How::Slow);
        assert!(slow.check(1, 2).is_ok() && slow.check(1, 4).is_ok() && slow.check(0, 3).is_ok());
        for bad in ["", "1", "1:0", "x:2", "1:2:boom", "1:2:panic:3"] {
            assert!(Injected::parse(bad).is_err(), "{bad}");
        }
    }
}
