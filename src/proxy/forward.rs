//! Forwarding one request: pick a node, send, fail over before the first byte, relay after it.
//!
//! The rule that keeps clients safe (pingora's failover guide): a request may be retried on
//! another node only while nothing has gone to the client. So an attempt is judged in two
//! phases:
//! 1. Until the first byte of the answer's body: connect errors, 5xx, and timeouts are
//!    retryable (full-jitter exponential backoff, bounded attempts, a node is not tried twice
//!    unless it is the only one). A node's 503 "server busy" is retried elsewhere but is not a
//!    node failure. 4xx passes through untouched.
//! 2. After it: the answer goes to `relay`, which passes it on chunk by chunk and judges the
//!    exchange once when it ends.
//!
//! How to reach the node in its dialect (URL, translation, timeouts) is `upstream`'s; this
//! module decides only what an attempt's result means for the retry loop.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::Response;
use http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use tokio::time::Instant;

use super::relay::{self, Source};
use super::resume::{self, Resume};
use crate::admit::Ticket;
use crate::config::{Config, Origin};
use crate::error::BrokerError;
use crate::node::{InFlight, Node};
use crate::outcome::Outcome;
use crate::state::Shared;
use crate::telemetry::Trace;
use crate::upstream::assemble::{self, AssembleError};
use crate::upstream::client::NodeRequest;
use crate::upstream::openai::{self, Plan};
use crate::upstream::translate::{native_error, Reply};
use crate::upstream::{self, Answer, SendError, Upstream};

/// Everything about the client's request that an attempt needs.
#[derive(Debug, Clone)]
pub struct Outbound {
    pub method: Method,
    pub path_and_query: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub model: Option<String>,
    pub category: String,
    pub priority: u32,
    pub origin: Origin,
    pub session: Option<String>,
    pub request_id: String,
    pub queue_timeout: Duration,
    /// The body's own `stream`, when it says.
    pub stream: Option<bool>,
    /// Whether a cloud provider may answer when no node can (see `Ticket::has_alternative`).
    pub has_alternative: bool,
    /// The client speaks HTTP/1 (0.9 to 1.1), whose connection pulls a streamed body ahead on
    /// its own for a while: read-ahead may start late (`readahead`).
    pub http1: bool,
}

/// Why one attempt did not produce a response for the client.
#[derive(Debug)]
struct AttemptFailed {
    outcome: Outcome,
    detail: String,
}

/// Send `out` to the cluster; the response carries `X-Corral-Node` and `X-Corral-Attempts`.
pub async fn forward(
    shared: &Arc<Shared>,
    mut out: Outbound,
    trace: &mut Option<Trace>,
) -> Result<Response, (BrokerError, u32)> {
    let started = Instant::now();
    let deadline = started + out.queue_timeout;
    let config = shared.config();
    let max_attempts = config.retry.max_attempts.max(1);
    let Some(router) = shared.router(&out.category) else {
        return Err((BrokerError::UnknownCategory { name: out.category.clone(), known: String::new() }, 0));
    };
    shared.retry_budget.deposit(started);
    let mut ticket = ticket_for(&out, router);
    let idle = config.category(&out.category).map_or(config.proxy.idle_timeout(), |c| c.stream_idle_timeout());
    let mut failures: Vec<(String, AttemptFailed)> = Vec::new();

    for attempt in 1..=max_attempts {
        if attempt > 1 && !may_retry(shared, &ticket, attempt, deadline, &out.request_id).await {
            break;
        }
        let guard = match shared.admission.admit(&ticket, deadline, &shared.shutdown).await {
            Ok(g) => g,
            Err(e) if failures.is_empty() => return Err((e, 0)),
            // Nobody left to try: report what the attempts so far ran into.
            Err(_) => break,
        };
        let node = Arc::clone(guard.node());
        let forced = guard.forced();
        let estimate = guard.estimate();
        ticket.tried.push(Arc::clone(&node));
        if let Some(t) = trace.as_mut() {
            dispatched(t, &mut out, node.name(), attempt, estimate);
        }
        match attempt_once(shared, &config, guard, &out).await {
            Ok(Attempt::Relay(answer, guard)) => {
                if let Some(t) = trace.as_mut() {
                    t.mark_first_byte();
                }
                let resume = continues(shared, &config, &out, &answer, &node);
                let read_ahead = super::readahead::Budget::of(shared).map(|b| b.late_for(out.http1));
                let resp = relay::respond(
                    answer,
                    Source::Node(guard),
                    trace.take(),
                    &out.request_id,
                    idle,
                    resume,
                    read_ahead,
                );
                return Ok(estimated(labelled(resp, node.name(), attempt), estimate));
            }
            Ok(Attempt::Whole(resp)) => return Ok(estimated(labelled(resp, node.name(), attempt), estimate)),
            Err(f) => {
                tracing::debug!(request_id = %out.request_id, node = %node.name(), attempt, outcome = ?f.outcome, detail = %f.detail, "attempt failed");
                // A node that let a deadline pass, or said it lacks the model, is not asked
                // again for this request, even as the only node left.
                if f.outcome.rules_the_node_out() {
                    ticket.excluded.push(Arc::clone(&node));
                }
                if let Some(t) = trace.as_mut() {
                    t.attempt_failed(node.name(), f.outcome.name(), &f.detail);
                }
                failures.push((node.name().to_string(), f));
                // Forced past its open breaker because nothing else could answer: once.
                if forced {
                    break;
                }
            }
        }
    }
    let attempts = failures.len() as u32;
    Err((summarize(&failures, out.model.as_deref()), attempts))
}

