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

/// The request store: `--db`, else the one the config (`--config`, or the platform's) names;
/// with neither given and no `corral serve` store yet, the one `corral demo` writes (said on
/// stderr), so `corral history` right after the demo shows the demo's requests.
fn store_path(db: Option<PathBuf>, config: Option<&Path>) -> Result<PathBuf, ExitCode> {
    if let Some(db) = db {
        return Ok(db);
    }
    let named = config::load(config).map(|(c, _, _)| corral::store::default_path(&c.store))?;
    let demo = demo::default_store();
    if config.is_none() && !named.exists() && demo.exists() {
        eprintln!("using the demo's store at {} (no `corral serve` store at {})", demo.display(), named.display());
        return Ok(demo);
    }
    Ok(named)
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
