//! Per-category request limits (`proxy::limits`): a request over a cap is clamped (and told so
//! in `X-Corral-Clamped`) or refused with 400 `over_limit`, per the category; defaults fill in
//! what a request leaves out. The sim answers exactly `num_predict` / `max_tokens` tokens, so
//! what reached the node shows in its token count.

mod common;

use common::{cluster, ndjson, Cluster};
use corral::config::{OverLimit, RequestLimits};
use serde_json::{json, Value};

async fn limited(f: impl FnOnce(&mut RequestLimits) + 'static) -> Cluster {
    let c = cluster(1).config(move |cfg| f(&mut cfg.categories[0].limits)).start().await;
    c.learn_models().await;
    c
}

fn chat(options: Value) -> Value {
    json!({"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}], "stream": false, "options": options})
}

#[tokio::test]
async fn a_request_over_a_cap_is_clamped_and_told_so() {
    let c = limited(|l| {
        l.max_predict = 5;
        l.max_keep_alive_s = 600;
        l.temperature_max = Some(1.0);
    })
    .await;
    let mut body = chat(json!({"num_predict": 100, "temperature": 1.8}));
    body["keep_alive"] = json!("-1");
    let r = c.post("/api/chat", body).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-corral-clamped"], "num_predict=5, temperature=1, keep_alive=600");
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["eval_count"], 5, "the node was asked for 5 tokens, not 100: {v}");
    assert_eq!(v["done_reason"], "length");
    // The OpenAI dialect's name for the same cap.
    let r = c
        .post(
            "/v1/chat/completions",
            json!({"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}),
        )
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-corral-clamped"], "max_tokens=5");
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["usage"]["completion_tokens"], 5, "{v}");
    // Within the caps: nothing said, the body goes as it came.
    let r = c.post("/api/generate", json!({"model": "llama3.2", "prompt": "hi", "options": {"num_predict": 3}})).await;
    assert!(r.headers().get("x-corral-clamped").is_none());
    let lines = ndjson(&r.text().await.expect("stream"));
    assert_eq!(lines.last().map(|l| l["eval_count"].clone()), Some(json!(3)));
}

#[tokio::test]
async fn a_default_fills_in_what_the_request_leaves_out() {
    let c = limited(|l| {
        l.default_predict = 4;
        l.max_predict = 8;
    })
    .await;
    let v: Value = c.post("/api/chat", chat(json!({}))).await.json().await.expect("json");
    assert_eq!(v["eval_count"], 4, "no num_predict asked: the category's default: {v}");
    let r = c.post("/api/generate", json!({"model": "llama3.2", "prompt": "hi", "stream": false})).await;
    assert!(r.headers().get("x-corral-clamped").is_none(), "a default is not a clamp");
    assert_eq!(r.json::<Value>().await.expect("json")["eval_count"], 4);
}

#[tokio::test]
async fn a_refusing_category_answers_400_and_sends_nothing() {
    let c = limited(|l| {
        l.max_num_ctx = 8192;
        l.max_predict = 256;
        l.over_limit = OverLimit::Refuse;
    })
    .await;
    let r = c.post("/api/chat", chat(json!({"num_ctx": 32768}))).await;
    assert_eq!(r.status(), 400);
    assert_eq!(r.headers()["x-corral-forwarded"], "false");
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["code"], "over_limit");
    assert!(v["error"].as_str().is_some_and(|e| e.contains("num_ctx 32768") && e.contains("8192")), "{v}");
    let r = c.post("/api/generate", json!({"model": "llama3.2", "prompt": "hi", "options": {"num_predict": -1}})).await;
    assert_eq!(r.status(), 400, "\"no limit\" is over the cap");
    assert_eq!(c.inference_counts(), vec![0], "nothing reached the node");
    let r = c.post("/api/chat", chat(json!({"num_ctx": 4096, "num_predict": 100}))).await;
    assert_eq!(r.status(), 200, "within the caps it runs");
}

#[tokio::test]
async fn help_shows_each_categorys_limits_and_idempotency() {
    let c = limited(|l| {
        l.max_predict = 512;
        l.over_limit = OverLimit::Refuse;
    })
    .await;
    let v: Value = c.admin(reqwest::Method::GET, "/help").send().await.expect("help").json().await.expect("json");
    let cat = &v["categories"][0];
    assert_eq!(cat["limits"]["max_predict"], 512, "{cat}");
    assert!(cat["limits"]["over_limit"].as_str().is_some_and(|s| s.contains("over_limit")), "{cat}");
    assert_eq!(cat["idempotency"]["window_ms"], 600_000);
    assert!(v["response_headers"]["X-Corral-Clamped"].is_string());
    assert!(v["request_headers"]["Idempotency-Key"].is_string());
}