/// Attempt number `attempt` goes to `node`: the record says so, and when traces are exported
/// the node is sent the attempt's span as its `traceparent`, so it continues the trace under it.
fn dispatched(t: &mut Trace, out: &mut Outbound, node: &str, attempt: u32, estimate: Option<Duration>) {
    t.mark_dispatched();
    t.row.attempts = i64::from(attempt);
    t.row.node = Some(node.to_string());
    t.row.estimate_ms = estimate.map(|e| e.as_millis() as i64);
    if let Some(tp) = t.attempt_began(node) {
        out.headers.insert(crate::otlp::TRACEPARENT, tp);
    }
}

/// Whether attempt number `attempt` may go ahead, after its backoff: the retry budget must
/// allow it, and when every node asked not to be sent more yet (429) the same one is asked
/// again only once its Retry-After is over, and only when that fits the queue timeout.
async fn may_retry(shared: &Shared, ticket: &Ticket, attempt: u32, deadline: Instant, request_id: &str) -> bool {
    if !shared.retry_budget.try_withdraw(Instant::now()) {
        tracing::warn!(request_id, "retry budget spent: not retrying");
        return false;
    }
    tokio::time::sleep(shared.backoff(attempt - 1)).await;
    if let Some(wait) = shared.admission.held_off_for(ticket, Instant::now()) {
        if Instant::now() + wait > deadline {
            tracing::debug!(
                request_id,
                wait_ms = wait.as_millis() as u64,
                "every node is rate-limited past the queue timeout"
            );
            return false;
        }
        tokio::time::sleep(wait).await;
    }
    true
}

/// For a chat stream in a category with `continue_on_cut`: how another node would continue it
/// if it broke (`resume`).
fn continues(
    shared: &Arc<Shared>,
    config: &Config,
    out: &Outbound,
    answer: &Answer,
    node: &Arc<Node>,
) -> Option<Resume> {
    let on = config.category(&out.category).is_some_and(|c| c.continue_on_cut);
    let chat = out.path_and_query.split('?').next() == Some("/api/chat") && out.stream != Some(false);
    if !(on && chat && answer.status == StatusCode::OK) {
        return None;
    }
    let (shared, out, broke) = (Arc::clone(shared), out.clone(), Arc::clone(node));
    Some(Resume::new(Box::new(move |said| Box::pin(continuation(shared, out, broke, said)))))
}

