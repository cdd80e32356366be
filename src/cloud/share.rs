//! The share of requests a cloud provider answered over a sliding window, and the alert when
//! it crosses the configured threshold (up, and back down): a rising share means the cluster
//! is failing quietly and money is being spent.
//!
//! Counts live in one-second buckets, so memory is fixed whatever the traffic. Time is passed
//! in, so tests drive it.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::AlertsConfig;

/// A crossing of the threshold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Crossing {
    pub share: f64,
    pub requests: u64,
    pub threshold: f64,
    /// True when the share rose to or past the threshold; false when it fell back below.
    pub above: bool,
}

#[derive(Debug)]
pub struct Window {
    cfg: AlertsConfig,
    /// (second index, requests, cloud answers), oldest first.
    buckets: VecDeque<(u64, u64, u64)>,
    origin: Instant,
    above: bool,
}

impl Window {
    pub fn new(cfg: AlertsConfig, now: Instant) -> Self {
        Self { cfg, buckets: VecDeque::new(), origin: now, above: false }
    }

    pub fn set_config(&mut self, cfg: AlertsConfig) {
        self.cfg = cfg;
    }

    fn second(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.origin).as_secs()
    }

    fn expire(&mut self, now: Instant) {
        let window = Duration::from_millis(self.cfg.fallback_window_ms).as_secs().max(1);
        let current = self.second(now);
        while self.buckets.front().is_some_and(|&(s, _, _)| s + window <= current) {
            self.buckets.pop_front();
        }
    }

    /// Count one finished request; returns a crossing if this one made it.
    pub fn record(&mut self, now: Instant, by_cloud: bool) -> Option<Crossing> {
        self.expire(now);
        let s = self.second(now);
        match self.buckets.back_mut() {
            Some(b) if b.0 == s => {
                b.1 += 1;
                b.2 += u64::from(by_cloud);
            }
            _ => self.buckets.push_back((s, 1, u64::from(by_cloud))),
        }
        self.check()
    }

    /// (share, requests) in the window now.
    pub fn share(&mut self, now: Instant) -> (f64, u64) {
        self.expire(now);
        self.totals()
    }

    fn totals(&self) -> (f64, u64) {
        let (n, cloud) = self.buckets.iter().fold((0, 0), |(n, c), b| (n + b.1, c + b.2));
        (if n == 0 { 0.0 } else { cloud as f64 / n as f64 }, n)
    }

    fn check(&mut self) -> Option<Crossing> {
        let threshold = self.cfg.fallback_share;
        if threshold <= 0.0 {
            return None;
        }
        let (share, requests) = self.totals();
        let above = requests >= self.cfg.fallback_min_requests && share >= threshold;
        // Back down only below the threshold, not merely under the minimum count.
        let below = share < threshold;
        if above && !self.above {
            self.above = true;
            return Some(Crossing { share, requests, threshold, above: true });
        }
        if below && self.above {
            self.above = false;
            return Some(Crossing { share, requests, threshold, above: false });
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> AlertsConfig {
        AlertsConfig { fallback_share: 0.5, fallback_window_ms: 10_000, fallback_min_requests: 4 }
    }

    #[test]
    fn crossing_up_and_down_is_reported_once_each() {
        let t0 = Instant::now();
        let mut w = Window::new(cfg(), t0);
        assert_eq!(w.record(t0, true), None, "one request is below the minimum count");
        assert_eq!(w.record(t0, true), None);
        assert_eq!(w.record(t0, false), None);
        let up = w.record(t0, true).expect("3 of 4 by cloud crosses 0.5");
        assert!(up.above && (up.share - 0.75).abs() < 1e-9 && up.requests == 4);
        assert_eq!(w.record(t0, true), None, "still above: no second alert");
        for _ in 0..3 {
            assert_eq!(w.record(t0, false), None, "4 of 7, 4 of 8 stay at or above 0.5");
        }
        let down = w.record(t0, false).expect("4 of 9 falls below");
        assert!(!down.above);
    }

    #[test]
    fn old_requests_leave_the_window() {
        let t0 = Instant::now();
        let mut w = Window::new(cfg(), t0);
        for _ in 0..4 {
            w.record(t0, true);
        }
        assert_eq!(w.share(t0), (1.0, 4));
        assert_eq!(w.share(t0 + Duration::from_secs(9)), (1.0, 4));
        assert_eq!(w.share(t0 + Duration::from_secs(10)), (0.0, 0));
        let down = w.record(t0 + Duration::from_secs(11), false).expect("the cloud answers aged out");
        assert!(!down.above);
    }
}
