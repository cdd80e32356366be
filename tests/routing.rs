//! Routing, admission, breakers and model operations against real loopback sims.

mod common;

use std::time::Duration;

use common::{cluster, eventually, long_seed, ndjson};
use corral::breaker::BreakerState;
use corral::config::{CategoryConfig, ListenerConfig, Origin, Policy};
use corral::node::NodeState;
use corral::sim::Faults;
use reqwest::Method;
use serde_json::{json, Value};

fn chat_body(id: &str, seed: u64) -> Value {
    json!({"model": "llama3.2", "stream": false, "messages": [{"role": "user", "content": id}], "options": {"seed": seed}})
}

/// The order in which the sim received chat requests, by their X-Request-Id.
fn arrival(c: &common::Cluster) -> Vec<String> {
    c.sims[0].received().into_iter().filter(|r| r.path == "/api/chat").filter_map(|r| r.request_id).collect()
}

#[tokio::test]
async fn local_before_remote_without_preempting_the_running_request() {
    let c = cluster(1)
        .config(|cfg| {
            cfg.nodes[0].max_concurrency = 1;
            cfg.listeners.push(ListenerConfig {
                addr: "127.0.0.1:0".into(),
                origin: Origin::Remote,
                ..ListenerConfig::default()
            });
        })
        .start()
        .await;
    c.sims[0].update_faults(|f| f.token_delay_ms = Some(20));
    let seed = long_seed(20);
    // Remote A starts and holds the only slot.
    let a = c
        .client
        .post(c.url_on(1, "/api/chat"))
        .header("x-request-id", "A")
        .json(&json!({"model": "llama3.2", "messages": [{"role": "user", "content": "a"}], "options": {"seed": seed}}))
        .send()
        .await
        .expect("A answers");
    // Remote B queues, claiming to be local through forwarding headers.
    let b = tokio::spawn({
        let req = c
            .client
            .post(c.url_on(1, "/api/chat"))
            .header("x-request-id", "B")
            .header("x-forwarded-for", "127.0.0.1")
            .header("forwarded", "for=127.0.0.1")
            .json(&chat_body("b", 1));
        async move { req.send().await.map(|r| r.status().as_u16()) }
    });
    assert!(eventually(Duration::from_secs(5), || c.broker.queue_depth() == 1).await, "B waits");
    // Local C queues after B.
    let cc = tokio::spawn({
        let req = c.client.post(c.url_on(0, "/api/chat")).header("x-request-id", "C").json(&chat_body("c", 2));
        async move { req.send().await.map(|r| r.status().as_u16()) }
    });
    assert!(eventually(Duration::from_secs(5), || c.broker.queue_depth() == 2).await, "C waits too");
    let a_text = a.text().await.expect("A's stream");
    assert!(ndjson(&a_text).last().is_some_and(|l| l["done"] == true), "A ran to the end, not pre-empted");
    assert_eq!(b.await.expect("task").expect("B answers"), 200);
    assert_eq!(cc.await.expect("task").expect("C answers"), 200);
    assert_eq!(arrival(&c), vec!["A", "C", "B"], "local C ran before remote B; forwarding headers changed nothing");
}

