//! `/admin/requests`: the request log from the store (metadata only, never prompt or output
//! text). The list is filtered by time, node, category, status, model and request id (or its
//! prefix) and paged honestly: every answer says how many rows match (`total`), whether there
//! are more (`more`) and where the next page starts (`next_before`, given back as `before=`).
//! `/admin/requests/{id}` is one request with its attempts in order; `/admin/requests/summary`
//! counts, errors, latency percentiles and tokens per model or per node over a range. Also
//! `parse_since`, the one reading of `since=`/`window=`/`range=` values that the charts and the
//! CLI share.

use std::collections::BTreeMap;

use axum::extract::{Path, Query, State};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::{AdminError, AdminState};
use crate::store::{Cursor, GroupBy, Sample, Store};

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

fn store_of(s: &AdminState) -> Result<&Store, AdminError> {
    s.shared
        .telemetry
        .store()
        .ok_or_else(|| AdminError::NotFound { kind: "request store (it is disabled)", name: "store".into() })
}

/// An empty query value (`node=`) means "any", as the UI sends it.
fn given(v: Option<String>) -> Option<String> {
    v.filter(|s| !s.trim().is_empty())
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub(super) struct RequestsQuery {
    since: Option<String>,
    node: Option<String>,
    category: Option<String>,
    status: Option<String>,
    model: Option<String>,
    /// A request id or its start (Corral's id or the client's `X-Request-Id`).
    id: Option<String>,
    /// Only this broker's requests (`store.broker`); none: every broker's.
    broker: Option<String>,
    /// The `next_before` of the page before.
    before: Option<String>,
    limit: Option<i64>,
}

impl RequestsQuery {
    fn into_query(self) -> Result<crate::store::Query, AdminError> {
        let since_ms = match given(self.since) {
            Some(v) => Some(
                parse_since(&v)
                    .ok_or_else(|| AdminError::BadQuery(format!("since=\"{v}\" is not like 15m, 2h, 7d or unix ms")))?,
            ),
            None => None,
        };
        let before = match given(self.before) {
            Some(v) => Some(Cursor::parse(&v).ok_or_else(|| {
                AdminError::BadQuery(format!(
                    "before=\"{v}\" is not a page cursor (take next_before from the last page)"
                ))
            })?),
            None => None,
        };
        if let Some(n) = self.limit.filter(|n| *n < 1) {
            // Not quietly read as 1: a page size the caller did not ask for is a silent cap.
            return Err(AdminError::BadQuery(format!("limit={n}: a page holds at least 1 request")));
        }
        Ok(crate::store::Query {
            since_ms,
            node: given(self.node),
            category: given(self.category),
            status: given(self.status),
            model: given(self.model),
            id: given(self.id),
            broker: given(self.broker),
            before,
            limit: self.limit,
        })
    }
}

/// `GET /admin/requests?since=&node=&category=&status=&model=&id=&broker=&before=&limit=`: newest first,
/// one page, with `total`, `more` and `next_before`.
pub(super) async fn list(
    State(s): State<AdminState>,
    Query(q): Query<RequestsQuery>,
) -> Result<Json<Value>, AdminError> {
    let store = store_of(&s)?;
    let page = crate::store::page_requests(store.pool(), &q.into_query()?).await?;
    Ok(Json(json!({
        "requests": page.rows,
        "total": page.total,
        "more": page.more,
        "next_before": page.next.map(|c| c.to_string()),
        "limit": page.limit,
        "dropped_records": store.dropped(),
    })))
}

/// `GET /admin/requests/{id}`: one request, with every attempt in order.
pub(super) async fn get(State(s): State<AdminState>, Path(id): Path<String>) -> Result<Json<Value>, AdminError> {
    let store = store_of(&s)?;
    let row = crate::store::request_by_id(store.pool(), &id)
        .await?
        .ok_or(AdminError::NotFound { kind: "request", name: id })?;
    let attempts = crate::store::attempts(&row);
    Ok(Json(json!({ "request": row, "attempts": attempts })))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub(super) struct SummaryQuery {
    range: Option<String>,
    by: Option<String>,
    /// Only this broker's requests; none: every broker's.
    broker: Option<String>,
}

/// Counts, errors, latency and tokens of one group of requests.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Group {
    /// The model, the node (`cloud:<provider>` for a provider), or none (nothing answered).
    pub key: Option<String>,
    /// Requests that ended.
    pub requests: u64,
    /// Those that failed on Corral's or a node's side (neither `ok` nor `client_error`).
    pub errors: u64,
    /// Those refused as the client's mistake (`client_error`).
    pub client_errors: u64,
    /// Total time percentiles (nearest rank, as the charts take them) over those with a time.
    pub p50_ms: Option<f64>,
    pub p95_ms: Option<f64>,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub tokens: i64,
}

impl Group {
    fn of(key: Option<String>, samples: &[&Sample]) -> Group {
        let mut times: Vec<f64> = samples.iter().filter_map(|s| s.total_ms).map(|v| v as f64).collect();
        times.sort_by(f64::total_cmp);
        let pct = |p: f64| (!times.is_empty()).then(|| crate::charts::percentile(&times, p));
        let prompt_tokens = samples.iter().filter_map(|s| s.prompt_tokens).sum::<i64>();
        let completion_tokens = samples.iter().filter_map(|s| s.completion_tokens).sum::<i64>();
        Group {
            key,
            requests: samples.len() as u64,
            errors: samples.iter().filter(|s| s.status != "ok" && s.status != "client_error").count() as u64,
            client_errors: samples.iter().filter(|s| s.status == "client_error").count() as u64,
            p50_ms: pct(50.0),
            p95_ms: pct(95.0),
            prompt_tokens,
            completion_tokens,
            tokens: prompt_tokens + completion_tokens,
        }
    }
}

/// One [`Group`] per key, the busiest first, and one of everything together.
pub fn summarize(samples: &[Sample]) -> (Vec<Group>, Group) {
    let mut by_key: BTreeMap<Option<&str>, Vec<&Sample>> = BTreeMap::new();
    for s in samples {
        by_key.entry(s.key.as_deref()).or_default().push(s);
    }
    let mut groups: Vec<Group> = by_key.into_iter().map(|(k, v)| Group::of(k.map(str::to_string), &v)).collect();
    groups.sort_by(|a, b| b.requests.cmp(&a.requests).then_with(|| a.key.cmp(&b.key)));
    let all: Vec<&Sample> = samples.iter().collect();
    (groups, Group::of(None, &all))
}

/// `GET /admin/requests/summary?range=1h&by=model|node`: per model or per node, the requests
/// that started in the range and have ended.
pub(super) async fn summary(
    State(s): State<AdminState>,
    Query(q): Query<SummaryQuery>,
) -> Result<Json<Value>, AdminError> {
    let store = store_of(&s)?;
    let range = given(q.range).unwrap_or_else(|| "1h".into());
    let since = parse_since(&range)
        .ok_or_else(|| AdminError::BadQuery(format!("range=\"{range}\" is not like 5m, 15m, 1h or 24h")))?;
    let by = match given(q.by).as_deref() {
        None | Some("model") => GroupBy::Model,
        Some("node") => GroupBy::Node,
        Some(other) => return Err(AdminError::BadQuery(format!("by=\"{other}\" is not model or node"))),
    };
    let broker = given(q.broker);
    let samples = crate::store::samples(store.pool(), since, by, broker.as_deref()).await?;
    let (groups, all) = summarize(&samples);
    Ok(Json(json!({ "range": range, "since": since, "by": by, "groups": groups, "all": all })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(key: &str, status: &str, total_ms: i64, tokens: (i64, i64)) -> Sample {
        Sample {
            key: Some(key.into()),
            status: status.into(),
            total_ms: Some(total_ms),
            prompt_tokens: Some(tokens.0),
            completion_tokens: Some(tokens.1),
        }
    }

    #[test]
    fn a_summary_counts_each_group_and_everything_together() {
        let mut samples: Vec<Sample> = (1..=10).map(|i| sample("a", "ok", i * 10, (1, i))).collect();
        samples.push(sample("b", "error", 500, (0, 0)));
        samples.push(sample("b", "client_error", 5, (0, 0)));
        samples.push(Sample { key: Some("b".into()), status: "cancelled".into(), ..Sample::default() });
        let (groups, all) = summarize(&samples);
        assert_eq!(groups.iter().map(|g| g.key.as_deref()).collect::<Vec<_>>(), [Some("a"), Some("b")]);
        let a = &groups[0];
        assert_eq!((a.requests, a.errors, a.client_errors), (10, 0, 0));
        // Nearest rank over 10, 20, ... 100: index round(0.5 * 9) = 5 and round(0.95 * 9) = 9.
        assert_eq!((a.p50_ms, a.p95_ms), (Some(60.0), Some(100.0)));
        assert_eq!((a.prompt_tokens, a.completion_tokens, a.tokens), (10, 55, 65));
        let b = &groups[1];
        assert_eq!((b.requests, b.errors, b.client_errors), (3, 2, 1), "a cancelled request is no success");
        assert_eq!(b.p50_ms, Some(500.0), "only requests with a time count for latency");
        assert_eq!((all.requests, all.errors, all.tokens), (13, 2, 65));
        assert_eq!(summarize(&[]).1.p50_ms, None, "no latency without requests");
    }
}
