//! The `corral` binary's commands, one module each; `args` holds their clap definitions.
//!
//! Each command parses nothing itself (`main.rs` did) and decides no broker behaviour: it loads
//! what it needs, calls the library, prints, and returns the exit code (0 ok, 1 runtime failure,
//! 2 usage or validation error). What several commands share lives here: where the store is, the
//! admin token for a broker this process starts, and waiting for a stop signal.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use corral::StartOptions;

pub mod args;
pub mod bench;
pub mod config;
pub mod demo;
pub mod drill;
pub mod history;
pub mod man;
pub mod models;
pub mod report;
pub mod secret;
pub mod serve;
pub mod sim;
pub mod status;

/// Where `history` and `report` read the records: a SQLite file, or a fleet's PostgreSQL.
enum Records {
    File(PathBuf),
    Fleet(corral::config::StoreConfig),
}

/// The request store: `--db`, else the one the config (`--config`, or the platform's) names
/// (its PostgreSQL with `store.url`); with neither given and no `corral serve` store yet, the
/// one `corral demo` writes (said on stderr), so `corral history` right after the demo shows
/// the demo's requests.
fn records_at(db: Option<PathBuf>, config: Option<&Path>) -> Result<Records, ExitCode> {
    if let Some(db) = db {
        return Ok(Records::File(db));
    }
    let store = config::load(config).map(|(c, _, _)| c.store)?;
    if store.url.is_some() {
        return Ok(Records::Fleet(store));
    }
    let named = corral::store::default_path(&store);
    let demo = demo::default_store();
    if config.is_none() && !named.exists() && demo.exists() {
        eprintln!("using the demo's store at {} (no `corral serve` store at {})", demo.display(), named.display());
        return Ok(Records::File(demo));
    }
    Ok(Records::File(named))
}

/// The records, opened for reading: the SQLite file read-only (WAL lets it be read beside a
/// live broker), or a pool on the fleet's PostgreSQL that leaves its schema as it is.
async fn open_records(at: &Records) -> Result<corral::store::Pool, String> {
    match at {
        Records::File(db) if !db.exists() => {
            Err(format!("no request store at {}; has `corral serve` run? (or pass --db FILE)", db.display()))
        }
        Records::File(db) => corral::store::open_pool(db, true).await.map_err(|e| e.to_string()),
        Records::Fleet(store) => {
            corral::store::pg::open(store).await.map(corral::store::Pool::Postgres).map_err(|e| e.to_string())
        }
    }
}

/// The admin token from `CORRAL_ADMIN_TOKEN`, else one generated for this run.
fn start_options() -> StartOptions {
    StartOptions { admin_token: env_token(), ..StartOptions::default() }
}

fn env_token() -> Option<String> {
    std::env::var("CORRAL_ADMIN_TOKEN").ok().filter(|t| !t.is_empty())
}

/// Whether the admin token is the user's own (so it is not printed).
fn token_from_env() -> bool {
    env_token().is_some()
}

/// Returns on SIGINT (Ctrl-C) or, on Unix, SIGTERM.
async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
