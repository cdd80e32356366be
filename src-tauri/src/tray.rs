//! The tray: its icon (`icons.rs`, chosen by `look.rs`), tooltip and menu, kept in step with
//! the broker, and what each menu item does. Labels come from `look.rs` only.
//!
//! Node switches go through the admin API on loopback (as the window's do), so they are
//! validated and written to the config file the same way; pause and mute are the broker's and
//! the notifier's own switches.

use std::sync::atomic::Ordering;
use std::sync::Mutex;

use tauri::image::Image;
use tauri::menu::{CheckMenuItem, IsMenuItem, Menu, MenuItem, PredefinedMenuItem, Submenu};
use tauri::tray::{MouseButton, MouseButtonState, TrayIcon, TrayIconBuilder, TrayIconEvent};
use tauri::{AppHandle, Manager, Wry};
use tauri_plugin_clipboard_manager::ClipboardExt;
use tauri_plugin_dialog::{DialogExt, MessageDialogButtons, MessageDialogKind};
use tauri_plugin_opener::OpenerExt;

use crate::look::{self, Snapshot};
use crate::Shell;

/// The menu's items that change, kept to update them in place.
pub struct Tray {
    icon: TrayIcon,
    status: MenuItem<Wry>,
    nodes: Submenu<Wry>,
    node_items: Mutex<Vec<(String, CheckMenuItem<Wry>)>>,
    empty: MenuItem<Wry>,
    pause: MenuItem<Wry>,
    mute: CheckMenuItem<Wry>,
    last: Mutex<Option<Snapshot>>,
}

/// Build the tray with its full menu (node entries are filled by the first `refresh`).
pub fn build(app: &AppHandle, endpoint: &str, muted: bool) -> tauri::Result<Tray> {
    let sep = || PredefinedMenuItem::separator(app);
    let status = MenuItem::with_id(app, "status", "Starting…", false, None::<&str>)?;
    let empty = MenuItem::with_id(app, "no-nodes", look::NO_NODES, false, None::<&str>)?;
    let nodes = Submenu::with_id_and_items(app, "nodes", look::NODES, true, &[&empty])?;
    let item = |id: &str, label: &str| MenuItem::with_id(app, id, label, true, None::<&str>);
    let pause = item("pause", look::pause_label(true))?;
    let mute = CheckMenuItem::with_id(app, "mute", look::MUTE, true, muted, None::<&str>)?;
    let copies = look::connect_items(endpoint).map(|(id, label, _)| item(id, &label));
    let [a, b, c] = copies;
    let connect = Submenu::with_id_and_items(app, "connect", look::CONNECT, true, &[&a?, &b?, &c?])?;
    let menu = Menu::with_items(
        app,
        &[
            &status,
            &sep()?,
            &item("open", look::OPEN)?,
            &nodes,
            &connect,
            &item("browser", look::BROWSER)?,
            &item("config-dir", look::CONFIG_DIR)?,
            &item("logs-dir", look::LOGS_DIR)?,
            &sep()?,
            &pause,
            &mute,
            &sep()?,
            &item("quit", look::QUIT)?,
        ],
    )?;
    let icon = TrayIconBuilder::with_id("corral")
        .icon(image(look::Icon::NoNodes))
        .tooltip("Corral: starting")
        .menu(&menu)
        .show_menu_on_left_click(false)
        .on_menu_event(|app, event| on_menu(app, event.id.as_ref()))
        .on_tray_icon_event(|tray, event| {
            if let TrayIconEvent::Click { button: MouseButton::Left, button_state: MouseButtonState::Up, .. } = event {
                crate::show_window(tray.app_handle());
            }
        })
        .build(app)?;
    Ok(Tray { icon, status, nodes, node_items: Mutex::default(), empty, pause, mute, last: Mutex::default() })
}

fn image(icon: look::Icon) -> Image<'static> {
    Image::new_owned(crate::icons::rgba(icon), crate::icons::SIZE, crate::icons::SIZE)
}

