//! `/admin/models`: the models on the nodes, and the operations on them.
//!
//! `GET /admin/models` is the node x model matrix: each reachable node is asked for its
//! `/api/tags` (size, digest, details) and `/api/ps` (what is loaded) at once, within the probe
//! timeout; a node that is down or does not answer shows what it last listed, marked `stale`,
//! never as live. Per model: its size, family, parameter size, quantisation, the digest most
//! nodes hold, and `digests_differ` when two nodes hold different builds under one name.
//!
//! Pull, delete and copy are the proxy's fan-out of Ollama's `/api/pull`, `/api/delete` and
//! `/api/copy`, recorded like a client's model operation (from the admin origin). A pull
//! streams each node's progress lines as Ollama sends them (`status`, `digest`, `total`,
//! `completed`), tagged with `node`; a client that goes away cancels it: the fan-out drops the
//! upstream request, and Ollama stops a pull whose request is gone (the part downloaded stays
//! for the next pull to resume). Delete and copy run on each named node as its own operation,
//! so every node's result (and error) is named. An unknown node name is refused before
//! anything starts (404 `not_found`, or 400 `unknown_node` for a pull, naming the nodes there
//! are).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::{Method, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{parse, AdminError, AdminState};
use crate::config::model_key;
use crate::node::{Health, Node};
use crate::proxy::{model_operation, pull};
use crate::upstream::Upstream;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct PullRequest {
    name: String,
    #[serde(default)]
    nodes: Vec<String>,
}

/// Pull a model onto the named nodes (all serving nodes when none are named), streaming each
/// node's progress as NDJSON lines (`{"node": ..., "status": ..., "completed": ..., "total": ...}`).
pub(super) async fn pull_model(State(s): State<AdminState>, body: axum::body::Bytes) -> Result<Response, AdminError> {
    let req: PullRequest = parse(&body)?;
    Ok(pull(&s.shared, &req.name, &req.nodes).await.into_response())
}

/// What one node said for the matrix: its `/api/tags` and `/api/ps` entries, or nothing.
struct Listing {
    node: Arc<Node>,
    tags: Option<Vec<Value>>,
    loaded: Vec<String>,
}

fn entries(v: Option<Value>) -> Option<Vec<Value>> {
    v?.get("models").and_then(Value::as_array).cloned()
}

fn name_of(entry: &Value) -> String {
    let name = entry.get("model").or_else(|| entry.get("name")).and_then(Value::as_str).unwrap_or_default();
    model_key(name).into_owned()
}

/// Whether a node is worth asking now: not known to be down.
fn reachable(n: &Node) -> bool {
    n.health() != Health::Unhealthy
}

async fn listing(s: &AdminState, node: Arc<Node>, timeout: Duration) -> Listing {
    if !reachable(&node) {
        return Listing { node, tags: None, loaded: Vec::new() };
    }
    let up = Upstream::node(&node);
    let client = &s.shared.client;
    let (tags, ps) = tokio::join!(up.metadata(client, "/api/tags", timeout), up.metadata(client, "/api/ps", timeout));
    let loaded = entries(ps).unwrap_or_default().iter().map(name_of).collect();
    Listing { tags: entries(tags), node, loaded }
}

/// `GET /admin/models`: the node x model matrix (see the module's words).
pub(super) async fn matrix(State(s): State<AdminState>) -> Json<Value> {
    let config = s.shared.config();
    let timeout = Duration::from_millis(config.health.timeout_ms.max(config.proxy.connect_timeout_ms))
        .max(Duration::from_secs(2));
    let nodes = s.shared.registry.all();
    let listings = futures_util::future::join_all(nodes.iter().map(|n| listing(&s, Arc::clone(n), timeout))).await;
    let mut models: BTreeMap<String, Value> = BTreeMap::new();
    let mut node_rows = Vec::new();
    for l in &listings {
        let name = l.node.name();
        node_rows.push(json!({
            "name": name,
            "state": l.node.state(),
            "state_reason": l.node.since().reason,
            "reachable": reachable(&l.node),
            "answered": l.tags.is_some(),
            "stale": l.tags.is_none(),
        }));
        match &l.tags {
            Some(tags) => {
                for t in tags {
                    let key = name_of(t);
                    let cell = json!({
                        "loaded": l.loaded.contains(&key),
                        "digest": t.get("digest"),
                        "size": t.get("size"),
                        "modified_at": t.get("modified_at"),
                        "stale": false,
                    });
                    add_cell(&mut models, &key, name, cell, Some(t));
                }
            }
            None => {
                // Last known: names only, never shown as loaded.
                for key in l.node.models().unwrap_or_default() {
                    add_cell(&mut models, &key, name, json!({ "loaded": false, "stale": true }), None);
                }
            }
        }
    }
    let rows: Vec<Value> = models.into_values().map(judge_digests).collect();
    Json(json!({ "nodes": node_rows, "models": rows }))
}

/// Put a node's cell into the model's row, taking the model's facts from the first node that
/// listed them.
fn add_cell(models: &mut BTreeMap<String, Value>, key: &str, node: &str, cell: Value, tag: Option<&Value>) {
    let row = models.entry(key.to_string()).or_insert_with(|| json!({ "name": key, "cells": {} }));
    if let (Some(t), true) = (tag, row.get("size").is_none()) {
        let d = &t["details"];
        row["size"] = t["size"].clone();
        row["family"] = d["family"].clone();
        row["parameter_size"] = d["parameter_size"].clone();
        row["quantization_level"] = d["quantization_level"].clone();
        row["format"] = d["format"].clone();
    }
    row["cells"][node] = cell;
}

