//! The store's one writer: it drains the record channel in batches, one transaction each, and
//! keeps a batch it could not write.
//!
//! A batch is whatever arrived within [`BATCH_LINGER`] of its first record, at most
//! [`BATCH_MAX`]. A request that started and finished in one batch gets only its finished row;
//! a started row never overwrites a finished one (`ON CONFLICT DO NOTHING`), so batches may
//! arrive in any split. Rollups are summed per (minute, node) in memory, one upsert per group.
//!
//! When a write fails because the database is away or busy (an outage of the fleet's
//! PostgreSQL, a locked SQLite file), the writer keeps the batch and tries it again, after
//! [`RETRY_FIRST`] doubling to [`RETRY_MAX`], and reads nothing more meanwhile: the channel
//! (`store.channel_capacity`) and the batch in hand are the outage's bounded buffer. The request
//! path keeps handing over with `try_send`, so a full buffer drops and counts, never blocks.
//! Once the database answers, the kept batch goes first and the channel after it, in order. A
//! write the database refuses (a constraint, a bad statement) is logged and the batch let go, as
//! retrying would not help. Cancelled while the database is away, the writer says how many
//! records it could not write and stops.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{now_ms, NodeEventRow, Pool, Record, RequestRow, Started};

/// How long the writer waits for more records before writing a batch. Each transaction has a
/// cost of its own (the WAL frames of every b-tree page it touched, the round trips to sqlx's
/// thread): side by side at 15k requests a second, 100 ms cost 2-3 us less CPU per request
/// than 20 ms (five interleaved rounds, issue 16), and resident memory after warm-up stayed
/// the same. Records still reach the store within a tenth of a second, and a channel filling
/// past half cuts the wait short.
const BATCH_LINGER: Duration = Duration::from_millis(100);
/// The most records in one batch (one transaction).
pub(super) const BATCH_MAX: usize = 2048;
/// The first wait before a failed batch is tried again; each failure doubles it, up to
/// [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(2);

/// A write that failed, as status shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WriteError {
    pub message: String,
    /// When it failed (unix ms).
    pub at_ms: i64,
}

/// What the writer tells status: the batch it holds and how the last write went.
#[derive(Debug, Default)]
pub(super) struct Health {
    /// Records in the batch being written or kept for a retry.
    held: AtomicUsize,
    last_error: Mutex<Option<WriteError>>,
    /// Rung by the request path when the channel is more than half full: the writer stops
    /// lingering and writes.
    pressure: tokio::sync::Notify,
}

