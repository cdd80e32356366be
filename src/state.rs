//! The broker's runtime state: the config in force, the node registry, one router per
//! category, admission, the retry budget, the HTTP clients, telemetry, and `apply()`, which
//! moves all of it to a new config.
//!
//! Every change of config (a file reload, an admin API edit, an import) ends in `apply()`, so
//! what a section says is what runs: nodes are added, removed or retuned in place (their
//! in-flight requests finish on their own handle), routers are rebuilt when categories change,
//! queue limits, the breaker policy, the retry budget, the probe schedule and the alert
//! thresholds are swapped. Only what is bound at start (listener sockets and their keys, the
//! admin address, the store, the HTTP client's connect timeout, the header-read timeout) waits
//! for a restart, and `restart_needed` names exactly those keys so no edit is silently ignored.
//!
//! Reads are snapshots (`ArcSwap`, `watch`): the request path never waits for a reload.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use arc_swap::ArcSwap;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admit::Admission;
use crate::config::{Config, HealthConfig};
use crate::node::{NodeTuning, Registry};
use crate::retry::RetryBudget;
use crate::route::Router;
use crate::telemetry::Telemetry;

/// Config keys that are read once, when the broker starts, and why. Everything else applies
/// at the next reload.
pub const RESTART_KEYS: &[(&str, &str)] = &[
    ("listeners", "proxy sockets and their client keys are bound at start"),
    ("admin.addr", "the admin socket is bound at start"),
    ("store", "the request store is opened at start"),
    ("proxy.connect_timeout_ms", "the node HTTP client is built at start"),
    ("proxy.header_read_timeout_ms", "the listeners' connection settings are fixed at start"),
];

/// The keys of `RESTART_KEYS` whose values differ between `running` and `next`.
pub fn restart_needed(running: &Config, next: &Config) -> Vec<&'static str> {
    let differs = [
        running.listeners != next.listeners,
        running.admin != next.admin,
        running.store != next.store,
        running.proxy.connect_timeout_ms != next.proxy.connect_timeout_ms,
        running.proxy.header_read_timeout_ms != next.proxy.header_read_timeout_ms,
    ];
    RESTART_KEYS.iter().zip(differs).filter(|(_, d)| *d).map(|((k, _), _)| *k).collect()
}

/// What the last config file reloads did, for status displays.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ReloadStatus {
    pub reloads: u64,
    pub last_error: Option<String>,
    /// Keys changed in the file that take effect only at the next restart.
    pub pending_restart: Vec<String>,
}

/// State shared by every proxy listener (and the admin API, which changes it at runtime).
pub struct Shared {
    config: ArcSwap<Config>,
    routers: ArcSwap<HashMap<String, Arc<Router>>>,
    pub registry: Arc<Registry>,
    pub admission: Arc<Admission>,
    pub retry_budget: RetryBudget,
    pub client: reqwest::Client,
    pub shutdown: CancellationToken,
    /// Background work started by requests (model operations fanned out to nodes): shutdown
    /// waits for it within the drain bound.
    pub tasks: TaskTracker,
    pub telemetry: Arc<Telemetry>,
    /// Outcome of config file reloads, for status displays.
    pub reload: Arc<Mutex<ReloadStatus>>,
    /// Clients for cloud providers (per connect timeout).
    pub cloud_clients: crate::cloud::Clients,
    /// Client keys of listeners that name `api_keys`, kept in step with the keyring.
    pub client_keys: Arc<crate::clients::ClientKeys>,
    /// The probe schedule, watched by the health task.
    health: tokio::sync::watch::Sender<HealthConfig>,
    /// False while an operator has paused the broker: new requests get 503 `paused`.
    accepting: AtomicBool,
    seed: Option<u64>,
    rng: Mutex<SmallRng>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("state::Shared").field("registry", &self.registry).finish()
    }
}

fn routers_for(config: &Config, seed: Option<u64>) -> HashMap<String, Arc<Router>> {
    config
        .categories
        .iter()
        .enumerate()
        .map(|(i, c)| (c.name.clone(), Arc::new(Router::new(c, seed.map(|s| s.wrapping_add(i as u64))))))
        .collect()
}

impl Shared {
    pub fn new(
        config: Config,
        registry: Arc<Registry>,
        client: reqwest::Client,
        shutdown: CancellationToken,
        telemetry: Arc<Telemetry>,
        seed: Option<u64>,
    ) -> Self {
        let rng = match seed {
            Some(s) => SmallRng::seed_from_u64(s ^ 0x5eed),
            None => SmallRng::from_entropy(),
        };
        telemetry.set_alerts(config.alerts.clone());
        Self {
            routers: ArcSwap::from_pointee(routers_for(&config, seed)),
            admission: Arc::new(Admission::new(Arc::clone(&registry), config.queue.clone())),
            retry_budget: RetryBudget::new(config.retry.budget_ratio, config.retry.budget_min_per_sec),
            health: tokio::sync::watch::Sender::new(config.health.clone()),
            config: ArcSwap::from_pointee(config),
            registry,
            client,
            shutdown,
            tasks: TaskTracker::new(),
            telemetry,
            reload: Arc::default(),
            cloud_clients: crate::cloud::Clients::default(),
            client_keys: Arc::default(),
            accepting: AtomicBool::new(true),
            seed,
            rng: Mutex::new(rng),
        }
    }

