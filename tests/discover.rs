//! Discovery on the proxy listener: `GET /.well-known/corral` and `GET /status` answer without
//! a client key, say how the request was classified (`request_origin`, from the listener), and
//! never show a remote caller a node's URL or name or the admin listener.

mod common;

use std::time::Duration;

use common::{cluster, eventually};
use corral::config::{ListenerConfig, Origin};
use serde_json::{json, Value};

fn remote_listener(tweak: impl FnOnce(&mut ListenerConfig)) -> ListenerConfig {
    let mut l = ListenerConfig { addr: "127.0.0.1:0".into(), origin: Origin::Remote, ..ListenerConfig::default() };
    tweak(&mut l);
    l
}

async fn get(c: &common::Cluster, url: String) -> (u16, String) {
    let r = c.client.get(url).send().await.expect("the broker answers");
    (r.status().as_u16(), r.text().await.expect("body"))
}

fn json_of(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// Nothing in `body` names a node: neither its URL (nor its port) nor its name.
fn assert_no_node_in(c: &common::Cluster, body: &str) {
    for sim in &c.sims {
        let url = sim.url();
        let port = url.rsplit(':').next().expect("a port").trim_end_matches('/');
        let hosts = [format!("127.0.0.1:{port}"), format!("localhost:{port}")];
        assert!(!body.contains(&url) && !hosts.iter().any(|h| body.contains(h)), "a node's URL leaked: {body}");
    }
    for node in c.broker.registry().all().iter() {
        assert!(!body.contains(&format!("\"{}\"", node.name())), "node name {} leaked: {body}", node.name());
    }
}

#[tokio::test]
async fn well_known_names_the_service_and_its_urls_as_the_caller_reaches_them() {
    let c = cluster(1).config(|cfg| cfg.listeners.push(remote_listener(|_| {}))).start().await;
    let (status, body) = get(&c, c.url("/.well-known/corral")).await;
    assert_eq!(status, 200, "{body}");
    let v = json_of(&body);
    let proxy = format!("http://{}", c.broker.proxy_addr());
    assert_eq!(v["name"], "corral");
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(v["help_schema"], corral::proxy::discover::HELP_SCHEMA);
    assert_eq!(v["request_origin"], "local");
    assert_eq!(v["urls"]["proxy"], proxy.as_str());
    assert_eq!(v["urls"]["v1"], format!("{proxy}/v1"));
    assert_eq!(v["urls"]["openapi"], format!("{proxy}/openapi.json"));
    let admin = format!("http://{}", c.broker.admin_addr());
    assert_eq!(v["urls"]["admin"], admin.as_str(), "a local caller on loopback can use the admin API");
    assert_eq!(v["urls"]["help"], format!("{admin}/help"));
    let apis: Vec<&str> = v["apis"].as_array().expect("apis").iter().filter_map(Value::as_str).collect();
    assert_eq!(apis, ["ollama", "openai", "openai-responses", "anthropic-messages"]);
    // The URL the caller used, not the bind address: a tunnel's name is what it should use.
    let r = c.client.get(c.url("/.well-known/corral")).header("host", "localhost:9999").send().await.expect("answer");
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["urls"]["v1"], "http://localhost:9999/v1");
    // Through the remote listener: no admin URL at all.
    let (status, body) = get(&c, c.url_on(1, "/.well-known/corral")).await;
    assert_eq!(status, 200, "{body}");
    let v = json_of(&body);
    assert_eq!(v["request_origin"], "remote");
    assert!(v["urls"]["admin"].is_null() && v["urls"]["help"].is_null(), "a remote caller is not told: {v}");
    let admin = c.broker.admin_addr();
    assert!(!body.contains(&admin.to_string()), "the admin listener leaked to a remote caller: {body}");
    assert_no_node_in(&c, &body);
}

