//! `POST /admin/drill` against simulated nodes on loopback: the node taken out serves none of
//! the batch, the others serve all of it, the node is put back afterwards (and serves again),
//! and every refusal has its code.

mod common;

use std::time::Duration;

use common::{cluster, eventually};
use corral::config::{NodeConfig, Policy};
use corral::node::Admin;
use reqwest::Method;
use serde_json::{json, Value};

async fn drill(c: &common::Cluster, body: Value) -> (u16, Value) {
    let r = c.admin(Method::POST, "/admin/drill").json(&body).send().await.expect("admin answers");
    let status = r.status().as_u16();
    (status, r.json().await.expect("a JSON answer"))
}

fn served_by(v: &Value) -> Vec<String> {
    let results = v["results"].as_array().expect("results");
    results.iter().map(|r| r["served_by"].as_str().unwrap_or("-").to_string()).collect()
}

#[tokio::test]
async fn a_drained_node_serves_none_of_the_batch_and_serves_again_after() {
    let c = cluster(2).policy(Policy::RoundRobin).start().await;
    c.learn_models().await;
    let (status, v) = drill(&c, json!({ "node": "n0", "requests": 6 })).await;
    assert_eq!(status, 200, "the drill ran: {v}");
    assert_eq!(v["node"], "n0");
    assert_eq!(v["taken_out"], "drain");
    assert_eq!(c.sims[0].inference_count(), 0, "the drained node got none of the batch");
    assert_eq!(served_by(&v), vec!["n1"; 6], "the other node served every request: {v}");
    let default = &v["per_category"][0];
    assert_eq!((default["category"].as_str(), default["sent"].as_u64()), (Some("default"), Some(6)), "{v}");
    assert_eq!(default["served"], 6, "{v}");
    assert_eq!(default["by"], json!({ "n1": 6 }), "{v}");
    assert!(default["p50_ms"].as_f64().is_some_and(|p| p <= default["max_ms"].as_f64().unwrap_or(0.0)), "{v}");
    assert_eq!(default["errors"], json!([]), "{v}");
    assert!(v["note"].is_null(), "another node served, so nothing to warn about: {v}");

    assert_eq!(c.node(0).admin(), Admin::Active, "the node is put back after the drill");
    let mut by = Vec::new();
    for _ in 0..4 {
        let r = c.chat("llama3.2", false).await;
        assert_eq!(r.status(), 200);
        by.push(r.headers()["x-corral-node"].to_str().unwrap_or_default().to_string());
    }
    assert!(by.iter().any(|n| n == "n0"), "round-robin reaches the restored node again: {by:?}");
    assert!(c.sims[0].inference_count() > 0, "the restored node serves again");
}

#[tokio::test]
async fn unknown_names_bad_counts_and_no_token_are_refused_with_their_codes() {
    let c = cluster(2).start().await;
    c.learn_models().await;
    for (body, want, code) in [
        (json!({ "node": "nope" }), 404, "not_found"),
        (json!({ "category": "nope" }), 404, "not_found"),
        (json!({ "requests": 0 }), 400, "malformed_json"),
        (json!({ "requests": 21 }), 400, "malformed_json"),
        (json!({ "take_out": "unplug" }), 400, "malformed_json"),
        (json!({ "nodes": "n0" }), 400, "malformed_json"),
    ] {
        let (status, v) = drill(&c, body.clone()).await;
        assert_eq!((status, v["code"].as_str()), (want, Some(code)), "{body} -> {v}");
    }
    let (_, v) = drill(&c, json!({ "node": "nope" })).await;
    assert!(v["error"].as_str().is_some_and(|e| e.contains("nope")), "the sentence names the node: {v}");
    let r = c.client.post(c.admin_url("/admin/drill")).json(&json!({})).send().await.expect("answer");
    assert_eq!(r.status(), 401, "a drill needs the admin token like every admin route");
    assert!(c.broker.registry().all().iter().all(|n| n.admin() == Admin::Active), "a refused drill takes nothing out");
    assert_eq!(c.inference_counts(), vec![0, 0], "a refused drill sends nothing");
}

#[tokio::test]
async fn a_node_already_out_or_no_serving_node_is_refused() {
    let c = cluster(2).start().await;
    c.node(1).set_admin(Admin::Draining);
    let (status, v) = drill(&c, json!({ "node": "n1" })).await;
    assert_eq!((status, v["code"].as_str()), (409, Some("drill_node_out")), "{v}");
    assert_eq!(c.node(1).admin(), Admin::Draining, "a node drained by the operator stays drained");
    c.node(0).set_admin(Admin::Draining);
    let (status, v) = drill(&c, json!({})).await;
    assert_eq!((status, v["code"].as_str()), (409, Some("drill_no_node")), "{v}");
}

