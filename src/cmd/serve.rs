//! `corral serve`: the broker headless, from a config file (or defaults), until SIGINT/SIGTERM,
//! then a graceful drain. Prints the proxy URL, the admin URL and the UI login URL on stderr
//! (with the token, unless it came from `CORRAL_ADMIN_TOKEN`).
//!
//! The admin token is stable across starts, so open browser tabs stay signed in: the user's own
//! from `CORRAL_ADMIN_TOKEN`, else the one in the OS keyring (the desktop app's), else, where no
//! keyring answers, the one in `admin-token` (mode 0600) beside the request store. The log says
//! where it is kept.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use corral::broker::StartError;
use corral::config::Config;
use corral::secrets::{SecretError, TokenHome};
use corral::{Broker, StartOptions};

/// How long the keyring may take to answer before the token file is used instead.
const KEYRING_WAIT: Duration = Duration::from_secs(5);

pub async fn run(config: Option<&Path>, notify: bool, listen: Option<&str>, admin: Option<&str>) -> ExitCode {
    let (mut config, source, watch) = match super::config::load(config) {
        Ok(c) => c,
        Err(code) => return code,
    };
    override_addresses(&mut config, listen, admin);
    tracing::info!(config = %source, nodes = config.nodes.len(), "starting broker");
    for (name, state) in super::secret::states(&config) {
        if state != "set" {
            tracing::warn!(secret = %name, state, "a secret the config names is not in the OS keyring; set it with `corral secret set {name}`");
        }
    }
    let admin_token = match super::env_token() {
        Some(t) => t,
        None => match kept_token(state_dir(&config)).await {
            Ok(t) => t,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(1);
            }
        },
    };
    let addrs = Addresses::of(&config, watch.as_deref(), listen.is_some(), admin.is_some());
    let options = StartOptions { admin_token: Some(admin_token), config_path: watch, ..super::start_options() };
    let broker = match Broker::start(config, options).await {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: {}", addrs.explain(&e));
            let usage = matches!(e, StartError::Config(_) | StartError::WeakToken(_));
            return ExitCode::from(if usage { 2 } else { 1 });
        }
    };
    announce(&broker);
    let stop_notices = tokio_util::sync::CancellationToken::new();
    if notify {
        let muted = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        tokio::spawn(corral::alerts::run(broker.shared().telemetry.subscribe_notable(), muted, stop_notices.clone()));
        tracing::info!("desktop notifications on");
    }
    super::wait_for_signal().await;
    stop_notices.cancel();
    broker.shutdown().await;
    ExitCode::SUCCESS
}

/// `--listen` / `--admin` replace the addresses (the rest of the listener's settings stay).
fn override_addresses(config: &mut Config, listen: Option<&str>, admin: Option<&str>) {
    if let Some(addr) = listen {
        match config.listeners.first_mut() {
            Some(l) => l.addr = addr.to_string(),
            None => {
                config.listeners.push(corral::config::ListenerConfig { addr: addr.to_string(), ..Default::default() })
            }
        }
    }
    if let Some(addr) = admin {
        config.admin.addr = addr.to_string();
    }
}

fn announce(broker: &Broker) {
    eprintln!("Corral is serving the Ollama API on http://{}", broker.proxy_addr());
    // A token the user chose is theirs to keep: it is not echoed into logs and scrollback.
    if super::token_from_env() {
        eprintln!("Admin API on http://{} (token: the one in CORRAL_ADMIN_TOKEN)", broker.admin_addr());
        eprintln!("Open the UI: http://{}/ui/ and sign in with that token", broker.admin_addr());
    } else {
        eprintln!("Admin API on http://{} (token: {})", broker.admin_addr(), broker.admin_token());
        eprintln!("Open the UI: http://{}/ui/#token={}", broker.admin_addr(), broker.admin_token());
    }
}

/// Where `serve` keeps what it needs between starts: the request store's directory.
fn state_dir(config: &Config) -> PathBuf {
    let store = corral::store::default_path(&config.store);
    match store.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// The keyring's admin token, else the state dir's file; logs where it is kept.
async fn kept_token(dir: PathBuf) -> Result<String, String> {
    let keyring = tokio::task::spawn_blocking(corral::secrets::admin_token);
    let answer = match tokio::time::timeout(KEYRING_WAIT, keyring).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => Err(SecretError::Keyring(e.to_string())),
        Err(_) => Err(SecretError::NoKeyring(format!("no answer within {} s", KEYRING_WAIT.as_secs()))),
    };
    let shown = dir.display().to_string();
    let (token, home, why) = tokio::task::spawn_blocking(move || corral::secrets::kept_admin_token(&dir, || answer))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("cannot keep the admin token in {shown}: {e}; set CORRAL_ADMIN_TOKEN instead"))?;
    match (home, why) {
        (TokenHome::Keyring, _) => {
            tracing::info!("admin token kept in the OS keyring (corral.internal, admin-token): the same on every start")
        }
        (TokenHome::File(path), why) => tracing::warn!(
            reason = %why.map(|e| e.to_string()).unwrap_or_default(),
            "OS keyring not used; admin token kept in {} (mode 0600): the same on every start",
            path.display()
        ),
    }
    Ok(token)
}

/// The addresses a start binds and where each came from, to say how to change one that is
/// taken: in the config file, or with `--listen` / `--admin` when no file is in use.
struct Addresses {
    proxy: String,
    admin: String,
    file: Option<PathBuf>,
    proxy_flag: bool,
    admin_flag: bool,
}

impl Addresses {
    fn of(config: &Config, file: Option<&Path>, proxy_flag: bool, admin_flag: bool) -> Self {
        Self {
            proxy: config.listeners.first().map(|l| l.addr.clone()).unwrap_or_default(),
            admin: config.admin.addr.clone(),
            file: file.map(Path::to_path_buf),
            proxy_flag,
            admin_flag,
        }
    }

    /// The error line for a failed start.
    fn explain(&self, e: &StartError) -> String {
        let StartError::Bind { addr, source } = e else { return e.to_string() };
        let (flag, from_flag) = if *addr == self.admin {
            ("--admin ADDR", self.admin_flag)
        } else if *addr == self.proxy {
            ("--listen ADDR", self.proxy_flag)
        } else {
            ("", false)
        };
        let hint = match (&self.file, from_flag, flag) {
            (Some(f), false, "") => format!("change the address in {}", f.display()),
            (Some(f), false, flag) => format!("change the address in {}, or start with {flag}", f.display()),
            (_, _, "") => "pick another address".to_string(),
            (_, _, flag) => format!("pick a free one with {flag} (like 127.0.0.1:0 for any free port)"),
        };
        format!("cannot listen on {addr}: {source}; is another Corral (or Ollama) using it? {hint}")
    }
}
