//! Trust, from the client side: remote clients cannot crowd out the owner, pick categories
//! they were not given, or wait as long as they like; records cannot be forged or flooded by
//! what a client sends (SECURITY.md, findings 7 and 10).

mod common;

use std::time::Duration;

use common::cluster;
use corral::config::{CategoryConfig, ListenerConfig, Origin};
use serde_json::{json, Value};

fn remote_listener(tweak: impl FnOnce(&mut ListenerConfig)) -> ListenerConfig {
    let mut l = ListenerConfig { addr: "127.0.0.1:0".into(), origin: Origin::Remote, ..ListenerConfig::default() };
    tweak(&mut l);
    l
}

fn chat_body() -> Value {
    json!({"model": "llama3.2", "stream": false, "messages": [{"role": "user", "content": "hi"}]})
}

#[tokio::test]
async fn remote_clients_cannot_fill_the_queue_against_local_ones() {
    let c = cluster(1)
        .spec(0, |s| s.ttft = Duration::from_secs(30))
        .config(|cfg| {
            cfg.nodes[0].max_concurrency = 1;
            cfg.queue.max_requests = 4;
            cfg.listeners.push(remote_listener(|_| {}));
        })
        .start()
        .await;
    c.learn_models().await;
    // One request takes the only slot; remote clients then try to fill the queue.
    let mut held = Vec::new();
    for i in 0..7 {
        let url = c.url_on(1, "/api/chat");
        let req = c.client.post(url).header("x-corral-queue-timeout", "20000").json(&chat_body());
        held.push(tokio::spawn(async move { (i, req.send().await.map(|r| r.status().as_u16()).unwrap_or(0)) }));
    }
    let remote_refused = async {
        let mut refused = 0;
        for h in held.iter_mut() {
            if let Ok(Ok((_, 429))) = tokio::time::timeout(Duration::from_millis(300), &mut *h).await {
                refused += 1;
            }
        }
        refused
    }
    .await;
    assert!(c.broker.queue_depth() <= 2, "remote clients hold at most half the queue: {}", c.broker.queue_depth());
    assert!(remote_refused >= 4, "the remote overflow got 429 at once ({remote_refused})");
    // The owner's local request still gets a place in the queue (it waits, it is not refused).
    let local = c.client.post(c.url("/api/chat")).header("x-corral-queue-timeout", "300").json(&chat_body());
    let r = local.send().await.expect("answer");
    let code = r.json::<Value>().await.expect("json")["code"].clone();
    assert_eq!(code, "queue_timeout", "the local request was queued, not refused as queue_full");
    for h in held {
        h.abort();
    }
}

#[tokio::test]
async fn a_remote_client_waits_no_longer_than_the_cap() {
    let c = cluster(1)
        .spec(0, |s| s.ttft = Duration::from_secs(30))
        .config(|cfg| {
            cfg.nodes[0].max_concurrency = 1;
            cfg.queue.remote_max_wait_ms = 200;
            cfg.listeners.push(remote_listener(|_| {}));
        })
        .start()
        .await;
    c.learn_models().await;
    let busy = c.client.post(c.url("/api/chat")).json(&chat_body()).send();
    let busy = tokio::spawn(busy);
    assert!(common::eventually(Duration::from_secs(5), || c.node(0).in_flight() == 1).await);
    let started = tokio::time::Instant::now();
    let r = c
        .client
        .post(c.url_on(1, "/api/chat"))
        .header("x-corral-queue-timeout", "600000")
        .json(&chat_body())
        .send()
        .await
        .expect("answer");
    let waited = started.elapsed();
    assert_eq!(r.status(), 503);
    assert_eq!(r.json::<Value>().await.expect("json")["code"], "queue_timeout");
    assert!(waited < Duration::from_secs(5), "asked for 10 minutes, capped at 200 ms: waited {waited:?}");
    busy.abort();
}