#[tokio::test]
async fn status_says_what_could_start_now_and_how_the_request_was_counted() {
    let c = cluster(2)
        .models(0, &["llama3.2"])
        .models(1, &["llama3.2", "qwen2.5"])
        .spec(0, |s| s.ttft = Duration::from_secs(30))
        .config(|cfg| {
            cfg.nodes[0].max_concurrency = 1;
            cfg.listeners.push(remote_listener(|_| {}));
        })
        .start()
        .await;
    c.learn_models().await;
    c.broker.registry().all()[1].set_enabled(false);
    let (status, body) = get(&c, c.url_on(1, "/status")).await;
    assert_eq!(status, 200, "{body}");
    let v = json_of(&body);
    assert_eq!(v["request_origin"], "remote", "counted from the listener that accepted it");
    assert_eq!(v["state"], "accepting");
    assert!(v["snapshot"].as_str().is_some_and(|s| s.contains("not a reservation")), "{v}");
    let model = |v: &Value, name: &str| {
        v["models"].as_array().expect("models").iter().find(|m| m["model"] == name).cloned().unwrap_or(Value::Null)
    };
    let llama = model(&v, "llama3.2:latest");
    assert_eq!(llama["can_start"], true, "n0 is up with a free slot: {v}");
    assert_eq!((llama["nodes"].as_u64(), llama["ready_nodes"].as_u64()), (Some(2), Some(1)), "{llama}");
    assert_eq!(model(&v, "qwen2.5:latest")["can_start"], false, "its only node is disabled: {v}");
    assert_no_node_in(&c, &body);
    // Take n0's only slot: llama3.2 cannot start now, and a queued remote request is counted.
    let chat = json!({"model": "llama3.2", "stream": false, "messages": [{"role": "user", "content": "hi"}]});
    let held = c.client.post(c.url("/api/chat")).json(&chat).send();
    let held = tokio::spawn(held);
    assert!(eventually(Duration::from_secs(5), || c.node(0).in_flight() == 1).await, "the first chat runs");
    let queued = c.client.post(c.url_on(1, "/api/chat")).header("x-corral-queue-timeout", "20000").json(&chat).send();
    let queued = tokio::spawn(queued);
    assert!(eventually(Duration::from_secs(5), || c.broker.queue_depth() == 1).await, "the remote chat waits");
    let v = json_of(&get(&c, c.url("/status")).await.1);
    assert_eq!(v["request_origin"], "local");
    assert_eq!(model(&v, "llama3.2:latest")["can_start"], false, "no free slot: {v}");
    assert_eq!(v["queue"], json!({"local": 0, "remote": 1, "total": 1}));
    // Paused: said so, and nothing can start.
    let r = c.admin(reqwest::Method::PUT, "/admin/accepting").json(&json!({"accepting": false})).send().await;
    assert_eq!(r.expect("answer").status(), 200);
    let v = json_of(&get(&c, c.url("/status")).await.1);
    assert_eq!((v["state"].as_str(), v["accepting"].as_bool()), (Some("paused"), Some(false)));
    held.abort();
    queued.abort();
}

#[tokio::test]
async fn status_needs_no_client_key_but_shows_models_only_with_one() {
    assert!(corral::secrets::use_memory_store(), "tests never touch the real keyring");
    corral::secrets::set_client_key("discover-client", "discover-key-4be1").expect("stored");
    let c = cluster(1)
        .config(|cfg| cfg.listeners.push(remote_listener(|l| l.api_keys = vec!["discover-client".into()])))
        .start()
        .await;
    c.learn_models().await;
    let (status, body) = get(&c, c.url_on(1, "/status")).await;
    assert_eq!(status, 200, "a tunnel can be checked without a key: {body}");
    let v = json_of(&body);
    assert_eq!(v["request_origin"], "remote");
    assert!(v["models"].is_null() && v["models_hidden"].is_string(), "no model list without the key: {v}");
    let (_, body) = get(&c, c.url_on(1, "/.well-known/corral")).await;
    let v = json_of(&body);
    assert!(v["version"].is_null(), "no version without the key, as /api/version: {v}");
    assert_eq!(v["auth"]["client_key"], true);
    let r = c.client.get(c.url_on(1, "/status")).bearer_auth("discover-key-4be1").send().await.expect("answer");
    let v: Value = r.json().await.expect("json");
    assert!(v["models"].as_array().is_some_and(|m| !m.is_empty()), "the key shows the models: {v}");
    // Everything else on the listener still needs the key.
    let (status, _) = get(&c, c.url_on(1, "/api/tags")).await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn ollamas_own_api_status_still_goes_to_a_node() {
    let c = cluster(1).start().await;
    c.learn_models().await;
    let before = c.sims[0].received().iter().filter(|r| r.path == "/api/status").count();
    let r = c.client.get(c.url("/api/status")).send().await.expect("answer");
    let _ = r.text().await;
    let after = c.sims[0].received().iter().filter(|r| r.path == "/api/status").count();
    assert_eq!(after, before + 1, "/api/status is Ollama's route, forwarded to a node");
    // And /status is answered here, never forwarded.
    let _ = get(&c, c.url("/status")).await;
    assert!(c.sims[0].received().iter().all(|r| r.path != "/status"), "Corral's /status reached a node");
}
