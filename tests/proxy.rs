//! The proxy against real loopback sims: pass-through, streaming, spreading, failover, errors.

mod common;

use std::time::Duration;

use common::{cluster, eventually, long_seed, ndjson};
use corral::config::Policy;
use corral::node::Health;
use corral::sim::Faults;
use futures_util::StreamExt;
use serde_json::{json, Value};

#[tokio::test]
async fn chat_is_passed_through_with_ollama_fields_and_corral_headers() {
    let c = cluster(1).start().await;
    let r = c.chat("llama3.2", false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-corral-node"], "n0");
    assert_eq!(r.headers()["x-corral-attempts"], "1");
    assert!(r.headers().contains_key("x-request-id"));
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["done"], true);
    assert_eq!(v["message"]["role"], "assistant");
    assert!(!v["message"]["content"].as_str().unwrap_or("").is_empty());
    for field in ["total_duration", "load_duration", "prompt_eval_count", "eval_count", "eval_duration"] {
        assert!(v[field].is_u64(), "final answer carries {field}: {v}");
    }
}

#[tokio::test]
async fn streamed_chat_arrives_as_ndjson_ending_in_done() {
    let c = cluster(1).start().await;
    let r = c.chat("llama3.2", true).await;
    assert_eq!(r.headers()["content-type"], "application/x-ndjson");
    let lines = ndjson(&r.text().await.expect("body"));
    assert!(lines.len() >= 2);
    let last = lines.last().expect("lines");
    assert_eq!(last["done"], true);
    assert_eq!(last["done_reason"], "stop");
    assert!(lines[..lines.len() - 1].iter().all(|l| l["done"] == false));
}

#[tokio::test]
async fn first_line_reaches_the_client_while_the_node_is_still_generating() {
    let c = cluster(1).start().await;
    // The node sends two tokens and then keeps generating (stalls) without finishing.
    c.sims[0].update_faults(|f| f.hang_after = Some(2));
    let r = c.chat("llama3.2", true).await;
    let mut body = r.bytes_stream();
    let first = tokio::time::timeout(Duration::from_secs(10), body.next())
        .await
        .expect("the first chunk is not held back until the answer is complete")
        .expect("a chunk")
        .expect("no error");
    let line: Value =
        serde_json::from_slice(first.split(|b| *b == b'\n').next().unwrap_or_default()).expect("a JSON line");
    assert_eq!(line["done"], false);
    assert_eq!(c.sims[0].completed(), 0, "the node has not finished");
    assert_eq!(c.sims[0].running(), 1, "the node is still generating");
}

