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
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
    ("proxy.stream_buffer_total_bytes", "the read-ahead memory bound is set at start"),
    ("telemetry.otlp_endpoint", "the trace exporter is started with the broker and flushed at shutdown"),
];

/// The keys of `RESTART_KEYS` whose values differ between `running` and `next`.
pub fn restart_needed(running: &Config, next: &Config) -> Vec<&'static str> {
    let differs = [
        running.listeners != next.listeners,
        running.admin != next.admin,
        running.store != next.store,
        running.proxy.connect_timeout_ms != next.proxy.connect_timeout_ms,
        running.proxy.header_read_timeout_ms != next.proxy.header_read_timeout_ms,
        running.proxy.stream_buffer_total_bytes != next.proxy.stream_buffer_total_bytes,
        running.telemetry != next.telemetry,
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
    routers: ArcSwap<foldhash::HashMap<String, Arc<Router>>>,
    pub registry: Arc<Registry>,
    pub admission: Arc<Admission>,
    pub retry_budget: RetryBudget,
    /// For probes, model operations and metadata: reqwest.
    pub client: reqwest::Client,
    /// For forwarded requests: hyper's pooled client (`upstream::client`).
    pub node_client: crate::upstream::client::NodeClient,
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
    /// Model operations running now, bounded by `queue.max_model_ops`.
    pub model_ops: Arc<ModelOps>,
    /// Merged metadata answers (`/api/tags`, `/api/ps`, `/v1/models`) of the last moment.
    pub recent: Arc<Recent>,
    /// Bytes of streamed answers held for slow readers, all streams together
    /// (`proxy.stream_buffer_total_bytes` permits; see `proxy::readahead`).
    pub read_ahead: Arc<tokio::sync::Semaphore>,
    read_ahead_total: usize,
    /// Where clients reach the proxy (`http://addr` per listener, as bound) and whether the
    /// nodes are simulated: what the UI tells a person to point clients at.
    front: std::sync::OnceLock<(Vec<String>, bool)>,
    /// The admin listener's address as bound (for discovery's admin URL).
    admin_at: std::sync::OnceLock<std::net::SocketAddr>,
    /// The file the config came from (and is watched), where runtime edits are written too.
    file: std::sync::OnceLock<std::path::PathBuf>,
    /// Held from writing an edit to the file until it is in force, so two edits at once
    /// reach the file and the running broker in the same order.
    edits: std::sync::Mutex<()>,
    /// The probe schedule, watched by the health task.
    health: tokio::sync::watch::Sender<HealthConfig>,
    /// Counts every `apply()`: the fleet's config task wakes on it to publish a local edit.
    applied: tokio::sync::watch::Sender<u64>,
    /// False while an operator has paused the broker: new requests get 503 `paused`.
    accepting: AtomicBool,
    seed: Option<u64>,
    rng: Mutex<SmallRng>,
    /// Unix ms when this broker started.
    started_ms: i64,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("state::Shared").field("registry", &self.registry).finish()
    }
}