#[tokio::test]
async fn urgent_categories_go_first() {
    let c = cluster(1)
        .config(|cfg| {
            cfg.nodes[0].max_concurrency = 1;
            cfg.categories.push(CategoryConfig {
                name: "batch".into(),
                priority: 5,
                affinity: false,
                ..CategoryConfig::default()
            });
            cfg.categories.push(CategoryConfig {
                name: "urgent".into(),
                priority: 0,
                affinity: false,
                ..CategoryConfig::default()
            });
        })
        .start()
        .await;
    c.sims[0].update_faults(|f| f.hang_after = Some(1));
    let held = c.chat("llama3.2", true).await;
    c.sims[0].update_faults(|f| f.hang_after = None);
    let send = |cat: &'static str, id: &'static str| {
        let req = c
            .client
            .post(c.url("/api/chat"))
            .header("x-corral-category", cat)
            .header("x-request-id", id)
            .json(&chat_body(id, 3));
        tokio::spawn(async move { req.send().await.map(|r| r.status().as_u16()) })
    };
    let batch = send("batch", "batch");
    assert!(eventually(Duration::from_secs(5), || c.broker.queue_depth() == 1).await);
    let urgent = send("urgent", "urgent");
    assert!(eventually(Duration::from_secs(5), || c.broker.queue_depth() == 2).await);
    drop(held);
    assert_eq!(urgent.await.expect("task").expect("answer"), 200);
    assert_eq!(batch.await.expect("task").expect("answer"), 200);
    let order = arrival(&c);
    assert_eq!(&order[order.len() - 2..], ["urgent", "batch"], "priority 0 before priority 5: {order:?}");
}

#[tokio::test]
async fn a_full_queue_is_429_not_forwarded() {
    let c = cluster(1)
        .config(|cfg| {
            cfg.nodes[0].max_concurrency = 1;
            cfg.queue.max_requests = 1;
        })
        .start()
        .await;
    c.sims[0].update_faults(|f| f.hang_after = Some(1));
    let held = c.chat("llama3.2", true).await;
    let waiting = tokio::spawn({
        let req = c.client.post(c.url("/api/chat")).header("x-corral-queue-timeout", "5000").json(&chat_body("w", 1));
        async move { req.send().await.map(|r| r.status().as_u16()) }
    });
    assert!(eventually(Duration::from_secs(5), || c.broker.queue_depth() == 1).await);
    let r = c.post("/api/chat", chat_body("x", 2)).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["x-corral-forwarded"], "false");
    assert!(r.headers().contains_key("retry-after"));
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["code"], "queue_full");
    assert_eq!(v["forwarded"], false);
    drop(held);
    c.sims[0].update_faults(|f| f.hang_after = None);
    assert_eq!(waiting.await.expect("task").expect("answer"), 200);
    assert_eq!(c.sims[0].inference_count(), 2, "the refused request never reached the node");
}

#[tokio::test]
async fn breaker_opens_half_opens_and_closes() {
    let c = cluster(2)
        .policy(Policy::RoundRobin)
        .config(|cfg| {
            cfg.breaker.failures_to_open = 2;
            cfg.breaker.cooldown_ms = 300;
            cfg.breaker.trial_requests = 1;
        })
        .start()
        .await;
    c.sims[0].set_faults(Faults::statuses(500, 2));
    for _ in 0..6 {
        assert_eq!(c.chat("llama3.2", false).await.status(), 200, "failures are hidden by failover");
        if c.node(0).breaker_state() == BreakerState::Open {
            break;
        }
    }
    assert_eq!(c.node(0).breaker_state(), BreakerState::Open, "two failures open it");
    let asked = c.sims[0].inference_count();
    for _ in 0..4 {
        let r = c.chat("llama3.2", false).await;
        assert_eq!(r.headers()["x-corral-node"], "n1", "an open breaker keeps n0 out");
    }
    assert_eq!(c.sims[0].inference_count(), asked, "n0 got nothing while open");
    assert!(
        eventually(Duration::from_secs(5), || c.node(0).breaker_state() == BreakerState::HalfOpen).await,
        "cool-down ends"
    );
    for _ in 0..4 {
        assert_eq!(c.chat("llama3.2", false).await.status(), 200);
        if c.node(0).breaker_state() == BreakerState::Closed {
            break;
        }
    }
    assert_eq!(c.node(0).breaker_state(), BreakerState::Closed, "a good trial closes it");
    assert_eq!(c.sims[0].inference_count(), asked + 1, "exactly one trial went through");
}

#[tokio::test]
async fn the_last_node_standing_is_not_ejected() {
    let c = cluster(1).config(|cfg| cfg.breaker.failures_to_open = 1).start().await;
    c.sims[0].set_faults(Faults::statuses(500, 1));
    let _ = c.chat("llama3.2", false).await;
    assert_eq!(c.node(0).breaker_state(), BreakerState::Open);
    let r = c.chat("llama3.2", false).await;
    assert_eq!(r.status(), 200, "with every breaker open, the cluster still tries");
}

