//! `/admin/charts/{chart}.svg`: one chart of the recent past (latency, ttfb, throughput,
//! outcomes, queue, health), drawn by `crate::charts` from the store's rows and node events.
//! Sizes are clamped so a query cannot ask for an unbounded image.

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use http::header;
use serde::Deserialize;

use super::requests::parse_since;
use super::{AdminError, AdminState};

#[derive(Debug, Deserialize)]
pub(super) struct ChartQuery {
    window: Option<String>,
    width: Option<u32>,
    height: Option<u32>,
}

/// `GET /admin/charts/{chart}.svg?window=15m`: one chart of the recent past, from the store.
pub(super) async fn chart(
    State(s): State<AdminState>,
    Path(file): Path<String>,
    Query(q): Query<ChartQuery>,
) -> Result<Response, AdminError> {
    let name = file.strip_suffix(".svg").unwrap_or(&file);
    let chart = crate::charts::Chart::from_name(name).ok_or_else(|| AdminError::NotFound {
        kind: "chart (known: latency, ttfb, throughput, outcomes, queue, health)",
        name: name.to_string(),
    })?;
    let window = q.window.as_deref().unwrap_or("15m");
    let from =
        parse_since(window).ok_or_else(|| AdminError::BadBody(format!("window=\"{window}\" is not like 15m or 1h")))?;
    let store = s
        .shared
        .telemetry
        .store()
        .ok_or_else(|| AdminError::NotFound { kind: "request store (it is disabled)", name: "store".into() })?;
    let to = crate::store::now_ms();
    let rows = store
        .requests(&crate::store::Query { since_ms: Some(from), limit: Some(200_000), ..Default::default() })
        .await?;
    let events = store.node_events(from).await?;
    let snap = crate::charts::Snapshot::build(&rows, &events, from, to, 30);
    let size = (q.width.unwrap_or(640).clamp(200, 4000), q.height.unwrap_or(320).clamp(150, 4000));
    let svg = crate::charts::svg(chart, &snap, size)?;
    Ok(([(header::CONTENT_TYPE, "image/svg+xml")], svg).into_response())
}
