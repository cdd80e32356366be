//! The admin listener: JSON API for operators, the CLI and the UI (loopback by default).
//!
//! Everything but `GET /healthz` needs the bearer token (`Authorization: Bearer <token>`, or
//! `?token=` for clients that cannot set headers, like `EventSource`), compared in constant
//! time. Changes go draft -> validate -> swap: a node or category edit is applied to a copy of
//! the running config, the whole copy is validated, and only then swapped in, so the broker
//! never runs a config that `corral config check` would refuse. In-flight requests are never
//! dropped by a change: a removed node's requests hold their own handle and finish.

use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use http::{header, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value};
use subtle::ConstantTimeEq;

use crate::config::{CategoryConfig, Config, NodeConfig};
use crate::node::{Admin, Node};
use crate::proxy::Shared;

#[derive(Clone)]
pub struct AdminState {
    pub shared: Arc<Shared>,
    pub token: Arc<String>,
}

/// Errors of the admin API, each with a stable code.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("missing or wrong admin token; send Authorization: Bearer <token>")]
    Unauthorized,
    #[error("no {kind} named \"{name}\"")]
    NotFound { kind: &'static str, name: String },
    #[error("{kind} \"{name}\" already exists")]
    Conflict { kind: &'static str, name: String },
    #[error("the change would make the config invalid: {}", .0.join("; "))]
    Invalid(Vec<String>),
    #[error("body is not valid JSON for this endpoint: {0}")]
    BadBody(String),
    #[error("{0}")]
    Secret(#[from] crate::secrets::SecretError),
}

impl AdminError {
    pub fn code(&self) -> &'static str {
        match self {
            Self::Unauthorized => "unauthorized",
            Self::NotFound { .. } => "not_found",
            Self::Conflict { .. } => "conflict",
            Self::Invalid(_) => "invalid_config",
            Self::BadBody(_) => "malformed_json",
            Self::Secret(e) => e.code(),
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::NotFound { .. } => StatusCode::NOT_FOUND,
            Self::Conflict { .. } => StatusCode::CONFLICT,
            Self::Invalid(_) | Self::BadBody(_) => StatusCode::BAD_REQUEST,
            Self::Secret(crate::secrets::SecretError::NotFound(_)) => StatusCode::NOT_FOUND,
            Self::Secret(crate::secrets::SecretError::BadName(_) | crate::secrets::SecretError::Empty) => {
                StatusCode::BAD_REQUEST
            }
            Self::Secret(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        let mut body = json!({ "error": self.to_string(), "code": self.code() });
        if let Self::Invalid(problems) = &self {
            body["problems"] = json!(problems);
        }
        let mut r = (self.status(), Json(body)).into_response();
        if matches!(self, Self::Unauthorized) {
            r.headers_mut().insert(header::WWW_AUTHENTICATE, http::HeaderValue::from_static("Bearer"));
        }
        r
    }
}

/// The admin router. `routes()` lists every path so tests can check each one needs the token.
pub fn router(state: AdminState) -> Router {
    let protected = Router::new()
        .route("/help", get(help))
        .route("/admin/status", get(status))
        .route("/admin/nodes", get(list_nodes).post(add_node))
        .route("/admin/nodes/{name}", get(get_node).patch(patch_node).delete(delete_node))
        .route("/admin/categories", get(list_categories).put(put_categories))
        .route("/admin/categories/{name}", get(get_category).put(put_category).delete(delete_category))
        .route("/admin/config/export", get(export_config))
        .route("/metrics", get(metrics))
        .route("/admin/requests", get(requests))
        .route("/admin/charts/{file}", get(chart))
        .route("/admin/events", get(events))
        .route("/admin/config/import", axum::routing::post(import_config))
        .route("/admin/secrets", get(list_secrets))
        .route("/admin/secrets/{name}", axum::routing::put(put_secret).delete(delete_secret))
        .route("/admin/nodes/{name}/test", axum::routing::post(test_node))
        .route("/admin/providers", get(list_providers).put(put_providers))
        .route("/admin/providers/{name}/test", axum::routing::post(test_provider))
        .route("/admin/models/pull", axum::routing::post(pull_model))
        .route("/admin/accepting", get(get_accepting).put(put_accepting))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), require_token));
    Router::new()
        .route("/healthz", get(healthz))
        // The UI's static files: no data in them; every call they make needs the token.
        .route("/", get(crate::ui::root))
        .route("/ui/", get(crate::ui::index))
        .route("/ui/{*file}", get(crate::ui::asset))
        .merge(protected)
        .with_state(state)
}