/// Another node's continuation of `out`'s answer, of which the client has `said`: the same
/// request with `said` as a trailing assistant message, on any node but the one that broke.
async fn continuation(
    shared: Arc<Shared>,
    out: Outbound,
    broke: Arc<Node>,
    said: String,
) -> Result<(Answer, InFlight), String> {
    let body = resume::prefilled(&out.body, &said).ok_or("the request cannot carry a partial answer")?;
    let out = Outbound { body, stream: Some(true), ..out };
    let config = shared.config();
    let router = shared.router(&out.category).ok_or("its category is gone")?;
    let mut ticket = ticket_for(&out, router);
    ticket.tried.push(Arc::clone(&broke));
    ticket.excluded.push(broke);
    let deadline = Instant::now() + out.queue_timeout;
    let guard = shared.admission.admit(&ticket, deadline, &shared.shutdown).await.map_err(|e| e.to_string())?;
    let node = guard.node().name().to_string();
    match attempt_once(&shared, &config, guard, &out).await {
        Ok(Attempt::Relay(answer, guard)) if answer.status.is_success() => Ok((answer, guard)),
        Ok(Attempt::Relay(answer, _)) => Err(format!("{node} answered HTTP {}", answer.status.as_u16())),
        Ok(Attempt::Whole(resp)) => Err(format!("{node} refused it (HTTP {})", resp.status().as_u16())),
        Err(f) => Err(format!("{node}: {}", f.detail)),
    }
}

fn ticket_for(out: &Outbound, router: Arc<crate::route::Router>) -> Ticket {
    Ticket {
        model: out.model.clone(),
        key: out.model.as_deref().map(|m| crate::config::model_key(m).into_owned()),
        session: out.session.clone(),
        tried: Vec::new(),
        router,
        priority: out.priority,
        origin: out.origin,
        body_bytes: out.body.len(),
        excluded: Vec::new(),
        has_alternative: out.has_alternative,
        work: crate::plan::Work::of(&out.body),
        arrived: Instant::now(),
    }
}

/// `resp` marked with the node that answered and the attempts it took.
fn labelled(mut resp: Response, node: &str, attempt: u32) -> Response {
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(node) {
        h.insert(&super::names::X_CORRAL_NODE, v);
    }
    h.insert(&super::names::X_CORRAL_ATTEMPTS, HeaderValue::from(attempt));
    resp
}

/// `resp` with `fastest-finish`'s estimate of the request's time (from arrival), when it made one.
fn estimated(mut resp: Response, estimate: Option<Duration>) -> Response {
    if let Some(e) = estimate {
        resp.headers_mut().insert(&super::names::X_CORRAL_ESTIMATE_MS, HeaderValue::from(e.as_millis() as u64));
    }
    resp
}

/// Turn the failed attempts into the one error the client sees.
fn summarize(failures: &[(String, AttemptFailed)], model: Option<&str>) -> BrokerError {
    let attempts = failures.len() as u32;
    let detail = failures.iter().map(|(n, f)| format!("{n}: {}", f.detail)).collect::<Vec<_>>().join("; ");
    if let (Some(m), true) = (model, failures.iter().all(|(_, f)| f.outcome == Outcome::ModelMissing)) {
        // The nodes received it and said so: never reported as sent nowhere.
        return BrokerError::model_refused_by_nodes(m, detail);
    }
    let reached = failures.iter().any(|(_, f)| f.outcome != Outcome::ConnectFailed);
    if !reached {
        return BrokerError::NoNodeReachable { detail };
    }
    if failures.iter().all(|(_, f)| matches!(f.outcome, Outcome::Busy | Outcome::ConnectFailed)) {
        return BrokerError::ClusterBusy;
    }
    match failures.last() {
        Some((_, f)) if f.outcome.is_timeout() => BrokerError::UpstreamTimeout { attempts, detail },
        _ => BrokerError::UpstreamFailed { attempts, detail },
    }
}

/// Headers that describe one hop, never forwarded (RFC 9110 §7.6.1), plus `Host` (the node's
/// own is set from its URL: an Ollama bound to loopback answers 403 to a foreign Host).
fn is_hop_header(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "transfer-encoding"
            | "te"
            | "trailer"
            | "upgrade"
            | "host"
            | "content-length"
            | "proxy-authorization"
            | "proxy-authenticate"
    ) || name.as_str().starts_with("x-corral-")
}

