//! The request store: one metadata row per request, node events, per-minute rollups, in SQLite
//! (sqlx, WAL). Never prompt or output text.
//!
//! The request path never waits on disk: it hands records to a bounded channel (`try_send`), and
//! one writer task drains it in batches, one transaction per batch. If the channel is full the
//! record is dropped and counted, and the count itself is written (`dropped_records`) and shown
//! in status, so a gap in the history is never silent.
//!
//! A request's row is inserted as `running` when it starts and completed when it ends; rows
//! still `running` at the next start were cut off by a crash and become `unknown` (never
//! silently `ok`). Retention deletes by age and keeps at most `max_rows`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, SqlitePool};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::StoreConfig;

pub mod pg;
mod search;

pub use search::{
    attempts, count_requests, limit_of, page_requests, query_requests, request_by_id, samples, Attempt, Cursor,
    GroupBy, Page, Sample,
};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open the request store at {path}: {source}")]
    Open { path: String, source: sqlx::Error },
    #[error("cannot migrate the request store at {path}: {source}")]
    Migrate { path: String, source: sqlx::migrate::MigrateError },
    #[error("request store query failed: {0}")]
    Query(#[from] sqlx::Error),
    #[error("cannot read the store's PostgreSQL password (keyring secret \"{name}\"): {source}")]
    Password { name: String, source: crate::secrets::SecretError },
}

impl StoreError {
    pub fn code(&self) -> &'static str {
        match self {
            Self::Open { .. } => "store_open_failed",
            Self::Migrate { .. } => "store_migrate_failed",
            Self::Query(_) => "store_query_failed",
            Self::Password { .. } => "store_password_missing",
        }
    }
}

/// The start of a request.
#[derive(Debug, Clone)]
pub struct Started {
    pub id: String,
    pub started_at: i64,
    pub endpoint: String,
    /// The client's `X-Request-Id`, so a request cut short by a crash can still be found by it.
    pub client_request_id: Option<String>,
}

/// Everything known when a request ends.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct RequestRow {
    pub id: String,
    pub started_at: i64,
    pub finished_at: Option<i64>,
    pub endpoint: String,
    pub category: String,
    pub origin: String,
    pub model: String,
    pub node: Option<String>,
    pub attempts: i64,
    pub fallback: Option<String>,
    pub status: String,
    pub http_status: Option<i64>,
    pub error_code: Option<String>,
    pub queued_ms: Option<i64>,
    pub ttfb_ms: Option<i64>,
    pub total_ms: Option<i64>,
    pub prompt_tokens: Option<i64>,
    pub completion_tokens: Option<i64>,
    pub streamed: bool,
    pub interrupted: bool,
    /// The `X-Request-Id` the client sent, if any (bounded, visible ASCII); never a key.
    pub client_request_id: Option<String>,
    /// The model that answered, when it is not the one asked for (a cloud provider's).
    pub answered_model: Option<String>,
    /// The attempts that failed before the answer (or before giving up), in order.
    pub failed_attempts: Vec<FailedAttempt>,
    /// The node that continued this answer after its stream broke (`continue_on_cut`).
    pub continued_by: Option<String>,
    /// Time the node spent generating the completion tokens, in µs (Ollama's `eval_duration`);
    /// tokens per second is `completion_tokens` / this (`crate::charts::generation`).
    pub generation_us: Option<i64>,
    /// When the node was done with the request, ms after arrival: before `total_ms` when a slow
    /// client was still reading the answer from Corral's read-ahead buffer.
    pub node_done_ms: Option<i64>,
    /// `fastest-finish`'s estimate of the request's time from arrival to the end (ms), when it chose the node.
    pub estimate_ms: Option<i64>,
}

/// One attempt that did not answer: where it went and how it ended.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct FailedAttempt {
    pub node: String,
    /// An `Outcome` name (`silent`, `failed`, `busy`...).
    pub outcome: String,
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeEventRow {
    pub at: i64,
    pub node: String,
    pub from_state: String,
    pub to_state: String,
    pub reason: String,
}

