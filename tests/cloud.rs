//! Cloud fallback, redaction and OpenAI-compatible nodes, against loopback sims: local Ollama
//! sims, and a sim playing an OpenAI-compatible cloud that records what it received.
//! (The API key from the OS keyring is covered in tests/secrets.rs, inside a D-Bus session.)

mod common;

use std::time::Duration;

use common::{cluster, eventually, ndjson};
use corral::config::{CategoryConfig, CloudPermission, NodeConfig, NodeKind, ProviderConfig};
use corral::sim::{Faults, ScriptStep, SimNode, SimSpec};
use corral::telemetry::Event;
use serde_json::{json, Value};

async fn cloud_sim(f: impl FnOnce(&mut SimSpec)) -> SimNode {
    let mut spec = SimSpec { models: vec!["gpt-4o-mini".into()], cloud: true, ..SimSpec::default() };
    f(&mut spec);
    SimNode::start(spec).await.expect("cloud sim starts")
}

fn provider(name: &str, cloud: &SimNode) -> ProviderConfig {
    ProviderConfig {
        name: name.into(),
        base_url: format!("{}/v1", cloud.url()),
        model_map: [("llama3.2".to_string(), "gpt-4o-mini".to_string())].into(),
        ..ProviderConfig::default()
    }
}

/// Two local nodes; `default` may fall back to `providers`, `hr` may not, `support` falls back
/// with redaction.
async fn setup(providers: Vec<ProviderConfig>) -> common::Cluster {
    let names: Vec<String> = providers.iter().map(|p| p.name.clone()).collect();
    cluster(2)
        .config(move |cfg| {
            cfg.categories[0].cloud = CloudPermission::OnFailure;
            cfg.categories[0].providers = names.clone();
            cfg.categories.push(CategoryConfig { name: "hr".into(), ..CategoryConfig::default() });
            cfg.categories.push(CategoryConfig {
                name: "support".into(),
                cloud: CloudPermission::OnFailure,
                providers: names,
                redact: true,
                ..CategoryConfig::default()
            });
            cfg.providers = providers;
        })
        .start()
        .await
}

/// A cluster whose only node is the OpenAI-compatible `node` (`kind = "openai"`), models learned.
async fn only_openai_node(node: &SimNode) -> common::Cluster {
    let url = node.url();
    let c = cluster(0)
        .config(move |cfg| {
            cfg.nodes = vec![NodeConfig { name: "llama".into(), url, kind: NodeKind::Openai, ..NodeConfig::default() }]
        })
        .start()
        .await;
    c.learn_models().await;
    c
}

fn stop_all(c: &common::Cluster) {
    for s in &c.sims {
        s.stop();
    }
}