#[tokio::test]
async fn openai_chat_streams_sse_ending_in_done_marker() {
    let c = cluster(1).start().await;
    let r = c
        .post(
            "/v1/chat/completions",
            json!({"model": "llama3.2", "stream": true, "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"].to_str().unwrap_or("").starts_with("text/event-stream"));
    let text = r.text().await.expect("body");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let r = c
        .post("/v1/chat/completions", json!({"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}]}))
        .await;
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["object"], "chat.completion");
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap_or(0) > 0);
}

#[tokio::test]
async fn generation_is_deterministic_for_a_seed_on_every_node() {
    let c = cluster(3).policy(Policy::RoundRobin).start().await;
    let mut answers = Vec::new();
    for _ in 0..3 {
        let r = c
            .post(
                "/api/generate",
                json!({"model": "llama3.2", "prompt": "x", "stream": false, "options": {"seed": 11, "num_predict": 5}}),
            )
            .await;
        let v: Value = r.json().await.expect("json");
        assert_eq!(v["eval_count"], 5, "num_predict is honoured");
        assert_eq!(v["done_reason"], "length");
        answers.push(v["response"].as_str().unwrap_or_default().to_string());
    }
    assert_eq!(c.inference_counts(), vec![1, 1, 1], "round robin visits every node once");
    assert!(answers.windows(2).all(|w| w[0] == w[1]), "same seed, same text: {answers:?}");
}

#[tokio::test]
async fn concurrent_load_spreads_over_nodes() {
    let c = cluster(3).config(|cfg| cfg.nodes.iter_mut().for_each(|n| n.max_concurrency = 2)).start().await;
    for s in &c.sims {
        s.update_faults(|f| f.ttft_ms = Some(100));
    }
    let reqs = (0..12).map(|_| c.chat("llama3.2", false));
    let results = futures_util::future::join_all(reqs).await;
    assert!(results.iter().all(|r| r.status() == 200), "every request succeeds");
    let counts = c.inference_counts();
    assert_eq!(counts.iter().sum::<usize>(), 12, "each request ran exactly once: {counts:?}");
    assert!(counts.iter().filter(|&&n| n > 0).count() >= 2, "load is spread: {counts:?}");
    assert!(c.broker.registry().all().iter().all(|n| n.in_flight() == 0), "every slot was given back");
}

#[tokio::test]
async fn requests_go_only_to_nodes_that_have_the_model() {
    let c = cluster(3).models(0, &["llama3.2"]).models(1, &["nomic-embed-text"]).models(2, &["llama3.2"]).start().await;
    c.learn_models().await;
    for _ in 0..6 {
        let r = c.post("/api/embed", json!({"model": "nomic-embed-text", "input": ["a", "b"]})).await;
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.expect("json");
        assert_eq!(v["embeddings"].as_array().map(Vec::len), Some(2));
    }
    assert_eq!(c.inference_counts(), vec![0, 6, 0]);
}

#[tokio::test]
async fn a_500_fails_over_to_another_node() {
    let c = cluster(2).policy(Policy::RoundRobin).start().await;
    c.sims[0].set_faults(Faults::statuses(500, 100));
    let mut attempts = Vec::new();
    for _ in 0..6 {
        let r = c.chat("llama3.2", false).await;
        assert_eq!(r.status(), 200, "a failing node costs the client nothing");
        assert_eq!(r.headers()["x-corral-node"], "n1");
        attempts.push(r.headers()["x-corral-attempts"].to_str().unwrap_or("").to_string());
    }
    assert!(attempts.iter().any(|a| a == "2"), "some requests were retried: {attempts:?}");
    assert!(c.sims[0].inference_count() >= 1);
}

#[tokio::test]
async fn three_500s_then_ok_on_a_single_node_is_retried_within_the_attempt_cap() {
    let c = cluster(1)
        .config(|cfg| {
            cfg.retry.max_attempts = 4;
        })
        .start()
        .await;
    c.sims[0].set_faults(Faults::statuses(500, 3));
    let r = c.chat("llama3.2", false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-corral-attempts"], "4");
    assert_eq!(c.sims[0].inference_count(), 4);
}

#[tokio::test]
async fn when_every_attempt_fails_the_client_gets_502_forwarded_true() {
    let c = cluster(2).start().await;
    for s in &c.sims {
        s.set_faults(Faults::statuses(500, 100));
    }
    let r = c.chat("llama3.2", false).await;
    assert_eq!(r.status(), 502);
    assert!(r.headers().get("x-corral-forwarded").is_none(), "the request did reach nodes");
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["code"], "upstream_failed");
    assert_eq!(v["forwarded"], true);
    assert!(v["error"].as_str().unwrap_or("").contains("HTTP 500"), "{v}");
    assert_eq!(
        c.inference_counts(),
        vec![1, 1],
        "each node tried once: never the same node twice while another is left"
    );
}

#[tokio::test]
async fn a_hanging_node_fails_over_after_the_first_byte_timeout() {
    let c = cluster(2).policy(Policy::RoundRobin).config(|cfg| cfg.proxy.first_byte_timeout_ms = 300).start().await;
    c.sims[0].update_faults(|f| f.hang = true);
    for _ in 0..2 {
        let r = c.chat("llama3.2", true).await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-corral-node"], "n1");
        let lines = ndjson(&r.text().await.expect("body"));
        assert_eq!(lines.last().map(|l| l["done"].clone()), Some(json!(true)));
    }
}

#[tokio::test]
async fn a_stopped_node_fails_over_and_is_marked_down() {
    let c = cluster(2).policy(Policy::RoundRobin).start().await;
    c.sims[0].stop();
    for _ in 0..4 {
        let r = c.chat("llama3.2", false).await;
        assert_eq!(r.status(), 200);
    }
    assert_eq!(c.node(0).health(), Health::Unhealthy, "a refused connection takes the node out at once");
    assert_eq!(c.sims[1].inference_count(), 4);
}

#[tokio::test]
async fn all_nodes_unreachable_is_503_not_forwarded() {
    let c = cluster(2).start().await;
    c.sims[0].stop();
    c.sims[1].stop();
    let r = c.chat("llama3.2", false).await;
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["x-corral-forwarded"], "false");
    assert!(r.headers().contains_key("retry-after"));
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["code"], "no_node_reachable");
    assert_eq!(v["forwarded"], false);
    // Now both are known down: the broker does not even try.
    let r = c.chat("llama3.2", false).await;
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["code"], "no_healthy_node");
}

