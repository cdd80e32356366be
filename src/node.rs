//! The node registry: each configured node's static facts plus its live state.
//!
//! Live state is written by two kinds of observers, the probes in `health` and the outcomes of
//! real requests in `proxy`, and read on every request by `route`. Reads are lock-free (atomics
//! and `ArcSwap` snapshots); no lock is ever held across an `.await`.
//!
//! In-flight counting is a guard (`InFlight`) taken at dispatch and dropped when the answer's
//! stream ends or is cancelled, so the count can never drift or go below zero. Dropping a guard
//! wakes requests waiting for capacity.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use serde::Serialize;
use tokio::sync::Notify;

use crate::config::{normalize_model, NodeConfig};

/// Liveness as the broker believes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    /// Not probed yet: optimistically routable, so a fresh broker serves at once.
    Unknown,
    Healthy,
    Unhealthy,
}

impl Health {
    fn from_u8(v: u8) -> Self {
        match v {
            1 => Self::Healthy,
            2 => Self::Unhealthy,
            _ => Self::Unknown,
        }
    }
    fn as_u8(self) -> u8 {
        match self {
            Self::Unknown => 0,
            Self::Healthy => 1,
            Self::Unhealthy => 2,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::Healthy => "healthy",
            Self::Unhealthy => "unhealthy",
        }
    }
}

/// A model a node reported as loaded in `/api/ps`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LoadedModel {
    pub name: String,
    pub size: u64,
    pub size_vram: u64,
}

/// How one exchange with a node ended, judged once at the end of the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The node answered (any 2xx/4xx) and the body ended cleanly.
    Success,
    /// The node is saturated ("server busy"): try elsewhere, not a failure.
    Busy,
    /// The TCP connection could not be made: the node is not there.
    ConnectFailed,
    /// 5xx, or the transport broke before the answer started.
    Failed,
    /// No first byte, or silence between chunks, past the configured timeout.
    TimedOut,
    /// The answer started and then broke off.
    StreamCut,
    /// The client went away; says nothing about the node.
    ClientGone,
}

impl Outcome {
    pub fn is_node_failure(self) -> bool {
        matches!(self, Self::ConnectFailed | Self::Failed | Self::TimedOut | Self::StreamCut)
    }
}

pub struct Node {
    pub config: NodeConfig,
    pub base_url: url::Url,
    health: AtomicU8,
    enabled: AtomicBool,
    in_flight: AtomicUsize,
    probe_successes: AtomicU32,
    probe_failures: AtomicU32,
    passive_failures: AtomicU32,
    /// Models from `/api/tags`, normalized; `None` until the first deep probe answers.
    models: ArcSwap<Option<BTreeSet<String>>>,
    loaded: ArcSwap<Vec<LoadedModel>>,
    served: AtomicUsize,
    capacity_freed: Arc<Notify>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("name", &self.config.name)
            .field("health", &self.health())
            .field("in_flight", &self.in_flight())
            .finish()
    }
}

