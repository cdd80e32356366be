//! The errors a person meets in the first minutes, each as the client sees it (status, code,
//! the sentence), as the request store records it, and as `corral models` prints it: a mistyped
//! model while a node is down, every node down under the merged lists, a pull onto a node that
//! is down, and a node name that does not exist.

mod common;

use std::time::Duration;

use common::process::BIN;
use common::{cluster, ndjson, Cluster};
use corral::config::ProviderConfig;
use corral::sim::SimNode;
use corral::store::{Query, RequestRow};
use serde_json::{json, Value};

/// Stop `sim` and wait until its port refuses connections (the listener closes on the
/// runtime's next turn after `stop`).
async fn stopped(sim: &SimNode) {
    sim.stop();
    for _ in 0..1000 {
        if tokio::net::TcpStream::connect(sim.addr()).await.is_err() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("the sim at {} still accepts connections after stop", sim.addr());
}

/// The stored record of the request with Corral id `id`, once its writer has flushed it.
async fn record(c: &Cluster, id: &str) -> RequestRow {
    let store = c.broker.shared().telemetry.store().expect("store on").clone();
    for _ in 0..500 {
        let rows = store.requests(&Query::default()).await.expect("query");
        if let Some(r) = rows.into_iter().find(|r| r.id == id && r.status != "running") {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no finished record of request {id}");
}

fn request_id(r: &reqwest::Response) -> String {
    r.headers()["x-corral-request-id"].to_str().expect("ascii").to_string()
}

/// `corral <args>` against the cluster, off the runtime (the broker serves it meanwhile):
/// (exit code, stdout, stderr).
async fn corral(args: Vec<String>) -> (i32, String, String) {
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new(BIN).args(&args).env("NO_COLOR", "1").output().expect("corral runs");
        let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
        (out.status.code().unwrap_or(-1), text(out.stdout), text(out.stderr))
    })
    .await
    .expect("the CLI ran")
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn a_mistyped_model_while_a_node_is_down_is_404_with_did_you_mean() {
    // A provider is configured, but `default` never falls back: before, this gave 503
    // cloud_not_allowed about a cloud that had nothing to do with the typo.
    let c = cluster(3)
        .models(0, &["llama3.2:latest"])
        .models(1, &["llama3.2:latest"])
        .models(2, &["llama3.2:latest", "qwen2.5:7b"])
        .config(|cfg| {
            cfg.providers.push(ProviderConfig {
                name: "cloud".into(),
                base_url: "http://127.0.0.1:9/v1".into(),
                ..ProviderConfig::default()
            })
        })
        .start()
        .await;
    // n1 went down before it ever listed its models; n2 listed them, then went down.
    stopped(&c.sims[1]).await;
    c.node(1).record_probe(false, 1, 1);
    c.learn_models().await;
    stopped(&c.sims[2]).await;
    c.node(2).record_probe(false, 1, 1);
    assert_eq!(c.node(1).models(), None, "n1 never listed its models");

    let r = c.chat("llama3.3", false).await;
    let id = request_id(&r);
    assert_eq!(r.status(), 404, "a typo is not a health problem");
    assert_eq!(r.headers()["x-corral-forwarded"], "false");
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["code"], "model_not_found", "{v}");
    assert_eq!(v["did_you_mean"], json!(["llama3.2"]), "{v}");
    let said = v["error"].as_str().expect("a sentence");
    assert!(said.starts_with("model 'llama3.3' not found"), "Ollama's own words first: {said}");
    assert!(said.contains("did you mean llama3.2?"), "{said}");
    assert!(said.contains("n1 is down and has not listed its models yet"), "the blind spot is named: {said}");
    assert!(!said.contains("cloud"), "no cloud wording for a typo: {said}");
    let row = record(&c, &id).await;
    assert_eq!((row.status.as_str(), row.error_code.as_deref()), ("client_error", Some("model_not_found")));

    // A model only the down n2 lists: that one is a health problem, and says which model (with
    // a provider configured, as the never-category's refusal, which gives the local reason).
    let r = c.chat("qwen2.5:7b", false).await;
    assert_eq!(r.status(), 503);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["code"], "cloud_not_allowed", "{v}");
    assert!(v["error"].as_str().is_some_and(|e| e.contains("no healthy node can serve model \"qwen2.5:7b\"")), "{v}");

    // Another tag of a listed model (n2's list counts while it is down).
    let r = c.chat("qwen2.5", false).await;
    assert_eq!(r.status(), 404);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["did_you_mean"], json!(["qwen2.5:7b"]), "{v}");
}