/// Routes that answer without the token: the liveness check and the UI's static files.
pub const PUBLIC_ROUTES: &[(&str, &str)] = &[("GET", "/healthz"), ("GET", "/"), ("GET", "/ui/"), ("GET", "/ui/x")];

/// Every protected (method, path) pair, for tests that must not let a route slip past the token.
pub const PROTECTED_ROUTES: &[(&str, &str)] = &[
    ("GET", "/help"),
    ("GET", "/admin/status"),
    ("GET", "/admin/nodes"),
    ("POST", "/admin/nodes"),
    ("GET", "/admin/nodes/x"),
    ("PATCH", "/admin/nodes/x"),
    ("DELETE", "/admin/nodes/x"),
    ("GET", "/admin/categories"),
    ("PUT", "/admin/categories"),
    ("GET", "/admin/categories/x"),
    ("PUT", "/admin/categories/x"),
    ("DELETE", "/admin/categories/x"),
    ("GET", "/admin/config/export"),
    ("GET", "/metrics"),
    ("GET", "/admin/requests"),
    ("GET", "/admin/charts/latency.svg"),
    ("GET", "/admin/events"),
    ("POST", "/admin/config/import"),
    ("GET", "/admin/secrets"),
    ("PUT", "/admin/secrets/x"),
    ("DELETE", "/admin/secrets/x"),
    ("POST", "/admin/nodes/x/test"),
    ("GET", "/admin/providers"),
    ("PUT", "/admin/providers"),
    ("POST", "/admin/providers/x/test"),
    ("POST", "/admin/models/pull"),
    ("GET", "/admin/accepting"),
    ("PUT", "/admin/accepting"),
];

async fn require_token(State(state): State<AdminState>, req: Request, next: Next) -> Response {
    let from_header = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_string);
    let from_query = req.uri().query().and_then(|q| {
        url::form_urlencoded::parse(q.as_bytes()).find(|(k, _)| k == "token").map(|(_, v)| v.into_owned())
    });
    let given = from_header.or(from_query).unwrap_or_default();
    if bool::from(given.as_bytes().ct_eq(state.token.as_bytes())) {
        next.run(req).await
    } else {
        AdminError::Unauthorized.into_response()
    }
}

async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

fn node_json(n: &Node) -> Value {
    let now = tokio::time::Instant::now();
    json!({
        "name": n.name(),
        "url": n.config.url,
        "kind": n.config.kind,
        "state": n.state(),
        "health": n.health(),
        "admin": n.admin(),
        "breaker": n.breaker_state(),
        "weight": n.weight(),
        "max_concurrency": n.max_concurrency(),
        "in_flight": n.in_flight(),
        "served": n.served(),
        "ttfb_ms": n.ttfb_estimate(now).map(|d| d.as_secs_f64() * 1000.0),
        "slow_start_share": n.slow_start_factor(now),
        "models": n.models(),
        "loaded": *n.loaded(),
    })
}

async fn status(State(s): State<AdminState>) -> Json<Value> {
    let nodes: Vec<Value> = s.shared.registry.all().iter().map(|n| node_json(n)).collect();
    let config = s.shared.config();
    let (share, requests) = s.shared.telemetry.fallback_share();
    let stats = recent_stats(&s).await;
    Json(json!({
        "nodes": nodes,
        "stats": stats,
        "queue": { "depth": s.shared.admission.depth(), "bytes": s.shared.admission.queued_bytes(), "max_requests": config.queue.max_requests, "max_bytes": config.queue.max_bytes },
        "categories": config.categories,
        "reload": *s.shared.reload.lock().unwrap_or_else(|p| p.into_inner()),
        "accepting": s.shared.accepting(),
        "fallback": {
            "share": share,
            "requests": requests,
            "window_ms": config.alerts.fallback_window_ms,
            "alert_share": config.alerts.fallback_share,
            "providers": config.providers.iter().map(|p| json!({ "name": p.name, "base_url": p.base_url, "secret": p.secret })).collect::<Vec<_>>(),
        },
    }))
}

