//! Endpoints answered from every serving node at once and merged: `/api/tags` and `/v1/models`
//! (the union of models, so a client sees one big Ollama), `/api/ps` (the union, each entry
//! annotated with the `node` it is loaded on). Nodes are asked concurrently with the probe
//! timeout; a node that does not answer is left out, not waited for, and named in
//! `X-Corral-Missing-Nodes`. With every node out of service there is nothing to merge: 503
//! `no_node_up` naming each node's state, never an empty list. Ollama's CLI (`ollama list`) and
//! its Python client show an error's sentence to the person and hide headers, so an empty list
//! would read as "no models" while the models sit on nodes that are down.
//!
//! Model operations (pull, create, copy, delete, and the blob uploads a create needs) go to
//! several nodes too, and answer in Ollama's shape so its clients read them to the end: each
//! line's `error` is a string, no node's own end says `status: "success"` or `error`, and one
//! final line after every node says `success` or names who failed and why (per-node results
//! in `nodes`, a field clients ignore).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use http::{HeaderMap, Method};
use serde_json::{json, Value};

use crate::error::BrokerError;
use crate::node::{Node, Registry};
use crate::state::{Gathered, Shared};
use crate::telemetry::Trace;
use crate::upstream::translate::native_error;
use crate::upstream::Upstream;

/// How long a merged metadata answer is reused: a burst of clients costs each node one request.
const METADATA_TTL: Duration = Duration::from_secs(1);

/// GET `path` from every available node, or the answer fetched for another caller a moment ago
/// (single flight; see `state::Recent`).
async fn gather(shared: &Shared, path: &str) -> Gathered {
    shared.recent.get(path, METADATA_TTL, gather_now(shared, path)).await
}

