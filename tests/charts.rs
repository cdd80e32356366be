//! `GET /admin/charts/series`: the live charts' numbers, from records put into the store, and
//! tokens/s by its one definition on the node cards and in the chart alike.

mod common;

use std::time::Duration;

use common::cluster;
use corral::store::RequestRow;
use reqwest::Method;
use serde_json::Value;

/// A finished row of `node` ending at `end`.
fn row(
    id: &str,
    node: &str,
    end: i64,
    total: i64,
    tokens: Option<i64>,
    gen_us: Option<i64>,
    status: &str,
) -> RequestRow {
    RequestRow {
        id: id.into(),
        started_at: end - total,
        finished_at: Some(end),
        endpoint: "/api/chat".into(),
        node: Some(node.into()),
        total_ms: Some(total),
        ttfb_ms: Some(10),
        completion_tokens: tokens,
        generation_us: gen_us,
        status: status.into(),
        ..RequestRow::default()
    }
}

async fn series(c: &common::Cluster, range: &str) -> (u16, Value) {
    let r = c.admin(Method::GET, &format!("/admin/charts/series?range={range}")).send().await.expect("admin answers");
    let status = r.status().as_u16();
    (status, r.json().await.expect("json"))
}

fn values(v: &Value) -> Vec<Option<f64>> {
    v.as_array().expect("a list").iter().map(Value::as_f64).collect()
}

fn node_values(metric: &Value, node: &str) -> Vec<Option<f64>> {
    let s = metric["nodes"].as_array().expect("nodes").iter().find(|s| s["name"] == node);
    values(&s.unwrap_or_else(|| panic!("no series for {node} in {metric}"))["values"])
}

