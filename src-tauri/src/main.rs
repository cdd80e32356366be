//! Corral's desktop shell. It owns shell features only: the window, the tray, desktop
//! notifications, file dialogs. The broker runs embedded on Tauri's tokio runtime and the
//! window shows the broker's own UI from its loopback admin listener, so everything the window
//! can do, the admin API (and `corral serve` in a browser) can do too. The admin token comes
//! from the OS keyring and travels in the URL fragment: nobody types it.
//!
//! Closing the window keeps Corral running in the tray; Quit drains in-flight requests first.

#![cfg_attr(not(debug_assertions), windows_subsystem = "windows")]

mod tray;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use corral::config::Config;
use corral::sim::SimNode;
use corral::{Broker, StartOptions};
use tauri::image::Image;
use tauri::menu::{CheckMenuItem, Menu, MenuItem, PredefinedMenuItem};
use tauri::tray::{MouseButton, MouseButtonState, TrayIconBuilder, TrayIconEvent};
use tauri::{AppHandle, Manager, RunEvent, WebviewUrl, WebviewWindowBuilder, WindowEvent};
use tauri_plugin_dialog::{DialogExt, MessageDialogKind};
use tokio_util::sync::CancellationToken;

/// What the shell keeps while it runs.
struct Shell {
    broker: Mutex<Option<Broker>>,
    stop: CancellationToken,
    ui_url: String,
    /// The demo cluster, when there was nothing to front.
    _sims: Vec<SimNode>,
}

/// Where the cluster comes from: `CORRAL_CONFIG` or the config file, else an Ollama on the
/// default port, else the demo cluster of simulated nodes.
async fn start_broker() -> Result<(Broker, Vec<SimNode>, String), String> {
    let path = std::env::var_os("CORRAL_CONFIG").map(std::path::PathBuf::from).or_else(corral::config::default_path);
    let token =
        std::env::var("CORRAL_ADMIN_TOKEN").ok().filter(|t| !t.is_empty()).or_else(
            || match corral::secrets::admin_token() {
                Ok(t) => Some(t),
                Err(e) => {
                    tracing::warn!(error = %e, "admin token not kept in the keyring; using one for this run");
                    None
                }
            },
        );
    let mut sims = Vec::new();
    let (config, source, watch) = match path.filter(|p| p.exists()) {
        Some(p) => {
            let c = Config::load(&p).map_err(|e| format!("{}: {e}", p.display()))?;
            (c, p.display().to_string(), Some(p))
        }
        None if ollama_on_default_port().await => (Config::default(), "the Ollama on 127.0.0.1:11434".into(), None),
        None => {
            let (s, nodes) =
                corral::sim::demo_nodes(3).await.map_err(|e| format!("cannot start the demo nodes: {e}"))?;
            sims = s;
            let mut c = Config { nodes, ..Config::default() };
            let (cloud, provider, categories) =
                corral::sim::demo_cloud().await.map_err(|e| format!("cannot start the simulated cloud: {e}"))?;
            sims.push(cloud);
            c.providers.push(provider);
            c.categories.extend(categories);
            c.store.path =
                Some(corral::store::default_path(&c.store).with_file_name("corral-demo.db").display().to_string());
            (c, "the demo cluster (no config, no Ollama on 127.0.0.1:11434)".into(), None)
        }
    };
    let options =
        StartOptions { admin_token: token, config_path: watch, demo: !sims.is_empty(), ..StartOptions::default() };
    let broker = Broker::start(config, options).await.map_err(|e| e.to_string())?;
    Ok((broker, sims, source))
}

/// Whether something listens on Ollama's default port (a bare connect, within half a second).
async fn ollama_on_default_port() -> bool {
    let connect = tokio::net::TcpStream::connect("127.0.0.1:11434");
    matches!(tokio::time::timeout(std::time::Duration::from_millis(500), connect).await, Ok(Ok(_)))
}

fn show_window(app: &AppHandle) {
    let Some(shell) = app.try_state::<Shell>() else { return };
    if let Some(w) = app.get_webview_window("main") {
        let _ = w.show();
        let _ = w.unminimize();
        let _ = w.set_focus();
        return;
    }
    let url = match shell.ui_url.parse() {
        Ok(u) => u,
        Err(e) => {
            tracing::error!(error = %e, "bad UI URL");
            return;
        }
    };
    if let Err(e) = WebviewWindowBuilder::new(app, "main", WebviewUrl::External(url))
        .title("Corral")
        .inner_size(1280.0, 860.0)
        .min_inner_size(760.0, 520.0)
        .build()
    {
        tracing::error!(error = %e, "cannot open the window");
    }
}

fn quit(app: &AppHandle) {
    let app = app.clone();
    tauri::async_runtime::spawn(async move {
        let broker = app.try_state::<Shell>().and_then(|s| {
            s.stop.cancel();
            s.broker.lock().unwrap_or_else(|p| p.into_inner()).take()
        });
        if let Some(b) = broker {
            tracing::info!("quitting: letting in-flight requests finish");
            b.shutdown().await;
        }
        app.exit(0);
    });
}

