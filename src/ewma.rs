//! Peak-EWMA of time to first byte, the latency signal of `least-latency` and `p2c`.
//!
//! As in Finagle and tower's `PeakEwma`: a sample above the current estimate replaces it at
//! once (the estimate reacts to a node getting slow immediately), a sample below it is blended
//! in with weight `exp(-elapsed / decay)` (the estimate relaxes back over about `decay`). With
//! no samples yet the estimate is `None`, and policies treat such a node as worth exploring.

use std::time::Duration;

use tokio::time::Instant;

#[derive(Debug, Clone)]
pub struct PeakEwma {
    decay: Duration,
    estimate_ns: Option<f64>,
    updated: Option<Instant>,
}

impl PeakEwma {
    pub fn new(decay: Duration) -> Self {
        Self { decay, estimate_ns: None, updated: None }
    }

    pub fn observe(&mut self, sample: Duration, now: Instant) {
        let rtt = sample.as_nanos() as f64;
        let next = match (self.estimate_ns, self.updated) {
            (Some(est), _) if rtt > est => rtt,
            (Some(est), Some(at)) => {
                let elapsed = now.saturating_duration_since(at).as_nanos() as f64;
                let w = (-elapsed / self.decay.as_nanos().max(1) as f64).exp();
                est * w + rtt * (1.0 - w)
            }
            _ => rtt,
        };
        self.estimate_ns = Some(next);
        self.updated = Some(now);
    }

    /// The estimate as of the last sample, undecayed, and when that sample came: what a person
    /// is shown. The decay in `estimate` is a routing device (explore a node that was slow
    /// once), not a measurement, so it must not reach a screen as "1 ms".
    pub fn last(&self) -> Option<(Duration, Instant)> {
        Some((Duration::from_nanos(self.estimate_ns? as u64), self.updated?))
    }

    /// The current estimate, decayed towards zero while nothing is observed, so a node that
    /// was slow once gets tried again eventually.
    pub fn estimate(&self, now: Instant) -> Option<Duration> {
        let (est, at) = (self.estimate_ns?, self.updated?);
        let elapsed = now.saturating_duration_since(at).as_nanos() as f64;
        let w = (-elapsed / self.decay.as_nanos().max(1) as f64).exp();
        Some(Duration::from_nanos((est * w) as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn peaks_are_taken_at_once_and_decay_slowly() {
        let mut e = PeakEwma::new(Duration::from_secs(10));
        assert_eq!(e.estimate(Instant::now()), None);
        e.observe(Duration::from_millis(100), Instant::now());
        e.observe(Duration::from_millis(900), Instant::now());
        assert_eq!(e.estimate(Instant::now()), Some(Duration::from_millis(900)), "a peak replaces the estimate");
        tokio::time::advance(Duration::from_secs(1)).await;
        e.observe(Duration::from_millis(100), Instant::now());
        let est = e.estimate(Instant::now()).expect("estimate").as_millis();
        assert!((800..900).contains(&est), "a low sample moves the estimate only a little after 1 s: {est}");
        tokio::time::advance(Duration::from_secs(60)).await;
        let est = e.estimate(Instant::now()).expect("estimate");
        assert!(est < Duration::from_millis(10), "an old estimate fades: {est:?}");
        let (shown, _) = e.last().expect("a sample was seen");
        assert!(shown.as_millis() >= 800, "what a person sees does not fade with idleness: {shown:?}");
    }
}
