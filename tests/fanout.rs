//! Fan-out, retries and browsers: model operations on several nodes keep Ollama's progress
//! shape (clients read to the one final line and raise its `error` string), blob uploads reach
//! every node a create goes to, a node's "this request is unsupported" 500 is its answer (not
//! retried, not held against it), and CORS answers as Ollama's does.

mod common;

use common::{cluster, ndjson};
use corral::breaker::BreakerState;
use corral::sim::{Faults, ScriptStep};
use serde_json::{json, Value};

const PULL_ERROR: &str = "pull model manifest: file does not exist";

/// What ollama-py, ollama-js and Go's client each do with a progress stream: stop at the first
/// line with `error` (and raise it) or, for ollama-js, at `status: "success"`.
fn where_clients_stop(lines: &[Value]) -> usize {
    lines.iter().position(|l| l.get("error").is_some() || l["status"] == "success").expect("a final line")
}

#[tokio::test]
async fn a_pull_failing_on_one_of_three_nodes_ends_in_one_error_string_naming_it() {
    let c = cluster(3).start().await;
    c.sims[2].set_faults(Faults { fail_pulls: Some(PULL_ERROR.into()), ..Faults::default() });
    let r = c.post("/api/pull", json!({"model": "qwen3:4b"})).await;
    assert_eq!(r.status(), 200, "a stream has begun before any node fails, as on Ollama");
    let lines = ndjson(&r.text().await.expect("body"));
    assert_eq!(where_clients_stop(&lines), lines.len() - 1, "clients read every node's progress: {lines:#?}");
    let last = lines.last().expect("lines");
    assert_eq!(
        last["error"],
        json!(format!("pull failed on 1 of 3 nodes: n2: {PULL_ERROR}")),
        "one string clients raise with the node's own words"
    );
    assert_eq!(last["nodes"]["n0"]["status"], "success");
    assert_eq!(last["nodes"]["n2"]["error"], PULL_ERROR);
    for n in ["n0", "n1"] {
        assert!(lines.iter().any(|l| l["status"] == format!("node {n}: success") && l["node"] == n), "{n} reported");
    }
    let n2 = lines.iter().find(|l| l["node"] == "n2" && l.get("node_error").is_some()).expect("n2's own end");
    assert_eq!(n2["node_error"], PULL_ERROR);
    assert!(n2["status"].as_str().is_some_and(|s| s.contains(PULL_ERROR)), "shown by progress bars: {n2}");
    assert!(c.sims[0].models().contains(&"qwen3:4b".to_string()), "the others still pulled");
}

#[tokio::test]
async fn a_pull_on_every_node_ends_in_exactly_one_success_line() {
    let c = cluster(3).start().await;
    let r = c.post("/api/pull", json!({"model": "qwen3:4b"})).await;
    let lines = ndjson(&r.text().await.expect("body"));
    assert_eq!(where_clients_stop(&lines), lines.len() - 1, "no node's own success ends the stream early");
    assert_eq!(lines.iter().filter(|l| l["status"] == "success").count(), 1);
    let last = lines.last().expect("lines");
    assert_eq!(last["status"], "success");
    assert_eq!(last["nodes"].as_object().map(|o| o.len()), Some(3), "per-node results: {last}");
    assert!(lines.iter().filter(|l| l.get("completed").is_some()).all(|l| l["node"].is_string()));
}

#[tokio::test]
async fn a_non_streamed_pull_answers_one_json_by_the_same_rules() {
    let c = cluster(3).start().await;
    let r = c.post("/api/pull", json!({"model": "qwen3:4b", "stream": false})).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.expect("json")["status"], "success");
    c.sims[1].set_faults(Faults { fail_pulls: Some(PULL_ERROR.into()), ..Faults::default() });
    let r = c.post("/api/pull", json!({"model": "qwen3:4b", "stream": false})).await;
    assert_eq!(r.status(), 502, "part of the cluster failed");
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["error"], json!(format!("pull failed on 1 of 3 nodes: n1: {PULL_ERROR}")), "a string: {v}");
    assert_eq!(v["code"], "upstream_failed");
    assert_eq!(v["nodes"]["n0"]["status"], "success");
}

#[tokio::test]
async fn a_blob_reaches_every_node_the_create_goes_to() {
    let c = cluster(3).start().await;
    let digest = "sha256:5b2f0c0e4b3a8f1d9e7c6a5b4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c";
    let blob = format!("/api/blobs/{digest}");
    let head = c.client.head(c.url(&blob)).send().await.expect("answer");
    assert_eq!(head.status(), 404, "no node has it yet");
    let post = c.client.post(c.url(&blob)).body(vec![7u8; 4096]).send().await.expect("answer");
    assert_eq!(post.status(), 201, "created, as Ollama answers");
    for (i, s) in c.sims.iter().enumerate() {
        assert_eq!(s.blobs(), vec![digest.to_string()], "n{i} has the blob");
    }
    let head = c.client.head(c.url(&blob)).send().await.expect("answer");
    assert_eq!(head.status(), 200, "every node has it now");
    let r = c.post("/api/create", json!({"model": "mine", "files": {"model.gguf": digest}})).await;
    let lines = ndjson(&r.text().await.expect("body"));
    assert_eq!(lines.last().map(|l| l["status"].clone()), Some(json!("success")), "{lines:#?}");
    assert!(c
        .sims
        .iter()
        .all(|s| s.models().contains(&"mine:latest".to_string()) || s.models().contains(&"mine".to_string())));
}

