//! Finding requests in the log, paging through it honestly, and the attempts of one request.
//!
//! Filters: time, node, category, status, model (asked or answered), and a request id or its
//! prefix (Corral's id or the client's `X-Request-Id`). Rows come newest first, `started_at DESC,
//! id ASC`, the order `query_requests` has always used. A page is a keyset page: its cursor
//! (`<started_at>.<id>`) names the last row it holds, and the next page starts strictly after
//! that row, so rows written meanwhile never shift a page or repeat a row. A page says how many
//! rows match in all (`total`) and whether there are more, so a caller never meets a silent cap.
//! The rows and the count are read in one transaction, so they agree.
//!
//! Each query is one SQL text for both engines (`$N` placeholders, which SQLite takes too, and
//! `LOWER(..) LIKE` so a prefix matches alike on both); [`on_engine!`] runs it on the engine's own
//! pool, so the SQLite path is what it was, with no driver in between. `broker=` picks one
//! broker's rows out of a fleet's; without it a query covers the whole fleet.

use serde::{Deserialize, Serialize};
use sqlx::{ColumnIndex, Database, Decode, Encode, QueryBuilder, Row, Type};

use super::{Pool, Query, RequestRow, StoreError};

/// Where a page ends: the last row it holds. Written `<started_at>.<id>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    pub started_at: i64,
    pub id: String,
}

impl Cursor {
    /// The cursor that starts the page after `row`.
    pub fn after(row: &RequestRow) -> Cursor {
        Cursor { started_at: row.started_at, id: row.id.clone() }
    }

    /// `<started_at>.<id>` as [`Cursor`]'s `Display` writes it; `None` for anything else.
    pub fn parse(s: &str) -> Option<Cursor> {
        let (at, id) = s.trim().split_once('.')?;
        let started_at = at.parse().ok()?;
        (!id.is_empty()).then(|| Cursor { started_at, id: id.to_string() })
    }
}

impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.started_at, self.id)
    }
}

/// One page of the log, newest first.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Page {
    pub rows: Vec<RequestRow>,
    /// Rows matching the filters on every page together (the cursor aside).
    pub total: i64,
    /// Whether older rows match too.
    pub more: bool,
    /// Where the next page starts, when there is one.
    pub next: Option<Cursor>,
    /// The most rows a page holds, as applied.
    pub limit: i64,
}

/// The columns of a [`RequestRow`], in its field order.
pub(super) const ROW_COLUMNS: &str = "id, started_at, finished_at, endpoint, category, origin, model, node, attempts, \
     fallback, status, http_status, error_code, queued_ms, ttfb_ms, total_ms, prompt_tokens, completion_tokens, \
     streamed, interrupted, client_request_id, answered_model, failed_attempts, continued_by, generation_us, node_done_ms, estimate_ms, \
     broker";

/// The page size `q` asks for: 1000 unless it says, within 1 and a million.
pub fn limit_of(q: &Query) -> i64 {
    q.limit.unwrap_or(1000).clamp(1, 1_000_000)
}

/// `s` as a LIKE pattern matching every text that starts with it (`%`, `_` and `\` taken
/// literally).
fn prefix_pattern(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 1);
    for c in s.chars() {
        if matches!(c, '\\' | '%' | '_') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('%');
    out
}

/// ` WHERE ...` for `q`'s filters; with `cursor`, also "after `q.before`".
fn push_filters<'a, DB: Database>(b: &mut QueryBuilder<'a, DB>, q: &Query, cursor: bool)
where
    i64: Encode<'a, DB> + Type<DB>,
    String: Encode<'a, DB> + Type<DB>,
{
    b.push(" WHERE started_at >= ").push_bind(q.since_ms.unwrap_or(0));
    let exact = [("node", &q.node), ("category", &q.category), ("status", &q.status), ("broker", &q.broker)];
    for (column, value) in exact {
        if let Some(v) = value {
            b.push(format!(" AND {column} = ")).push_bind(v.clone());
        }
    }
    if let Some(m) = &q.model {
        b.push(" AND (model = ").push_bind(m.clone()).push(" OR answered_model = ").push_bind(m.clone()).push(")");
    }
    if let Some(id) = q.id.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
        // SQLite's LIKE ignores ASCII case and PostgreSQL's does not: LOWER on both sides.
        let pattern = prefix_pattern(&id.to_lowercase());
        b.push(" AND (LOWER(id) LIKE ").push_bind(pattern.clone()).push(" ESCAPE '\\'");
        b.push(" OR LOWER(client_request_id) LIKE ").push_bind(pattern).push(" ESCAPE '\\')");
    }
    if let (true, Some(c)) = (cursor, &q.before) {
        b.push(" AND (started_at < ").push_bind(c.started_at);
        b.push(" OR (started_at = ").push_bind(c.started_at).push(" AND id > ").push_bind(c.id.clone()).push("))");
    }
}