#[tokio::test]
async fn an_over_long_prompt_is_refused_before_any_node() {
    let c = cluster(1).config(|cfg| cfg.proxy.default_num_ctx = 100).start().await;
    let long = "word ".repeat(200);
    // Ollama refuses what does not fit only when told not to truncate; so does Corral.
    let r =
        c.post("/api/generate", json!({"model": "llama3.2", "prompt": long, "stream": false, "truncate": false})).await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["code"], "context_too_long");
    assert!(v["error"].as_str().is_some_and(|e| e.contains("250") && e.contains("100")), "names both numbers: {v}");
    assert_eq!(c.sims[0].inference_count(), 0, "it never reached a node");
    // 360 bytes = 90 estimated tokens: over 85% of 100, so it passes with a warning.
    let r = c.post("/api/generate", json!({"model": "llama3.2", "prompt": "x".repeat(360), "stream": false})).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().contains_key("x-corral-context-warning"));
    // The request's own num_ctx wins.
    let r = c
        .post(
            "/api/generate",
            json!({"model": "llama3.2", "prompt": long, "stream": false, "options": {"num_ctx": 8192}}),
        )
        .await;
    assert_eq!(r.status(), 200);
    assert!(!r.headers().contains_key("x-corral-context-warning"));
    // By default Ollama truncates and answers: Corral passes it on, saying it will be cut.
    let small = json!({"num_ctx": 100});
    let r =
        c.post("/api/generate", json!({"model": "llama3.2", "prompt": long, "stream": false, "options": small})).await;
    assert_eq!(r.status(), 200);
    let warning = r.headers()["x-corral-context-warning"].to_str().unwrap_or_default().to_string();
    assert!(warning.contains("truncate"), "{warning}");
    let chat = json!({"model": "llama3.2", "stream": false, "options": small, "messages": [{"role": "user", "content": long}]});
    assert_eq!(c.post("/api/chat", chat).await.status(), 200, "a long chat Ollama trims is served");
}

#[tokio::test]
async fn pull_goes_to_the_named_nodes_with_per_node_progress() {
    let c = cluster(3).start().await;
    let r = c
        .client
        .post(c.url("/api/pull"))
        .header("x-corral-node", "n0,n2")
        .json(&json!({"model": "qwen3:4b"}))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), 200);
    let lines = ndjson(&r.text().await.expect("body"));
    let nodes: std::collections::BTreeSet<&str> = lines.iter().filter_map(|l| l["node"].as_str()).collect();
    assert_eq!(nodes, ["n0", "n2"].into_iter().collect(), "progress from the named nodes only");
    assert!(lines.iter().any(|l| l["node"] == "n0" && l["completed"].is_u64()), "byte progress per node");
    assert_eq!(lines.last().map(|l| l["status"].clone()), Some(json!("success")));
    assert_eq!(lines.iter().filter(|l| l["status"] == "success").count(), 1, "one final success, after all nodes");
    assert!(lines.iter().any(|l| l["status"] == "node n0: success" && l["node"] == "n0"), "each node's own end");
    let last = lines.last().expect("lines");
    let mut finished: Vec<&String> = last["nodes"].as_object().expect("per-node results").keys().collect();
    finished.sort();
    assert_eq!(finished, ["n0", "n2"], "the final line names each node's result");
    assert!(c.sims[0].models().contains(&"qwen3:4b".to_string()));
    assert!(!c.sims[1].models().contains(&"qwen3:4b".to_string()), "n1 was not named");
    assert!(c.sims[2].models().contains(&"qwen3:4b".to_string()));
    assert_eq!(c.node(0).serves("qwen3:4b"), Some(true), "routing learned it at once");
    let r = c
        .client
        .post(c.url("/api/pull"))
        .header("x-corral-node", "n9")
        .json(&json!({"model": "x"}))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), 400);
    assert_eq!(r.json::<Value>().await.expect("json")["code"], "unknown_node");
    // Delete from every node that has it.
    let r = c.client.delete(c.url("/api/delete")).json(&json!({"model": "qwen3:4b"})).send().await.expect("answer");
    assert_eq!(r.status(), 200);
    assert!(c.sims.iter().all(|s| !s.models().contains(&"qwen3:4b".to_string())));
}

