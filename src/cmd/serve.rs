//! `corral serve`: the broker headless, from a config file (or defaults), until SIGINT/SIGTERM,
//! then a graceful drain. Prints the proxy URL, the admin URL and the UI login URL on stderr
//! (with the token only when it was generated for this run).

use std::path::Path;
use std::process::ExitCode;

use corral::{Broker, StartOptions};

pub async fn run(config: Option<&Path>, notify: bool, listen: Option<&str>, admin: Option<&str>) -> ExitCode {
    let (mut config, source, watch) = match super::config::load(config) {
        Ok(c) => c,
        Err(code) => return code,
    };
    // `--listen` / `--admin` replace the addresses (the rest of the listener's settings stay).
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
    tracing::info!(config = %source, nodes = config.nodes.len(), "starting broker");
    for (name, state) in super::secret::states(&config) {
        if state != "set" {
            tracing::warn!(secret = %name, state, "a provider's secret is not in the OS keyring; set it with `corral secret set {name}`");
        }
    }
    let options = StartOptions { config_path: watch, ..super::start_options() };
    let broker = match Broker::start(config, options).await {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: {e}");
            let usage = matches!(e, corral::broker::StartError::Config(_) | corral::broker::StartError::WeakToken(_));
            return ExitCode::from(if usage { 2 } else { 1 });
        }
    };
    eprintln!("Corral is serving the Ollama API on http://{}", broker.proxy_addr());
    // A token the user chose is theirs to keep: it is not echoed into logs and scrollback.
    if super::token_from_env() {
        eprintln!("Admin API on http://{} (token: the one in CORRAL_ADMIN_TOKEN)", broker.admin_addr());
        eprintln!("Open the UI: http://{}/ui/ and sign in with that token", broker.admin_addr());
    } else {
        eprintln!("Admin API on http://{} (token: {})", broker.admin_addr(), broker.admin_token());
        eprintln!("Open the UI: http://{}/ui/#token={}", broker.admin_addr(), broker.admin_token());
    }
    let stop_notices = tokio_util::sync::CancellationToken::new();
    if notify {
        let muted = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        tokio::spawn(corral::alerts::run(broker.shared().telemetry.subscribe(), muted, stop_notices.clone()));
        tracing::info!("desktop notifications on");
    }
    super::wait_for_signal().await;
    stop_notices.cancel();
    broker.shutdown().await;
    ExitCode::SUCCESS
}
