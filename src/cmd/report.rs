//! `corral report`: one page of charts (latency, time to first token, throughput, outcomes,
//! queue and node health) from the request store, as PNG or SVG. Reads the store read-only, so
//! it runs beside a live broker; the drawing is `corral::charts`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

pub async fn run(since: &str, out: &Path, db: Option<PathBuf>, config: Option<&Path>) -> ExitCode {
    let Some(from) = corral::admin::parse_since(since) else {
        eprintln!("error: --since {since} is not like 15m, 1h or 7d");
        return ExitCode::from(2);
    };
    let ext = out.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    if !matches!(ext.as_deref(), Some("png" | "svg")) {
        eprintln!("error: --out must end in .png or .svg");
        return ExitCode::from(2);
    }
    let db = match super::store_path(db, config) {
        Ok(p) => p,
        Err(code) => return code,
    };
    if !db.exists() {
        eprintln!("error: no request store at {}; has `corral serve` run? (or pass --db FILE)", db.display());
        return ExitCode::from(1);
    }
    match draw(&db, from, out).await {
        Ok(n) => {
            println!("wrote {} ({n} requests since {since})", out.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

/// Draw the charts for everything since `from` (ms); the number of requests they cover.
async fn draw(db: &Path, from: i64, out: &Path) -> Result<usize, String> {
    let pool = corral::store::open_pool(db, true).await.map_err(|e| e.to_string())?;
    let q = corral::store::Query { since_ms: Some(from), limit: Some(1_000_000), ..Default::default() };
    let rows = corral::store::query_requests(&pool, &q).await.map_err(|e| e.to_string())?;
    let events = corral::store::query_node_events(&pool, from).await.map_err(|e| e.to_string())?;
    let now = corral::store::now_ms();
    let buckets = corral::charts::Buckets::spanning(from, now, 60);
    let snap = corral::charts::Snapshot::build(&rows, &events, buckets, now, &[]);
    corral::charts::report(&snap, out).map_err(|e| e.to_string())?;
    Ok(snap.requests)
}
