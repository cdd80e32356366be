//! The admin API: token on every route, self-description, runtime node and category changes.

mod common;

use common::{cluster, ndjson};
use corral::admin::{Access, ROUTES};
use corral::sim::{SimNode, SimSpec};
use reqwest::Method;
use serde_json::{json, Value};

/// The same table the admin router is built from, over the real listener the broker binds.
#[tokio::test]
async fn every_route_but_healthz_and_the_ui_needs_the_token() {
    let c = cluster(1).start().await;
    let r = c.client.get(c.admin_url("/healthz")).send().await.expect("answer");
    assert_eq!(r.status(), 200);
    for route in ROUTES.iter().filter(|r| r.access == Access::Protected) {
        let (method, path) = (&route.method, concrete(route.path));
        let r = c.client.request(method.clone(), c.admin_url(&path)).send().await.expect("answer");
        assert_eq!(r.status(), 401, "{method} {path} without a token");
        assert_eq!(r.json::<Value>().await.expect("json")["code"], "unauthorized");
        let r = c
            .client
            .request(method.clone(), c.admin_url(&path))
            .bearer_auth("wrong-token")
            .send()
            .await
            .expect("answer");
        assert_eq!(r.status(), 401, "{method} {path} with a wrong token");
    }
    let r = c.client.get(c.admin_url(&format!("/admin/status?token={}", common::TOKEN))).send().await.expect("answer");
    assert_eq!(r.status(), 401, "a token in the URL opens only the event stream");
}

/// A concrete path for a route's pattern: every `{param}` or `{*rest}` segment becomes `x`.
fn concrete(pattern: &str) -> String {
    pattern.split('/').map(|seg| if seg.starts_with('{') { "x" } else { seg }).collect::<Vec<_>>().join("/")
}

#[tokio::test]
async fn help_describes_the_running_config() {
    let c = cluster(2).start().await;
    let help: Value = c.admin(Method::GET, "/help").send().await.expect("answer").json().await.expect("json");
    let config = c.broker.config();
    let cats = help["categories"].as_array().expect("categories");
    assert_eq!(cats.len(), config.categories.len());
    assert_eq!(cats[0]["policy"], config.categories[0].policy.name());
    assert_eq!(help["limits"]["max_body_bytes"], config.proxy.max_body_bytes);
    assert_eq!(help["queue"]["max_requests"], config.queue.max_requests);
    assert_eq!(help["nodes"].as_array().map(Vec::len), Some(2));
    assert!(help["request_headers"]["X-Corral-Category"].is_string());
    assert_eq!(help["help_schema"], corral::proxy::discover::HELP_SCHEMA, "its own schema version");
    assert_ne!(help["help_schema"], help["version"], "the schema version is not Corral's version");
    assert_eq!(help["openapi"], "/openapi.json", "/help links the OpenAPI document");
    let restart: Vec<&str> = help["config_reload"]["restart_keys"]
        .as_array()
        .expect("restart keys")
        .iter()
        .filter_map(|k| k["key"].as_str())
        .collect();
    let expected: Vec<&str> = corral::state::RESTART_KEYS.iter().map(|(k, _)| *k).collect();
    assert_eq!(restart, expected, "/help names exactly the keys that wait for a restart");
    let proxy = help["proxy"]["endpoints"].as_array().expect("proxy endpoints");
    assert_eq!(proxy.len(), corral::proxy::routes::ROUTES.len(), "every proxy route, from the table it dispatches by");
    assert!(proxy.iter().any(|e| e.as_str().is_some_and(|e| e.starts_with("POST /v1/messages: "))));
    let endpoints = help["admin"]["endpoints"].as_array().expect("endpoints");
    assert_eq!(endpoints.len(), corral::admin::ROUTES.len(), "every admin route, from the one table");
    assert!(endpoints.iter().any(|e| e == "POST /admin/providers/{name}/test"));
    // It follows runtime changes.
    let r = c
        .admin(Method::PUT, "/admin/categories/default")
        .json(&json!({"policy": "p2c", "priority": 3}))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), 200);
    let help: Value = c.admin(Method::GET, "/help").send().await.expect("answer").json().await.expect("json");
    assert_eq!(help["categories"][0]["policy"], "p2c");
    assert_eq!(help["categories"][0]["priority"], 3);
    // The scheduling rules a client meets, per category, and what it may infer.
    let r = c
        .admin(Method::PUT, "/admin/categories/default")
        .json(&json!({"first_token_timeout_ms": 800, "wait_for_warm": true}))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let help: Value = c.admin(Method::GET, "/help").send().await.expect("answer").json().await.expect("json");
    let sched = &help["categories"][0]["scheduling"];
    assert!(sched["first_token_deadline"].as_str().is_some_and(|d| d.starts_with("800 ms")), "{sched}");
    assert!(
        sched["candidate_order"].as_str().is_some_and(|o| o.contains("loaded but busy (waits for it) > not loaded")),
        "{sched}"
    );
    assert!(sched["slow_nodes"].as_str().is_some_and(|t| t.contains("3 times in a row")), "{sched}");
    let infer = &help["what_a_client_may_infer"];
    assert!(infer["status_is_a_snapshot"].as_str().is_some_and(|t| t.contains("not a reservation")), "{infer}");
    assert_eq!(infer["read_ahead"]["per_stream_bytes"], config.proxy.stream_buffer_bytes);
}