#[tokio::test]
async fn affinity_sends_requests_where_the_model_is_hot() {
    let c = cluster(3).policy(Policy::RoundRobin).config(|cfg| cfg.categories[0].affinity = true).start().await;
    // Load the model on n2 only, directly.
    let direct = reqwest::Client::new();
    direct
        .post(format!("{}/api/generate", c.sims[2].url()))
        .json(&json!({"model": "llama3.2", "prompt": "", "stream": false}))
        .send()
        .await
        .expect("loads");
    c.learn_models().await;
    for _ in 0..5 {
        let r = c.chat("llama3.2", false).await;
        assert_eq!(r.headers()["x-corral-node"], "n2");
    }
}

#[tokio::test]
async fn sticky_sessions_stay_put() {
    let c = cluster(3).policy(Policy::Sticky).start().await;
    let mut owners = std::collections::BTreeMap::new();
    for s in 0..12 {
        let session = format!("conv-{s}");
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..3 {
            let r = c
                .client
                .post(c.url("/api/chat"))
                .header("x-corral-session", &session)
                .json(&chat_body("s", 1))
                .send()
                .await
                .expect("answer");
            seen.insert(r.headers()["x-corral-node"].to_str().unwrap_or_default().to_string());
        }
        assert_eq!(seen.len(), 1, "{session} stays on one node");
        owners.insert(session, seen.into_iter().next().unwrap_or_default());
    }
    let distinct: std::collections::BTreeSet<_> = owners.values().collect();
    assert!(distinct.len() >= 2, "sessions spread: {owners:?}");
}

#[tokio::test]
async fn draining_lets_in_flight_streams_finish_and_takes_nothing_new() {
    let c = cluster(2).policy(Policy::RoundRobin).start().await;
    c.sims[0].update_faults(|f| f.token_delay_ms = Some(10));
    let r = c.chat("llama3.2", true).await;
    assert_eq!(r.headers()["x-corral-node"], "n0");
    let patched =
        c.admin(Method::PATCH, "/admin/nodes/n0").json(&json!({"draining": true})).send().await.expect("admin");
    assert_eq!(patched.status(), 200);
    assert_eq!(c.node(0).state(), NodeState::Draining);
    let lines = ndjson(&r.text().await.expect("stream finishes"));
    assert_eq!(lines.last().map(|l| l["done"].clone()), Some(json!(true)));
    for _ in 0..4 {
        assert_eq!(c.chat("llama3.2", false).await.headers()["x-corral-node"], "n1");
    }
}

#[tokio::test]
async fn policy_can_change_at_runtime() {
    let c = cluster(2).start().await;
    let r = c
        .admin(Method::PUT, "/admin/categories/default")
        .json(&json!({"policy": "round-robin", "affinity": false}))
        .send()
        .await
        .expect("admin");
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let mut nodes = Vec::new();
    for _ in 0..4 {
        nodes.push(c.chat("llama3.2", false).await.headers()["x-corral-node"].to_str().unwrap_or_default().to_string());
    }
    assert_eq!(nodes, vec!["n0", "n1", "n0", "n1"], "round robin now");
    let r = c
        .admin(Method::PUT, "/admin/categories/default")
        .json(&json!({"policy": "fastest"}))
        .send()
        .await
        .expect("admin");
    assert_eq!(r.status(), 400, "an unknown policy is refused and nothing changes");
    assert_eq!(c.broker.config().categories[0].policy, Policy::RoundRobin);
}
