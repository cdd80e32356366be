//! The charts of the recent past, from the store's rows and node events, computed once by
//! `crate::charts::Snapshot`: `GET /admin/charts/series?range=15m` gives the bucketed numbers
//! as JSON (the UI draws its live charts from them), and `GET /admin/charts/{chart}.svg` the
//! same numbers drawn by plotters. A live window ends now: its last bucket also counts the
//! requests waiting in the queue this moment, and each node's health runs up to its state now.
//! Sizes are clamped so a query cannot ask for an unbounded image.

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::header;
use serde::Deserialize;

use super::requests::parse_since;
use super::{AdminError, AdminState};
use crate::charts::{Buckets, Snapshot};

/// The ranges the live charts offer, each with its bucket size: about 60 to 100 points a line.
pub const RANGES: [(&str, i64, usize); 4] =
    [("5m", 5_000, 60), ("15m", 15_000, 60), ("1h", 60_000, 60), ("24h", 900_000, 96)];

/// A request that ended in the window may have started before it (a long answer, a long
/// wait): rows are read from this much earlier.
const LOOKBACK_MS: i64 = 10 * 60_000;

/// Most rows one chart query reads.
const MAX_ROWS: i64 = 200_000;

/// `range=` as its buckets ending at `now_ms`; the error names the values there are.
pub fn range_buckets(range: &str, now_ms: i64) -> Result<Buckets, AdminError> {
    let known = || RANGES.iter().map(|r| r.0).collect::<Vec<_>>().join(", ");
    RANGES
        .iter()
        .find(|r| r.0 == range.trim())
        .map(|(_, step, count)| Buckets::ending_at(now_ms, *step, *count))
        .ok_or_else(|| {
            let shown: String = range.chars().take(40).collect();
            AdminError::BadQuery(format!("range={shown:?} is not a chart range; use one of {}", known()))
        })
}

/// The snapshot of `b`, up to now, with the live queue and node states; of `broker`'s requests
/// only when one is named (a fleet's store holds every broker's).
async fn snapshot(s: &AdminState, b: Buckets, now_ms: i64, broker: Option<String>) -> Result<Snapshot, AdminError> {
    let store = s
        .shared
        .telemetry
        .store()
        .ok_or_else(|| AdminError::NotFound { kind: "request store (it is disabled)", name: "store".into() })?;
    let since = b.from_ms - LOOKBACK_MS;
    let rows = store
        .requests(&crate::store::Query { since_ms: Some(since), limit: Some(MAX_ROWS), broker, ..Default::default() })
        .await?;
    let events = store.node_events(b.from_ms).await?;
    let current: Vec<(String, String)> =
        s.shared.registry.all().iter().map(|n| (n.name().to_string(), n.state().name().to_string())).collect();
    let mut snap = Snapshot::build(&rows, &events, b, now_ms, &current);
    // Requests still waiting have no row with their wait yet: the queue as it is now.
    if let Some(last) = snap.queue_depth.last_mut() {
        let now = s.shared.admission.depth() as f64;
        *last = Some(last.unwrap_or(0.0).max(now));
    }
    Ok(snap)
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub(super) struct SeriesQuery {
    range: Option<String>,
    /// Only this broker's requests; none: every broker's.
    broker: Option<String>,
}

/// `GET /admin/charts/series?range=5m|15m|1h|24h` (default 15m): every chart's numbers.
pub(super) async fn series(
    State(s): State<AdminState>,
    Query(q): Query<SeriesQuery>,
) -> Result<Json<serde_json::Value>, AdminError> {
    let range = q.range.as_deref().unwrap_or("15m");
    let now_ms = crate::store::now_ms();
    let broker = q.broker.filter(|b| !b.trim().is_empty());
    let snap = snapshot(&s, range_buckets(range, now_ms)?, now_ms, broker).await?;
    let mut body =
        serde_json::to_value(&snap).map_err(|e| AdminError::Chart(crate::charts::ChartError::Draw(e.to_string())))?;
    body["range"] = range.trim().into();
    body["ranges"] = RANGES.iter().map(|r| r.0).collect::<Vec<_>>().into();
    Ok(Json(body))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub(super) struct ChartQuery {
    window: Option<String>,
    width: Option<u32>,
    height: Option<u32>,
    /// Only this broker's requests; none: every broker's.
    broker: Option<String>,
}

/// `GET /admin/charts/{chart}.svg?window=15m`: one chart of the recent past, from the store.
pub(super) async fn chart(
    State(s): State<AdminState>,
    Path(file): Path<String>,
    Query(q): Query<ChartQuery>,
) -> Result<Response, AdminError> {
    let name = file.strip_suffix(".svg").unwrap_or(&file);
    let chart = crate::charts::Chart::from_name(name).ok_or_else(|| AdminError::NotFound {
        kind: "chart (known: latency, ttfb, throughput, outcomes, queue, health; or series for the numbers)",
        name: name.to_string(),
    })?;
    let window = q.window.as_deref().unwrap_or("15m");
    let from =
        parse_since(window).ok_or_else(|| AdminError::BadQuery(format!("window={window:?} is not like 15m or 1h")))?;
    let now_ms = crate::store::now_ms();
    let broker = q.broker.filter(|b| !b.trim().is_empty());
    let snap = snapshot(&s, Buckets::spanning(from, now_ms, 30), now_ms, broker).await?;
    let size = (q.width.unwrap_or(640).clamp(200, 4000), q.height.unwrap_or(320).clamp(150, 4000));
    let svg = crate::charts::svg(chart, &snap, size)?;
    Ok(([(header::CONTENT_TYPE, "image/svg+xml")], svg).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_the_four_offered_and_anything_else_is_a_clear_400() {
        let now = 1_700_000_123_456;
        for (name, step, count) in RANGES {
            let b = range_buckets(name, now).expect(name);
            assert_eq!((b.step_ms, b.count), (step, count), "{name}");
            assert!(b.from_ms <= now - step * (count as i64 - 1) && b.to_ms() > now, "{name} ends with now");
        }
        assert_eq!(range_buckets("24h", now).map(|b| b.step_ms * b.count as i64).ok(), Some(86_400_000));
        for bad in ["", "2x", "7d", "15", "-5m", "15m;drop"] {
            let e = range_buckets(bad, now).expect_err(bad);
            assert_eq!((e.code(), e.status().as_u16()), ("bad_query", 400), "{bad}");
            assert!(e.to_string().contains("5m, 15m, 1h, 24h"), "the message lists the ranges: {e}");
        }
    }
}
