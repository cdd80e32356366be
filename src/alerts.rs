//! What deserves a person's attention, from the telemetry bus: node down, node back, a
//! failover storm, cloud fallback starting and ending (and its share crossing the alert line),
//! a config reload that failed. One notice per change of state, never one per request, and
//! rate-limited per subject so a flapping node cannot flood the desktop.
//!
//! `Alerts` is pure (events and instants in, notices out), so the policy is tested with a
//! driven clock; `deliver` hands notices to the desktop's notification server (notify-rust:
//! D-Bus on Linux, the native centres elsewhere). `corral serve --notify` and the desktop app
//! both run `run`.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use tokio::sync::broadcast;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::node::NodeState;
use crate::store::RequestRow;
use crate::telemetry::Event;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Urgency {
    Normal,
    Critical,
}

/// One desktop notification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// Dedup key: notices with the same subject are rate-limited together.
    pub subject: String,
    pub summary: String,
    pub body: String,
    pub urgency: Urgency,
}

/// Failovers (requests that needed more than one node) within this window that make a storm.
const STORM_COUNT: usize = 5;
const STORM_WINDOW: Duration = Duration::from_secs(60);
/// At most this many notices per subject per `BURST_WINDOW`: a node that goes down and comes
/// back is told both ways; one that flaps is told once each way, then left to the UI.
const BURST: usize = 2;
const BURST_WINDOW: Duration = Duration::from_secs(60);
/// After a storm notice, quiet for this long.
const STORM_QUIET: Duration = Duration::from_secs(300);

#[derive(Debug, Default)]
pub struct Alerts {
    muted: bool,
    sent: HashMap<String, VecDeque<Instant>>,
    failovers: VecDeque<Instant>,
    storm_until: Option<Instant>,
    in_fallback: bool,
    /// Node states already announced (down or not), so a repeat of the same state says
    /// nothing; for a down node, since when (unix ms) and why, for the "back" notice.
    announced: HashMap<String, Announced>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Announced {
    Up,
    Down { at_ms: i64, reason: String },
}

impl Alerts {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn set_muted(&mut self, muted: bool) {
        self.muted = muted;
    }

    pub fn muted(&self) -> bool {
        self.muted
    }

    /// The notices `event` calls for at `now` (none while muted; state is still tracked).
    pub fn on_event(&mut self, event: &Event, now: Instant) -> Vec<Notice> {
        let candidates = self.judge(event, now);
        if self.muted {
            return Vec::new();
        }
        candidates
            .into_iter()
            .filter(|n| {
                let times = self.sent.entry(n.subject.clone()).or_default();
                while times.front().is_some_and(|&t| now.duration_since(t) >= BURST_WINDOW) {
                    times.pop_front();
                }
                let allowed = times.len() < BURST;
                if allowed {
                    times.push_back(now);
                } else {
                    tracing::debug!(subject = %n.subject, summary = %n.summary, "notification rate-limited");
                }
                allowed
            })
            .collect()
    }

    /// The notices `event` calls for, before muting and rate limits.
    fn judge(&mut self, event: &Event, now: Instant) -> Vec<Notice> {
        match event {
            Event::NodeState { node, from, to, reason, at } => self.node_state(node, *from, *to, reason, *at),
            Event::Request(row) => {
                let mut out = Vec::new();
                out.extend(self.storm(row, now));
                out.extend(self.fallback(row));
                out
            }
            Event::FallbackShare { share, threshold, above: true, .. } => vec![Notice {
                subject: "fallback-share".into(),
                summary: format!("{:.0}% of requests answered by the cloud", share * 100.0),
                body: format!("Above the alert line of {:.0}% (alerts.fallback_share).", threshold * 100.0),
                urgency: Urgency::Critical,
            }],
            Event::FallbackShare { .. } => Vec::new(),
            Event::ConfigReload { ok: false, error } => vec![Notice {
                subject: "config-reload".into(),
                summary: "Config reload failed".into(),
                body: format!("The running config is unchanged. {}", error.as_deref().unwrap_or("")),
                urgency: Urgency::Critical,
            }],
            Event::ConfigReload { ok: true, .. } => Vec::new(),
        }
    }