#[tokio::test]
async fn a_blob_for_named_nodes_goes_to_those_only_and_a_missing_one_fails_that_create() {
    let c = cluster(3).start().await;
    let digest = "sha256:0000000000000000000000000000000000000000000000000000000000000001";
    let post = c
        .client
        .post(c.url(&format!("/api/blobs/{digest}")))
        .header("x-corral-node", "n0,n1")
        .body("gguf")
        .send()
        .await
        .expect("answer");
    assert_eq!(post.status(), 201);
    assert!(c.sims[2].blobs().is_empty(), "n2 was not named");
    // A create on every node fails on n2 only, in the node's words.
    let r = c.post("/api/create", json!({"model": "mine", "files": {"model.gguf": digest}})).await;
    let lines = ndjson(&r.text().await.expect("body"));
    let last = lines.last().expect("lines");
    let error = last["error"].as_str().expect("a string");
    assert!(error.starts_with("create failed on 1 of 3 nodes: n2: open blobs/sha256-"), "{error}");
}

fn unsupported(times: u32) -> Faults {
    Faults {
        script: [ScriptStep::new(500, times)].into(),
        script_error: Some("image input is not supported - hint: you may need to provide the mmproj".into()),
        ..Faults::default()
    }
}

#[tokio::test]
async fn a_500_saying_the_request_is_unsupported_is_the_nodes_answer_not_retried_nor_held_against_it() {
    let c = cluster(2).config(|cfg| cfg.breaker.failures_to_open = 2).start().await;
    for s in &c.sims {
        s.set_faults(unsupported(10));
    }
    for _ in 0..4 {
        let r = c.chat("llama3.2", false).await;
        assert_eq!(r.status(), 500, "the node's own status");
        assert_eq!(r.headers()["x-corral-attempts"], "1", "not retried: the same request gets the same answer");
        let v: Value = r.json().await.expect("json");
        assert!(v["error"].as_str().is_some_and(|e| e.starts_with("image input is not supported")), "{v}");
        assert!(v.get("code").is_none(), "the node's answer, not a broker error: {v}");
    }
    assert_eq!(c.inference_counts().iter().sum::<usize>(), 4, "one request per chat");
    for i in 0..2 {
        assert_eq!(c.node(i).breaker_state(), BreakerState::Closed, "n{i} did nothing wrong");
        assert!(c.node(i).is_available());
    }
}

#[tokio::test]
async fn a_plain_500_is_still_retried_elsewhere() {
    let c = cluster(2).start().await;
    c.sims[0].set_faults(Faults::statuses(500, 1));
    c.sims[1].set_faults(Faults::statuses(500, 1));
    let r = c.chat("llama3.2", false).await;
    assert_ne!(r.status(), 500, "never passed through as the node's answer");
    assert!(c.inference_counts().iter().sum::<usize>() >= 2, "a failure that may pass is retried");
}

/// A preflight as Chromium sends it for a JSON `fetch` from `origin`.
async fn preflight(c: &common::Cluster, origin: &str) -> reqwest::Response {
    c.client
        .request(reqwest::Method::OPTIONS, c.url("/api/chat"))
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "content-type,x-corral-category")
        .send()
        .await
        .expect("answer")
}

#[tokio::test]
async fn cors_answers_allowed_origins_as_ollama_and_gives_foreign_ones_nothing() {
    let c =
        cluster(1).config(|cfg| cfg.listeners[0].allowed_origins = vec!["https://chat.example".into()]).start().await;
    for origin in ["http://localhost:5173", "https://chat.example", "tauri://localhost"] {
        let r = preflight(&c, origin).await;
        assert_eq!(r.status(), 204, "{origin}'s preflight");
        let h = r.headers();
        assert_eq!(h["access-control-allow-origin"], origin);
        let allowed = h["access-control-allow-headers"].to_str().expect("text").to_ascii_lowercase();
        for name in ["authorization", "content-type", "user-agent", "accept", "x-requested-with", "x-corral-category"] {
            assert!(allowed.contains(name), "{name} allowed: {allowed}");
        }
        assert!(h["access-control-allow-methods"].to_str().expect("text").contains("POST"));
        let r = c
            .client
            .post(c.url("/api/chat"))
            .header("origin", origin)
            .json(&json!({"model": "llama3.2", "stream": false, "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .expect("answer");
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["access-control-allow-origin"], origin, "the page may read the answer");
    }
    let r = preflight(&c, "https://evil.example").await;
    assert_eq!(r.status(), 403, "Ollama's origin rule");
    assert!(r.headers().get("access-control-allow-origin").is_none(), "no CORS for a foreign origin");
    let r = c.client.get(c.url("/api/tags")).send().await.expect("answer");
    assert!(r.headers().get("access-control-allow-origin").is_none(), "no Origin, no CORS");
    let r = c
        .client
        .request(reqwest::Method::OPTIONS, c.admin_url("/admin/nodes"))
        .header("origin", "http://localhost:5173");
    let r = r.header("access-control-request-method", "GET").send().await.expect("answer");
    assert!(r.headers().get("access-control-allow-origin").is_none(), "the admin listener keeps no CORS");
}
