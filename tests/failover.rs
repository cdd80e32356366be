//! Failover against upstreams that say "not now": a 429 is busy, not broken (issue 14).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::cluster;
use corral::config::{NodeConfig, NodeKind};
use serde_json::{json, Value};

/// An OpenAI-compatible server that lists `llama3.2` and answers every chat 429 with
/// `Retry-After: 2`, counting the chats it was sent.
async fn rate_limited_node() -> (String, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&hits);
    let app = axum::Router::new()
        .route("/health", axum::routing::get(|| async { "ok" }))
        .route(
            "/v1/models",
            axum::routing::get(|| async {
                axum::Json(json!({"object": "list", "data": [{"id": "llama3.2", "object": "model"}]}))
            }),
        )
        .route(
            "/v1/chat/completions",
            axum::routing::post(move || {
                let hits = Arc::clone(&counted);
                async move {
                    hits.fetch_add(1, Ordering::Relaxed);
                    let body = json!({"error": {"message": "rate limit reached", "type": "rate_limit_error"}});
                    (http::StatusCode::TOO_MANY_REQUESTS, [(http::header::RETRY_AFTER, "2")], axum::Json(body))
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, hits)
}

#[tokio::test]
async fn a_429_sends_the_request_elsewhere_at_once_and_keeps_that_node_out_for_its_retry_after() {
    let (url, hits) = rate_limited_node().await;
    let c = cluster(1)
        .config(move |cfg| {
            cfg.nodes.push(NodeConfig { name: "limited".into(), url, kind: NodeKind::Openai, ..NodeConfig::default() });
            cfg.categories[0].policy = corral::config::Policy::RoundRobin;
        })
        .start()
        .await;
    c.learn_models().await;
    for i in 0..6 {
        let r = c.chat("llama3.2", false).await;
        assert_eq!(r.status(), 200, "request {i} is served by the other node");
        let _: Value = r.json().await.expect("json");
    }
    assert_eq!(hits.load(Ordering::Relaxed), 1, "after its 429 the node is left alone for its Retry-After (2 s)");
    let limited = c.broker.registry().get("limited").expect("node");
    assert_eq!(limited.breaker_state(), corral::breaker::BreakerState::Closed, "a 429 is busy, not a failure");
    assert!(limited.held_off(tokio::time::Instant::now()), "still inside its Retry-After");
}