fn routers_for(config: &Config, seed: Option<u64>) -> foldhash::HashMap<String, Arc<Router>> {
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
        node_client: crate::upstream::client::NodeClient,
        shutdown: CancellationToken,
        telemetry: Arc<Telemetry>,
        seed: Option<u64>,
    ) -> Self {
        let rng = match seed {
            Some(s) => SmallRng::seed_from_u64(s ^ 0x5eed),
            None => SmallRng::from_entropy(),
        };
        telemetry.set_alerts(config.alerts.clone());
        telemetry.quotas().set_rules(config.quotas.clone());
        let read_ahead_total = config.proxy.stream_buffer_total_bytes.min(tokio::sync::Semaphore::MAX_PERMITS);
        Self {
            read_ahead: Arc::new(tokio::sync::Semaphore::new(read_ahead_total)),
            read_ahead_total,
            routers: ArcSwap::from_pointee(routers_for(&config, seed)),
            admission: Arc::new(Admission::new(Arc::clone(&registry), config.queue.clone())),
            retry_budget: RetryBudget::new(config.retry.budget_ratio, config.retry.budget_min_per_sec),
            health: tokio::sync::watch::Sender::new(config.health.clone()),
            applied: tokio::sync::watch::Sender::new(0),
            config: ArcSwap::from_pointee(config),
            registry,
            client,
            node_client,
            shutdown,
            tasks: TaskTracker::new(),
            telemetry,
            reload: Arc::default(),
            cloud_clients: crate::cloud::Clients::default(),
            client_keys: Arc::default(),
            model_ops: Arc::default(),
            recent: Arc::default(),
            accepting: AtomicBool::new(true),
            front: std::sync::OnceLock::new(),
            admin_at: std::sync::OnceLock::new(),
            file: std::sync::OnceLock::new(),
            edits: std::sync::Mutex::new(()),
            seed,
            rng: Mutex::new(rng),
            started_ms: crate::store::now_ms(),
        }
    }

    /// Unix ms when this broker started.
    pub fn started_at_ms(&self) -> i64 {
        self.started_ms
    }

    /// Bytes held for slow readers right now, and the bound.
    pub fn read_ahead_use(&self) -> (usize, usize) {
        (self.read_ahead_total.saturating_sub(self.read_ahead.available_permits()), self.read_ahead_total)
    }

    /// The config in force (a snapshot: it may be replaced at any time).
    pub fn config(&self) -> Arc<Config> {
        self.config.load_full()
    }

    /// Record the proxy URLs as bound, and whether this is a demo (once, at start).
    pub fn set_front(&self, urls: Vec<String>, demo: bool) {
        let _ = self.front.set((urls, demo));
    }

    /// The proxy URLs clients should use, and whether the nodes are simulated.
    pub fn front(&self) -> (&[String], bool) {
        self.front.get().map_or((&[][..], false), |(u, d)| (u.as_slice(), *d))
    }

    /// Record the admin listener's address as bound (once, at start).
    pub fn set_admin_addr(&self, addr: std::net::SocketAddr) {
        let _ = self.admin_at.set(addr);
    }

    /// The admin listener's address as bound; `None` before the listeners are up.
    pub fn admin_addr(&self) -> Option<std::net::SocketAddr> {
        self.admin_at.get().copied()
    }

    /// Taken by an edit while it writes the file and swaps the config in.
    pub fn edit_lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.edits.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The config file runtime edits go to (set once, at start).
    pub fn set_config_file(&self, path: std::path::PathBuf) {
        let _ = self.file.set(path);
    }

    /// The config file runtime edits go to, when the broker has one.
    pub fn config_file(&self) -> Option<&std::path::Path> {
        self.file.get().map(std::path::PathBuf::as_path)
    }

    /// Write `next` into the config file, if there is one, so the edit survives the next
    /// reload and restart. Keys that wait for a restart keep what the file says (an edit the
    /// user made there and that is not applied yet is not undone).
    pub fn persist(&self, next: &Config) -> Result<(), crate::config::EditError> {
        let Some(path) = self.file.get() else { return Ok(()) };
        let mut to_write = next.clone();
        if let Ok(on_disk) = Config::load(path) {
            to_write.listeners = on_disk.listeners;
            to_write.admin = on_disk.admin;
            to_write.store = on_disk.store;
            to_write.proxy.connect_timeout_ms = on_disk.proxy.connect_timeout_ms;
            to_write.proxy.header_read_timeout_ms = on_disk.proxy.header_read_timeout_ms;
            to_write.telemetry = on_disk.telemetry;
        }
        crate::config::write_into(path, &to_write)
    }

    /// Every client key name a listener accepts.
    pub fn client_key_names(&self) -> std::collections::BTreeSet<String> {
        let names = self
            .config()
            .listeners
            .iter()
            .flat_map(|l| l.api_keys.iter().cloned())
            .collect::<std::collections::BTreeSet<_>>();
        names.into_iter().filter(|n| n != crate::config::ANY_FLEET_KEY).collect()
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
        self.telemetry.quotas().set_rules(next.quotas.clone());
        if prev.health != next.health {
            self.health.send_replace(next.health.clone());
        }
        self.config.store(Arc::new(next));
        self.admission.dispatch();
        self.applied.send_modify(|n| *n += 1);
    }

    /// Changes on every `apply()` (whatever made it: an edit, an import, a reload).
    pub fn applied(&self) -> tokio::sync::watch::Receiver<u64> {
        self.applied.subscribe()
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
                        Ok(_) => {
                            tracing::info!(node = %n.name, url = %crate::config::redacted_url(&n.url), "node added")
                        }
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

/// A count of model operations (pull, delete, create, copy, push, blobs) running at once,
/// held below a limit read at each entry, so a reload of `queue.max_model_ops` applies to the
/// next operation without resizing anything.
#[derive(Debug, Default)]
pub struct ModelOps {
    running: AtomicUsize,
    freed: tokio::sync::Notify,
}

/// One running model operation's place; dropping it lets the next one in.
#[derive(Debug)]
pub struct ModelOpSlot(Arc<ModelOps>);

impl ModelOps {
    /// Wait until fewer than `limit` (at least 1) operations run, then count this one.
    pub async fn enter(self: &Arc<Self>, limit: usize) -> ModelOpSlot {
        loop {
            // Registered before the check, so a slot freed between the check and the wait
            // still wakes this caller.
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let n = self.running.load(Ordering::Acquire);
            if n < limit.max(1) {
                if self.running.compare_exchange(n, n + 1, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                    return ModelOpSlot(Arc::clone(self));
                }
                continue;
            }
            freed.await;
        }
    }

    pub fn running(&self) -> usize {
        self.running.load(Ordering::Acquire)
    }
}

impl Drop for ModelOpSlot {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::AcqRel);
        self.0.freed.notify_waiters();
    }
}