#[derive(Debug)]
enum Record {
    Started(Started),
    Finished(Box<RequestRow>),
    NodeEvent(NodeEventRow),
}

/// Filters for `history` and `/admin/requests` (see [`search`] for how they match and page).
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct Query {
    /// Only requests started at or after this (unix ms).
    pub since_ms: Option<i64>,
    pub node: Option<String>,
    pub category: Option<String>,
    pub status: Option<String>,
    /// The model asked for or the one that answered.
    pub model: Option<String>,
    /// A request id or its start: Corral's id or the client's `X-Request-Id`.
    pub id: Option<String>,
    /// Only rows after this one (the next page).
    pub before: Option<Cursor>,
    /// The most rows to return (default 1000).
    pub limit: Option<i64>,
}

type Task = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// The store's background tasks, for the caller to spawn and own.
pub struct StoreTasks {
    /// Drains the record channel into SQLite; ends after cancellation once the channel is empty.
    pub writer: Task,
    /// Applies retention at start and every `retention_interval_ms`.
    pub retention: Task,
}

/// Cheap to clone; the request path's handle on the store.
#[derive(Clone)]
pub struct Store {
    pool: SqlitePool,
    tx: mpsc::Sender<Record>,
    dropped: Arc<AtomicU64>,
    path: PathBuf,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

/// The store file: `store.path`, else `corral.db` in the platform data dir.
pub fn default_path(config: &StoreConfig) -> PathBuf {
    if let Some(p) = &config.path {
        return PathBuf::from(p);
    }
    directories::ProjectDirs::from("dev", "corral", "corral")
        .map(|d| d.data_dir().join("corral.db"))
        .unwrap_or_else(|| PathBuf::from("corral.db"))
}

/// The store's files, the database and SQLite's `-wal` / `-shm` / `-journal` beside it.
fn store_files(path: &Path) -> impl Iterator<Item = PathBuf> + '_ {
    std::iter::once(path.to_path_buf()).chain(["-wal", "-shm", "-journal"].into_iter().map(move |suffix| {
        let mut name = path.as_os_str().to_os_string();
        name.push(suffix);
        PathBuf::from(name)
    }))
}

/// Make the store the owner's only, whatever the umask: a missing directory is created 0700
/// (Corral's own data directory is made 0700 even when it exists), the database is created
/// 0600 before SQLite opens it, and existing files (an older install's 0644 ones) are set
/// 0600. SQLite creates its `-wal` and `-shm` files with the database's mode, and
/// [`seal_files`] sets them again once they exist.
fn prepare_files(path: &Path) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        crate::config::create_private_dir(dir)?;
        let own = directories::ProjectDirs::from("dev", "corral", "corral").is_some_and(|d| d.data_dir() == dir);
        if own {
            crate::config::make_private(dir)?;
        }
    }
    if !path.exists() {
        let mut open = std::fs::OpenOptions::new();
        open.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut open, 0o600);
        match open.open(path) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    seal_files(path)
}

/// Set 0600 on each of the store's files that exists.
fn seal_files(path: &Path) -> std::io::Result<()> {
    store_files(path).filter(|f| f.exists()).try_for_each(|f| crate::config::make_private(&f))
}

pub async fn open_pool(path: &Path, read_only: bool) -> Result<SqlitePool, StoreError> {
    let failed = |e: std::io::Error| StoreError::Open { path: path.display().to_string(), source: sqlx::Error::Io(e) };
    if !read_only {
        prepare_files(path).map_err(failed)?;
    }
    let opts = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(!read_only)
        .read_only(read_only)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(Duration::from_secs(5));
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(opts)
        .await
        .map_err(|source| StoreError::Open { path: path.display().to_string(), source })?;
    if !read_only {
        // The first connection switched the file to WAL, so `-wal` and `-shm` exist now.
        seal_files(path).map_err(failed)?;
    }
    Ok(pool)
}

