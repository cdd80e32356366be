//! Idempotent retries (`proxy::idempotency`): a request sent again with the same
//! `Idempotency-Key` never runs upstream twice. While the first runs the duplicate joins it
//! and gets the whole answer; after it, the duplicate is replayed from memory or refused with
//! 409, per the category; keys are scoped per client.

mod common;

use common::{cluster, long_seed, ndjson, Cluster};
use corral::config::{ListenerConfig, Origin};
use futures_util::StreamExt;
use serde_json::{json, Value};

fn chat(seed: u64, stream: bool) -> Value {
    json!({
        "model": "llama3.2",
        "messages": [{"role": "user", "content": "tell me a story"}],
        "options": {"seed": seed},
        "stream": stream,
    })
}

fn keyed(c: &Cluster, url: String, key: &str, body: &Value) -> reqwest::RequestBuilder {
    c.client.post(url).header("idempotency-key", key).json(body)
}

/// A cluster of one sim that streams a token every 80 ms, with the default category tweaked.
async fn slow_cluster(tweak: impl FnOnce(&mut corral::config::Config) + 'static) -> Cluster {
    let c = cluster(1).config(tweak).start().await;
    c.learn_models().await;
    c.sims[0].update_faults(|f| f.token_delay_ms = Some(80));
    c
}

#[tokio::test]
async fn a_duplicate_while_the_first_streams_and_after_it_runs_upstream_once() {
    let c = slow_cluster(|cfg| cfg.categories[0].replay_finished = true).await;
    let body = chat(long_seed(20), true);
    let a = keyed(&c, c.url("/api/chat"), "job-1", &body).send().await.expect("A answers");
    assert_eq!(a.status(), 200);
    let a_id = a.headers()["x-corral-request-id"].to_str().expect("ascii").to_string();
    let mut a_stream = a.bytes_stream();
    let mut a_bytes = a_stream.next().await.expect("a first chunk").expect("bytes").to_vec();
    // A is streaming now (its first chunk is here and the answer is 20+ tokens at 80 ms each).
    let b = keyed(&c, c.url("/api/chat"), "job-1", &body).send().await.expect("B answers");
    assert_eq!(b.headers()["x-corral-idempotent"], "attached", "B joins the running A");
    assert_eq!(b.headers()["x-corral-first-request-id"], a_id.as_str());
    assert_ne!(b.headers()["x-corral-request-id"], a_id.as_str(), "B has its own record");
    let b_text = b.text().await.expect("B's stream");
    while let Some(chunk) = a_stream.next().await {
        a_bytes.extend_from_slice(&chunk.expect("A's stream"));
    }
    let a_text = String::from_utf8(a_bytes).expect("utf-8");
    assert_eq!(b_text, a_text, "the attached copy is the whole answer, from its first byte");
    assert!(ndjson(&a_text).last().is_some_and(|l| l["done"] == true), "A ran to the end: {a_text}");
    let c_resp = keyed(&c, c.url("/api/chat"), "job-1", &body).send().await.expect("C answers");
    assert_eq!(c_resp.status(), 200);
    assert_eq!(c_resp.headers()["x-corral-idempotent"], "replayed", "after A finished: from memory");
    assert_eq!(c_resp.text().await.expect("C's body"), a_text);
    assert_eq!(c.inference_counts(), vec![1], "three sends, one upstream execution");
}

#[tokio::test]
async fn the_first_clients_leaving_does_not_cancel_what_its_retry_joins() {
    let c = slow_cluster(|_| {}).await;
    let body = chat(long_seed(20), true);
    let a = keyed(&c, c.url("/api/chat"), "job-2", &body).send().await.expect("A answers");
    let mut a_stream = a.bytes_stream();
    let first = a_stream.next().await.expect("a first chunk").expect("bytes");
    // The client times out and gives up on A.
    drop(a_stream);
    let b = keyed(&c, c.url("/api/chat"), "job-2", &body).send().await.expect("B answers");
    assert_eq!(b.headers()["x-corral-idempotent"], "attached");
    let b_text = b.text().await.expect("B's stream");
    assert!(b_text.as_bytes().starts_with(&first), "B gets what A's client already had, then the rest");
    assert!(ndjson(&b_text).last().is_some_and(|l| l["done"] == true), "the answer ran to its end: {b_text}");
    assert_eq!(c.inference_counts(), vec![1], "the retry never ran twice");
    assert_eq!(c.sims[0].cancelled(), 0, "A's generation was not cancelled when its client left");
}

