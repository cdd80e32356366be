//! OpenTelemetry traces, exported over OTLP/HTTP (`[telemetry] otlp_endpoint`).
//!
//! One trace per request: a server span for the request and a client span per attempt on a
//! node, children of it. The trace context comes from the client's W3C `traceparent` when it
//! sends a valid one (the request span is then a child of the client's span, and an unsampled
//! parent means nothing is exported), else a fresh trace id is drawn; each attempt passes its
//! own span on to the node as `traceparent`, so the node's spans join the same trace.
//!
//! Off the request path: a request hands its finished spans (plain data, `RequestSpans`) to a
//! bounded channel with `try_send` and never waits; when the channel is full they are dropped
//! and counted. One task (`run`) batches them (up to `BATCH_SPANS`, or what came within
//! `FLUSH_EVERY`), encodes an `ExportTraceServiceRequest` with the official opentelemetry-proto
//! messages (prost, no gRPC) and POSTs it as `application/x-protobuf` to `{endpoint}/v1/traces`
//! with the broker's own HTTP client. A batch the collector does not take is dropped and
//! counted, never retried (a collector that is down must not grow memory). At shutdown the task
//! sends what is queued, within `FLUSH_AT_EXIT`. With no endpoint none of this exists: a
//! request's trace carries `None` and every hook is one branch.
//!
//! Telemetry's `Trace` drives a `Live` through the request (begun, continued, attempt began,
//! attempt failed) and, when it is judged, turns it and the request's row into spans here: the
//! row's facts become attributes (node, outcome, timings, tokens, fallback provider, degraded
//! model), so the spans say what the record says.

use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{
    span::SpanKind, status::StatusCode, ResourceSpans, ScopeSpans, Span, Status,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::store::RequestRow;

/// The W3C trace context header, taken from clients and given to nodes.
pub const TRACEPARENT: &str = "traceparent";

/// Finished requests waiting for the exporter; past it their spans are dropped and counted.
pub const QUEUE_REQUESTS: usize = 4096;
/// Most spans in one export request.
pub const BATCH_SPANS: usize = 512;
/// Longest a finished span waits for its batch to fill.
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// Longest one export request may take.
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest the shutdown flush may take.
pub const FLUSH_AT_EXIT: Duration = Duration::from_secs(3);

/// A span context from a `traceparent` header (W3C Trace Context, level 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub sampled: bool,
}

impl Parent {
    /// `00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`; a later version may append
    /// fields after another `-`. All-zero ids, version `ff` and upper-case hex are invalid.
    pub fn parse(value: &str) -> Option<Self> {
        let v = value.trim();
        let (head, rest) = (v.get(..55)?, v.get(55..)?);
        let mut parts = head.split('-');
        let (version, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let version = hex::<1>(version)?[0];
        if version == 0xff || (version == 0 && !rest.is_empty()) || (!rest.is_empty() && !rest.starts_with('-')) {
            return None;
        }
        let (trace_id, span_id, flags) = (hex::<16>(trace)?, hex::<8>(span)?, hex::<1>(flags)?[0]);
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(Self { trace_id, span_id, sampled: flags & 1 == 1 })
    }

    /// The header value naming this context.
    pub fn header(&self) -> String {
        format!("00-{}-{}-{:02x}", to_hex(&self.trace_id), to_hex(&self.span_id), u8::from(self.sampled))
    }
}

/// Exactly `N` bytes from `2N` lower-case hex digits.
fn hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    let b = s.as_bytes();
    if b.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = digit(b[2 * i])? << 4 | digit(b[2 * i + 1])?;
    }
    Some(out)
}

pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A random, non-zero id.
pub fn fresh_id<const N: usize>() -> [u8; N] {
    loop {
        let id: [u8; N] = std::array::from_fn(|_| rand::random::<u8>());
        if id != [0; N] {
            return id;
        }
    }
}

/// Nanoseconds since the Unix epoch, by the wall clock (spans are placed on it).
pub fn unix_nanos() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// An attribute's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Str(String),
    Int(i64),
    Bool(bool),
}