fn copy_headers(from: &HeaderMap) -> HeaderMap {
    from.iter().filter(|(k, _)| !is_hop_header(k)).map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// A node's answer headers as the client gets them: without hop headers, and without what only
/// Corral decides for its clients. A cookie set by a node would be the browser's for every port
/// of the host (the admin UI's included), and CORS is the listener's own rule
/// (`browser::cors`), never a node's.
fn answer_headers(from: &HeaderMap) -> HeaderMap {
    let corrals = |k: &HeaderName| k == header::SET_COOKIE || k.as_str().starts_with("access-control-");
    from.iter().filter(|(k, _)| !is_hop_header(k) && !corrals(k)).map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// What a successful attempt produced.
enum Attempt {
    /// A body to relay chunk by chunk; its first chunk is already here. The guard holds the
    /// node's slot until the relay ends.
    Relay(Answer, InFlight),
    /// A complete, small response (the node's own 404, a refusal in Ollama's words).
    Whole(Response),
}

/// A small JSON answer with `status`.
fn whole(status: StatusCode, body: String) -> Response {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json; charset=utf-8"));
    r
}

async fn attempt_once(
    shared: &Shared,
    config: &Config,
    mut guard: InFlight,
    out: &Outbound,
) -> Result<Attempt, AttemptFailed> {
    let node = Arc::clone(guard.node());
    let up = Upstream::node(&node);
    let plan = if up.is_openai() {
        let model = out.model.as_deref().unwrap_or_default();
        match Plan::new(&up, node.name(), &out.path_and_query, model, &out.body) {
            Ok(p) => Some(p),
            Err(refusal) => {
                guard.judge(Outcome::Success);
                return Ok(Attempt::Whole(whole(refusal.status, refusal.body.to_string())));
            }
        }
    } else {
        None
    };
    let (request, assembled) = match prepare(out, &up, plan.as_ref()) {
        Ok(prepared) => prepared,
        Err(e) => return Err(judged(&mut guard, Outcome::Failed, e.to_string())),
    };
    let category = config.category(&out.category);
    let whole = generates(&out.path_and_query) && assembled.is_none() && !streams(&out.path_and_query, out.stream);
    let (first_byte, late) = first_token_deadline(config, category, whole);
    let timed = |e: SendError| {
        let outcome = if e.outcome() == Outcome::Silent { late } else { e.outcome() };
        (outcome, e.to_string())
    };
    let sent = match upstream::send_to_node(&shared.node_client, request, first_byte).await {
        Ok(s) => s,
        Err(e) => {
            let (outcome, detail) = timed(e);
            return Err(judged(&mut guard, outcome, detail));
        }
    };
    let native = plan.as_ref().and_then(|p| p.native).is_some();
    let sent = match not_an_answer(&mut guard, out, sent, native).await {
        Ok(sent) => sent,
        Err(decided) => return decided.map(Attempt::Whole),
    };
    let answer = match node_answer(sent, plan).await {
        Ok(a) => a,
        Err(e) => {
            let (outcome, detail) = timed(e);
            return Err(judged(&mut guard, outcome, detail));
        }
    };
    node.observe_ttfb(answer.sent_at.elapsed());
    match assembled {
        Some(api) if answer.status == StatusCode::OK => {
            let idle = category.map_or(config.proxy.idle_timeout(), |c| c.stream_idle_timeout());
            match is_stream(&answer.headers) {
                true => assembled_attempt(guard, answer, api, idle).await,
                false => whole_attempt(guard, answer, idle).await,
            }
        }
        _ => Ok(Attempt::Relay(answer, guard)),
    }
}

/// The request for the node, and whether its one-JSON answer is to be assembled from a
/// stream: asked of an Ollama node, one JSON is asked as a stream, so the first token is seen
/// (and bounded) whatever the answer's length.
fn prepare(
    out: &Outbound,
    up: &Upstream,
    plan: Option<&Plan>,
) -> Result<(NodeRequest, Option<assemble::Api>), http::Error> {
    let assembled = assemble::Api::of(&out.path_and_query)
        .filter(|api| plan.is_none() && one_json(*api, out.stream))
        .and_then(|api| api.streamed_body(&out.body).map(|b| (api, b)));
    let (uri, body) = match (plan, &assembled) {
        (Some(p), _) => (http::Uri::try_from(p.url.as_str())?, p.body.clone()),
        (None, Some((_, streamed))) => (up.uri(&out.path_and_query)?, streamed.clone()),
        (None, None) => (up.uri(&out.path_and_query)?, out.body.clone()),
    };
    let mut request = http::Request::builder().method(out.method.clone()).uri(uri).body(body)?;
    let headers = request.headers_mut();
    *headers = copy_headers(&out.headers);
    if let Ok(v) = HeaderValue::from_str(&out.request_id) {
        headers.insert(&super::names::X_REQUEST_ID, v);
    }
    if plan.is_some_and(|p| p.native.is_some()) {
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    }
    Ok((request, assembled.map(|(api, _)| api)))
}

/// Whether `path` generates text (its first byte can be long in coming).
fn generates(path: &str) -> bool {
    matches!(
        path.split('?').next().unwrap_or(path),
        "/api/chat" | "/api/generate" | "/v1/chat/completions" | "/v1/completions" | "/v1/responses" | "/v1/messages"
    )
}

/// Whether the answer to `path` streams, given the body's `stream` (Ollama's API streams
/// unless told not to, `/v1` only when asked).
fn streams(path: &str, stream: Option<bool>) -> bool {
    stream.unwrap_or_else(|| path.starts_with("/api/"))
}

/// Longest wait for a generated answer that comes as one JSON Corral could not ask as a stream
/// (an OpenAI-compatible node's, `/v1/completions`...), in first-byte timeouts: its first byte
/// is its last, so it is bounded as a whole answer, as before first-token deadlines existed.
const WHOLE_ANSWER_TIMEOUTS: u32 = 5;

/// How long a node has for its first byte, and what missing it means: past the category's
/// tighter first-token deadline the node is too slow for this request (`Slow`); past the
/// proxy's first-byte timeout it is silent (`Silent`, which takes it out). A `whole` answer
/// (one JSON whose first token cannot be seen) gets `WHOLE_ANSWER_TIMEOUTS` first-byte timeouts
/// and is an ordinary failure when it takes longer: a long answer is not a silent node.
fn first_token_deadline(
    config: &Config,
    category: Option<&crate::config::CategoryConfig>,
    whole: bool,
) -> (Duration, Outcome) {
    let global = config.proxy.first_byte_timeout();
    if whole {
        return (global * WHOLE_ANSWER_TIMEOUTS, Outcome::TimedOut);
    }
    match category.and_then(|c| c.first_token_timeout()).filter(|d| *d < global) {
        Some(d) => (d, Outcome::Slow),
        None => (global, Outcome::Silent),
    }
}

/// Judge a head that is not an answer to relay: a 429, a 5xx, a 404 about the model, an
/// OpenAI-compatible node's 4xx. `Ok(sent)` hands back an answer to relay; `Err` carries the
/// attempt's end (a small response for the client, or a failure to retry).
async fn not_an_answer(
    guard: &mut InFlight,
    out: &Outbound,
    sent: upstream::Sent,
    native: bool,
) -> Result<upstream::Sent, Result<Response, AttemptFailed>> {
    let status = sent.response.status();
    let node = Arc::clone(guard.node());
    if status == StatusCode::TOO_MANY_REQUESTS {
        return Err(Err(rate_limited(guard, sent.response).await));
    }
    if status.is_server_error() {
        let body = upstream::read_small(sent.response, Duration::from_secs(2)).await;
        if says_unsupported(&body) {
            // The request itself is what the node cannot do: its answer, not its failure.
            tracing::debug!(node = %node.name(), status = status.as_u16(), "node cannot serve this request");
            guard.judge(Outcome::Success);
            let native_path = native || out.path_and_query.starts_with("/api/");
            let body = if native_path { native_error(body.as_bytes()).to_string() } else { body };
            return Err(Ok(whole(status, body)));
        }
        let busy = status == StatusCode::SERVICE_UNAVAILABLE && body.contains("server busy");
        let outcome = if busy { Outcome::Busy } else { Outcome::Failed };
        return Err(Err(judged(guard, outcome, format!("HTTP {} {}", status.as_u16(), body.trim()))));
    }
    if status == StatusCode::NOT_FOUND && out.model.is_some() && !out.path_and_query.starts_with("/api/show") {
        return Err(not_found(guard, out, sent.response, native).await);
    }
    if native && status.is_client_error() {
        // The node's own refusal, in Ollama's words.
        let body = upstream::read_small(sent.response, Duration::from_secs(2)).await;
        tracing::debug!(node = %node.name(), status = status.as_u16(), "OpenAI-compatible node refused");
        guard.judge(Outcome::Success);
        return Err(Ok(whole(status, native_error(body.as_bytes()).to_string())));
    }
    Ok(sent)
}

/// The attempt's end when a node asked for a stream sent one JSON instead: relayed once it is
/// read whole and parses; a cut, garbled or oversized one is the node's failure.
async fn whole_attempt(mut guard: InFlight, mut answer: Answer, idle: Duration) -> Result<Attempt, AttemptFailed> {
    let (status, sent_at, headers) = (answer.status, answer.sent_at, std::mem::take(&mut answer.headers));
    match assemble::collect_json(answer, idle).await {
        Ok(body) => {
            let rest: upstream::BodyStream = Box::pin(futures_util::stream::empty());
            Ok(Attempt::Relay(Answer { status, headers, first: Some(body), body: rest, sent_at, whole: true }, guard))
        }
        Err(e) => {
            let outcome = if matches!(e, AssembleError::Stalled(_)) { Outcome::TimedOut } else { Outcome::Failed };
            Err(judged(&mut guard, outcome, format!("one JSON instead of a stream: {e}")))
        }
    }
}

/// The attempt's end once its streamed answer is read whole and made into one JSON.
async fn assembled_attempt(
    mut guard: InFlight,
    answer: Answer,
    api: assemble::Api,
    idle: Duration,
) -> Result<Attempt, AttemptFailed> {
    match assemble_answer(answer, api, idle).await {
        Ok(whole) => Ok(Attempt::Relay(whole, guard)),
        // What Ollama would have answered 500 with, when it is about the request itself.
        Err(AssembleError::Node(m)) if says_unsupported(&m) => {
            guard.judge(Outcome::Success);
            let body = serde_json::json!({ "error": m }).to_string();
            Ok(Attempt::Whole(whole(StatusCode::INTERNAL_SERVER_ERROR, body)))
        }
        Err(e) => {
            let outcome = if matches!(e, AssembleError::Stalled(_)) { Outcome::TimedOut } else { Outcome::Failed };
            Err(judged(&mut guard, outcome, e.to_string()))
        }
    }
}

/// Whether a request to `api` with the body's `stream` wants one JSON (Ollama's own API
/// streams unless told not to; `/v1` only when asked).
fn one_json(api: assemble::Api, stream: Option<bool>) -> bool {
    match api {
        assemble::Api::V1Chat => stream != Some(true),
        _ => stream == Some(false),
    }
}

/// Whether an answer is the stream asked for, to be assembled (an error or a bare load comes
/// as one JSON already).
fn is_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-ndjson") || v.starts_with("text/event-stream"))
}

/// The whole of a streamed answer made into the one JSON the client asked for; nothing has
/// reached the client yet, so a failure on the way is an attempt that may go elsewhere.
async fn assemble_answer(answer: Answer, api: assemble::Api, idle: Duration) -> Result<Answer, AssembleError> {
    let (status, sent_at) = (answer.status, answer.sent_at);
    let mut headers = answer.headers.clone();
    let body = assemble::collect(answer, api, idle).await?;
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(api.content_type()));
    let rest: upstream::BodyStream = Box::pin(futures_util::stream::empty());
    Ok(Answer { status, headers, first: Some(body), body: rest, sent_at, whole: true })
}

