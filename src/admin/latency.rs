//! `/admin/latency`: the latency test. With a model, time to first token on each node: a
//! streamed one-token generation (`num_predict` 1, or `max_tokens` 1 on an OpenAI-compatible
//! node) timed to its first content chunk, so a model that must load first shows its load time,
//! as a client would meet it. Without one, a plain reachability ping (the liveness probe).
//!
//! A failed test says why in the probe's words ("connection refused at http://...", "timed out
//! after 60000 ms at ...", "HTTP 404 at ...: model ..."). The last result per node and model is
//! kept in memory with the unix ms it was taken (`at`), so the UI shows its age and any screen
//! or tab sees the same grid; a broker restart forgets them. The UI's Nodes "Test" button is
//! the same test without a model (`POST /admin/nodes/{name}/test`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::{parse, AdminError, AdminState};
use crate::config::redacted_url;
use crate::node::Node;
use crate::upstream::Upstream;

/// Longest wait for a first token: a model may have to load from disk first.
const FIRST_TOKEN_TIMEOUT: Duration = Duration::from_secs(60);

/// One test's result. `model` is `None` for a ping.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Measured {
    pub node: String,
    pub model: Option<String>,
    /// `ttft` (time to first token of `model`) or `ping` (the liveness probe).
    pub kind: &'static str,
    pub ok: bool,
    /// Time to first token, or the ping's round trip (ms); of a failure, how long it took to fail.
    pub ms: f64,
    /// When the answer's head came (ms), for a first-token test that got one.
    pub head_ms: Option<f64>,
    pub timeout_ms: u64,
    /// Why it failed, in the probe's words; `None` when ok.
    pub error: Option<String>,
    /// Unix ms it was taken.
    pub at: i64,
}

/// The last result per (node, model), `""` for the ping.
#[derive(Debug, Clone, Default)]
pub struct Latencies(Arc<Mutex<BTreeMap<(String, String), Measured>>>);

impl Latencies {
    fn keep(&self, m: &Measured) {
        let key = (m.node.clone(), m.model.clone().unwrap_or_default());
        self.0.lock().unwrap_or_else(|p| p.into_inner()).insert(key, m.clone());
    }

    fn all(&self) -> Vec<Measured> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect()
    }
}

/// Test `node` (a first token of `model`, or a ping without one) and keep the result.
pub(super) async fn measure(s: &AdminState, node: &Node, model: Option<&str>) -> Measured {
    let client = &s.shared.client;
    let url = redacted_url(&node.config.url);
    let started = tokio::time::Instant::now();
    let (timeout, got) = match model {
        Some(m) => {
            let got = Upstream::node(node).first_token(client, m, FIRST_TOKEN_TIMEOUT).await;
            (FIRST_TOKEN_TIMEOUT, got.map(|t| (t.first_token_ms, Some(t.head_ms))))
        }
        None => {
            let timeout = Duration::from_millis(s.shared.config().health.timeout_ms.max(1_000));
            let got = Upstream::node(node).liveness(client, timeout).await;
            (timeout, got.map(|()| (started.elapsed().as_secs_f64() * 1000.0, None)))
        }
    };
    let m = Measured {
        node: node.name().to_string(),
        model: model.map(crate::config::normalize_model),
        kind: if model.is_some() { "ttft" } else { "ping" },
        ok: got.is_ok(),
        ms: got.as_ref().map_or_else(|_| started.elapsed().as_secs_f64() * 1000.0, |(ms, _)| *ms),
        head_ms: got.as_ref().ok().and_then(|(_, h)| *h),
        timeout_ms: timeout.as_millis() as u64,
        error: got.err().map(|e| e.at(&url)),
        at: crate::store::now_ms(),
    };
    s.latency.keep(&m);
    m
}

/// `GET /admin/latency`: every kept result, with its age on the broker's clock (`age_ms`).
pub(super) async fn list(State(s): State<AdminState>) -> Json<serde_json::Value> {
    let now = crate::store::now_ms();
    let rows: Vec<serde_json::Value> = s
        .latency
        .all()
        .into_iter()
        .map(|m| {
            let age = (now - m.at).max(0);
            let mut v = serde_json::json!(m);
            v["age_ms"] = age.into();
            v
        })
        .collect();
    Json(serde_json::json!({ "now": now, "results": rows }))
}

/// The body of `POST /admin/latency`; every field may be left out.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = LatencyRequest)]
pub(super) struct Ask {
    /// Models to time; none: a ping of each node.
    #[serde(default)]
    models: Vec<String>,
    /// Nodes to test; none: every node (for a model, every node that may have it).
    #[serde(default)]
    nodes: Vec<String>,
}

/// `POST /admin/latency`: test each node (concurrently; one model after another on a node, so
/// the tests do not queue behind each other) and answer the new results.
pub(super) async fn run(
    State(s): State<AdminState>,
    body: axum::body::Bytes,
) -> Result<Json<Vec<Measured>>, AdminError> {
    let ask: Ask = if body.is_empty() { Ask::default() } else { parse(&body)? };
    let all = s.shared.registry.all();
    let mut nodes: Vec<Arc<Node>> = Vec::new();
    for name in &ask.nodes {
        let node = all.iter().find(|n| n.name() == name);
        nodes.push(Arc::clone(node.ok_or_else(|| AdminError::NotFound { kind: "node", name: name.clone() })?));
    }
    let named = !nodes.is_empty();
    if !named {
        nodes = all.iter().cloned().collect();
    }
    let models: Vec<Option<String>> =
        if ask.models.is_empty() { vec![None] } else { ask.models.iter().cloned().map(Some).collect() };
    let per_node = nodes.iter().map(|node| {
        let (s, models) = (&s, &models);
        async move {
            let mut out = Vec::new();
            for m in models {
                // Unasked, a node that does not list the model is left out (it would say 404).
                if !named && m.as_deref().is_some_and(|m| node.serves(m) == Some(false)) {
                    continue;
                }
                out.push(measure(s, node, m.as_deref()).await);
            }
            out
        }
    });
    Ok(Json(futures_util::future::join_all(per_node).await.into_iter().flatten().collect()))
}