impl Health {
    pub(super) fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    pub(super) fn last_error(&self) -> Option<WriteError> {
        self.last_error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn failed(&self, e: &sqlx::Error) {
        let error = WriteError { message: e.to_string(), at_ms: now_ms() };
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(error);
    }

    fn succeeded(&self) {
        let mut last = self.last_error.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some() {
            *last = None;
        }
    }
}

/// What the writer task owns.
pub(super) struct Writer {
    pub(super) pool: Pool,
    /// This broker's name, written on every row.
    pub(super) broker: Arc<str>,
    pub(super) dropped: Arc<AtomicU64>,
    pub(super) health: Arc<Health>,
}

/// Drain the channel in batches, one transaction each, until cancelled and empty.
pub(super) async fn run(w: Writer, mut rx: mpsc::Receiver<Record>, cancel: CancellationToken) {
    let mut written_drops = 0u64;
    let mut conn = None;
    while let Some(batch) = next_batch(&mut rx, &w.health, &cancel).await {
        w.health.held.store(batch.len(), Ordering::Relaxed);
        let Some(drops) = w.write_until_done(&mut conn, &batch, written_drops, &cancel).await else {
            // Cancelled with the database away: say what is lost, and stop.
            rx.close();
            let mut left = batch.len();
            while rx.try_recv().is_ok() {
                left += 1;
            }
            tracing::error!(records = left, "the request store is unreachable at shutdown: records not written");
            break;
        };
        written_drops = drops;
        w.health.held.store(0, Ordering::Relaxed);
    }
    tracing::debug!("store writer stopped");
}

/// The next batch: the first record, then what follows within [`BATCH_LINGER`]. `None` once
/// cancelled and empty.
///
/// The writer sleeps through the linger and takes what arrived in one go, rather than waking
/// for each record: at thousands of requests a second a wake per record was a measurable
/// share of the broker's CPU. A channel filling past half wakes it early
/// ([`offer`]), so a small `store.channel_capacity` never overflows while it
/// sleeps.
async fn next_batch(
    rx: &mut mpsc::Receiver<Record>,
    health: &Health,
    cancel: &CancellationToken,
) -> Option<Vec<Record>> {
    let first = tokio::select! {
        r = rx.recv() => r,
        _ = cancel.cancelled() => {
            // Flush what is queued, then stop.
            rx.close();
            rx.recv().await
        }
    }?;
    let mut batch = vec![first];
    let linger = tokio::time::Instant::now() + BATCH_LINGER;
    drain(rx, &mut batch);
    if batch.len() < BATCH_MAX && !cancel.is_cancelled() {
        // Linger briefly so a steady trickle becomes one transaction, not one per record.
        tokio::select! {
            _ = tokio::time::sleep_until(linger) => {}
            _ = health.pressure.notified() => {}
            _ = cancel.cancelled() => {}
        }
        drain(rx, &mut batch);
    }
    Some(batch)
}

/// Hand `r` to the writer without waiting; `false` when the channel is full. Past half full
/// it cuts the writer's linger short.
pub(super) fn offer(tx: &mpsc::Sender<Record>, health: &Health, r: Record) -> bool {
    if tx.try_send(r).is_err() {
        return false;
    }
    if tx.capacity() * 2 < tx.max_capacity() {
        health.pressure.notify_one();
    }
    true
}

/// Move what the channel holds now into `batch`, up to [`BATCH_MAX`].
fn drain(rx: &mut mpsc::Receiver<Record>, batch: &mut Vec<Record>) {
    while batch.len() < BATCH_MAX {
        match rx.try_recv() {
            Ok(r) => batch.push(r),
            Err(_) => break,
        }
    }
}

impl Writer {
    /// Write `batch` (with the drops counted since `written_drops`), trying again while the
    /// database is away. The drop total now written, or `None` when cancelled before the batch
    /// could be written.
    /// `conn` is the writer's own connection, kept from batch to batch (see [`Conn`]) and let
    /// go after a failed write, so the next try starts on a sound one.
    async fn write_until_done(
        &self,
        conn: &mut Option<Conn>,
        batch: &[Record],
        written_drops: u64,
        cancel: &CancellationToken,
    ) -> Option<u64> {
        let mut wait = RETRY_FIRST;
        let mut failures = 0u32;
        loop {
            let now_dropped = self.dropped.load(Ordering::Relaxed);
            let written = match conn {
                Some(c) => write_batch(c, batch, &self.broker, now_dropped - written_drops).await,
                None => match Conn::acquire(&self.pool).await {
                    Ok(c) => write_batch(conn.insert(c), batch, &self.broker, now_dropped - written_drops).await,
                    Err(e) => Err(e),
                },
            };
            let e = match written {
                Ok(()) => {
                    if failures > 0 {
                        tracing::info!(failures, records = batch.len(), "request store writes again");
                    }
                    self.health.succeeded();
                    return Some(now_dropped);
                }
                Err(e) => e,
            };
            *conn = None;
            self.health.failed(&e);
            if !transient(&e) {
                tracing::error!(error = %e, records = batch.len(), "request store write failed");
                return Some(written_drops);
            }
            if failures == 0 {
                tracing::error!(error = %e, records = batch.len(), "request store write failed; keeping the batch and trying again");
            } else {
                tracing::debug!(error = %e, failures, "request store write failed again");
            }
            failures += 1;
            if cancel.is_cancelled() {
                return None;
            }
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = cancel.cancelled() => {}
            }
            wait = (wait * 2).min(RETRY_MAX);
        }
    }
}

