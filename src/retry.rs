//! Retry budget: retries may be at most `ratio` of recent requests plus a floor per second.
//!
//! The attempt cap bounds one request; the budget bounds the cluster. Without it, a sick
//! cluster multiplies its own load by the attempt cap exactly when it can least take it
//! (Finagle's and linkerd's retry budgets). The window is ten one-second buckets on tokio's
//! clock, so tests drive it with paused time.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

const BUCKETS: usize = 10;
const BUCKET: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub struct RetryBudget {
    window: Mutex<Window>,
}

/// The policy and its buckets, under one lock so a reload swaps the policy atomically.
#[derive(Debug)]
struct Window {
    ratio: f64,
    min_per_sec: u32,
    buckets: VecDeque<Bucket>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    start: Instant,
    requests: u64,
    retries: u64,
}

impl RetryBudget {
    pub fn new(ratio: f64, min_per_sec: u32) -> Self {
        Self { window: Mutex::new(Window { ratio, min_per_sec, buckets: VecDeque::new() }) }
    }

    /// Take a new ratio and floor (a reload); the counts of the window are kept.
    pub fn set_policy(&self, ratio: f64, min_per_sec: u32) {
        let mut w = self.window.lock().unwrap_or_else(|p| p.into_inner());
        w.ratio = ratio;
        w.min_per_sec = min_per_sec;
    }

    fn with_current<T>(&self, now: Instant, f: impl FnOnce(f64, u32, &mut VecDeque<Bucket>) -> T) -> T {
        let mut guard = self.window.lock().unwrap_or_else(|p| p.into_inner());
        let (ratio, min_per_sec) = (guard.ratio, guard.min_per_sec);
        let w = &mut guard.buckets;
        while w.front().is_some_and(|b| now.saturating_duration_since(b.start) >= BUCKET * BUCKETS as u32) {
            w.pop_front();
        }
        if w.back().is_none_or(|b| now.saturating_duration_since(b.start) >= BUCKET) {
            w.push_back(Bucket { start: now, requests: 0, retries: 0 });
        }
        f(ratio, min_per_sec, w)
    }

    /// Count a new request (not a retry).
    pub fn deposit(&self, now: Instant) {
        self.with_current(now, |_, _, w| {
            if let Some(b) = w.back_mut() {
                b.requests += 1;
            }
        });
    }

    /// Take permission for one retry; `false` when the budget is spent.
    pub fn try_withdraw(&self, now: Instant) -> bool {
        self.with_current(now, |ratio, min_per_sec, w| {
            let floor = u64::from(min_per_sec) * BUCKETS as u64;
            let requests: u64 = w.iter().map(|b| b.requests).sum();
            let retries: u64 = w.iter().map(|b| b.retries).sum();
            let allowed = floor + (ratio * requests as f64) as u64;
            if retries < allowed {
                if let Some(b) = w.back_mut() {
                    b.retries += 1;
                }
                true
            } else {
                false
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn retries_are_capped_at_the_ratio_plus_floor() {
        let b = RetryBudget::new(0.2, 1);
        for _ in 0..100 {
            b.deposit(Instant::now());
        }
        let granted = (0..100).filter(|_| b.try_withdraw(Instant::now())).count();
        assert_eq!(granted, 10 + 20, "floor of 1/s over 10 s plus 20% of 100 requests");
    }

    #[tokio::test(start_paused = true)]
    async fn the_window_slides() {
        let b = RetryBudget::new(0.0, 1);
        let granted = (0..20).filter(|_| b.try_withdraw(Instant::now())).count();
        assert_eq!(granted, 10);
        assert!(!b.try_withdraw(Instant::now()));
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(b.try_withdraw(Instant::now()), "old retries age out of the window");
    }
}
