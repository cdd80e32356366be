//! Circuit breaker per node, fed by the one `Outcome` of each exchange.
//!
//! `closed` -> (`failures_to_open` consecutive node failures) -> `open` -> (after `cooldown`)
//! -> `half-open`: one trial request at a time, `trial_requests` successes in a row close it
//! again, any failure re-opens it. Busy, 4xx and client-gone outcomes say nothing about the
//! node and are ignored (linkerd's consecutive-failures accrual, `linkerd/http/breaker`).
//!
//! Invariant: in half-open at most one trial is in flight; `try_acquire` hands out that one
//! permit and the outcome (or a dropped, unjudged exchange) gives it back. The breaker never
//! sleeps or spawns: time comes in as `now` so tests drive it with tokio's paused clock.

use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use crate::outcome::Outcome;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

impl BreakerState {
    pub fn name(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open => "open",
            Self::HalfOpen => "half-open",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerPolicy {
    pub failures_to_open: u32,
    pub cooldown: Duration,
    pub trial_requests: u32,
}

#[derive(Debug)]
pub struct Breaker {
    policy: BreakerPolicy,
    state: BreakerState,
    consecutive_failures: u32,
    opened_at: Option<Instant>,
    trial_in_flight: bool,
    trial_successes: u32,
}

/// What a dispatch through the breaker was: an ordinary request or the half-open trial.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    Normal,
    Trial,
}

impl Breaker {
    pub fn new(policy: BreakerPolicy) -> Self {
        Self {
            policy,
            state: BreakerState::Closed,
            consecutive_failures: 0,
            opened_at: None,
            trial_in_flight: false,
            trial_successes: 0,
        }
    }

    pub fn set_policy(&mut self, policy: BreakerPolicy) {
        self.policy = policy;
    }

    /// The state as of `now` (an open breaker whose cool-down passed reads half-open).
    pub fn state(&mut self, now: Instant) -> BreakerState {
        if self.state == BreakerState::Open && self.opened_at.is_some_and(|t| now >= t + self.policy.cooldown) {
            self.state = BreakerState::HalfOpen;
            self.trial_successes = 0;
            self.trial_in_flight = false;
            tracing::info!("breaker half-open: letting a trial request through");
        }
        self.state
    }

    /// Whether a request may go to this node now; `Trial` when it is the half-open probe.
    /// Closed as of the last change: a closed breaker stays closed until an outcome opens it
    /// (time alone moves only open to half-open), so this needs no `now`.
    pub fn is_closed(&self) -> bool {
        self.state == BreakerState::Closed
    }

    pub fn would_allow(&mut self, now: Instant) -> bool {
        match self.state(now) {
            BreakerState::Closed => true,
            BreakerState::Open => false,
            BreakerState::HalfOpen => !self.trial_in_flight,
        }
    }

    /// Take a permit (call only after `would_allow`); half-open hands out one at a time.
    pub fn acquire(&mut self, now: Instant) -> Option<Permit> {
        match self.state(now) {
            BreakerState::Closed => Some(Permit::Normal),
            BreakerState::Open => None,
            BreakerState::HalfOpen if !self.trial_in_flight => {
                self.trial_in_flight = true;
                Some(Permit::Trial)
            }
            BreakerState::HalfOpen => None,
        }
    }

    /// Forced permit for the last node standing: never ejected, even while open.
    pub fn force(&mut self) -> Permit {
        Permit::Normal
    }

    /// Feed one judged exchange. Returns the new state when it changed.
    pub fn record(&mut self, permit: Permit, outcome: Outcome, now: Instant) -> Option<BreakerState> {
        let before = self.state(now);
        if permit == Permit::Trial {
            self.trial_in_flight = false;
        }
        let failure = outcome.is_node_failure();
        let success = outcome == Outcome::Success;
        match before {
            BreakerState::Closed => {
                if failure {
                    self.consecutive_failures += 1;
                    // A node that takes requests and never answers costs each one a whole
                    // first-byte timeout: once is enough to take it out.
                    if outcome == Outcome::Silent || self.consecutive_failures >= self.policy.failures_to_open {
                        self.open(now);
                    }
                } else if success {
                    self.consecutive_failures = 0;
                }
            }
            BreakerState::HalfOpen if permit == Permit::Trial => {
                if failure {
                    self.open(now);
                } else if success {
                    self.trial_successes += 1;
                    if self.trial_successes >= self.policy.trial_requests {
                        self.state = BreakerState::Closed;
                        self.consecutive_failures = 0;
                    }
                }
            }
            // Late outcomes of requests sent before the breaker opened do not move it.
            _ => {}
        }
        (self.state != before).then_some(self.state)
    }