/// Per node (and `cluster`), over the last 15 minutes from the store: requests, latency
/// p50/p95, time to first byte p50, and generation speed (completion tokens per second of
/// streaming). What the UI's cards show beside the live state.
async fn recent_stats(s: &AdminState) -> Value {
    let Some(store) = s.shared.telemetry.store() else { return json!({}) };
    let now_ms = (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64;
    let query = crate::store::Query { since_ms: Some(now_ms - 15 * 60_000), limit: Some(20_000), ..Default::default() };
    let Ok(rows) = store.requests(&query).await else { return json!({}) };
    let mut groups: std::collections::BTreeMap<String, Vec<&crate::store::RequestRow>> =
        std::collections::BTreeMap::new();
    for r in rows.iter().filter(|r| r.status != "running") {
        groups
            .entry(
                r.node
                    .clone()
                    .or_else(|| r.fallback.as_ref().map(|p| format!("cloud:{p}")))
                    .unwrap_or_else(|| "none".into()),
            )
            .or_default()
            .push(r);
        groups.entry("cluster".into()).or_default().push(r);
    }
    let summarize = |rows: &[&crate::store::RequestRow]| {
        let mut total: Vec<f64> = rows.iter().filter_map(|r| r.total_ms).map(|v| v as f64).collect();
        let mut ttfb: Vec<f64> = rows.iter().filter_map(|r| r.ttfb_ms).map(|v| v as f64).collect();
        total.sort_by(f64::total_cmp);
        ttfb.sort_by(f64::total_cmp);
        let (tokens, gen_ms) =
            rows.iter().fold((0i64, 0i64), |(t, ms), r| match (r.completion_tokens, r.total_ms, r.ttfb_ms) {
                (Some(c), Some(total), Some(first)) if total > first => (t + c, ms + (total - first)),
                _ => (t, ms),
            });
        let pct = |v: &[f64], p: f64| (!v.is_empty()).then(|| crate::charts::percentile(v, p));
        json!({
            "requests": rows.len(),
            "errors": rows.iter().filter(|r| r.status == "error" || r.status == "interrupted").count(),
            "p50_ms": pct(&total, 50.0),
            "p95_ms": pct(&total, 95.0),
            "ttfb_p50_ms": pct(&ttfb, 50.0),
            "tokens_per_s": (gen_ms > 0).then(|| tokens as f64 * 1000.0 / gen_ms as f64),
        })
    };
    Value::Object(groups.iter().map(|(k, v)| (k.clone(), summarize(v))).collect())
}

async fn list_nodes(State(s): State<AdminState>) -> Json<Value> {
    Json(json!(s.shared.registry.all().iter().map(|n| node_json(n)).collect::<Vec<_>>()))
}

async fn get_node(State(s): State<AdminState>, Path(name): Path<String>) -> Result<Json<Value>, AdminError> {
    let node = s.shared.registry.get(&name).ok_or(AdminError::NotFound { kind: "node", name })?;
    Ok(Json(node_json(&node)))
}

/// Validate `next` as a whole and swap it in.
fn commit(s: &AdminState, next: Config) -> Result<(), AdminError> {
    let problems = next.validate();
    if !problems.is_empty() {
        return Err(AdminError::Invalid(problems.into_iter().map(|(p, m)| format!("{p}: {m}")).collect()));
    }
    s.shared.apply(next);
    Ok(())
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, AdminError> {
    serde_json::from_slice(body).map_err(|e| AdminError::BadBody(e.to_string()))
}

async fn add_node(State(s): State<AdminState>, body: axum::body::Bytes) -> Result<Response, AdminError> {
    let node: NodeConfig = parse(&body)?;
    let mut next = Config::clone(&s.shared.config());
    if next.nodes.iter().any(|n| n.name == node.name) {
        return Err(AdminError::Conflict { kind: "node", name: node.name });
    }
    next.nodes.push(node.clone());
    commit(&s, next)?;
    let created = s.shared.registry.get(&node.name).map(|n| node_json(&n)).unwrap_or(Value::Null);
    Ok((StatusCode::CREATED, Json(created)).into_response())
}

/// Fields an operator may change on a running node.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodePatch {
    enabled: Option<bool>,
    draining: Option<bool>,
    weight: Option<u32>,
    max_concurrency: Option<u32>,
}

async fn patch_node(
    State(s): State<AdminState>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, AdminError> {
    let patch: NodePatch = parse(&body)?;
    let node = s.shared.registry.get(&name).ok_or_else(|| AdminError::NotFound { kind: "node", name: name.clone() })?;
    let mut next = Config::clone(&s.shared.config());
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
    commit(&s, next)?;
    // Draining is a runtime action, not config: it ends when the operator says so.
    match (patch.draining, node.admin()) {
        (Some(true), Admin::Active) => node.set_admin(Admin::Draining),
        (Some(false), Admin::Draining) => node.set_admin(Admin::Active),
        _ => {}
    }
    Ok(Json(node_json(&node)))
}

async fn delete_node(State(s): State<AdminState>, Path(name): Path<String>) -> Result<StatusCode, AdminError> {
    let mut next = Config::clone(&s.shared.config());
    let before = next.nodes.len();
    next.nodes.retain(|n| n.name != name);
    if next.nodes.len() == before {
        return Err(AdminError::NotFound { kind: "node", name });
    }
    commit(&s, next)?;
    Ok(StatusCode::NO_CONTENT)
}

async fn list_categories(State(s): State<AdminState>) -> Json<Value> {
    Json(json!(s.shared.config().categories))
}

async fn get_category(State(s): State<AdminState>, Path(name): Path<String>) -> Result<Json<Value>, AdminError> {
    let config = s.shared.config();
    let c = config.category(&name).ok_or(AdminError::NotFound { kind: "category", name })?;
    Ok(Json(json!(c)))
}

async fn put_categories(State(s): State<AdminState>, body: axum::body::Bytes) -> Result<Json<Value>, AdminError> {
    let categories: Vec<CategoryConfig> = parse(&body)?;
    let mut next = Config::clone(&s.shared.config());
    next.categories = categories;
    commit(&s, next)?;
    Ok(Json(json!(s.shared.config().categories)))
}

async fn put_category(
    State(s): State<AdminState>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, AdminError> {
    let mut category: CategoryConfig = parse(&body)?;
    category.name = name.clone();
    let mut next = Config::clone(&s.shared.config());
    match next.categories.iter_mut().find(|c| c.name == name) {
        Some(slot) => *slot = category,
        None => next.categories.push(category),
    }
    commit(&s, next)?;
    let config = s.shared.config();
    Ok(Json(json!(config.category(&name))))
}

async fn delete_category(State(s): State<AdminState>, Path(name): Path<String>) -> Result<StatusCode, AdminError> {
    let mut next = Config::clone(&s.shared.config());
    let before = next.categories.len();
    next.categories.retain(|c| c.name != name);
    if next.categories.len() == before {
        return Err(AdminError::NotFound { kind: "category", name });
    }
    commit(&s, next)?;
    Ok(StatusCode::NO_CONTENT)
}

/// Time one liveness probe of a node (the UI's "test latency" button).
async fn test_node(State(s): State<AdminState>, Path(name): Path<String>) -> Result<Json<Value>, AdminError> {
    let node = s.shared.registry.get(&name).ok_or(AdminError::NotFound { kind: "node", name: name.clone() })?;
    let timeout = std::time::Duration::from_millis(s.shared.config().health.timeout_ms.max(1_000));
    let started = std::time::Instant::now();
    let ok = crate::health::probe_liveness(&s.shared.client, &node, timeout).await;
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    Ok(Json(json!({ "name": name, "ok": ok, "ms": ms, "timeout_ms": timeout.as_millis() as u64 })))
}

async fn list_providers(State(s): State<AdminState>) -> Json<Value> {
    let config = s.shared.config();
    let needed: Vec<String> = config.providers.iter().map(|p| p.secret.clone()).filter(|n| !n.is_empty()).collect();
    let states = tokio::task::spawn_blocking(move || {
        needed
            .into_iter()
            .map(|n| {
                let state = match crate::secrets::is_set(&n) {
                    Ok(true) => "set",
                    Ok(false) => "missing",
                    Err(_) => "unknown",
                };
                (n, state)
            })
            .collect::<std::collections::HashMap<_, _>>()
    })
    .await
    .unwrap_or_default();
    Json(json!(config
        .providers
        .iter()
        .map(|p| {
            let mut v = json!(p);
            v["secret_state"] =
                json!(if p.secret.is_empty() { "none" } else { states.get(&p.secret).copied().unwrap_or("unknown") });
            v
        })
        .collect::<Vec<_>>()))
}

async fn put_providers(State(s): State<AdminState>, body: axum::body::Bytes) -> Result<Json<Value>, AdminError> {
    let providers: Vec<crate::config::ProviderConfig> = parse(&body)?;
    let mut next = Config::clone(&s.shared.config());
    next.providers = providers;
    commit(&s, next)?;
    Ok(Json(json!(s.shared.config().providers)))
}

/// Ask a provider for one token with its key: does the URL, the key and the model map work?
async fn test_provider(State(s): State<AdminState>, Path(name): Path<String>) -> Result<Json<Value>, AdminError> {
    let config = s.shared.config();
    let p = config.providers.iter().find(|p| p.name == name).ok_or(AdminError::NotFound { kind: "provider", name })?;
    let started = std::time::Instant::now();
    let result = crate::cloud::probe(&s.shared, p).await;
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    Ok(Json(match result {
        Ok(model) => json!({ "name": p.name, "ok": true, "ms": ms, "model": model }),
        Err(e) => json!({ "name": p.name, "ok": false, "ms": ms, "error": e }),
    }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PullRequest {
    name: String,
    #[serde(default)]
    nodes: Vec<String>,
}

/// Pull a model onto the named nodes (all serving nodes when none are named), streaming each
/// node's progress as NDJSON lines (`{"node": ..., "status": ..., "completed": ..., "total": ...}`).
async fn pull_model(State(s): State<AdminState>, body: axum::body::Bytes) -> Result<Response, AdminError> {
    let req: PullRequest = parse(&body)?;
    for n in &req.nodes {
        if s.shared.registry.get(n).is_none() {
            return Err(AdminError::NotFound { kind: "node", name: n.clone() });
        }
    }
    Ok(crate::proxy::pull(&s.shared, &req.name, &req.nodes).await.into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Accepting {
    accepting: bool,
}

async fn get_accepting(State(s): State<AdminState>) -> Json<Value> {
    Json(json!({ "accepting": s.shared.accepting() }))
}

/// Pause (`{"accepting": false}`) or resume the broker: paused, new requests get 503 `paused`
/// while running ones finish.
async fn put_accepting(State(s): State<AdminState>, body: axum::body::Bytes) -> Result<Json<Value>, AdminError> {
    let a: Accepting = parse(&body)?;
    s.shared.set_accepting(a.accepting);
    Ok(Json(json!({ "accepting": s.shared.accepting() })))
}

async fn export_config(State(s): State<AdminState>) -> Response {
    let text = crate::config::export_text(&s.shared.config());
    ([(header::CONTENT_TYPE, "application/toml; charset=utf-8")], text).into_response()
}

/// A self-description for clients (and agents) that have no docs at hand.
async fn help(State(s): State<AdminState>) -> Json<Value> {
    let config = s.shared.config();
    let nodes: Vec<Value> = s
        .shared
        .registry
        .all()
        .iter()
        .map(|n| json!({ "name": n.name(), "state": n.state(), "models": n.models(), "max_concurrency": n.max_concurrency(), "weight": n.weight() }))
        .collect();
    Json(json!({
        "service": "corral",
        "version": env!("CARGO_PKG_VERSION"),
        "what": "One endpoint in front of a cluster of Ollama nodes: speaks the Ollama API and the OpenAI-compatible /v1 API, picks a node per request, fails over, and queues fairly.",
        "proxy": {
            "listeners": config.listeners,
            "endpoints": [
                "GET /", "HEAD /", "GET /api/version", "GET /api/tags (union of every node's models; entries list their nodes)",
                "GET /api/ps (union, each entry names its node)", "POST /api/show", "POST /api/chat", "POST /api/generate",
                "POST /api/embed", "POST /api/embeddings", "POST /api/pull, POST /api/create, POST /api/copy, DELETE /api/delete (to the nodes in X-Corral-Node, or all)",
                "POST /api/push", "POST|HEAD /api/blobs/{digest}", "POST /v1/chat/completions", "POST /v1/completions", "POST /v1/embeddings", "GET /v1/models",
            ],
        },
        "admin": {
            "addr": config.admin.addr,
            "auth": "Authorization: Bearer <token> on every route but GET /healthz",
            "endpoints": ["GET /healthz", "GET /help", "GET /metrics", "GET /admin/requests?since=&node=&category=&status=&limit=", "GET /admin/status", "GET|POST /admin/nodes", "GET|PATCH|DELETE /admin/nodes/{name}", "GET|PUT /admin/categories", "GET|PUT|DELETE /admin/categories/{name}", "GET /admin/config/export", "POST /admin/config/import?mode=merge|replace&dry_run=true", "GET /admin/secrets (names, set/missing)", "PUT|DELETE /admin/secrets/{name}", "GET /admin/events (SSE: node_state, request, config_reload, fallback_share)", "GET /admin/charts/{latency|ttfb|throughput|outcomes|queue|health}.svg?window=15m"],
        },
        "request_headers": {
            "X-Corral-Category": "pick a category by name; unknown names get 400 unknown_category",
            "X-Corral-Session": "sticky key for the sticky policy (keeps a conversation on the node holding its KV cache)",
            "X-Corral-Queue-Timeout": "milliseconds this request may wait for a free node (default: the category's queue_timeout_ms)",
            "X-Corral-Node": "comma-separated node names for model operations (pull, delete, copy, create)",
            "X-Request-Id": "kept and passed to the node; generated when absent",
        },
        "response_headers": {
            "X-Request-Id": "the request's id",
            "X-Corral-Node": "the node that answered",
            "X-Corral-Attempts": "how many nodes were tried",
            "X-Corral-Forwarded": "false on rejections that reached no node (safe to retry anywhere)",
            "X-Corral-Context-Warning": "the prompt fills more than 85% of the context",
            "X-Corral-Fallback": "the cloud provider that answered, when the cluster could not",
        },
        "categories": config.categories.iter().map(|c| json!({
            "name": c.name, "policy": c.policy.name(), "priority": c.priority, "queue_timeout_ms": c.queue_timeout_ms,
            "cloud": c.cloud, "providers": c.providers, "redact": c.redact, "models": c.models, "affinity": c.affinity,
        })).collect::<Vec<_>>(),
        "cloud_fallback": {
            "when": "no node has the model, every node tried failed before its first byte, or the queue was full or timed out; never after the first byte of a local answer",
            "never": "categories with cloud = \"never\" get 503 cloud_not_allowed (forwarded as the local failure was)",
            "all_failed": "502 cloud_failed with the local reason and each provider's",
            "providers": config.providers.iter().map(|p| json!({ "name": p.name, "base_url": p.base_url, "models": p.model_map })).collect::<Vec<_>>(),
            "alert": { "fallback_share": config.alerts.fallback_share, "window_ms": config.alerts.fallback_window_ms, "min_requests": config.alerts.fallback_min_requests },
        },
        "classification": "category = X-Corral-Category header, else the listener's category, else the first category whose models patterns match the model, else \"default\"",
        "queue": {
            "order": "category priority (0 first), then origin (local listeners before remote), then arrival; a running request is never pre-empted",
            "max_requests": config.queue.max_requests,
            "max_bytes": config.queue.max_bytes,
            "full": "429 queue_full, forwarded=false, Retry-After",
            "timeout": "503 queue_timeout, forwarded=false, Retry-After",
        },
        "limits": {
            "max_body_bytes": config.proxy.max_body_bytes,
            "connect_timeout_ms": config.proxy.connect_timeout_ms,
            "first_byte_timeout_ms": config.proxy.first_byte_timeout_ms,
            "idle_timeout_ms": config.proxy.idle_timeout_ms,
            "max_attempts": config.retry.max_attempts,
            "retry_budget_ratio": config.retry.budget_ratio,
            "default_num_ctx": config.proxy.default_num_ctx,
            "context_guard": config.proxy.context_guard,
        },
        "errors": "JSON {error, code, forwarded}; codes in docs/errors.md. Mid-stream failures end the stream with {\"error\", \"code\"}.",
        "nodes": nodes,
    }))
}

async fn metrics(State(s): State<AdminState>) -> Response {
    let text = s.shared.telemetry.render(&s.shared.registry, s.shared.admission.depth());
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text).into_response()
}

/// `since` as a duration back from now (`15m`, `2h`, `7d`, `30s`) or unix ms.
pub fn parse_since(since: &str) -> Option<i64> {
    let s = since.trim();
    if let Ok(ms) = s.parse::<i64>() {
        return Some(ms);
    }
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit())?);
    let n: i64 = num.parse().ok()?;
    let ms = match unit {
        "s" => n * 1_000,
        "m" => n * 60_000,
        "h" => n * 3_600_000,
        "d" => n * 86_400_000,
        _ => return None,
    };
    Some(crate::store::now_ms() - ms)
}

#[derive(Debug, Deserialize)]
struct RequestsQuery {
    since: Option<String>,
    node: Option<String>,
    category: Option<String>,
    status: Option<String>,
    limit: Option<i64>,
}

async fn requests(
    State(s): State<AdminState>,
    axum::extract::Query(q): axum::extract::Query<RequestsQuery>,
) -> Result<Json<Value>, AdminError> {
    let Some(store) = s.shared.telemetry.store() else {
        return Err(AdminError::NotFound { kind: "request store (it is disabled)", name: "store".into() });
    };
    let since_ms = match &q.since {
        Some(v) => Some(
            parse_since(v)
                .ok_or_else(|| AdminError::BadBody(format!("since=\"{v}\" is not like 15m, 2h, 7d or unix ms")))?,
        ),
        None => None,
    };
    let query = crate::store::Query { since_ms, node: q.node, category: q.category, status: q.status, limit: q.limit };
    let rows = store.requests(&query).await.map_err(|e| AdminError::BadBody(e.to_string()))?;
    Ok(Json(json!({ "requests": rows, "dropped_records": store.dropped() })))
}

#[derive(Debug, Deserialize)]
struct ChartQuery {
    window: Option<String>,
    width: Option<u32>,
    height: Option<u32>,
}

/// `GET /admin/charts/{chart}.svg?window=15m`: one chart of the recent past, from the store.
async fn chart(
    State(s): State<AdminState>,
    Path(file): Path<String>,
    axum::extract::Query(q): axum::extract::Query<ChartQuery>,
) -> Result<Response, AdminError> {
    let name = file.strip_suffix(".svg").unwrap_or(&file);
    let chart = crate::charts::Chart::from_name(name).ok_or_else(|| AdminError::NotFound {
        kind: "chart (known: latency, ttfb, throughput, outcomes, queue, health)",
        name: name.to_string(),
    })?;
    let window = q.window.as_deref().unwrap_or("15m");
    let from =
        parse_since(window).ok_or_else(|| AdminError::BadBody(format!("window=\"{window}\" is not like 15m or 1h")))?;
    let store = s
        .shared
        .telemetry
        .store()
        .ok_or_else(|| AdminError::NotFound { kind: "request store (it is disabled)", name: "store".into() })?;
    let to = crate::store::now_ms();
    let rows = store
        .requests(&crate::store::Query { since_ms: Some(from), limit: Some(200_000), ..Default::default() })
        .await
        .map_err(|e| AdminError::BadBody(e.to_string()))?;
    let events = store.node_events(from).await.map_err(|e| AdminError::BadBody(e.to_string()))?;
    let snap = crate::charts::Snapshot::build(&rows, &events, from, to, 30);
    let size = (q.width.unwrap_or(640).clamp(200, 4000), q.height.unwrap_or(320).clamp(150, 4000));
    let svg = crate::charts::svg(chart, &snap, size).map_err(|e| AdminError::BadBody(e.to_string()))?;
    Ok(([(header::CONTENT_TYPE, "image/svg+xml")], svg).into_response())
}

/// `GET /admin/events`: Server-Sent Events, one per thing that changed (node state, a finished
/// request, a config reload). The UI listens and then re-fetches what it shows (push, then
/// pull). A listener that falls behind gets a `lagged` event with the count it missed.
async fn events(State(s): State<AdminState>) -> Response {
    use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
    use tokio::sync::broadcast::error::RecvError;
    let rx = s.shared.telemetry.subscribe();
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        let event = match rx.recv().await {
            Ok(e) => {
                let kind = match &e {
                    crate::telemetry::Event::NodeState { .. } => "node_state",
                    crate::telemetry::Event::Request(_) => "request",
                    crate::telemetry::Event::ConfigReload { .. } => "config_reload",
                    crate::telemetry::Event::FallbackShare { .. } => "fallback_share",
                };
                SseEvent::default().event(kind).json_data(&e).unwrap_or_else(|_| SseEvent::default().event(kind))
            }
            Err(RecvError::Lagged(n)) => SseEvent::default().event("lagged").data(n.to_string()),
            Err(RecvError::Closed) => return None,
        };
        Some((Ok::<_, std::convert::Infallible>(event), rx))
    });
    Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
}

#[derive(Debug, Deserialize)]
struct ImportQuery {
    mode: Option<crate::config::ImportMode>,
    dry_run: Option<bool>,
}

/// `POST /admin/config/import?mode=merge|replace&dry_run=true` with a TOML body: the preview
/// (added, changed, removed, secrets needed) and, unless a dry run, the swap.
async fn import_config(
    State(s): State<AdminState>,
    axum::extract::Query(q): axum::extract::Query<ImportQuery>,
    body: String,
) -> Result<Json<Value>, AdminError> {
    let incoming =
        Config::parse(&body).map_err(|e| AdminError::Invalid(e.problems.iter().map(|p| p.to_string()).collect()))?;
    let mode = q.mode.unwrap_or(crate::config::ImportMode::Merge);
    let (next, changes) = crate::config::import(&s.shared.config(), &incoming, mode);
    let secrets = crate::config::secret_names(&next);
    let dry_run = q.dry_run.unwrap_or(false);
    if !dry_run {
        commit(&s, next)?;
    } else {
        let problems = next.validate();
        if !problems.is_empty() {
            return Err(AdminError::Invalid(problems.into_iter().map(|(p, m)| format!("{p}: {m}")).collect()));
        }
    }
    Ok(Json(json!({ "mode": mode, "dry_run": dry_run, "changes": changes, "secrets_needed": secrets })))
}

/// Keyring calls block on D-Bus: run them off the async workers.
async fn keyring<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, crate::secrets::SecretError> + Send + 'static,
) -> Result<T, AdminError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| AdminError::Secret(crate::secrets::SecretError::Keyring(e.to_string())))?
        .map_err(AdminError::from)
}