/// `SELECT` of up to `limit` rows `q` selects, after its cursor, newest first.
fn push_select<'a, DB: Database>(b: &mut QueryBuilder<'a, DB>, q: &Query, limit: i64)
where
    i64: Encode<'a, DB> + Type<DB>,
    String: Encode<'a, DB> + Type<DB>,
{
    b.push(format_args!("SELECT {ROW_COLUMNS} FROM requests"));
    push_filters(b, q, true);
    b.push(" ORDER BY started_at DESC, id LIMIT ").push_bind(limit);
}

/// `SELECT COUNT(*) AS n` of the rows `q`'s filters match, the cursor aside.
fn push_count<'a, DB: Database>(b: &mut QueryBuilder<'a, DB>, q: &Query)
where
    i64: Encode<'a, DB> + Type<DB>,
    String: Encode<'a, DB> + Type<DB>,
{
    b.push("SELECT COUNT(*) AS n FROM requests");
    push_filters(b, q, false);
}

/// The rows `q` selects, newest first, at most [`limit_of`] of them.
pub async fn query_requests(pool: &Pool, q: &Query) -> Result<Vec<RequestRow>, StoreError> {
    Ok(on_engine!(Pool, pool, |p| {
        let mut b = QueryBuilder::default();
        push_select(&mut b, q, limit_of(q));
        b.build().fetch_all(p).await?.iter().map(row_of).collect()
    }))
}

/// How many rows `q`'s filters match in all (its cursor and limit aside).
pub async fn count_requests(pool: &Pool, q: &Query) -> Result<i64, StoreError> {
    Ok(on_engine!(Pool, pool, |p| {
        let mut b = QueryBuilder::default();
        push_count(&mut b, q);
        b.build().fetch_one(p).await?.get("n")
    }))
}

/// One page of what `q` selects: its rows, how many match in all, and where the next page starts.
pub async fn page_requests(pool: &Pool, q: &Query) -> Result<Page, StoreError> {
    let limit = limit_of(q);
    let (mut rows, total): (Vec<RequestRow>, i64) = on_engine!(Pool, pool, |p| {
        let mut tx = p.begin().await?;
        // One more than a page: whether it comes back says whether there are more.
        let mut b = QueryBuilder::default();
        push_select(&mut b, q, limit + 1);
        let rows = b.build().fetch_all(&mut *tx).await?.iter().map(row_of).collect();
        let mut b = QueryBuilder::default();
        push_count(&mut b, q);
        let total = b.build().fetch_one(&mut *tx).await?.get("n");
        tx.commit().await?;
        (rows, total)
    });
    let more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    let next = if more { rows.last().map(Cursor::after) } else { None };
    Ok(Page { rows, total, more, next, limit })
}

/// The request with Corral's id `id`, if the store has it.
pub async fn request_by_id(pool: &Pool, id: &str) -> Result<Option<RequestRow>, StoreError> {
    let sql = format!("SELECT {ROW_COLUMNS} FROM requests WHERE id = $1");
    Ok(on_engine!(Pool, pool, |p| sqlx::query(&sql).bind(id).fetch_optional(p).await?.as_ref().map(row_of)))
}