    /// Down, or back from down; once per change, so a repeated state says nothing. The down
    /// notice says why ("connection refused at http://..."); the back notice how long it was
    /// down and why.
    fn node_state(&mut self, node: &str, from: NodeState, to: NodeState, reason: &str, at: i64) -> Vec<Notice> {
        let down = to == NodeState::Unhealthy;
        let up = matches!(to, NodeState::Healthy | NodeState::Recovering) && from == NodeState::Unhealthy;
        let was_down = matches!(self.announced.get(node), Some(Announced::Down { .. }));
        if !(down || up) || (was_down == down && self.announced.contains_key(node)) {
            return Vec::new();
        }
        let subject = format!("node:{node}");
        if down {
            self.announced.insert(node.to_string(), Announced::Down { at_ms: at, reason: reason.to_string() });
            return vec![Notice {
                subject,
                summary: format!("Node {node} is down"),
                body: format!("{}. Its requests go to the other nodes.", sentence(reason)),
                urgency: Urgency::Critical,
            }];
        }
        let body = match self.announced.insert(node.to_string(), Announced::Up) {
            Some(Announced::Down { at_ms, reason }) => format!(
                "Back after {} down ({reason}). It takes a growing share of requests again.",
                crate::node::duration_text(at - at_ms)
            ),
            _ => "It takes a growing share of requests again.".into(),
        };
        vec![Notice { subject, summary: format!("Node {node} is back"), body, urgency: Urgency::Normal }]
    }

    /// `STORM_COUNT` failovers within `STORM_WINDOW` make a storm, told once per `STORM_QUIET`.
    fn storm(&mut self, row: &RequestRow, now: Instant) -> Option<Notice> {
        if row.attempts > 1 && row.node.is_some() {
            self.failovers.push_back(now);
        }
        while self.failovers.front().is_some_and(|&t| now.duration_since(t) > STORM_WINDOW) {
            self.failovers.pop_front();
        }
        let quiet = self.storm_until.is_some_and(|t| now < t);
        if self.failovers.len() < STORM_COUNT || quiet {
            return None;
        }
        self.storm_until = Some(now + STORM_QUIET);
        Some(Notice {
            subject: "failover-storm".into(),
            summary: "Failover storm".into(),
            body: format!(
                "{} requests needed another node in the last minute: a node is failing while it still looks up.",
                self.failovers.len()
            ),
            urgency: Urgency::Critical,
        })
    }

    /// The first request a provider answers starts a fallback; the next inference request a
    /// node answers on its own ends it.
    fn fallback(&mut self, row: &RequestRow) -> Option<Notice> {
        let inference = crate::cloud::can_fall_back(&row.endpoint);
        match (&row.fallback, row.status.as_str()) {
            (Some(provider), "ok") if !self.in_fallback => {
                self.in_fallback = true;
                Some(Notice {
                    subject: "cloud-fallback".into(),
                    summary: "Cloud fallback started".into(),
                    body: format!("The cluster could not answer a {} request; {provider} did.", row.category),
                    urgency: Urgency::Critical,
                })
            }
            (None, "ok") if self.in_fallback && inference && row.node.is_some() => {
                self.in_fallback = false;
                Some(Notice {
                    subject: "cloud-fallback-ended".into(),
                    summary: "Cloud fallback ended".into(),
                    body: "The cluster answers on its own again.".into(),
                    urgency: Urgency::Normal,
                })
            }
            _ => None,
        }
    }
}

/// A reason as the start of a sentence: first letter up, no trailing full stop.
fn sentence(reason: &str) -> String {
    let r = reason.trim().trim_end_matches('.');
    let mut c = r.chars();
    match c.next() {
        Some(first) => first.to_uppercase().chain(c).collect(),
        None => "No reason was given".into(),
    }
}

/// Why a notice did not reach the desktop.
#[derive(Debug, thiserror::Error)]
pub enum NoticeError {
    /// The notification server (D-Bus on Linux, the native centre elsewhere) refused or is
    /// not there.
    #[error("the desktop notification server failed: {0}")]
    Server(String),
}

impl NoticeError {
    pub fn code(&self) -> &'static str {
        match self {
            Self::Server(_) => "notification_failed",
        }
    }
}