/// `GET /admin/secrets`: the stored names, and for every secret the config names, whether it
/// is set. Never a value.
async fn list_secrets(State(s): State<AdminState>) -> Result<Json<Value>, AdminError> {
    let needed = crate::config::secret_names(&s.shared.config());
    let stored = keyring(crate::secrets::list).await?;
    let status: serde_json::Map<String, Value> = needed
        .iter()
        .map(|n| (n.clone(), Value::String(if stored.contains(n) { "set" } else { "missing" }.into())))
        .collect();
    Ok(Json(json!({ "stored": stored, "needed": status })))
}

/// `PUT /admin/secrets/{name}`: the body is the value (plain text, or JSON `{"value": ...}`).
async fn put_secret(Path(name): Path<String>, body: String) -> Result<StatusCode, AdminError> {
    let value = match serde_json::from_str::<Value>(&body) {
        Ok(Value::Object(o)) => o.get("value").and_then(Value::as_str).map(str::to_string).unwrap_or_default(),
        _ => body.trim_end_matches(['\r', '\n']).to_string(),
    };
    keyring(move || crate::secrets::set(&name, &value)).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn delete_secret(Path(name): Path<String>) -> Result<StatusCode, AdminError> {
    keyring(move || crate::secrets::delete(&name)).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::PROTECTED_ROUTES;

    /// Every `(method, path)` the router declares, read from this file's own source, so a new
    /// route cannot be added without joining the list the 401 test walks.
    fn declared_routes() -> Vec<(String, String)> {
        let src = include_str!("admin.rs");
        let mut out = Vec::new();
        for line in
            src.lines().map(str::trim).filter(|l| l.starts_with(".route(\"") || l.contains("Router::new().route(\""))
        {
            let Some(path) = line.split('"').nth(1) else { continue };
            let path = path.replace("{name}", "x").replace("{file}", "latency.svg").replace("{*file}", "x");
            for (word, method) in
                [("get(", "GET"), ("post(", "POST"), ("put(", "PUT"), ("patch(", "PATCH"), ("delete(", "DELETE")]
            {
                if line.contains(&format!("({word}"))
                    || line.contains(&format!(".{word}"))
                    || line.contains(&format!("::{word}"))
                    || line.contains(&format!(" {word}"))
                {
                    out.push((method.to_string(), path.clone()));
                }
            }
        }
        out
    }

    #[test]
    fn every_declared_route_but_healthz_is_in_the_protected_list() {
        let declared = declared_routes();
        assert!(declared.len() >= PROTECTED_ROUTES.len(), "the source scan found the routes: {declared:?}");
        for (method, path) in &declared {
            if super::PUBLIC_ROUTES.iter().any(|(m, p)| m == method && p == path) {
                continue;
            }
            assert!(
                PROTECTED_ROUTES.iter().any(|(m, p)| m == method && p == path),
                "{method} {path} is routed but missing from PROTECTED_ROUTES, so no test checks it needs the token"
            );
        }
        for (m, p) in PROTECTED_ROUTES {
            assert!(declared.iter().any(|(dm, dp)| dm == m && dp == p), "{m} {p} is listed but not routed");
        }
    }
}