#[tokio::test]
async fn status_says_when_no_node_can_take_a_request() {
    let c = cluster(2).start().await;
    c.learn_models().await;
    let capacity = || async {
        let v: Value = c.admin(Method::GET, "/admin/status").send().await.expect("status").json().await.expect("json");
        v["capacity"].clone()
    };
    let up = capacity().await;
    assert_eq!((up["serving_nodes"].as_u64(), up["none"].as_bool()), (Some(2), Some(false)), "{up}");
    for n in ["n0", "n1"] {
        let r = c
            .admin(Method::PATCH, &format!("/admin/nodes/{n}"))
            .json(&json!({"enabled": false}))
            .send()
            .await
            .expect("patch");
        assert_eq!(r.status(), 200);
    }
    let none = capacity().await;
    assert_eq!(
        (none["serving_nodes"].as_u64(), none["slots"].as_u64(), none["none"].as_bool()),
        (Some(0), Some(0), Some(true)),
        "{none}"
    );
}

#[tokio::test]
async fn nodes_can_be_added_changed_and_removed_at_runtime() {
    let c = cluster(1).start().await;
    c.learn_models().await;
    let extra =
        SimNode::start(SimSpec { models: vec!["phi4:latest".into()], ..SimSpec::default() }).await.expect("sim");
    let r = c
        .admin(Method::POST, "/admin/nodes")
        .json(&json!({"name": "extra", "url": extra.url()}))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), 201, "{:?}", r.text().await);
    let r = c.post("/api/generate", json!({"model": "phi4", "prompt": "x", "stream": false})).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-corral-node"], "extra", "the new node serves at once");

    let r = c
        .admin(Method::POST, "/admin/nodes")
        .json(&json!({"name": "extra", "url": extra.url()}))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), 409);
    let r = c
        .admin(Method::POST, "/admin/nodes")
        .json(&json!({"name": "Bad Name", "url": "nope"}))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["code"], "invalid_config");
    assert!(v["problems"].as_array().is_some_and(|p| p.len() >= 2), "every problem listed: {v}");
    let r = c.admin(Method::POST, "/admin/nodes").body("{not json").send().await.expect("answer");
    assert_eq!(r.json::<Value>().await.expect("json")["code"], "malformed_json");

    let r = c
        .admin(Method::PATCH, "/admin/nodes/extra")
        .json(&json!({"weight": 5, "max_concurrency": 7}))
        .send()
        .await
        .expect("answer");
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["weight"], 5);
    assert_eq!(v["max_concurrency"], 7);
    let r = c.admin(Method::PATCH, "/admin/nodes/extra").json(&json!({"wieght": 5})).send().await.expect("answer");
    assert_eq!(r.status(), 400, "unknown fields are refused");
    let r = c.admin(Method::PATCH, "/admin/nodes/extra").json(&json!({"enabled": false})).send().await.expect("answer");
    assert_eq!(r.json::<Value>().await.expect("json")["state"], "disabled");
    let r = c.post("/api/generate", json!({"model": "phi4", "prompt": "x", "stream": false})).await;
    assert_eq!(r.status(), 503, "a disabled node takes nothing");
    c.admin(Method::PATCH, "/admin/nodes/extra").json(&json!({"enabled": true})).send().await.expect("answer");

    // Removing a node with a stream in flight: the stream still finishes.
    extra.update_faults(|f| f.token_delay_ms = Some(10));
    let stream = c.post("/api/generate", json!({"model": "phi4", "prompt": "long"})).await;
    let r = c.admin(Method::DELETE, "/admin/nodes/extra").send().await.expect("answer");
    assert_eq!(r.status(), 204);
    let lines = ndjson(&stream.text().await.expect("body"));
    assert_eq!(lines.last().map(|l| l["done"].clone()), Some(json!(true)), "in-flight request finished");
    let r = c.post("/api/generate", json!({"model": "phi4", "prompt": "x", "stream": false})).await;
    assert_eq!(r.status(), 404, "the model left with its node");
    let r = c.admin(Method::DELETE, "/admin/nodes/extra").send().await.expect("answer");
    assert_eq!(r.status(), 404);
}