/// A node's 404 for a request naming a model: "model not found" means its model list was
/// stale (try a node that has it); anything else is the node's own answer.
async fn not_found(
    guard: &mut InFlight,
    out: &Outbound,
    resp: reqwest::Response,
    translated: bool,
) -> Result<Response, AttemptFailed> {
    let content_type = resp.headers().get(header::CONTENT_TYPE).cloned();
    let body = upstream::read_small(resp, Duration::from_secs(2)).await;
    if says_model_missing(&body) {
        // Stale model list (say, before the first deep probe): try a node that has it.
        if let Some(m) = &out.model {
            guard.node().forget_model(m);
        }
        return Err(judged(guard, Outcome::ModelMissing, format!("HTTP 404 {}", body.trim())));
    }
    guard.judge(Outcome::Success);
    if translated {
        return Ok(whole(StatusCode::NOT_FOUND, native_error(body.as_bytes()).to_string()));
    }
    // The node's own answer as it sent it: Go's plain `404 page not found` stays plain text.
    let mut r = whole(StatusCode::NOT_FOUND, body);
    match content_type {
        Some(ct) => r.headers_mut().insert(header::CONTENT_TYPE, ct),
        None => r.headers_mut().remove(header::CONTENT_TYPE),
    };
    Ok(r)
}