/// GET `path` from every available node; `(node, JSON)` for those that answered.
async fn gather_now(shared: &Shared, path: &str) -> Gathered {
    let nodes: Vec<Arc<Node>> = shared.registry.all().iter().filter(|n| n.is_available()).cloned().collect();
    if nodes.is_empty() {
        return Err(no_node_up(&shared.registry, path));
    }
    let config = shared.config();
    let timeout = Duration::from_millis(config.health.timeout_ms.max(config.proxy.connect_timeout_ms))
        .max(Duration::from_secs(2));
    let asks = nodes.iter().map(|node| {
        let client = &shared.client;
        async move {
            match Upstream::node(node).metadata(client, path, timeout).await {
                Some(v) => Some((Arc::clone(node), v)),
                None => {
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
    Ok(Arc::new(answers))
}

/// Every node is out of service: the error that says so, with each node's state.
pub(super) fn no_node_up(registry: &Registry, what: &str) -> BrokerError {
    let all = registry.all();
    let nodes = if all.is_empty() {
        "no node is configured".to_string()
    } else {
        let state = |n: &Arc<Node>| format!("{} is {}", n.name(), crate::catalog::state_word(n.state()));
        all.iter().map(state).collect::<Vec<_>>().join(", ")
    };
    BrokerError::NoNodeUp { what: what.to_string(), nodes }
}

/// A merged answer, with `X-Corral-Missing-Nodes` naming the configured nodes it lacks (out of
/// service, or no answer in time): a client can tell "not on the cluster" from "not asked".
fn merged(shared: &Shared, answered: &[(Arc<Node>, Value)], body: Value) -> Response {
    let missing: Vec<String> = shared
        .registry
        .all()
        .iter()
        .filter(|n| !answered.iter().any(|(a, _)| Arc::ptr_eq(a, n)))
        .map(|n| n.name().to_string())
        .collect();
    let mut r = axum::Json(body).into_response();
    if let Some(v) =
        Some(missing.join(", ")).filter(|m| !m.is_empty()).and_then(|m| http::HeaderValue::from_str(&m).ok())
    {
        r.headers_mut().insert("x-corral-missing-nodes", v);
    }
    r
}

fn entries(v: &Value, key: &str) -> Vec<Value> {
    v.get(key).and_then(Value::as_array).cloned().unwrap_or_default()
}

fn name_of(entry: &Value) -> String {
    entry.get("model").or_else(|| entry.get("name")).and_then(Value::as_str).unwrap_or_default().to_string()
}

pub(super) async fn tags(shared: &Shared) -> Result<Response, BrokerError> {
    let mut union: BTreeMap<String, Value> = BTreeMap::new();
    let answered = gather(shared, "/api/tags").await?;
    for (node, v) in answered.iter() {
        let models = entries(v, "models");
        // A fresh answer is as good as a deep probe: keep the routing table current.
        node.set_models(models.iter().map(name_of).filter(|n| !n.is_empty()));
        for m in models {
            // One entry per model as Ollama names it (case, `:latest`, registry prefix), each
            // saying which nodes have it (`nodes`, Corral's addition).
            let key = crate::config::model_key(&name_of(&m)).to_string();
            let entry = union.entry(key).or_insert(m);
            if let Some(obj) = entry.as_object_mut() {
                let nodes = obj.entry("nodes").or_insert_with(|| Value::Array(Vec::new()));
                if let Some(list) = nodes.as_array_mut() {
                    list.push(Value::String(node.name().to_string()));
                }
            }
        }
    }
    Ok(merged(shared, &answered, json!({ "models": union.into_values().collect::<Vec<_>>() })))
}

pub(super) async fn ps(shared: &Shared) -> Result<Response, BrokerError> {
    let mut all = Vec::new();
    let answered = gather(shared, "/api/ps").await?;
    for (node, v) in answered.iter() {
        for mut m in entries(v, "models") {
            if let Some(obj) = m.as_object_mut() {
                obj.insert("node".into(), Value::String(node.name().to_string()));
            }
            all.push(m);
        }
    }
    Ok(merged(shared, &answered, json!({ "models": all })))
}

pub(super) async fn v1_models(shared: &Shared) -> Result<Response, BrokerError> {
    let mut union: BTreeMap<String, Value> = BTreeMap::new();
    let answered = gather(shared, "/v1/models").await?;
    for (_, v) in answered.iter() {
        for m in entries(v, "data") {
            let id = m.get("id").and_then(Value::as_str).unwrap_or_default();
            union.entry(crate::config::model_key(id).to_string()).or_insert(m);
        }
    }
    Ok(merged(shared, &answered, json!({ "object": "list", "data": union.into_values().collect::<Vec<_>>() })))
}

/// One entry of the merged `/v1/models` (`GET /v1/models/{model}`), or OpenAI's 404 for a
/// model no node lists. A plain name finds its `:latest` entry, as on Ollama.
pub(super) async fn v1_model(shared: &Shared, model: &str) -> Result<Response, BrokerError> {
    let wanted = crate::config::model_key(model);
    for (_, v) in gather(shared, "/v1/models").await?.iter() {
        for m in entries(v, "data") {
            let id = m.get("id").and_then(Value::as_str).unwrap_or_default();
            if id == model || crate::config::model_key(id) == wanted {
                return Ok(axum::Json(m).into_response());
            }
        }
    }
    let known = crate::catalog::known_models(&shared.registry, std::iter::empty());
    let guesses = crate::catalog::closest(model, &known);
    let hint = crate::error::did_you_mean_sentence(&guesses).map(|s| format!("; {s}")).unwrap_or_default();
    let error = json!({ "error": {
        "message": format!("model \"{model}\" not found{hint}"),
        "type": "invalid_request_error", "param": "model", "code": "model_not_found",
    }, "did_you_mean": guesses });
    Ok((http::StatusCode::NOT_FOUND, axum::Json(error)).into_response())
}

/// `keep_alive: 0` with no prompt (`ollama stop`): sent to every available Ollama-kind node
/// that may hold the model, at once; answered as Ollama answers it. OpenAI-compatible servers
/// keep their model loaded and are not asked.
pub(super) async fn unload(shared: &Shared, path: &str, body: Bytes, model: &str) -> Result<Response, BrokerError> {
    let key = crate::config::model_key(model);
    let nodes: Vec<Arc<Node>> = shared
        .registry
        .all()
        .iter()
        .filter(|n| n.is_available() && n.serves_key(&key) != Some(false))
        .cloned()
        .collect();
    if nodes.is_empty() {
        if !shared.registry.all().iter().any(|n| n.is_available()) {
            return Err(no_node_up(&shared.registry, path));
        }
        return Err(BrokerError::model_not_found(model));
    }
    let timeout = Duration::from_secs(10);
    let asks = nodes.iter().filter(|n| !Upstream::node(n).is_openai()).map(|n| {
        let request = shared.client.post(Upstream::node(n).url(path)).header("content-type", "application/json");
        let body = body.clone();
        async move {
            let sent = tokio::time::timeout(timeout, request.body(body).send()).await;
            let ok = matches!(&sent, Ok(Ok(r)) if r.status().is_success());
            if !ok {
                tracing::warn!(node = %n.name(), "unload not confirmed by the node");
            }
            ok
        }
    });
    let confirmed = futures_util::future::join_all(asks).await;
    if !confirmed.is_empty() && !confirmed.iter().any(|ok| *ok) {
        return Err(BrokerError::NoNodeReachable { detail: "no node confirmed the unload".into() });
    }
    let answer = crate::upstream::lifecycle::Lifecycle::Unload.answer(path, model);
    Ok(axum::Json(answer).into_response())
}

/// The nodes a model operation goes to: those named in `X-Corral-Node`, else every available
/// node (for delete and copy: every available node that has the model).
fn targets(
    shared: &Shared,
    path: &str,
    headers: &HeaderMap,
    model: Option<&str>,
) -> Result<Vec<Arc<Node>>, BrokerError> {
    let all = shared.registry.all();
    if let Some(v) = headers.get("x-corral-node") {
        let names = v
            .to_str()
            .map_err(|_| BrokerError::BadHeader { name: "X-Corral-Node", reason: "not visible ASCII".into() })?;
        let mut chosen = Vec::new();
        for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let node = all.iter().find(|n| n.name() == name).ok_or_else(|| BrokerError::UnknownNode {
                // A client's header, told back: the first 64 characters are enough to recognise it.
                name: name.chars().take(64).collect(),
                known: all.iter().map(|n| n.name()).collect::<Vec<_>>().join(", "),
            })?;
            chosen.push(Arc::clone(node));
        }
        if chosen.is_empty() {
            return Err(BrokerError::BadHeader { name: "X-Corral-Node", reason: "names no node".into() });
        }
        return Ok(chosen);
    }
    let needs_model = matches!(path, "/api/delete" | "/api/copy");
    let up: Vec<&Arc<Node>> = all.iter().filter(|n| n.is_available()).collect();
    if up.is_empty() {
        return Err(no_node_up(&shared.registry, path));
    }
    let chosen: Vec<Arc<Node>> =
        up.into_iter().filter(|n| !needs_model || model.is_none_or(|m| n.serves(m) != Some(false))).cloned().collect();
    match model {
        Some(m) if chosen.is_empty() => Err(BrokerError::model_not_found(m)),
        _ => Ok(chosen),
    }
}
/// `/api/pull`, `/api/delete`, `/api/copy`, `/api/create` (and blob uploads, `blob`) on several
/// nodes at once. Streamed operations (pull and create, unless `"stream": false`) interleave
/// every node's progress lines as they come, each tagged with `"node"`, and end with one
/// summary line. The 200 and the stream start only once some node is at work (its first
/// progress line): an operation no node could start is one JSON error with its own status
/// (503 `no_node_reachable` when no node could be reached: nothing was done anywhere). Each
/// node's part runs on the broker's task tracker, so shutdown waits for it within the drain
/// bound. The request's record (`trace`, taken here) says `ok` only when every node succeeded,
/// and lists each node that failed with why.
///
/// At most `queue.max_model_ops` operations run at once; more wait up to `wait`, then 503
/// `queue_timeout`. The client's `Origin` goes to the nodes, so their own Ollama origin check
/// still sees who asked.
pub(super) async fn model_op(
    shared: &Shared,
    op: ModelOp<'_>,
    body: Bytes,
    trace: &mut Option<Trace>,
) -> Result<Response, BrokerError> {
    let ModelOp { method, path, headers, model, wait } = op;
    if path.starts_with("/api/blobs/") {
        return blob(shared, method, path, headers, body, wait).await;
    }
    let nodes = targets(shared, path, headers, model)?;
    let limit = shared.config().queue.max_model_ops;
    let waited = tokio::time::Instant::now();
    let slot = tokio::time::timeout(wait, shared.model_ops.enter(limit))
        .await
        .map_err(|_| BrokerError::QueueTimeout { waited_ms: waited.elapsed().as_millis() as u64 })?;
    let slot = Arc::new(slot);
    let streamed = matches!(path, "/api/pull" | "/api/create")
        && serde_json::from_slice::<Value>(&body).ok().and_then(|v| v.get("stream").and_then(Value::as_bool))
            != Some(false);
    let origin = headers.get(http::header::ORIGIN).cloned();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(String, NodeEvent)>(64);
    for node in &nodes {
        let (client, node, tx, body, method) =
            (shared.client.clone(), Arc::clone(node), tx.clone(), body.clone(), method.clone());
        let (target, origin, slot, recent) =
            (Upstream::node(&node).url(path), origin.clone(), Arc::clone(&slot), Arc::clone(&shared.recent));
        shared.tasks.spawn(async move {
            let name = node.name().to_string();
            let mut request = client.request(method, target).header("content-type", "application/json").body(body);
            if let Some(o) = origin {
                request = request.header(http::header::ORIGIN, o);
            }
            let event = match request.send().await {
                Err(e) => NodeEvent::Done(not_sent(&e)),
                Ok(resp) => relay_lines(&name, resp, &tx).await,
            };
            if matches!(event, NodeEvent::Done(Ended { error: None, .. })) {
                // The node's model list changed: learn it now, not at the next deep probe, and
                // let the next `/api/tags` ask again.
                crate::health::probe_deep(&client, &node, Duration::from_secs(5)).await;
                recent.clear();
            }
            let _ = tx.send((name, event)).await;
            drop(slot);
        });
    }
    drop(tx);
    let op = op_name(path);
    let early = if streamed { until_at_work(&mut rx, nodes.len()).await } else { Vec::new() };
    if streamed && early.iter().any(|(_, e)| matches!(e, NodeEvent::Line(_))) {
        let stream = progress(early, rx, nodes.len(), op, trace.take());
        let mut r = Response::new(axum::body::Body::from_stream(stream));
        r.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/x-ndjson"));
        return Ok(r);
    }
    let results = collected(early, rx).await;
    let r = answer(&results, op);
    judge(trace.take(), &results, r.status().as_u16());
    Ok(r)
}

/// What a model operation is, as the request said it.
pub(super) struct ModelOp<'a> {
    pub method: &'a Method,
    pub path: &'a str,
    pub headers: &'a HeaderMap,
    pub model: Option<&'a str>,
    pub wait: Duration,
}

/// The events of the first moments of a streamed operation: up to the first progress line of
/// any node, or every node's end when none sends one.
async fn until_at_work(rx: &mut NodeEvents, total: usize) -> Vec<(String, NodeEvent)> {
    let mut early = Vec::new();
    let mut ended = 0;
    while ended < total {
        let Some((node, event)) = rx.recv().await else { break };
        let line = matches!(event, NodeEvent::Line(_));
        ended += usize::from(!line);
        early.push((node, event));
        if line {
            break;
        }
    }
    early
}

/// How a node's part ended when its request could not be sent: "connection refused" (nothing
/// reached the node), or how the exchange broke.
fn not_sent(e: &reqwest::Error) -> Ended {
    let why = crate::upstream::root_cause(e);
    // "Connection refused (os error 111)" -> "connection refused": a person's words.
    let why = why.split(" (os error").next().unwrap_or(&why).trim();
    let mut chars = why.chars();
    let why = chars.next().map(|c| c.to_lowercase().chain(chars).collect::<String>()).unwrap_or_default();
    if e.is_connect() {
        let why = if e.is_timeout() { "no connection within the connect timeout".to_string() } else { why };
        return Ended { status: 503, error: Some(why), reached: false };
    }
    Ended { status: 502, error: Some(format!("cannot reach node: {why}")), reached: true }
}

/// `HEAD|POST /api/blobs/:digest`: sent to the nodes a following `/api/create` goes to (those in
/// `X-Corral-Node`, else every available node), so each has the blob the create names. Answered
/// as Ollama does only when every node agrees: HEAD 200 when all hold it, else 404 (the client
/// then uploads, and nodes that hold it already answer 200); POST 201 (200 when every node had
/// it). A node that fails is named, as for the other model operations.
async fn blob(
    shared: &Shared,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    body: Bytes,
    wait: Duration,
) -> Result<Response, BrokerError> {
    let nodes = targets(shared, "/api/create", headers, None)?;
    let waited = tokio::time::Instant::now();
    let _slot = tokio::time::timeout(wait, shared.model_ops.enter(shared.config().queue.max_model_ops))
        .await
        .map_err(|_| BrokerError::QueueTimeout { waited_ms: waited.elapsed().as_millis() as u64 })?;
    let content_type = headers.get(http::header::CONTENT_TYPE).cloned();
    let asks = nodes.iter().map(|node| {
        let mut request = shared.client.request(method.clone(), Upstream::node(node).url(path)).body(body.clone());
        if let Some(t) = &content_type {
            request = request.header(http::header::CONTENT_TYPE, t.clone());
        }
        async move {
            let ended = match request.send().await {
                Err(e) => not_sent(&e),
                Ok(r) if r.status().is_success() => Ended { status: r.status().as_u16(), error: None, reached: true },
                Ok(r) => {
                    let status = r.status().as_u16();
                    let text = crate::upstream::read_small(r, Duration::from_secs(2)).await;
                    let error = native_error(text.as_bytes())["error"].as_str().unwrap_or_default().to_string();
                    let error = Some(if error.is_empty() { format!("HTTP {status}") } else { error });
                    Ended { status, error, reached: true }
                }
            };
            (node.name().to_string(), ended)
        }
    });
    let results: Results = futures_util::future::join_all(asks).await.into_iter().collect();
    let digest = path.trim_start_matches("/api/blobs/");
    let all_ok = results.values().all(|e| e.error.is_none());
    if *method == Method::HEAD {
        if all_ok {
            return Ok(http::StatusCode::OK.into_response());
        }
        if results.values().all(|e| e.error.is_none() || e.status == 404) {
            let error = json!({ "error": format!("blob \"{digest}\" not found") });
            return Ok((http::StatusCode::NOT_FOUND, axum::Json(error)).into_response());
        }
    }
    if all_ok {
        let created = results.values().any(|e| e.status == 201);
        return Ok(if created { http::StatusCode::CREATED } else { http::StatusCode::OK }.into_response());
    }
    Ok(answer(&results, op_name(path)))
}

type NodeEvents = tokio::sync::mpsc::Receiver<(String, NodeEvent)>;

/// How one node's part ended: its HTTP status, the node's own words when it failed, and
/// whether the request reached it at all (`false`: nothing was done there).
#[derive(Debug, Clone)]
struct Ended {
    status: u16,
    error: Option<String>,
    reached: bool,
}

impl Ended {
    /// The failure as the final line says it: "node gpu1 is down: connection refused" when the
    /// node could not be reached, else "gpu1: <the node's words>".
    fn said(&self, node: &str) -> Option<String> {
        let e = self.error.as_deref()?;
        Some(if self.reached { format!("{node}: {e}") } else { format!("node {node} is down: {e}") })
    }
}

type Results = BTreeMap<String, Ended>;

/// The operation's name in the final line ("pull failed on 1 of 3 nodes: ...").
fn op_name(path: &str) -> &'static str {
    match path {
        "/api/pull" => "pull",
        "/api/create" => "create",
        "/api/copy" => "copy",
        "/api/delete" => "delete",
        _ => "blob upload",
    }
}

/// Every node's progress lines as they come (`early` first: what arrived before the answer
/// started), each tagged with its node, then one final line; the record is judged with it.
///
/// Clients stop reading at the first line that has `error` (ollama-py and ollama-js raise it,
/// Go's client returns it) or `status: "success"` (ollama-js), so only the final line may say
/// either: a node's own end is `"status": "node n0: success"` (or `"... failed: <why>"`, the
/// reason also in `node_error`), never `error` or `success` on its own.
fn progress(
    early: Vec<(String, NodeEvent)>,
    rx: NodeEvents,
    total: usize,
    op: &'static str,
    trace: Option<Trace>,
) -> impl futures_util::Stream<Item = Result<Bytes, std::convert::Infallible>> {
    let state = (std::collections::VecDeque::from(early), rx, Results::new(), trace);
    futures_util::stream::unfold(state, move |(mut early, mut rx, mut done, mut trace)| async move {
        if done.len() == total {
            return None;
        }
        let (node, event) = match early.pop_front() {
            Some(e) => e,
            None => rx.recv().await?,
        };
        let out = match event {
            NodeEvent::Line(mut v) => {
                if let Some(obj) = v.as_object_mut() {
                    obj.insert("node".into(), Value::String(node));
                }
                format!("{v}\n")
            }
            NodeEvent::Done(ended) => {
                let line = match (&ended.error, ended.reached) {
                    (None, _) => json!({ "status": format!("node {node}: success"), "node": node }),
                    (Some(e), false) => {
                        json!({ "status": format!("node {node} is down: {e}"), "node": node, "node_error": e })
                    }
                    (Some(e), true) => {
                        json!({ "status": format!("node {node}: failed: {e}"), "node": node, "node_error": e })
                    }
                };
                done.insert(node, ended);
                if done.len() == total {
                    judge(trace.take(), &done, 200);
                    format!("{line}\n{}\n", summary(&done, op))
                } else {
                    format!("{line}\n")
                }
            }
        };
        Some((Ok(Bytes::from(out)), (early, rx, done, trace)))
    })
}

/// The one final answer of a model operation, in Ollama's shape: `{"status": "success"}` when
/// every node succeeded, else `{"error": "<op> failed on k of n nodes: <node>: <why>; ..."}`
/// (a string, as clients expect). Per-node results ride in `nodes`, a field clients ignore.
fn summary(done: &Results, op: &str) -> Value {
    let nodes: serde_json::Map<String, Value> = done
        .iter()
        .map(|(n, e)| {
            let v = match &e.error {
                None => json!({ "status": "success" }),
                Some(why) => json!({ "status": "failed", "http_status": e.status, "error": why, "reached": e.reached }),
            };
            (n.clone(), v)
        })
        .collect();
    let failed: Vec<String> = done.iter().filter_map(|(n, e)| e.said(n)).collect();
    if failed.is_empty() {
        return json!({ "status": "success", "nodes": nodes });
    }
    let error = format!("{op} failed on {} of {} nodes: {}", failed.len(), done.len(), failed.join("; "));
    json!({ "error": error, "code": failure_code(done), "nodes": nodes })
}

/// `no_node_reachable` when no node was reached (nothing was done anywhere), else
/// `upstream_failed`.
fn failure_code(done: &Results) -> &'static str {
    if done.values().all(|e| !e.reached) {
        BrokerError::NoNodeReachable { detail: String::new() }.code()
    } else {
        BrokerError::UpstreamFailed { attempts: 0, detail: String::new() }.code()
    }
}

/// Every node's end of a non-streamed model operation (`early`: events already taken).
async fn collected(early: Vec<(String, NodeEvent)>, mut rx: NodeEvents) -> Results {
    let mut results = Results::new();
    for (node, event) in early {
        if let NodeEvent::Done(ended) = event {
            results.insert(node, ended);
        }
    }
    while let Some((node, event)) = rx.recv().await {
        if let NodeEvent::Done(ended) = event {
            results.insert(node, ended);
        }
    }
    results
}

/// One JSON answer for a fanned-out operation: success; 503 `no_node_reachable` (with
/// `X-Corral-Forwarded: false`) when no node could be reached; the nodes' own client error when
/// every node gave the same one (say, 404 model not found); else 502 naming who failed and why.
fn answer(results: &Results, op: &str) -> Response {
    let failed: Vec<&Ended> = results.values().filter(|e| e.error.is_some()).collect();
    if failed.is_empty() {
        return axum::Json(summary(results, op)).into_response();
    }
    if failed.len() == results.len() && failed.iter().all(|e| !e.reached) {
        let refused = BrokerError::NoNodeReachable { detail: String::new() };
        let mut body = summary(results, op);
        body["forwarded"] = json!(false);
        let mut r = (refused.status(), axum::Json(body)).into_response();
        r.headers_mut().insert("x-corral-forwarded", http::HeaderValue::from_static("false"));
        r.headers_mut().insert(http::header::RETRY_AFTER, http::HeaderValue::from(1));
        return r;
    }
    let statuses: std::collections::BTreeSet<u16> = failed.iter().map(|e| e.status).collect();
    if failed.len() == results.len() && statuses.len() == 1 && statuses.iter().all(|s| (400..500).contains(s)) {
        let status = http::StatusCode::from_u16(failed[0].status).unwrap_or(http::StatusCode::BAD_REQUEST);
        return (status, axum::Json(json!({ "error": failed[0].error }))).into_response();
    }
    let e = BrokerError::UpstreamFailed { attempts: results.len() as u32, detail: String::new() };
    (e.status(), axum::Json(summary(results, op))).into_response()
}

/// A model operation's record: one attempt per node, each node that failed with why (its
/// outcome `connect_failed` when the request never reached it), `ok` only when every node
/// succeeded. `http` is the status the client got (200 for a stream, whatever its end said).
fn judge(trace: Option<Trace>, results: &Results, http: u16) {
    let Some(mut t) = trace else { return };
    t.row.attempts = results.len() as i64;
    let succeeded: Vec<&String> = results.iter().filter(|(_, e)| e.error.is_none()).map(|(n, _)| n).collect();
    if let [only] = succeeded.as_slice() {
        t.row.node = Some((*only).clone());
    }
    t.row.failed_attempts = results
        .iter()
        .filter_map(|(n, e)| {
            let outcome = if e.reached { "failed" } else { "connect_failed" };
            Some(crate::store::FailedAttempt { node: n.clone(), outcome: outcome.into(), detail: e.error.clone()? })
        })
        .collect();
    if t.row.failed_attempts.is_empty() {
        t.finish("ok", Some(http), None);
        return;
    }
    let status = if (400..500).contains(&http) { "client_error" } else { "error" };
    t.finish(status, Some(http), Some(failure_code(results)));
}

/// What one node's part of a model operation produced.
enum NodeEvent {
    Line(Value),
    Done(Ended),
}

/// Pass a node's NDJSON progress lines on; the final event says how it ended.
async fn relay_lines(
    node: &str,
    resp: reqwest::Response,
    tx: &tokio::sync::mpsc::Sender<(String, NodeEvent)>,
) -> NodeEvent {
    let status = resp.status().as_u16();
    let ended = |status, error| NodeEvent::Done(Ended { status, error, reached: true });
    let mut stream = resp.bytes_stream();
    let mut buf: Vec<u8> = Vec::new();
    let mut error = None;
    // A node's `error` line is its verdict (kept for the final line, as a string whatever shape
    // the node gave it); its own `success` line is reported by the `Done` event instead.
    let handle = |line: &[u8], error: &mut Option<String>| -> Option<Value> {
        let v: Value = serde_json::from_slice(line).ok()?;
        if v.get("error").is_some_and(|e| !e.is_null()) {
            *error = native_error(line)["error"].as_str().map(str::to_string);
            return None;
        }
        (v.get("status").and_then(Value::as_str) != Some("success")).then_some(v)
    };
    loop {
        // A client that went away ends the node's part at once, even while the node is quiet:
        // dropping the request is how Ollama learns to stop (a pull runs under its context).
        let next = tokio::select! {
            next = stream.next() => next,
            _ = tx.closed() => return ended(499, Some("client went away".into())),
        };
        match next {
            Some(Ok(chunk)) => {
                buf.extend_from_slice(&chunk);
                while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=pos).collect();
                    if let Some(v) = handle(&line, &mut error) {
                        if tx.send((node.to_string(), NodeEvent::Line(v))).await.is_err() {
                            return ended(499, Some("client went away".into()));
                        }
                    }
                }
            }
            Some(Err(e)) => return ended(502, Some(format!("stream broke: {}", e.without_url()))),
            None => break,
        }
    }
    if !buf.iter().all(u8::is_ascii_whitespace) {
        if let Some(v) = handle(&buf, &mut error) {
            let _ = tx.send((node.to_string(), NodeEvent::Line(v))).await;
        }
    }
    if !(200..300).contains(&status) && error.is_none() {
        error = Some(format!("HTTP {status}"));
    }
    if (200..300).contains(&status) && error.is_some() {
        // Ollama streams a failure after its 200 (`streamResponse`): the node still failed.
        return ended(500, error);
    }
    ended(status, error)
}
