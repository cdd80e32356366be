//! Failover against upstreams that say "not now": a 429 is busy, not broken (issue 14).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::cluster;
use corral::config::{CloudPermission, NodeConfig, NodeKind, ProviderConfig};
use corral::sim::{SimNode, SimSpec};
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
    let url = common::serve(app).await;
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

/// `body` with what differs per answer by design blanked: its `created_at` stamp and tool
/// call ids (Ollama makes both afresh for every answer).
fn unstamped(body: &str) -> String {
    let v: Value = serde_json::from_str(body).expect("json");
    let stamp = v["created_at"].as_str().expect("created_at").to_string();
    assert!(!stamp.is_empty(), "the answer is stamped: {body}");
    let mut out = body.replacen(&stamp, "<created_at>", 1);
    for call in v["message"]["tool_calls"].as_array().into_iter().flatten() {
        let id = call["id"].as_str().expect("id");
        out = out.replacen(&format!("\"{id}\""), "\"<id>\"", 1);
    }
    out
}

#[tokio::test]
async fn a_non_streamed_answer_is_assembled_from_a_stream_byte_for_byte() {
    let c = cluster(1).start().await;
    let direct = reqwest::Client::new();
    // Loaded first, so neither answer below carries a cold load's duration.
    let warm = json!({"model": "llama3.2", "prompt": "", "stream": false});
    direct.post(format!("{}/api/generate", c.sims[0].url())).json(&warm).send().await.expect("sim loads");
    let cases = [
        (
            "/api/chat",
            json!({"model": "llama3.2", "messages": [{"role": "user", "content": "a <b> & c"}], "stream": false, "options": {"seed": 11}}),
        ),
        (
            "/api/chat",
            json!({"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}], "stream": false, "think": true, "options": {"seed": 12}}),
        ),
        (
            "/api/chat",
            json!({"model": "llama3.2", "messages": [{"role": "user", "content": "weather?"}], "stream": false,
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]}),
        ),
        (
            "/api/generate",
            json!({"model": "llama3.2", "prompt": "once upon", "stream": false, "think": true, "options": {"seed": 13, "num_predict": 9}}),
        ),
    ];
    for (path, body) in cases {
        let own = direct.post(format!("{}{path}", c.sims[0].url())).json(&body).send().await.expect("sim answers");
        let own_type = own.headers()["content-type"].clone();
        let own = own.text().await.expect("body");
        let via = c.post(path, body.clone()).await;
        assert_eq!(via.status(), 200);
        assert_eq!(via.headers()["content-type"], own_type, "{path}: the same content type as the node's own");
        let via = via.text().await.expect("body");
        assert_eq!(unstamped(&via), unstamped(&own), "{path} {body}: Corral's assembly is the node's own answer");
    }
}

#[tokio::test]
async fn a_long_non_streamed_answer_is_not_cut_by_the_first_token_deadline() {
    // 12 tokens 60 ms apart: the whole answer takes ~0.7 s, its first token comes at once.
    let c = cluster(1).config(|cfg| cfg.categories[0].first_token_timeout_ms = 300).start().await;
    c.sims[0].set_faults(corral::sim::Faults { token_delay_ms: Some(60), ..Default::default() });
    let r = c
        .post("/api/chat", json!({"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}], "stream": false, "options": {"num_predict": 12}}))
        .await;
    assert_eq!(r.status(), 200, "the deadline is on the first token, not the whole answer");
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["eval_count"], 12);
    assert_eq!(v["done"], true);
}

#[tokio::test]
async fn a_slow_first_token_moves_a_non_streamed_request_to_another_node() {
    // n0's first token takes 3 s; the category waits 300 ms for one.
    let c = cluster(2)
        .config(|cfg| {
            cfg.categories[0].first_token_timeout_ms = 300;
            cfg.categories[0].policy = corral::config::Policy::Priority;
            cfg.categories[0].order = vec!["n0".into(), "n1".into()];
        })
        .start()
        .await;
    c.sims[0].set_faults(corral::sim::Faults { ttft_ms: Some(3_000), ..Default::default() });
    for stream in [false, true] {
        let started = tokio::time::Instant::now();
        let r = c.chat("llama3.2", stream).await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-corral-node"], "n1", "answered by the node that was not slow");
        assert_eq!(r.headers()["x-corral-attempts"], "2");
        let text = r.text().await.expect("body");
        let elapsed = started.elapsed();
        assert!(elapsed >= std::time::Duration::from_millis(300), "it waited the deadline first: {elapsed:?}");
        assert!(elapsed < std::time::Duration::from_millis(2_000), "moved at the deadline, not after 3 s: {elapsed:?}");
        assert!(text.contains("\"done\":true"), "{text}");
    }
    assert_eq!(
        c.node(0).breaker_state(),
        corral::breaker::BreakerState::Closed,
        "slow for this category's deadline is not broken"
    );
}

#[tokio::test]
async fn a_node_that_keeps_missing_the_first_token_deadline_is_marked_slow_and_tried_last() {
    let c = cluster(2)
        .config(|cfg| {
            cfg.categories[0].first_token_timeout_ms = 150;
            cfg.categories[0].policy = corral::config::Policy::Priority;
            cfg.categories[0].order = vec!["n0".into(), "n1".into()];
        })
        .start()
        .await;
    c.sims[0].set_faults(corral::sim::Faults { ttft_ms: Some(3_000), ..Default::default() });
    let slow = || async {
        let v: serde_json::Value =
            c.admin(reqwest::Method::GET, "/admin/nodes").send().await.expect("nodes").json().await.expect("json");
        (v[0]["slow"].clone(), v[0]["first_token_misses"].clone(), v[0]["state"].clone())
    };
    for miss in 1..=corral::node::SLOW_AFTER_MISSES {
        let r = c.chat("llama3.2", false).await;
        assert_eq!(
            (r.headers()["x-corral-node"].to_str().ok(), r.headers()["x-corral-attempts"].to_str().ok()),
            (Some("n1"), Some("2"))
        );
        assert_eq!(slow().await.1, miss, "misses counted");
    }
    assert_eq!(
        slow().await,
        (serde_json::json!(true), serde_json::json!(3), serde_json::json!("healthy")),
        "slow, still healthy"
    );
    // n0 is first in the order, but a slow node is tried after the others: no deadline waited.
    let started = tokio::time::Instant::now();
    let r = c.chat("llama3.2", false).await;
    assert_eq!(
        (r.headers()["x-corral-node"].to_str().ok(), r.headers()["x-corral-attempts"].to_str().ok()),
        (Some("n1"), Some("1"))
    );
    assert!(started.elapsed() < std::time::Duration::from_millis(150), "{:?}", started.elapsed());
    assert_eq!(c.node(0).breaker_state(), corral::breaker::BreakerState::Closed);
}

/// A cluster of `n` sims where n0 is tried first, first-byte timeout `ms`.
fn first_is_n0(n: usize, ms: u64) -> common::ClusterBuilder {
    cluster(n).config(move |cfg| {
        cfg.proxy.first_byte_timeout_ms = ms;
        cfg.categories[0].policy = corral::config::Policy::Priority;
        cfg.categories[0].order = vec!["n0".into()];
    })
}

#[tokio::test]
async fn a_node_that_accepts_and_never_answers_costs_one_first_byte_timeout_once() {
    let c = first_is_n0(2, 400).start().await;
    c.sims[0].set_faults(corral::sim::Faults { hang: true, ..Default::default() });
    let started = tokio::time::Instant::now();
    let r = c.chat("llama3.2", false).await;
    let first = started.elapsed();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-corral-node"], "n1");
    assert!(first >= std::time::Duration::from_millis(400), "{first:?}");
    assert!(first < std::time::Duration::from_millis(1_200), "one timeout, not three: {first:?}");
    assert_eq!(c.node(0).breaker_state(), corral::breaker::BreakerState::Open, "one silence takes it out");
    for _ in 0..5 {
        let started = tokio::time::Instant::now();
        let r = c.chat("llama3.2", false).await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-corral-node"], "n1");
        assert!(started.elapsed() < std::time::Duration::from_millis(400), "no more waiting on n0");
    }
    assert_eq!(c.sims[0].inference_count(), 1, "while its breaker is open n0 gets no client traffic");
}

#[tokio::test]
async fn the_last_node_standing_is_tried_once_and_the_client_learns_within_one_timeout() {
    let c = first_is_n0(1, 300).config(|cfg| cfg.retry.max_attempts = 3).start().await;
    c.sims[0].set_faults(corral::sim::Faults { hang: true, ..Default::default() });
    for round in 0..2 {
        let started = tokio::time::Instant::now();
        let r = c.chat("llama3.2", false).await;
        let took = started.elapsed();
        assert_eq!(r.status(), 504, "round {round}");
        assert_eq!(r.headers()["x-corral-attempts"], "1", "round {round}: never the same silent node twice");
        let v: Value = r.json().await.expect("json");
        assert_eq!(v["code"], "upstream_timeout");
        assert!(took < std::time::Duration::from_millis(900), "round {round}: one timeout: {took:?}");
    }
    assert_eq!(c.sims[0].inference_count(), 2, "once per request, with nowhere else to go");
}

#[tokio::test]
async fn an_open_breaker_sends_requests_to_the_cloud_instead_of_the_dead_node() {
    let cloud = SimNode::start(SimSpec { models: vec!["gpt-4o-mini".into()], cloud: true, ..SimSpec::default() })
        .await
        .expect("cloud sim");
    let base_url = format!("{}/v1", cloud.url());
    let c = first_is_n0(1, 300)
        .config(move |cfg| {
            cfg.providers = vec![ProviderConfig {
                name: "cloud".into(),
                base_url,
                model_map: [("llama3.2".to_string(), "gpt-4o-mini".to_string())].into(),
                ..ProviderConfig::default()
            }];
            cfg.categories[0].cloud = CloudPermission::OnFailure;
            cfg.categories[0].providers = vec!["cloud".into()];
        })
        .start()
        .await;
    c.sims[0].set_faults(corral::sim::Faults { hang: true, ..Default::default() });
    let started = tokio::time::Instant::now();
    let r = c.chat("llama3.2", false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-corral-fallback"], "cloud");
    assert!(started.elapsed() < std::time::Duration::from_millis(900), "one timeout, then the cloud");
    for _ in 0..3 {
        let started = tokio::time::Instant::now();
        let r = c.chat("llama3.2", false).await;
        assert_eq!(r.headers()["x-corral-fallback"], "cloud");
        assert!(started.elapsed() < std::time::Duration::from_millis(300), "straight to the cloud");
    }
    assert_eq!(c.sims[0].inference_count(), 1, "an ejected node is not forced while the cloud can answer");
}

#[tokio::test]
async fn a_stalled_stream_ends_within_the_categorys_idle_timeout_and_a_stalled_assembly_goes_elsewhere() {
    let c = first_is_n0(2, 5_000).config(|cfg| cfg.categories[0].stream_idle_timeout_ms = 300).start().await;
    c.sims[0].set_faults(corral::sim::Faults { hang_after: Some(3), ..Default::default() });
    let started = tokio::time::Instant::now();
    let r = c.chat("llama3.2", true).await;
    assert_eq!(r.headers()["x-corral-node"], "n0");
    let lines = common::ndjson(&r.text().await.expect("body"));
    let took = started.elapsed();
    assert_eq!(lines.last().expect("lines")["code"], "stream_idle_timeout", "{lines:?}");
    assert!(took < std::time::Duration::from_millis(1_500), "{took:?}");
    // Not streamed: nothing reached the client when n0 stalled, so n1 answers it whole.
    let r = c.chat("llama3.2", false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-corral-node"], "n1");
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["done"], true);
}

#[test]
fn the_defaults_bound_a_clients_wait_in_tens_of_seconds() {
    let d = corral::config::Config::default();
    assert!(d.proxy.first_byte_timeout_ms <= 60_000, "{}", d.proxy.first_byte_timeout_ms);
    assert!(d.categories[0].stream_idle_timeout_ms <= 30_000);
}

#[tokio::test]
async fn with_every_node_rate_limited_the_same_node_is_asked_again_only_after_its_retry_after() {
    let c = cluster(1).start().await;
    let limited = |retry_after| corral::sim::Faults {
        script: [corral::sim::ScriptStep::rate_limited(1, Some(retry_after))].into(),
        ..Default::default()
    };
    c.sims[0].set_faults(limited(1));
    let started = tokio::time::Instant::now();
    let r = c.chat("llama3.2", false).await;
    let took = started.elapsed();
    assert_eq!(r.status(), 200, "answered once its Retry-After was over");
    assert_eq!(r.headers()["x-corral-attempts"], "2");
    assert!(took >= std::time::Duration::from_millis(1_000), "it waited what the node asked: {took:?}");
    assert!(took < std::time::Duration::from_millis(1_800), "{took:?}");
    // A wait past the queue timeout is not waited: the client hears at once, with a Retry-After.
    c.sims[0].set_faults(limited(30));
    let started = tokio::time::Instant::now();
    let r = c
        .client
        .post(c.url("/api/chat"))
        .header("x-corral-queue-timeout", "2000")
        .json(&json!({"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}], "stream": false}))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(r.json::<Value>().await.expect("json")["code"], "cluster_busy");
    assert!(started.elapsed() < std::time::Duration::from_millis(1_000), "no pointless wait");
    assert_eq!(c.sims[0].inference_count(), 3, "two for the first request, one for the second");
}

/// The text of an NDJSON chat stream, and its last line.
fn chat_text(lines: &[Value]) -> String {
    lines.iter().filter_map(|l| l["message"]["content"].as_str()).collect()
}

async fn rows_of(c: &common::Cluster) -> Vec<corral::store::RequestRow> {
    let store = c.broker.shared().telemetry.store().expect("store on").clone();
    for _ in 0..300 {
        let rows = store.requests(&corral::store::Query::default()).await.expect("query");
        if !rows.is_empty() && rows.iter().all(|r| r.status != "running") {
            return rows;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("no finished record");
}

#[tokio::test]
async fn with_continue_on_cut_a_cut_stream_is_finished_by_another_node_as_one_answer() {
    let c = first_is_n0(2, 5_000).config(|cfg| cfg.categories[0].continue_on_cut = true).start().await;
    let body = json!({"model": "llama3.2", "messages": [{"role": "user", "content": "tell me"}], "options": {"seed": 5, "num_predict": 60}});
    // What an uncut node answers.
    let whole =
        reqwest::Client::new().post(format!("{}/api/chat", c.sims[1].url())).json(&body).send().await.expect("sim");
    let whole = common::ndjson(&whole.text().await.expect("body"));
    let (whole_text, whole_count) = (chat_text(&whole), whole.last().expect("last")["eval_count"].clone());
    assert_eq!(whole_count, 60);
    // Cut after 40 of the 60 tokens.
    c.sims[0].set_faults(corral::sim::Faults { cut_after: Some(40), ..Default::default() });
    let r = c.post("/api/chat", body).await;
    assert_eq!(r.headers()["x-corral-node"], "n0");
    let lines = common::ndjson(&r.text().await.expect("body"));
    let last = lines.last().expect("lines");
    assert_eq!(last["done"], true, "one answer, ending in done:true: {lines:?}");
    assert_eq!(lines.iter().filter(|l| l["done"] == true).count(), 1);
    assert!(lines.iter().all(|l| l.get("error").is_none()), "no error line: {lines:?}");
    assert_eq!(chat_text(&lines), whole_text, "the two parts are the answer an uncut node gives");
    assert_eq!(last["eval_count"], whole_count, "the count covers both parts");
    assert_eq!(c.sims[1].inference_count(), 2, "n1 continued it (after answering it whole for the comparison)");
    let rows = rows_of(&c).await;
    let row = rows.iter().find(|r| r.endpoint == "/api/chat").expect("row");
    assert_eq!((row.node.as_deref(), row.continued_by.as_deref()), (Some("n0"), Some("n1")), "{row:?}");
    assert_eq!(row.status, "ok");
}

#[tokio::test]
async fn a_continuation_the_next_upstream_refuses_ends_with_the_error_line() {
    let strict =
        SimNode::start(SimSpec { cloud: true, refuse_prefill: true, ..SimSpec::default() }).await.expect("sim");
    let url = strict.url();
    let c = first_is_n0(1, 5_000)
        .config(move |cfg| {
            cfg.categories[0].continue_on_cut = true;
            cfg.nodes.push(NodeConfig { name: "strict".into(), url, kind: NodeKind::Openai, ..NodeConfig::default() });
        })
        .start()
        .await;
    c.learn_models().await;
    c.sims[0].set_faults(corral::sim::Faults { cut_after: Some(5), ..Default::default() });
    let seed = common::long_seed(24);
    let r = c
        .post("/api/chat", json!({"model": "llama3.2", "messages": [{"role": "user", "content": "tell me"}], "options": {"seed": seed}}))
        .await;
    let lines = common::ndjson(&r.text().await.expect("body"));
    let last = lines.last().expect("lines");
    assert_eq!(last["code"], "stream_interrupted", "{lines:?}");
    assert!(last["error"].as_str().unwrap_or_default().contains("no other node continued it"), "{last}");
    assert!(lines.iter().all(|l| l["done"] != true), "never a fake done: {lines:?}");
    assert_eq!(strict.inference_count(), 1, "the prefill was asked of the other node, which refused it");
}

#[tokio::test]
async fn a_non_streamed_v1_chat_is_assembled_from_the_nodes_sse_as_ollama_writes_it() {
    let c = cluster(1).start().await;
    let direct = reqwest::Client::new();
    let cases = [
        json!({"model": "llama3.2", "messages": [{"role": "user", "content": "a <b> & c"}], "seed": 21}),
        json!({"model": "llama3.2", "messages": [{"role": "user", "content": "hm"}], "stream": false, "reasoning_effort": "low", "seed": 22, "max_tokens": 7}),
        json!({"model": "llama3.2", "messages": [{"role": "user", "content": "weather?"}],
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]}),
    ];
    // Loaded first, so both answers below are warm.
    direct.post(format!("{}/v1/chat/completions", c.sims[0].url())).json(&cases[0]).send().await.expect("sim");
    for body in cases {
        let own =
            direct.post(format!("{}/v1/chat/completions", c.sims[0].url())).json(&body).send().await.expect("sim");
        let own_type = own.headers()["content-type"].clone();
        let mut own: Value = own.json().await.expect("json");
        let via = c.post("/v1/chat/completions", body.clone()).await;
        assert_eq!(via.status(), 200);
        assert_eq!(via.headers()["content-type"], own_type);
        let mut via: Value = via.json().await.expect("json");
        // Made afresh for every answer by Ollama too.
        for v in [&mut own, &mut via] {
            v["id"] = json!("<id>");
            v["created"] = json!(0);
            for call in v["choices"][0]["message"]["tool_calls"].as_array_mut().into_iter().flatten() {
                call["id"] = json!("<id>");
            }
        }
        assert_eq!(via, own, "{body}");
    }
}

#[tokio::test]
async fn a_slow_first_token_moves_a_non_streamed_v1_chat_to_another_node() {
    let c = cluster(2)
        .config(|cfg| {
            cfg.categories[0].first_token_timeout_ms = 300;
            cfg.categories[0].policy = corral::config::Policy::Priority;
        })
        .start()
        .await;
    c.sims[0].set_faults(corral::sim::Faults { ttft_ms: Some(3_000), ..Default::default() });
    let started = tokio::time::Instant::now();
    let r = c
        .post("/v1/chat/completions", json!({"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}]}))
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-corral-node"], "n1");
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["object"], "chat.completion");
    assert!(started.elapsed() < std::time::Duration::from_millis(2_000));
}

#[tokio::test]
async fn a_long_one_json_answer_whose_first_token_cannot_be_seen_is_not_a_silent_node() {
    // An OpenAI-compatible node answering `/v1` in one JSON: its first byte is its last.
    let node = SimNode::start(SimSpec { cloud: true, ..SimSpec::default() }).await.expect("sim");
    node.set_faults(corral::sim::Faults { token_delay_ms: Some(60), ..Default::default() });
    let url = node.url();
    let c = cluster(0)
        .config(move |cfg| {
            cfg.proxy.first_byte_timeout_ms = 300;
            cfg.nodes = vec![NodeConfig { name: "llama".into(), url, kind: NodeKind::Openai, ..NodeConfig::default() }];
        })
        .start()
        .await;
    c.learn_models().await;
    let body = json!({"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 12});
    let r = c.post("/v1/chat/completions", body).await;
    assert_eq!(r.status(), 200, "12 tokens at 60 ms take longer than one first-byte timeout, and are waited for");
    assert_eq!(c.node(0).breaker_state(), corral::breaker::BreakerState::Closed);
}