/// Whether a node's 404 body says the *model* is missing (Ollama: `{"error":"model \"x\" not
/// found, try pulling it first"}`; OpenAI-compatible servers: an error object saying so), as
/// opposed to the route: Go's mux answers an unknown path with the plain text "404 page not
/// found", which says nothing about any model and must never make Corral forget one.
fn says_model_missing(body: &str) -> bool {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(body) else { return false };
    let message = match &v["error"] {
        serde_json::Value::String(m) => m.clone(),
        serde_json::Value::Object(o) => o.get("message").and_then(|m| m.as_str()).unwrap_or_default().to_string(),
        _ => return false,
    };
    let m = message.to_ascii_lowercase();
    m.contains("model") && (m.contains("not found") || m.contains("does not exist"))
}

/// Whether a node's 5xx says the request itself is unsupported (llama.cpp's 500 "image input is
/// not supported", a model that "does not support tools"): sending it again, here or to a twin
/// node, gets the same answer, so it is passed to the client and never retried.
fn says_unsupported(body: &str) -> bool {
    let m = native_error(body.as_bytes())["error"].as_str().unwrap_or_default().to_ascii_lowercase();
    ["not supported", "unsupported", "does not support"].iter().any(|s| m.contains(s))
}

/// The answer's body (translated back for an OpenAI-compatible node) up to its first chunk.
async fn node_answer(sent: upstream::Sent, plan: Option<Plan>) -> Result<Answer, SendError> {
    let status = sent.response.status();
    let mut headers = answer_headers(sent.response.headers());
    let remaining = sent.remaining();
    let (sent_at, first_byte) = (sent.sent_at, sent.first_byte);
    let body = match plan.and_then(|p| p.native.map(|n| (n, p.model))) {
        None => upstream::raw_body(sent.response),
        Some(((api, stream), model)) => {
            let reply = Reply::native(api, &model, sent_at, None);
            let (content_type, body) =
                openai::answer_body(sent.response, Some(reply), stream, remaining).await.map_err(SendError::Failed)?;
            headers.insert(header::CONTENT_TYPE, content_type);
            body
        }
    };
    upstream::first_chunk(status, headers, body, sent_at, remaining, first_byte).await
}