#[tokio::test]
async fn a_listener_only_serves_the_categories_it_lists() {
    let c = cluster(1)
        .config(|cfg| {
            cfg.categories.push(CategoryConfig { name: "private".into(), ..CategoryConfig::default() });
            cfg.listeners.push(remote_listener(|l| l.categories = vec!["default".into()]));
        })
        .start()
        .await;
    c.learn_models().await;
    let r = c
        .client
        .post(c.url_on(1, "/api/chat"))
        .header("x-corral-category", "private")
        .json(&chat_body())
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), 403);
    assert_eq!(r.headers()["x-corral-forwarded"], "false");
    assert_eq!(r.json::<Value>().await.expect("json")["code"], "category_not_allowed");
    assert_eq!(c.sims[0].inference_count(), 0, "nothing ran");
    let ok = c.client.post(c.url_on(1, "/api/chat")).json(&chat_body()).send().await.expect("answer");
    assert_eq!(ok.status(), 200, "its own category works");
    let local = c.client.post(c.url("/api/chat")).header("x-corral-category", "private").json(&chat_body());
    assert_eq!(local.send().await.expect("answer").status(), 200, "the local listener may use any category");
}

async fn store_rows(c: &common::Cluster, at_least: usize) -> Vec<corral::store::RequestRow> {
    let store = c.broker.shared().telemetry.store().expect("store on").clone();
    let mut rows = Vec::new();
    for _ in 0..300 {
        rows =
            store.requests(&corral::store::Query { limit: Some(10_000), ..Default::default() }).await.expect("query");
        if rows.iter().filter(|r| r.status != "running").count() >= at_least {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    rows
}

#[tokio::test]
async fn a_clients_request_id_is_echoed_but_never_names_a_row() {
    let c = cluster(1).start().await;
    c.learn_models().await;
    for _ in 0..20 {
        let r = c.client.post(c.url("/api/chat")).header("x-request-id", "same-id").json(&chat_body());
        let r = r.send().await.expect("answer");
        assert_eq!(r.headers()["x-request-id"], "same-id", "the client's id is echoed");
        assert_ne!(r.headers()["x-corral-request-id"], "same-id", "Corral records under its own id");
    }
    let rows = store_rows(&c, 20).await;
    let mine: Vec<_> = rows.iter().filter(|r| r.client_request_id.as_deref() == Some("same-id")).collect();
    assert_eq!(mine.len(), 20, "twenty requests sharing one client id leave twenty rows");
    assert!(rows.iter().all(|r| r.id != "same-id"));
}

#[tokio::test]
async fn model_names_cannot_forge_log_lines_or_bloat_records() {
    let c = cluster(1).start().await;
    let forged = "llama3.2\n2026-12-01T00:00:00Z INFO corral::request status=ok\u{1b}[2J";
    let r = c.post("/api/chat", json!({"model": forged, "messages": []})).await;
    assert_eq!(r.status(), 400);
    assert_eq!(r.json::<Value>().await.expect("json")["code"], "bad_model_name");
    let huge = "m".repeat(5 * 1024 * 1024);
    let r = c.post("/api/chat", json!({"model": huge, "messages": []})).await;
    assert_eq!(r.status(), 400);
    let body = r.text().await.expect("body");
    assert!(body.len() < 1024, "the error does not echo a 5 MB name: {} bytes", body.len());
    let rows = store_rows(&c, 2).await;
    assert!(rows.iter().all(|r| r.model.len() <= 260 && !r.model.contains('\n')), "{rows:#?}");
    let r = c.client.get(c.url(&format!("/api/{}", "x".repeat(8000)))).send().await.expect("answer");
    assert_eq!(r.status(), 404);
    let rows = store_rows(&c, 3).await;
    assert!(rows.iter().all(|r| r.endpoint.len() <= 260), "paths are bounded in the record");
}

#[tokio::test]
async fn unauthenticated_floods_are_counted_not_stored_row_by_row() {
    let c = cluster(1)
        .config(|cfg| cfg.listeners.push(remote_listener(|l| l.api_keys = vec!["client-nobody".into()])))
        .start()
        .await;
    let url = c.url_on(1, "/api/tags");
    let started = tokio::time::Instant::now();
    for _ in 0..500 {
        let r = c.client.get(&url).bearer_auth("wrong").send().await.expect("answer");
        assert_eq!(r.status(), 401);
    }
    let secs = started.elapsed().as_secs() + 1;
    let rows = store_rows(&c, 1).await;
    let metrics = c.admin(reqwest::Method::GET, "/metrics").send().await.expect("metrics").text().await.expect("text");
    println!("500 unauthenticated requests in {secs} s: {} rows", rows.len());
    assert!(rows.len() as u64 <= 10 * (secs + 1), "at most 10 rows a second: {} rows in {secs} s", rows.len());
    assert!(metrics.contains("corral_unauthenticated_rejections_total 500"), "every one is counted");
}