#[tokio::test]
async fn a_node_that_comes_back_is_probed_healthy_again() {
    let c = cluster(2)
        .config(|cfg| {
            cfg.health.interval_ms = 20;
            cfg.health.successes_to_up = 2;
        })
        .start()
        .await;
    c.sims[0].stop();
    assert!(
        eventually(Duration::from_secs(10), || c.node(0).health() == Health::Unhealthy).await,
        "probes notice the node is gone"
    );
    c.sims[0].restart().await.expect("rebinds its port");
    assert!(
        eventually(Duration::from_secs(10), || c.node(0).health() == Health::Healthy).await,
        "probes bring it back"
    );
}

#[tokio::test]
async fn a_cut_mid_stream_ends_with_an_error_line_and_is_not_retried() {
    let c = cluster(2).policy(Policy::RoundRobin).start().await;
    c.sims[0].update_faults(|f| f.cut_after = Some(3));
    let r = c.chat("llama3.2", true).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-corral-node"], "n0");
    let lines = ndjson(&r.text().await.expect("body"));
    assert_eq!(lines.len(), 4, "three relayed chunks and the error line: {lines:?}");
    let last = lines.last().expect("lines");
    assert_eq!(last["code"], "stream_interrupted");
    assert!(last["error"].as_str().unwrap_or("").contains("n0"));
    assert!(lines.iter().all(|l| l["done"] != true), "never a fake done:true");
    assert_eq!(c.sims[1].inference_count(), 0, "nothing is retried after the first byte");
}

#[tokio::test]
async fn a_node_silent_mid_stream_hits_the_idle_timeout() {
    let c = cluster(1).config(|cfg| cfg.proxy.idle_timeout_ms = 200).start().await;
    c.sims[0].update_faults(|f| f.hang_after = Some(2));
    let r = c.chat("llama3.2", true).await;
    let lines = ndjson(&r.text().await.expect("body"));
    assert_eq!(lines.last().map(|l| l["code"].clone()), Some(json!("stream_idle_timeout")));
    assert!(eventually(Duration::from_secs(5), || c.node(0).in_flight() == 0).await, "the slot is given back");
}

#[tokio::test]
async fn a_cut_in_a_non_streamed_answer_is_never_passed_on_as_a_whole_one() {
    // Corral assembles the one JSON from the node's stream: a cut one has reached no client, so
    // another node answers it; with none left, the client gets an error, never half a document.
    let c = cluster(2).policy(Policy::Priority).start().await;
    c.sims[0].update_faults(|f| f.cut_after = Some(1));
    let r = c.chat("llama3.2", false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-corral-node"], "n1");
    assert_eq!(r.json::<Value>().await.expect("a whole document")["done"], true);
    c.sims[1].update_faults(|f| f.cut_after = Some(1));
    let r = c.chat("llama3.2", false).await;
    assert_eq!(r.status(), 502);
    assert_eq!(r.json::<Value>().await.expect("error")["code"], "upstream_failed");
}

#[tokio::test]
async fn client_errors_pass_through_and_are_not_retried() {
    let c = cluster(2).models(0, &["nomic-embed-text"]).models(1, &["nomic-embed-text"]).start().await;
    let r = c.chat("nomic-embed-text", false).await;
    assert_eq!(r.status(), 400, "the node's own 400 is passed on");
    assert!(r.headers().get("x-corral-forwarded").is_none());
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["error"], "\"nomic-embed-text\" does not support chat");
    assert_eq!(c.inference_counts().iter().sum::<usize>(), 1);
}

#[tokio::test]
async fn server_busy_goes_elsewhere_without_marking_the_node_down() {
    let c = cluster(2).policy(Policy::RoundRobin).config(|cfg| cfg.breaker.failures_to_open = 1).start().await;
    c.sims[0].set_faults(Faults::statuses(503, 100));
    for _ in 0..6 {
        let r = c.chat("llama3.2", false).await;
        assert_eq!(r.status(), 200);
    }
    assert!(c.sims[0].inference_count() >= 1, "n0 was asked");
    assert_ne!(c.node(0).health(), Health::Unhealthy, "busy is not a failure");
    assert_eq!(c.node(0).breaker_state(), corral::breaker::BreakerState::Closed, "busy does not trip the breaker");
}

