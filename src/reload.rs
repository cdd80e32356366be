//! Config hot reload: watch the config file and apply good edits without a restart.
//!
//! A change is parsed and validated as a whole; a bad edit keeps the running config and is
//! reported with every problem and its line (the log, `/admin/status`, and later the desktop
//! notification). A good one is applied through the same `Shared::apply` the admin API uses, so
//! nodes come and go without dropping in-flight requests. What is bound at start (see
//! `state::RESTART_KEYS`) keeps its running value, and a change to it is reported, key by key,
//! as needing a restart.
//!
//! The `notify` crate watches the file's directory (editors replace files rather than write
//! them in place); events are debounced so one save is one reload.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio_util::sync::CancellationToken;

use crate::config::{Config, ConfigError};
use crate::state::{ReloadStatus, Shared};

/// Why a reload was refused: the file does not parse or does not validate.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("{0}")]
    Config(#[from] ConfigError),
}

impl ReloadError {
    pub fn code(&self) -> &'static str {
        match self {
            Self::Config(_) => "invalid_config",
        }
    }
}

/// Re-read `path` and apply it. Returns the changed keys that take effect only at the next
/// restart (the running values stay for those).
pub fn reload(path: &Path, shared: &Shared) -> Result<Vec<&'static str>, ReloadError> {
    // Read and apply under the edit lock: a file read just before an edit is written must
    // not be applied after it (it would undo the edit).
    let _one_at_a_time = shared.edit_lock();
    let next = Config::load(path)?;
    let current = shared.config();
    let pending = crate::state::restart_needed(&current, &next);
    if !pending.is_empty() {
        tracing::warn!(keys = ?pending, "config keys changed that take effect at the next restart");
    }
    let mut applied = next;
    // What is bound at start stays as bound; everything else takes effect now.
    applied.listeners = current.listeners.clone();
    applied.admin = current.admin.clone();
    applied.store = current.store.clone();
    applied.proxy.connect_timeout_ms = current.proxy.connect_timeout_ms;
    applied.proxy.header_read_timeout_ms = current.proxy.header_read_timeout_ms;
    applied.proxy.stream_buffer_total_bytes = current.proxy.stream_buffer_total_bytes;
    applied.telemetry = current.telemetry.clone();
    shared.apply(applied);
    Ok(pending)
}

/// Watch `path` until `cancel` fires. The watcher lives inside the returned task.
pub fn watch(
    path: PathBuf,
    shared: Arc<Shared>,
    status: Arc<Mutex<ReloadStatus>>,
    cancel: CancellationToken,
) -> notify::Result<impl std::future::Future<Output = ()>> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let file_name = path.file_name().map(|n| n.to_os_string());
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if let Ok(event) = event {
            let ours = event.paths.iter().any(|p| p.file_name().map(|n| n.to_os_string()) == file_name);
            if ours && (event.kind.is_modify() || event.kind.is_create()) {
                let _ = tx.send(());
            }
        }
    })?;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new(".")).to_path_buf();
    watcher.watch(&dir, RecursiveMode::NonRecursive)?;
    Ok(async move {
        let _watcher = watcher;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                got = rx.recv() => {
                    if got.is_none() {
                        break;
                    }
                    // Debounce: one save often fires several events.
                    tokio::time::sleep(Duration::from_millis(150)).await;
                    while rx.try_recv().is_ok() {}
                    let result = reload(&path, &shared);
                    shared.telemetry.publish(crate::telemetry::Event::ConfigReload {
                        ok: result.is_ok(),
                        error: result.as_ref().err().map(ToString::to_string),
                    });
                    record(&status, &path, result);
                }
            }
        }
    })
}

fn record(status: &Mutex<ReloadStatus>, path: &Path, result: Result<Vec<&'static str>, ReloadError>) {
    let mut s = status.lock().unwrap_or_else(|p| p.into_inner());
    match result {
        Ok(pending) => {
            s.reloads += 1;
            s.last_error = None;
            s.pending_restart = pending.into_iter().map(str::to_string).collect();
            tracing::info!(path = %path.display(), "config reloaded");
        }
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e, code = e.code(), "config reload refused; the running config stays");
            s.last_error = Some(e.to_string());
        }
    }
}