/// Longest a node's `Retry-After` keeps it out of routing.
const MAX_HOLD_OFF: Duration = Duration::from_secs(60);

/// A node's 429: it is busy, not failing. It is kept out of routing for what its `Retry-After`
/// asks (1 s when it says nothing, at most a minute), and the request goes elsewhere at once.
async fn rate_limited(guard: &mut InFlight, resp: reqwest::Response) -> AttemptFailed {
    let wait = resp
        .headers()
        .get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(Duration::from_secs(1), Duration::from_secs)
        .min(MAX_HOLD_OFF);
    guard.node().hold_off(wait);
    let body = upstream::read_small(resp, Duration::from_secs(2)).await;
    tracing::debug!(node = %guard.node().name(), wait_ms = wait.as_millis() as u64, "node rate-limited the request");
    judged(guard, Outcome::Busy, format!("HTTP 429 {} (held off for {} s)", body.trim(), wait.as_secs()))
}

/// Judge a failed attempt on its guard (which frees the slot when dropped) and describe it.
fn judged(guard: &mut InFlight, outcome: Outcome, detail: String) -> AttemptFailed {
    guard.judge(outcome);
    AttemptFailed { outcome, detail }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_headers_and_host_are_not_forwarded() {
        let mut h = HeaderMap::new();
        h.insert("host", HeaderValue::from_static("corral.local"));
        h.insert("connection", HeaderValue::from_static("keep-alive"));
        h.insert("x-corral-category", HeaderValue::from_static("default"));
        h.insert("authorization", HeaderValue::from_static("Bearer t"));
        let out = copy_headers(&h);
        assert!(out.get("host").is_none(), "the node's own Host is set from its URL");
        assert!(out.get("connection").is_none());
        assert!(out.get("x-corral-category").is_none(), "Corral's own headers stay with Corral");
        assert_eq!(out["authorization"], "Bearer t");
    }

    #[test]
    fn a_nodes_cookies_and_cors_never_reach_the_client() {
        let mut h = HeaderMap::new();
        h.insert("set-cookie", HeaderValue::from_static("session=node; Path=/"));
        h.insert("access-control-allow-origin", HeaderValue::from_static("*"));
        h.insert("access-control-allow-credentials", HeaderValue::from_static("true"));
        h.insert("x-corral-node", HeaderValue::from_static("spoofed"));
        h.insert("content-type", HeaderValue::from_static("application/x-ndjson"));
        let out = answer_headers(&h);
        let names: Vec<&str> = out.keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["content-type"], "only the node's own description of its answer");
    }

    fn summarize_any(f: &[(String, AttemptFailed)]) -> BrokerError {
        summarize(f, None)
    }

    #[test]
    fn only_a_404_about_a_model_means_the_model_is_missing() {
        assert!(says_model_missing(r#"{"error":"model \"llama3.2\" not found, try pulling it first"}"#));
        assert!(says_model_missing(
            r#"{"error":{"message":"The model `x` does not exist","type":"invalid_request_error"}}"#
        ));
        assert!(!says_model_missing("404 page not found"), "Go's mux: an unknown route, not a model");
        assert!(!says_model_missing(r#"{"error":"file not found"}"#), "not about a model");
    }

    #[test]
    fn only_a_5xx_about_the_request_itself_is_the_nodes_answer() {
        assert!(says_unsupported(
            r#"{"error":{"code":500,"message":"image input is not supported - hint: provide the mmproj","type":"server_error"}}"#
        ));
        assert!(says_unsupported(r#"{"error":"registry.ollama.ai/library/x does not support tools"}"#));
        assert!(says_unsupported("Unsupported param: logprobs"));
        assert!(!says_unsupported(r#"{"error":"simulated failure (500)"}"#));
        assert!(!says_unsupported(r#"{"error":"CUDA error: out of memory"}"#), "may pass on another node");
    }

    #[test]
    fn summary_never_claims_a_forwarded_request_was_not_executed() {
        let f = |outcome| (String::from("n"), AttemptFailed { outcome, detail: String::new() });
        assert_eq!(summarize_any(&[f(Outcome::ConnectFailed)]).code(), "no_node_reachable");
        assert!(!summarize_any(&[f(Outcome::ConnectFailed), f(Outcome::ConnectFailed)]).forwarded());
        assert!(summarize_any(&[f(Outcome::ConnectFailed), f(Outcome::Failed)]).forwarded());
        assert_eq!(summarize_any(&[f(Outcome::Failed), f(Outcome::TimedOut)]).code(), "upstream_timeout");
        assert_eq!(summarize_any(&[f(Outcome::Busy), f(Outcome::Busy)]).code(), "cluster_busy");
    }
}