impl Node {
    pub fn new(config: NodeConfig, capacity_freed: Arc<Notify>) -> Result<Self, url::ParseError> {
        let base_url = url::Url::parse(&config.url)?;
        Ok(Self {
            enabled: AtomicBool::new(config.enabled),
            config,
            base_url,
            health: AtomicU8::new(Health::Unknown.as_u8()),
            in_flight: AtomicUsize::new(0),
            probe_successes: AtomicU32::new(0),
            probe_failures: AtomicU32::new(0),
            passive_failures: AtomicU32::new(0),
            models: ArcSwap::from_pointee(None),
            loaded: ArcSwap::from_pointee(Vec::new()),
            served: AtomicUsize::new(0),
            capacity_freed,
        })
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    pub fn health(&self) -> Health {
        Health::from_u8(self.health.load(Ordering::Acquire))
    }

    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Acquire)
    }

    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Release);
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Requests this node answered since start, for status and tests.
    pub fn served(&self) -> usize {
        self.served.load(Ordering::Relaxed)
    }

    pub fn has_capacity(&self) -> bool {
        self.in_flight() < self.config.max_concurrency as usize
    }

    /// Routable at all: enabled and not known to be down.
    pub fn is_available(&self) -> bool {
        self.enabled() && self.health() != Health::Unhealthy
    }

    /// `Some(true/false)` once the node's model list is known; `None` before that.
    pub fn serves(&self, model: &str) -> Option<bool> {
        let models = self.models.load();
        models.as_ref().as_ref().map(|set| set.contains(&normalize_model(model)))
    }

    pub fn models(&self) -> Option<BTreeSet<String>> {
        self.models.load().as_ref().clone()
    }

    pub fn set_models(&self, names: impl IntoIterator<Item = String>) {
        let set: BTreeSet<String> = names.into_iter().map(|n| normalize_model(&n)).collect();
        self.models.store(Arc::new(Some(set)));
    }

    pub fn loaded(&self) -> Arc<Vec<LoadedModel>> {
        self.loaded.load_full()
    }

    pub fn set_loaded(&self, loaded: Vec<LoadedModel>) {
        self.loaded.store(Arc::new(loaded));
    }

    /// Take a slot regardless of capacity. The returned guard gives it back when dropped.
    pub fn dispatch(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight { node: Arc::clone(self) }
    }

    /// Take a slot only if one is free under `max_concurrency` (atomically: two requests can
    /// never both take the last slot).
    pub fn try_dispatch(self: &Arc<Self>) -> Option<InFlight> {
        let max = self.config.max_concurrency as usize;
        self.in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1))
            .ok()
            .map(|_| InFlight { node: Arc::clone(self) })
    }

    fn set_health(&self, to: Health, reason: &str) {
        let from = Health::from_u8(self.health.swap(to.as_u8(), Ordering::AcqRel));
        if from != to {
            tracing::info!(node = %self.name(), from = from.name(), to = to.name(), reason, "node health changed");
        }
    }

    /// Feed one liveness probe result through the hysteresis.
    pub fn record_probe(&self, ok: bool, failures_to_down: u32, successes_to_up: u32) {
        if ok {
            self.probe_failures.store(0, Ordering::Release);
            let n = self.probe_successes.fetch_add(1, Ordering::AcqRel) + 1;
            match self.health() {
                Health::Unknown => self.set_health(Health::Healthy, "first probe answered"),
                Health::Unhealthy if n >= successes_to_up => {
                    self.passive_failures.store(0, Ordering::Release);
                    self.set_health(Health::Healthy, "probes answered again");
                }
                _ => {}
            }
        } else {
            self.probe_successes.store(0, Ordering::Release);
            let n = self.probe_failures.fetch_add(1, Ordering::AcqRel) + 1;
            if self.health() != Health::Unhealthy && n >= failures_to_down {
                self.set_health(Health::Unhealthy, "liveness probes failed");
            }
        }
    }

    /// Feed the outcome of a real request (passive health).
    pub fn record_outcome(&self, outcome: Outcome, passive_failures_to_down: u32) {
        match outcome {
            Outcome::Success => {
                self.served.fetch_add(1, Ordering::Relaxed);
                self.passive_failures.store(0, Ordering::Release);
            }
            Outcome::Busy | Outcome::ClientGone => {}
            Outcome::ConnectFailed => {
                // A refused connection is certain: do not wait for the next probe.
                self.probe_successes.store(0, Ordering::Release);
                self.set_health(Health::Unhealthy, "connection refused on a request");
            }
            Outcome::Failed | Outcome::TimedOut | Outcome::StreamCut => {
                let n = self.passive_failures.fetch_add(1, Ordering::AcqRel) + 1;
                if n >= passive_failures_to_down && self.health() != Health::Unhealthy {
                    self.probe_successes.store(0, Ordering::Release);
                    self.set_health(Health::Unhealthy, "consecutive request failures");
                }
            }
        }
    }
}