/// A chat sent with `X-Corral-Category: category`.
async fn chat_in(c: &common::Cluster, category: &str, model: &str, stream: bool) -> reqwest::Response {
    c.client
        .post(c.url("/api/chat"))
        .header("x-corral-category", category)
        .json(&json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": "salary review"}]}))
        .send()
        .await
        .expect("answer")
}

fn cloud_calls(cloud: &SimNode) -> usize {
    cloud.count("/v1/chat/completions") + cloud.count("/v1/embeddings") + cloud.count("/v1/completions")
}

#[tokio::test]
async fn all_nodes_down_falls_back_streamed_in_ollamas_format() {
    let cloud = cloud_sim(|_| {}).await;
    let c = setup(vec![provider("cloudsim", &cloud)]).await;
    stop_all(&c);

    let r = c.chat("llama3.2", true).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-corral-fallback"], "cloudsim");
    assert_eq!(r.headers()["content-type"], "application/x-ndjson");
    let lines = ndjson(&r.text().await.expect("body"));
    assert!(lines.len() > 2, "streamed token by token: {lines:?}");
    let (last, tokens) = lines.split_last().expect("lines");
    assert!(tokens
        .iter()
        .all(|l| l["done"] == false && l["model"] == "gpt-4o-mini" && l["message"]["role"] == "assistant"));
    assert_eq!(last["done"], true);
    assert_eq!(last["done_reason"], "stop");
    assert_eq!(last["eval_count"].as_u64(), Some(tokens.len() as u64), "usage from the provider");
    assert!(last["prompt_eval_count"].as_u64().is_some_and(|n| n > 0));

    let sent = cloud.received().into_iter().find(|r| r.path == "/v1/chat/completions").expect("the cloud got it");
    assert_eq!(sent.model.as_deref(), Some("gpt-4o-mini"), "model_map applied");
    let body: Value = serde_json::from_str(sent.body.as_deref().unwrap_or("")).expect("json body");
    assert_eq!(body["messages"], json!([{"role": "user", "content": "hello"}]));
    assert_eq!(body["stream"], true);

    let r = c.chat("llama3.2", false).await;
    assert_eq!(r.headers()["x-corral-fallback"], "cloudsim");
    let v: Value = r.json().await.expect("json");
    assert_eq!((v["done"].clone(), v["model"].clone()), (json!(true), json!("gpt-4o-mini")), "the model that answered");
    assert!(v["message"]["content"].as_str().is_some_and(|t| !t.is_empty()));

    let r = c.post("/api/generate", json!({"model": "llama3.2", "prompt": "hi", "stream": false})).await;
    let v: Value = r.json().await.expect("json");
    assert!(v["response"].as_str().is_some_and(|t| !t.is_empty()), "{v}");

    // `/v1` goes as it came, with only the model changed.
    let r = c
        .post(
            "/v1/chat/completions",
            json!({"model": "llama3.2", "stream": true, "messages": [{"role": "user", "content": "x"}]}),
        )
        .await;
    assert_eq!(r.headers()["x-corral-fallback"], "cloudsim");
    assert!(r.text().await.expect("body").trim_end().ends_with("data: [DONE]"));

    // The store says who answered (once its writer has flushed).
    let mut rows = Vec::new();
    for _ in 0..500 {
        let v: Value =
            c.admin(reqwest::Method::GET, "/admin/requests").send().await.expect("admin").json().await.expect("json");
        rows = v["requests"].as_array().cloned().unwrap_or_default();
        if rows.iter().filter(|r| r["status"] != "running").count() >= 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(rows.iter().filter(|r| r["fallback"] == "cloudsim" && r["status"] == "ok").count(), 4, "{rows:?}");
}

#[tokio::test]
async fn a_never_category_gets_503_and_the_cloud_sees_nothing() {
    let cloud = cloud_sim(|_| {}).await;
    let c = setup(vec![provider("cloudsim", &cloud)]).await;
    stop_all(&c);
    for stream in [true, false] {
        let r = chat_in(&c, "hr", "llama3.2", stream).await;
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()["x-corral-forwarded"], "false");
        let v: Value = r.json().await.expect("json");
        assert_eq!(v["code"], "cloud_not_allowed");
        assert!(v["error"].as_str().is_some_and(|e| e.contains("\"hr\"") && e.contains("never")), "{v}");
    }
    // A model the dead nodes might have had: still 503, and still nothing leaves.
    let r = chat_in(&c, "hr", "qwen9", true).await;
    assert_eq!(r.status(), 503);
    assert_eq!(cloud.received().len(), 0, "nothing left the building");
}

#[tokio::test]
async fn a_healthy_cluster_answers_locally_and_mid_stream_failures_never_fall_back() {
    let cloud = cloud_sim(|_| {}).await;
    let c = setup(vec![provider("cloudsim", &cloud)]).await;
    let r = c.chat("llama3.2", false).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("x-corral-fallback").is_none());
    assert!(r.headers().get("x-corral-node").is_some());

    for s in &c.sims {
        s.set_faults(Faults { cut_after: Some(2), ..Faults::default() });
    }
    let text = c.chat("llama3.2", true).await.text().await.expect("body");
    let lines = ndjson(&text);
    assert_eq!(lines.last().map(|l| l["code"].clone()), Some(json!("stream_interrupted")));
    assert_eq!(cloud_calls(&cloud), 0, "after the first byte there is no fallback");
}

#[tokio::test]
async fn a_model_no_node_has_is_a_404_in_a_never_category() {
    let cloud = cloud_sim(|_| {}).await;
    let c = setup(vec![provider("cloudsim", &cloud)]).await;
    c.learn_models().await;
    let r = chat_in(&c, "hr", "qwen9", true).await;
    assert_eq!(r.status(), 404);
    assert_eq!(r.json::<Value>().await.expect("json")["code"], "model_not_found");
    assert_eq!(cloud.received().len(), 0);
}