    /// The config in force (a snapshot: it may be replaced at any time).
    pub fn config(&self) -> Arc<Config> {
        self.config.load_full()
    }

    /// Every client key name a listener accepts.
    pub fn client_key_names(&self) -> std::collections::BTreeSet<String> {
        self.config().listeners.iter().flat_map(|l| l.api_keys.iter().cloned()).collect()
    }

    /// The probe schedule; changes when a reload changes `[health]`.
    pub fn health_config(&self) -> tokio::sync::watch::Receiver<HealthConfig> {
        self.health.subscribe()
    }

    /// Swap in a validated config: nodes, categories (and their routers), queue limits, the
    /// breaker policy, the retry budget, probes and alerts. Listeners and addresses stay as
    /// they were bound (see `restart_needed`).
    pub fn apply(&self, next: Config) {
        let prev = self.config();
        self.apply_nodes(&prev, &next);
        if prev.categories != next.categories {
            self.routers.store(Arc::new(routers_for(&next, self.seed)));
        }
        self.admission.set_limits(next.queue.clone());
        self.retry_budget.set_policy(next.retry.budget_ratio, next.retry.budget_min_per_sec);
        self.telemetry.set_alerts(next.alerts.clone());
        if prev.health != next.health {
            self.health.send_replace(next.health.clone());
        }
        self.config.store(Arc::new(next));
        self.admission.dispatch();
    }

    /// Nodes: add new, drop gone (their in-flight requests finish), retune the rest in place.
    fn apply_nodes(&self, prev: &Config, next: &Config) {
        let tuning = NodeTuning::of(next);
        self.registry.set_tuning(tuning);
        for gone in prev.nodes.iter().filter(|p| !next.nodes.iter().any(|n| n.name == p.name)) {
            self.registry.remove(&gone.name);
            tracing::info!(node = %gone.name, "node removed");
        }
        for n in &next.nodes {
            match self.registry.get(&n.name) {
                Some(node) if node.config.url == n.url && node.config.kind == n.kind => {
                    node.set_weight(n.weight);
                    node.set_max_concurrency(n.max_concurrency);
                    node.set_tuning(tuning);
                    let was = prev.nodes.iter().find(|p| p.name == n.name).map(|p| p.enabled);
                    if was != Some(n.enabled) {
                        node.set_enabled(n.enabled);
                    }
                }
                existing => {
                    if existing.is_some() {
                        self.registry.remove(&n.name);
                    }
                    match self.registry.add(n.clone()) {
                        Ok(_) => tracing::info!(node = %n.name, url = %n.url, "node added"),
                        Err(e) => tracing::error!(node = %n.name, error = %e, "node not added"),
                    }
                }
            }
        }
    }

    /// Pause or resume taking new requests (running ones always finish).
    pub fn set_accepting(&self, on: bool) {
        let was = self.accepting.swap(on, Ordering::AcqRel);
        if was != on {
            tracing::warn!(accepting = on, "broker {}", if on { "resumed" } else { "paused: new requests get 503" });
        }
    }

    pub fn accepting(&self) -> bool {
        self.accepting.load(Ordering::Acquire)
    }

    fn rng(&self) -> MutexGuard<'_, SmallRng> {
        self.rng.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The router of `category` (the default one for a category that just vanished).
    pub fn router(&self, category: &str) -> Option<Arc<Router>> {
        let routers = self.routers.load();
        routers.get(category).or_else(|| routers.get("default")).or_else(|| routers.values().next()).cloned()
    }

    /// Full jitter (AWS architecture blog): uniform in [0, min(cap, base * 2^retry)].
    pub fn backoff(&self, retry: u32) -> Duration {
        let config = self.config();
        let r = &config.retry;
        let ceiling = r.backoff_base_ms.saturating_mul(1u64 << retry.min(20)).min(r.backoff_cap_ms);
        let ms = self.rng().gen_range(0..=ceiling);
        Duration::from_millis(ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restart_keys_are_named_only_when_they_change() {
        let a = Config::default();
        let mut b = a.clone();
        b.breaker.failures_to_open += 1;
        b.health.interval_ms += 1;
        assert!(restart_needed(&a, &b).is_empty(), "breaker and health apply at reload");
        b.proxy.connect_timeout_ms += 1;
        b.admin.addr = "127.0.0.1:1".into();
        assert_eq!(restart_needed(&a, &b), vec!["admin.addr", "proxy.connect_timeout_ms"]);
    }
}