/// One request's claim on a node's capacity.
#[derive(Debug)]
pub struct InFlight {
    node: Arc<Node>,
}

impl InFlight {
    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.node.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.node.capacity_freed.notify_waiters();
    }
}

/// All configured nodes, in config order.
#[derive(Debug)]
pub struct Registry {
    nodes: Vec<Arc<Node>>,
    capacity_freed: Arc<Notify>,
    waiting: AtomicUsize,
}

impl Registry {
    pub fn new(configs: &[NodeConfig]) -> Result<Self, url::ParseError> {
        let capacity_freed = Arc::new(Notify::new());
        let nodes = configs
            .iter()
            .map(|c| Node::new(c.clone(), Arc::clone(&capacity_freed)).map(Arc::new))
            .collect::<Result<_, _>>()?;
        Ok(Self { nodes, capacity_freed, waiting: AtomicUsize::new(0) })
    }

    pub fn all(&self) -> &[Arc<Node>] {
        &self.nodes
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Node>> {
        self.nodes.iter().find(|n| n.name() == name)
    }

    /// Woken whenever any node frees a slot.
    pub fn capacity_freed(&self) -> &Notify {
        &self.capacity_freed
    }

    /// Requests waiting for a free slot right now (the queue depth).
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// Count one request as waiting until the guard drops.
    pub fn wait_guard(&self) -> Waiting<'_> {
        self.waiting.fetch_add(1, Ordering::AcqRel);
        Waiting(self)
    }
}

/// One request counted in the queue depth.
#[derive(Debug)]
pub struct Waiting<'a>(&'a Registry);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> Arc<Node> {
        let cfg = NodeConfig { name: "a".into(), url: "http://127.0.0.1:1".into(), ..NodeConfig::default() };
        Arc::new(Node::new(cfg, Arc::new(Notify::new())).expect("valid url"))
    }

    #[test]
    fn in_flight_guard_never_drifts() {
        let n = node();
        let a = n.dispatch();
        let b = n.dispatch();
        assert_eq!(n.in_flight(), 2);
        drop(a);
        drop(b);
        assert_eq!(n.in_flight(), 0);
    }

    #[test]
    fn hysteresis_needs_consecutive_successes_to_come_back() {
        let n = node();
        n.record_probe(true, 2, 3);
        assert_eq!(n.health(), Health::Healthy, "first good probe makes an unknown node healthy");
        n.record_probe(false, 2, 3);
        assert_eq!(n.health(), Health::Healthy, "one failure is not enough");
        n.record_probe(false, 2, 3);
        assert_eq!(n.health(), Health::Unhealthy);
        n.record_probe(true, 2, 3);
        n.record_probe(true, 2, 3);
        n.record_probe(false, 2, 3);
        n.record_probe(true, 2, 3);
        n.record_probe(true, 2, 3);
        assert_eq!(n.health(), Health::Unhealthy, "a failure in between restarts the count");
        n.record_probe(true, 2, 3);
        assert_eq!(n.health(), Health::Healthy);
    }

    #[test]
    fn busy_and_client_gone_do_not_count_against_a_node() {
        let n = node();
        for _ in 0..10 {
            n.record_outcome(Outcome::Busy, 2);
            n.record_outcome(Outcome::ClientGone, 2);
        }
        assert_ne!(n.health(), Health::Unhealthy);
        n.record_outcome(Outcome::Failed, 2);
        n.record_outcome(Outcome::Failed, 2);
        assert_eq!(n.health(), Health::Unhealthy);
    }

    #[test]
    fn model_lookup_uses_ollama_names() {
        let n = node();
        assert_eq!(n.serves("llama3.2"), None, "unknown before the first deep probe");
        n.set_models(["llama3.2".to_string()]);
        assert_eq!(n.serves("llama3.2:latest"), Some(true));
        assert_eq!(n.serves("qwen"), Some(false));
    }
}