#[tokio::test]
async fn sim_answers_busy_past_parallel_plus_queue() {
    let c = cluster(1)
        .spec(0, |s| {
            s.parallel = 1;
            s.max_queue = 0;
        })
        .config(|cfg| cfg.retry.max_attempts = 1)
        .start()
        .await;
    c.sims[0].update_faults(|f| f.hang_after = Some(1));
    let held = c.chat("llama3.2", true).await;
    assert_eq!(held.status(), 200);
    let r = c.chat("llama3.2", false).await;
    assert_eq!(r.status(), 503);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["code"], "cluster_busy");
    drop(held);
}

#[tokio::test]
async fn unknown_model_is_404_json() {
    let c = cluster(2).start().await;
    c.learn_models().await;
    let r = c.chat("no-such-model", false).await;
    assert_eq!(r.status(), 404);
    assert_eq!(r.headers()["x-corral-forwarded"], "false");
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["code"], "model_not_found");
    assert!(v["error"].as_str().unwrap_or("").contains("no-such-model"));
    assert_eq!(c.inference_counts(), vec![0, 0]);
}

#[tokio::test]
async fn malformed_json_is_400_and_the_broker_keeps_serving() {
    let c = cluster(1).start().await;
    for body in ["{\"model\": ", "not json", "[1,2]", "\u{0}", "{\"model\": 5}"] {
        let r = c.client.post(c.url("/api/chat")).body(body).send().await.expect("answer");
        assert_eq!(r.status(), 400, "body {body:?}");
        let v: Value = r.json().await.expect("json");
        assert_eq!(v["code"], "malformed_json", "body {body:?}");
        assert_eq!(v["forwarded"], false);
    }
    let r = c.client.post(c.url("/api/chat")).body("{\"messages\": []}").send().await.expect("answer");
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["code"], "missing_model");
    let deep = format!("{{\"model\":\"llama3.2\",\"x\":{}{}}}", "[".repeat(5000), "]".repeat(5000));
    let r = c.client.post(c.url("/api/chat")).body(deep).send().await.expect("answer");
    assert_eq!(r.status(), 400, "deeply nested JSON is refused, not a stack overflow");
    let bad_utf8: Vec<u8> = b"{\"model\":\"\xff\xfe\"}".to_vec();
    let r = c.client.post(c.url("/api/chat")).body(bad_utf8).send().await.expect("answer");
    assert_eq!(r.status(), 400, "invalid UTF-8");
    assert_eq!(c.sims[0].inference_count(), 0, "nothing bad reached the node");
    assert_eq!(c.chat("llama3.2", false).await.status(), 200, "still serving");
}

#[tokio::test]
async fn oversized_body_is_413_and_the_broker_keeps_serving() {
    let c = cluster(1).config(|cfg| cfg.proxy.max_body_bytes = 4096).start().await;
    let big = json!({"model": "llama3.2", "prompt": "x".repeat(10_000)});
    let r = c.post("/api/generate", big).await;
    assert_eq!(r.status(), 413);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["code"], "body_too_large");
    // Without a Content-Length (chunked upload), the limit still holds.
    let chunks = futures_util::stream::iter((0..10).map(|_| Ok::<_, std::io::Error>(vec![b' '; 1000])));
    let r =
        c.client.post(c.url("/api/generate")).body(reqwest::Body::wrap_stream(chunks)).send().await.expect("answer");
    assert_eq!(r.status(), 413);
    assert_eq!(c.sims[0].inference_count(), 0);
    assert_eq!(c.chat("llama3.2", false).await.status(), 200, "still serving");
}

#[tokio::test]
async fn unknown_route_and_category_are_explained() {
    let c = cluster(1).start().await;
    let r = c.client.get(c.url("/api/nope")).send().await.expect("answer");
    assert_eq!(r.status(), 404);
    assert_eq!(r.json::<Value>().await.expect("json")["code"], "unknown_route");
    let r = c
        .client
        .post(c.url("/api/chat"))
        .header("x-corral-category", "vip")
        .json(&json!({"model": "llama3.2"}))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["code"], "unknown_category");
    assert!(v["error"].as_str().unwrap_or("").contains("default"), "lists the known categories: {v}");
    let r = c
        .client
        .post(c.url("/api/chat"))
        .header("x-corral-queue-timeout", "soon")
        .json(&json!({"model": "llama3.2"}))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.json::<Value>().await.expect("json")["code"], "bad_header");
}

