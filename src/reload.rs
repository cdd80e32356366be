//! Config hot reload: watch the config file and apply good edits without a restart.
//!
//! A change is parsed and validated as a whole; a bad edit keeps the running config and is
//! reported with every problem and its line (the log, `/admin/status`, and later the desktop
//! notification). A good one is applied through the same `Shared::apply` the admin API uses, so
//! nodes come and go without dropping in-flight requests. Listener and admin addresses are
//! bound once: a change to them is reported as needing a restart.
//!
//! The `notify` crate watches the file's directory (editors replace files rather than write
//! them in place); events are debounced so one save is one reload.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::proxy::Shared;

/// What the last reload did, for status displays.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ReloadStatus {
    pub reloads: u64,
    pub last_error: Option<String>,
}

/// Re-read `path` and apply it. Returns the error text when the file was refused.
pub fn reload(path: &Path, shared: &Shared) -> Result<(), String> {
    let next = Config::load(path).map_err(|e| e.to_string())?;
    let current = shared.config();
    if next.listeners != current.listeners || next.admin != current.admin {
        tracing::warn!("listener or admin addresses changed in the config: they apply at the next restart");
    }
    let mut applied = next;
    // Addresses stay as bound; everything else takes effect now.
    applied.listeners = current.listeners.clone();
    applied.admin = current.admin.clone();
    shared.apply(applied);
    Ok(())
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
                        error: result.as_ref().err().cloned(),
                    });
                    let mut s = status.lock().unwrap_or_else(|p| p.into_inner());
                    match result {
                        Ok(()) => {
                            s.reloads += 1;
                            s.last_error = None;
                            tracing::info!(path = %path.display(), "config reloaded");
                        }
                        Err(e) => {
                            tracing::error!(path = %path.display(), error = %e, "config reload refused; the running config stays");
                            s.last_error = Some(e);
                        }
                    }
                }
            }
        }
    })
}