#[tokio::test]
async fn a_model_no_node_has_is_answered_by_the_cloud() {
    let cloud = cloud_sim(|s| s.models.push("qwen-max".into())).await;
    let mut p = provider("cloudsim", &cloud);
    p.model_map.insert("qwen3:235b".into(), "qwen-max".into());
    let c = setup(vec![p]).await;
    c.learn_models().await;
    let r = c
        .post(
            "/api/chat",
            json!({"model": "qwen3:235b", "stream": false, "messages": [{"role": "user", "content": "x"}]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-corral-fallback"], "cloudsim");
    assert_eq!(cloud.received()[0].model.as_deref(), Some("qwen-max"));
    assert_eq!(c.inference_counts(), vec![0, 0]);
}

#[tokio::test]
async fn providers_are_tried_in_order_and_all_failures_are_reported_together() {
    let keyed = cloud_sim(|s| s.api_key = Some("sk-right".into())).await;
    let dead = cloud_sim(|_| {}).await;
    dead.stop();
    let c = setup(vec![provider("first", &dead), provider("second", &keyed)]).await;
    let (_, v) = cloud_failure(&c).await;
    let msg = v["error"].as_str().unwrap_or("");
    assert!(msg.contains("first: cannot connect"), "{msg}");
    assert!(msg.contains("second: HTTP 401 Incorrect API key"), "{msg}");
    assert!(msg.contains("n0") && msg.contains("n1"), "the local reason too: {msg}");
    assert_eq!(keyed.count("/v1/chat/completions"), 1, "the second was tried after the first");
    assert_eq!(v["forwarded"], true, "the second provider received it");
}

#[tokio::test]
async fn a_fallback_that_reached_no_provider_says_it_was_sent_nowhere() {
    let dead = cloud_sim(|_| {}).await;
    dead.stop();
    let c = setup(vec![provider("first", &dead)]).await;
    let (headers, v) = cloud_failure(&c).await;
    assert_eq!(headers.get("x-corral-forwarded").map(|v| v.as_bytes()), Some(&b"false"[..]), "safe to send again");
    assert_eq!(v["forwarded"], false, "{v}");
}

/// With every node of `c` stopped, a chat that every provider fails: a 502 `cloud_failed`, its
/// headers and body.
async fn cloud_failure(c: &common::Cluster) -> (reqwest::header::HeaderMap, Value) {
    stop_all(c);
    let r = c.chat("llama3.2", false).await;
    assert_eq!(r.status(), 502);
    let headers = r.headers().clone();
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["code"], "cloud_failed", "{v}");
    (headers, v)
}

#[tokio::test]
async fn redaction_hides_pii_from_the_cloud_and_the_client_gets_it_back() {
    let cloud = cloud_sim(|s| s.echo = true).await;
    let c = setup(vec![provider("cloudsim", &cloud)]).await;
    stop_all(&c);
    let said = "Reach me at li.wei@example.com or 13800138000; ID 11010519491231002X, card 4111 1111 1111 1111.";
    for stream in [true, false] {
        let r = c
            .client
            .post(c.url("/api/chat"))
            .header("x-corral-category", "support")
            .json(&json!({"model": "llama3.2", "stream": stream, "messages": [{"role": "user", "content": said}]}))
            .send()
            .await
            .expect("answer");
        assert_eq!(r.headers()["x-corral-fallback"], "cloudsim");
        let text = r.text().await.expect("body");
        let answer: String = if stream {
            ndjson(&text).iter().filter_map(|l| l["message"]["content"].as_str().map(str::to_string)).collect()
        } else {
            serde_json::from_str::<Value>(&text).expect("json")["message"]["content"].as_str().unwrap_or("").to_string()
        };
        assert_eq!(answer, said, "placeholders restored (stream: {stream})");
    }
    for r in cloud.received() {
        let body = r.body.unwrap_or_default();
        for secret in ["li.wei@example.com", "13800138000", "11010519491231002X", "4111 1111 1111 1111"] {
            assert!(!body.contains(secret), "{secret} reached the cloud: {body}");
        }
        assert!(body.contains("[EMAIL_1]") && body.contains("[CARD_1]"), "{body}");
    }
    assert_eq!(cloud.received().len(), 2);
}

#[tokio::test]
async fn crossing_the_fallback_share_raises_one_event() {
    let cloud = cloud_sim(|_| {}).await;
    let c = cluster(1)
        .config({
            let p = provider("cloudsim", &cloud);
            move |cfg| {
                cfg.categories[0].cloud = CloudPermission::OnFailure;
                cfg.categories[0].providers = vec!["cloudsim".into()];
                cfg.providers = vec![p];
                cfg.alerts.fallback_share = 0.5;
                cfg.alerts.fallback_min_requests = 2;
            }
        })
        .start()
        .await;
    let mut events = c.broker.shared().telemetry.subscribe();
    assert_eq!(c.chat("llama3.2", false).await.status(), 200);
    c.sims[0].stop();
    for _ in 0..3 {
        assert_eq!(c.chat("llama3.2", false).await.status(), 200);
    }
    let mut crossings = Vec::new();
    while let Ok(Ok(e)) = tokio::time::timeout(Duration::from_millis(200), events.recv()).await {
        if let Event::FallbackShare { share, above, .. } = e {
            crossings.push((share, above));
        }
    }
    assert_eq!(crossings, vec![(0.5, true)], "one event, when 1 of 2 came from the cloud");
    let status: Value =
        c.admin(reqwest::Method::GET, "/admin/status").send().await.expect("admin").json().await.expect("json");
    assert_eq!(status["fallback"]["share"], json!(0.75));
    let metrics = c.client.get(c.admin_url("/metrics")).bearer_auth(common::TOKEN).send().await.expect("metrics");
    assert!(metrics.text().await.expect("text").contains("corral_fallback_share 0.75"));
}

#[tokio::test]
async fn an_openai_compatible_node_serves_ollama_clients_with_ollama_answers() {
    // A sim that speaks only `/v1` stands in for a llama.cpp server (the real one runs in
    // tests/python/test_llamacpp.py).
    let node = cloud_sim(|s| s.models = vec!["tiny".into()]).await;
    let c = only_openai_node(&node).await;
    let tags: Value = c.client.get(c.url("/api/tags")).send().await.expect("tags").json().await.expect("json");
    assert_eq!(tags["models"][0]["name"], "tiny");
    assert!(
        corral::health::probe_liveness(&c.client, &c.node(0), Duration::from_secs(2)).await,
        "/health is 404, /v1/models answers"
    );

    let r = c.chat("tiny", true).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-corral-node"], "llama");
    let lines = ndjson(&r.text().await.expect("body"));
    let last = lines.last().expect("lines");
    assert_eq!((last["done"].clone(), last["model"].clone()), (json!(true), json!("tiny")));
    assert_eq!(last["eval_count"].as_u64(), Some(lines.len() as u64 - 1));
    let r = c.post("/api/embed", json!({"model": "tiny", "input": ["a", "b"]})).await;
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["embeddings"].as_array().map(Vec::len), Some(2), "{v}");
    // Its own refusals come back in Ollama's words.
    let r = c.post("/api/chat", json!({"model": "tiny", "messages": [{"role": "robot", "content": "x"}]})).await;
    assert_eq!(r.status(), 400);
    assert!(r.json::<Value>().await.expect("json")["error"].as_str().is_some_and(|e| e.contains("robot")));
    assert!(node.received().iter().all(|r| !r.path.starts_with("/api/")), "nothing Ollama-native reached it");
}

#[tokio::test]
async fn an_unknown_model_never_becomes_a_paid_cloud_call() {
    let cloud = cloud_sim(|_| {}).await;
    let mut p = provider("cloudsim", &cloud);
    p.model_map.insert("*".into(), "gpt-4o-mini".into());
    let c = setup(vec![p]).await;
    c.learn_models().await;
    // A typo in a cloud-allowed category: no node has it, and the provider only maps it
    // through its catch-all entry.
    let r = chat_in(&c, "default", "llama3.3-typo", false).await;
    assert_eq!(r.status(), 404);
    assert_eq!(r.json::<Value>().await.expect("json")["code"], "model_not_found");
    assert_eq!(cloud_calls(&cloud), 0, "nothing was sent to the provider with the organisation's key");
    // A model the provider names explicitly is a deliberate cloud model: it may go there.
    let mut mapped = provider("cloudsim", &cloud);
    mapped.model_map.insert("gpt-only".into(), "gpt-4o-mini".into());
    let c = setup(vec![mapped]).await;
    c.learn_models().await;
    let r = chat_in(&c, "default", "gpt-only", false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(cloud_calls(&cloud), 1);
}

#[tokio::test]
async fn a_fallback_answer_is_credited_to_the_provider_not_the_node_that_failed() {
    let cloud = cloud_sim(|_| {}).await;
    let c = setup(vec![provider("cloudsim", &cloud)]).await;
    c.learn_models().await;
    for s in &c.sims {
        s.set_faults(Faults::statuses(500, 100));
    }
    let r = chat_in(&c, "default", "llama3.2", false).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-corral-fallback"], "cloudsim");
    let store = c.broker.shared().telemetry.store().expect("store on").clone();
    let mut rows = Vec::new();
    for _ in 0..300 {
        rows = store.requests(&corral::store::Query::default()).await.expect("query");
        if rows.iter().any(|r| r.status == "ok") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let row = rows.iter().find(|r| r.status == "ok").expect("the fallback's row");
    assert_eq!(row.fallback.as_deref(), Some("cloudsim"), "{rows:#?}");
    assert_eq!(row.node, None, "no node answered; the failed ones are in attempts ({})", row.attempts);
    assert!(row.attempts >= 2, "local attempts plus the provider");
    assert_eq!(row.answered_model.as_deref(), Some("gpt-4o-mini"), "the record names the model that answered");
    assert_eq!(row.failed_attempts.len() as i64, row.attempts - 1, "each failed attempt is listed: {row:?}");
    for f in &row.failed_attempts {
        assert!(f.node == "n0" || f.node == "n1", "{f:?}");
        assert_eq!(f.outcome, "failed", "{f:?}");
        assert!(f.detail.contains("HTTP 500"), "{f:?}");
    }
    let metrics = c.admin(reqwest::Method::GET, "/metrics").send().await.expect("metrics").text().await.expect("text");
    assert!(metrics.contains("node=\"provider:cloudsim\""), "metrics name the provider:\n{metrics}");
    assert!(
        metrics.contains("corral_fallbacks_total{provider=\"cloudsim\",model=\"gpt-4o-mini\"} 1"),
        "metrics name the provider's model:\n{metrics}"
    );
    assert!(metrics.contains("corral_failed_attempts_total{node=\"n0\",outcome=\"failed\"}"), "{metrics}");
}

#[tokio::test]
async fn loads_and_unloads_generate_nothing_anywhere() {
    // An OpenAI-compatible node: a bare load is answered at once, never turned into a chat.
    let node = cloud_sim(|s| s.models = vec!["tiny".into()]).await;
    let c = only_openai_node(&node).await;
    let r = c.post("/api/generate", json!({"model": "tiny"})).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.expect("json");
    assert_eq!((v["done"].clone(), v["done_reason"].clone()), (json!(true), json!("load")), "{v}");
    assert_eq!(cloud_calls(&node), 0, "nothing was generated on the node");

    // `ollama stop` reaches every Ollama node, and a cloud-allowed category never bills it.
    let cloud = cloud_sim(|_| {}).await;
    let c = setup(vec![provider("cloudsim", &cloud)]).await;
    c.learn_models().await;
    let r = chat_in(&c, "default", "llama3.2", false).await;
    assert_eq!(r.status(), 200);
    let unload = json!({"model": "llama3.2", "keep_alive": 0});
    let r = c.post("/api/generate", unload.clone()).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.expect("json")["done_reason"], "unload");
    for (i, s) in c.sims.iter().enumerate() {
        let got = s.received().iter().filter(|r| r.path == "/api/generate").count();
        assert_eq!(got, 1, "node {i} was asked to unload");
    }
    stop_all(&c);
    let r = c.post("/api/generate", unload).await;
    assert_ne!(r.status(), 200, "no node to unload from");
    let r = c.post("/api/chat", json!({"model": "llama3.2", "messages": []})).await;
    assert!(!r.status().is_success(), "a load with every node down fails locally");
    assert_eq!(cloud_calls(&cloud), 0, "neither a load nor an unload was sent to the provider");
}

#[tokio::test]
async fn show_during_an_outage_answers_a_remote_model_where_the_cloud_is_allowed() {
    let cloud = cloud_sim(|_| {}).await;
    let c = setup(vec![provider("cloudsim", &cloud)]).await;
    c.learn_models().await;
    stop_all(&c);
    let show = |category: &'static str| {
        c.client
            .post(c.url("/api/show"))
            .header("x-corral-category", category)
            .json(&json!({"model": "llama3.2"}))
            .send()
    };
    let r = show("default").await.expect("answer");
    assert_eq!(r.status(), 200, "clients that ask show before chatting keep working");
    assert_eq!(r.headers()["x-corral-fallback"], "cloudsim");
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["remote_model"], "gpt-4o-mini");
    assert!(v["details"].is_object() && v["capabilities"][0] == "completion", "{v}");
    assert!(!show("hr").await.expect("answer").status().is_success(), "a never category says the cluster is down");
    assert_eq!(cloud_calls(&cloud), 0, "show costs the provider nothing");
}

