//! The request store on real SQLite files and, where a test PostgreSQL is set
//! (`CORRAL_TEST_PG_URL`, see tests/common/pg.rs), on PostgreSQL too: what is recorded, crash
//! recovery, retention, bursts. Each case runs once per engine.

mod common;

use std::time::Duration;

use common::{cluster, temp_db};
use corral::config::StoreConfig;
use corral::store::{apply_retention, dropped_total, query_requests, Query, Store};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// The engines a case runs on: SQLite (`None`), then a fresh PostgreSQL database's URL when
/// there is a test server (with `CORRAL_PG=required`, a missing one fails).
async fn engines(prefix: &str) -> Vec<Option<String>> {
    let mut out = vec![None];
    if let Some(url) = common::pg::fresh_database(prefix).await {
        out.push(Some(url));
    }
    out
}

/// Wait until the writer has flushed `n` finished rows.
async fn finished_rows(store: &Store, n: usize) -> Vec<corral::store::RequestRow> {
    let mut rows = Vec::new();
    for _ in 0..500 {
        rows = store.requests(&Query::default()).await.expect("query");
        if rows.iter().filter(|r| r.status != "running").count() >= n {
            return rows;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    rows
}

#[tokio::test]
async fn every_request_gets_one_row_with_its_outcome() {
    for url in engines("store_rows").await {
        one_row_per_request(url).await;
    }
}

async fn one_row_per_request(url: Option<String>) {
    let c = cluster(2).config(move |cfg| cfg.store.url = url).policy(corral::config::Policy::RoundRobin).start().await;
    c.learn_models().await;
    let store = c.broker.shared().telemetry.store().expect("store on").clone();
    assert!(c.chat("llama3.2", false).await.status().is_success());
    let streamed =
        c.post("/api/generate", json!({"model": "llama3.2", "prompt": "hi", "options": {"num_predict": 4}})).await;
    streamed.text().await.expect("body");
    assert_eq!(c.chat("nope", false).await.status(), 404);
    c.sims[0].update_faults(|f| f.cut_after = Some(2));
    c.sims[1].update_faults(|f| f.cut_after = Some(2));
    c.chat("llama3.2", true).await.text().await.expect("body");
    let rows = finished_rows(&store, 4).await;
    assert_eq!(rows.len(), 4, "{rows:#?}");
    let by_status = |s: &str| rows.iter().filter(|r| r.status == s).count();
    assert_eq!(by_status("ok"), 2);
    assert_eq!(by_status("client_error"), 1);
    assert_eq!(by_status("interrupted"), 1);
    let gen = rows.iter().find(|r| r.endpoint == "/api/generate").expect("generate row");
    assert!(gen.streamed, "generate streams by default");
    assert_eq!(gen.completion_tokens, Some(4), "tokens read from the final chunk");
    assert!(gen.prompt_tokens.is_some());
    assert!(gen.ttfb_ms.is_some() && gen.total_ms.is_some() && gen.queued_ms.is_some());
    assert!(gen.node.is_some());
    let missing = rows.iter().find(|r| r.status == "client_error").expect("404 row");
    assert_eq!(missing.error_code.as_deref(), Some("model_not_found"));
    assert_eq!(missing.http_status, Some(404));
    let cut = rows.iter().find(|r| r.status == "interrupted").expect("cut row");
    assert!(cut.interrupted);
    assert_eq!(cut.error_code.as_deref(), Some("stream_interrupted"));
}

#[tokio::test]
async fn node_state_changes_are_recorded_with_their_reason() {
    for url in engines("store_events").await {
        node_events_recorded(url).await;
    }
}

async fn node_events_recorded(url: Option<String>) {
    let c = cluster(2).config(move |cfg| cfg.store.url = url).start().await;
    let store = c.broker.shared().telemetry.store().expect("store on").clone();
    c.sims[0].stop();
    let _ = c.chat("llama3.2", false).await;
    let _ = c.chat("llama3.2", false).await;
    let mut events = Vec::new();
    for _ in 0..500 {
        events = store.node_events(0).await.expect("query");
        if events.iter().any(|e| e.node == "n0" && e.to_state == "unhealthy") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let down = events.iter().find(|e| e.node == "n0" && e.to_state == "unhealthy").expect("the change was recorded");
    assert_eq!(
        down.reason,
        format!("a request could not connect to {} (refused or unreachable)", c.sims[0].url()),
        "the request path's reason names the node's address"
    );
}

#[tokio::test]
async fn rows_left_running_by_a_crash_become_unknown() {
    for url in engines("store_crash").await {
        running_rows_become_unknown(url).await;
    }
}

async fn running_rows_become_unknown(url: Option<String>) {
    let path = temp_db();
    let config = StoreConfig { path: Some(path.display().to_string()), url, ..StoreConfig::default() };
    {
        let cancel = CancellationToken::new();
        let (store, tasks) = Store::open(&config, cancel.clone()).await.expect("open");
        let writer = tokio::spawn(tasks.writer);
        store.started(corral::store::Started {
            id: "r1".into(),
            started_at: corral::store::now_ms(),
            endpoint: "/api/chat".into(),
            client_request_id: None,
        });
        let mut seen = false;
        for _ in 0..500 {
            if store
                .requests(&Query::default())
                .await
                .expect("query")
                .iter()
                .any(|r| r.id == "r1" && r.status == "running")
            {
                seen = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(seen, "the running row was written");
        // A crash: the process dies with the row still running.
        writer.abort();
    }
    let (store, _tasks) = Store::open(&config, CancellationToken::new()).await.expect("reopen");
    let rows = store.requests(&Query::default()).await.expect("query");
    assert_eq!(rows[0].status, "unknown", "never silently ok");
}

#[tokio::test]
async fn retention_keeps_the_newest_rows_within_the_age_limit() {
    for url in engines("store_retention").await {
        retention_keeps_newest(url).await;
    }
}

async fn retention_keeps_newest(url: Option<String>) {
    let path = temp_db();
    let config = StoreConfig {
        path: Some(path.display().to_string()),
        url,
        max_rows: 3,
        max_age_days: 1,
        ..StoreConfig::default()
    };
    let (store, tasks) = Store::open(&config, CancellationToken::new()).await.expect("open");
    // Only the writer: this test applies retention itself.
    let _writer = tokio::spawn(tasks.writer);
    let now = corral::store::now_ms();
    for (i, age_ms) in [0i64, 1_000, 2_000, 3_000, 4_000, 3 * 86_400_000].iter().enumerate() {
        store.finished(corral::store::RequestRow {
            id: format!("r{i}"),
            started_at: now - age_ms,
            endpoint: "/api/chat".into(),
            status: "ok".into(),
            ..Default::default()
        });
    }
    let rows = finished_rows(&store, 6).await;
    assert_eq!(rows.len(), 6);
    let removed = apply_retention(store.pool(), &config).await.expect("retention");
    assert_eq!(removed, 3, "one too old, two beyond max_rows");
    let ids: Vec<String> = store.requests(&Query::default()).await.expect("query").into_iter().map(|r| r.id).collect();
    assert_eq!(ids, vec!["r0", "r1", "r2"]);
}

#[tokio::test]
async fn a_full_writer_channel_drops_and_counts_but_never_blocks_requests() {
    for url in engines("store_drops").await {
        full_channel_drops(url).await;
    }
}

async fn full_channel_drops(url: Option<String>) {
    let c = cluster(1)
        .config(move |cfg| {
            cfg.store.channel_capacity = 1;
            cfg.store.url = url;
        })
        .start()
        .await;
    let store = c.broker.shared().telemetry.store().expect("store on").clone();
    let burst = futures_util::future::join_all((0..200).map(|_| c.chat("llama3.2", false))).await;
    assert!(burst.iter().all(|r| r.status().is_success()), "every request was served");
    let dropped = store.dropped();
    assert!(dropped > 0, "a one-slot channel cannot take a burst of 200");
    let mut written = 0;
    for _ in 0..500 {
        // One more record makes the writer note the drops in its next batch.
        let _ = c.chat("llama3.2", false).await;
        written = dropped_total(store.pool()).await.expect("query");
        if written > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(written > 0, "the drop count is itself recorded");
    let rows = query_requests(store.pool(), &Query { limit: Some(10_000), ..Query::default() }).await.expect("query");
    assert!(rows.len() < 400, "some records were dropped, not queued without bound");
}
