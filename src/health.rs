//! Probes: every node is watched by one background task, off the request path.
//!
//! - Liveness: `GET /api/version` every `health.interval_ms` with a short timeout, fed through
//!   the node's hysteresis (`failures_to_down`, `successes_to_up`).
//! - Readiness (optional, `health.readiness_model`): a 1-token generate. Off by default: an
//!   inference probe loads the model and resets its keep-alive, pinning VRAM.
//! - Deep: `GET /api/tags` and `GET /api/ps` every `health.deep_interval_ms`, and right after a
//!   node (re)appears: which models it has, which are loaded, how much of each is in VRAM, and
//!   with what context length.
//! - Warm-up: a node that joins or comes back first preloads `health.warm_models` (a generate
//!   with only `model` and `keep_alive`), then takes traffic.
//!
//! The task probes whatever the registry holds at each tick, so nodes added or removed at
//! runtime are picked up without restarting anything. It stops when `cancel` fires.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::config::{HealthConfig, NodeKind};
use crate::node::{Health, LoadedModel, Node, Registry};

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
    #[serde(default)]
    context_length: Option<u64>,
}

fn url(node: &Node, path: &str) -> String {
    format!("{}{}", node.base_url.as_str().trim_end_matches('/'), path)
}

/// One liveness probe: did the node answer `/api/version` with a 2xx in time?
/// OpenAI-compatible nodes: `/health` (llama.cpp, vLLM), or `/v1/models` where there is none.
pub async fn probe_liveness(client: &reqwest::Client, node: &Node, timeout: Duration) -> bool {
    let get = |target: String| async move {
        match tokio::time::timeout(timeout, client.get(target).send()).await {
            Ok(Ok(r)) => Some(r.status()),
            _ => None,
        }
    };
    if node.config.kind == NodeKind::Openai {
        return match get(url(node, "/health")).await {
            Some(s) if s == reqwest::StatusCode::NOT_FOUND => {
                get(crate::cloud::openai_url(&node.base_url, "/models").to_string())
                    .await
                    .is_some_and(|s| s.is_success())
            }
            Some(s) => s.is_success(),
            None => false,
        };
    }
    get(url(node, "/api/version")).await.is_some_and(|s| s.is_success())
}

/// One readiness probe: can the node generate one token of `model`?
pub async fn probe_readiness(client: &reqwest::Client, node: &Node, model: &str, timeout: Duration) -> bool {
    let (target, body) = if node.config.kind == NodeKind::Openai {
        let m = model.strip_suffix(":latest").unwrap_or(model);
        let body = serde_json::json!({"model": m, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1});
        (crate::cloud::openai_url(&node.base_url, "/chat/completions").to_string(), body)
    } else {
        let body =
            serde_json::json!({"model": model, "prompt": "ping", "stream": false, "options": {"num_predict": 1}});
        (url(node, "/api/generate"), body)
    };
    matches!(
        tokio::time::timeout(timeout, client.post(target).json(&body).send()).await,
        Ok(Ok(r)) if r.status().is_success()
    )
}

/// Preload `models` the node has (Ollama loads a model on a generate with no prompt).
pub async fn warm_up(client: &reqwest::Client, node: &Node, models: &[String], timeout: Duration) {
    if node.config.kind == NodeKind::Openai {
        // OpenAI-compatible servers load their model at start; there is no preload request.
        return;
    }
    for m in models {
        if node.serves(m) == Some(false) {
            continue;
        }
        let body = serde_json::json!({"model": m, "keep_alive": "5m"});
        let ok = matches!(
            tokio::time::timeout(timeout, client.post(url(node, "/api/generate")).json(&body).send()).await,
            Ok(Ok(r)) if r.status().is_success()
        );
        tracing::info!(node = %node.name(), model = %m, ok, "warm-up");
    }
}

/// One deep probe: refresh the node's model list and loaded models. Returns whether it answered.
pub async fn probe_deep(client: &reqwest::Client, node: &Node, timeout: Duration) -> bool {
    let fetch = |path: &'static str| {
        let target = url(node, path);
        async move {
            let resp = tokio::time::timeout(timeout, client.get(target).send()).await.ok()?.ok()?;
            if !resp.status().is_success() {
                return None;
            }
            tokio::time::timeout(timeout, resp.bytes()).await.ok()?.ok()
        }
    };
    if node.config.kind == NodeKind::Openai {
        let target = crate::cloud::openai_url(&node.base_url, "/models").to_string();
        let list = async {
            let resp = tokio::time::timeout(timeout, client.get(target).send()).await.ok()?.ok()?;
            if !resp.status().is_success() {
                return None;
            }
            tokio::time::timeout(timeout, resp.json::<serde_json::Value>()).await.ok()?.ok()
        };
        let Some(v) = list.await else { return false };
        let tags = crate::proxy::openai_models_as_tags(&v);
        let names = tags["models"]
            .as_array()
            .map(|a| a.iter().filter_map(|m| m["name"].as_str()).map(str::to_string).collect::<Vec<_>>());
        node.set_models(names.unwrap_or_default());
        return true;
    }
    let (tags, ps) = tokio::join!(fetch("/api/tags"), fetch("/api/ps"));
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
            ps.models
                .into_iter()
                .map(|m| LoadedModel {
                    name: m.name,
                    size: m.size,
                    size_vram: m.size_vram,
                    context_length: m.context_length,
                })
                .collect(),
        );
    }
    answered
}

/// Probe one node once: liveness (+ readiness), and on (re)appearance the deep probe and warm-up.
async fn check(client: &reqwest::Client, node: Arc<Node>, cfg: &HealthConfig) {
    let timeout = Duration::from_millis(cfg.timeout_ms);
    let mut ok = probe_liveness(client, &node, timeout).await;
    if ok {
        if let Some(m) = &cfg.readiness_model {
            if node.serves(m) != Some(false) {
                ok = probe_readiness(client, &node, m, timeout.max(Duration::from_secs(30))).await;
            }
        }
    }
    let returning = ok && node.health() != Health::Healthy;
    if returning {
        // Learn its models and warm them before it takes traffic again.
        probe_deep(client, &node, timeout).await;
        if !cfg.warm_models.is_empty() {
            warm_up(client, &node, &cfg.warm_models, Duration::from_secs(120)).await;
        }
    }
    node.record_probe(ok, cfg.failures_to_down, cfg.successes_to_up);
}

/// Run the probes of every node in `registry` until `cancel` fires.
pub async fn run(registry: Arc<Registry>, client: reqwest::Client, cfg: HealthConfig, cancel: CancellationToken) {
    let timeout = Duration::from_millis(cfg.timeout_ms);
    let mut live = tokio::time::interval(Duration::from_millis(cfg.interval_ms));
    live.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut deep = tokio::time::interval(Duration::from_millis(cfg.deep_interval_ms));
    deep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = live.tick() => {
                let nodes = registry.all();
                futures_util::future::join_all(nodes.iter().map(|n| check(&client, Arc::clone(n), &cfg))).await;
            }
            _ = deep.tick() => {
                let nodes = registry.all();
                let up = nodes.iter().filter(|n| n.health() != Health::Unhealthy);
                futures_util::future::join_all(up.map(|n| probe_deep(&client, n, timeout))).await;
            }
        }
    }
    tracing::debug!("probes stopped");
}