#[tokio::test]
async fn union_listings_name_a_model_once_however_each_node_spells_it() {
    // An Ollama node says `llama3.2:latest`; an OpenAI-compatible one says `llama3.2`.
    let openai = cloud_sim(|s| s.models = vec!["llama3.2".into()]).await;
    let c = cluster(1)
        .config({
            let url = openai.url();
            move |cfg| {
                cfg.nodes.push(NodeConfig {
                    name: "llama".into(),
                    url,
                    kind: NodeKind::Openai,
                    ..NodeConfig::default()
                })
            }
        })
        .start()
        .await;
    c.learn_models().await;
    let tags: Value = c.client.get(c.url("/api/tags")).send().await.expect("tags").json().await.expect("json");
    let llamas: Vec<&Value> = tags["models"]
        .as_array()
        .expect("models")
        .iter()
        .filter(|m| m["name"].as_str().is_some_and(|n| n.starts_with("llama3.2")))
        .collect();
    assert_eq!(llamas.len(), 1, "one entry for llama3.2: {tags}");
    assert_eq!(llamas[0]["nodes"].as_array().map(Vec::len), Some(2), "listing both nodes: {tags}");
    let v1: Value = c.client.get(c.url("/v1/models")).send().await.expect("models").json().await.expect("json");
    let ids: Vec<&str> = v1["data"].as_array().expect("data").iter().filter_map(|m| m["id"].as_str()).collect();
    assert_eq!(ids.iter().filter(|id| id.starts_with("llama3.2")).count(), 1, "{ids:?}");
}

