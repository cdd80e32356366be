//! OpenTelemetry export (issue 19, item 4): with `[telemetry] otlp_endpoint`, a request is one
//! trace (a request span and a child span per attempt) POSTed as OTLP/HTTP protobuf, decoded
//! here with the official opentelemetry-proto messages; the trace continues the client's
//! `traceparent` and is passed on to the node; a collector that does not answer costs requests
//! nothing and its drops are counted.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{cluster, eventually, Cluster};
use corral::config::Policy;
use corral::sim::Faults;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::Span;

/// An OTLP/HTTP trace receiver on loopback: every span it was sent, decoded.
async fn receiver() -> (String, Arc<Mutex<Vec<Span>>>) {
    let spans = Arc::new(Mutex::new(Vec::new()));
    let kept = Arc::clone(&spans);
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |headers: http::HeaderMap, body: axum::body::Bytes| {
            let kept = Arc::clone(&kept);
            async move {
                let ct = headers.get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
                assert_eq!(ct, Some("application/x-protobuf"), "OTLP/HTTP protobuf is announced as such");
                let req: ExportTraceServiceRequest =
                    prost::Message::decode(body).expect("an ExportTraceServiceRequest");
                let mut all = kept.lock().expect("receiver lock");
                for rs in req.resource_spans {
                    for ss in rs.scope_spans {
                        all.extend(ss.spans);
                    }
                }
                http::StatusCode::OK
            }
        }),
    );
    let url = common::serve(app).await;
    (url, spans)
}

/// Two nodes tried in order n0, n1, exporting to `endpoint`.
async fn traced_cluster(endpoint: String) -> Cluster {
    let c = cluster(2)
        .policy(Policy::Priority)
        .config(move |cfg| {
            cfg.categories[0].order = vec!["n0".into(), "n1".into()];
            cfg.telemetry.otlp_endpoint = Some(endpoint);
        })
        .start()
        .await;
    c.learn_models().await;
    c
}

