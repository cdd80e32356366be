//! Node state with its reason and time, as `/admin/status`, the latency test and the store's
//! node events tell it; and what a dead node last reported, marked last-known. Probes are
//! driven explicitly (`health::probe_all`), never waited for.

mod common;

use std::time::Duration;

use common::cluster;
use corral::config::HealthConfig;
use corral::sim::Faults;
use serde_json::Value;

fn health() -> HealthConfig {
    HealthConfig { timeout_ms: 500, failures_to_down: 1, successes_to_up: 1, ..HealthConfig::default() }
}

async fn probe(c: &common::Cluster) {
    corral::health::probe_all(c.broker.registry(), &c.client, &health()).await;
}

async fn status_of(c: &common::Cluster, node: &str) -> Value {
    let status: Value =
        c.admin(reqwest::Method::GET, "/admin/status").send().await.expect("status").json().await.expect("json");
    status["nodes"].as_array().expect("nodes").iter().find(|n| n["name"] == node).cloned().expect("the node is listed")
}

#[tokio::test]
async fn a_down_node_says_why_since_when_and_what_it_last_reported() {
    let c = cluster(2).start().await;
    probe(&c).await;
    assert_eq!(c.chat("llama3.2", false).await.status(), 200);
    assert_eq!(c.chat("llama3.2", false).await.status(), 200);
    c.learn_models().await;
    let up = status_of(&c, "n0").await;
    assert_eq!(up["state"], "healthy");
    assert_eq!(up["state_reason"], "first probe answered");
    assert_eq!(up["stale"], false, "a healthy node's data is live");
    assert!(up["loaded"].as_array().is_some_and(|l| !l.is_empty()), "the chat loaded a model: {up}");

    let before = corral::store::now_ms();
    c.sims[0].stop();
    probe(&c).await;
    let down = status_of(&c, "n0").await;
    let url = c.sims[0].url();
    assert_eq!(down["state"], "unhealthy");
    // The start-up probe round runs on its own thread and may count a failure too: "... (2
    // probes in a row)". The cause and where come first either way.
    let reason = down["state_reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with(&format!("connection refused at {url}")), "the concrete cause and where: {down}");
    let since = down["state_since"].as_i64().expect("since is unix ms");
    assert!(since >= before && since <= corral::store::now_ms(), "since when it went down: {since} vs {before}");
    assert!(down["state_for_ms"].as_i64().is_some_and(|ms| ms >= 0), "{down}");

    assert_eq!(down["stale"], true, "a dead node's models and first token are last-known");
    assert_eq!(down["loaded"], up["loaded"], "what it last reported is kept");
    let loaded_at = down["loaded_as_of"].as_i64().expect("loaded_as_of");
    assert!(loaded_at < since, "learned before it went down");
    assert!(down["ttfb_ms"].as_f64().is_some(), "{down}");
    assert_eq!(down["ttfb_ms"], up["ttfb_ms"], "the first-token estimate does not fade while nothing flows");
    assert!(down["ttfb_as_of"].as_i64().is_some_and(|t| t <= before), "{down}");

    probe(&c).await;
    let still = status_of(&c, "n0").await;
    assert_eq!(still["state_since"], down["state_since"], "a second failed probe keeps since when");
    c.broker.shutdown().await;
}

#[tokio::test]
async fn an_http_error_is_told_with_its_status_and_body_and_the_latency_test_says_why() {
    let c = cluster(2).start().await;
    probe(&c).await;
    c.sims[1].update_faults(|f| f.fail_probes = true);
    probe(&c).await;
    let n1 = status_of(&c, "n1").await;
    let url = c.sims[1].url();
    assert_eq!(n1["state"], "unhealthy");
    let reason = n1["state_reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with(&format!("HTTP 500 at {url}: simulated probe failure")), "{n1}");

    let test: Value =
        c.admin(reqwest::Method::POST, "/admin/nodes/n1/test").send().await.expect("test").json().await.expect("json");
    assert_eq!(test["ok"], false);
    assert_eq!(test["error"], format!("HTTP 500 at {url}: simulated probe failure"), "a failed test says why");
    c.sims[0].stop();
    let test: Value =
        c.admin(reqwest::Method::POST, "/admin/nodes/n0/test").send().await.expect("test").json().await.expect("json");
    assert_eq!(test["error"], format!("connection refused at {}", c.sims[0].url()));

    c.sims[1].set_faults(Faults::default());
    probe(&c).await;
    let back = status_of(&c, "n1").await;
    assert_eq!(back["state_reason"], "probes answered again");
    assert_eq!(back["stale"], false);
    c.broker.shutdown().await;
}

#[tokio::test]
async fn the_operator_is_named_as_the_reason_and_a_disabled_down_node_stays_down_since_then() {
    let c = cluster(2).start().await;
    probe(&c).await;
    c.sims[0].stop();
    probe(&c).await;
    let down = status_of(&c, "n0").await;
    let patch = |body: Value| c.admin(reqwest::Method::PATCH, "/admin/nodes/n0").json(&body).send();
    assert!(patch(serde_json::json!({ "enabled": false })).await.expect("patch").status().is_success());
    let off = status_of(&c, "n0").await;
    assert_eq!(
        (off["state"].as_str(), off["state_reason"].as_str()),
        (Some("disabled"), Some("disabled by an operator"))
    );
    assert!(patch(serde_json::json!({ "enabled": true })).await.expect("patch").status().is_success());
    let on = status_of(&c, "n0").await;
    assert_eq!(on["state"], "unhealthy");
    // A probe may land between the two reads (re-enabling probes the node): the cause and
    // the since stay, only the "(N probes in a row)" count may have grown.
    let cause = |v: &Value| {
        let reason = v["state_reason"].as_str().unwrap_or_default().to_string();
        reason.split(" (").next().unwrap_or_default().to_string()
    };
    assert_eq!(
        (cause(&on), &on["state_since"]),
        (cause(&down), &down["state_since"]),
        "re-enabled, it is down for the same reason, since the same time"
    );
    c.broker.shutdown().await;
}

#[tokio::test]
async fn the_store_records_each_change_with_its_concrete_reason() {
    let c = cluster(2).start().await;
    let store = c.broker.shared().telemetry.store().expect("store on").clone();
    probe(&c).await;
    c.sims[1].stop();
    probe(&c).await;
    let want = format!("connection refused at {}", c.sims[1].url());
    // The writer task batches; read until the row is there (bounded).
    let mut events = Vec::new();
    for _ in 0..500 {
        events = store.node_events(0).await.expect("query");
        if events.iter().any(|e| e.node == "n1" && e.to_state == "unhealthy") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let down = events.iter().find(|e| e.node == "n1" && e.to_state == "unhealthy").expect("the change was recorded");
    // The background probes may have failed on it too: "... (2 probes in a row)".
    assert!(down.reason.starts_with(&want), "{events:?}");
    assert_eq!(down.from_state, "healthy");
    c.broker.shutdown().await;
}