/// Faults that answer the next `steps` inference requests as scripted.
fn scripted(steps: impl IntoIterator<Item = ScriptStep>) -> Faults {
    Faults { script: steps.into_iter().collect(), ..Faults::default() }
}

/// Chats each provider sim received.
fn chats(sims: &[&SimNode]) -> Vec<usize> {
    sims.iter().map(|s| s.count("/v1/chat/completions")).collect()
}

/// A `/api/chat` with a queue timeout of `queue_ms`, timed.
async fn timed_chat(c: &common::Cluster, queue_ms: Option<u64>) -> (reqwest::Response, Duration) {
    let mut r = c.client.post(c.url("/api/chat")).json(&json!({
        "model": "llama3.2", "stream": false, "messages": [{"role": "user", "content": "hello"}],
    }));
    if let Some(ms) = queue_ms {
        r = r.header("x-corral-queue-timeout", ms.to_string());
    }
    let started = tokio::time::Instant::now();
    let answer = r.send().await.expect("answer");
    (answer, started.elapsed())
}

#[tokio::test]
async fn a_provider_429_goes_to_the_next_at_once_and_keeps_that_provider_out_for_its_retry_after() {
    let (first, second) = (cloud_sim(|_| {}).await, cloud_sim(|_| {}).await);
    // One 429 only: were `first` asked again within its Retry-After, it would answer.
    first.set_faults(scripted([ScriptStep::rate_limited(1, Some(3))]));
    let c = setup(vec![provider("first", &first), provider("second", &second)]).await;
    stop_all(&c);

    let (r, took) = timed_chat(&c, None).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-corral-fallback"], "second", "the next provider answered");
    assert!(took < Duration::from_millis(1500), "at once, not after the 3 s Retry-After: {took:?}");
    assert_eq!(chats(&[&first, &second]), vec![1, 1]);

    let (r, took) = timed_chat(&c, None).await;
    assert_eq!(r.headers()["x-corral-fallback"], "second");
    assert!(took < Duration::from_millis(1500), "{took:?}");
    assert_eq!(chats(&[&first, &second]), vec![1, 2], "within its Retry-After the rate-limited provider gets nothing");

    let clients = &c.broker.shared().cloud_clients;
    assert!(clients.held_off("first").is_some_and(|left| left <= Duration::from_secs(3)), "held off, for at most 3 s");
    assert!(eventually(Duration::from_secs(5), || clients.held_off("first").is_none()).await, "the hold-off ends");
    let r = c.chat("llama3.2", false).await;
    assert_eq!(r.headers()["x-corral-fallback"], "first", "back in the chain, first again, once its wait is over");
    assert_eq!(chats(&[&first, &second]), vec![2, 2]);
}