impl Store {
    /// Open (creating and migrating as needed), mark rows a crash left `running` as `unknown`,
    /// and start the writer and retention tasks. Returns the tasks for the caller to own.
    pub async fn open(config: &StoreConfig, cancel: CancellationToken) -> Result<(Store, StoreTasks), StoreError> {
        let path = default_path(config);
        let pool = open_pool(&path, false).await?;
        sqlx::migrate!("./migrations")
            .run(&pool)
            .await
            .map_err(|source| StoreError::Migrate { path: path.display().to_string(), source })?;
        let recovered =
            sqlx::query("UPDATE requests SET status = 'unknown' WHERE status = 'running'").execute(&pool).await?;
        if recovered.rows_affected() > 0 {
            tracing::warn!(
                rows = recovered.rows_affected(),
                "requests left running by an earlier crash marked unknown"
            );
        }
        let (tx, rx) = mpsc::channel(config.channel_capacity.max(1));
        let dropped = Arc::new(AtomicU64::new(0));
        let store = Store { pool: pool.clone(), tx, dropped: Arc::clone(&dropped), path };
        let writer = Box::pin(writer(pool.clone(), rx, dropped, cancel.clone()));
        let retention = Box::pin(retention(pool, config.clone(), cancel));
        Ok((store, StoreTasks { writer, retention }))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Records the request path could not hand over since start.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    fn send(&self, r: Record) {
        if self.tx.try_send(r).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn started(&self, s: Started) {
        self.send(Record::Started(s));
    }

    pub fn finished(&self, row: RequestRow) {
        self.send(Record::Finished(Box::new(row)));
    }

    pub fn node_event(&self, e: NodeEventRow) {
        self.send(Record::NodeEvent(e));
    }

    pub async fn requests(&self, q: &Query) -> Result<Vec<RequestRow>, StoreError> {
        query_requests(&self.pool, q).await
    }

    pub async fn node_events(&self, since_ms: i64) -> Result<Vec<NodeEventRow>, StoreError> {
        query_node_events(&self.pool, since_ms).await
    }
}

pub async fn query_node_events(pool: &SqlitePool, since_ms: i64) -> Result<Vec<NodeEventRow>, StoreError> {
    let rows =
        sqlx::query("SELECT at, node, from_state, to_state, reason FROM node_events WHERE at >= ? ORDER BY at, id")
            .bind(since_ms)
            .fetch_all(pool)
            .await?;
    Ok(rows
        .into_iter()
        .map(|r| NodeEventRow {
            at: r.get("at"),
            node: r.get("node"),
            from_state: r.get("from_state"),
            to_state: r.get("to_state"),
            reason: r.get("reason"),
        })
        .collect())
}

/// How long the writer waits for more records before writing a batch.
const BATCH_LINGER: Duration = Duration::from_millis(5);

/// Drain the channel in batches, one transaction each, until cancelled and empty.
async fn writer(pool: SqlitePool, mut rx: mpsc::Receiver<Record>, dropped: Arc<AtomicU64>, cancel: CancellationToken) {
    let mut written_drops = 0u64;
    loop {
        let first = tokio::select! {
            r = rx.recv() => r,
            _ = cancel.cancelled() => {
                // Flush what is queued, then stop.
                rx.close();
                rx.recv().await
            }
        };
        let Some(first) = first else { break };
        // Linger briefly so a steady trickle becomes one transaction, not one per record.
        let mut batch = vec![first];
        let linger = tokio::time::Instant::now() + BATCH_LINGER;
        while batch.len() < 2048 {
            match rx.try_recv() {
                Ok(r) => batch.push(r),
                Err(mpsc::error::TryRecvError::Disconnected) => break,
                Err(mpsc::error::TryRecvError::Empty) if cancel.is_cancelled() => break,
                Err(mpsc::error::TryRecvError::Empty) => match tokio::time::timeout_at(linger, rx.recv()).await {
                    Ok(Some(r)) => batch.push(r),
                    _ => break,
                },
            }
        }
        let now_dropped = dropped.load(Ordering::Relaxed);
        if let Err(e) = write_batch(&pool, &batch, now_dropped - written_drops).await {
            tracing::error!(error = %e, records = batch.len(), "request store write failed");
        } else {
            written_drops = now_dropped;
        }
    }
    tracing::debug!("store writer stopped");
}

type Tx<'a> = sqlx::Transaction<'a, sqlx::Sqlite>;

/// Per (minute, node): requests, errors, total ms, ttfb ms, completion tokens.
type Rollups<'a> = std::collections::HashMap<(i64, &'a str), [i64; 5]>;

async fn write_batch(pool: &SqlitePool, batch: &[Record], new_drops: u64) -> Result<(), sqlx::Error> {
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
    let done: std::collections::HashSet<&str> = finished.iter().map(|r| r.id.as_str()).collect();
    started.retain(|s| !done.contains(s.id.as_str()));
    let rollups = rollups_of(&finished);
    let mut tx = pool.begin().await?;
    insert_started(&mut tx, &started).await?;
    upsert_finished(&mut tx, &finished).await?;
    for e in events {
        sqlx::query("INSERT INTO node_events (at, node, from_state, to_state, reason) VALUES (?, ?, ?, ?, ?)")
            .bind(e.at)
            .bind(&e.node)
            .bind(&e.from_state)
            .bind(&e.to_state)
            .bind(&e.reason)
            .execute(&mut *tx)
            .await?;
    }
    upsert_rollups(&mut tx, rollups).await?;
    if new_drops > 0 {
        sqlx::query("INSERT INTO dropped_records (at, count) VALUES (?, ?)")
            .bind(now_ms())
            .bind(new_drops as i64)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await
}

/// Rollups are summed per (minute, node) in memory: one upsert per group, not per row.
fn rollups_of<'a>(finished: &[&'a RequestRow]) -> Rollups<'a> {
    let mut rollups = Rollups::new();
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