#[tokio::test]
async fn the_only_node_drilled_shows_what_clients_see_with_no_node() {
    let c = cluster(1).start().await;
    c.learn_models().await;
    let (status, v) = drill(&c, json!({ "requests": 2 })).await;
    assert_eq!(status, 200, "the drill runs with one node: what clients see then is the finding: {v}");
    assert_eq!(v["node"], "n0", "the one serving node is picked");
    assert!(v["note"].as_str().is_some_and(|n| n.contains("only serving node")), "the answer says so: {v}");
    let default = &v["per_category"][0];
    assert_eq!((default["sent"].as_u64(), default["served"].as_u64()), (Some(2), Some(0)), "{v}");
    for r in v["results"].as_array().expect("results") {
        assert_eq!(r["status"], 503, "nothing can serve while the only node is out: {r}");
        assert!(r["code"].as_str().is_some_and(|c| !c.is_empty()), "each failure has Corral's code: {r}");
    }
    assert_eq!(c.sims[0].inference_count(), 0);
    assert_eq!(c.node(0).admin(), Admin::Active, "put back");
    assert_eq!(c.chat("llama3.2", false).await.status(), 200, "and serving again");
}

#[tokio::test]
async fn a_second_drill_while_one_runs_is_refused_and_the_next_may_start_after() {
    let slow = |s: &mut corral::sim::SimSpec| s.ttft = Duration::from_millis(800);
    let c = cluster(2).spec(0, slow).spec(1, slow).start().await;
    c.learn_models().await;
    let first = drill(&c, json!({ "node": "n0", "requests": 1 }));
    let second = async {
        let running = eventually(Duration::from_secs(5), || c.node(0).admin() == Admin::Draining).await;
        assert!(running, "the first drill takes n0 out");
        drill(&c, json!({ "node": "n1" })).await
    };
    let ((s1, v1), (s2, v2)) = tokio::join!(first, second);
    assert_eq!(s1, 200, "{v1}");
    assert_eq!((s2, v2["code"].as_str()), (409, Some("drill_running")), "{v2}");
    assert_eq!(c.node(1).admin(), Admin::Active, "the refused drill took nothing out");
    let (s3, v3) = drill(&c, json!({ "node": "n1", "requests": 1 })).await;
    assert_eq!(s3, 200, "once the first drill answered, the next runs: {v3}");
}

#[tokio::test]
async fn a_fault_on_a_sim_fails_over_and_its_own_faults_are_put_back() {
    let c = cluster(2).policy(Policy::RoundRobin).start().await;
    c.learn_models().await;
    c.sims[0].update_faults(|f| f.token_delay_ms = Some(1));
    let faults_url = format!("{}/_sim/faults", c.sims[0].url());
    let before: Value = c.client.get(&faults_url).send().await.expect("sim").json().await.expect("json");
    let (status, v) = drill(&c, json!({ "node": "n0", "take_out": "fault", "requests": 4 })).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["taken_out"], "fault");
    assert_eq!(served_by(&v), vec!["n1"; 4], "every request ended on the healthy node: {v}");
    assert!(c.sims[0].inference_count() > 0, "with a fault, requests still reach the node and fail there");
    let retried = v["results"].as_array().expect("results").iter().filter(|r| r["attempts"] == 2).count();
    assert!(retried > 0, "clients routed to the broken node were answered on a second attempt: {v}");
    let after: Value = c.client.get(&faults_url).send().await.expect("sim").json().await.expect("json");
    assert_eq!(after, before, "the sim's own faults are back as they were");
    assert_eq!(c.node(0).admin(), Admin::Active, "a fault drill never drains");
}

#[tokio::test]
async fn a_fault_needs_a_simulated_node() {
    let c = cluster(1)
        .config(|cfg| {
            cfg.nodes.push(NodeConfig { name: "real".into(), url: "http://127.0.0.1:9".into(), ..Default::default() })
        })
        .start()
        .await;
    let (status, v) = drill(&c, json!({ "node": "real", "take_out": "fault" })).await;
    assert_eq!((status, v["code"].as_str()), (409, Some("drill_not_sim")), "{v}");
    assert!(c.broker.registry().all().iter().all(|n| n.admin() == Admin::Active), "nothing was taken out");
}