#[tokio::test]
async fn without_replay_a_finished_duplicate_is_refused_with_the_first_request_named() {
    let c = slow_cluster(|_| {}).await;
    let body = chat(1, false);
    let a = keyed(&c, c.url("/api/chat"), "job-3", &body).send().await.expect("A answers");
    assert_eq!(a.status(), 200);
    let a_id = a.headers()["x-corral-request-id"].to_str().expect("ascii").to_string();
    let a_json: Value = a.json().await.expect("A's answer");
    assert_eq!(a_json["done"], true);
    let b = keyed(&c, c.url("/api/chat"), "job-3", &body).send().await.expect("B answers");
    assert_eq!(b.status(), 409, "replay_finished is off by default");
    assert_eq!(b.headers()["x-corral-forwarded"], "false");
    let v: Value = b.json().await.expect("json");
    assert_eq!(v["code"], "duplicate_request");
    assert_eq!(v["first_request_id"], a_id.as_str());
    assert_eq!(v["first_outcome"], "completed with HTTP 200");
    // The same key for another request is a client bug, said as such.
    let other = keyed(&c, c.url("/api/chat"), "job-3", &chat(2, false)).send().await.expect("answer");
    assert_eq!(other.status(), 422);
    assert_eq!(other.json::<Value>().await.expect("json")["code"], "idempotency_key_reused");
    assert_eq!(c.inference_counts(), vec![1]);
    // A trace id alone is not a promise: sent again after it finished, it runs again.
    for _ in 0..2 {
        let r = c.client.post(c.url("/api/chat")).header("x-request-id", "trace-9").json(&body).send().await;
        assert_eq!(r.expect("answer").status(), 200);
    }
    assert_eq!(c.inference_counts(), vec![3]);
}

#[tokio::test]
async fn a_window_of_zero_turns_deduplication_off() {
    let c = slow_cluster(|cfg| cfg.categories[0].idempotency_window_ms = 0).await;
    let body = chat(1, false);
    for _ in 0..2 {
        let r = keyed(&c, c.url("/api/chat"), "job-4", &body).send().await.expect("answer");
        assert_eq!(r.status(), 200);
        assert!(r.headers().get("x-corral-idempotent").is_none());
    }
    assert_eq!(c.inference_counts(), vec![2]);
}

#[tokio::test]
async fn another_client_with_the_same_key_is_not_attached() {
    assert!(corral::secrets::use_memory_store(), "tests never touch the real keyring");
    corral::secrets::set_client_key("idem-client-a", "idem-canary-a-51f0").expect("stored");
    corral::secrets::set_client_key("idem-client-b", "idem-canary-b-8e2c").expect("stored");
    let c = cluster(1)
        .config(|cfg| {
            cfg.listeners.push(ListenerConfig {
                addr: "127.0.0.1:0".into(),
                origin: Origin::Remote,
                api_keys: vec!["idem-client-a".into(), "idem-client-b".into()],
                ..ListenerConfig::default()
            });
        })
        .start()
        .await;
    c.learn_models().await;
    c.sims[0].update_faults(|f| f.token_delay_ms = Some(80));
    let body = chat(long_seed(20), true);
    let a = keyed(&c, c.url_on(1, "/api/chat"), "shared", &body).bearer_auth("idem-canary-a-51f0");
    let a = a.send().await.expect("A answers");
    assert_eq!(a.status(), 200);
    let mut a_stream = a.bytes_stream();
    let _ = a_stream.next().await.expect("A streams");
    let b = keyed(&c, c.url_on(1, "/api/chat"), "shared", &body).bearer_auth("idem-canary-b-8e2c");
    let b = b.send().await.expect("B answers");
    assert_eq!(b.status(), 200);
    assert!(b.headers().get("x-corral-idempotent").is_none(), "B is another client: its own run");
    let _ = b.text().await.expect("B's stream");
    // Without a key (the local listener), the same name is yet another scope.
    let local = keyed(&c, c.url("/api/chat"), "shared", &body).send().await.expect("answer");
    assert!(local.headers().get("x-corral-idempotent").is_none());
    let _ = local.text().await;
    while a_stream.next().await.is_some() {}
    assert_eq!(c.inference_counts(), vec![3], "three clients, three runs; none read another's answer");
}