    fn open(&mut self, now: Instant) {
        self.state = BreakerState::Open;
        self.opened_at = Some(now);
        self.trial_in_flight = false;
        self.trial_successes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn policy() -> BreakerPolicy {
        BreakerPolicy { failures_to_open: 3, cooldown: Duration::from_secs(10), trial_requests: 2 }
    }

    #[tokio::test(start_paused = true)]
    async fn full_cycle_closed_open_half_open_closed() {
        let mut b = Breaker::new(policy());
        let now = Instant::now();
        for _ in 0..2 {
            assert_eq!(b.record(Permit::Normal, Outcome::Failed, now), None);
        }
        assert_eq!(b.record(Permit::Normal, Outcome::TimedOut, now), Some(BreakerState::Open));
        assert!(!b.would_allow(now));
        tokio::time::advance(Duration::from_secs(9)).await;
        assert_eq!(b.state(Instant::now()), BreakerState::Open, "cool-down not over");
        tokio::time::advance(Duration::from_secs(1)).await;
        let t = Instant::now();
        assert_eq!(b.state(t), BreakerState::HalfOpen);
        let p = b.acquire(t).expect("one trial");
        assert_eq!(p, Permit::Trial);
        assert!(b.acquire(t).is_none(), "never two trials at once");
        assert_eq!(b.record(p, Outcome::Success, t), None, "one success of two");
        let p = b.acquire(t).expect("second trial");
        assert_eq!(b.record(p, Outcome::Success, t), Some(BreakerState::Closed));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_trial_reopens() {
        let mut b = Breaker::new(BreakerPolicy { failures_to_open: 1, ..policy() });
        b.record(Permit::Normal, Outcome::Failed, Instant::now());
        tokio::time::advance(Duration::from_secs(10)).await;
        let p = b.acquire(Instant::now()).expect("trial");
        assert_eq!(b.record(p, Outcome::StreamCut, Instant::now()), Some(BreakerState::Open));
        assert!(!b.would_allow(Instant::now()), "cool-down starts over");
    }

    #[tokio::test(start_paused = true)]
    async fn busy_client_errors_and_client_gone_never_trip_it() {
        let mut b = Breaker::new(BreakerPolicy { failures_to_open: 1, ..policy() });
        for o in [Outcome::Busy, Outcome::ClientGone, Outcome::Success] {
            for _ in 0..10 {
                b.record(Permit::Normal, o, Instant::now());
            }
        }
        assert_eq!(b.state(Instant::now()), BreakerState::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn one_silence_opens_it_and_a_slow_first_token_never_does() {
        let mut b = Breaker::new(policy());
        for _ in 0..10 {
            b.record(Permit::Normal, Outcome::Slow, Instant::now());
        }
        assert_eq!(b.state(Instant::now()), BreakerState::Closed, "slow for one category is not broken");
        assert_eq!(b.record(Permit::Normal, Outcome::Silent, Instant::now()), Some(BreakerState::Open));
    }

    proptest! {
        #[test]
        fn half_open_never_lets_two_trials_through(ops in proptest::collection::vec(0u8..4, 1..200)) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().expect("rt");
            rt.block_on(async {
                let mut b = Breaker::new(BreakerPolicy { failures_to_open: 1, cooldown: Duration::from_millis(5), trial_requests: 2 });
                let mut trials_out = 0u32;
                let mut permits = Vec::new();
                for op in ops {
                    let now = Instant::now();
                    match op {
                        0 => if let Some(p) = b.acquire(now) { if p == Permit::Trial { trials_out += 1; } permits.push(p); },
                        1 => if let Some(p) = permits.pop() { if p == Permit::Trial { trials_out -= 1; } b.record(p, Outcome::Failed, now); },
                        2 => if let Some(p) = permits.pop() { if p == Permit::Trial { trials_out -= 1; } b.record(p, Outcome::Success, now); },
                        _ => tokio::time::advance(Duration::from_millis(3)).await,
                    }
                    prop_assert!(trials_out <= 1, "two half-open trials in flight");
                }
                Ok(())
            })?;
        }
    }
}