#[tokio::test]
async fn with_every_node_down_the_model_lists_say_so_and_corral_models_too() {
    let c = cluster(2).start().await;
    c.learn_models().await;
    for i in 0..2 {
        stopped(&c.sims[i]).await;
        c.node(i).record_probe(false, 1, 1);
    }
    for path in ["/api/tags", "/api/ps", "/v1/models"] {
        let r = c.client.get(c.url(path)).send().await.expect("answer");
        let id = request_id(&r);
        assert_eq!(r.status(), 503, "{path}: not an empty list that reads as 'no models'");
        assert_eq!(r.headers()["x-corral-forwarded"], "false");
        assert!(r.headers().contains_key("retry-after"), "{path}: worth asking again");
        let v: Value = r.json().await.expect("json");
        assert_eq!(v["code"], "no_node_up", "{path}: {v}");
        assert_eq!(
            v["error"],
            format!("no node is up to answer {path}: n0 is down, n1 is down; try again when one is back"),
            "{path}"
        );
        let row = record(&c, &id).await;
        assert_eq!((row.status.as_str(), row.error_code.as_deref()), ("error", Some("no_node_up")), "{path}");
    }
    // The model the down nodes list is a health problem; a typo of it is still a typo.
    let r = c.chat("llama3.2", false).await;
    assert_eq!(r.status(), 503);
    let v: Value = r.json().await.expect("json");
    assert_eq!(
        (v["code"].as_str(), v["error"].as_str()),
        (Some("no_healthy_node"), Some("no healthy node can serve model \"llama3.2\" right now"))
    );
    let r = c.chat("llama3.3", false).await;
    assert_eq!(r.status(), 404);
    assert_eq!(r.json::<Value>().await.expect("json")["did_you_mean"], json!(["llama3.2"]));

    let (code, out, err) = corral(args(&["models", "--url", &c.url("")])).await;
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("Corral is running, but no node is up"), "{err}");
    assert!(err.contains("n0 is down, n1 is down"), "{err}");
    assert!(!err.contains("is Corral running?"), "it is, and it answered: {err}");
}

#[tokio::test]
async fn a_merged_list_names_the_nodes_it_lacks() {
    let c = cluster(2).models(0, &["llama3.2:latest"]).models(1, &["qwen2.5:7b"]).start().await;
    c.learn_models().await;
    stopped(&c.sims[1]).await;
    c.node(1).record_probe(false, 1, 1);
    let r = c.client.get(c.url("/api/tags")).send().await.expect("answer");
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-corral-missing-nodes"], "n1", "the list lacks n1's models, and says so");
    let (code, out, err) = corral(args(&["models", "--url", &c.url("")])).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("llama3.2") && out.contains("n0"), "{out}");
    assert!(err.contains("not listed: the models of n1"), "{err}");
}

