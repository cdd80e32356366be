//! The local degrade chain (`proxy::degrade`): when every node with the requested model is busy
//! past the queue timeout, a category with `degrade` answers with the next model of its chain,
//! says so in `X-Corral-Degraded`, and the record keeps the model that answered.

mod common;

use std::time::Duration;

use common::{cluster, long_seed, Cluster};
use futures_util::StreamExt;
use serde_json::{json, Value};

/// n0 has only llama3.2 and one slot; n1 has only the smaller qwen2.5:3b.
async fn two_sizes(degrade: &'static [&'static str]) -> Cluster {
    let c = cluster(2)
        .models(0, &["llama3.2:latest"])
        .models(1, &["qwen2.5:3b"])
        .config(move |cfg| {
            cfg.nodes[0].max_concurrency = 1;
            cfg.categories[0].degrade = degrade.iter().map(|m| m.to_string()).collect();
        })
        .start()
        .await;
    c.learn_models().await;
    c.sims[0].update_faults(|f| f.token_delay_ms = Some(80));
    c
}

fn chat(model: &str, seed: u64, stream: bool) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "options": {"seed": seed}, "stream": stream})
}

async fn rows(c: &Cluster, at_least: usize) -> Vec<corral::store::RequestRow> {
    let store = c.broker.shared().telemetry.store().expect("store on").clone();
    let mut rows = Vec::new();
    for _ in 0..300 {
        let q = corral::store::Query { limit: Some(100), ..Default::default() };
        rows = store.requests(&q).await.expect("query");
        if rows.iter().filter(|r| r.status != "running").count() >= at_least {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    rows
}

#[tokio::test]
async fn a_busy_model_is_served_by_the_next_in_the_chain_and_says_so() {
    let c = two_sizes(&["qwen2.5:3b"]).await;
    // A holds n0's only slot, streaming slowly.
    let a = c.post("/api/chat", chat("llama3.2", long_seed(20), true)).await;
    let mut a_stream = a.bytes_stream();
    let _ = a_stream.next().await.expect("A streams");
    let b = c
        .client
        .post(c.url("/api/chat"))
        .header("x-corral-queue-timeout", "200")
        .json(&chat("llama3.2", 1, false))
        .send()
        .await
        .expect("B answers");
    assert_eq!(b.status(), 200, "no 503: the smaller model answered");
    assert_eq!(b.headers()["x-corral-degraded"], "qwen2.5:3b");
    assert_eq!(b.headers()["x-corral-node"], "n1");
    let b_id = b.headers()["x-corral-request-id"].to_str().expect("ascii").to_string();
    let v: Value = b.json().await.expect("json");
    assert_eq!(v["model"], "qwen2.5:3b", "the answer names the model that wrote it: {v}");
    drop(a_stream);
    let rows = rows(&c, 2).await;
    let row = rows.iter().find(|r| r.id == b_id).expect("B's record");
    assert_eq!(row.model, "llama3.2", "the record keeps what was asked");
    assert_eq!(row.answered_model.as_deref(), Some("qwen2.5:3b"), "and what answered: {row:?}");
    assert_eq!(c.sims[1].inference_count(), 1);
}

#[tokio::test]
async fn without_a_chain_the_busy_model_times_out_as_before() {
    let c = two_sizes(&[]).await;
    let a = c.post("/api/chat", chat("llama3.2", long_seed(20), true)).await;
    let mut a_stream = a.bytes_stream();
    let _ = a_stream.next().await.expect("A streams");
    let b = c.client.post(c.url("/api/chat")).header("x-corral-queue-timeout", "200").json(&chat("llama3.2", 1, false));
    let b = b.send().await.expect("B answers");
    assert_eq!(b.status(), 503);
    assert!(b.headers().get("x-corral-degraded").is_none());
    assert_eq!(b.json::<Value>().await.expect("json")["code"], "queue_timeout");
    assert_eq!(c.sims[1].inference_count(), 0, "nothing went to the smaller model");
}

#[tokio::test]
async fn the_chain_comes_before_or_after_the_cloud_as_the_category_says() {
    use corral::config::{CloudPermission, DegradeOrder, ProviderConfig};
    for (order, degraded) in [(DegradeOrder::BeforeCloud, true), (DegradeOrder::AfterCloud, false)] {
        let spec = corral::sim::SimSpec { models: vec!["gpt-4o-mini".into()], cloud: true, ..Default::default() };
        let cloud = corral::sim::SimNode::start(spec).await.expect("cloud sim starts");
        let base_url = format!("{}/v1", cloud.url());
        let c = cluster(2)
            .models(0, &["llama3.2:latest"])
            .models(1, &["qwen2.5:3b"])
            .config(move |cfg| {
                cfg.nodes[0].max_concurrency = 1;
                let cat = &mut cfg.categories[0];
                cat.degrade = vec!["qwen2.5:3b".into()];
                cat.degrade_order = order;
                cat.cloud = CloudPermission::OnFailure;
                cat.providers = vec!["cloud".into()];
                let model_map = [("llama3.2".to_string(), "gpt-4o-mini".to_string())].into();
                cfg.providers =
                    vec![ProviderConfig { name: "cloud".into(), base_url, model_map, ..Default::default() }];
            })
            .start()
            .await;
        c.learn_models().await;
        c.sims[0].update_faults(|f| f.token_delay_ms = Some(80));
        let a = c.post("/api/chat", chat("llama3.2", long_seed(20), true)).await;
        let mut a_stream = a.bytes_stream();
        let _ = a_stream.next().await.expect("A streams");
        let b =
            c.client.post(c.url("/api/chat")).header("x-corral-queue-timeout", "200").json(&chat("llama3.2", 1, false));
        let b = b.send().await.expect("B answers");
        assert_eq!(b.status(), 200, "{order:?}");
        assert_eq!(b.headers().contains_key("x-corral-degraded"), degraded, "{order:?}");
        assert_eq!(b.headers().contains_key("x-corral-fallback"), !degraded, "{order:?}");
        assert_eq!(cloud.inference_count(), usize::from(!degraded), "{order:?}: the cloud was asked only after");
        assert_eq!(c.sims[1].inference_count(), usize::from(degraded), "{order:?}");
    }
}

#[tokio::test]
async fn past_the_chain_a_static_answer_is_well_formed_and_marked() {
    let c = cluster(1)
        .models(0, &["llama3.2:latest"])
        .config(|cfg| {
            cfg.nodes[0].max_concurrency = 1;
            cfg.categories[0].static_answer = Some("The cluster is busy; try again in a minute.".into());
        })
        .start()
        .await;
    c.learn_models().await;
    c.sims[0].update_faults(|f| f.token_delay_ms = Some(80));
    let a = c.post("/api/chat", chat("llama3.2", long_seed(20), true)).await;
    let mut a_stream = a.bytes_stream();
    let _ = a_stream.next().await.expect("A streams");
    for stream in [false, true] {
        let b = c
            .client
            .post(c.url("/api/chat"))
            .header("x-corral-queue-timeout", "200")
            .json(&chat("llama3.2", 1, stream))
            .send()
            .await
            .expect("B answers");
        assert_eq!(b.status(), 200, "the static text, not a 503");
        assert_eq!(b.headers()["x-corral-degraded"], "static");
        let text = b.text().await.expect("body");
        let last: Value = serde_json::from_str(text.lines().last().unwrap_or_default()).expect("an Ollama line");
        assert_eq!((last["done"].as_bool(), last["done_reason"].as_str()), (Some(true), Some("degraded")), "{text}");
        let content: String = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|v| v["message"]["content"].as_str().map(str::to_string))
            .collect();
        assert_eq!(content, "The cluster is busy; try again in a minute.");
    }
    // OpenAI-compatible clients get their own shape.
    let v1 = c
        .client
        .post(c.url("/v1/chat/completions"))
        .header("x-corral-queue-timeout", "200")
        .json(&json!({"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("answers");
    assert_eq!(v1.headers()["x-corral-degraded"], "static");
    let v: Value = v1.json().await.expect("json");
    assert_eq!(v["choices"][0]["message"]["content"], "The cluster is busy; try again in a minute.");
    assert_eq!(c.sims[0].inference_count(), 1, "only A reached the node");
    drop(a_stream);
}