/// One span, as plain data.
#[derive(Debug, Clone, PartialEq)]
pub struct SpanData {
    pub span_id: [u8; 8],
    pub parent: Option<[u8; 8]>,
    /// Whether `parent` came from another process (the client's span).
    pub remote_parent: bool,
    pub name: String,
    pub start_ns: u64,
    pub end_ns: u64,
    pub attributes: Vec<(&'static str, Value)>,
    /// `Some(message)` for a span that ended in error.
    pub error: Option<String>,
}

/// One request's spans: the request span first, then its attempts.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestSpans {
    pub trace_id: [u8; 16],
    pub request: SpanData,
    pub attempts: Vec<SpanData>,
}

impl RequestSpans {
    fn len(&self) -> usize {
        1 + self.attempts.len()
    }
}

/// A request's trace while it runs (only when exporting).
#[derive(Debug)]
pub struct Live {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    parent: Option<[u8; 8]>,
    sampled: bool,
    start_ns: u64,
    started: Instant,
    attempts: Vec<Attempt>,
}

/// One attempt on a node; `end_ns` is `None` while it runs (the one that answers runs until
/// the request ends).
#[derive(Debug)]
struct Attempt {
    span_id: [u8; 8],
    node: String,
    start_ns: u64,
    end_ns: Option<u64>,
    outcome: String,
    detail: String,
    degraded: Option<String>,
}

impl Default for Live {
    fn default() -> Self {
        Self::new()
    }
}

impl Live {
    /// A fresh trace, begun now.
    pub fn new() -> Self {
        Self {
            trace_id: fresh_id(),
            span_id: fresh_id(),
            parent: None,
            sampled: true,
            start_ns: unix_nanos(),
            started: Instant::now(),
            attempts: Vec::new(),
        }
    }

    /// Continue the client's trace from its `traceparent` header value, when valid.
    pub fn continue_from(&mut self, traceparent: Option<&str>) {
        if let Some(p) = traceparent.and_then(Parent::parse) {
            self.trace_id = p.trace_id;
            self.parent = Some(p.span_id);
            self.sampled = p.sampled;
        }
    }

    fn now_ns(&self) -> u64 {
        self.start_ns + self.started.elapsed().as_nanos() as u64
    }

    /// An attempt on `node` begins (`degraded`: the smaller model it is asked for); returns the
    /// `traceparent` the node is to get, naming the attempt's span.
    pub fn attempt_began(&mut self, node: &str, degraded: Option<String>) -> String {
        let now = self.now_ns();
        self.close_open(now, "abandoned", "");
        let span_id = fresh_id();
        let (node, start_ns) = (node.to_string(), now);
        let (outcome, detail) = (String::new(), String::new());
        self.attempts.push(Attempt { span_id, node, start_ns, end_ns: None, outcome, detail, degraded });
        Parent { trace_id: self.trace_id, span_id, sampled: self.sampled }.header()
    }

    /// The running attempt ended without an answer: `outcome` is an `Outcome` name.
    pub fn attempt_failed(&mut self, outcome: &str, detail: &str) {
        let now = self.now_ns();
        self.close_open(now, outcome, detail);
    }

    fn close_open(&mut self, at: u64, outcome: &str, detail: &str) {
        if let Some(a) = self.attempts.last_mut().filter(|a| a.end_ns.is_none()) {
            a.end_ns = Some(at);
            a.outcome = outcome.to_string();
            a.detail = detail.to_string();
        }
    }

    /// The finished request's spans, from its judged `row`; `None` when the client's trace is
    /// not sampled.
    pub fn finish(self, row: &RequestRow) -> Option<RequestSpans> {
        if !self.sampled {
            return None;
        }
        let end = self.now_ns();
        let failed = matches!(row.status.as_str(), "error" | "interrupted");
        let message = || row.error_code.clone().unwrap_or_else(|| row.status.clone());
        let request = SpanData {
            span_id: self.span_id,
            parent: self.parent,
            remote_parent: self.parent.is_some(),
            name: row.endpoint.clone(),
            start_ns: self.start_ns,
            end_ns: end,
            attributes: request_attributes(row),
            error: failed.then(message),
        };
        let count = self.attempts.len();
        let attempts = self
            .attempts
            .into_iter()
            .enumerate()
            .map(|(i, a)| attempt_span(a, i + 1, i + 1 == count, self.span_id, end, row))
            .collect();
        Some(RequestSpans { trace_id: self.trace_id, request, attempts })
    }
}

