//! Corral's desktop shell. It owns shell features only: the window, the tray, desktop
//! notifications, file dialogs. The broker runs embedded on Tauri's tokio runtime and the
//! window shows the broker's own UI from its loopback admin listener, so everything the window
//! can do, the admin API (and `corral serve` in a browser) can do too. The admin token comes
//! from the OS keyring and travels in the URL fragment: nobody types it.
//!
//! One instance per session: a second launch hands over to the first (which shows its window)
//! and exits. Closing the window keeps Corral running in the tray; Quit drains in-flight
//! requests first.

#![cfg_attr(not(debug_assertions), windows_subsystem = "windows")]

mod icons;
mod inspect;
mod look;
mod notify;
mod save;
mod start;
mod tray;

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock};

use corral::node::Registry;
use corral::sim::SimNode;
use corral::state::Shared;
use corral::Broker;
use inspect::Inspect;
use tauri::{AppHandle, Manager, RunEvent, WebviewUrl, WebviewWindowBuilder, WindowEvent};
use tauri_plugin_dialog::{DialogExt, MessageDialogKind};
use tokio_util::sync::CancellationToken;

/// What the shell keeps while it runs.
pub struct Shell {
    broker: Mutex<Option<Broker>>,
    stop: CancellationToken,
    ui_url: String,
    /// The demo cluster, when there was nothing to front.
    _sims: Vec<SimNode>,
    shared: Arc<Shared>,
    registry: Arc<Registry>,
    muted: Arc<AtomicBool>,
    /// The proxy URL clients point at (the first listener).
    endpoint: String,
    /// The UI for a browser (the token in the fragment, as the window gets it).
    browser_url: String,
    admin_url: String,
    token: String,
    http: reqwest::Client,
    config_dir: PathBuf,
    logs_dir: PathBuf,
    inspect: Arc<Inspect>,
    tray: OnceLock<tray::Tray>,
    /// Wakes the tray's refresh at once (after a menu action).
    kick: tokio::sync::Notify,
}

pub fn show_window(app: &AppHandle) {
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

/// Bring the window up on the Nodes screen with `node`'s row in view (a notification's
/// action). The UI may still be loading in a new window: the script waits for it (≤ 10 s).
pub fn open_node(app: &AppHandle, node: &str) {
    show_window(app);
    let Some(w) = app.get_webview_window("main") else { return };
    let name = serde_json::to_string(node).unwrap_or_else(|_| "\"\"".into());
    let js = format!(
        "(function go(n) {{ const b = document.querySelector('[data-screen=nodes]'); \
         if (!b) {{ if (n > 0) setTimeout(() => go(n - 1), 200); return; }} b.click(); \
         setTimeout(() => {{ const r = document.querySelector('tr[data-node=' + CSS.escape({name}) + ']'); \
         if (r) r.scrollIntoView({{ block: 'center' }}); }}, 100); }})(50)"
    );
    if let Err(e) = w.eval(&js) {
        tracing::warn!(error = %e, "cannot open the Nodes screen");
    }
    if let Some(i) = app.try_state::<Arc<Inspect>>() {
        i.update(|r| r.screen_opened = Some(format!("nodes:{node}")));
    }
}

pub fn quit(app: &AppHandle) {
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

/// Refresh the tray now rather than at the next tick.
pub fn kick(app: &AppHandle) {
    if let Some(s) = app.try_state::<Shell>() {
        s.kick.notify_one();
    }
}

/// Test hook: run a tray menu item by id, as a click would. Refused unless
/// `CORRAL_DESKTOP_STATE` is set (see `inspect.rs`).
#[tauri::command]
fn test_tray_click(app: AppHandle, id: String) -> Result<(), String> {
    let on = app.try_state::<Arc<Inspect>>().is_some_and(|i| i.enabled());
    if !on {
        return Err("test hooks are off (CORRAL_DESKTOP_STATE is not set)".into());
    }
    match id.strip_prefix("notice:") {
        Some(node) => open_node(&app, node),
        None => tray::on_menu(&app, &id),
    }
    Ok(())
}

/// The broker could not start: say why in a window (and on stderr), then stop when the
/// person closes it (exit code 2). The window is shown once the event loop runs.
fn fail_to_start(app: &AppHandle, why: &str) {
    tracing::error!(error = %why, "cannot start the broker");
    eprintln!("error: Corral cannot start: {}", why.replace('\n', " "));
    if let Some(i) = app.try_state::<Arc<Inspect>>() {
        i.update(|r| r.error = Some(why.to_string()));
    }
    // Let a corrected launch start while this message is still open.
    tauri_plugin_single_instance::destroy(app);
    let h = app.clone();
    app.dialog().message(why).kind(MessageDialogKind::Error).title("Corral cannot start").show(move |_| h.exit(2));
}

fn setup(app: &mut tauri::App, source: start::Source) -> Result<(), Box<dyn std::error::Error>> {
    let started = match tauri::async_runtime::block_on(start::start_broker(source)) {
        Ok(s) => s,
        Err(e) => {
            fail_to_start(app.handle(), &e);
            return Ok(());
        }
    };
    let broker = started.broker;
    tracing::info!(source = %started.source, proxy = %broker.proxy_addr(), admin = %broker.admin_addr(), "broker started");
    let ui_url = format!("http://{}/ui/#token={}", broker.admin_addr(), broker.admin_token());
    let shared = Arc::clone(broker.shared());
    let muted = Arc::new(AtomicBool::new(std::env::var_os("CORRAL_MUTE").is_some()));
    let stop = CancellationToken::new();
    let endpoint = shared.front().0.first().cloned().unwrap_or_else(|| format!("http://{}", broker.proxy_addr()));
    let config_file = started.file.or_else(corral::config::default_path);
    let shell = Shell {
        ui_url: ui_url.clone(),
        browser_url: ui_url,
        admin_url: format!("http://{}", broker.admin_addr()),
        token: broker.admin_token().to_string(),
        registry: Arc::clone(broker.registry()),
        broker: Mutex::new(Some(broker)),
        stop: stop.clone(),
        _sims: started.sims,
        shared: Arc::clone(&shared),
        muted: Arc::clone(&muted),
        endpoint: endpoint.clone(),
        http: reqwest::Client::builder().no_proxy().build()?,
        config_dir: config_file.and_then(|f| f.parent().map(PathBuf::from)).unwrap_or_else(|| PathBuf::from(".")),
        logs_dir: logs_dir(),
        inspect: Arc::clone(&app.state::<Arc<Inspect>>()),
        tray: OnceLock::new(),
        kick: tokio::sync::Notify::new(),
    };
    app.manage(shell);
    let handle = app.handle().clone();
    let open: Arc<dyn Fn(String) + Send + Sync> = Arc::new(move |node: String| {
        let h = handle.clone();
        let _ = handle.run_on_main_thread(move || open_node(&h, &node));
    });
    tauri::async_runtime::spawn(notify::run(
        shared.telemetry.subscribe_notable(),
        Arc::clone(&muted),
        stop.clone(),
        open,
    ));
    let t = tray::build(app.handle(), &endpoint, muted.load(std::sync::atomic::Ordering::Relaxed))?;
    let _ = app.state::<Shell>().tray.set(t);
    tauri::async_runtime::spawn(keep_tray(app.handle().clone()));
    if std::env::var_os("CORRAL_START_HIDDEN").is_none() {
        show_window(app.handle());
    }
    Ok(())
}

/// Keep the tray in step: on every notable bus event, on a kick, and every second (in-flight
/// counts, requests).
async fn keep_tray(app: AppHandle) {
    let shell = app.state::<Shell>();
    let mut events = shell.shared.telemetry.subscribe_notable();
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = shell.stop.cancelled() => return,
            _ = events.recv() => {}
            _ = shell.kick.notified() => {}
            _ = tick.tick() => {}
        }
        let Some(t) = shell.tray.get() else { continue };
        if let Err(e) = t.refresh(&app, &shell, tray::snapshot(&shell)) {
            tracing::warn!(error = %e, "cannot update the tray");
        }
    }
}