#[tokio::test]
async fn a_pull_onto_a_dead_node_names_it_and_is_recorded_as_failed() {
    let c = cluster(2).start().await;
    stopped(&c.sims[1]).await;
    let pull = |nodes: &'static str| {
        c.client.post(c.url("/api/pull")).header("x-corral-node", nodes).json(&json!({"model": "qwen3:4b"})).send()
    };

    // Nothing was done anywhere: no 200, and the sentence names the node and why.
    let r = pull("n1").await.expect("answer");
    let id = request_id(&r);
    assert_eq!(r.status(), 503, "nothing was pulled: not a 200 with an error inside");
    assert_eq!(r.headers()["x-corral-forwarded"], "false");
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["code"], "no_node_reachable", "{v}");
    assert_eq!(v["error"], "pull failed on 1 of 1 nodes: node n1 is down: connection refused", "{v}");
    let row = record(&c, &id).await;
    assert_eq!((row.status.as_str(), row.error_code.as_deref()), ("error", Some("no_node_reachable")), "{row:?}");
    assert_eq!(row.failed_attempts.len(), 1, "{row:?}");
    assert_eq!(
        (row.failed_attempts[0].node.as_str(), row.failed_attempts[0].outcome.as_str()),
        ("n1", "connect_failed")
    );

    // One node pulls, the other is down: the stream runs, ends in one error naming n1, and the
    // record says the operation failed.
    let r = pull("n0,n1").await.expect("answer");
    let id = request_id(&r);
    assert_eq!(r.status(), 200, "n0 is at work");
    let lines = ndjson(&r.text().await.expect("body"));
    let last = lines.last().expect("a final line");
    assert_eq!(last["error"], "pull failed on 1 of 2 nodes: node n1 is down: connection refused", "{lines:?}");
    assert!(lines.iter().any(|l| l["status"] == "node n1 is down: connection refused"), "{lines:?}");
    let row = record(&c, &id).await;
    assert_eq!((row.status.as_str(), row.error_code.as_deref()), ("error", Some("upstream_failed")), "{row:?}");
    assert_eq!(row.node.as_deref(), Some("n0"), "the node that did pull");
    assert!(c.sims[0].models().contains(&"qwen3:4b".to_string()));

    // The admin API's pull (the UI's) and `corral models pull` say the same, and are recorded.
    let r = c
        .admin(reqwest::Method::POST, "/admin/models/pull")
        .json(&json!({"name": "qwen3:4b", "nodes": ["n1"]}))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), 503);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["error"], "pull failed on 1 of 1 nodes: node n1 is down: connection refused", "{v}");
    let store = c.broker.shared().telemetry.store().expect("store on").clone();
    let mut admin_row = None;
    for _ in 0..500 {
        let rows = store.requests(&Query::default()).await.expect("query");
        admin_row = rows.into_iter().find(|r| r.origin == "admin" && r.status != "running");
        if admin_row.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let admin_row = admin_row.expect("the admin pull is recorded");
    assert_eq!((admin_row.endpoint.as_str(), admin_row.status.as_str()), ("/api/pull", "error"), "{admin_row:?}");
    let (code, out, err) = corral(args(&["models", "--url", &c.url(""), "pull", "qwen3:4b", "--nodes", "n1"])).await;
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("node n1 is down: connection refused"), "{err}");
}

#[tokio::test]
async fn an_unknown_node_name_is_400_naming_the_nodes_there_are() {
    let c = cluster(2).start().await;
    let r = c
        .client
        .post(c.url("/api/pull"))
        .header("x-corral-node", "n0,gpu9")
        .json(&json!({"model": "qwen3:4b"}))
        .send()
        .await
        .expect("answer");
    let id = request_id(&r);
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["code"], "unknown_node", "{v}");
    assert_eq!(v["error"], "no node named \"gpu9\"; nodes: n0, n1", "{v}");
    let row = record(&c, &id).await;
    assert_eq!((row.status.as_str(), row.error_code.as_deref()), ("client_error", Some("unknown_node")));
    assert!(!c.sims[0].models().contains(&"qwen3:4b".to_string()), "refused before anything started");
    // A long name is told back cut short, not echoed whole.
    let long = "x".repeat(5000);
    let r = c
        .client
        .post(c.url("/api/pull"))
        .header("x-corral-node", &long)
        .json(&json!({"model": "qwen3:4b"}))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.expect("json");
    let said = v["error"].as_str().unwrap_or_default();
    assert!(said.contains(&"x".repeat(64)) && !said.contains(&"x".repeat(65)), "{said:.200}");

    let r = c
        .admin(reqwest::Method::POST, "/admin/models/pull")
        .json(&json!({"name": "qwen3:4b", "nodes": ["gpu9"]}))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), 400);
    assert_eq!(r.json::<Value>().await.expect("json")["error"], "no node named \"gpu9\"; nodes: n0, n1");

    let (code, out, err) = corral(args(&["models", "--url", &c.url(""), "pull", "qwen3:4b", "--nodes", "gpu9"])).await;
    assert_eq!(code, 2, "a usage error: {out}{err}");
    assert!(err.contains("no node named \"gpu9\"; nodes: n0, n1"), "{err}");
    assert!(!err.contains("invalid header"), "{err}");
}