/// Whether a failed write may succeed when tried again: the database was away, busy or out
/// of room, not refusing these records. PostgreSQL's SQLSTATE classes 08 (connection), 40
/// (rolled back), 53 (resources), 57 (operator: shutting down) and 58 (system); SQLite's BUSY,
/// LOCKED, IOERR, FULL and CANTOPEN.
fn transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(d) => match d.code() {
            Some(code) => match code.parse::<i32>() {
                Ok(sqlite) => matches!(sqlite & 0xff, 5 | 6 | 10 | 13 | 14),
                Err(_) => ["08", "40", "53", "57", "58"].iter().any(|class| code.starts_with(class)),
            },
            None => false,
        },
        _ => false,
    }
}

/// The writer's own connection, held from one batch to the next. Taking a pooled connection
/// per batch handed the writer each of SQLite's connections in turn, and a connection finding
/// the file changed by another empties its page cache: every batch began by reading the
/// table's and indexes' right edges back from the WAL (a `pread` for every two records in
/// `strace`), and the two connections' threads both stayed busy (issue 16).
enum Conn {
    Sqlite(sqlx::pool::PoolConnection<sqlx::Sqlite>),
    Postgres(sqlx::pool::PoolConnection<sqlx::Postgres>),
}

impl Conn {
    async fn acquire(pool: &Pool) -> Result<Conn, sqlx::Error> {
        Ok(match pool {
            Pool::Sqlite(p) => Conn::Sqlite(p.acquire().await?),
            Pool::Postgres(p) => Conn::Postgres(p.acquire().await?),
        })
    }
}

/// The writer's transaction, on either engine.
enum Tx<'c> {
    Sqlite(sqlx::Transaction<'c, sqlx::Sqlite>),
    Postgres(sqlx::Transaction<'c, sqlx::Postgres>),
}

/// Per (minute, node): requests, errors, total ms, ttfb ms, completion tokens.
type Rollups<'a> = foldhash::HashMap<(i64, &'a str), [i64; 5]>;

async fn write_batch(conn: &mut Conn, batch: &[Record], broker: &str, new_drops: u64) -> Result<(), sqlx::Error> {
    let mut started: Vec<&Started> = Vec::new();
    let mut finished: Vec<&RequestRow> = Vec::new();
    let mut events: Vec<&NodeEventRow> = Vec::new();
    for r in batch {
        match r {
            Record::Started(s) => started.push(s),
            Record::Finished(row) => finished.push(row),
            Record::NodeEvent(e) => events.push(e),
        }
    }
    // A request that started and finished within one batch needs only its finished row.
    let done: foldhash::HashSet<&str> = finished.iter().map(|r| r.id.as_str()).collect();
    started.retain(|s| !done.contains(s.id.as_str()));
    let rollups = rollups_of(&finished);
    let mut tx = match conn {
        Conn::Sqlite(c) => Tx::Sqlite(sqlx::Connection::begin(&mut **c).await?),
        Conn::Postgres(c) => Tx::Postgres(sqlx::Connection::begin(&mut **c).await?),
    };
    insert_started(&mut tx, &started, broker).await?;
    upsert_finished(&mut tx, &finished, broker).await?;
    insert_events(&mut tx, &events, broker).await?;
    upsert_rollups(&mut tx, rollups).await?;
    if new_drops > 0 {
        let sql = "INSERT INTO dropped_records (at, broker, count) VALUES ($1, $2, $3)";
        let count = i64::try_from(new_drops).unwrap_or(i64::MAX);
        on_engine!(Tx, &mut tx, |t| sqlx::query(sql)
            .bind(now_ms())
            .bind(broker)
            .bind(count)
            .execute(&mut **t)
            .await?
            .rows_affected());
    }
    on_engine!(Tx, tx, |t| t.commit().await)
}