/// `~/.local/share/corral/logs` on Linux (the platform's data dir): `corral-desktop.log`.
fn logs_dir() -> PathBuf {
    directories::ProjectDirs::from("dev", "corral", "corral")
        .map(|d| d.data_local_dir().join("logs"))
        .unwrap_or_else(|| PathBuf::from("logs"))
}

/// Log to stderr (coloured on a terminal) and to the logs folder's file (never coloured).
fn init_logging() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_from_env("CORRAL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let dir = logs_dir();
    let file = corral::config::create_private_dir(&dir).and_then(|_| {
        let path = dir.join("corral-desktop.log");
        // One previous run kept, so the file cannot grow without end.
        if std::fs::metadata(&path).is_ok_and(|m| m.len() > 10 << 20) {
            let _ = std::fs::rename(&path, dir.join("corral-desktop.log.1"));
        }
        std::fs::OpenOptions::new().create(true).append(true).open(path)
    });
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let to_file = file.ok().map(|f| tracing_subscriber::fmt::layer().with_ansi(false).with_writer(Mutex::new(f)));
    tracing_subscriber::registry().with(filter).with(stderr).with(to_file).init();
}

fn main() {
    // WebKitWebDriver starts the app with `--automation`: not ours to refuse.
    let args = std::env::args().skip(1).filter(|a| a != "--automation");
    let args = match start::parse_args(args) {
        Ok(a) if a.help => {
            println!("{}", start::USAGE);
            return;
        }
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    init_logging();
    let source = start::choose(
        args.config,
        std::env::var_os("CORRAL_CONFIG").map(PathBuf::from),
        corral::config::default_path(),
    );
    let app = tauri::Builder::default()
        .plugin(tauri_plugin_single_instance::init(|app, argv, _cwd| {
            tracing::info!(?argv, "a second launch: showing this window instead");
            if let Some(i) = app.try_state::<Arc<Inspect>>() {
                i.update(|r| r.second_launches += 1);
            }
            show_window(app);
        }))
        .plugin(tauri_plugin_dialog::init())
        .plugin(tauri_plugin_clipboard_manager::init())
        .plugin(tauri_plugin_opener::init())
        .manage(Arc::new(Inspect::from_env()))
        .invoke_handler(tauri::generate_handler![save::save_file, test_tray_click])
        .setup(move |app| setup(app, source))
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
