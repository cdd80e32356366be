//! Saving what the UI hands over (config export, requests CSV): a native save dialog
//! (tauri-plugin-dialog), then the file written here in Rust. The window gets no file-system
//! permission of its own: it can only hand text to this command, and only the path the person
//! picked is written.
//!
//! Test hook: with `CORRAL_DESKTOP_SAVE_TO=DIR` the dialog is not shown and the answer is
//! `DIR/<suggested name>`, so a WebDriver test can check the file got written.

use std::path::{Path, PathBuf};

use tauri::{AppHandle, Manager};
use tauri_plugin_dialog::DialogExt;

/// Only a plain file name is suggested: the UI cannot steer where the dialog starts.
fn suggested(name: &str) -> String {
    let base = Path::new(name).file_name().and_then(|n| n.to_str()).unwrap_or("");
    if base.is_empty() || base.starts_with('.') {
        "corral-export.txt".into()
    } else {
        base.to_string()
    }
}

/// Where to write: the test hook's directory, else what the person picked (None: cancelled).
fn ask(app: &AppHandle, name: &str) -> Result<Option<PathBuf>, String> {
    if let Some(dir) = std::env::var_os("CORRAL_DESKTOP_SAVE_TO") {
        let path = Path::new(&dir).join(name);
        tracing::info!(path = %path.display(), "save dialog answered by CORRAL_DESKTOP_SAVE_TO (test hook)");
        return Ok(Some(path));
    }
    let ext = Path::new(name).extension().and_then(|e| e.to_str()).unwrap_or("txt").to_string();
    let picked =
        app.dialog().file().set_title("Save").set_file_name(name).add_filter(ext.clone(), &[&ext]).blocking_save_file();
    match picked {
        None => Ok(None),
        Some(p) => p.into_path().map(Some).map_err(|e| format!("the dialog gave no usable path: {e}")),
    }
}

/// Save `text` under a name the person picks, suggesting `name`. Returns the path written, or
/// None when the person cancelled; an error says what failed, for the window to show.
#[tauri::command]
pub async fn save_file(app: AppHandle, name: String, text: String) -> Result<Option<String>, String> {
    let name = suggested(&name);
    // The dialog blocks until answered: off the async workers.
    let handle = app.clone();
    let path = tauri::async_runtime::spawn_blocking(move || ask(&handle, &name))
        .await
        .map_err(|e| format!("the save dialog failed: {e}"))??;
    let Some(path) = path else { return Ok(None) };
    let shown = path.display().to_string();
    let result = tokio::fs::write(&path, text).await.map_err(|e| format!("cannot write {shown}: {e}"));
    if let Some(i) = app.try_state::<std::sync::Arc<crate::inspect::Inspect>>() {
        let r = result.as_ref().map(|_| shown.clone()).unwrap_or_else(|e| format!("error: {e}"));
        i.update(|s| s.saved = Some(r));
    }
    match result {
        Ok(()) => {
            tracing::info!(path = %shown, "saved");
            Ok(Some(shown))
        }
        Err(e) => {
            tracing::warn!(error = %e, "save failed");
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_plain_file_name_is_suggested() {
        assert_eq!(suggested("corral-config.toml"), "corral-config.toml");
        assert_eq!(suggested("../../etc/passwd"), "passwd");
        assert_eq!(suggested("/tmp/x.csv"), "x.csv");
        assert_eq!(suggested(".bashrc"), "corral-export.txt");
        assert_eq!(suggested(""), "corral-export.txt");
    }
}
