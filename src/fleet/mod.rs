//! Several brokers in front of one fleet, sharing one PostgreSQL (`[store] url`).
//!
//! The database is the fleet's meeting place, never the request path: each broker keeps
//! routing in memory and talks to PostgreSQL from background tasks only (config versions
//! through LISTEN/NOTIFY, heartbeats and membership, once-per-fleet jobs under an advisory
//! lock, capacity shares, client-key verifiers and usage). The pool itself is the store's
//! (`crate::store::pg`). With SQLite (no `url`) none of this runs and a broker is on its own.

pub mod capacity;
pub mod config;
pub mod keeper;
pub mod keys;
pub mod members;
pub mod shares;

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde::Serialize;
use sqlx::postgres::PgPool;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::state::Shared;

/// A broker is gone this long after its last heartbeat (the database's clock).
pub const GONE_AFTER: Duration = Duration::from_secs(5);

/// How often a broker heartbeats its row and re-reads the fleet's.
pub const HEARTBEAT: Duration = Duration::from_secs(1);

/// What this broker knows of its fleet: its name and instance, the pool on the fleet's
/// database, the members as last read, and whether it is the keeper. Read by the admin API;
/// written by the tasks of [`Fleet::start`].
#[derive(Debug)]
pub struct Fleet {
    pool: PgPool,
    name: String,
    /// Random per process: two processes under one name are told apart (and warned about).
    instance: String,
    urls: OnceLock<(String, String)>,
    keeper: AtomicBool,
    members: Mutex<members::Seen>,
    /// The shared config version in force (-1: none), heartbeated for the brokers' list.
    config_version: AtomicI64,
    /// How the shared config stands here, for `/admin/status`.
    sync: Mutex<config::ConfigSync>,
}

impl Fleet {
    /// The fleet of a store on PostgreSQL; `None` for SQLite (a broker alone).
    pub fn of(store: &crate::store::Store) -> Option<Arc<Self>> {
        let crate::store::Pool::Postgres(pool) = store.pool() else { return None };
        Some(Arc::new(Self {
            pool: pool.clone(),
            name: store.broker().to_string(),
            instance: uuid::Uuid::new_v4().simple().to_string(),
            urls: OnceLock::new(),
            keeper: AtomicBool::new(false),
            members: Mutex::new(members::Seen::default()),
            config_version: AtomicI64::new(-1),
            sync: Mutex::new(config::ConfigSync::default()),
        }))
    }

    /// This broker's name among the fleet's.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Whether this broker runs the once-per-fleet jobs now.
    pub fn is_keeper(&self) -> bool {
        self.keeper.load(Ordering::Acquire)
    }

    /// The shared config version in force, when there is one.
    pub fn config_version(&self) -> Option<i64> {
        Some(self.config_version.load(Ordering::Acquire)).filter(|v| *v >= 0)
    }

    pub fn set_config_version(&self, version: i64) {
        self.config_version.store(version, Ordering::Release);
    }

    pub fn update_sync(&self, change: impl FnOnce(&mut config::ConfigSync)) {
        change(&mut self.sync.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
    }

    /// The members as last read (at most one heartbeat old while the database answers).
    pub fn members(&self) -> members::Seen {
        self.members.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Start heartbeats and membership, the keeper's election and jobs, capacity shares and
    /// the shared config's task (after its first sync), once the listeners are up (their
    /// addresses go into the heartbeat).
    pub fn start(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        sync: config::Sync,
        tracker: &TaskTracker,
        cancel: &CancellationToken,
    ) {
        let (proxy, _) = shared.front();
        let proxy = reachable(proxy.first().map(String::as_str).unwrap_or_default());
        let admin = shared.admin_addr().map(|a| format!("http://{a}")).unwrap_or_default();
        let _ = self.urls.set((admin, proxy));
        // Until the first rebalance, take no slot: another broker may hold them all.
        for node in shared.registry.all().iter() {
            node.set_fleet_share(0);
        }
        tracker.spawn(members::run(Arc::clone(self), Arc::clone(shared), cancel.clone()));
        tracker.spawn(keeper::run(Arc::clone(self), shared.telemetry.store().cloned(), cancel.clone()));
        tracker.spawn(shares::run(Arc::clone(self), Arc::clone(shared), cancel.clone()));
        tracker.spawn(config::run(sync, cancel.clone()));
        tracker.spawn(keys::run(
            Arc::clone(self),
            Arc::clone(&shared.client_keys),
            Arc::clone(shared.telemetry.usage()),
            Arc::clone(shared.telemetry.quotas()),
            cancel.clone(),
        ));
        tracker.spawn(config::watch_secrets(Arc::clone(self), Arc::clone(shared), cancel.clone()));
        tracing::info!(broker = %self.name, instance = %self.instance, "fleet member: heartbeats, keeper election and capacity shares started");
    }

    /// What `/admin/status` shows under `fleet`.
    pub fn status(&self) -> FleetStatus {
        let seen = self.members();
        FleetStatus {
            broker: self.name.clone(),
            keeper: self.is_keeper(),
            live_brokers: seen.live(),
            last_contact_ms_ago: seen.read_at.map(|t| t.elapsed().as_millis() as u64),
            last_error: seen.last_error.clone(),
            config: self.sync.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone(),
        }
    }
}

/// A connection listening on `channel`; `None` while the database does not answer (the
/// caller's poll covers the gap, and it tries again on its next round).
async fn listen(pool: &PgPool, channel: &str) -> Option<sqlx::postgres::PgListener> {
    let mut l = sqlx::postgres::PgListener::connect_with(pool).await.ok()?;
    l.listen(channel).await.ok()?;
    Some(l)
}

/// The next notification, or forever without a listener.
async fn notified(listener: &mut Option<sqlx::postgres::PgListener>) -> Result<(), sqlx::Error> {
    match listener {
        Some(l) => l.recv().await.map(|_| ()),
        None => std::future::pending().await,
    }
}

/// A listener's URL as other machines reach it: one bound to every address (`0.0.0.0`, `[::]`)
/// is shown under this host's name.
fn reachable(url: &str) -> String {
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    match url.strip_prefix("http://0.0.0.0:").or_else(|| url.strip_prefix("http://[::]:")) {
        Some(port) if !host.is_empty() => format!("http://{host}:{port}"),
        _ => url.to_string(),
    }
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct FleetStatus {
    pub broker: String,
    /// This broker runs the once-per-fleet jobs (marking gone brokers' requests, retention).
    pub keeper: bool,
    pub live_brokers: usize,
    /// Since the membership was last read from the database; `None` before the first read.
    pub last_contact_ms_ago: Option<u64>,
    /// The last database error of the membership task, while it fails.
    pub last_error: Option<String>,
    /// The shared config: version in force, a refused version and why, missing secrets.
    pub config: config::ConfigSync,
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_listener_on_every_address_is_shown_under_the_host_name() {
        let host = gethostname::gethostname().to_string_lossy().into_owned();
        assert_eq!(super::reachable("http://0.0.0.0:11400"), format!("http://{host}:11400"));
        assert_eq!(super::reachable("http://[::]:11400"), format!("http://{host}:11400"));
        assert_eq!(super::reachable("http://10.0.0.11:11400"), "http://10.0.0.11:11400");
    }
}