/// Rollups are summed per (minute, node) in memory: one upsert per group, not per row.
fn rollups_of<'a>(finished: &[&'a RequestRow]) -> Rollups<'a> {
    let mut rollups = Rollups::default();
    for row in finished {
        if let Some(node) = &row.node {
            let minute = row.finished_at.unwrap_or(row.started_at) / 60_000;
            let sums = rollups.entry((minute, node.as_str())).or_default();
            sums[0] += 1;
            sums[1] += i64::from(row.status != "ok" && row.status != "client_error");
            sums[2] += row.total_ms.unwrap_or(0);
            sums[3] += row.ttfb_ms.unwrap_or(0);
            sums[4] += row.completion_tokens.unwrap_or(0);
        }
    }
    rollups
}

/// The most rows in one multi-row statement.
const CHUNK: usize = 64;

/// `rows` cut into statements of [`CHUNK`] rows, then of the powers of two below it: any batch
/// is written with at most seven distinct statement texts, each prepared once and cached, where
/// a statement per batch size would be parsed afresh for nearly every batch (and a cache of
/// large prepared statements costs megabytes per connection).
fn chunks<T>(mut rows: &[T]) -> impl Iterator<Item = &[T]> {
    std::iter::from_fn(move || {
        if rows.is_empty() {
            return None;
        }
        let n = if rows.len() >= CHUNK { CHUNK } else { 1 << rows.len().ilog2() };
        let (head, rest) = rows.split_at(n);
        rows = rest;
        Some(head)
    })
}

/// `head VALUES (…), (…) tail`: `rows` rows of `cols` placeholders, `$1, $2…` for PostgreSQL
/// and `?` for SQLite (where sqlx looks a `$n` up by name, each bind a search). Made once per
/// engine and chunk size ([`chunks`]) and kept: building the text per batch with a
/// `QueryBuilder` was a third of the writer's own work per record (callgrind).
fn values_sql(
    made: &'static [[std::sync::OnceLock<String>; 7]; 2],
    pg: bool,
    head: &str,
    cols: usize,
    rows: usize,
    tail: &str,
) -> &'static str {
    let slot = (CHUNK.ilog2() - rows.max(1).ilog2()) as usize;
    made[usize::from(pg)][slot.min(6)].get_or_init(|| {
        let mut sql = format!("{head} VALUES ");
        for r in 0..rows {
            sql.push_str(if r == 0 { "(" } else { ", (" });
            for c in 0..cols {
                if c > 0 {
                    sql.push_str(", ");
                }
                match pg {
                    true => sql.push_str(&format!("${}", r * cols + c + 1)),
                    false => sql.push('?'),
                }
            }
            sql.push(')');
        }
        sql + tail
    })
}

const STARTED_HEAD: &str = "INSERT INTO requests (id, started_at, endpoint, status, client_request_id, broker)";
// The finished row, if an earlier batch wrote it, stays as it is.
const STARTED_TAIL: &str = " ON CONFLICT (id) DO NOTHING";
static STARTED_SQL: [[std::sync::OnceLock<String>; 7]; 2] = [const { [const { std::sync::OnceLock::new() }; 7] }; 2];

async fn insert_started(tx: &mut Tx<'_>, started: &[&Started], broker: &str) -> Result<(), sqlx::Error> {
    // Multi-row statements: one round trip per few dozen rows.
    let pg = matches!(tx, Tx::Postgres(_));
    on_engine!(Tx, tx, |t| for chunk in chunks(started) {
        let mut q = sqlx::query(values_sql(&STARTED_SQL, pg, STARTED_HEAD, 6, chunk.len(), STARTED_TAIL));
        for s in chunk {
            q = q
                .bind(&s.id)
                .bind(s.started_at)
                .bind(&s.endpoint)
                .bind("running")
                .bind(&s.client_request_id)
                .bind(broker);
        }
        q.execute(&mut **t).await?;
    });
    Ok(())
}