/// The broker as the tray sees it now.
pub fn snapshot(shell: &Shell) -> Snapshot {
    let nodes = shell
        .registry
        .all()
        .iter()
        .map(|n| look::NodeView { name: n.name().to_string(), state: n.state(), in_flight: n.in_flight() })
        .collect();
    Snapshot {
        nodes,
        accepting: shell.shared.accepting(),
        queued: shell.shared.admission.depth(),
        muted: shell.muted.load(Ordering::Relaxed),
    }
}

impl Tray {
    /// Bring icon, tooltip and menu in line with `snap` (nothing when nothing changed).
    pub fn refresh(&self, app: &AppHandle, shell: &Shell, snap: Snapshot) -> tauri::Result<()> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.as_ref() == Some(&snap) {
            return Ok(());
        }
        let icon = look::icon_of(&snap);
        if last.as_ref().is_none_or(|l| look::icon_of(l) != icon) {
            self.icon.set_icon(Some(image(icon)))?;
            shell.inspect.icon(icon);
        }
        self.icon.set_tooltip(Some(look::tooltip(&snap)))?;
        self.status.set_text(look::status_line(&snap))?;
        self.pause.set_text(look::pause_label(snap.accepting))?;
        self.mute.set_checked(snap.muted)?;
        self.refresh_nodes(app, &snap)?;
        shell.inspect.update(|r| {
            r.icon = Some(icon.name());
            r.tooltip = look::tooltip(&snap);
            r.menu = look::menu_labels(&snap, &shell.endpoint);
            r.nodes = snap.nodes.iter().map(|n| (n.name.clone(), look::node_enabled(n))).collect();
            r.muted = snap.muted;
        });
        *last = Some(snap);
        Ok(())
    }

    /// One ticked entry per node; rebuilt when the set of names changes, else updated.
    fn refresh_nodes(&self, app: &AppHandle, snap: &Snapshot) -> tauri::Result<()> {
        let mut items = self.node_items.lock().unwrap_or_else(|p| p.into_inner());
        let same = items.len() == snap.nodes.len() && items.iter().zip(&snap.nodes).all(|((n, _), v)| *n == v.name);
        if !same {
            for (_, item) in items.drain(..) {
                self.nodes.remove(&item)?;
            }
            let _ = self.nodes.remove(&self.empty);
            for n in &snap.nodes {
                let id = format!("node:{}", n.name);
                let item =
                    CheckMenuItem::with_id(app, id, look::node_label(n), true, look::node_enabled(n), None::<&str>)?;
                self.nodes.append(&item)?;
                items.push((n.name.clone(), item));
            }
            if snap.nodes.is_empty() {
                self.nodes.append(&self.empty as &dyn IsMenuItem<Wry>)?;
            }
            return Ok(());
        }
        for ((_, item), n) in items.iter().zip(&snap.nodes) {
            item.set_text(look::node_label(n))?;
            item.set_checked(look::node_enabled(n))?;
        }
        Ok(())
    }
}

/// What a click on a menu item does, by its id (also the `test_tray_click` hook's entry).
pub fn on_menu(app: &AppHandle, id: &str) {
    let Some(shell) = app.try_state::<Shell>() else { return };
    match id {
        "open" => crate::show_window(app),
        "copy" | "copy-openai" | "copy-env" => copy_endpoint(app, &shell, id),
        "browser" => open(app, OpenWhat::Url(shell.browser_url.clone())),
        "config-dir" => open(app, OpenWhat::Dir(shell.config_dir.clone())),
        "logs-dir" => open(app, OpenWhat::Dir(shell.logs_dir.clone())),
        "pause" => shell.shared.set_accepting(!shell.shared.accepting()),
        "mute" => {
            let now = !shell.muted.load(Ordering::Relaxed);
            shell.muted.store(now, Ordering::Relaxed);
            tracing::info!(muted = now, "notifications");
        }
        "quit" => crate::quit(app),
        other => match other.strip_prefix("node:") {
            Some(node) => toggle_node(app, &shell, node.to_string()),
            None => tracing::debug!(id = other, "menu item without an action"),
        },
    }
    crate::kick(app);
}

