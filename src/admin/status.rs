//! The broker as a whole: `GET /healthz` (liveness, public), `GET /admin/status` (nodes, recent
//! stats, queue, categories, reload outcome, fallback share, the store's engine and writes: what
//! the UI's overview shows),
//! `GET /help` (a self-description for clients and agents with no docs at hand), `GET /metrics`
//! (OpenMetrics text) and `/admin/accepting` (pause and resume: paused, new requests get 503
//! `paused` while running ones finish).

use std::collections::BTreeMap;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::header;
use serde::Deserialize;
use serde_json::{json, Value};

use super::nodes::node_json;
use super::{parse, AdminError, AdminState};
use crate::store::RequestRow;

pub(super) async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

pub(super) async fn status(State(s): State<AdminState>) -> Json<Value> {
    let nodes: Vec<Value> = s.shared.registry.all().iter().map(|n| node_json(n)).collect();
    let config = s.shared.config();
    let (share, requests) = s.shared.telemetry.fallback_share();
    let stats = recent_stats(&s).await;
    Json(json!({
        "nodes": nodes,
        "stats": stats,
        "queue": { "depth": s.shared.admission.depth(), "bytes": s.shared.admission.queued_bytes(), "max_requests": config.queue.max_requests, "max_bytes": config.queue.max_bytes },
        "read_ahead": { "bytes": s.shared.read_ahead_use().0, "max_bytes": s.shared.read_ahead_use().1, "per_stream_bytes": config.proxy.stream_buffer_bytes },
        "categories": config.categories,
        "reload": *s.shared.reload.lock().unwrap_or_else(|p| p.into_inner()),
        "accepting": s.shared.accepting(),
        "capacity": capacity(&s),
        "connect": connect(&s),
        // Engine, where, what waits to be written, drops, and the last write error while writes fail.
        "store": s.shared.telemetry.store().map(crate::store::Store::status),
        // With a fleet: this broker's name, whether it is the keeper, live brokers, last contact.
        "fleet": s.fleet.as_ref().map(|f| f.status()),
        // Names and last use only: a key's value never leaves the keyring through the API.
        "client_keys": s.shared.client_keys.info(),
        "fallback": {
            "share": share,
            "requests": requests,
            "window_ms": config.alerts.fallback_window_ms,
            "alert_share": config.alerts.fallback_share,
            "providers": config.providers.iter().map(|p| json!({ "name": p.name, "base_url": crate::config::redacted_url(&p.base_url), "secret": p.secret })).collect::<Vec<_>>(),
        },
    }))
}