/// The request span's attributes: what the request's row says.
fn request_attributes(row: &RequestRow) -> Vec<(&'static str, Value)> {
    let s = |v: &str| Value::Str(v.to_string());
    let mut a = vec![
        ("http.route", s(&row.endpoint)),
        ("corral.request_id", s(&row.id)),
        ("corral.status", s(&row.status)),
        ("corral.category", s(&row.category)),
        ("corral.origin", s(&row.origin)),
        ("corral.attempts", Value::Int(row.attempts)),
        ("corral.streamed", Value::Bool(row.streamed)),
    ];
    let optional: [(&'static str, Option<Value>); 12] = [
        ("gen_ai.request.model", Some(row.model.as_str()).filter(|m| !m.is_empty()).map(s)),
        ("http.response.status_code", row.http_status.map(Value::Int)),
        ("error.type", row.error_code.as_deref().map(s)),
        ("corral.node", row.node.as_deref().map(s)),
        ("corral.client_request_id", row.client_request_id.as_deref().map(s)),
        ("corral.queued_ms", row.queued_ms.map(Value::Int)),
        ("corral.ttfb_ms", row.ttfb_ms.map(Value::Int)),
        ("gen_ai.usage.input_tokens", row.prompt_tokens.map(Value::Int)),
        ("gen_ai.usage.output_tokens", row.completion_tokens.map(Value::Int)),
        ("corral.fallback.provider", row.fallback.as_deref().map(s)),
        // A model answered in the place of the one asked: a provider's, or a degrade step's.
        (
            if row.fallback.is_some() { "corral.fallback.model" } else { "corral.degraded.model" },
            row.answered_model.as_deref().map(s),
        ),
        ("corral.continued_by", row.continued_by.as_deref().map(s)),
    ];
    a.extend(optional.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))));
    a
}

/// One attempt's span; the `last` one, if still running, is the one that answered and ends
/// with the request, carrying its status and tokens.
fn attempt_span(a: Attempt, number: usize, last: bool, parent: [u8; 8], end: u64, row: &RequestRow) -> SpanData {
    let answered = last && a.end_ns.is_none();
    let outcome = match (answered, row.status.as_str()) {
        (true, "ok") => "success".to_string(),
        (true, status) => status.to_string(),
        (false, _) => a.outcome.clone(),
    };
    let mut attributes = vec![
        ("corral.node", Value::Str(a.node.clone())),
        ("corral.attempt", Value::Int(number as i64)),
        ("corral.outcome", Value::Str(outcome.clone())),
    ];
    if let Some(m) = &a.degraded {
        attributes.push(("corral.degraded.model", Value::Str(m.clone())));
    }
    let error = if answered {
        attributes.extend(
            [
                ("http.response.status_code", row.http_status),
                ("gen_ai.usage.input_tokens", row.prompt_tokens),
                ("gen_ai.usage.output_tokens", row.completion_tokens),
            ]
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, Value::Int(v)))),
        );
        matches!(row.status.as_str(), "error" | "interrupted").then_some(outcome)
    } else {
        attributes.push(("corral.detail", Value::Str(a.detail.clone())));
        Some(if a.detail.is_empty() { outcome } else { format!("{outcome}: {}", a.detail) })
    };
    SpanData {
        span_id: a.span_id,
        parent: Some(parent),
        remote_parent: false,
        name: format!("attempt {}", a.node),
        start_ns: a.start_ns,
        end_ns: a.end_ns.unwrap_or(end),
        attributes,
        error,
    }
}

