//! `/admin/nodes`: the cluster's nodes, live. Reads show each node's static facts beside its
//! live state (health, breaker, in-flight, latency estimate, models). Edits change the config
//! (draft -> validate -> swap); draining is the one runtime-only action, kept out of the
//! config, and it ends only when the operator says so. A removed node's in-flight requests
//! finish on their own handle.

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::StatusCode;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{edit, parse, AdminError, AdminState};
use crate::config::NodeConfig;
use crate::node::{Admin, Health, Node};

/// One node as every admin read shows it (also the `nodes` of `/admin/status`).
///
/// `state_reason` / `state_since` (unix ms) / `state_for_ms` say why and since when. What the
/// node reported (`loaded`, `ttfb_ms`) comes with when it was learned (`loaded_as_of`,
/// `ttfb_as_of`, unix ms); `stale` is true while the node is down, and then `models`, `loaded`
/// and `ttfb_ms` are last-known, not live. `ttfb_ms` is the estimate as of its last sample: it
/// does not fade while no traffic flows (routing's decayed estimate is not shown).
pub(super) fn node_json(n: &Node) -> Value {
    let now = tokio::time::Instant::now();
    let now_ms = crate::store::now_ms();
    let since = n.since();
    let ttfb = n.ttfb_seen();
    json!({
        "name": n.name(),
        "url": crate::config::redacted_url(&n.config.url),
        "kind": n.config.kind,
        "state": n.state(),
        "state_reason": since.reason,
        "state_since": since.at_ms,
        "state_for_ms": (now_ms - since.at_ms).max(0),
        "health": n.health(),
        "admin": n.admin(),
        "breaker": n.breaker_state(),
        "weight": n.weight(),
        "max_concurrency": n.max_concurrency(),
        // In a fleet: this broker's share of the node's slots (null on its own).
        "fleet_share": n.fleet_share(),
        "in_flight": n.in_flight(),
        "served": n.served(),
        "stale": n.health() == Health::Unhealthy,
        "ttfb_ms": ttfb.map(|(d, _)| d.as_secs_f64() * 1000.0),
        "ttfb_as_of": ttfb.map(|(_, at)| at),
        "slow_start_share": n.slow_start_factor(now),
        // Keeps missing first-token deadlines: tried after the others, not broken.
        "slow": n.is_slow(now),
        "first_token_misses": n.first_token_misses(),
        "models": n.models(),
        "loaded": *n.loaded(),
        "loaded_as_of": n.loaded_as_of(),
        // Learned from finished answers; a field is null while unknown (never seen, or stale).
        "speed": n.speeds(now).into_iter().collect::<std::collections::BTreeMap<_, _>>(),
    })
}

pub(super) async fn list(State(s): State<AdminState>) -> Json<Value> {
    Json(json!(s.shared.registry.all().iter().map(|n| node_json(n)).collect::<Vec<_>>()))
}

pub(super) async fn get(State(s): State<AdminState>, Path(name): Path<String>) -> Result<Json<Value>, AdminError> {
    let node = s.shared.registry.get(&name).ok_or(AdminError::NotFound { kind: "node", name })?;
    Ok(Json(node_json(&node)))
}

pub(super) async fn add(State(s): State<AdminState>, body: axum::body::Bytes) -> Result<Response, AdminError> {
    let node: NodeConfig = parse(&body)?;
    edit(&s, |next| {
        if next.nodes.iter().any(|n| n.name == node.name) {
            return Err(AdminError::Conflict { kind: "node", name: node.name.clone() });
        }
        next.nodes.push(node.clone());
        Ok(())
    })?;
    let created = s.shared.registry.get(&node.name).map(|n| node_json(&n)).unwrap_or(Value::Null);
    Ok((StatusCode::CREATED, Json(created)).into_response())
}

/// Fields an operator may change on a running node.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct NodePatch {
    enabled: Option<bool>,
    draining: Option<bool>,
    weight: Option<u32>,
    max_concurrency: Option<u32>,
}

pub(super) async fn patch(
    State(s): State<AdminState>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, AdminError> {
    let patch: NodePatch = parse(&body)?;
    let node = s.shared.registry.get(&name).ok_or_else(|| AdminError::NotFound { kind: "node", name: name.clone() })?;
    edit(&s, |next| {
        if let Some(entry) = next.nodes.iter_mut().find(|n| n.name == name) {
            if let Some(e) = patch.enabled {
                entry.enabled = e;
            }
            if let Some(w) = patch.weight {
                entry.weight = w;
            }
            if let Some(m) = patch.max_concurrency {
                entry.max_concurrency = m;
            }
        }
        Ok(())
    })?;
    // Draining is a runtime action, not config: it ends when the operator says so.
    match (patch.draining, node.admin()) {
        (Some(true), Admin::Active) => node.set_admin(Admin::Draining),
        (Some(false), Admin::Draining) => node.set_admin(Admin::Active),
        _ => {}
    }
    Ok(Json(node_json(&node)))
}

pub(super) async fn delete(State(s): State<AdminState>, Path(name): Path<String>) -> Result<StatusCode, AdminError> {
    edit(&s, |next| {
        let before = next.nodes.len();
        next.nodes.retain(|n| n.name != name);
        if next.nodes.len() == before {
            return Err(AdminError::NotFound { kind: "node", name: name.clone() });
        }
        Ok(())
    })?;
    Ok(StatusCode::NO_CONTENT)
}

/// The body of `POST /admin/nodes/{name}/test`, which may be empty.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct TestAsk {
    /// Time to first token of this model; none: one timed liveness probe.
    model: Option<String>,
}

/// The latency test of one node (the UI's "Test" button): one timed liveness probe, or with a
/// `model` its time to first token. A failed one says why (`error`: "connection refused at
/// http://..."). Kept with the others of `/admin/latency`.
pub(super) async fn test(
    State(s): State<AdminState>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, AdminError> {
    let ask: TestAsk = if body.is_empty() { TestAsk::default() } else { parse(&body)? };
    let node = s.shared.registry.get(&name).ok_or(AdminError::NotFound { kind: "node", name: name.clone() })?;
    let measured = super::latency::measure(&s, &node, ask.model.as_deref()).await;
    let mut v = json!(measured);
    v["name"] = json!(name);
    Ok(Json(v))
}
