//! The request store: one metadata row per request, node events, per-minute rollups, in SQLite
//! (sqlx, WAL) for one broker or, with `store.url`, in a PostgreSQL that a fleet of brokers
//! shares (`pg.rs`). Never prompt or output text. Every row names the broker that wrote it
//! (`store.broker`, else the host name), on SQLite too.
//!
//! The request path never waits on disk: it hands records to a bounded channel (`try_send`), and
//! one writer task (`writer.rs`) drains it in batches, one transaction per batch. If the channel
//! is full the record is dropped and counted, and the count itself is written
//! (`dropped_records`) and shown in status, so a gap in the history is never silent. While the
//! database is away the writer keeps its batch and tries again, so the channel is the bounded
//! buffer of an outage.
//!
//! Both engines run the same SQL text (`$N` placeholders, `ON CONFLICT`), each on its own sqlx
//! pool: [`Pool`] is the choice of engine, and [`on_engine!`] writes a query once for both.
//!
//! A request's row is inserted as `running` when it starts and completed when it ends; rows
//! still `running` at the next start were cut off by a crash and become `unknown` (never
//! silently `ok`): on SQLite all of them, on PostgreSQL this broker's own only. Retention
//! deletes by age and keeps at most `max_rows` (on PostgreSQL, the fleet's rows together).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use sqlx::postgres::PgPool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, SqlitePool};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::StoreConfig;

/// Run `body` with `inner` bound to the engine's own value inside `value`, an enum `Kind`
/// with a `Sqlite` and a `Postgres` variant ([`Pool`], the writer's transaction): the body is
/// written once and compiled for each engine, so each runs on its own sqlx driver.
macro_rules! on_engine {
    ($kind:ident, $value:expr, |$inner:ident| $body:expr) => {
        match $value {
            $kind::Sqlite($inner) => $body,
            $kind::Postgres($inner) => $body,
        }
    };
}

pub mod pg;
mod search;
mod writer;

pub use writer::WriteError;

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
    /// The broker that handled it (`store.broker`, else its host name). The store fills it in
    /// when it writes the row; what the request path sets here is not written.
    pub broker: String,
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
    Finished(Arc<RequestRow>),
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
    /// Only this broker's requests (a fleet's store holds every broker's); none: the fleet's.
    pub broker: Option<String>,
    /// Only rows after this one (the next page).
    pub before: Option<Cursor>,
    /// The most rows to return (default 1000).
    pub limit: Option<i64>,
}

/// A background task of the store's, for the caller to run.
pub type Task = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// The store's background tasks, for the caller to spawn and own.
pub struct StoreTasks {
    /// Drains the record channel into the database; ends after cancellation once the channel is
    /// empty (or, with the database away, once it has said what it could not write).
    pub writer: Task,
    /// Applies retention at start and every `retention_interval_ms`.
    pub retention: Task,
}

/// The database the records are in: a SQLite file for one broker, a PostgreSQL that a fleet
/// of brokers shares. Cheap to clone (sqlx pools are handles).
#[derive(Clone, Debug)]
pub enum Pool {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

impl Pool {
    /// `sqlite` or `postgres`.
    pub fn engine(&self) -> &'static str {
        match self {
            Pool::Sqlite(_) => "sqlite",
            Pool::Postgres(_) => "postgres",
        }
    }

    /// The SQLite pool, when the records are in a file.
    pub fn sqlite(&self) -> Option<&SqlitePool> {
        match self {
            Pool::Sqlite(p) => Some(p),
            Pool::Postgres(_) => None,
        }
    }

    /// Close every connection (a reader done with the store lets the writer have it alone).
    pub async fn close(&self) {
        match self {
            Pool::Sqlite(p) => p.close().await,
            Pool::Postgres(p) => p.close().await,
        }
    }
}

/// Cheap to clone; the request path's handle on the store.
#[derive(Clone)]
pub struct Store {
    pool: Pool,
    tx: mpsc::Sender<Record>,
    dropped: Arc<AtomicU64>,
    health: Arc<writer::Health>,
    /// The file's path, or the PostgreSQL URL as it may be shown.
    location: Arc<str>,
    broker: Arc<str>,
    /// Whether this broker runs retention: always alone; in a fleet, only its keeper.
    fleet_jobs: Arc<AtomicBool>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("engine", &self.pool.engine()).field("location", &self.location).finish()
    }
}