async fn chat_with(c: &Cluster, traceparent: Option<&str>) -> reqwest::Response {
    let body =
        serde_json::json!({"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}], "stream": false});
    let mut req = c.client.post(c.url("/api/chat")).json(&body);
    if let Some(tp) = traceparent {
        req = req.header("traceparent", tp);
    }
    req.send().await.expect("broker answers")
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn attr(s: &Span, key: &str) -> Option<Value> {
    s.attributes.iter().find(|kv| kv.key == key).and_then(|kv| kv.value.clone()).and_then(|v| v.value)
}

fn text(s: &Span, key: &str) -> String {
    match attr(s, key) {
        Some(Value::StringValue(v)) => v,
        other => panic!("span {} has no string {key}: {other:?}", s.name),
    }
}

/// The spans of trace `trace_id` once the request span and `attempts` attempt spans are in.
async fn trace_of(spans: &Arc<Mutex<Vec<Span>>>, trace_id: &str, attempts: usize) -> Vec<Span> {
    let got =
        || spans.lock().expect("lock").iter().filter(|s| hex(&s.trace_id) == trace_id).cloned().collect::<Vec<_>>();
    eventually(Duration::from_secs(10), || got().len() > attempts).await;
    got()
}

#[tokio::test]
async fn a_failed_over_chat_is_one_trace_that_continues_the_clients_and_reaches_the_node() {
    let (endpoint, spans) = receiver().await;
    let c = traced_cluster(endpoint).await;
    c.sims[0].set_faults(Faults::statuses(500, 1));
    let (trace_id, client_span) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let r = chat_with(&c, Some(&format!("00-{trace_id}-{client_span}-01"))).await;
    assert_eq!(r.status(), 200, "n1 answers after n0's 500");
    assert_eq!(r.headers().get("x-corral-attempts").and_then(|v| v.to_str().ok()), Some("2"));
    let _ = r.bytes().await.expect("body");

    let trace = trace_of(&spans, trace_id, 2).await;
    assert_eq!(trace.len(), 3, "one request span and two attempt spans, all in the client's trace: {trace:#?}");
    let request: Vec<&Span> = trace.iter().filter(|s| s.kind == SpanKind::Server as i32).collect();
    assert_eq!(request.len(), 1, "one request span");
    let request = request[0];
    assert_eq!(hex(&request.parent_span_id), client_span, "the request span is a child of the client's span");
    assert_eq!(text(request, "corral.node"), "n1");
    let mut attempts: Vec<&Span> = trace.iter().filter(|s| s.kind == SpanKind::Client as i32).collect();
    attempts.sort_by_key(|s| s.start_time_unix_nano);
    assert!(attempts.iter().all(|a| a.parent_span_id == request.span_id), "attempts are children of the request");
    let seen: Vec<(String, String)> =
        attempts.iter().map(|a| (text(a, "corral.node"), text(a, "corral.outcome"))).collect();
    assert_eq!(seen, [("n0".into(), "failed".into()), ("n1".into(), "success".into())]);
    assert!(attempts[0].end_time_unix_nano <= attempts[1].start_time_unix_nano, "the retry follows the failure");
    assert!(request.start_time_unix_nano <= attempts[0].start_time_unix_nano);
    assert!(request.end_time_unix_nano >= attempts[1].end_time_unix_nano, "the request ends with its answer");

    // Each node was sent its own attempt's span as the parent, in the same trace.
    for (sim, attempt) in c.sims.iter().zip(&attempts) {
        let sent: Vec<String> =
            sim.received().into_iter().filter(|r| r.path == "/api/chat").filter_map(|r| r.traceparent).collect();
        let want = format!("00-{trace_id}-{}-01", hex(&attempt.span_id));
        assert_eq!(sent, [want], "the node continues the trace under its attempt span");
    }
}

#[tokio::test]
async fn without_a_traceparent_a_fresh_trace_is_made_and_passed_on() {
    let (endpoint, spans) = receiver().await;
    let c = traced_cluster(endpoint).await;
    let r = chat_with(&c, None).await;
    assert_eq!(r.status(), 200);
    let _ = r.bytes().await.expect("body");
    let sent = c.sims[0].received().into_iter().find(|r| r.path == "/api/chat").and_then(|r| r.traceparent);
    let sent = sent.expect("the node was sent a traceparent");
    let trace_id = sent.split('-').nth(1).expect("a trace id field").to_string();
    assert_ne!(trace_id, "0".repeat(32), "a real trace id");
    let trace = trace_of(&spans, &trace_id, 1).await;
    assert_eq!(trace.len(), 2, "request span and one attempt: {trace:#?}");
    let request = trace.iter().find(|s| s.kind == SpanKind::Server as i32).expect("request span");
    assert!(request.parent_span_id.is_empty(), "a fresh trace has a root span");
    assert_eq!(text(request, "http.route"), "/api/chat");

    let again = chat_with(&c, None).await;
    let _ = again.bytes().await;
    let second =
        c.sims[0].received().into_iter().filter(|r| r.path == "/api/chat").filter_map(|r| r.traceparent).nth(1);
    assert!(!second.expect("second traceparent").contains(&trace_id), "every request is its own trace");
}

/// A collector that takes connections and never answers: the slowest a collector can be.
async fn black_hole() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            held.push(conn);
        }
    });
    url
}

#[tokio::test]
async fn a_collector_that_never_answers_neither_slows_nor_fails_requests_and_drops_are_counted() {
    let c = traced_cluster(black_hole().await).await;
    for i in 0..10 {
        let started = tokio::time::Instant::now();
        let r = chat_with(&c, None).await;
        assert_eq!(r.status(), 200, "request {i} is served whatever the collector does");
        let _ = r.bytes().await.expect("body");
        // The export waits up to 5 s for the collector; a request that waited for it would show.
        assert!(started.elapsed() < Duration::from_secs(2), "request {i} took {:?}", started.elapsed());
    }
    let metrics = || async {
        let r = c.admin(reqwest::Method::GET, "/metrics").send().await.expect("metrics");
        r.text().await.expect("text")
    };
    let line = "corral_otlp_dropped_spans_total{reason=\"export_failed\"}";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let mut text = metrics().await;
    while !text.contains(line) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        text = metrics().await;
    }
    let dropped: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix(line))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("the failed export is counted: {text}"));
    assert!(dropped >= 2, "at least the first request's spans were dropped, not {dropped}");
    assert!(text.contains("corral_otlp_exported_spans_total 0"), "none reached a collector");
}
