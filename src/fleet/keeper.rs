//! The keeper: one live broker of the fleet, elected by holding a PostgreSQL session advisory
//! lock on a connection of its own, runs the once-per-fleet jobs: it marks the `running`
//! requests of gone brokers `unknown` (their process ended or lost the database; a broker
//! that comes back overwrites them with how they really ended) and it alone runs the store's
//! retention. When the keeper's session ends (a SIGKILL closes its socket at once) the lock is
//! free and another broker takes it within one [`PERIOD`].

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgConnection;
use sqlx::Connection;
use tokio_util::sync::CancellationToken;

use super::{Fleet, GONE_AFTER};

/// How often the lock is tried (or, held, the jobs run).
pub const PERIOD: Duration = Duration::from_millis(500);

/// The advisory lock's key: "corral" in ASCII, then 1 (the keeper).
const KEEPER_LOCK: i64 = 0x636f_7272_616c_0001;

const MARK_GONE_SQL: &str = "UPDATE requests SET status = 'unknown' WHERE status = 'running' AND broker <> $1 \
     AND broker IN (SELECT name FROM brokers WHERE last_seen < now() - make_interval(secs => $2))";

/// Brokers gone for a day leave the list (and their capacity rows with them).
const FORGET_SQL: &str = "WITH old AS (DELETE FROM brokers WHERE last_seen < now() - interval '1 day' RETURNING name) \
     DELETE FROM node_shares WHERE broker IN (SELECT name FROM old)";

/// Quota windows end within 31 days; their rows are kept a day past that.
const OLD_QUOTAS_SQL: &str = "DELETE FROM quota_use WHERE updated_at < now() - interval '32 days'";

/// Try for the lock every [`PERIOD`]; while held, run the jobs. A lost connection loses the
/// lock with it: this broker stops being the keeper and tries again on a new connection.
pub async fn run(fleet: Arc<Fleet>, store: Option<crate::store::Store>, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut conn: Option<PgConnection> = None;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tick.tick() => {}
        }
        if conn.is_none() {
            match PgConnection::connect_with(&fleet.pool.connect_options()).await {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    tracing::debug!(error = %e, "keeper: cannot reach the database");
                    set_keeper(&fleet, store.as_ref(), false);
                    continue;
                }
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        if let Err(e) = turn(&fleet, store.as_ref(), c).await {
            tracing::warn!(error = %e, "keeper: the database connection failed; no longer the keeper");
            set_keeper(&fleet, store.as_ref(), false);
            conn = None;
        }
    }
    if let Some(c) = conn {
        // Closing the session releases the lock at once, for the next keeper.
        let _ = c.close().await;
    }
    set_keeper(&fleet, store.as_ref(), false);
}

/// Take the lock if free; as keeper, run the jobs once.
async fn turn(fleet: &Fleet, store: Option<&crate::store::Store>, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    if !fleet.is_keeper() {
        let got: bool =
            sqlx::query_scalar("SELECT pg_try_advisory_lock($1)").bind(KEEPER_LOCK).fetch_one(&mut *conn).await?;
        if !got {
            return Ok(());
        }
        tracing::info!(broker = %fleet.name, "this broker is now the fleet's keeper");
        set_keeper(fleet, store, true);
    }
    let marked = sqlx::query(MARK_GONE_SQL)
        .bind(&fleet.name)
        .bind(GONE_AFTER.as_secs_f64())
        .execute(&mut *conn)
        .await?
        .rows_affected();
    if marked > 0 {
        tracing::warn!(rows = marked, "requests left running by a gone broker marked unknown");
    }
    sqlx::query(FORGET_SQL).execute(&mut *conn).await?;
    sqlx::query(OLD_QUOTAS_SQL).execute(&mut *conn).await?;
    Ok(())
}

fn set_keeper(fleet: &Fleet, store: Option<&crate::store::Store>, on: bool) {
    fleet.keeper.store(on, Ordering::Release);
    if let Some(store) = store {
        store.set_runs_fleet_jobs(on);
    }
}