/// Show a notice on the desktop. Blocks on D-Bus: call off the async workers.
pub fn deliver(n: &Notice) -> Result<(), NoticeError> {
    let mut note = notify_rust::Notification::new();
    note.appname("Corral").summary(&n.summary).body(&n.body);
    #[cfg(all(unix, not(target_os = "macos")))]
    note.urgency(match n.urgency {
        Urgency::Normal => notify_rust::Urgency::Normal,
        Urgency::Critical => notify_rust::Urgency::Critical,
    });
    note.show().map(|_| ()).map_err(|e| NoticeError::Server(e.to_string()))
}

/// The next event of the bus for a notifier; `None` once `cancel` fires or the bus closes. A
/// notifier that fell behind skips what it missed (logged) rather than stopping.
pub async fn next_event(events: &mut broadcast::Receiver<Event>, cancel: &CancellationToken) -> Option<Event> {
    loop {
        let event = tokio::select! {
            _ = cancel.cancelled() => return None,
            e = events.recv() => e,
        };
        match event {
            Ok(e) => return Some(e),
            Err(broadcast::error::RecvError::Lagged(n)) => {
                tracing::warn!(missed = n, "notifications fell behind the event bus");
            }
            Err(broadcast::error::RecvError::Closed) => return None,
        }
    }
}