/// Put the Connect entry `id`'s text (the endpoint, its `/v1` or the `OLLAMA_HOST` line) on
/// the clipboard.
fn copy_endpoint(app: &AppHandle, shell: &Shell, id: &str) {
    let items = look::connect_items(&shell.endpoint);
    let Some((_, _, text)) = items.into_iter().find(|(i, _, _)| *i == id) else { return };
    match app.clipboard().write_text(text.clone()) {
        Ok(()) => {
            tracing::info!(copied = %text, "endpoint copied");
            if shell.inspect.enabled() {
                let back = app.clipboard().read_text().ok();
                shell.inspect.update(|r| r.copied = back);
            }
        }
        Err(e) => error(app, format!("Cannot copy the endpoint: {e}")),
    }
}

enum OpenWhat {
    Url(String),
    Dir(std::path::PathBuf),
}

fn open(app: &AppHandle, what: OpenWhat) {
    let result = match &what {
        OpenWhat::Url(u) => app.opener().open_url(u, None::<&str>),
        OpenWhat::Dir(d) => {
            if let Err(e) = corral::config::create_private_dir(d) {
                tracing::warn!(dir = %d.display(), error = %e, "cannot create the folder");
            }
            app.opener().open_path(d.display().to_string(), None::<&str>)
        }
    };
    if let Err(e) = result {
        let what = match what {
            OpenWhat::Url(_) => "the UI in a browser".to_string(),
            OpenWhat::Dir(d) => d.display().to_string(),
        };
        error(app, format!("Cannot open {what}: {e}"));
    }
}

/// Enable or disable `node` through the admin API; disabling the last serving node asks first.
fn toggle_node(app: &AppHandle, shell: &Shell, node: String) {
    let Some(n) = shell.registry.get(&node) else { return };
    let enable = !n.enabled();
    let others_serve = shell.registry.all().iter().any(|o| o.name() != node && o.enabled() && o.is_available());
    let ask = format!("{node} is the last node serving. Disabling it leaves the cluster with no capacity: every request waits, then fails or goes to the cloud.");
    let (app, client, base, token) = (app.clone(), shell.http.clone(), shell.admin_url.clone(), shell.token.clone());
    let send = move |app: AppHandle| {
        tauri::async_runtime::spawn(async move {
            let url = format!("{base}/admin/nodes/{node}");
            let body = serde_json::json!({ "enabled": enable });
            let r = client.patch(url).bearer_auth(token).json(&body).send().await;
            match r.map(|r| (r.status(), r)) {
                Ok((s, _)) if s.is_success() => tracing::info!(%node, enable, "node switched from the tray"),
                Ok((_, r)) => {
                    let why = r.text().await.unwrap_or_default();
                    error(&app, format!("Cannot {} {node}: {why}", if enable { "enable" } else { "disable" }));
                }
                Err(e) => error(&app, format!("Cannot reach the broker to switch {node}: {e}")),
            }
            crate::kick(&app);
        });
    };
    if enable || others_serve {
        return send(app);
    }
    let confirm = app.dialog().message(ask).title("Disable the last node?").kind(MessageDialogKind::Warning);
    let confirm = confirm.buttons(MessageDialogButtons::OkCancelCustom("Disable".into(), "Cancel".into()));
    confirm.show(move |yes| {
        if yes {
            send(app)
        }
    });
}

/// Tell the person: a native message box (and the log).
pub fn error(app: &AppHandle, text: String) {
    tracing::warn!(error = %text, "tray action failed");
    app.dialog().message(text).title("Corral").kind(MessageDialogKind::Error).show(|_| {});
}