const FINISHED_HEAD: &str = "INSERT INTO requests (id, started_at, finished_at, endpoint, category, origin, model, \
     node, attempts, fallback, status, http_status, error_code, queued_ms, ttfb_ms, total_ms, prompt_tokens, \
     completion_tokens, streamed, interrupted, client_request_id, answered_model, failed_attempts, continued_by, \
     generation_us, node_done_ms, estimate_ms, broker)";
const FINISHED_TAIL: &str =
    " ON CONFLICT(id) DO UPDATE SET finished_at=excluded.finished_at, endpoint=excluded.endpoint, \
     category=excluded.category, origin=excluded.origin, model=excluded.model, node=excluded.node, \
     attempts=excluded.attempts, fallback=excluded.fallback, status=excluded.status, \
     http_status=excluded.http_status, error_code=excluded.error_code, queued_ms=excluded.queued_ms, \
     ttfb_ms=excluded.ttfb_ms, total_ms=excluded.total_ms, prompt_tokens=excluded.prompt_tokens, \
     completion_tokens=excluded.completion_tokens, streamed=excluded.streamed, interrupted=excluded.interrupted, \
     client_request_id=excluded.client_request_id, answered_model=excluded.answered_model, \
     failed_attempts=excluded.failed_attempts, continued_by=excluded.continued_by, \
     generation_us=excluded.generation_us, node_done_ms=excluded.node_done_ms, estimate_ms=excluded.estimate_ms";
static FINISHED_SQL: [[std::sync::OnceLock<String>; 7]; 2] = [const { [const { std::sync::OnceLock::new() }; 7] }; 2];

async fn upsert_finished(tx: &mut Tx<'_>, finished: &[&RequestRow], broker: &str) -> Result<(), sqlx::Error> {
    let pg = matches!(tx, Tx::Postgres(_));
    on_engine!(Tx, tx, |t| for chunk in chunks(finished) {
        let mut q = sqlx::query(values_sql(&FINISHED_SQL, pg, FINISHED_HEAD, 28, chunk.len(), FINISHED_TAIL));
        for row in chunk {
            let failed = (!row.failed_attempts.is_empty())
                .then(|| serde_json::to_string(&row.failed_attempts).unwrap_or_default());
            q = q
                .bind(&row.id)
                .bind(row.started_at)
                .bind(row.finished_at)
                .bind(&row.endpoint)
                .bind(&row.category)
                .bind(&row.origin)
                .bind(&row.model)
                .bind(&row.node)
                .bind(row.attempts)
                .bind(&row.fallback)
                .bind(&row.status)
                .bind(row.http_status)
                .bind(&row.error_code)
                .bind(row.queued_ms)
                .bind(row.ttfb_ms)
                .bind(row.total_ms)
                .bind(row.prompt_tokens)
                .bind(row.completion_tokens)
                .bind(row.streamed)
                .bind(row.interrupted)
                .bind(&row.client_request_id)
                .bind(&row.answered_model)
                .bind(failed)
                .bind(&row.continued_by)
                .bind(row.generation_us)
                .bind(row.node_done_ms)
                .bind(row.estimate_ms)
                .bind(broker);
        }
        q.execute(&mut **t).await?;
    });
    Ok(())
}

async fn insert_events(tx: &mut Tx<'_>, events: &[&NodeEventRow], broker: &str) -> Result<(), sqlx::Error> {
    let sql =
        "INSERT INTO node_events (at, node, from_state, to_state, reason, broker) VALUES ($1, $2, $3, $4, $5, $6)";
    on_engine!(Tx, tx, |t| for e in events {
        sqlx::query(sql)
            .bind(e.at)
            .bind(&e.node)
            .bind(&e.from_state)
            .bind(&e.to_state)
            .bind(&e.reason)
            .bind(broker)
            .execute(&mut **t)
            .await?;
    });
    Ok(())
}

