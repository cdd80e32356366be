//! Several brokers in front of one fleet, sharing one PostgreSQL (`[store] url`).
//!
//! The database is the fleet's meeting place, never the request path: each broker keeps
//! routing in memory and talks to PostgreSQL from background tasks only (records, config
//! versions through LISTEN/NOTIFY, heartbeats, capacity shares, client-key verifiers). With
//! SQLite (no `url`) none of this runs and a broker is on its own.

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use crate::config::StoreConfig;

/// Why the fleet's database could not be used.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("store.url \"{url}\" is not a PostgreSQL URL: {source}")]
    Url { url: String, source: sqlx::Error },
    #[error("cannot read the PostgreSQL password (keyring secret \"{name}\"): {source}")]
    Password { name: String, source: crate::secrets::SecretError },
    #[error("cannot reach the fleet's PostgreSQL at {url}: {source}")]
    Connect { url: String, source: sqlx::Error },
    #[error("cannot migrate the fleet's PostgreSQL at {url}: {source}")]
    Migrate { url: String, source: sqlx::migrate::MigrateError },
    #[error("fleet database query failed: {0}")]
    Query(#[from] sqlx::Error),
}

impl FleetError {
    pub fn code(&self) -> &'static str {
        match self {
            Self::Url { .. } => "fleet_url_invalid",
            Self::Password { .. } => "fleet_password_missing",
            Self::Connect { .. } => "fleet_unreachable",
            Self::Migrate { .. } => "fleet_migrate_failed",
            Self::Query(_) => "fleet_query_failed",
        }
    }
}

/// This broker's name among the fleet's: `store.broker`, else the host name.
pub fn broker_name(config: &StoreConfig) -> String {
    config.broker.clone().unwrap_or_else(|| {
        let host = gethostname::gethostname().to_string_lossy().into_owned();
        if host.is_empty() {
            "corral".into()
        } else {
            host
        }
    })
}

/// The URL as it may be shown: without a password (validation refuses one in the file, but
/// a URL can come from elsewhere).
pub fn display_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) => {
            let _ = u.set_password(None);
            u.to_string()
        }
        Err(_) => "(an invalid URL)".into(),
    }
}

/// A pool on the fleet's database, migrated to this build's schema
/// (`migrations/postgres/`). The password, if any, comes from the keyring.
pub async fn connect(config: &StoreConfig) -> Result<PgPool, FleetError> {
    let url = config.url.as_deref().unwrap_or_default();
    let shown = display_url(url);
    let mut opts: PgConnectOptions =
        url.parse().map_err(|source| FleetError::Url { url: shown.clone(), source })?;
    if let Some(name) = &config.password_secret {
        let name = name.clone();
        let secret = tokio::task::spawn_blocking({
            let name = name.clone();
            move || crate::secrets::get(&name)
        })
        .await
        .map_err(|e| FleetError::Connect { url: shown.clone(), source: sqlx::Error::Io(std::io::Error::other(e)) })?;
        let password = secret.map_err(|source| FleetError::Password { name, source })?;
        opts = opts.password(&password);
    }
    opts = opts.application_name("corral");
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(opts)
        .await
        .map_err(|source| FleetError::Connect { url: shown.clone(), source })?;
    sqlx::migrate!("./migrations/postgres")
        .run(&pool)
        .await
        .map_err(|source| FleetError::Migrate { url: shown, source })?;
    Ok(pool)
}