/// A row of `ROW_COLUMNS` as a [`RequestRow`], from either engine (the flags are INTEGER 0/1 on
/// SQLite and BOOLEAN on PostgreSQL; both decode as `bool`).
pub(super) fn row_of<R: Row>(r: &R) -> RequestRow
where
    &'static str: ColumnIndex<R>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> bool: Decode<'r, R::Database> + Type<R::Database>,
{
    RequestRow {
        id: r.get("id"),
        started_at: r.get("started_at"),
        finished_at: r.get("finished_at"),
        endpoint: r.get("endpoint"),
        category: r.get("category"),
        origin: r.get("origin"),
        model: r.get("model"),
        node: r.get("node"),
        attempts: r.get("attempts"),
        fallback: r.get("fallback"),
        status: r.get("status"),
        http_status: r.get("http_status"),
        error_code: r.get("error_code"),
        queued_ms: r.get("queued_ms"),
        ttfb_ms: r.get("ttfb_ms"),
        total_ms: r.get("total_ms"),
        prompt_tokens: r.get("prompt_tokens"),
        completion_tokens: r.get("completion_tokens"),
        streamed: r.get("streamed"),
        interrupted: r.get("interrupted"),
        client_request_id: r.get("client_request_id"),
        answered_model: r.get("answered_model"),
        failed_attempts: r
            .get::<Option<String>, _>("failed_attempts")
            .and_then(|j| serde_json::from_str(&j).ok())
            .unwrap_or_default(),
        continued_by: r.get("continued_by"),
        generation_us: r.get("generation_us"),
        node_done_ms: r.get("node_done_ms"),
        estimate_ms: r.get("estimate_ms"),
        broker: r.get("broker"),
    }
}

/// What requests are grouped by in a summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupBy {
    /// The model asked for.
    Model,
    /// The node that answered; `cloud:<provider>` when a provider did; none when nothing did.
    Node,
}

impl GroupBy {
    fn key(self) -> &'static str {
        match self {
            GroupBy::Model => "model",
            GroupBy::Node => "COALESCE(node, 'cloud:' || fallback)",
        }
    }
}

/// What a summary needs of one ended request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sample {
    pub key: Option<String>,
    pub status: String,
    pub total_ms: Option<i64>,
    pub prompt_tokens: Option<i64>,
    pub completion_tokens: Option<i64>,
}

/// Every request that started at or after `since_ms` and has ended, keyed by `by`; only
/// `broker`'s when one is named.
pub async fn samples(pool: &Pool, since_ms: i64, by: GroupBy, broker: Option<&str>) -> Result<Vec<Sample>, StoreError> {
    let sql = format!(
        "SELECT {} AS key, status, total_ms, prompt_tokens, completion_tokens FROM requests \
         WHERE started_at >= $1 AND status != 'running' AND ($2 IS NULL OR broker = $2)",
        by.key()
    );
    Ok(on_engine!(Pool, pool, |p| sqlx::query(&sql)
        .bind(since_ms)
        .bind(broker)
        .fetch_all(p)
        .await?
        .iter()
        .map(|r| Sample {
            key: r.get("key"),
            status: r.get("status"),
            total_ms: r.get("total_ms"),
            prompt_tokens: r.get("prompt_tokens"),
            completion_tokens: r.get("completion_tokens"),
        })
        .collect()))
}

/// One try at answering a request, as the log knows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Attempt {
    /// 1 for the first, in the order they happened.
    pub n: usize,
    /// The node it went to (none for a cloud provider).
    pub node: Option<String>,
    /// The cloud provider it went to.
    pub provider: Option<String>,
    /// The model that answered, when it is not the one asked for.
    pub model: Option<String>,
    /// How it ended: an `Outcome` name for a failed one (`silent`, `failed`, `busy`...), the
    /// request's status for the one that ended it, `cut` for a stream another node continued.
    pub outcome: String,
    /// What went wrong, in words, when something did.
    pub detail: Option<String>,
    pub http_status: Option<i64>,
    pub error_code: Option<String>,
    pub ttfb_ms: Option<i64>,
    pub total_ms: Option<i64>,
}

