//! Scheduling that knows LLM work: the speed model learned from sims' timing fields, and
//! `fastest-finish` against `least-connections` and `p2c` on a mixed fleet.

mod common;

use std::time::Duration;

use common::{cluster, Cluster};
use corral::config::Policy;
use serde_json::{json, Value};
use tokio::time::Instant;

fn ask(c: &Cluster, tokens: u64) -> impl std::future::Future<Output = reqwest::Response> + 'static {
    let (client, url) = (c.client.clone(), c.url("/api/generate"));
    let body = json!({ "model": "llama3.2", "prompt": "count the sheep", "stream": true, "options": { "num_predict": tokens } });
    async move { client.post(url).json(&body).send().await.expect("broker answers") }
}

/// Send `n` requests at once and read every answer to its end.
async fn burst(c: &Cluster, n: usize, tokens: u64) -> Vec<reqwest::Response> {
    let sends: Vec<_> = (0..n).map(|_| tokio::spawn(ask(c, tokens))).collect();
    let mut out = Vec::new();
    for s in sends {
        out.push(s.await.expect("request task"));
    }
    out
}

async fn drain(responses: Vec<reqwest::Response>) {
    for r in responses {
        assert_eq!(r.status(), 200);
        let text = r.text().await.expect("answer body");
        assert!(text.contains("\"done\":true"), "a whole answer: {text}");
    }
}

async fn status(c: &Cluster) -> Value {
    c.admin(reqwest::Method::GET, "/admin/status").send().await.expect("status").json().await.expect("json")
}

#[tokio::test]
async fn the_speed_model_learns_prefill_decode_and_cold_load_from_the_sim() {
    let c = cluster(1)
        .spec(0, |s| {
            s.tps = 50.0;
            s.ttft = Duration::from_millis(100);
            s.load_ms = 300;
        })
        .start()
        .await;
    let started = Instant::now();
    drain(burst(&c, 1, 10).await).await;
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "the cold load and the first token really took their time"
    );
    let s = status(&c).await;
    let speed = &s["nodes"][0]["speed"]["llama3.2:latest"];
    let decode = speed["decode_tps"].as_f64().expect("decode speed known");
    assert!((40.0..=60.0).contains(&decode), "about --tps 50: {speed}");
    let load = speed["load_ms"].as_f64().expect("cold load known");
    assert!((290.0..=320.0).contains(&load), "about --load-ms 300: {speed}");
    let prefill = speed["prefill_tps"].as_f64().expect("prefill known");
    assert!(prefill > 0.0 && prefill < 1000.0, "prompt tokens over the 100 ms wait: {speed}");
    drain(burst(&c, 1, 10).await).await;
    let again = status(&c).await;
    assert_eq!(
        again["nodes"][0]["speed"]["llama3.2:latest"]["load_ms"].as_f64(),
        Some(load),
        "a warm answer does not move the cold-load estimate"
    );
    let metrics = c
        .client
        .get(c.admin_url("/metrics"))
        .bearer_auth(common::TOKEN)
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains("corral_node_decode_tokens_per_second{node=\"n0\",model=\"llama3.2:latest\"}"),
        "the decode speed is exported per node and model:\n{metrics}"
    );
}

/// One fast node between two slow ones, each taking 20 at once; a warm-up so the broker knows
/// their speeds, then 60 requests at once. Returns the makespan of the 60.
async fn mixed_fleet_batch(policy: Policy) -> Duration {
    let c = cluster(3)
        .spec(0, |s| (s.tps, s.parallel) = (30.0, 20))
        .spec(1, |s| (s.tps, s.parallel) = (200.0, 20))
        .spec(2, |s| (s.tps, s.parallel) = (30.0, 20))
        .config(|cfg| {
            for n in cfg.nodes.iter_mut() {
                n.max_concurrency = 20;
            }
        })
        .policy(policy)
        .start()
        .await;
    for s in &c.sims {
        s.update_faults(|f| f.ttft_ms = Some(20));
    }
    for _ in 0..2 {
        drain(burst(&c, 3, 10).await).await;
    }
    if policy == Policy::FastestFinish {
        let s = status(&c).await;
        for n in s["nodes"].as_array().expect("nodes") {
            assert!(n["speed"]["llama3.2:latest"]["decode_tps"].is_number(), "warm-up taught every node's speed: {n}");
        }
    }
    let started = Instant::now();
    let responses = burst(&c, 60, 120).await;
    if policy == Policy::FastestFinish {
        let estimate =
            responses[0].headers().get("x-corral-estimate-ms").and_then(|v| v.to_str().ok()).map(str::to_string);
        assert!(estimate.and_then(|e| e.parse::<u64>().ok()).is_some(), "fastest-finish says its estimate");
    }
    let mut per_node = std::collections::BTreeMap::new();
    for r in &responses {
        let node = r.headers().get("x-corral-node").and_then(|v| v.to_str().ok()).unwrap_or("?").to_string();
        *per_node.entry(node).or_insert(0) += 1;
    }
    drain(responses).await;
    let makespan = started.elapsed();
    println!("{}: {makespan:?}, requests per node {per_node:?}", policy.name());
    makespan
}

#[tokio::test]
async fn fastest_finish_ends_a_mixed_fleet_batch_sooner_than_least_connections_and_p2c() {
    let ff = mixed_fleet_batch(Policy::FastestFinish).await;
    let lc = mixed_fleet_batch(Policy::LeastConnections).await;
    let p2c = mixed_fleet_batch(Policy::P2c).await;
    println!("makespan of 60 requests, 1 fast (200 tok/s) + 2 slow (30 tok/s) sims: fastest-finish {ff:?}, least-connections {lc:?}, p2c {p2c:?}");
    assert!(ff.as_secs_f64() <= 0.8 * lc.as_secs_f64(), "at least 20% sooner than least-connections: {ff:?} vs {lc:?}");
    assert!(ff.as_secs_f64() <= 0.8 * p2c.as_secs_f64(), "at least 20% sooner than p2c: {ff:?} vs {p2c:?}");
}