#[tokio::test]
async fn a_full_cluster_queues_then_times_out_with_503_not_forwarded() {
    let c = cluster(1).config(|cfg| cfg.nodes[0].max_concurrency = 1).start().await;
    c.sims[0].update_faults(|f| f.hang_after = Some(1));
    let held = c.chat("llama3.2", true).await;
    assert_eq!(held.status(), 200);
    let r = c
        .client
        .post(c.url("/api/chat"))
        .header("x-corral-queue-timeout", "100")
        .json(&json!({"model": "llama3.2", "stream": false}))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["x-corral-forwarded"], "false");
    assert_eq!(r.json::<Value>().await.expect("json")["code"], "queue_timeout");
    assert_eq!(c.sims[0].inference_count(), 1, "the queued request never reached the node");
    drop(held);
}

#[tokio::test]
async fn a_queued_request_runs_when_a_slot_frees() {
    let c = cluster(1).config(|cfg| cfg.nodes[0].max_concurrency = 1).start().await;
    c.sims[0].update_faults(|f| f.hang_after = Some(1));
    let held = c.chat("llama3.2", true).await;
    c.sims[0].update_faults(|f| f.hang_after = None);
    let waiting = tokio::spawn({
        let client = c.client.clone();
        let url = c.url("/api/chat");
        async move {
            client
                .post(url)
                .json(&json!({"model": "llama3.2", "stream": false}))
                .send()
                .await
                .map(|r| r.status().as_u16())
        }
    });
    assert!(eventually(Duration::from_secs(5), || c.broker.queue_depth() == 1).await, "the second request queues");
    assert_eq!(c.sims[0].inference_count(), 1, "and has not reached the node");
    drop(held);
    let status = waiting.await.expect("task").expect("answer");
    assert_eq!(status, 200);
    assert_eq!(c.sims[0].inference_count(), 2);
    assert_eq!(c.broker.queue_depth(), 0);
}

#[tokio::test]
async fn union_endpoints_merge_every_node() {
    let c =
        cluster(2).models(0, &["llama3.2", "qwen2.5:7b"]).models(1, &["llama3.2", "nomic-embed-text"]).start().await;
    let v: Value = c.client.get(c.url("/api/tags")).send().await.expect("answer").json().await.expect("json");
    let mut names: Vec<String> =
        v["models"].as_array().expect("models").iter().map(|m| m["name"].as_str().unwrap_or("").to_string()).collect();
    names.sort();
    assert_eq!(names, vec!["llama3.2:latest", "nomic-embed-text:latest", "qwen2.5:7b"]);
    let v: Value = c.client.get(c.url("/v1/models")).send().await.expect("answer").json().await.expect("json");
    assert_eq!(v["data"].as_array().map(Vec::len), Some(3));
    // Load llama3.2 on both nodes, then /api/ps says where.
    c.sims[0].update_faults(|_| {});
    for _ in 0..2 {
        let _ = c.chat("llama3.2", false).await;
    }
    let _ = c.post("/api/embed", json!({"model": "nomic-embed-text", "input": "x"})).await;
    let v: Value = c.client.get(c.url("/api/ps")).send().await.expect("answer").json().await.expect("json");
    let entries = v["models"].as_array().expect("models");
    assert!(entries.iter().all(|m| m["node"].is_string()), "every entry names its node: {v}");
    assert!(entries.iter().any(|m| m["name"] == "nomic-embed-text:latest" && m["node"] == "n1"), "{v}");
}

#[tokio::test]
async fn union_skips_a_dead_node() {
    let c = cluster(2).models(0, &["a"]).models(1, &["b"]).start().await;
    c.sims[1].stop();
    let r = c.client.get(c.url("/api/tags")).send().await.expect("answer");
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["models"].as_array().map(Vec::len), Some(1));
}

