//! Client keys fleet-wide: every broker follows the verifiers in `client_keys` (on a
//! `corral_keys` notification and every [`EVERY`]) into `clients::ClientKeys`, which checks a
//! bearer against them beside the keyring's values, and adds its per-key usage to `key_usage`
//! every [`EVERY`]. The database never sees a key, only its SHA-256; a broker never sends one.
//! While the database is away, the verifiers last read stay in force (a revoke made meanwhile
//! reaches this broker when it returns) and usage accumulates here, given back on a failed flush.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgListener, PgPool};
use tokio_util::sync::CancellationToken;

use super::{listen, notified, Fleet};
use crate::clients::{parse_verifier, ClientKeys, Usage};
use crate::quota::{now_s, Quotas, Use};

/// How often verifiers are re-read and usage is flushed.
pub const EVERY: Duration = Duration::from_secs(1);

const VERIFIERS_SQL: &str = "SELECT name, verifier FROM client_keys ORDER BY name";
const USAGE_SQL: &str = "INSERT INTO key_usage (name, broker, requests, prompt_tokens, output_tokens) \
     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (name, broker) DO UPDATE SET \
     requests = key_usage.requests + EXCLUDED.requests, prompt_tokens = key_usage.prompt_tokens + EXCLUDED.prompt_tokens, \
     output_tokens = key_usage.output_tokens + EXCLUDED.output_tokens, updated_at = now()";
const CREATE_SQL: &str =
    "INSERT INTO client_keys (name, verifier, created_by) VALUES ($1, $2, $3) ON CONFLICT (name) DO NOTHING";
const QUOTA_WRITE_SQL: &str = "INSERT INTO quota_use (name, window_s, window_start, broker, requests, tokens) \
     VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (name, window_s, window_start, broker) DO UPDATE SET \
     requests = GREATEST(quota_use.requests, EXCLUDED.requests), tokens = GREATEST(quota_use.tokens, EXCLUDED.tokens), \
     updated_at = now()";
const QUOTA_READ_SQL: &str = "SELECT name, window_s, window_start, broker, requests, tokens FROM quota_use \
     WHERE window_start = ANY($1)";
const TOTALS_SQL: &str =
    "SELECT name, SUM(requests)::BIGINT AS requests, SUM(prompt_tokens)::BIGINT AS prompt_tokens, \
     SUM(output_tokens)::BIGINT AS output_tokens \
     FROM key_usage GROUP BY name ORDER BY name";

/// A key's usage summed over the fleet's brokers.
#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct KeyUsage {
    pub name: String,
    pub requests: i64,
    pub prompt_tokens: i64,
    pub output_tokens: i64,
}

/// Record a new key's verifier; false when the name is taken in the fleet.
pub async fn create(fleet: &Fleet, name: &str, verifier: &str) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(CREATE_SQL).bind(name).bind(verifier).bind(fleet.name()).execute(fleet.pool()).await?;
    Ok(done.rows_affected() == 1)
}

/// Remove a key's verifier from the fleet; false when there was none.
pub async fn revoke(fleet: &Fleet, name: &str) -> Result<bool, sqlx::Error> {
    let done = sqlx::query("DELETE FROM client_keys WHERE name = $1").bind(name).execute(fleet.pool()).await?;
    Ok(done.rows_affected() == 1)
}

/// Names of the fleet's keys.
pub async fn names(fleet: &Fleet) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar("SELECT name FROM client_keys ORDER BY name").fetch_all(fleet.pool()).await
}

/// Every key's usage summed over the brokers.
pub async fn usage(fleet: &Fleet) -> Result<Vec<KeyUsage>, sqlx::Error> {
    sqlx::query_as(TOTALS_SQL).fetch_all(fleet.pool()).await
}

/// Before serving: the fleet's keys, so they work from the first request (bounded wait).
pub async fn first_load(fleet: &Fleet, keys: &ClientKeys) {
    match tokio::time::timeout(Duration::from_secs(3), load(fleet.pool())).await {
        Ok(Ok(loaded)) => {
            keys.set_verifiers(loaded);
        }
        Ok(Err(e)) => tracing::warn!(error = %e, "cannot read the fleet's client keys at start; following them"),
        Err(_) => tracing::warn!("the fleet's database did not answer at start; its client keys follow"),
    }
}