/// The store as `/admin/status` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StoreStatus {
    /// `sqlite` or `postgres`.
    pub engine: &'static str,
    /// The SQLite file, or the PostgreSQL URL without a password.
    pub location: String,
    /// This broker's name on its rows.
    pub broker: String,
    /// Records handed over and not yet written: in the channel, and the batch the writer holds.
    pub pending: usize,
    /// At most this many records wait; past it they are dropped and counted.
    pub capacity: usize,
    /// Records dropped since start (the channel was full).
    pub dropped: u64,
    /// The last write's error, while the writes fail (none once one succeeds).
    pub last_error: Option<WriteError>,
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

/// The SQLite file at `path`, for reading (`read_only`: beside a live broker, as `corral
/// history` does) or, made private first, for the store itself.
pub async fn open_pool(path: &Path, read_only: bool) -> Result<Pool, StoreError> {
    open_sqlite(path, read_only).await.map(Pool::Sqlite)
}

async fn open_sqlite(path: &Path, read_only: bool) -> Result<SqlitePool, StoreError> {
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
        .busy_timeout(Duration::from_secs(5))
        // Page cache per connection: 256 KiB, not SQLite's 2 MiB default. The writer appends at
        // the right edge of the table and each index (ids and times grow), so its working set is
        // a few dozen pages; reads past the cache come from the OS's page cache. The default let
        // four connections hold 8 MiB of resident memory for nothing (issue 16).
        .pragma("cache_size", "-256")
        // The writer's multi-row upserts keep a statement journal; in memory, not a file
        // under /var/tmp written on every batch.
        .pragma("temp_store", "memory");
    // Two connections: the writer holds one for good (see store/writer.rs), readers share the
    // other (WAL lets them run beside it). Each is a thread of sqlx's with SQLite's own glibc
    // arena (~800 KiB resident once used) and its page cache; four let a broker that served a
    // few thousand requests sit on three, and a third for readers was opened at start by the
    // retention sweep while the writer held its own (issue 16).
    let pool = SqlitePoolOptions::new()
        .max_connections(2)
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
    /// PostgreSQL with `store.url`, else the SQLite file.
    pub async fn open(config: &StoreConfig, cancel: CancellationToken) -> Result<(Store, StoreTasks), StoreError> {
        let (pool, location) = match &config.url {
            Some(url) => (Pool::Postgres(pg::connect(config).await?), pg::display_url(url)),
            None => {
                let path = default_path(config);
                let pool = open_sqlite(&path, false).await?;
                sqlx::migrate!("./migrations")
                    .run(&pool)
                    .await
                    .map_err(|source| StoreError::Migrate { path: path.display().to_string(), source })?;
                (Pool::Sqlite(pool), path.display().to_string())
            }
        };
        let broker: Arc<str> = pg::broker_name(config).into();
        let recovered = mark_cut_off(&pool, &broker).await?;
        if recovered > 0 {
            tracing::warn!(rows = recovered, "requests left running by an earlier crash marked unknown");
        }
        let (tx, rx) = mpsc::channel(config.channel_capacity.max(1));
        let dropped = Arc::new(AtomicU64::new(0));
        let health = Arc::new(writer::Health::default());
        // A fleet's keeper (`crate::fleet::keeper`) turns this on; alone, it is on.
        let fleet_jobs = Arc::new(AtomicBool::new(matches!(pool, Pool::Sqlite(_))));
        let store = Store {
            pool: pool.clone(),
            tx,
            dropped: Arc::clone(&dropped),
            health: Arc::clone(&health),
            location: location.into(),
            broker: Arc::clone(&broker),
            fleet_jobs: Arc::clone(&fleet_jobs),
        };
        let w = writer::Writer { pool: pool.clone(), broker, dropped, health };
        let writer = Box::pin(writer::run(w, rx, cancel.clone()));
        let retention = Box::pin(retention(pool, config.clone(), fleet_jobs, cancel));
        Ok((store, StoreTasks { writer, retention }))
    }

    /// The SQLite file's path, or the PostgreSQL URL as it may be shown.
    pub fn location(&self) -> &str {
        &self.location
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Run retention from here (in a fleet, only the keeper does).
    pub fn set_runs_fleet_jobs(&self, on: bool) {
        self.fleet_jobs.store(on, Ordering::Release);
    }

    /// This broker's name on the rows it writes.
    pub fn broker(&self) -> &str {
        &self.broker
    }

    /// Records the request path could not hand over since start.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Engine, location, what waits to be written, drops, and the last write error.
    pub fn status(&self) -> StoreStatus {
        let queued = self.tx.max_capacity() - self.tx.capacity();
        StoreStatus {
            engine: self.pool.engine(),
            location: self.location.to_string(),
            broker: self.broker.to_string(),
            pending: queued + self.health.held(),
            capacity: self.tx.max_capacity() + writer::BATCH_MAX,
            dropped: self.dropped(),
            last_error: self.health.last_error(),
        }
    }

    fn send(&self, r: Record) {
        if !writer::offer(&self.tx, &self.health, r) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn started(&self, s: Started) {
        self.send(Record::Started(s));
    }

    pub fn finished(&self, row: impl Into<Arc<RequestRow>>) {
        self.send(Record::Finished(row.into()));
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

/// Rows left `running` by an earlier run were cut off by a crash: mark them `unknown`. A SQLite
/// file is one broker's, so all of its running rows (whatever the broker was called then); on
/// PostgreSQL only this broker's own, never a live neighbour's. How many.
async fn mark_cut_off(pool: &Pool, broker: &str) -> Result<u64, StoreError> {
    let own = matches!(pool, Pool::Postgres(_)).then_some(broker);
    let sql = "UPDATE requests SET status = 'unknown' WHERE status = 'running' AND ($1 IS NULL OR broker = $1)";
    Ok(on_engine!(Pool, pool, |p| sqlx::query(sql).bind(own).execute(p).await?.rows_affected()))
}

pub async fn query_node_events(pool: &Pool, since_ms: i64) -> Result<Vec<NodeEventRow>, StoreError> {
    let sql = "SELECT at, node, from_state, to_state, reason FROM node_events WHERE at >= $1 ORDER BY at, id";
    Ok(on_engine!(Pool, pool, |p| sqlx::query(sql)
        .bind(since_ms)
        .fetch_all(p)
        .await?
        .into_iter()
        .map(|r| NodeEventRow {
            at: r.get("at"),
            node: r.get("node"),
            from_state: r.get("from_state"),
            to_state: r.get("to_state"),
            reason: r.get("reason"),
        })
        .collect()))
}

/// Delete by age and keep at most `max_rows`, now and then every `retention_interval_ms`.
async fn retention(pool: Pool, config: StoreConfig, runs: Arc<AtomicBool>, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_millis(config.retention_interval_ms.max(1)));
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tick.tick() => {
                if !runs.load(Ordering::Acquire) {
                    continue;
                }
                if let Err(e) = apply_retention(&pool, &config).await {
                    tracing::warn!(error = %e, "retention pass failed");
                }
            }
        }
    }
}

/// Delete rows older than `max_age_days` (never a running one) and all but the newest
/// `max_rows`; old node events and rollups too. How many request rows went.
pub async fn apply_retention(pool: &Pool, config: &StoreConfig) -> Result<u64, StoreError> {
    let cutoff = now_ms() - (config.max_age_days as i64) * 86_400_000;
    let keep = i64::try_from(config.max_rows).unwrap_or(i64::MAX);
    Ok(on_engine!(Pool, pool, |p| {
        let mut removed = sqlx::query("DELETE FROM requests WHERE started_at < $1 AND status != 'running'")
            .bind(cutoff)
            .execute(p)
            .await?
            .rows_affected();
        // Both engines take `LIMIT n OFFSET m` (SQLite no OFFSET alone): every row past the newest `keep`.
        removed += sqlx::query(
            "DELETE FROM requests WHERE id IN \
             (SELECT id FROM requests ORDER BY started_at DESC, id LIMIT $1 OFFSET $2)",
        )
        .bind(i64::MAX)
        .bind(keep)
        .execute(p)
        .await?
        .rows_affected();
        sqlx::query("DELETE FROM node_events WHERE at < $1").bind(cutoff).execute(p).await?;
        sqlx::query("DELETE FROM rollups WHERE minute < $1").bind(cutoff / 60_000).execute(p).await?;
        removed
    }))
}

pub fn now_ms() -> i64 {
    (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64
}

/// Dropped-record total as written in the store (survives restarts; a fleet's, all brokers').
pub async fn dropped_total(pool: &Pool) -> Result<i64, StoreError> {
    // PostgreSQL's SUM of BIGINT is NUMERIC: cast back for both.
    let sql = "SELECT CAST(COALESCE(SUM(count), 0) AS BIGINT) AS n FROM dropped_records";
    Ok(on_engine!(Pool, pool, |p| sqlx::query(sql).fetch_one(p).await?.get("n")))
}