/// Per node (and `cluster`), over the last 15 minutes from the store: requests, latency
/// p50/p95, time to first byte p50, and tokens/s (output tokens / generation time,
/// `crate::charts::generation`). What the UI's cards show beside the live state.
async fn recent_stats(s: &AdminState) -> Value {
    let Some(store) = s.shared.telemetry.store() else { return json!({}) };
    let now_ms = (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64;
    let query = crate::store::Query { since_ms: Some(now_ms - 15 * 60_000), limit: Some(20_000), ..Default::default() };
    let Ok(rows) = store.requests(&query).await else { return json!({}) };
    let mut groups: BTreeMap<String, Vec<&RequestRow>> = BTreeMap::new();
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
    Value::Object(groups.iter().map(|(k, v)| (k.clone(), summarize(v))).collect())
}

/// One group's numbers for `recent_stats`.
fn summarize(rows: &[&RequestRow]) -> Value {
    let mut total: Vec<f64> = rows.iter().filter_map(|r| r.total_ms).map(|v| v as f64).collect();
    let mut ttfb: Vec<f64> = rows.iter().filter_map(|r| r.ttfb_ms).map(|v| v as f64).collect();
    total.sort_by(f64::total_cmp);
    ttfb.sort_by(f64::total_cmp);
    let pct = |v: &[f64], p: f64| (!v.is_empty()).then(|| crate::charts::percentile(v, p));
    json!({
        "requests": rows.len(),
        "errors": rows.iter().filter(|r| r.status == "error" || r.status == "interrupted").count(),
        "p50_ms": pct(&total, 50.0),
        "p95_ms": pct(&total, 95.0),
        "ttfb_p50_ms": pct(&ttfb, 50.0),
        // The one definition the charts use too: output tokens / generation time.
        "tokens_per_s": crate::charts::tokens_per_s(rows.iter().copied()),
    })
}

pub(super) async fn metrics(State(s): State<AdminState>) -> Response {
    let text = s.shared.telemetry.render(&s.shared.registry, s.shared.admission.depth());
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text).into_response()
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct Accepting {
    accepting: bool,
}

pub(super) async fn get_accepting(State(s): State<AdminState>) -> Json<Value> {
    Json(json!({ "accepting": s.shared.accepting() }))
}

/// Pause (`{"accepting": false}`) or resume the broker: paused, new requests get 503 `paused`
/// while running ones finish.
pub(super) async fn put_accepting(
    State(s): State<AdminState>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, AdminError> {
    let a: Accepting = parse(&body)?;
    s.shared.set_accepting(a.accepting);
    Ok(Json(json!({ "accepting": s.shared.accepting() })))
}

/// What can take requests now: the nodes that serve (up, recovering or not probed yet: not
/// disabled, draining or down) and their slots. `none`: every request waits, then gets 503;
/// the UI's banner and `corral status` say so.
fn capacity(s: &AdminState) -> Value {
    use crate::node::NodeState::{Healthy, Recovering, Unknown};
    let nodes = s.shared.registry.all();
    let serving: Vec<_> = nodes.iter().filter(|n| matches!(n.state(), Healthy | Recovering | Unknown)).collect();
    json!({
        "serving_nodes": serving.len(),
        "slots": serving.iter().map(|n| n.slots()).sum::<usize>(),
        "none": serving.is_empty(),
    })
}

/// A self-description for clients (and agents) that have no docs at hand.
/// Where to point a client, ready to copy: the first listener's Ollama and `/v1` URLs, the
/// `OLLAMA_HOST` line, every listener, and whether the nodes are simulated.
fn connect(s: &AdminState) -> Value {
    let (urls, demo) = s.shared.front();
    let first = urls.first().cloned().unwrap_or_default();
    json!({
        "ollama": first,
        "openai": format!("{first}/v1"),
        "env": format!("OLLAMA_HOST={first}"),
        "listeners": urls,
        "demo": demo,
        // Ready to paste and run: a first request through the official Ollama and OpenAI
        // Python clients and curl.
        "snippets": snippets(&first, &snippet_model(s), !s.shared.config().listeners.first().is_none_or(|l| l.api_keys.is_empty())),
        // Where UI edits are written; null: they last until the broker stops.
        "config_file": s.shared.config_file().map(|p| p.display().to_string()),
    })
}

/// The model the snippets ask: the first chat model a node serves, shown as a user types it.
fn snippet_model(s: &AdminState) -> String {
    snippet_model_of(s.shared.registry.all().iter().filter_map(|n| n.models()).flatten())
}

/// Names come from the nodes, and a snippet is pasted into a shell: only a plain model name
/// is used (Ollama's own characters), so a node that lies cannot put a command in the user's
/// terminal. Embedding models come last: they would answer a chat snippet with an error.
fn snippet_model_of(names: impl Iterator<Item = String>) -> String {
    let plain = |m: &String| {
        !m.is_empty() && m.len() <= 128 && m.bytes().all(|b| b.is_ascii_alphanumeric() || b"._:/-".contains(&b))
    };
    let names: Vec<String> = names.filter(plain).collect();
    let found = names.iter().find(|m| !m.contains("embed")).or(names.first());
    found.map_or_else(|| "llama3.2".to_string(), |m| m.strip_suffix(":latest").unwrap_or(m).to_string())
}

/// A first request to `url` for `model` as the official `ollama` and `openai` Python clients
/// and curl make it; `keyed`: the listener wants a client key, read from `CORRAL_API_KEY`.
fn snippets(url: &str, model: &str, keyed: bool) -> Value {
    let ask = r#"[{"role": "user", "content": "Why is the sky blue?"}]"#;
    let (import, ollama_auth, openai_key, curl_auth) = if keyed {
        (
            "import os\n",
            r#", headers={"Authorization": "Bearer " + os.environ["CORRAL_API_KEY"]}"#,
            r#"os.environ["CORRAL_API_KEY"]"#,
            r#" -H "Authorization: Bearer $CORRAL_API_KEY""#,
        )
    } else {
        ("", "", r#""corral""#, "")
    };
    json!({
        "python": format!("{import}from ollama import Client\n\nclient = Client(host=\"{url}\"{ollama_auth})\nreply = client.chat(model=\"{model}\", messages={ask})\nprint(reply.message.content)\n"),
        "openai": format!("{import}from openai import OpenAI\n\nclient = OpenAI(base_url=\"{url}/v1\", api_key={openai_key})\nreply = client.chat.completions.create(model=\"{model}\", messages={ask})\nprint(reply.choices[0].message.content)\n"),
        "curl": format!("curl {url}/api/chat{curl_auth} -d '{{\"model\": \"{model}\", \"messages\": {ask}, \"stream\": false}}'\n"),
    })
}

/// The proxy part of `/help`: its listeners, endpoints and the APIs it speaks.
fn proxy_help(config: &crate::config::Config) -> Value {
    json!({
        "listeners": config.listeners,
        // From the table the proxy dispatches by: "METHOD /path: what it does".
        "endpoints": crate::proxy::routes::ROUTES.iter().map(|r| format!("{} {}: {}", r.method, r.path, r.summary)).collect::<Vec<_>>(),
        "apis": crate::proxy::discover::APIS,
    })
}

/// The admin part of `/help`, from the one route table.
fn admin_help(config: &crate::config::Config) -> Value {
    let (public, protected): (Vec<&super::Route>, Vec<&super::Route>) =
        super::ROUTES.iter().partition(|r| r.access == super::Access::Public);
    let line = |r: &&super::Route| format!("{} {}", r.method, r.path);
    json!({
        "addr": config.admin.addr,
        "auth": format!(
            "Authorization: Bearer <token> on every route but {} (?token= is accepted where headers cannot be set, like EventSource)",
            public.iter().map(line).collect::<Vec<_>>().join(", ")
        ),
        "endpoints": super::ROUTES.iter().map(|r| line(&r)).collect::<Vec<_>>(),
        "protected": protected.len(),
        "notes": {
            "/admin/requests": "?since=&node=&category=&status=&model=&id=&before=&limit= (newest first; total, more, next_before)",
            "/admin/requests/summary": "?range=1h&by=model|node",
            "/admin/config/import": "?mode=merge|replace&dry_run=true",
            "/admin/events": "SSE: node_state, request, config_reload, fallback_share",
            "/admin/charts/series": "?range=5m|15m|1h|24h: every chart's numbers per bucket, per node and cluster-wide (JSON)",
            "/admin/charts/{file}": "{latency|ttfb|throughput|outcomes|queue|health}.svg?window=15m",
        },
    })
}

pub(super) async fn help(State(s): State<AdminState>) -> Json<Value> {
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
        // The version of this document's shape, apart from Corral's: a client reading `/help`
        // needs to change only when it changes.
        "help_schema": crate::proxy::discover::HELP_SCHEMA,
        "openapi": "/openapi.json",
        "what": "One endpoint in front of a cluster of Ollama nodes: speaks the Ollama API and the OpenAI-compatible /v1 API, picks a node per request, fails over, and queues fairly.",
        "proxy": proxy_help(&config),
        "admin": admin_help(&config),
        "config_reload": {
            "applies": "a config file save, an admin edit or an import applies every key at once, except those below",
            "restart_keys": crate::state::RESTART_KEYS.iter().map(|(k, why)| json!({ "key": k, "why": why })).collect::<Vec<_>>(),
            "pending_restart": s.shared.reload.lock().map(|r| r.pending_restart.clone()).unwrap_or_default(),
        },
        "request_headers": {
            "X-Corral-Category": "pick a category by name; unknown names get 400 unknown_category",
            "X-Corral-Session": "sticky key for the sticky policy (keeps a conversation on the node holding its KV cache)",
            "X-Corral-Queue-Timeout": "milliseconds this request may wait for a free node (default: the category's queue_timeout_ms)",
            "X-Corral-Node": "comma-separated node names for model operations (pull, delete, copy, create)",
            "X-Request-Id": "echoed and passed to the node; recorded beside Corral's own id (X-Corral-Request-Id), never as it; the same id with the same request joins a running one",
            "Idempotency-Key": "a duplicate joins the running request or, after it, is replayed or refused with 409 duplicate_request (see each category's idempotency)",
        },
        "response_headers": {
            "X-Request-Id": "the request's id",
            "X-Corral-Node": "the node that answered",
            "X-Corral-Attempts": "how many nodes were tried",
            "X-Corral-Forwarded": "false on rejections that reached no node (safe to retry anywhere)",
            "X-Corral-Context-Warning": "the prompt fills more than 85% of the context",
            "X-Corral-Fallback": "the cloud provider that answered, when the cluster could not",
            "X-Corral-Idempotent": "attached (joined a running request) or replayed (from memory); X-Corral-First-Request-Id names the first",
            "X-Corral-Degraded": "the smaller model that answered instead (the category's degrade chain)",
            "X-Corral-Clamped": "the request limits that lowered what the request asked (num_predict=512, temperature=1)",
        },
        "categories": config.categories.iter().map(category_help).collect::<Vec<_>>(),
        "cloud_fallback": {
            "when": "no node has the model, every node tried failed before its first byte, or the queue was full or timed out; never after the first byte of a local answer",
            "never": "categories with cloud = \"never\" get 503 cloud_not_allowed (forwarded as the local failure was)",
            "all_failed": "502 cloud_failed with the local reason and each provider's",
            "providers": config.providers.iter().map(|p| json!({ "name": p.name, "base_url": crate::config::redacted_url(&p.base_url), "models": p.model_map })).collect::<Vec<_>>(),
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
        "what_a_client_may_infer": inference_help(&config),
        "errors": "JSON {error, code, forwarded}; codes in docs/errors.md. Mid-stream failures end the stream with {\"error\", \"code\"}.",
        "nodes": nodes,
    }))
}

/// What a client may and may not conclude from what it sees (the busy-light field report).
fn inference_help(config: &crate::config::Config) -> Value {
    json!({
        "status_is_a_snapshot": "what /admin/status, /api/ps or a probe shows is a snapshot, not a reservation: another request may take the slot first",
        "disconnect": "closing the connection before the node is done cancels the node's work (Corral closes its connection to the node), except for a request sent with an Idempotency-Key: that one runs to its end, so a retry with the same key joins it instead of running again; after the node is done, the rest of a streamed answer waits in Corral's read-ahead buffer and closing changes nothing upstream",
        "retry": "a rejection marked X-Corral-Forwarded: false reached no node and is safe to retry; anything else may have run: retry with the same Idempotency-Key",
        "read_ahead": { "per_stream_bytes": config.proxy.stream_buffer_bytes, "total_bytes": config.proxy.stream_buffer_total_bytes, "why": "a client slower than the node does not hold the node's slot; past the bound the node waits for the client" },
    })
}

/// How a category picks a node and when it gives up on one, in words a client can act on.
fn scheduling_help(c: &crate::config::CategoryConfig) -> Value {
    let order = match (c.affinity, c.wait_for_warm) {
        (false, _) => "no occupancy preference: the policy sees every candidate",
        (true, false) => {
            "model loaded and idle > not loaded (a cold load) > loaded but busy > loading would evict another model"
        }
        (true, true) => {
            "model loaded and idle > loaded but busy (waits for it) > not loaded > loading would evict another model"
        }
    };
    let deadline = match c.first_token_timeout_ms {
        0 => "off: a node has until proxy.first_byte_timeout_ms for its first token".to_string(),
        ms => format!("{ms} ms: with nothing sent to the client yet, a node without a first token by then is cancelled and the request goes elsewhere (one attempt of the retry budget)"),
    };
    json!({
        "policy": c.policy.name(),
        "candidate_order": order,
        "first_token_deadline": deadline,
        "slow_nodes": format!(
            "a node that misses first-token deadlines {} times in a row is marked slow (not failed: health and breaker untouched) and tried after every other candidate for {} s after its last miss, or until it answers in time",
            crate::node::SLOW_AFTER_MISSES,
            crate::node::SLOW_FOR.as_secs()
        ),
        "estimate": if c.policy == crate::config::Policy::FastestFinish { "X-Corral-Estimate-Ms: the planned time from arrival to the end (slot wait + prefill + decode + load), also in the record; a plan, re-made if the node's estimate worsens" } else { "none (only fastest-finish estimates)" },
    })
}

/// One category in `/help`: how it routes, and the rules a client meets (idempotency, limits).
fn category_help(c: &crate::config::CategoryConfig) -> Value {
    let l = &c.limits;
    let over = match l.over_limit {
        crate::config::OverLimit::Clamp => "clamped to the cap, said in X-Corral-Clamped",
        crate::config::OverLimit::Refuse => "refused with 400 over_limit; nothing sent",
    };
    let m = crate::proxy::idempotency::Limits::DEFAULT;
    let memory = format!(
        "answers kept in memory only: {} MiB each, {} MiB in all, {} keys; past a bound an answer can no longer be joined",
        m.entry_bytes >> 20,
        m.total_bytes >> 20,
        m.entries
    );
    json!({
        "name": c.name, "policy": c.policy.name(), "priority": c.priority, "queue_timeout_ms": c.queue_timeout_ms,
        "cloud": c.cloud, "providers": c.providers, "redact": c.redact, "models": c.models, "affinity": c.affinity,
        "scheduling": scheduling_help(c),
        "idempotency": {
            "window_ms": c.idempotency_window_ms,
            "while_running": if c.idempotency_window_ms > 0 { "a duplicate joins the running request and gets its whole answer" } else { "off: every request runs" },
            "after_finished": if c.replay_finished { "replayed from memory within the window" } else { "409 duplicate_request naming the first request (Idempotency-Key); X-Request-Id alone runs again" },
            "memory": memory,
        },
        "degrade": {
            "chain": c.degrade,
            "order": c.degrade_order,
            "when": format!("the requested model cannot start within the queue timeout (its nodes busy or down): the next model that starts within {} ms answers, marked X-Corral-Degraded", crate::proxy::degrade::STEP_WAIT.as_millis()),
        },
        "limits": {
            "max_predict": l.max_predict, "default_predict": l.default_predict, "max_num_ctx": l.max_num_ctx,
            "default_num_ctx": l.default_num_ctx, "max_keep_alive_s": l.max_keep_alive_s, "default_keep_alive_s": l.default_keep_alive_s,
            "temperature_min": l.temperature_min, "temperature_max": l.temperature_max,
            "over_limit": over, "zero_means": "no cap / no default",
        },
    })
}

#[cfg(test)]
mod tests {
    use super::{snippet_model_of, snippets};

    fn names(n: &[&str]) -> impl Iterator<Item = String> {
        n.iter().map(|s| s.to_string()).collect::<Vec<_>>().into_iter()
    }

    #[test]
    fn the_snippet_model_is_a_plain_chat_model_name_never_one_that_could_run_in_a_shell() {
        assert_eq!(snippet_model_of(names(&["nomic-embed-text:latest", "qwen2.5:7b"])), "qwen2.5:7b");
        assert_eq!(snippet_model_of(names(&["llama3.2:latest"])), "llama3.2");
        assert_eq!(
            snippet_model_of(names(&["nomic-embed-text:latest"])),
            "nomic-embed-text",
            "only embeddings: still a name it serves"
        );
        // A node that lies about its models cannot break out of the curl snippet's quotes.
        assert_eq!(snippet_model_of(names(&["x'; rm -rf ~ #", "a\"b", "$(id)"])), "llama3.2");
        assert_eq!(snippet_model_of(names(&[])), "llama3.2");
    }

    #[test]
    fn a_keyed_listener_gets_snippets_that_send_the_key_from_the_environment() {
        let open = snippets("http://127.0.0.1:11434", "llama3.2", false);
        let keyed = snippets("http://127.0.0.1:11434", "llama3.2", true);
        for k in ["python", "openai", "curl"] {
            let (o, s) = (open[k].as_str().unwrap_or_default(), keyed[k].as_str().unwrap_or_default());
            assert!(!o.contains("CORRAL_API_KEY"), "{o}");
            assert!(s.contains("CORRAL_API_KEY"), "{k}: {s}");
        }
        assert!(keyed["curl"].as_str().unwrap_or_default().contains(r#"-H "Authorization: Bearer $CORRAL_API_KEY""#));
    }
}