/// Follow verifiers and flush usage until `cancel` fires; the last usage is flushed at the end.
pub async fn run(
    fleet: Arc<Fleet>,
    keys: Arc<ClientKeys>,
    usage: Arc<Usage>,
    quotas: Arc<Quotas>,
    cancel: CancellationToken,
) {
    usage.start_counting();
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut listener: Option<PgListener> = None;
    loop {
        if listener.is_none() {
            listener = listen(fleet.pool(), "corral_keys").await;
        }
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tick.tick() => {
                flush(&fleet, &usage).await;
                if let Err(e) = sync_quotas(&fleet, &quotas).await {
                    tracing::debug!(error = %e, "cannot share quota windows; counting on with the last known");
                }
            }
            got = notified(&mut listener) => {
                if got.is_err() {
                    listener = None;
                }
            }
        }
        match load(fleet.pool()).await {
            Ok(loaded) => {
                if keys.set_verifiers(loaded) {
                    tracing::info!("the fleet's client keys changed");
                }
            }
            Err(e) => tracing::debug!(error = %e, "cannot read the fleet's client keys; keeping the last ones"),
        }
    }
    flush(&fleet, &usage).await;
}

pub async fn load(pool: &PgPool) -> Result<Vec<(String, crate::clients::Digest)>, sqlx::Error> {
    let rows: Vec<(String, String)> = sqlx::query_as(VERIFIERS_SQL).fetch_all(pool).await?;
    Ok(rows
        .into_iter()
        .filter_map(|(name, v)| match parse_verifier(&v) {
            Some(d) => Some((name, d)),
            None => {
                tracing::warn!(client_key = %name, "a fleet client key's verifier is not 64 hex digits; ignored");
                None
            }
        })
        .collect())
}

/// Add this broker's counts to the database in one transaction; on failure keep them here.
async fn flush(fleet: &Fleet, usage: &Usage) {
    let taken = usage.take();
    if taken.is_empty() {
        return;
    }
    let result = async {
        let mut tx = fleet.pool().begin().await?;
        for (name, c) in &taken {
            sqlx::query(USAGE_SQL)
                .bind(name)
                .bind(fleet.name())
                .bind(c.requests)
                .bind(c.prompt_tokens)
                .bind(c.output_tokens)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await
    }
    .await;
    if let Err(e) = result {
        tracing::debug!(error = %e, "cannot add client-key usage to the database; kept for the next flush");
        usage.give_back(taken);
    }
}

/// Write this broker's counts of the current quota windows, then read everyone's.
async fn sync_quotas(fleet: &Fleet, quotas: &Quotas) -> Result<(), sqlx::Error> {
    let lengths = quotas.window_lengths();
    if lengths.is_empty() {
        return Ok(());
    }
    let now = now_s();
    let as_i64 = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let mine = quotas.mine(now);
    if !mine.is_empty() {
        let mut tx = fleet.pool().begin().await?;
        for (name, window_s, start, used) in &mine {
            sqlx::query(QUOTA_WRITE_SQL)
                .bind(name)
                .bind(as_i64(*window_s))
                .bind(as_i64(*start))
                .bind(fleet.name())
                .bind(as_i64(used.requests))
                .bind(as_i64(used.tokens))
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
    }
    let starts: Vec<i64> = lengths.iter().map(|w| as_i64(now / w.max(&1) * w.max(&1))).collect();
    let rows: Vec<(String, i64, i64, String, i64, i64)> =
        sqlx::query_as(QUOTA_READ_SQL).bind(&starts).fetch_all(fleet.pool()).await?;
    let as_u64 = |n: i64| u64::try_from(n).unwrap_or(0);
    let rows: Vec<_> = rows
        .into_iter()
        .map(|(name, window_s, start, broker, requests, tokens)| {
            let own = broker == fleet.name();
            (name, as_u64(window_s), as_u64(start), own, Use { requests: as_u64(requests), tokens: as_u64(tokens) })
        })
        .collect();
    quotas.set_fleet(&rows, now);
    Ok(())
}