#[tokio::test]
async fn status_and_export_reflect_the_cluster() {
    let c = cluster(2).start().await;
    let _ = c.chat("llama3.2", false).await;
    let v: Value = c.admin(Method::GET, "/admin/status").send().await.expect("answer").json().await.expect("json");
    let nodes = v["nodes"].as_array().expect("nodes");
    assert_eq!(nodes.len(), 2);
    assert!(nodes.iter().all(|n| n["breaker"] == "closed" && n["state"].is_string()));
    assert_eq!(nodes.iter().map(|n| n["served"].as_u64().unwrap_or(0)).sum::<u64>(), 1);
    let text = c.admin(Method::GET, "/admin/config/export").send().await.expect("answer").text().await.expect("text");
    let parsed = corral::Config::parse(&text).expect("the export is a valid config");
    assert_eq!(parsed.nodes.len(), 2);
}

#[tokio::test]
async fn the_event_stream_tells_what_changed() {
    use futures_util::StreamExt;
    let c = cluster(2).start().await;
    let r = c.client.get(c.admin_url(&format!("/admin/events?token={}", common::TOKEN))).send().await.expect("sse");
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"].to_str().unwrap_or("").starts_with("text/event-stream"));
    let mut body = r.bytes_stream();
    assert_eq!(c.chat("llama3.2", false).await.status(), 200);
    let patched =
        c.admin(Method::PATCH, "/admin/nodes/n1").json(&json!({"draining": true})).send().await.expect("admin");
    assert_eq!(patched.status(), 200);
    let mut text = String::new();
    let read = async {
        while let Some(Ok(chunk)) = body.next().await {
            text.push_str(&String::from_utf8_lossy(&chunk));
            if text.contains("event: request") && text.contains("\"to\":\"draining\"") {
                break;
            }
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), read).await.expect("both events arrive");
    assert!(text.contains("\"to\":\"draining\""), "{text}");
    assert!(text.contains("\"status\":\"ok\""), "{text}");
}

#[tokio::test]
async fn a_config_import_previews_then_applies() {
    let c = cluster(1).start().await;
    let extra = SimNode::start(SimSpec::default()).await.expect("sim");
    let file = format!("[[nodes]]\nname = \"shared\"\nurl = \"{}\"\n", extra.url());
    let r = c
        .admin(Method::POST, "/admin/config/import?mode=merge&dry_run=true")
        .body(file.clone())
        .send()
        .await
        .expect("answer");
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["changes"][0]["name"], "shared");
    assert_eq!(v["changes"][0]["action"], "added");
    assert_eq!(v["trust"][0]["id"], "node:shared:added", "a new node would receive prompts: {v}");
    assert_eq!(c.broker.registry().all().len(), 1, "a dry run changes nothing");
    let r = c.admin(Method::POST, "/admin/config/import?mode=merge").body(file.clone()).send().await.expect("answer");
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.expect("json")["held_back"][0], "node:shared:added");
    assert_eq!(c.broker.registry().all().len(), 1, "held back until a person accepts it");
    let r = c
        .admin(Method::POST, "/admin/config/import?mode=merge&accept=node:shared:added")
        .body(file)
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), 200);
    assert_eq!(c.broker.registry().all().len(), 2);
    let r = c.admin(Method::POST, "/admin/config/import").body("[[nodes]\nbroken").send().await.expect("answer");
    assert_eq!(r.status(), 400);
    assert_eq!(r.json::<Value>().await.expect("json")["code"], "invalid_config");
    assert_eq!(c.broker.registry().all().len(), 2, "a broken import keeps the running config");
    // Oversized files are refused in words, in JSON, whichever limit they pass.
    for (size, says) in [(1_500_000, "a config is at most 1048576"), (3_000_000, "length limit exceeded")] {
        let huge = format!("# {}\n", "x".repeat(size));
        let r = c.admin(Method::POST, "/admin/config/import?dry_run=true").body(huge).send().await.expect("answer");
        assert_eq!(r.status(), 400, "{size} bytes");
        let v: Value = r.json().await.expect("a JSON refusal");
        assert_eq!(v["code"], "invalid_config");
        assert!(v["error"].as_str().is_some_and(|m| m.contains(says)), "{size} bytes: {v}");
    }
}