/// The digest most nodes hold (`digest`) and whether any node holds another (`digests_differ`).
fn judge_digests(mut row: Value) -> Value {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    if let Some(cells) = row["cells"].as_object() {
        for cell in cells.values() {
            if let Some(d) = cell["digest"].as_str().filter(|d| !d.is_empty()) {
                *counts.entry(d.to_string()).or_default() += 1;
            }
        }
    }
    let common = counts.iter().max_by_key(|(_, n)| **n).map(|(d, _)| d.clone());
    row["digest"] = json!(common);
    row["digests_differ"] = json!(counts.len() > 1);
    row
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct DeleteRequest {
    name: String,
    /// Nodes to delete it from; none: every node that lists it.
    #[serde(default)]
    nodes: Vec<String>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CopyRequest {
    source: String,
    destination: String,
    /// Nodes to copy on; none: every node that lists the source.
    #[serde(default)]
    nodes: Vec<String>,
}

/// `POST /admin/models/delete`: Ollama's `/api/delete` on each node.
pub(super) async fn delete(State(s): State<AdminState>, body: axum::body::Bytes) -> Result<Response, AdminError> {
    let req: DeleteRequest = parse(&body)?;
    let nodes = chosen(&s, &req.nodes, &req.name)?;
    let body = json!({ "model": req.name });
    Ok(on_each(&s, &Method::DELETE, "/api/delete", body, &req.name, nodes, "delete").await)
}

/// `POST /admin/models/copy`: Ollama's `/api/copy` (source -> destination) on each node.
pub(super) async fn copy(State(s): State<AdminState>, body: axum::body::Bytes) -> Result<Response, AdminError> {
    let req: CopyRequest = parse(&body)?;
    let nodes = chosen(&s, &req.nodes, &req.source)?;
    let body = json!({ "source": req.source, "destination": req.destination });
    Ok(on_each(&s, &Method::POST, "/api/copy", body, &req.source, nodes, "copy").await)
}

/// The named nodes (each must exist), else every node that lists `model`.
fn chosen(s: &AdminState, names: &[String], model: &str) -> Result<Vec<String>, AdminError> {
    let all = s.shared.registry.all();
    if names.is_empty() {
        let having: Vec<String> =
            all.iter().filter(|n| n.serves(model) == Some(true)).map(|n| n.name().to_string()).collect();
        if having.is_empty() {
            return Err(AdminError::NotFound { kind: "model", name: model.to_string() });
        }
        return Ok(having);
    }
    for name in names {
        if !all.iter().any(|n| n.name() == name) {
            return Err(AdminError::NotFound { kind: "node", name: name.clone() });
        }
    }
    Ok(names.to_vec())
}

/// Run one model operation per node, at once, and answer every node's result: 200 when all
/// succeeded, else the status they share (404 when the model was on none of them) or 502, with
/// `error` naming each node that failed and why.
async fn on_each(
    s: &AdminState,
    method: &Method,
    path: &str,
    body: Value,
    model: &str,
    nodes: Vec<String>,
    op: &str,
) -> Response {
    let runs = nodes.iter().map(|node| {
        let body = body.clone();
        async move {
            let r = model_operation(&s.shared, method, path, body, model, std::slice::from_ref(node)).await;
            let status = r.status();
            let bytes = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap_or_default();
            let said: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            // The fan-out's words for one node already name it ("node n1 is down: ..."); the
            // node's own error ("model 'x' not found") does not.
            let error = said["error"].as_str().map(str::to_string);
            json!({
                "node": node,
                "ok": status.is_success() && error.is_none(),
                "http_status": status.as_u16(),
                "error": error,
                "code": said.get("code"),
            })
        }
    });
    let results: Vec<Value> = futures_util::future::join_all(runs).await;
    let failed: Vec<&Value> = results.iter().filter(|r| r["ok"] != true).collect();
    if failed.is_empty() {
        return Json(json!({ "status": "success", "results": results })).into_response();
    }
    let said: Vec<String> = failed
        .iter()
        .map(|r| {
            let (node, e) = (r["node"].as_str().unwrap_or_default(), r["error"].as_str().unwrap_or("failed"));
            if e.contains(node) {
                e.to_string()
            } else {
                format!("{node}: {e}")
            }
        })
        .collect();
    let statuses: std::collections::BTreeSet<u64> = failed.iter().filter_map(|r| r["http_status"].as_u64()).collect();
    let status = match statuses.iter().next() {
        Some(&only) if statuses.len() == 1 && failed.len() == results.len() && (400..500).contains(&only) => {
            StatusCode::from_u16(only as u16).unwrap_or(StatusCode::BAD_GATEWAY)
        }
        _ => StatusCode::BAD_GATEWAY,
    };
    let code = failed.iter().find_map(|r| r["code"].as_str().map(str::to_string)).unwrap_or_else(|| {
        if status == StatusCode::NOT_FOUND { "model_not_found" } else { "upstream_failed" }.to_string()
    });
    let error = format!("{op} failed on {} of {} nodes: {}", failed.len(), results.len(), said.join("; "));
    (status, Json(json!({ "error": error, "code": code, "results": results }))).into_response()
}