/// What asking every node for one metadata path gave: `(node, JSON)` per node that answered.
pub type Gathered = Result<Arc<Vec<(Arc<crate::node::Node>, serde_json::Value)>>, crate::error::BrokerError>;

/// Metadata answers of the last moment, one per path, fetched once for every caller that asks
/// while a fetch runs or within `ttl` of its end (single flight): a burst of clients asking
/// `/api/tags` costs each node one request, not one per client. Errors are kept as long, so a
/// dead cluster is not asked again by every waiter in turn.
#[derive(Debug, Default)]
pub struct Recent {
    slots: Mutex<HashMap<String, Arc<Flight>>>,
}

/// One fetch of one path: empty while it runs, then when it ended and what it gave.
type Flight = tokio::sync::OnceCell<(tokio::time::Instant, Gathered)>;

impl Recent {
    pub async fn get(&self, path: &str, ttl: Duration, fetch: impl std::future::Future<Output = Gathered>) -> Gathered {
        let cell = {
            let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            let fresh = |c: &Flight| c.get().is_none_or(|(done, _)| done.elapsed() < ttl);
            match slots.get(path) {
                Some(c) if fresh(c) => Arc::clone(c),
                _ => {
                    let c = Arc::new(tokio::sync::OnceCell::new());
                    slots.insert(path.to_string(), Arc::clone(&c));
                    c
                }
            }
        };
        let (_, got) = cell
            .get_or_init(|| async {
                let got = fetch.await;
                (tokio::time::Instant::now(), got)
            })
            .await
            .clone();
        got
    }

    /// Forget every answer (a model operation changed what nodes hold).
    pub fn clear(&self) {
        self.slots.lock().unwrap_or_else(|p| p.into_inner()).clear();
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
