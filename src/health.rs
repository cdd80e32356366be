//! Probes: every node is watched by one background task, off the request path. This module
//! owns the schedule and the hysteresis only; how to ask a node in its dialect is `upstream`'s,
//! and what was learned is written to the node.
//!
//! - Liveness every `health.interval_ms` with a short timeout, fed through the node's
//!   hysteresis (`failures_to_down`, `successes_to_up`).
//! - Readiness (optional, `health.readiness_model`): a 1-token generate. Off by default: an
//!   inference probe loads the model and resets its keep-alive, pinning VRAM.
//! - Deep (inventory) every `health.deep_interval_ms`, and right after a node (re)appears:
//!   which models it has, which are loaded, how much of each is in VRAM, and with what context
//!   length.
//! - Warm-up: a node that joins or comes back first preloads `health.warm_models`, then takes
//!   traffic.
//!
//! The task probes whatever the registry holds at each tick, so nodes added or removed at
//! runtime are picked up without restarting anything, and it follows the `[health]` section
//! through a `watch`: a reload that changes an interval re-arms the timers at once. It stops
//! when `cancel` fires.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::{redacted_url, HealthConfig};
use crate::node::{Health, Node, Registry};
use crate::upstream::Upstream;

/// One liveness probe: did the node answer its liveness endpoint with a 2xx in time?
pub async fn probe_liveness(client: &reqwest::Client, node: &Node, timeout: Duration) -> bool {
    check_liveness(client, node, timeout).await.is_ok()
}

/// One liveness probe, and when it fails the reason as node state shows it:
/// "connection refused at http://10.0.0.6:11434", "timed out after 300 ms at ...",
/// "HTTP 500 at ...: <what the body said>" (the URL redacted of credentials).
pub async fn check_liveness(client: &reqwest::Client, node: &Node, timeout: Duration) -> Result<(), String> {
    Upstream::node(node).liveness(client, timeout).await.map_err(|e| e.at(&redacted_url(&node.config.url)))
}

/// Liveness, then (when configured and the node has the model) readiness: the probe whose
/// result feeds the hysteresis, with its reason.
async fn probe_once(client: &reqwest::Client, node: &Node, cfg: &HealthConfig) -> Result<(), String> {
    let timeout = Duration::from_millis(cfg.timeout_ms);
    check_liveness(client, node, timeout).await?;
    match &cfg.readiness_model {
        Some(m) if node.serves(m) != Some(false) => {
            let within = timeout.max(Duration::from_secs(30));
            Upstream::node(node)
                .readiness(client, m, within)
                .await
                .map_err(|e| format!("readiness probe ({m}): {}", e.at(&redacted_url(&node.config.url))))
        }
        _ => Ok(()),
    }
}

/// One deep probe: refresh the node's model list and loaded models. Returns whether it answered.
pub async fn probe_deep(client: &reqwest::Client, node: &Node, timeout: Duration) -> bool {
    let inventory = Upstream::node(node).inventory(client, timeout).await;
    let answered = inventory.models.is_some();
    match inventory.models {
        Some(models) => node.set_models(models),
        None => tracing::debug!(node = %node.name(), "deep probe: no usable model list"),
    }
    if let Some(loaded) = inventory.loaded {
        node.set_loaded(loaded);
    }
    answered
}

/// Preload `models` the node has.
async fn warm_up(client: &reqwest::Client, node: &Node, models: &[String], timeout: Duration) {
    let up = Upstream::node(node);
    for m in models {
        if node.serves(m) == Some(false) {
            continue;
        }
        match up.warm_up(client, m, timeout).await {
            Some(ok) => tracing::info!(node = %node.name(), model = %m, ok, "warm-up"),
            // This dialect has no preload: nothing more to try for this node.
            None => return,
        }
    }
}

/// Probe one node once: liveness (+ readiness), and on (re)appearance the deep probe and warm-up.
async fn check(client: &reqwest::Client, node: Arc<Node>, cfg: &HealthConfig) {
    let timeout = Duration::from_millis(cfg.timeout_ms);
    let result = probe_once(client, &node, cfg).await;
    let returning = result.is_ok() && node.health() != Health::Healthy;
    if returning {
        // Learn its models and warm them before it takes traffic again.
        probe_deep(client, &node, timeout).await;
        if !cfg.warm_models.is_empty() {
            warm_up(client, &node, &cfg.warm_models, Duration::from_secs(120)).await;
        }
    }
    node.record_probe_result(
        result.as_ref().map(|_| ()).map_err(String::as_str),
        cfg.failures_to_down,
        cfg.successes_to_up,
    );
}

/// Probe every node once now, as the schedule would: for tests and tools that drive probes
/// explicitly instead of waiting for the timer.
pub async fn probe_all(registry: &Registry, client: &reqwest::Client, cfg: &HealthConfig) {
    let nodes = registry.all();
    futures_util::future::join_all(nodes.iter().map(|n| check(client, Arc::clone(n), cfg))).await;
}

fn every(ms: u64) -> tokio::time::Interval {
    let mut i = tokio::time::interval(Duration::from_millis(ms.max(1)));
    i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    i
}

/// Run the probes of every node in `registry` until `cancel` fires, on the schedule `cfg`
/// holds at each moment.
pub async fn run(
    registry: Arc<Registry>,
    client: reqwest::Client,
    mut cfg: watch::Receiver<HealthConfig>,
    cancel: CancellationToken,
) {
    let mut current = cfg.borrow_and_update().clone();
    let mut live = every(current.interval_ms);
    let mut deep = every(current.deep_interval_ms);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            changed = cfg.changed() => {
                if changed.is_err() {
                    break;
                }
                let next = cfg.borrow_and_update().clone();
                if next.interval_ms != current.interval_ms {
                    live = every(next.interval_ms);
                }
                if next.deep_interval_ms != current.deep_interval_ms {
                    deep = every(next.deep_interval_ms);
                }
                tracing::info!(interval_ms = next.interval_ms, deep_interval_ms = next.deep_interval_ms, "probe schedule changed");
                current = next;
            }
            _ = live.tick() => probe_all(&registry, &client, &current).await,
            _ = deep.tick() => {
                let timeout = Duration::from_millis(current.timeout_ms);
                let nodes = registry.all();
                let up = nodes.iter().filter(|n| n.health() != Health::Unhealthy);
                futures_util::future::join_all(up.map(|n| probe_deep(&client, n, timeout))).await;
            }
        }
    }
    tracing::debug!("probes stopped");
}