#[tokio::test]
async fn series_buckets_known_records_into_percentiles_rates_and_gaps() {
    let c = cluster(2).start().await;
    let store = c.broker.shared().telemetry.store().expect("store on").clone();
    // Bucket A starts 150 s before the window's end; 5 s buckets for range=5m.
    let now = corral::store::now_ms();
    let a = corral::charts::Buckets::ending_at(now, 5_000, 60).from_ms + 30 * 5_000;
    for (i, total) in [100, 200, 300, 400].into_iter().enumerate() {
        let tokens = 10 * (i as i64 + 1);
        store.finished(row(&format!("a{i}"), "n0", a + 1_000 + i as i64, total, Some(tokens), Some(100_000), "ok"));
    }
    store.finished(row("b", "n1", a + 2_000, 50, None, None, "error"));
    // Two buckets later: a whole answer that reported no generation time has no rate.
    store.finished(row("c", "n0", a + 10_500, 1_000, Some(99), None, "ok"));
    let q = corral::store::Query { since_ms: Some(a - 60_000), ..Default::default() };
    for _ in 0..100 {
        if store.requests(&q).await.expect("query").len() == 6 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let (status, s) = series(&c, "5m").await;
    assert_eq!(status, 200, "{s}");
    assert_eq!((s["range"].as_str(), s["bucket_ms"].as_i64()), (Some("5m"), Some(5_000)));
    let buckets: Vec<i64> = s["buckets"].as_array().expect("buckets").iter().filter_map(Value::as_i64).collect();
    assert_eq!(buckets.len(), 60);
    let i = buckets.iter().position(|b| *b == a).expect("bucket A is in the window");
    assert_eq!(s["requests"], 6);
    assert_eq!(s["nodes"], serde_json::json!(["n0", "n1"]));

    let p50 = node_values(&s["latency_p50"], "n0");
    let p95 = node_values(&s["latency_p95"], "n0");
    // Nearest rank over [100, 200, 300, 400]: p50 is rank round(1.5) = 2, p95 rank 3.
    assert_eq!((p50[i], p95[i]), (Some(300.0), Some(400.0)));
    assert_eq!(p50[i + 1], None, "a bucket where nothing ended is a gap, not 0");
    assert_eq!(p50[i + 2], Some(1_000.0));
    assert_eq!(values(&s["latency_p50"]["cluster"])[i], Some(200.0), "cluster-wide: [50, 100, 200, 300, 400]");

    let tps = node_values(&s["tokens_per_s"], "n0");
    assert_eq!(tps[i], Some(250.0), "100 tokens over 4 x 100 ms of generation");
    assert_eq!(tps[i + 2], None, "no generation time, no rate");
    assert_eq!(node_values(&s["tokens_per_s"], "n1")[i], None, "an error with no tokens has no rate");

    let outcomes = s["outcomes"].as_array().expect("outcomes");
    let count = |name: &str, at: usize| outcomes.iter().find(|o| o["name"] == name).map(|o| values(&o["values"])[at]);
    assert_eq!(count("ok", i), Some(Some(4.0)));
    assert_eq!(count("error", i), Some(Some(1.0)));
    assert_eq!(count("ok", i + 1), Some(Some(0.0)), "counts are 0 where nothing ended");
    assert_eq!(values(&s["queue_depth"]).len(), 60);
    let health = s["health"].as_array().expect("health");
    assert!(health.iter().any(|h| h["node"] == "n0" && h["bands"][0]["to"].as_i64() >= Some(now)), "{health:?}");
}

#[tokio::test]
async fn a_range_that_is_not_offered_is_a_400_that_lists_the_ranges() {
    let c = cluster(1).start().await;
    for bad in ["7d", "abc", "15"] {
        let (status, body) = series(&c, bad).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert_eq!(body["code"], "bad_query");
        let msg = body["error"].as_str().unwrap_or_default();
        assert!(msg.contains("range=") && msg.contains("5m, 15m, 1h, 24h"), "{msg}");
    }
    for good in ["5m", "15m", "1h", "24h"] {
        let (status, body) = series(&c, good).await;
        assert_eq!(status, 200, "{good}: {body}");
        assert_eq!(body["requests"], 0, "no traffic yet");
    }
}

#[tokio::test]
async fn the_node_card_and_the_chart_agree_on_tokens_per_second() {
    let c = cluster(1).spec(0, |s| s.tps = 200.0).start().await;
    c.learn_models().await;
    for _ in 0..4 {
        assert!(c.chat("llama3.2", false).await.status().is_success());
    }
    let mut rows: Vec<RequestRow> = Vec::new();
    for _ in 0..100 {
        let body: Value =
            c.admin(Method::GET, "/admin/requests").send().await.expect("admin").json().await.expect("json");
        rows = serde_json::from_value(body["requests"].clone()).expect("rows");
        if rows.len() == 4 && rows.iter().all(|r| r.status == "ok") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(rows.iter().all(|r| r.generation_us.is_some_and(|g| g > 0)), "eval_duration is recorded: {rows:?}");
    let tokens: i64 = rows.iter().filter_map(|r| r.completion_tokens).sum();
    let secs: f64 = rows.iter().filter_map(|r| r.generation_us).map(|u| u as f64 / 1e6).sum();
    let want = tokens as f64 / secs;
    let status: Value = c.admin(Method::GET, "/admin/status").send().await.expect("admin").json().await.expect("json");
    let card = status["stats"]["n0"]["tokens_per_s"].as_f64().expect("the card has a rate");
    assert!((card - want).abs() < 1e-6 * want, "card {card} = total tokens / total generation time {want}");
    assert!((100.0..=400.0).contains(&card), "the sim generates at 200 tokens/s: {card}");
    // The chart's rate in each bucket is the same sum over the requests that ended in it.
    let (_, s) = series(&c, "15m").await;
    let step = s["bucket_ms"].as_i64().expect("step");
    let chart = node_values(&s["tokens_per_s"], "n0");
    let mut seen = 0;
    for (start, v) in s["buckets"].as_array().expect("buckets").iter().filter_map(Value::as_i64).zip(chart) {
        let mine: Vec<&RequestRow> =
            rows.iter().filter(|r| r.finished_at.is_some_and(|f| f >= start && f < start + step)).collect();
        assert_eq!(v, corral::charts::tokens_per_s(mine.iter().copied()), "bucket at {start}");
        seen += mine.len();
    }
    assert_eq!(seen, 4, "every request is in one bucket of the chart");
}