async fn insert_started(tx: &mut Tx<'_>, started: &[&Started]) -> Result<(), sqlx::Error> {
    // Multi-row statements: one round trip to SQLite's thread per few hundred rows.
    for chunk in started.chunks(500) {
        let mut q = sqlx::QueryBuilder::<sqlx::Sqlite>::new(
            "INSERT OR IGNORE INTO requests (id, started_at, endpoint, status, client_request_id) ",
        );
        q.push_values(chunk, |mut b, s| {
            b.push_bind(&s.id)
                .push_bind(s.started_at)
                .push_bind(&s.endpoint)
                .push_bind("running")
                .push_bind(&s.client_request_id);
        });
        q.build().execute(&mut **tx).await?;
    }
    Ok(())
}

async fn upsert_finished(tx: &mut Tx<'_>, finished: &[&RequestRow]) -> Result<(), sqlx::Error> {
    for chunk in finished.chunks(400) {
        let mut q = sqlx::QueryBuilder::<sqlx::Sqlite>::new(
            "INSERT INTO requests (id, started_at, finished_at, endpoint, category, origin, model, node, attempts, \
             fallback, status, http_status, error_code, queued_ms, ttfb_ms, total_ms, prompt_tokens, completion_tokens, \
             streamed, interrupted, client_request_id, answered_model, failed_attempts, continued_by, generation_us, node_done_ms, estimate_ms) ",
        );
        q.push_values(chunk, |mut b, row| {
            let failed = (!row.failed_attempts.is_empty())
                .then(|| serde_json::to_string(&row.failed_attempts).unwrap_or_default());
            b.push_bind(&row.id)
                .push_bind(row.started_at)
                .push_bind(row.finished_at)
                .push_bind(&row.endpoint)
                .push_bind(&row.category)
                .push_bind(&row.origin)
                .push_bind(&row.model)
                .push_bind(&row.node)
                .push_bind(row.attempts)
                .push_bind(&row.fallback)
                .push_bind(&row.status)
                .push_bind(row.http_status)
                .push_bind(&row.error_code)
                .push_bind(row.queued_ms)
                .push_bind(row.ttfb_ms)
                .push_bind(row.total_ms)
                .push_bind(row.prompt_tokens)
                .push_bind(row.completion_tokens)
                .push_bind(row.streamed)
                .push_bind(row.interrupted)
                .push_bind(&row.client_request_id)
                .push_bind(&row.answered_model)
                .push_bind(failed)
                .push_bind(&row.continued_by)
                .push_bind(row.generation_us)
                .push_bind(row.node_done_ms)
                .push_bind(row.estimate_ms);
        });
        q.push(
            " ON CONFLICT(id) DO UPDATE SET finished_at=excluded.finished_at, endpoint=excluded.endpoint, \
             category=excluded.category, origin=excluded.origin, model=excluded.model, node=excluded.node, \
             attempts=excluded.attempts, fallback=excluded.fallback, status=excluded.status, \
             http_status=excluded.http_status, error_code=excluded.error_code, queued_ms=excluded.queued_ms, \
             ttfb_ms=excluded.ttfb_ms, total_ms=excluded.total_ms, prompt_tokens=excluded.prompt_tokens, \
             completion_tokens=excluded.completion_tokens, streamed=excluded.streamed, interrupted=excluded.interrupted, \
             client_request_id=excluded.client_request_id, answered_model=excluded.answered_model, \
             failed_attempts=excluded.failed_attempts, continued_by=excluded.continued_by, \
             generation_us=excluded.generation_us, node_done_ms=excluded.node_done_ms, estimate_ms=excluded.estimate_ms",
        );
        q.build().execute(&mut **tx).await?;
    }
    Ok(())
}