#[tokio::test]
async fn a_rate_limited_provider_is_waited_for_only_when_nothing_else_can_serve_and_the_wait_fits() {
    let only = cloud_sim(|_| {}).await;
    let c = setup(vec![provider("only", &only)]).await;
    stop_all(&c);

    // Nothing else can serve, and its 1 s fits the 30 s queue timeout: the same provider again.
    only.set_faults(scripted([ScriptStep::rate_limited(1, Some(1))]));
    let (r, took) = timed_chat(&c, None).await;
    assert_eq!(r.status(), 200, "answered once its Retry-After passed");
    assert_eq!(r.headers()["x-corral-fallback"], "only");
    assert!(took >= Duration::from_millis(900), "it waited for the Retry-After: {took:?}");
    assert!(took < Duration::from_secs(4), "and not much longer: {took:?}");
    assert_eq!(chats(&[&only]), vec![2]);

    // A 30 s wait does not fit a 1 s queue timeout: the client hears it at once, with the wait.
    only.set_faults(scripted([ScriptStep::rate_limited(5, Some(30))]));
    let (r, took) = timed_chat(&c, Some(1000)).await;
    assert_eq!(r.status(), 429);
    let wait: u64 = r.headers()["retry-after"].to_str().expect("ascii").parse().expect("seconds");
    assert!((29..=30).contains(&wait), "the provider's Retry-After reaches the client: {wait}");
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["code"], "cloud_rate_limited", "{v}");
    assert!(v["error"].as_str().is_some_and(|e| e.contains("only: HTTP 429")), "{v}");
    assert!(took < Duration::from_millis(1500), "{took:?}");
    assert_eq!(chats(&[&only]), vec![3], "not asked again within its wait");

    // Still held off: the next request does not reach it either.
    let (r, _) = timed_chat(&c, Some(1000)).await;
    assert_eq!((r.status().as_u16(), r.headers().contains_key("retry-after")), (429, true));
    assert_eq!(chats(&[&only]), vec![3]);
}

