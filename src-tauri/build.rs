fn main() {
    // The app's own commands get permissions (`allow-save-file`, ...) that capabilities grant:
    // without this manifest Tauri refuses every app command to the window, whose UI is a
    // remote (loopback) origin.
    let manifest = tauri_build::AppManifest::new().commands(&["save_file", "test_tray_click"]);
    if let Err(e) = tauri_build::try_build(tauri_build::Attributes::new().app_manifest(manifest)) {
        panic!("tauri build step: {e:#}");
    }
}
