//! Endpoints answered from every serving node at once and merged: `/api/tags` and `/v1/models`
//! (the union of models, so a client sees one big Ollama), `/api/ps` (the union, each entry
//! annotated with the `node` it is loaded on). Nodes are asked concurrently with the probe
//! timeout; a node that does not answer is left out, not waited for.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::Shared;
use crate::error::BrokerError;
use crate::node::Node;

/// GET `path` from every available node; `(node, JSON)` for those that answered.
async fn gather(shared: &Shared, path: &str) -> Result<Vec<(Arc<Node>, Value)>, BrokerError> {
    let nodes: Vec<Arc<Node>> = shared.registry.all().iter().filter(|n| n.is_available()).cloned().collect();
    if nodes.is_empty() {
        return Err(BrokerError::NoHealthyNode { model: String::new() });
    }
    let timeout = Duration::from_millis(shared.config.health.timeout_ms.max(shared.config.proxy.connect_timeout_ms))
        .max(Duration::from_secs(2));
    let asks = nodes.iter().map(|node| {
        let url = format!("{}{}", node.base_url.as_str().trim_end_matches('/'), path);
        let client = shared.client.clone();
        let node = Arc::clone(node);
        async move {
            let ask = async {
                let resp = client.get(url).send().await.ok()?;
                if !resp.status().is_success() {
                    return None;
                }
                resp.json::<Value>().await.ok()
            };
            match tokio::time::timeout(timeout, ask).await {
                Ok(Some(v)) => Some((node, v)),
                _ => {
                    tracing::debug!(node = %node.name(), path, "node left out of a merged answer");
                    None
                }
            }
        }
    });
    let answers: Vec<_> = futures_util::future::join_all(asks).await.into_iter().flatten().collect();
    if answers.is_empty() {
        return Err(BrokerError::NoNodeReachable { detail: format!("no node answered {path}") });
    }
    Ok(answers)
}

fn entries(v: &Value, key: &str) -> Vec<Value> {
    v.get(key).and_then(Value::as_array).cloned().unwrap_or_default()
}

fn name_of(entry: &Value) -> String {
    entry.get("model").or_else(|| entry.get("name")).and_then(Value::as_str).unwrap_or_default().to_string()
}

pub(super) async fn tags(shared: &Shared) -> Result<Response, BrokerError> {
    let mut union: BTreeMap<String, Value> = BTreeMap::new();
    for (node, v) in gather(shared, "/api/tags").await? {
        let models = entries(&v, "models");
        // A fresh answer is as good as a deep probe: keep the routing table current.
        node.set_models(models.iter().map(name_of).filter(|n| !n.is_empty()));
        for m in models {
            union.entry(name_of(&m)).or_insert(m);
        }
    }
    Ok(axum::Json(json!({ "models": union.into_values().collect::<Vec<_>>() })).into_response())
}

pub(super) async fn ps(shared: &Shared) -> Result<Response, BrokerError> {
    let mut all = Vec::new();
    for (node, v) in gather(shared, "/api/ps").await? {
        for mut m in entries(&v, "models") {
            if let Some(obj) = m.as_object_mut() {
                obj.insert("node".into(), Value::String(node.name().to_string()));
            }
            all.push(m);
        }
    }
    Ok(axum::Json(json!({ "models": all })).into_response())
}

pub(super) async fn v1_models(shared: &Shared) -> Result<Response, BrokerError> {
    let mut union: BTreeMap<String, Value> = BTreeMap::new();
    for (_, v) in gather(shared, "/v1/models").await? {
        for m in entries(&v, "data") {
            let id = m.get("id").and_then(Value::as_str).unwrap_or_default().to_string();
            union.entry(id).or_insert(m);
        }
    }
    Ok(axum::Json(json!({ "object": "list", "data": union.into_values().collect::<Vec<_>>() })).into_response())
}