#[tokio::test]
async fn host_is_rewritten_and_request_id_is_kept() {
    let c = cluster(1).start().await;
    let r = c
        .client
        .post(c.url("/api/chat"))
        .header("x-request-id", "trace-42")
        .json(&json!({"model": "llama3.2", "stream": false}))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.headers()["x-request-id"], "trace-42");
    let got = c.sims[0].received();
    let chat = got.iter().find(|r| r.path == "/api/chat").expect("chat arrived");
    assert_eq!(chat.host.as_deref(), Some(c.sims[0].addr().to_string().as_str()), "Host is the node's own");
    assert_eq!(chat.request_id.as_deref(), Some("trace-42"));
}

#[tokio::test]
async fn a_client_that_goes_away_cancels_the_upstream_request() {
    let c = cluster(1).start().await;
    c.sims[0].update_faults(|f| f.token_delay_ms = Some(50));
    let seed = long_seed(25);
    let r = c.post("/api/generate", json!({"model": "llama3.2", "prompt": "p", "options": {"seed": seed}})).await;
    let mut body = r.bytes_stream();
    let _ = body.next().await;
    drop(body);
    assert!(eventually(Duration::from_secs(10), || c.sims[0].cancelled() == 1).await, "the node stopped generating");
    assert_eq!(c.sims[0].completed(), 0);
    assert!(eventually(Duration::from_secs(5), || c.node(0).in_flight() == 0).await, "the slot is given back");
    assert_ne!(c.node(0).health(), Health::Unhealthy, "a client leaving is not the node's fault");
}

#[tokio::test]
async fn root_and_version_answer_like_ollama() {
    let c = cluster(1).start().await;
    let r = c.client.get(c.url("/")).send().await.expect("answer");
    assert_eq!(r.text().await.expect("text"), "Ollama is running");
    let r = c.client.head(c.url("/")).send().await.expect("answer");
    assert_eq!(r.status(), 200);
    let v: Value = c.client.get(c.url("/api/version")).send().await.expect("answer").json().await.expect("json");
    assert!(v["version"].is_string());
    let v: Value = c.post("/api/show", json!({"model": "llama3.2"})).await.json().await.expect("json");
    assert!(v["capabilities"].as_array().is_some_and(|c| c.iter().any(|x| x == "completion")));
}

#[tokio::test]
async fn graceful_shutdown_lets_a_running_stream_finish() {
    let c = cluster(1).start().await;
    c.sims[0].update_faults(|f| f.token_delay_ms = Some(20));
    let r = c.chat("llama3.2", true).await;
    let common::Cluster { broker, sims, .. } = c;
    let shutdown = tokio::spawn(broker.shutdown());
    let lines = ndjson(&r.text().await.expect("the stream completes during the drain"));
    assert_eq!(lines.last().map(|l| l["done"].clone()), Some(json!(true)));
    shutdown.await.expect("shutdown finishes");
    drop(sims);
}

#[tokio::test]
async fn a_stale_model_list_is_corrected_by_the_nodes_own_404() {
    // Before any deep probe the broker does not know who has what.
    let c = cluster(2).policy(Policy::RoundRobin).models(0, &["only-on-0"]).models(1, &["only-on-1"]).start().await;
    for _ in 0..4 {
        let r = c.post("/api/generate", json!({"model": "only-on-1", "prompt": "x", "stream": false})).await;
        assert_eq!(r.status(), 200, "the request finds the node that has the model");
        assert_eq!(r.headers()["x-corral-node"], "n1");
    }
    assert_eq!(c.node(0).serves("only-on-1"), Some(false), "n0's 404 was remembered");
    let r = c.post("/api/generate", json!({"model": "nowhere", "prompt": "x", "stream": false})).await;
    assert_eq!(r.status(), 404);
    assert_eq!(r.json::<Value>().await.expect("json")["code"], "model_not_found");
}

#[tokio::test]
async fn a_node_that_said_it_lacks_the_model_is_not_asked_again_when_a_probe_relists_it() {
    let c = cluster(2).start().await;
    c.learn_models().await;
    for sim in &c.sims {
        sim.update_faults(|f| {
            let mut step = corral::sim::ScriptStep::new(404, 100);
            step.error =
                Some(corral::sim::StepError { message: "model \"llama3.2\" not found".into(), kind: None, code: None });
            f.script.push_back(step);
        });
    }
    // A background probe that lists n0's models again whenever the request waits (between
    // attempts): n0 is then the only node left serving the model, and was already asked.
    let (n0, done) = (c.node(0), std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)));
    let relister = tokio::spawn({
        let done = std::sync::Arc::clone(&done);
        async move {
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                n0.set_models(["llama3.2:latest".to_string()]);
                tokio::task::yield_now().await;
            }
        }
    });
    let r = c.chat("llama3.2", false).await;
    done.store(true, std::sync::atomic::Ordering::Release);
    relister.await.expect("relister ends");
    assert_eq!(r.status(), 404);
    assert_eq!(r.headers()["x-corral-attempts"], "2");
    let asked: Vec<usize> = c.sims.iter().map(|s| s.count("/api/chat")).collect();
    assert_eq!(asked, [1, 1], "each node asked once: its 404 stands for this request");
}

