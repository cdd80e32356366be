//! The store on PostgreSQL (`[store] url`), shared by a fleet of brokers: the pool, this
//! broker's name among the fleet's, and the URL as it may be shown.

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use super::StoreError;
use crate::config::StoreConfig;

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
pub async fn connect(config: &StoreConfig) -> Result<PgPool, StoreError> {
    let pool = open(config).await?;
    sqlx::migrate!("./migrations/postgres").run(&pool).await.map_err(|source| StoreError::Migrate {
        path: display_url(config.url.as_deref().unwrap_or_default()),
        source,
    })?;
    Ok(pool)
}

/// A pool on the fleet's database as it is, not migrated: for readers (`corral history`,
/// `corral report`), which never change the schema under the brokers.
pub async fn open(config: &StoreConfig) -> Result<PgPool, StoreError> {
    let url = config.url.as_deref().unwrap_or_default();
    let shown = display_url(url);
    let mut opts: PgConnectOptions = url.parse().map_err(|source| StoreError::Open { path: shown.clone(), source })?;
    if let Some(name) = &config.password_secret {
        let name = name.clone();
        let secret = tokio::task::spawn_blocking({
            let name = name.clone();
            move || crate::secrets::unclaimed(&name)
        })
        .await
        .map_err(|e| StoreError::Open { path: shown.clone(), source: sqlx::Error::Io(std::io::Error::other(e)) })?;
        let password = secret.map_err(|source| StoreError::Password { name, source })?;
        opts = opts.password(&password);
    }
    opts = opts.application_name("corral");
    PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(opts)
        .await
        .map_err(|source| StoreError::Open { path: shown, source })
}
