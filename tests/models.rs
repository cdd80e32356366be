//! The Models screen's admin API against simulated nodes: the node x model matrix (details,
//! digests that differ), a pull's progress reaching the client in order and a cancel that stops
//! the node's download, delete and copy with every node's error named, and the latency test
//! (time to first token of a model, or a ping) with the probe's reasons.

mod common;

use std::time::Duration;

use common::{cluster, eventually, ndjson};
use corral::sim::Faults;
use futures_util::StreamExt;
use reqwest::Method;
use serde_json::{json, Value};

async fn admin_json(c: &common::Cluster, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut req = c.admin(method, path);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.expect("admin answers");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Per digest, `completed` never goes back and never passes `total`.
fn assert_in_order(lines: &[Value]) {
    let mut seen: std::collections::HashMap<String, u64> = Default::default();
    for l in lines.iter().filter(|l| l.get("digest").is_some()) {
        let (d, total) = (l["digest"].as_str().expect("digest"), l["total"].as_u64().expect("total"));
        let done = l.get("completed").and_then(Value::as_u64).unwrap_or(0);
        assert!(done <= total, "completed {done} past total {total}: {l}");
        let before = seen.insert(d.to_string(), done).unwrap_or(0);
        assert!(done >= before, "progress of {d} went back from {before} to {done}");
    }
}

#[tokio::test]
async fn a_pull_streams_ordered_progress_and_its_totals_are_the_listed_size() {
    let c = cluster(2).start().await;
    c.sims[0].set_faults(Faults { pull_ms: Some(300), ..Faults::default() });
    let r = c.admin(Method::POST, "/admin/models/pull").json(&json!({"name": "qwen2.5:7b", "nodes": ["n0"]})).send();
    let r = r.await.expect("admin answers");
    assert_eq!(r.status(), 200);
    let lines = ndjson(&r.text().await.expect("body"));
    assert_eq!(lines[0]["status"], "pulling manifest", "Ollama's first line: {lines:#?}");
    assert_in_order(&lines);
    let ticks = lines.iter().filter(|l| l.get("completed").is_some()).count();
    assert!(ticks > 4, "progress comes over time, not at once: {ticks} progress lines");
    let mut finals: std::collections::BTreeMap<&str, u64> = Default::default();
    for l in lines.iter().filter(|l| l.get("digest").is_some()) {
        assert_eq!(l["node"], "n0", "every line says its node");
        assert!(l["status"].as_str().is_some_and(|s| s.starts_with("pulling ")), "{l}");
        finals.insert(l["digest"].as_str().expect("digest"), l["completed"].as_u64().unwrap_or(0));
    }
    let statuses: Vec<&str> = lines.iter().filter_map(|l| l["status"].as_str()).collect();
    let at = |s: &str| statuses.iter().position(|x| *x == s).unwrap_or_else(|| panic!("no {s:?} in {statuses:?}"));
    assert!(at("verifying sha256 digest") < at("writing manifest"), "{statuses:?}");
    assert_eq!(lines.last().expect("lines")["status"], "success");
    let tags: Value =
        reqwest::get(format!("{}/api/tags", c.sims[0].url())).await.expect("tags").json().await.expect("json");
    let entry = tags["models"].as_array().expect("models").iter().find(|m| m["name"] == "qwen2.5:7b").cloned();
    let size = entry.expect("pulled").get("size").and_then(Value::as_u64).expect("size");
    assert_eq!(finals.values().sum::<u64>(), size, "every layer whole, adding up to the size /api/tags lists");
    assert_eq!(c.sims[0].pulls_completed(), 1);
    assert!(!c.sims[1].models().contains(&"qwen2.5:7b".to_string()), "n1 was not asked");
}

#[tokio::test]
async fn dropping_the_pull_stream_stops_the_nodes_download_and_the_next_pull_resumes() {
    let c = cluster(1).start().await;
    c.sims[0].set_faults(Faults { pull_ms: Some(20_000), ..Faults::default() });
    let r = c.admin(Method::POST, "/admin/models/pull").json(&json!({"name": "qwen2.5:7b", "nodes": ["n0"]})).send();
    let mut body = r.await.expect("admin answers").bytes_stream();
    let mut text = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !ndjson(text.rsplit_once('\n').map_or("", |(done, _)| done)).iter().any(|l| l["completed"].as_u64() > Some(0))
    {
        assert!(tokio::time::Instant::now() < deadline, "no byte progress in 10 s: {text}");
        text.push_str(&String::from_utf8_lossy(&body.next().await.expect("more lines").expect("chunk")));
    }
    assert_eq!(c.sims[0].pulling(), 1, "the node is pulling");
    drop(body);
    assert!(eventually(Duration::from_secs(5), || c.sims[0].pulling() == 0).await, "the node's pull was not stopped");
    assert_eq!(c.sims[0].pulls_cancelled(), 1, "the node saw its client go away");
    let fetched = c.sims[0].pulled_bytes();
    assert!(fetched > 0, "it had begun");
    assert!(!c.sims[0].models().contains(&"qwen2.5:7b".to_string()), "a cancelled pull leaves no model");

    // Ollama keeps the part it fetched: the next pull starts from there.
    c.sims[0].set_faults(Faults { pull_ms: Some(200), ..Faults::default() });
    let r = c.admin(Method::POST, "/admin/models/pull").json(&json!({"name": "qwen2.5:7b"})).send().await;
    let lines = ndjson(&r.expect("admin answers").text().await.expect("body"));
    let first = lines.iter().find(|l| l.get("digest").is_some()).expect("a layer line");
    assert!(first["completed"].as_u64() > Some(0), "resumed, not from 0: {first}");
    assert_eq!(lines.last().expect("lines")["status"], "success");
    // Recorded like a client's pull that went away.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (_, rows) = admin_json(&c, Method::GET, "/admin/requests", None).await;
        let rows = rows["requests"].as_array().cloned().unwrap_or_default();
        let pulls: Vec<&str> =
            rows.iter().filter(|r| r["endpoint"] == "/api/pull").filter_map(|r| r["status"].as_str()).collect();
        if pulls.contains(&"cancelled") && pulls.contains(&"ok") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the pulls were not recorded as cancelled and ok: {pulls:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn the_matrix_shows_details_loaded_models_and_digests_that_differ() {
    let c = cluster(2).spec(1, |s| s.older = vec!["llama3.2:latest".into()]).start().await;
    assert_eq!(c.chat("llama3.2", false).await.status(), 200, "loads llama3.2 somewhere");
    let (status, m) = admin_json(&c, Method::GET, "/admin/models", None).await;
    assert_eq!(status, 200);
    let llama = m["models"].as_array().expect("models").iter().find(|r| r["name"] == "llama3.2:latest").cloned();
    let llama = llama.expect("llama3.2 is a row");
    assert_eq!(llama["family"], "llama");
    assert_eq!(llama["parameter_size"], "3.2B");
    assert_eq!(llama["quantization_level"], "Q4_K_M");
    assert!(llama["size"].as_u64() > Some(1_000_000_000), "{llama}");
    assert_eq!(llama["digests_differ"], true, "n1 holds an older build: {llama}");
    let (d0, d1) = (&llama["cells"]["n0"]["digest"], &llama["cells"]["n1"]["digest"]);
    assert!(d0.is_string() && d1.is_string() && d0 != d1, "each node's own digest: {llama}");
    let loaded = ["n0", "n1"].iter().filter(|n| llama["cells"][**n]["loaded"] == true).count();
    assert_eq!(loaded, 1, "the node that answered has it loaded: {llama}");
    let embed =
        m["models"].as_array().expect("models").iter().find(|r| r["name"] == "nomic-embed-text:latest").cloned();
    assert_eq!(embed.expect("embed row")["digests_differ"], false, "the same build everywhere");
    assert_eq!(m["nodes"].as_array().map(Vec::len), Some(2));
}

#[tokio::test]
async fn copy_then_delete_each_name_their_nodes_and_a_down_node_says_so() {
    let c = cluster(2).start().await;
    c.learn_models().await;
    let (status, v) = admin_json(
        &c,
        Method::POST,
        "/admin/models/copy",
        Some(json!({"source": "llama3.2", "destination": "mine", "nodes": ["n0"]})),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["results"][0]["node"], "n0");
    assert_eq!(c.sims[0].digest("mine"), c.sims[0].digest("llama3.2"), "a copy is the same build");
    assert!(!c.sims[1].models().contains(&"mine:latest".to_string()), "only on n0");

    let (status, v) =
        admin_json(&c, Method::POST, "/admin/models/delete", Some(json!({"name": "mine", "nodes": ["n0", "n1"]})))
            .await;
    assert_eq!(status, 502, "one node did, one failed: {v}");
    assert_eq!(v["error"], "delete failed on 1 of 2 nodes: n1: model 'mine' not found", "{v}");
    let ok: Vec<bool> = v["results"].as_array().expect("results").iter().map(|r| r["ok"] == true).collect();
    assert_eq!(ok, [true, false]);
    assert!(!c.sims[0].models().contains(&"mine:latest".to_string()), "deleted from n0");

    let (status, v) = admin_json(
        &c,
        Method::POST,
        "/admin/models/copy",
        Some(json!({"source": "nope", "destination": "x", "nodes": ["n0"]})),
    )
    .await;
    assert_eq!(status, 404, "{v}");
    assert_eq!(v["error"], "copy failed on 1 of 1 nodes: n0: model \"nope\" not found", "Ollama's words: {v}");

    c.sims[1].stop();
    let (status, v) =
        admin_json(&c, Method::POST, "/admin/models/delete", Some(json!({"name": "llama3.2", "nodes": ["n1"]}))).await;
    assert!(status >= 500, "{status} {v}");
    let e = v["error"].as_str().expect("error");
    assert!(e.contains("node n1 is down: connection refused"), "the node, named, and why: {e}");
    let (status, v) =
        admin_json(&c, Method::POST, "/admin/models/delete", Some(json!({"name": "llama3.2", "nodes": ["n9"]}))).await;
    assert_eq!((status, v["code"].as_str()), (404, Some("not_found")), "{v}");
}

#[tokio::test]
async fn the_latency_test_times_a_first_token_and_names_why_a_node_failed() {
    let c = cluster(2).spec(0, |s| s.ttft = Duration::from_millis(150)).start().await;
    c.learn_models().await;
    c.sims[1].stop();
    let (status, v) = admin_json(&c, Method::POST, "/admin/latency", Some(json!({"models": ["llama3.2"]}))).await;
    assert_eq!(status, 200, "{v}");
    let rows = v.as_array().expect("results");
    let n0 = rows.iter().find(|r| r["node"] == "n0").expect("n0 tested");
    assert_eq!((n0["ok"].as_bool(), n0["kind"].as_str()), (Some(true), Some("ttft")), "{n0}");
    assert!(n0["ms"].as_f64() >= Some(150.0), "at least the node's 150 ms to first token: {n0}");
    assert_eq!(n0["model"], "llama3.2:latest");
    let generate = c.sims[0].received().into_iter().filter(|r| r.path == "/api/generate").count();
    assert_eq!(generate, 1, "one tiny generate");
    let n1 = rows.iter().find(|r| r["node"] == "n1").expect("n1 tested");
    let url = c.sims[1].url();
    assert_eq!(n1["ok"], false);
    assert_eq!(n1["error"], json!(format!("connection refused at {url}")), "the probe's words: {n1}");

    let (status, ping) = admin_json(&c, Method::POST, "/admin/nodes/n0/test", None).await;
    assert_eq!(status, 200);
    assert_eq!((ping["kind"].as_str(), ping["ok"].as_bool()), (Some("ping"), Some(true)), "no model: a ping: {ping}");
    assert_eq!(ping["name"], "n0", "the Nodes button's field");

    let (_, kept) = admin_json(&c, Method::GET, "/admin/latency", None).await;
    let kept = kept["results"].as_array().expect("results").clone();
    assert_eq!(kept.len(), 3, "n0 and n1 for llama3.2, and n0's ping: {kept:#?}");
    assert!(kept.iter().all(|r| r["at"].as_i64() > Some(0) && r["age_ms"].as_i64() >= Some(0)), "{kept:#?}");
}