#[tokio::test]
async fn nodes_that_list_a_model_but_answer_404_for_it_are_named_and_the_request_counts_as_sent() {
    let c = cluster(2).start().await;
    c.learn_models().await;
    let missing = "model \"llama3.2\" not found, try pulling it first";
    for sim in &c.sims {
        sim.update_faults(|f| {
            // More than one: a background probe's generate may take a step of the script first.
            let mut step = corral::sim::ScriptStep::new(404, 100);
            step.error = Some(corral::sim::StepError { message: missing.into(), kind: None, code: None });
            f.script.push_back(step);
        });
    }
    let asked = |c: &common::Cluster| c.sims.iter().map(|s| s.count("/api/chat")).sum::<usize>();
    let before = asked(&c);
    let r = c.chat("llama3.2", false).await;
    assert_eq!(r.status(), 404);
    assert_eq!(asked(&c) - before, 2, "both nodes were asked");
    assert!(!r.headers().contains_key("x-corral-forwarded"), "both nodes received it: {:?}", r.headers());
    assert_eq!(r.headers()["x-corral-attempts"], "2");
    let v = r.json::<Value>().await.expect("json");
    assert_eq!(v["code"], "model_not_found");
    assert_eq!(v["forwarded"], true, "a request that reached nodes is never reported as sent nowhere: {v}");
    let msg = v["error"].as_str().unwrap_or_default();
    assert!(msg.starts_with("model 'llama3.2' not found: "), "Ollama's words first, which clients match on: {msg}");
    assert!(!msg.contains("no configured node lists it"), "both nodes list it: {msg}");
    for node in ["n0: HTTP 404", "n1: HTTP 404"] {
        assert!(msg.contains(node) && msg.contains("try pulling it first"), "each node's own answer ({node}): {msg}");
    }
}

#[tokio::test]
async fn a_client_that_trickles_its_headers_is_cut_off_and_others_are_served() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let c = cluster(1).config(|cfg| cfg.proxy.header_read_timeout_ms = 300).start().await;
    let mut slow = tokio::net::TcpStream::connect(c.broker.proxy_addr()).await.expect("connect");
    slow.write_all(b"POST /api/chat HTTP/1.1\r\nHost: corral\r\nContent-Type: app").await.expect("write part");
    // The server must end this connection on its own; bounded so a regression fails, not hangs.
    let mut buf = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(10), slow.read_to_end(&mut buf)).await;
    assert!(ended.is_ok(), "the trickling connection was never closed");
    let head = String::from_utf8_lossy(&buf);
    assert!(buf.is_empty() || head.starts_with("HTTP/1.1 408"), "closed, at most with a 408: {head:?}");
    assert_eq!(c.chat("llama3.2", false).await.status(), 200, "everyone else is served");
}

#[tokio::test]
async fn retrieving_a_model_with_the_openai_sdk_never_makes_it_vanish() {
    let c = cluster(2).start().await;
    c.learn_models().await;
    // The openai SDK's `models.retrieve("llama3.2")`.
    let r = c.client.get(c.url("/v1/models/llama3.2")).send().await.expect("answer");
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["object"], "model");
    assert!(v["id"].as_str().is_some_and(|id| id.starts_with("llama3.2")), "{v}");
    let r = c.client.get(c.url("/v1/models/nope")).send().await.expect("answer");
    assert_eq!(r.status(), 404);
    assert_eq!(r.json::<Value>().await.expect("json")["error"]["code"], "model_not_found");
    // Nothing about it reached a node's routing table: every node still serves the model.
    for i in 0..2 {
        assert_eq!(c.node(i).serves("llama3.2"), Some(true), "node {i} still serves llama3.2");
    }
    for i in 0..100 {
        assert_eq!(c.chat("llama3.2", false).await.status(), 200, "chat {i} after models.retrieve");
    }
}

