//! `corral report`: one page of charts (latency, time to first token, throughput, outcomes,
//! queue and node health) from the request store, as PNG or SVG. Reads the store read-only, so
//! it runs beside a live broker; with `store.url` the fleet's PostgreSQL, every broker's
//! requests or one's (`--broker`). The drawing is `corral::charts`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Where the report reads and what it covers: the store (`--db`, `--config`) and `--broker`.
pub struct Source {
    pub db: Option<PathBuf>,
    pub config: Option<PathBuf>,
    pub broker: Option<String>,
}

pub async fn run(since: &str, out: &Path, source: Source) -> ExitCode {
    let Some(from) = corral::admin::parse_since(since) else {
        eprintln!("error: --since {since} is not like 15m, 1h or 7d");
        return ExitCode::from(2);
    };
    let ext = out.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    if !matches!(ext.as_deref(), Some("png" | "svg")) {
        eprintln!("error: --out must end in .png or .svg");
        return ExitCode::from(2);
    }
    let at = match super::records_at(source.db, source.config.as_deref()) {
        Ok(at) => at,
        Err(code) => return code,
    };
    match draw(&at, from, source.broker, out).await {
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

/// Draw the charts for everything since `from` (ms), of `broker`'s requests when one is named;
/// the number of requests they cover.
async fn draw(at: &super::Records, from: i64, broker: Option<String>, out: &Path) -> Result<usize, String> {
    let pool = super::open_records(at).await?;
    let q = corral::store::Query { since_ms: Some(from), limit: Some(1_000_000), broker, ..Default::default() };
    let rows = corral::store::query_requests(&pool, &q).await.map_err(|e| e.to_string())?;
    let events = corral::store::query_node_events(&pool, from).await.map_err(|e| e.to_string())?;
    let now = corral::store::now_ms();
    let buckets = corral::charts::Buckets::spanning(from, now, 60);
    let snap = corral::charts::Snapshot::build(&rows, &events, buckets, now, &[]);
    corral::charts::report(&snap, out).map_err(|e| e.to_string())?;
    Ok(snap.requests)
}
