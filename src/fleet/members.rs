//! Membership: each broker heartbeats its row in `brokers` every [`HEARTBEAT`] with the
//! database's clock (`now()`), so brokers' clocks never matter, and reads everyone's rows in
//! the same round. A broker whose last heartbeat is older than [`GONE_AFTER`] is gone.

use std::sync::Arc;

use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Fleet, GONE_AFTER, HEARTBEAT};
use crate::state::Shared;

/// One broker as `GET /admin/brokers` shows it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Member {
    pub name: String,
    pub admin_url: String,
    pub proxy_url: String,
    /// Corral's version on that broker.
    pub version: String,
    /// The shared config version it runs; `None` without a shared config.
    pub config_version: Option<i64>,
    /// Unix ms of its start and of its last heartbeat (the database's clock).
    pub started_at_ms: i64,
    pub last_seen_ms: i64,
    /// How long ago its last heartbeat was, by the database's clock, when read.
    pub last_seen_ms_ago: i64,
    pub in_flight: i64,
    pub queued: i64,
    /// It holds the keeper's lock (runs the once-per-fleet jobs).
    pub keeper: bool,
    /// No heartbeat for longer than the gone bound (5 s).
    pub gone: bool,
}

/// The members as last read, and how that read went.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    pub members: Vec<Member>,
    /// When the last read succeeded.
    pub read_at: Option<Instant>,
    pub last_error: Option<String>,
}

impl Seen {
    /// Brokers that heartbeat (this one counted even before its first heartbeat lands).
    pub fn live(&self) -> usize {
        self.members.iter().filter(|m| !m.gone).count().max(1)
    }
}

const HEARTBEAT_SQL: &str = "INSERT INTO brokers (name, instance, admin_url, proxy_url, version, config_version, in_flight, queued, keeper) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
     ON CONFLICT (name) DO UPDATE SET instance = EXCLUDED.instance, admin_url = EXCLUDED.admin_url, \
     proxy_url = EXCLUDED.proxy_url, version = EXCLUDED.version, config_version = EXCLUDED.config_version, \
     started_at = CASE WHEN brokers.instance = EXCLUDED.instance THEN brokers.started_at ELSE now() END, \
     last_seen = now(), in_flight = EXCLUDED.in_flight, queued = EXCLUDED.queued, keeper = EXCLUDED.keeper \
     RETURNING (SELECT b.instance FROM brokers b WHERE b.name = $1 AND b.last_seen > now() - make_interval(secs => $10))";

const LIST_SQL: &str = "SELECT name, admin_url, proxy_url, version, config_version, \
     (extract(epoch FROM started_at) * 1000)::BIGINT AS started_at_ms, \
     (extract(epoch FROM last_seen) * 1000)::BIGINT AS last_seen_ms, \
     (extract(epoch FROM now() - last_seen) * 1000)::BIGINT AS last_seen_ms_ago, \
     in_flight, queued, keeper, last_seen < now() - make_interval(secs => $1) AS gone \
     FROM brokers ORDER BY name";

/// Heartbeat, then read the fleet, every [`HEARTBEAT`] until cancelled. A failure is kept
/// for the status and retried next round; serving never waits for this.
pub async fn run(fleet: Arc<Fleet>, shared: Arc<Shared>, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(HEARTBEAT);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut warned_twin = false;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tick.tick() => {}
        }
        match round(&fleet, &shared).await {
            Ok((members, twin)) => {
                if twin && !warned_twin {
                    tracing::warn!(broker = %fleet.name, "another live process heartbeats under this broker's name; give each broker its own [store] broker");
                }
                warned_twin = twin;
                let mut seen = fleet.members.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                *seen = Seen { members, read_at: Some(Instant::now()), last_error: None };
            }
            Err(e) => {
                tracing::warn!(error = %e, "fleet heartbeat failed; retrying");
                let mut seen = fleet.members.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                seen.last_error = Some(e.to_string());
            }
        }
    }
}

/// One heartbeat and one read. Also says whether another live instance held the name.
async fn round(fleet: &Fleet, shared: &Shared) -> Result<(Vec<Member>, bool), sqlx::Error> {
    let in_flight: usize = shared.registry.all().iter().map(|n| n.in_flight()).sum();
    let (admin_url, proxy_url) = fleet.urls.get().cloned().unwrap_or_default();
    let gone = GONE_AFTER.as_secs_f64();
    let before: Option<String> = sqlx::query_scalar(HEARTBEAT_SQL)
        .bind(&fleet.name)
        .bind(&fleet.instance)
        .bind(admin_url)
        .bind(proxy_url)
        .bind(env!("CARGO_PKG_VERSION"))
        .bind(fleet.config_version())
        .bind(in_flight as i64)
        .bind(shared.admission.depth() as i64)
        .bind(fleet.is_keeper())
        .bind(gone)
        .fetch_one(&fleet.pool)
        .await?;
    let twin = before.is_some_and(|i| i != fleet.instance);
    let members = sqlx::query_as::<_, Member>(LIST_SQL).bind(gone).fetch_all(&fleet.pool).await?;
    Ok((members, twin))
}