/// A node that answers `/api/version`, an empty `/api/ps`, and `models` model names in
/// `/api/tags`, padded to at least `pad` bytes, sent in 64 KiB chunks with no length.
async fn node_listing(models: usize, pad: usize) -> String {
    use axum::routing::get;
    let tags = move || async move {
        let list: Vec<Value> =
            (0..models).map(|i| json!({"name": format!("m{i}:latest"), "model": format!("m{i}:latest")})).collect();
        let mut text = json!({ "models": list }).to_string();
        let closing = text.pop().unwrap_or('}');
        text.push_str(&" ".repeat(pad.saturating_sub(text.len())));
        text.push(closing);
        let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
            text.into_bytes().chunks(64 << 10).map(|c| Ok(c.to_vec())).collect();
        axum::body::Body::from_stream(futures_util::stream::iter(chunks))
    };
    let app = axum::Router::new()
        .route("/api/version", get(|| async { axum::Json(json!({"version": "0.12.0"})) }))
        .route("/api/ps", get(|| async { axum::Json(json!({"models": []})) }))
        .route("/api/tags", get(tags));
    common::serve(app).await
}

#[tokio::test]
async fn a_nodes_model_list_is_read_within_bounds() {
    let huge = node_listing(10, 9 << 20).await;
    let many = node_listing(5_000, 0).await;
    let c = cluster(0)
        .config(move |cfg| {
            cfg.nodes = vec![
                corral::config::NodeConfig { name: "huge".into(), url: huge, ..Default::default() },
                corral::config::NodeConfig { name: "many".into(), url: many, ..Default::default() },
            ]
        })
        .start()
        .await;
    c.learn_models().await;
    assert_eq!(c.node(0).serves("m0"), None, "a 9 MiB list is not read: the node's models stay unknown");
    assert_eq!(c.node(1).serves("m0"), Some(true));
    assert_eq!(c.node(1).serves("m4095"), Some(true), "the first 4,096 models are kept");
    assert_eq!(c.node(1).serves("m4096"), Some(false), "the rest are not");
    let r = c.client.get(c.url("/api/tags")).send().await.expect("answer");
    let body = r.bytes().await.expect("body");
    assert!(body.len() < 1 << 20, "the merged list holds no 9 MiB node list: {} bytes", body.len());
}

/// A node that lists llama3.2 and answers every `/api/chat` with `body` as one
/// `application/json` 200, whatever was asked (as an older Ollama or a proxy might).
async fn node_answering_json(body: &'static str) -> String {
    use axum::routing::{get, post};
    let app = axum::Router::new()
        .route("/api/version", get(|| async { axum::Json(json!({"version": "0.12.0"})) }))
        .route("/api/ps", get(|| async { axum::Json(json!({"models": []})) }))
        .route(
            "/api/tags",
            get(|| async { axum::Json(json!({"models": [{"name": "llama3.2:latest", "model": "llama3.2:latest"}]})) }),
        )
        .route(
            "/api/chat",
            post(move || async move { ([(axum::http::header::CONTENT_TYPE, "application/json")], body) }),
        );
    common::serve(app).await
}

#[tokio::test]
async fn one_json_instead_of_a_stream_is_relayed_only_when_it_parses() {
    let whole = r#"{"model":"llama3.2","message":{"role":"assistant","content":"hi"},"done":true}"#;
    let cut = r#"{"model":"llama3.2","message":{"role":"assistant","content":"hi""#;
    for (body, ok) in [(whole, true), (cut, false)] {
        let url = node_answering_json(body).await;
        let c = cluster(0)
            .config(move |cfg| {
                cfg.nodes = vec![corral::config::NodeConfig { name: "odd".into(), url, ..Default::default() }]
            })
            .start()
            .await;
        c.learn_models().await;
        let r = c.chat("llama3.2", false).await;
        if ok {
            assert_eq!(r.status(), 200);
            assert_eq!(r.text().await.expect("body"), whole, "relayed as the node sent it");
        } else {
            assert_eq!(r.status(), 502, "a cut JSON is the node's failure, not a 200");
            let v: Value = r.json().await.expect("json");
            assert_eq!(v["code"], "upstream_failed");
            assert!(v["error"].as_str().is_some_and(|m| m.contains("one JSON instead of a stream")), "{v}");
        }
    }
}
