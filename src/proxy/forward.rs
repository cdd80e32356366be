//! Forwarding one request: pick a node, send, fail over before the first byte, relay after it.
//!
//! The rule that keeps clients safe (pingora's failover guide): a request may be retried on
//! another node only while nothing has gone to the client. So an attempt is judged in two
//! phases:
//! 1. Until the first byte of the answer's body: connect errors, 5xx, and timeouts are
//!    retryable (full-jitter exponential backoff, bounded attempts, a node is not tried twice
//!    unless it is the only one). A node's 503 "server busy" is retried elsewhere but is not a
//!    node failure. 4xx passes through untouched.
//! 2. After it: bytes are relayed chunk by chunk as they arrive (no buffering). If the node
//!    breaks off or falls silent past the idle timeout, the stream ends with one more line in
//!    the stream's own framing, `{"error": ..., "code": ...}`; never a fake `done:true`.
//!
//! Each exchange is judged once, when its stream ends or is dropped (`Relay`), and that one
//! `Outcome` feeds the node's passive health. The in-flight guard lives in the relay, so a node's
//! slot is held until the client has the last byte or has gone away; dropping the relay drops
//! the upstream response, which closes the connection and makes Ollama stop generating.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::Response;
use futures_util::StreamExt;
use http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use rand::Rng;
use tokio::time::Instant;

use super::Shared;
use crate::admit::Ticket;
use crate::cloud::translate::{self, Audience, Native};
use crate::config::{Config, NodeKind, Origin};
use crate::error::BrokerError;
use crate::node::{InFlight, Outcome};
use crate::telemetry::{status_for, Trace};

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
}

/// Why one attempt did not produce a response for the client.
#[derive(Debug)]
struct AttemptFailed {
    outcome: Outcome,
    detail: String,
}

/// Send `out` to the cluster; the response carries `X-Corral-Node` and `X-Corral-Attempts`.
pub async fn forward(
    shared: &Shared,
    out: Outbound,
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
    let mut ticket = Ticket {
        model: out.model.clone(),
        session: out.session.clone(),
        tried: Vec::new(),
        router,
        priority: out.priority,
        origin: out.origin,
        body_bytes: out.body.len(),
    };
    let mut failures: Vec<(String, AttemptFailed)> = Vec::new();

    for attempt in 1..=max_attempts {
        if attempt > 1 {
            if !shared.retry_budget.try_withdraw(Instant::now()) {
                tracing::warn!(request_id = %out.request_id, "retry budget spent: not retrying");
                break;
            }
            tokio::time::sleep(shared.backoff(attempt - 1)).await;
        }
        let guard = match shared.admission.admit(ticket.clone(), deadline, &shared.shutdown).await {
            Ok(g) => g,
            Err(e) if failures.is_empty() => return Err((e, 0)),
            // Nobody left to try: report what the attempts so far ran into.
            Err(_) => break,
        };
        let node = Arc::clone(guard.node());
        ticket.tried.push(Arc::clone(&node));
        if let Some(t) = trace.as_mut() {
            t.mark_dispatched();
            t.row.attempts = i64::from(attempt);
            t.row.node = Some(node.name().to_string());
        }
        match attempt_once(shared, &config, guard, &out).await {
            Ok(Answer::Relay(parts)) => {
                if let Some(t) = trace.as_mut() {
                    t.mark_first_byte();
                }
                let mut resp = parts.into_response(trace.take(), &out.request_id, config.proxy.idle_timeout());
                let h = resp.headers_mut();
                if let Ok(v) = HeaderValue::from_str(node.name()) {
                    h.insert("x-corral-node", v);
                }
                h.insert("x-corral-attempts", HeaderValue::from(attempt));
                return Ok(resp);
            }
            Ok(Answer::Whole(mut resp)) => {
                let h = resp.headers_mut();
                if let Ok(v) = HeaderValue::from_str(node.name()) {
                    h.insert("x-corral-node", v);
                }
                h.insert("x-corral-attempts", HeaderValue::from(attempt));
                return Ok(resp);
            }
            Err(f) => {
                tracing::debug!(request_id = %out.request_id, node = %node.name(), attempt, outcome = ?f.outcome, detail = %f.detail, "attempt failed");
                failures.push((node.name().to_string(), f));
            }
        }
    }
    let attempts = failures.len() as u32;
    Err((summarize(&failures, out.model.as_deref()), attempts))
}