/// Save a file the UI hands over (config export, CSV), where the person picks.
#[tauri::command]
async fn save_file(app: AppHandle, name: String, text: String) -> Result<Option<String>, String> {
    let Some(path) = app.dialog().file().set_file_name(&name).blocking_save_file() else { return Ok(None) };
    let path = path.into_path().map_err(|e| e.to_string())?;
    std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(Some(path.display().to_string()))
}

fn setup(app: &mut tauri::App) -> Result<(), Box<dyn std::error::Error>> {
    let (broker, sims, source) = match tauri::async_runtime::block_on(start_broker()) {
        Ok(b) => b,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the broker");
            app.dialog()
                .message(format!("Corral cannot start:\n\n{e}"))
                .kind(MessageDialogKind::Error)
                .title("Corral")
                .blocking_show();
            std::process::exit(2);
        }
    };
    tracing::info!(%source, proxy = %broker.proxy_addr(), admin = %broker.admin_addr(), "broker started");
    let ui_url = format!("http://{}/ui/#token={}", broker.admin_addr(), broker.admin_token());
    let shared = Arc::clone(broker.shared());
    let muted = Arc::new(AtomicBool::new(std::env::var_os("CORRAL_MUTE").is_some()));
    let stop = CancellationToken::new();
    tauri::async_runtime::spawn(corral::alerts::run(shared.telemetry.subscribe(), Arc::clone(&muted), stop.clone()));

    let open = MenuItem::with_id(app, "open", "Open Corral", true, None::<&str>)?;
    let pause = CheckMenuItem::with_id(app, "pause", "Pause accepting requests", true, false, None::<&str>)?;
    let mute =
        CheckMenuItem::with_id(app, "mute", "Mute notifications", true, muted.load(Ordering::Relaxed), None::<&str>)?;
    let quit_item = MenuItem::with_id(app, "quit", "Quit (let requests finish)", true, None::<&str>)?;
    let menu = Menu::with_items(
        app,
        &[&open, &PredefinedMenuItem::separator(app)?, &pause, &mute, &PredefinedMenuItem::separator(app)?, &quit_item],
    )?;
    let tray = TrayIconBuilder::with_id("corral")
        .icon(Image::from_bytes(tray::TrayState::Unknown.icon())?)
        .tooltip("Corral: starting")
        .menu(&menu)
        .on_menu_event({
            let shared = Arc::clone(&shared);
            let muted = Arc::clone(&muted);
            move |app, event| match event.id.as_ref() {
                "open" => show_window(app),
                "pause" => shared.set_accepting(!shared.accepting()),
                "mute" => {
                    let now = !muted.load(Ordering::Relaxed);
                    muted.store(now, Ordering::Relaxed);
                    tracing::info!(muted = now, "notifications");
                }
                "quit" => quit(app),
                _ => {}
            }
        })
        .on_tray_icon_event(|tray, event| {
            if let TrayIconEvent::Click { button: MouseButton::Left, button_state: MouseButtonState::Up, .. } = event {
                show_window(tray.app_handle());
            }
        })
        .build(app)?;

    // Keep the tray's icon and tooltip in step with the nodes.
    let mut events = shared.telemetry.subscribe();
    let registry = Arc::clone(broker.registry());
    let stop_tray = stop.clone();
    let shared_tray = Arc::clone(&shared);
    tauri::async_runtime::spawn(async move {
        let mut last = None;
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(2));
        loop {
            tokio::select! {
                _ = stop_tray.cancelled() => return,
                _ = events.recv() => {}
                _ = tick.tick() => {}
            }
            let states: Vec<_> = registry.all().iter().map(|n| n.state()).collect();
            let look = (tray::state_of(&states), tray::tooltip(&states, shared_tray.accepting()));
            if last.as_ref() != Some(&look) {
                if let Ok(img) = Image::from_bytes(look.0.icon()) {
                    let _ = tray.set_icon(Some(img));
                }
                let _ = tray.set_tooltip(Some(&look.1));
                last = Some(look);
            }
        }
    });

    app.manage(Shell { broker: Mutex::new(Some(broker)), stop, ui_url, _sims: sims });
    if std::env::var_os("CORRAL_START_HIDDEN").is_none() {
        show_window(app.handle());
    }
    Ok(())
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CORRAL_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let app = tauri::Builder::default()
        .plugin(tauri_plugin_dialog::init())
        .invoke_handler(tauri::generate_handler![save_file])
        .setup(setup)
        .on_window_event(|window, event| {
            if let WindowEvent::CloseRequested { api, .. } = event {
                // The broker keeps serving from the tray; Quit is in the tray's menu.
                api.prevent_close();
                let _ = window.hide();
            }
        })
        .build(tauri::generate_context!());
    let app = match app {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: cannot start the desktop app: {e}");
            std::process::exit(1);
        }
    };
    app.run(|_app, event| {
        if let RunEvent::ExitRequested { api, code: None, .. } = event {
            // No window left is not a reason to stop serving.
            api.prevent_exit();
        }
    });
}