/// What the exporter did, on `/metrics`.
#[derive(Debug, Clone, Default)]
pub struct Counters {
    pub exported: Counter,
    /// By reason: `queue_full` (the exporter fell behind) or `export_failed` (the collector
    /// did not take them).
    pub dropped: Family<DropLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct DropLabels {
    pub reason: String,
}

impl Counters {
    /// The counters, registered as `corral_otlp_exported_spans` and `corral_otlp_dropped_spans`.
    pub fn register(registry: &mut prometheus_client::registry::Registry) -> Self {
        let c = Self::default();
        registry.register("otlp_exported_spans", "Trace spans the OTLP collector accepted", c.exported.clone());
        registry.register(
            "otlp_dropped_spans",
            "Trace spans not exported, by reason: queue_full (the exporter fell behind) or export_failed (the collector did not take them)",
            c.dropped.clone(),
        );
        c
    }

    fn drop_spans(&self, reason: &str, n: usize) {
        self.dropped.get_or_create(&DropLabels { reason: reason.into() }).inc_by(n as u64);
    }
}

/// The request side of the exporter: where finished spans are offered.
#[derive(Debug)]
pub struct Exporter {
    tx: mpsc::Sender<RequestSpans>,
    counters: Counters,
}

impl Exporter {
    /// An exporter to `url` (`…/v1/traces`) and the task that sends for it until `cancel`.
    pub fn start(
        url: String,
        client: reqwest::Client,
        counters: Counters,
        cancel: CancellationToken,
    ) -> (Self, impl std::future::Future<Output = ()> + Send + 'static) {
        Self::start_with(url, client, counters, cancel, QUEUE_REQUESTS)
    }

    fn start_with(
        url: String,
        client: reqwest::Client,
        counters: Counters,
        cancel: CancellationToken,
        queue: usize,
    ) -> (Self, impl std::future::Future<Output = ()> + Send + 'static) {
        let (tx, rx) = mpsc::channel(queue);
        let post = Post { url, client, counters: counters.clone(), healthy: true };
        (Self { tx, counters }, run(rx, post, cancel))
    }

    /// Hand `spans` to the exporter without waiting; dropped and counted if it is behind.
    pub fn offer(&self, spans: RequestSpans) {
        let n = spans.len();
        if self.tx.try_send(spans).is_err() {
            self.counters.drop_spans("queue_full", n);
        }
    }
}

/// How batches leave: the collector's URL, the client, and whether the last export worked
/// (a change is logged once, not every batch).
struct Post {
    url: String,
    client: reqwest::Client,
    counters: Counters,
    healthy: bool,
}

impl Post {
    async fn send(&mut self, batch: Vec<RequestSpans>) {
        let n: usize = batch.iter().map(RequestSpans::len).sum();
        let body = prost::Message::encode_to_vec(&request(&batch));
        let sent = self
            .client
            .post(&self.url)
            .header(http::header::CONTENT_TYPE, "application/x-protobuf")
            .timeout(EXPORT_TIMEOUT)
            .body(body)
            .send()
            .await;
        let failure = match sent {
            Ok(r) if r.status().is_success() => None,
            Ok(r) => Some(format!("the collector answered HTTP {}", r.status().as_u16())),
            Err(e) => Some(e.to_string()),
        };
        match failure {
            None => {
                self.counters.exported.inc_by(n as u64);
                if !self.healthy {
                    tracing::info!(url = %self.url, "trace export works again");
                }
                self.healthy = true;
            }
            Some(why) => {
                self.counters.drop_spans("export_failed", n);
                if self.healthy {
                    tracing::warn!(url = %self.url, error = %why, spans = n, "cannot export traces; dropping them until the collector answers");
                }
                self.healthy = false;
            }
        }
    }
}

/// The exporter task: batch what requests offer, send, and at `cancel` send what is queued.
async fn run(mut rx: mpsc::Receiver<RequestSpans>, mut post: Post, cancel: CancellationToken) {
    loop {
        let first = tokio::select! {
            biased;
            _ = cancel.cancelled() => break,
            s = rx.recv() => s,
        };
        let Some(first) = first else { break };
        let mut batch = vec![first];
        let until = Instant::now() + FLUSH_EVERY;
        while batch.iter().map(RequestSpans::len).sum::<usize>() < BATCH_SPANS {
            tokio::select! {
                biased;
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep_until(until) => break,
                s = rx.recv() => match s {
                    Some(s) => batch.push(s),
                    None => break,
                },
            }
        }
        post.send(batch).await;
    }
    rx.close();
    let flush = async {
        let mut left = Vec::new();
        while let Ok(s) = rx.try_recv() {
            left.push(s);
        }
        for batch in left.chunks(BATCH_SPANS / 4) {
            post.send(batch.to_vec()).await;
        }
    };
    if tokio::time::timeout(FLUSH_AT_EXIT, flush).await.is_err() {
        tracing::warn!("trace export did not finish flushing at shutdown");
    }
}

/// The OTLP request for `batch`: one resource (this broker), one scope, every span.
pub fn request(batch: &[RequestSpans]) -> ExportTraceServiceRequest {
    let spans = batch
        .iter()
        .flat_map(|r| {
            let attempts = r.attempts.iter().map(|a| (a, SpanKind::Client));
            std::iter::once((&r.request, SpanKind::Server)).chain(attempts).map(move |(s, k)| span(r.trace_id, s, k))
        })
        .collect();
    let resource = Resource {
        attributes: vec![
            attribute("service.name", &Value::Str("corral".into())),
            attribute("service.version", &Value::Str(env!("CARGO_PKG_VERSION").into())),
        ],
        ..Resource::default()
    };
    let scope = InstrumentationScope {
        name: "corral".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        ..InstrumentationScope::default()
    };
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(resource),
            scope_spans: vec![ScopeSpans { scope: Some(scope), spans, ..ScopeSpans::default() }],
            ..ResourceSpans::default()
        }],
    }
}