/// Every attempt of `row`, in order: the failed ones as recorded, then the one that ended the
/// request (the node or provider that answered, or the answer still running), then the node that
/// continued a cut stream. A request refused before it reached a node has none. When every
/// attempt failed, the last failed one is the last attempt; the row's status says how it ended.
pub fn attempts(row: &RequestRow) -> Vec<Attempt> {
    let mut out: Vec<Attempt> = row
        .failed_attempts
        .iter()
        .map(|f| Attempt {
            node: Some(f.node.clone()),
            outcome: f.outcome.clone(),
            detail: (!f.detail.is_empty()).then(|| f.detail.clone()),
            ..Attempt::default()
        })
        .collect();
    let ended = Attempt {
        outcome: row.status.clone(),
        http_status: row.http_status,
        error_code: row.error_code.clone(),
        ttfb_ms: row.ttfb_ms,
        total_ms: row.total_ms,
        ..Attempt::default()
    };
    if let Some(provider) = &row.fallback {
        out.push(Attempt { provider: Some(provider.clone()), model: row.answered_model.clone(), ..ended });
    } else if let Some(node) = row.node.as_ref().filter(|_| (out.len() as i64) < row.attempts) {
        match &row.continued_by {
            Some(by) => {
                let detail = Some(format!("the stream broke; {by} continued the answer"));
                out.push(Attempt { node: Some(node.clone()), outcome: "cut".into(), detail, ..Attempt::default() });
                out.push(Attempt { node: Some(by.clone()), ..ended });
            }
            None => out.push(Attempt { node: Some(node.clone()), ..ended }),
        }
    }
    for (i, a) in out.iter_mut().enumerate() {
        a.n = i + 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::FailedAttempt;

    fn failed(node: &str, outcome: &str) -> FailedAttempt {
        FailedAttempt { node: node.into(), outcome: outcome.into(), detail: format!("{node} said no") }
    }

    #[test]
    fn a_cursor_reads_back_what_it_writes() {
        let c = Cursor { started_at: 1_700_000_000_123, id: "3f0c-aa".into() };
        assert_eq!(Cursor::parse(&c.to_string()), Some(c));
        for bad in ["", "12", "x.y", "12.", ".abc"] {
            assert_eq!(Cursor::parse(bad), None, "{bad:?} is no cursor");
        }
    }

    #[test]
    fn a_prefix_pattern_takes_like_wildcards_literally() {
        assert_eq!(prefix_pattern("ab"), "ab%");
        assert_eq!(prefix_pattern("a%_\\"), "a\\%\\_\\\\%");
    }

    #[test]
    fn the_attempts_of_a_request_answered_after_failures_end_with_the_answer() {
        let row = RequestRow {
            node: Some("n2".into()),
            attempts: 3,
            status: "ok".into(),
            http_status: Some(200),
            ttfb_ms: Some(12),
            total_ms: Some(40),
            failed_attempts: vec![failed("n0", "failed"), failed("n1", "silent")],
            ..RequestRow::default()
        };
        let a = attempts(&row);
        let seen: Vec<(usize, Option<&str>, &str)> =
            a.iter().map(|a| (a.n, a.node.as_deref(), a.outcome.as_str())).collect();
        assert_eq!(seen, [(1, Some("n0"), "failed"), (2, Some("n1"), "silent"), (3, Some("n2"), "ok")]);
        assert_eq!(a[0].detail.as_deref(), Some("n0 said no"));
        assert_eq!((a[2].ttfb_ms, a[2].total_ms, a[2].http_status), (Some(12), Some(40), Some(200)));
    }

    #[test]
    fn when_every_attempt_failed_the_last_failure_is_the_last_attempt() {
        let row = RequestRow {
            node: Some("n1".into()),
            attempts: 2,
            status: "error".into(),
            failed_attempts: vec![failed("n0", "failed"), failed("n1", "failed")],
            ..RequestRow::default()
        };
        assert_eq!(attempts(&row).len(), 2, "no made-up third attempt");
    }

    #[test]
    fn a_cloud_answer_and_a_continued_stream_are_attempts_of_their_own() {
        let cloud = RequestRow {
            attempts: 2,
            status: "ok".into(),
            fallback: Some("openai".into()),
            answered_model: Some("gpt-4o-mini".into()),
            failed_attempts: vec![failed("n0", "failed")],
            ..RequestRow::default()
        };
        let a = attempts(&cloud);
        assert_eq!(
            (a[1].provider.as_deref(), a[1].model.as_deref(), a[1].node.as_deref()),
            (Some("openai"), Some("gpt-4o-mini"), None)
        );
        let continued = RequestRow {
            node: Some("n0".into()),
            attempts: 1,
            status: "ok".into(),
            continued_by: Some("n1".into()),
            ..RequestRow::default()
        };
        let continued = attempts(&continued);
        let outcomes: Vec<(Option<&str>, &str)> =
            continued.iter().map(|a| (a.node.as_deref(), a.outcome.as_str())).collect();
        assert_eq!(outcomes, [(Some("n0"), "cut"), (Some("n1"), "ok")]);
        let refused = RequestRow { attempts: 0, status: "client_error".into(), ..RequestRow::default() };
        assert!(attempts(&refused).is_empty(), "a request no node saw has no attempt");
    }
}
