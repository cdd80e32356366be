//! Test hooks, off unless their variable is set (documented in README "Desktop app and UI"):
//!
//! - `CORRAL_DESKTOP_STATE=FILE`: the app keeps FILE (JSON, replaced atomically) up to date
//!   with what a person would see of it outside the window: the tray icon's look, its tooltip,
//!   every menu label, the last text put on the clipboard (read back from it), how many second
//!   launches were turned away, the last file saved and the start error, if any. A tray host
//!   is not needed to check the tray. It also allows the `test_tray_click` command, which runs
//!   a tray menu item by its id as a click would. The current tray icon is written beside
//!   FILE as `tray-icon.png`.
//! - `CORRAL_DESKTOP_SAVE_TO=DIR`: the save dialog answers `DIR/<suggested name>` at once
//!   instead of asking (see `save.rs`).

use std::path::PathBuf;
use std::sync::Mutex;

#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Report {
    pub icon: Option<&'static str>,
    pub tooltip: String,
    pub menu: Vec<String>,
    /// Node name -> ticked (enabled) in the Nodes submenu.
    pub nodes: Vec<(String, bool)>,
    pub muted: bool,
    pub copied: Option<String>,
    pub second_launches: u32,
    pub saved: Option<String>,
    pub error: Option<String>,
    pub screen_opened: Option<String>,
}

pub struct Inspect {
    file: Option<PathBuf>,
    report: Mutex<Report>,
}

impl Inspect {
    pub fn from_env() -> Self {
        Self { file: std::env::var_os("CORRAL_DESKTOP_STATE").map(PathBuf::from), report: Mutex::default() }
    }

    pub fn enabled(&self) -> bool {
        self.file.is_some()
    }

    /// Write the tray's current icon beside the state file (`tray-icon.png`).
    pub fn icon(&self, icon: crate::look::Icon) {
        let Some(file) = &self.file else { return };
        let path = file.with_file_name("tray-icon.png");
        match crate::icons::png(icon) {
            Ok(bytes) => {
                if let Err(e) = std::fs::write(&path, bytes) {
                    tracing::warn!(error = %e, file = %path.display(), "cannot write the tray icon file");
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot encode the tray icon"),
        }
    }

    /// Change the report and write it out (when the hook is on).
    pub fn update(&self, f: impl FnOnce(&mut Report)) {
        let Some(file) = &self.file else { return };
        let mut r = self.report.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut r);
        let Ok(text) = serde_json::to_string_pretty(&*r) else { return };
        let tmp = file.with_extension("tmp");
        if let Err(e) = std::fs::write(&tmp, text).and_then(|_| std::fs::rename(&tmp, file)) {
            tracing::warn!(error = %e, file = %file.display(), "cannot write the desktop state file");
        }
    }
}