async fn upsert_rollups(tx: &mut Tx<'_>, rollups: Rollups<'_>) -> Result<(), sqlx::Error> {
    // The kept row is named by its table: PostgreSQL finds a bare `requests` ambiguous.
    let sql = "INSERT INTO rollups (minute, node, requests, errors, total_ms_sum, ttfb_ms_sum, completion_tokens) \
         VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT(minute, node) DO UPDATE SET \
         requests = rollups.requests + excluded.requests, errors = rollups.errors + excluded.errors, \
         total_ms_sum = rollups.total_ms_sum + excluded.total_ms_sum, \
         ttfb_ms_sum = rollups.ttfb_ms_sum + excluded.ttfb_ms_sum, \
         completion_tokens = rollups.completion_tokens + excluded.completion_tokens";
    on_engine!(Tx, tx, |t| for ((minute, node), [requests, errors, total, ttfb, tokens]) in &rollups {
        sqlx::query(sql)
            .bind(minute)
            .bind(node)
            .bind(requests)
            .bind(errors)
            .bind(total)
            .bind(ttfb)
            .bind(tokens)
            .execute(&mut **t)
            .await?;
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(i: usize) -> Record {
        Record::NodeEvent(NodeEventRow {
            at: i as i64,
            node: "n".into(),
            from_state: "healthy".into(),
            to_state: "unhealthy".into(),
            reason: String::new(),
        })
    }

    /// With a channel of `capacity`: one record, the writer waiting on it, then `more` records
    /// offered at once. The batch's size, how long it took on the paused clock, and whether
    /// anything was left in the channel.
    async fn one_batch(capacity: usize, more: usize) -> (usize, Duration, bool) {
        let (tx, mut rx) = mpsc::channel(capacity);
        let (health, cancel) = (Arc::new(Health::default()), CancellationToken::new());
        let start = tokio::time::Instant::now();
        assert!(offer(&tx, &health, event(0)));
        let writer = {
            let health = Arc::clone(&health);
            tokio::spawn(async move { (next_batch(&mut rx, &health, &cancel).await, rx) })
        };
        tokio::task::yield_now().await;
        for i in 1..=more {
            assert!(offer(&tx, &health, event(i)), "record {i} fits");
        }
        let (batch, mut rx) = writer.await.expect("writer");
        (batch.map_or(0, |b| b.len()), start.elapsed(), rx.try_recv().is_ok())
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_is_what_arrived_within_the_linger_taken_in_one_go() {
        let (n, took, left) = one_batch(100, 9).await;
        assert_eq!(n, 10, "the ten records of the linger in one batch");
        assert!(took >= BATCH_LINGER, "it lingered: {took:?}");
        assert!(!left);
    }

    #[tokio::test(start_paused = true)]
    async fn a_channel_past_half_full_cuts_the_linger_short() {
        let (n, took, _) = one_batch(8, 5).await;
        assert_eq!(n, 6);
        assert!(took < BATCH_LINGER, "woken before its linger ended: {took:?}");
    }

    #[test]
    fn a_batch_is_written_in_few_statement_sizes() {
        let sizes = |n: usize| chunks(&vec![0u8; n]).map(<[u8]>::len).collect::<Vec<_>>();
        assert_eq!(sizes(0), Vec::<usize>::new());
        assert_eq!(sizes(1), [1]);
        assert_eq!(sizes(100), [64, 32, 4]);
        assert_eq!(sizes(2048).len(), 32);
        let all: std::collections::BTreeSet<usize> = (1..=300).flat_map(sizes).collect();
        assert_eq!(all.into_iter().collect::<Vec<_>>(), [1, 2, 4, 8, 16, 32, 64], "seven statements in all");
    }

    #[test]
    fn an_unreachable_database_is_tried_again_and_a_refusal_is_not() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(transient(&sqlx::Error::Io(refused)), "connection refused: the server is away");
        assert!(transient(&sqlx::Error::PoolTimedOut), "no connection within the timeout");
        assert!(!transient(&sqlx::Error::RowNotFound), "not a database outage");
        assert!(!transient(&sqlx::Error::PoolClosed), "the store is shutting down");
    }
}