#[tokio::test]
async fn when_every_provider_fails_and_one_was_rate_limited_the_client_keeps_its_retry_after() {
    let limited = cloud_sim(|_| {}).await;
    let keyed = cloud_sim(|s| s.api_key = Some("sk-right".into())).await;
    limited.set_faults(scripted([ScriptStep::rate_limited(5, Some(20))]));
    let c = setup(vec![provider("limited", &limited), provider("keyed", &keyed)]).await;
    stop_all(&c);
    let (r, took) = timed_chat(&c, Some(2000)).await;
    assert_eq!(r.status(), 502);
    let wait: u64 = r.headers()["retry-after"].to_str().expect("ascii").parse().expect("seconds");
    assert!((19..=20).contains(&wait), "the rate-limited provider's wait, not the default 1 s: {wait}");
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["code"], "cloud_failed");
    let msg = v["error"].as_str().unwrap_or("");
    assert!(msg.contains("limited: HTTP 429") && msg.contains("keyed: HTTP 401"), "every provider's reason: {msg}");
    assert!(took < Duration::from_millis(1500), "{took:?}");
    assert_eq!(chats(&[&limited, &keyed]), vec![1, 1], "the 401 is not retried");
}

#[tokio::test]
async fn a_content_filter_refusal_reaches_the_client_once_with_its_code_and_the_next_provider_sees_nothing() {
    let (first, second) = (cloud_sim(|_| {}).await, cloud_sim(|_| {}).await);
    let c = setup(vec![provider("first", &first), provider("second", &second)]).await;
    stop_all(&c);

    // `/v1`: the provider's refusal as it sent it.
    first.set_faults(scripted([ScriptStep::content_filter(1)]));
    let r = c
        .post("/v1/chat/completions", json!({"model": "llama3.2", "messages": [{"role": "user", "content": "x"}]}))
        .await;
    assert_eq!(r.status(), 400);
    assert_eq!(r.headers()["x-corral-fallback"], "first", "whose refusal it is");
    assert!(r.headers().get("x-corral-forwarded").is_none(), "it was forwarded");
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["error"]["code"], "content_filter", "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("content management policy")), "{v}");
    assert_eq!(chats(&[&first, &second]), vec![1, 0], "once, and the next provider saw nothing");

    // `/api/chat`: in Ollama's shape, status, code and Retry-After kept.
    first.set_faults(scripted([ScriptStep { retry_after: Some(2), ..ScriptStep::content_filter(1) }]));
    let r = c.chat("llama3.2", true).await;
    assert_eq!(r.status(), 400);
    assert_eq!(r.headers()["retry-after"], "2");
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["code"], "content_filter", "{v}");
    assert!(v["error"].as_str().is_some_and(|m| m.contains("content management policy")), "{v}");
    assert_eq!(chats(&[&first, &second]), vec![2, 0]);

    // A refusal about the provider itself (its key) still moves on.
    let keyed = cloud_sim(|s| s.api_key = Some("sk-right".into())).await;
    let c = setup(vec![provider("keyed", &keyed), provider("second", &second)]).await;
    stop_all(&c);
    let r = c.chat("llama3.2", false).await;
    assert_eq!((r.status().as_u16(), r.headers()["x-corral-fallback"].clone()), (200, "second".parse().unwrap()));
    assert_eq!(chats(&[&keyed, &second]), vec![1, 1]);
}

#[tokio::test]
async fn a_500_once_is_answered_on_the_retry_and_the_next_provider_sees_nothing() {
    let (first, second) = (cloud_sim(|_| {}).await, cloud_sim(|_| {}).await);
    first.set_faults(Faults::statuses(500, 1));
    let c = setup(vec![provider("first", &first), provider("second", &second)]).await;
    stop_all(&c);
    let (r, took) = timed_chat(&c, None).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-corral-fallback"], "first", "its retry answered");
    assert!(took < Duration::from_secs(2), "one short pause: {took:?}");
    assert_eq!(chats(&[&first, &second]), vec![2, 0]);
}