/// Turn the bus into desktop notifications until `cancel`. `muted` is read per event, so a
/// setting can switch them off at runtime.
pub async fn run(
    mut events: broadcast::Receiver<Event>,
    muted: std::sync::Arc<std::sync::atomic::AtomicBool>,
    cancel: CancellationToken,
) {
    let mut alerts = Alerts::new();
    while let Some(event) = next_event(&mut events, &cancel).await {
        alerts.set_muted(muted.load(std::sync::atomic::Ordering::Relaxed));
        for notice in alerts.on_event(&event, Instant::now()) {
            tracing::info!(summary = %notice.summary, "desktop notification");
            let n = notice.clone();
            match tokio::task::spawn_blocking(move || deliver(&n)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(summary = %notice.summary, error = %e, "notification not shown"),
                Err(e) => tracing::warn!(error = %e, "notification task failed"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(node: &str, from: NodeState, to: NodeState) -> Event {
        Event::NodeState { node: node.into(), from, to, reason: "probe failed".into(), at: 0 }
    }

    fn request(attempts: i64, node: Option<&str>, fallback: Option<&str>) -> Event {
        Event::Request(std::sync::Arc::new(RequestRow {
            endpoint: "/api/chat".into(),
            category: "default".into(),
            attempts,
            node: node.map(str::to_string),
            fallback: fallback.map(str::to_string),
            status: "ok".into(),
            ..RequestRow::default()
        }))
    }

    fn summaries(n: Vec<Notice>) -> Vec<String> {
        n.into_iter().map(|n| n.summary).collect()
    }

    #[test]
    fn one_notice_per_state_change_and_none_for_a_repeat() {
        let t = Instant::now();
        let mut a = Alerts::new();
        assert!(
            a.on_event(&state("gpu0", NodeState::Unknown, NodeState::Healthy), t).is_empty(),
            "coming up at start is quiet"
        );
        assert_eq!(
            summaries(a.on_event(&state("gpu0", NodeState::Healthy, NodeState::Unhealthy), t)),
            ["Node gpu0 is down"]
        );
        assert!(a.on_event(&state("gpu0", NodeState::Unhealthy, NodeState::Unhealthy), t).is_empty());
        let later = t + Duration::from_secs(2);
        assert_eq!(
            summaries(a.on_event(&state("gpu0", NodeState::Unhealthy, NodeState::Recovering), later)),
            ["Node gpu0 is back"]
        );
        assert!(
            a.on_event(&state("gpu0", NodeState::Recovering, NodeState::Healthy), later).is_empty(),
            "recovering -> healthy is not news"
        );
    }

    #[test]
    fn down_says_why_and_back_says_how_long() {
        let t = Instant::now();
        let mut a = Alerts::new();
        let down = Event::NodeState {
            node: "gpu0".into(),
            from: NodeState::Healthy,
            to: NodeState::Unhealthy,
            reason: "connection refused at http://10.0.0.6:11434".into(),
            at: 1_000_000,
        };
        let n = a.on_event(&down, t);
        assert_eq!(n.len(), 1);
        assert_eq!(
            n[0].body, "Connection refused at http://10.0.0.6:11434. Its requests go to the other nodes.",
            "the notice names the cause and the address, not \"probes failed\""
        );
        let back = Event::NodeState {
            node: "gpu0".into(),
            from: NodeState::Unhealthy,
            to: NodeState::Recovering,
            reason: "probes answered again".into(),
            at: 1_000_000 + 3 * 60_000 + 5_000,
        };
        let n = a.on_event(&back, t + Duration::from_secs(185));
        assert_eq!(
            n[0].body,
            "Back after 3 min down (connection refused at http://10.0.0.6:11434). It takes a growing share of requests again."
        );
    }

    #[test]
    fn a_flapping_node_is_rate_limited() {
        let t = Instant::now();
        let mut a = Alerts::new();
        let mut shown = 0;
        for i in 0..10u32 {
            let now = t + Duration::from_secs(u64::from(i));
            shown += a.on_event(&state("gpu1", NodeState::Healthy, NodeState::Unhealthy), now).len();
            shown += a.on_event(&state("gpu1", NodeState::Unhealthy, NodeState::Healthy), now).len();
        }
        assert_eq!(shown, 2, "ten flaps in ten seconds: told down and back once");
        let next_minute = t + BURST_WINDOW + Duration::from_secs(10);
        assert_eq!(a.on_event(&state("gpu1", NodeState::Healthy, NodeState::Unhealthy), next_minute).len(), 1);
    }

    #[test]
    fn a_storm_is_announced_once_then_quiet() {
        let t = Instant::now();
        let mut a = Alerts::new();
        let mut notices = Vec::new();
        for i in 0..20u32 {
            notices.extend(a.on_event(&request(2, Some("gpu0"), None), t + Duration::from_millis(u64::from(i) * 100)));
        }
        assert_eq!(summaries(notices), ["Failover storm"]);
        assert!(a.on_event(&request(1, Some("gpu0"), None), t + STORM_WINDOW * 2).is_empty());
    }

    #[test]
    fn fallback_start_and_end_are_one_notice_each() {
        let t = Instant::now();
        let mut a = Alerts::new();
        let mut all = Vec::new();
        for _ in 0..3 {
            all.extend(a.on_event(&request(1, None, Some("openai")), t));
        }
        all.extend(a.on_event(&request(1, Some("gpu0"), None), t));
        all.extend(a.on_event(&request(1, Some("gpu0"), None), t));
        assert_eq!(summaries(all), ["Cloud fallback started", "Cloud fallback ended"]);
    }

    #[test]
    fn muting_silences_but_keeps_track() {
        let t = Instant::now();
        let mut a = Alerts::new();
        a.set_muted(true);
        assert!(a.on_event(&state("gpu0", NodeState::Healthy, NodeState::Unhealthy), t).is_empty());
        a.set_muted(false);
        assert!(
            a.on_event(&state("gpu0", NodeState::Unhealthy, NodeState::Unhealthy), t).is_empty(),
            "already known down"
        );
        let reload = Event::ConfigReload { ok: false, error: Some("line 3: nodes[0].url".into()) };
        let n = a.on_event(&reload, t);
        assert_eq!(summaries(n.clone()), ["Config reload failed"]);
        assert!(n[0].body.contains("line 3"));
    }
}
