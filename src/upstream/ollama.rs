//! Probes in Ollama's own dialect (ollama/ollama `server/routes.go`): liveness is
//! `GET /api/version`, readiness a 1-token `/api/generate`, warm-up a generate with only
//! `model` and `keep_alive` (Ollama loads the model and answers at once), inventory
//! `/api/tags` (what it has) plus `/api/ps` (what is loaded, how much in VRAM, with what
//! context length).

use std::time::Duration;

use serde::Deserialize;

use super::probe::{self, ProbeError};
use super::{Inventory, Upstream};
use crate::node::LoadedModel;

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

pub(super) async fn liveness(up: &Upstream<'_>, client: &reqwest::Client, timeout: Duration) -> Result<(), ProbeError> {
    probe::exchange(client.get(up.url("/api/version")), timeout).await
}

pub(super) async fn readiness(
    up: &Upstream<'_>,
    client: &reqwest::Client,
    model: &str,
    timeout: Duration,
) -> Result<(), ProbeError> {
    let body = serde_json::json!({"model": model, "prompt": "ping", "stream": false, "options": {"num_predict": 1}});
    probe::exchange(client.post(up.url("/api/generate")).json(&body), timeout).await
}

/// Time to first token: a streamed one-token generate (`num_predict` 1), timed to its first
/// line with text (`response` or `thinking`), or to its `done` line when the token was empty.
pub(super) async fn first_token(
    up: &Upstream<'_>,
    client: &reqwest::Client,
    model: &str,
    timeout: Duration,
) -> Result<probe::FirstToken, ProbeError> {
    let body = serde_json::json!({"model": model, "prompt": "ping", "stream": true, "options": {"num_predict": 1}});
    probe::first_token(client.post(up.url("/api/generate")).json(&body), timeout, is_content).await
}

fn is_content(line: &[u8]) -> bool {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(line) else { return false };
    let said = |k: &str| v.get(k).and_then(serde_json::Value::as_str).is_some_and(|t| !t.is_empty());
    said("response") || said("thinking") || v.get("done").and_then(serde_json::Value::as_bool) == Some(true)
}

pub(super) async fn warm_up(up: &Upstream<'_>, client: &reqwest::Client, model: &str, timeout: Duration) -> bool {
    let body = serde_json::json!({"model": model, "keep_alive": "5m"});
    matches!(
        tokio::time::timeout(timeout, client.post(up.url("/api/generate")).json(&body).send()).await,
        Ok(Ok(r)) if r.status().is_success()
    )
}

async fn fetch(up: &Upstream<'_>, client: &reqwest::Client, path: &str, timeout: Duration) -> Option<bytes::Bytes> {
    let resp = tokio::time::timeout(timeout, client.get(up.url(path)).send()).await.ok()?.ok()?;
    if !resp.status().is_success() {
        return None;
    }
    tokio::time::timeout(timeout, super::read_capped(resp, super::MAX_LIST_BYTES)).await.ok()?
}

pub(super) async fn inventory(up: &Upstream<'_>, client: &reqwest::Client, timeout: Duration) -> Inventory {
    let (tags, ps) = tokio::join!(fetch(up, client, "/api/tags", timeout), fetch(up, client, "/api/ps", timeout));
    let models = tags.and_then(|b| serde_json::from_slice::<TagsResponse>(&b).ok()).map(|t| {
        t.models
            .into_iter()
            .map(|m| if m.model.is_empty() { m.name } else { m.model })
            .filter(|n| !n.is_empty())
            .take(super::MAX_MODELS)
            .collect()
    });
    let loaded = ps.and_then(|b| serde_json::from_slice::<PsResponse>(&b).ok()).map(|ps| {
        ps.models
            .into_iter()
            .take(super::MAX_MODELS)
            .map(|m| LoadedModel {
                name: m.name,
                size: m.size,
                size_vram: m.size_vram,
                context_length: m.context_length,
            })
            .collect()
    });
    Inventory { models, loaded }
}
