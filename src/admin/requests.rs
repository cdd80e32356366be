//! `/admin/requests`: the per-request metadata rows from the store (never prompt or output
//! text), filtered by time, node, category and status. Also `parse_since`, the one reading of
//! `since=`/`window=` values that the charts and the CLI share.

use axum::extract::{Query, State};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{AdminError, AdminState};

/// `since` as a duration back from now (`15m`, `2h`, `7d`, `30s`) or unix ms.
pub fn parse_since(since: &str) -> Option<i64> {
    let s = since.trim();
    if let Ok(ms) = s.parse::<i64>() {
        return Some(ms);
    }
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit())?);
    let n: i64 = num.parse().ok()?;
    let ms = match unit {
        "s" => n * 1_000,
        "m" => n * 60_000,
        "h" => n * 3_600_000,
        "d" => n * 86_400_000,
        _ => return None,
    };
    Some(crate::store::now_ms() - ms)
}

#[derive(Debug, Deserialize)]
pub(super) struct RequestsQuery {
    since: Option<String>,
    node: Option<String>,
    category: Option<String>,
    status: Option<String>,
    limit: Option<i64>,
}

/// `GET /admin/requests?since=&node=&category=&status=&limit=`.
pub(super) async fn list(
    State(s): State<AdminState>,
    Query(q): Query<RequestsQuery>,
) -> Result<Json<Value>, AdminError> {
    let Some(store) = s.shared.telemetry.store() else {
        return Err(AdminError::NotFound { kind: "request store (it is disabled)", name: "store".into() });
    };
    let since_ms = match &q.since {
        Some(v) => Some(
            parse_since(v)
                .ok_or_else(|| AdminError::BadBody(format!("since=\"{v}\" is not like 15m, 2h, 7d or unix ms")))?,
        ),
        None => None,
    };
    let query = crate::store::Query { since_ms, node: q.node, category: q.category, status: q.status, limit: q.limit };
    let rows = store.requests(&query).await?;
    Ok(Json(json!({ "requests": rows, "dropped_records": store.dropped() })))
}