/// Span flags: sampled, and whether the parent is remote (OTLP's `SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE`
/// and `SPAN_FLAGS_CONTEXT_IS_REMOTE`).
fn flags(s: &SpanData) -> u32 {
    0x01 | 0x100 | if s.remote_parent { 0x200 } else { 0 }
}

fn span(trace_id: [u8; 16], s: &SpanData, kind: SpanKind) -> Span {
    let status = match &s.error {
        Some(m) => Status { code: StatusCode::Error as i32, message: m.clone() },
        None => Status { code: StatusCode::Unset as i32, message: String::new() },
    };
    Span {
        trace_id: trace_id.to_vec(),
        span_id: s.span_id.to_vec(),
        parent_span_id: s.parent.map(|p| p.to_vec()).unwrap_or_default(),
        flags: flags(s),
        name: s.name.clone(),
        kind: kind as i32,
        start_time_unix_nano: s.start_ns,
        end_time_unix_nano: s.end_ns.max(s.start_ns),
        attributes: s.attributes.iter().map(|(k, v)| attribute(k, v)).collect(),
        status: Some(status),
        ..Span::default()
    }
}

fn attribute(key: &str, v: &Value) -> KeyValue {
    let value = match v {
        Value::Str(s) => any_value::Value::StringValue(s.clone()),
        Value::Int(i) => any_value::Value::IntValue(*i),
        Value::Bool(b) => any_value::Value::BoolValue(*b),
    };
    KeyValue { key: key.into(), value: Some(AnyValue { value: Some(value) }), ..KeyValue::default() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_is_read_as_w3c_says() {
        let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let p = Parent::parse(ok).expect("the spec's example");
        assert_eq!(to_hex(&p.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(to_hex(&p.span_id), "00f067aa0ba902b7");
        assert!(p.sampled);
        assert_eq!(p.header(), ok, "written back the same");
        let unsampled = Parent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").expect("valid");
        assert!(!unsampled.sampled);
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes-next";
        assert!(Parent::parse(later).is_some(), "a later version's extra fields are ignored");
        for bad in [
            "",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-011",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0é",
        ] {
            assert_eq!(Parent::parse(bad), None, "{bad:?} is not a traceparent");
        }
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_without_waiting() {
        let counters = Counters::default();
        let cancel = CancellationToken::new();
        // The task is never run: nothing drains the queue of one.
        let (e, _task) = Exporter::start_with(
            "http://127.0.0.1:9/v1/traces".into(),
            reqwest::Client::new(),
            counters.clone(),
            cancel,
            1,
        );
        let mut live = Live::new();
        live.attempt_began("gpu0", None);
        let spans = live.finish(&RequestRow { status: "ok".into(), ..RequestRow::default() }).expect("sampled");
        for _ in 0..3 {
            e.offer(spans.clone());
        }
        let full = counters.dropped.get_or_create(&DropLabels { reason: "queue_full".into() }).get();
        assert_eq!(full, 4, "two requests of two spans each found the queue full");
    }

    #[test]
    fn an_unsampled_parent_exports_nothing_but_is_passed_on() {
        let mut live = Live::new();
        live.continue_from(Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"));
        let sent = live.attempt_began("gpu0", None);
        assert!(sent.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-") && sent.ends_with("-00"), "{sent}");
        assert!(live.finish(&RequestRow::default()).is_none(), "the client chose not to sample this trace");
    }

    #[test]
    fn attempts_are_children_of_the_request_and_the_last_one_answered() {
        let mut live = Live::new();
        live.continue_from(Some("bogus"));
        live.attempt_began("n0", None);
        live.attempt_failed("failed", "HTTP 500");
        live.attempt_began("n1", Some("llama3.2:1b".into()));
        let row = RequestRow {
            status: "ok".into(),
            endpoint: "/api/chat".into(),
            completion_tokens: Some(12),
            answered_model: Some("llama3.2:1b".into()),
            ..RequestRow::default()
        };
        let r = live.finish(&row).expect("sampled");
        assert_eq!(r.request.parent, None, "an invalid traceparent starts a fresh trace");
        assert!(r.attempts.iter().all(|a| a.parent == Some(r.request.span_id)));
        let outcome = |s: &SpanData| s.attributes.iter().find(|(k, _)| *k == "corral.outcome").map(|(_, v)| v.clone());
        assert_eq!(outcome(&r.attempts[0]), Some(Value::Str("failed".into())));
        assert_eq!(r.attempts[0].error.as_deref(), Some("failed: HTTP 500"));
        assert_eq!(outcome(&r.attempts[1]), Some(Value::Str("success".into())));
        assert!(r.attempts[1].attributes.contains(&("gen_ai.usage.output_tokens", Value::Int(12))));
        assert!(r.attempts[1].attributes.contains(&("corral.degraded.model", Value::Str("llama3.2:1b".into()))));
        assert!(r.request.attributes.contains(&("corral.degraded.model", Value::Str("llama3.2:1b".into()))));
    }

    #[test]
    fn spans_encode_with_parents_kinds_and_status() {
        let data = |id: u8, parent: Option<u8>, error: Option<&str>| SpanData {
            span_id: [id; 8],
            parent: parent.map(|p| [p; 8]),
            remote_parent: parent == Some(9),
            name: format!("s{id}"),
            start_ns: 10,
            end_ns: 5,
            attributes: vec![("corral.node", Value::Str("gpu0".into())), ("n", Value::Int(3))],
            error: error.map(str::to_string),
        };
        let r = RequestSpans {
            trace_id: [7; 16],
            request: data(1, Some(9), None),
            attempts: vec![data(2, Some(1), Some("failed"))],
        };
        let bytes = prost::Message::encode_to_vec(&request(&[r]));
        let back: ExportTraceServiceRequest = prost::Message::decode(bytes.as_slice()).expect("decodes");
        let spans = &back.resource_spans[0].scope_spans[0].spans;
        assert_eq!(spans.len(), 2);
        assert_eq!((spans[0].kind, spans[1].kind), (SpanKind::Server as i32, SpanKind::Client as i32));
        assert_eq!(spans[0].parent_span_id, vec![9; 8]);
        assert_eq!(spans[0].flags, 0x301, "the request span's parent is the client's");
        assert_eq!(spans[1].flags, 0x101);
        assert_eq!(spans[1].status.as_ref().map(|s| s.code), Some(StatusCode::Error as i32));
        assert_eq!(spans[0].end_time_unix_nano, 10, "an end before the start is clamped to it");
    }
}
