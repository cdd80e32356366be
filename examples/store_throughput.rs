//! How many request records per second the store writer sustains, and whether the request
//! path ever waits: records are handed over with `try_send`, so the hand-over time is the
//! request path's whole cost. Run: cargo run --release --example store_throughput [N]

use tokio::time::Instant;

use corral::config::StoreConfig;
use corral::store::{Query, RequestRow, Store};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(50_000);
    let dir = std::env::temp_dir().join(format!("corral-store-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let config = StoreConfig {
        path: Some(dir.join("bench.db").display().to_string()),
        channel_capacity: n,
        ..StoreConfig::default()
    };
    let cancel = CancellationToken::new();
    let (store, tasks) = Store::open(&config, cancel.clone()).await.expect("open store");
    let writer = tokio::spawn(tasks.writer);
    let start = Instant::now();
    let mut worst = std::time::Duration::ZERO;
    for i in 0..n {
        let row = RequestRow {
            id: format!("req-{i}"),
            started_at: corral::store::now_ms(),
            finished_at: Some(corral::store::now_ms()),
            endpoint: "/api/chat".into(),
            category: "default".into(),
            origin: "local".into(),
            model: "llama3.2:latest".into(),
            node: Some(format!("gpu{}", i % 3)),
            attempts: 1,
            status: "ok".into(),
            http_status: Some(200),
            total_ms: Some(40),
            ttfb_ms: Some(5),
            completion_tokens: Some(16),
            prompt_tokens: Some(32),
            streamed: true,
            ..RequestRow::default()
        };
        let t = Instant::now();
        store.finished(row);
        worst = worst.max(t.elapsed());
    }
    let handed = start.elapsed();
    cancel.cancel();
    writer.await.expect("writer");
    let total = start.elapsed();
    let rows = store.requests(&Query { limit: Some(n as i64 + 1), ..Query::default() }).await.expect("query").len();
    println!("records: {n}, written: {rows}, dropped: {}", store.dropped());
    println!(
        "hand-over: {:.1} ms total, worst single hand-over {:.1} us",
        handed.as_secs_f64() * 1e3,
        worst.as_secs_f64() * 1e6
    );
    println!(
        "writer: {:.0} records/s ({:.2} s to flush everything)",
        rows as f64 / total.as_secs_f64(),
        total.as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