#[tokio::test]
async fn a_provider_that_fails_twice_is_left_for_the_next_and_when_all_fail_each_is_listed() {
    let (first, second) = (cloud_sim(|_| {}).await, cloud_sim(|_| {}).await);
    let c = setup(vec![provider("first", &first), provider("second", &second)]).await;
    stop_all(&c);

    // A connection broken before the first byte, every time: retried once, then the next.
    first.set_faults(Faults { cut_after: Some(0), ..Faults::default() });
    let r = c.chat("llama3.2", true).await;
    assert_eq!((r.status().as_u16(), r.headers()["x-corral-fallback"].clone()), (200, "second".parse().unwrap()));
    assert_eq!(ndjson(&r.text().await.expect("body")).last().map(|l| l["done"].clone()), Some(json!(true)));
    assert_eq!(chats(&[&first, &second]), vec![2, 1]);

    // Both keep answering 500: each tried twice, both reasons listed.
    first.set_faults(Faults::statuses(500, 10));
    second.set_faults(Faults::statuses(503, 10));
    let (r, took) = timed_chat(&c, None).await;
    assert_eq!(r.status(), 502);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["code"], "cloud_failed");
    let msg = v["error"].as_str().unwrap_or("");
    assert!(msg.contains("first: HTTP 500") && msg.contains("second: HTTP 503"), "{msg}");
    assert!(msg.matches("also on a retry").count() == 2, "{msg}");
    assert!(took < Duration::from_secs(3), "two short pauses: {took:?}");
    assert_eq!(chats(&[&first, &second]), vec![4, 3]);
}

#[tokio::test]
async fn a_fallback_answer_names_the_provider_model_that_answered() {
    let cloud = cloud_sim(|s| s.models.push("qwen-max".into())).await;
    let mut p = provider("cloudsim", &cloud);
    p.model_map.insert("llama3.2".into(), "qwen-max".into());
    let c = setup(vec![p]).await;
    stop_all(&c);

    let v: Value = c.chat("llama3.2", false).await.json().await.expect("json");
    assert_eq!(v["model"], "qwen-max", "/api/chat names the provider's model: {v}");
    let lines = ndjson(&c.chat("llama3.2", true).await.text().await.expect("body"));
    assert!(lines.iter().all(|l| l["model"] == "qwen-max"), "every streamed line: {lines:?}");
    let r = c.post("/api/generate", json!({"model": "llama3.2", "prompt": "hi", "stream": false})).await;
    assert_eq!(r.json::<Value>().await.expect("json")["model"], "qwen-max");
    // `/v1`: the provider's own answer, its `model` untouched.
    let r = c
        .post("/v1/chat/completions", json!({"model": "llama3.2", "messages": [{"role": "user", "content": "x"}]}))
        .await;
    assert_eq!(r.json::<Value>().await.expect("json")["model"], "qwen-max");
    assert!(cloud.received().iter().all(|r| r.model.as_deref() == Some("qwen-max")), "what it was asked for");
}

/// A server that answers everything with `307 Location: <to><path>`: a provider or node that
/// points somewhere else.
async fn redirector(to: String) -> String {
    let app = axum::Router::new().fallback(move |uri: axum::http::Uri| {
        let to = to.clone();
        async move {
            let location = format!("{to}{}", uri.path());
            (axum::http::StatusCode::TEMPORARY_REDIRECT, [(axum::http::header::LOCATION, location)], "")
        }
    });
    common::serve(app).await
}

#[tokio::test]
async fn a_provider_that_redirects_is_a_failure_and_the_prompt_goes_nowhere_else() {
    let elsewhere = cloud_sim(|_| {}).await;
    let bouncer = redirector(elsewhere.url()).await;
    let p = ProviderConfig { base_url: format!("{bouncer}/v1"), ..provider("openai", &elsewhere) };
    let c = setup(vec![p]).await;
    let (_, v) = cloud_failure(&c).await;
    let msg = v["error"].as_str().unwrap_or("");
    assert!(msg.contains("openai: HTTP 307 redirected to ") && msg.contains("not followed"), "{msg}");
    assert_eq!(cloud_calls(&elsewhere), 0, "the prompt never reached where the redirect pointed");
}

#[tokio::test]
async fn an_openai_kind_node_that_redirects_is_answered_as_it_is_never_followed() {
    let elsewhere = cloud_sim(|s| s.models = vec!["llama3.2".into()]).await;
    let bouncer = redirector(elsewhere.url()).await;
    let c = cluster(0)
        .config(move |cfg| {
            cfg.nodes =
                vec![NodeConfig { name: "llama".into(), url: bouncer, kind: NodeKind::Openai, ..NodeConfig::default() }]
        })
        .start()
        .await;
    // A client that does not follow redirects itself, to see what Corral did.
    let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");
    for path in ["/v1/chat/completions", "/api/chat"] {
        let r = client
            .post(c.url(path))
            .header("x-corral-node", "llama")
            .json(&json!({"model": "llama3.2", "stream": false, "messages": [{"role": "user", "content": "private"}]}))
            .send()
            .await
            .expect("answer");
        assert_ne!(r.status(), 200, "{path}: not the answer of the host the redirect named");
    }
    assert_eq!(cloud_calls(&elsewhere), 0, "the prompt never reached where the redirect pointed");
    assert_eq!(elsewhere.count("/v1/models") + elsewhere.count("/health"), 0, "nor did a probe");
}