async fn upsert_rollups(tx: &mut Tx<'_>, rollups: Rollups<'_>) -> Result<(), sqlx::Error> {
    for ((minute, node), [requests, errors, total, ttfb, tokens]) in rollups {
        sqlx::query(
            "INSERT INTO rollups (minute, node, requests, errors, total_ms_sum, ttfb_ms_sum, completion_tokens) \
             VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(minute, node) DO UPDATE SET requests = requests + excluded.requests, \
             errors = errors + excluded.errors, total_ms_sum = total_ms_sum + excluded.total_ms_sum, \
             ttfb_ms_sum = ttfb_ms_sum + excluded.ttfb_ms_sum, \
             completion_tokens = completion_tokens + excluded.completion_tokens",
        )
        .bind(minute)
        .bind(node)
        .bind(requests)
        .bind(errors)
        .bind(total)
        .bind(ttfb)
        .bind(tokens)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// Delete by age and keep at most `max_rows`, now and then every `retention_interval_ms`.
async fn retention(pool: SqlitePool, config: StoreConfig, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_millis(config.retention_interval_ms.max(1)));
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tick.tick() => {
                if let Err(e) = apply_retention(&pool, &config).await {
                    tracing::warn!(error = %e, "retention pass failed");
                }
            }
        }
    }
}

pub async fn apply_retention(pool: &SqlitePool, config: &StoreConfig) -> Result<u64, StoreError> {
    let cutoff = now_ms() - (config.max_age_days as i64) * 86_400_000;
    let mut removed = sqlx::query("DELETE FROM requests WHERE started_at < ? AND status != 'running'")
        .bind(cutoff)
        .execute(pool)
        .await?
        .rows_affected();
    removed += sqlx::query(
        "DELETE FROM requests WHERE id IN (SELECT id FROM requests ORDER BY started_at DESC, id LIMIT -1 OFFSET ?)",
    )
    .bind(config.max_rows as i64)
    .execute(pool)
    .await?
    .rows_affected();
    sqlx::query("DELETE FROM node_events WHERE at < ?").bind(cutoff).execute(pool).await?;
    sqlx::query("DELETE FROM rollups WHERE minute < ?").bind(cutoff / 60_000).execute(pool).await?;
    Ok(removed)
}

pub fn now_ms() -> i64 {
    (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64
}

/// Dropped-record total as written in the store (survives restarts).
pub async fn dropped_total(pool: &SqlitePool) -> Result<i64, StoreError> {
    Ok(sqlx::query("SELECT COALESCE(SUM(count), 0) AS n FROM dropped_records").fetch_one(pool).await?.get("n"))
}
