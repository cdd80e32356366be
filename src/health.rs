//! Probes: each node is watched by background tasks, off the request path.
//!
//! - Liveness: `GET /api/version` every `health.interval_ms` with a short timeout, fed through
//!   the node's hysteresis (`failures_to_down`, `successes_to_up`).
//! - Deep: `GET /api/tags` and `GET /api/ps` every `health.deep_interval_ms`, and right after a
//!   node (re)appears: which models it has, and which are loaded (and how much is in VRAM).
//!
//! Probes never run an inference: that would load a model and pin VRAM. Tasks stop when the
//! broker's cancellation token fires.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::config::HealthConfig;
use crate::node::{Health, LoadedModel, Node};

#[derive(Deserialize)]
struct TagsResponse {
    #[serde(default)]
    models: Vec<TagEntry>,
}

#[derive(Deserialize)]
struct TagEntry {
    #[serde(default)]
    name: String,
    #[serde(default)]
    model: String,
}

#[derive(Deserialize)]
struct PsResponse {
    #[serde(default)]
    models: Vec<PsEntry>,
}

#[derive(Deserialize)]
struct PsEntry {
    #[serde(default)]
    name: String,
    #[serde(default)]
    size: u64,
    #[serde(default)]
    size_vram: u64,
}

/// One liveness probe: did the node answer `/api/version` with a 2xx in time?
pub async fn probe_liveness(client: &reqwest::Client, node: &Node, timeout: Duration) -> bool {
    let Ok(url) = node.base_url.join("api/version") else {
        return false;
    };
    matches!(
        tokio::time::timeout(timeout, client.get(url).send()).await,
        Ok(Ok(r)) if r.status().is_success()
    )
}

/// One deep probe: refresh the node's model list and loaded models. Returns whether it answered.
pub async fn probe_deep(client: &reqwest::Client, node: &Node, timeout: Duration) -> bool {
    let fetch = |path: &'static str| {
        let url = node.base_url.join(path);
        async move {
            let url = url.ok()?;
            let resp = tokio::time::timeout(timeout, client.get(url).send()).await.ok()?.ok()?;
            if !resp.status().is_success() {
                return None;
            }
            tokio::time::timeout(timeout, resp.bytes()).await.ok()?.ok()
        }
    };
    let (tags, ps) = tokio::join!(fetch("api/tags"), fetch("api/ps"));
    let mut answered = false;
    if let Some(tags) = tags.and_then(|b| serde_json::from_slice::<TagsResponse>(&b).ok()) {
        node.set_models(
            tags.models
                .into_iter()
                .map(|m| if m.model.is_empty() { m.name } else { m.model })
                .filter(|n| !n.is_empty()),
        );
        answered = true;
    } else {
        tracing::debug!(node = %node.name(), "deep probe: /api/tags gave no usable answer");
    }
    if let Some(ps) = ps.and_then(|b| serde_json::from_slice::<PsResponse>(&b).ok()) {
        node.set_loaded(
            ps.models.into_iter().map(|m| LoadedModel { name: m.name, size: m.size, size_vram: m.size_vram }).collect(),
        );
    }
    answered
}

/// Run the probes of one node until `cancel` fires.
pub async fn watch(node: Arc<Node>, client: reqwest::Client, cfg: HealthConfig, cancel: CancellationToken) {
    let timeout = Duration::from_millis(cfg.timeout_ms);
    let mut live = tokio::time::interval(Duration::from_millis(cfg.interval_ms));
    live.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut deep = tokio::time::interval(Duration::from_millis(cfg.deep_interval_ms));
    deep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = live.tick() => {
                let before = node.health();
                let ok = probe_liveness(&client, &node, timeout).await;
                node.record_probe(ok, cfg.failures_to_down, cfg.successes_to_up);
                if before != Health::Healthy && node.health() == Health::Healthy {
                    // Back (or new): learn its models before the next deep tick.
                    probe_deep(&client, &node, timeout).await;
                }
            }
            _ = deep.tick() => {
                if node.health() != Health::Unhealthy {
                    probe_deep(&client, &node, timeout).await;
                }
            }
        }
    }
    tracing::debug!(node = %node.name(), "probes stopped");
}