/// Turn the failed attempts into the one error the client sees.
fn summarize(failures: &[(String, AttemptFailed)], model: Option<&str>) -> BrokerError {
    let attempts = failures.len() as u32;
    if let (Some(m), true) = (model, failures.iter().all(|(_, f)| f.outcome == Outcome::ModelMissing)) {
        return BrokerError::ModelNotFound(m.to_string());
    }
    let detail = failures.iter().map(|(n, f)| format!("{n}: {}", f.detail)).collect::<Vec<_>>().join("; ");
    let reached = failures.iter().any(|(_, f)| f.outcome != Outcome::ConnectFailed);
    if !reached {
        return BrokerError::NoNodeReachable { detail };
    }
    if failures.iter().all(|(_, f)| matches!(f.outcome, Outcome::Busy | Outcome::ConnectFailed)) {
        return BrokerError::ClusterBusy;
    }
    match failures.last() {
        Some((_, f)) if f.outcome == Outcome::TimedOut => BrokerError::UpstreamTimeout { attempts, detail },
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

/// What a successful attempt produced.
enum Answer {
    /// A body to relay chunk by chunk; its first chunk is already here.
    Relay(RelayParts),
    /// A complete, small response (the node's own 404).
    Whole(Response),
}

/// An answer's body as it arrives: bytes, or why it broke off.
pub(crate) type BodyStream = futures_util::stream::BoxStream<'static, Result<Bytes, BodyError>>;

/// Why an answer's body broke off.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    #[error("{}", root_cause(.0))]
    Http(#[from] reqwest::Error),
    /// The upstream's answer could not be translated (an OpenAI-compatible stream that ended
    /// early or carried an error event).
    #[error("{0}")]
    Translate(String),
}

/// Who produced an answer: a node (whose slot is held until the end, and which is judged by
/// how the answer ends) or a cloud provider.
pub(crate) enum Source {
    Node(InFlight),
    Provider(String),
}

pub(crate) struct RelayParts {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub upstream: BodyStream,
    pub first: Option<Bytes>,
    pub source: Source,
}

impl RelayParts {
    pub(crate) fn into_response(self, trace: Option<Trace>, request_id: &str, idle: Duration) -> Response {
        let framing = Framing::of(&self.headers);
        let relay = Relay {
            upstream: self.upstream,
            first: self.first,
            source: Some(self.source),
            trace,
            status: self.status,
            idle,
            framing,
            ends_with_newline: true,
            done: false,
            request_id: request_id.to_string(),
            bytes: 0,
            tail: std::collections::VecDeque::with_capacity(TAIL_CHUNKS),
            silence: Box::pin(tokio::time::sleep(idle)),
            stashed: None,
        };
        let mut response = Response::new(Body::from_stream(futures_util::stream::unfold(relay, Relay::next)));
        *response.status_mut() = self.status;
        *response.headers_mut() = self.headers;
        response
    }
}

async fn attempt_once(
    shared: &Shared,
    config: &Config,
    mut guard: InFlight,
    out: &Outbound,
) -> Result<Answer, AttemptFailed> {
    let node = Arc::clone(guard.node());
    let plan = if node.config.kind == NodeKind::Openai {
        match OpenaiPlan::new(&node, out) {
            Ok(p) => Some(p),
            Err((status, msg)) => {
                guard.judge(Outcome::Success);
                let mut r = Response::new(Body::from(serde_json::json!({ "error": msg }).to_string()));
                *r.status_mut() = status;
                r.headers_mut()
                    .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json; charset=utf-8"));
                return Ok(Answer::Whole(r));
            }
        }
    } else {
        None
    };
    let (url, body) = match &plan {
        Some(p) => (p.url.clone(), p.body.clone()),
        None => (node_url(&node.base_url, &out.path_and_query), out.body.clone()),
    };
    let mut headers = copy_headers(&out.headers);
    if let Ok(v) = HeaderValue::from_str(&out.request_id) {
        headers.insert("x-request-id", v);
    }
    if plan.as_ref().is_some_and(|p| p.native.is_some()) {
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    }
    let request = shared.client.request(out.method.clone(), url).headers(headers).body(body);
    let first_byte = config.proxy.first_byte_timeout();
    let sent_at = Instant::now();
    let resp = match tokio::time::timeout(first_byte, request.send()).await {
        Err(_) => {
            return Err(failed(
                &mut guard,
                Outcome::TimedOut,
                format!("no answer within {} ms", first_byte.as_millis()),
            ))
        }
        Ok(Err(e)) if e.is_connect() => {
            return Err(failed(&mut guard, Outcome::ConnectFailed, format!("cannot connect ({})", root_cause(&e))))
        }
        Ok(Err(e)) => return Err(failed(&mut guard, Outcome::Failed, format!("request failed ({})", root_cause(&e)))),
        Ok(Ok(r)) => r,
    };
    let status = resp.status();
    if status.is_server_error() {
        let body = read_small(resp, Duration::from_secs(2)).await;
        let busy = status == StatusCode::SERVICE_UNAVAILABLE && body.contains("server busy");
        return Err(failed(
            &mut guard,
            if busy { Outcome::Busy } else { Outcome::Failed },
            format!("HTTP {} {}", status.as_u16(), body.trim()),
        ));
    }

    if status == StatusCode::NOT_FOUND && out.model.is_some() && !out.path_and_query.starts_with("/api/show") {
        let body = read_small(resp, Duration::from_secs(2)).await;
        if body.contains("not found") || body.contains("does not exist") {
            // Stale model list (say, before the first deep probe): try a node that has it.
            if let Some(m) = &out.model {
                node.forget_model(m);
            }
            return Err(failed(&mut guard, Outcome::ModelMissing, format!("HTTP 404 {}", body.trim())));
        }
        let body = match plan.as_ref().and_then(|p| p.native) {
            Some(_) => crate::cloud::translate::native_error(body.as_bytes()).to_string(),
            None => body,
        };
        let mut r = Response::new(Body::from(body));
        *r.status_mut() = status;
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json; charset=utf-8"));
        guard.judge(Outcome::Success);
        return Ok(Answer::Whole(r));
    }
    let mut resp_headers = copy_headers(resp.headers());
    // Phase one ends with the first byte of the body: until then a retry is still safe.
    let remaining = first_byte.saturating_sub(sent_at.elapsed());
    let mut upstream: BodyStream = match plan.and_then(|p| p.native.map(|n| (n, p.model))) {
        None => resp.bytes_stream().map(|r| r.map_err(BodyError::from)).boxed(),
        Some(((api, _), _)) if status.is_client_error() => {
            // The node's own refusal, in Ollama's words.
            let body = read_small(resp, Duration::from_secs(2)).await;
            let mut r = Response::new(Body::from(crate::cloud::translate::native_error(body.as_bytes()).to_string()));
            *r.status_mut() = status;
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json; charset=utf-8"));
            tracing::debug!(node = %node.name(), ?api, status = status.as_u16(), "OpenAI-compatible node refused");
            guard.judge(Outcome::Success);
            return Ok(Answer::Whole(r));
        }
        Some(((api, stream), model)) => {
            let reply = crate::cloud::translate::Reply::native(api, &model, sent_at, None);
            match crate::cloud::answer_body(resp, Some(reply), stream, remaining).await {
                Ok((content_type, body)) => {
                    resp_headers.insert(header::CONTENT_TYPE, content_type);
                    body
                }
                Err(why) => return Err(failed(&mut guard, Outcome::Failed, why)),
            }
        }
    };
    let first = match tokio::time::timeout(remaining, upstream.next()).await {
        Err(_) => {
            return Err(failed(
                &mut guard,
                Outcome::TimedOut,
                format!("headers but no body within {} ms", first_byte.as_millis()),
            ))
        }
        Ok(Some(Err(e))) => {
            return Err(failed(&mut guard, Outcome::Failed, format!("body failed before the first byte ({e})")))
        }
        Ok(Some(Ok(b))) => Some(b),
        Ok(None) => None,
    };
    node.observe_ttfb(sent_at.elapsed());

    Ok(Answer::Relay(RelayParts { status, headers: resp_headers, upstream, first, source: Source::Node(guard) }))
}

/// How a request goes to a `kind = "openai"` node: Ollama's native endpoints translated to
/// Chat Completions / Embeddings, `/v1` as it came.
struct OpenaiPlan {
    url: url::Url,
    body: Bytes,
    /// The translated endpoint and whether the client wants a stream; `None` for `/v1`.
    native: Option<(Native, bool)>,
    /// The model name the client used, echoed in the answer.
    model: String,
}

impl OpenaiPlan {
    /// The plan, or the answer to give the client instead (a request that cannot be
    /// translated, an endpoint such a node does not have).
    fn new(node: &crate::node::Node, out: &Outbound) -> Result<Self, (StatusCode, String)> {
        let refuse = |status: StatusCode, msg: String| (status, msg);
        let path = out.path_and_query.split('?').next().unwrap_or("");
        let model = out.model.clone().unwrap_or_default();
        if let Some(rest) = out.path_and_query.strip_prefix("/v1") {
            return Ok(Self {
                url: crate::cloud::openai_url(&node.base_url, rest),
                body: out.body.clone(),
                native: None,
                model,
            });
        }
        let Some(api) = Native::of(path) else {
            return Err(refuse(
                StatusCode::NOT_IMPLEMENTED,
                format!("node {} is an OpenAI-compatible server; it has no {path}", node.name()),
            ));
        };
        let parsed: serde_json::Value =
            serde_json::from_slice(&out.body).map_err(|e| refuse(StatusCode::BAD_REQUEST, e.to_string()))?;
        let upstream_model = model.strip_suffix(":latest").unwrap_or(&model);
        let t = translate::request(api, &parsed, upstream_model, Audience::Node)
            .map_err(|e| refuse(StatusCode::BAD_REQUEST, e.0))?;
        Ok(Self {
            url: crate::cloud::openai_url(&node.base_url, api.upstream_path()),
            body: Bytes::from(t.body.to_string()),
            native: Some((api, t.stream)),
            model,
        })
    }
}

/// The node's URL for a request path, from its parsed base URL: no re-parsing (and no IDNA
/// pass) of the host per request. A base path (`http://host/ollama`) is kept as a prefix.
fn node_url(base: &url::Url, path_and_query: &str) -> url::Url {
    let mut url = base.clone();
    let (path, query) = path_and_query.split_once('?').map_or((path_and_query, None), |(p, q)| (p, Some(q)));
    let prefix = base.path().trim_end_matches('/');
    url.set_path(&format!("{prefix}{path}"));
    url.set_query(query);
    url
}

/// Judge a failed attempt on its guard (which frees the slot when dropped) and describe it.
fn failed(guard: &mut InFlight, outcome: Outcome, detail: String) -> AttemptFailed {
    guard.judge(outcome);
    AttemptFailed { outcome, detail }
}

/// The error's innermost cause, which is the useful one ("Connection refused").
pub(crate) fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

pub(crate) async fn read_small(resp: reqwest::Response, within: Duration) -> String {
    let mut out = Vec::new();
    let mut stream = resp.bytes_stream();
    let read = async {
        while let Some(Ok(chunk)) = stream.next().await {
            out.extend_from_slice(&chunk);
            if out.len() > 4096 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(within, read).await;
    out.truncate(4096);
    String::from_utf8_lossy(&out).into_owned()
}

/// How the answer is framed, which decides how a mid-stream failure is told to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// Ollama's streams: one JSON object per line.
    Ndjson,
    /// `/v1` streams: `data: {...}` events.
    Sse,
    /// A single document: a break cannot be marked inside it, so the connection is aborted.
    Opaque,
}

impl Framing {
    fn of(headers: &HeaderMap) -> Self {
        let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
        if ct.starts_with("application/x-ndjson") {
            Self::Ndjson
        } else if ct.starts_with("text/event-stream") {
            Self::Sse
        } else {
            Self::Opaque
        }
    }
}

/// Largest write made by joining frames that are already there.
const COALESCE_MAX: usize = 64 * 1024;

/// Chunks kept for reading token counts at the end: Ollama's final line, or OpenAI's usage
/// event followed by `[DONE]`.
const TAIL_CHUNKS: usize = 4;

/// Relays an answer's body and judges the exchange when it ends.
struct Relay {
    upstream: BodyStream,
    first: Option<Bytes>,
    source: Option<Source>,
    trace: Option<Trace>,
    status: StatusCode,
    /// The last chunks relayed (shared, not copied), where the token counts are.
    tail: std::collections::VecDeque<Bytes>,
    /// One timer for the idle timeout, re-armed per chunk rather than allocated per chunk.
    silence: std::pin::Pin<Box<tokio::time::Sleep>>,
    /// The end of the body, or an error, met while coalescing; handled on the next call.
    stashed: Option<Option<Result<Bytes, BodyError>>>,
    idle: Duration,
    framing: Framing,
    ends_with_newline: bool,
    done: bool,
    request_id: String,
    bytes: usize,
}

impl Relay {
    async fn next(mut self) -> Option<(Result<Bytes, std::io::Error>, Relay)> {
        if self.done {
            return None;
        }
        if let Some(first) = self.first.take() {
            let chunk = self.coalesce(first);
            return Some((Ok(self.pass(chunk)), self));
        }
        let next = match self.stashed.take() {
            Some(item) => Ok(item),
            None => {
                let deadline = Instant::now() + self.idle;
                self.silence.as_mut().reset(deadline);
                tokio::select! {
                    biased;
                    item = self.upstream.next() => Ok(item),
                    _ = self.silence.as_mut() => Err(()),
                }
            }
        };
        match next {
            Ok(Some(Ok(chunk))) => {
                let chunk = self.coalesce(chunk);
                Some((Ok(self.pass(chunk)), self))
            }
            Ok(None) => {
                self.finish(Outcome::Success, "");
                None
            }
            Ok(Some(Err(e))) => {
                let why = format!("the answer stopped mid-stream ({e})");
                self.fail(Outcome::StreamCut, why, "stream_interrupted")
            }
            Err(_) => {
                let why = format!("node sent nothing for {} ms mid-stream", self.idle.as_millis());
                self.fail(Outcome::TimedOut, why, "stream_idle_timeout")
            }
        }
    }

    /// Join `chunk` with whatever the node has already sent after it (never waiting), so a
    /// burst of small frames leaves as one write instead of one syscall each. An end or error
    /// met on the way is kept for the next call.
    fn coalesce(&mut self, chunk: Bytes) -> Bytes {
        use futures_util::FutureExt;
        let mut joined: Option<bytes::BytesMut> = None;
        loop {
            let len = joined.as_ref().map_or(chunk.len(), |j| j.len());
            if len >= COALESCE_MAX {
                break;
            }
            match self.upstream.next().now_or_never() {
                Some(Some(Ok(more))) => {
                    joined.get_or_insert_with(|| bytes::BytesMut::from(&chunk[..])).extend_from_slice(&more)
                }
                Some(other) => {
                    self.stashed = Some(other);
                    break;
                }
                None => break,
            }
        }
        joined.map_or(chunk, bytes::BytesMut::freeze)
    }

    fn pass(&mut self, chunk: Bytes) -> Bytes {
        if let Some(&last) = chunk.last() {
            self.ends_with_newline = last == b'\n';
        }
        self.bytes += chunk.len();
        if self.tail.len() == TAIL_CHUNKS {
            self.tail.pop_front();
        }
        self.tail.push_back(chunk.clone());
        chunk
    }

    /// The last few KiB relayed, for the token counts in the final chunk or usage event.
    fn tail_bytes(&self) -> Vec<u8> {
        let joined: Vec<u8> = self.tail.iter().flat_map(|b| b.iter().copied()).collect();
        joined[joined.len().saturating_sub(16 * 1024)..].to_vec()
    }

    fn fail(mut self, outcome: Outcome, why: String, code: &str) -> Option<(Result<Bytes, std::io::Error>, Relay)> {
        let node = self.finish(outcome, &why);
        let message = format!("{why} on {node}; the answer is incomplete");
        let item = match self.framing {
            Framing::Ndjson => {
                let line = serde_json::json!({ "error": message, "code": code });
                let lead = if self.ends_with_newline { "" } else { "\n" };
                Ok(Bytes::from(format!("{lead}{line}\n")))
            }
            Framing::Sse => {
                let event = serde_json::json!({ "error": { "message": message, "type": "api_error", "code": code } });
                let lead = if self.ends_with_newline { "" } else { "\n\n" };
                Ok(Bytes::from(format!("{lead}data: {event}\n\n")))
            }
            Framing::Opaque => Err(std::io::Error::new(std::io::ErrorKind::ConnectionAborted, message)),
        };
        Some((item, self))
    }

    /// Judge the exchange once and free the node's slot. Returns who answered ("node gpu0",
    /// "provider openai").
    fn finish(&mut self, outcome: Outcome, detail: &str) -> String {
        self.done = true;
        let Some(source) = self.source.take() else { return String::new() };
        // Held to the end of this function: the node's slot frees after the record is made.
        let mut guard = None;
        let name = match source {
            Source::Node(mut g) => {
                g.judge(outcome);
                let name = format!("node {}", g.node().name());
                guard = Some(g);
                name
            }
            Source::Provider(p) => format!("provider {p}"),
        };
        if let Some(mut t) = self.trace.take() {
            let (prompt, completion) = crate::telemetry::tokens_in_tail(&self.tail_bytes());
            t.row.prompt_tokens = prompt;
            t.row.completion_tokens = completion;
            let (status, code) = match outcome {
                Outcome::Success => (status_for(self.status.as_u16()), None),
                Outcome::ClientGone => ("cancelled", Some("client_gone")),
                Outcome::TimedOut => ("interrupted", Some("stream_idle_timeout")),
                _ => ("interrupted", Some("stream_interrupted")),
            };
            t.finish(status, Some(self.status.as_u16()), code);
        }
        if outcome.is_node_failure() {
            tracing::warn!(request_id = %self.request_id, from = %name, ?outcome, detail, bytes = self.bytes, "answer broke off after it started");
        } else {
            tracing::debug!(request_id = %self.request_id, from = %name, ?outcome, bytes = self.bytes, "answer relayed");
        }
        drop(guard);
        name
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if self.source.is_some() {
            // Dropped before the end: the client went away. Dropping `upstream` closes the
            // node's connection, so it stops generating.
            self.finish(Outcome::ClientGone, "client disconnected");
        }
    }
}

impl Shared {
    /// Full jitter (AWS architecture blog): uniform in [0, min(cap, base * 2^retry)].
    fn backoff(&self, retry: u32) -> Duration {
        let config = self.config();
        let r = &config.retry;
        let ceiling = r.backoff_base_ms.saturating_mul(1u64 << retry.min(20)).min(r.backoff_cap_ms);
        let ms = self.rng().gen_range(0..=ceiling);
        Duration::from_millis(ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_urls_keep_base_paths_and_queries() {
        let base = url::Url::parse("http://10.0.0.5:11434").expect("url");
        assert_eq!(node_url(&base, "/api/chat").as_str(), "http://10.0.0.5:11434/api/chat");
        let prefixed = url::Url::parse("http://gpu.local/ollama/").expect("url");
        assert_eq!(node_url(&prefixed, "/v1/models?x=1").as_str(), "http://gpu.local/ollama/v1/models?x=1");
    }

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

    fn summarize_any(f: &[(String, AttemptFailed)]) -> BrokerError {
        summarize(f, None)
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
