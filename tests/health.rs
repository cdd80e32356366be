//! Probes against live sims: readiness, warm-up, flapping.

mod common;

use std::time::Duration;

use common::{cluster, eventually};
use corral::node::{Health, NodeState};
use corral::sim::Faults;

#[tokio::test]
async fn a_joining_node_is_warmed_up_before_it_takes_traffic() {
    let c = cluster(1)
        .config(|cfg| {
            cfg.health.interval_ms = 50;
            cfg.health.warm_models = vec!["llama3.2".into()];
        })
        .start()
        .await;
    assert!(eventually(Duration::from_secs(10), || c.node(0).health() == Health::Healthy).await);
    let got = c.sims[0].received();
    let warm = got.iter().position(|r| r.path == "/api/generate" && r.model.as_deref() == Some("llama3.2"));
    let healthy_probe = got.iter().position(|r| r.path == "/api/version");
    assert!(warm.is_some(), "the warm-up generate was sent: {got:?}");
    assert!(healthy_probe < warm, "after the node answered its first probe");
    let ps: serde_json::Value =
        reqwest::get(format!("{}/api/ps", c.sims[0].url())).await.expect("ps").json().await.expect("json");
    assert_eq!(ps["models"][0]["name"], "llama3.2:latest", "the model is loaded");
}

#[tokio::test]
async fn a_failing_readiness_probe_keeps_a_node_out() {
    let c = cluster(2)
        .config(|cfg| {
            cfg.health.interval_ms = 30;
            cfg.health.failures_to_down = 2;
            cfg.health.readiness_model = Some("llama3.2".into());
        })
        .start()
        .await;
    c.sims[1].set_faults(Faults::statuses(500, 10_000));
    assert!(
        eventually(Duration::from_secs(10), || c.node(1).health() == Health::Unhealthy).await,
        "liveness alone would say up"
    );
    assert!(eventually(Duration::from_secs(10), || c.node(0).health() == Health::Healthy).await);
    c.sims[1].set_faults(Faults::default());
    assert!(
        eventually(Duration::from_secs(10), || c.node(1).state() == NodeState::Recovering).await,
        "back, and ramping up"
    );
}

#[tokio::test]
async fn a_flapping_node_is_taken_out_and_brought_back_by_probes() {
    let c = cluster(1)
        .config(|cfg| {
            cfg.health.interval_ms = 20;
            cfg.health.failures_to_down = 2;
            cfg.health.successes_to_up = 2;
        })
        .start()
        .await;
    c.sims[0].update_faults(|f| f.flap_every = Some(4));
    assert!(eventually(Duration::from_secs(10), || c.node(0).health() == Health::Unhealthy).await);
    assert!(eventually(Duration::from_secs(10), || c.node(0).health() == Health::Healthy).await);
}
