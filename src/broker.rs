//! The broker as one running thing: listeners, probes, and their orderly end.
//!
//! `Broker::start` binds every listener before serving anything, so a port conflict fails the
//! start with a clear message instead of leaving a half-started broker. Every background task
//! is spawned through one `TaskTracker` and stops on one `CancellationToken`. `shutdown` stops
//! accepting, lets in-flight requests finish within `proxy.drain_timeout_ms`, and logs what
//! was left.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::node::{NodeTuning, Registry};
use crate::proxy::{self, ProxyState};
use crate::state::Shared;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(
        "cannot listen on {addr}: {source}; is another Corral (or Ollama) using it? Change the address in the config"
    )]
    Bind { addr: String, source: std::io::Error },
    #[error("{0}")]
    Config(#[from] crate::config::ConfigError),
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
    #[error("{0}; set [store] path to a writable file, or enabled = false")]
    Store(#[from] crate::store::StoreError),
    #[error("the admin token is too weak ({0}); use at least 32 random characters, or leave CORRAL_ADMIN_TOKEN unset to get one")]
    WeakToken(&'static str),
}

impl StartError {
    pub fn code(&self) -> &'static str {
        match self {
            Self::Bind { .. } => "listen_failed",
            Self::Config(_) => "invalid_config",
            Self::Client(_) => "client_failed",
            Self::Store(e) => e.code(),
            Self::WeakToken(_) => "weak_admin_token",
        }
    }
}

/// Knobs for tests and the demo that are not part of the config file.
#[derive(Debug, Clone, Default)]
pub struct StartOptions {
    /// Seed every random choice (tie-breaks, backoff jitter) for reproducible runs.
    pub seed: Option<u64>,
    /// The admin API's bearer token; generated when not given.
    pub admin_token: Option<String>,
    /// The config file to watch for hot reload.
    pub config_path: Option<std::path::PathBuf>,
    /// The nodes are simulated (`corral demo`, the desktop's demo cluster): said in the UI.
    pub demo: bool,
}

pub struct Broker {
    shared: Arc<Shared>,
    proxy_addrs: Vec<SocketAddr>,
    admin_addr: SocketAddr,
    admin_token: Arc<String>,
    cancel: CancellationToken,
    tracker: TaskTracker,
    store_cancel: CancellationToken,
    store_tracker: TaskTracker,
    /// Stops the probe thread when the broker is dropped without `shutdown` (tests do).
    _probes: tokio_util::sync::DropGuard,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker").field("proxy_addrs", &self.proxy_addrs).finish()
    }
}

/// Probes run on a thread and runtime of their own, with a client of their own. A flood of
/// requests on the proxy's runtime delays every task's wake-up by the length of its run
/// queue; a probe timed there blames the node for the broker's own backlog (seen: 10,000
/// requests arriving at once made a healthy node "time out after 1000 ms" twice, and the
/// thousand queued requests were answered 503 no_healthy_node). On its own thread a probe
/// measures the node.
fn spawn_probes(
    tracker: &TaskTracker,
    registry: Arc<Registry>,
    config: &Config,
    health: tokio::sync::watch::Receiver<crate::config::HealthConfig>,
    cancel: CancellationToken,
) -> Result<(), StartError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("corral-probes")
        .build()
        .map_err(|e| StartError::Client(format!("cannot start the probe runtime: {e}")))?;
    let client = node_reqwest(config)?;
    // A plain thread, not `spawn_blocking`: dropping the proxy's runtime must never wait for
    // it. `shutdown` still waits until the probes have stopped, through `stopped`.
    let (done, stopped) = tokio::sync::oneshot::channel::<()>();
    std::thread::Builder::new()
        .name("corral-probes".into())
        .spawn(move || {
            runtime.block_on(crate::health::run(registry, client, health, cancel));
            let _ = done.send(());
        })
        .map_err(|e| StartError::Client(format!("cannot start the probe thread: {e}")))?;
    tracker.spawn(async move {
        let _ = stopped.await;
    });
    Ok(())
}

/// Client keys: loaded before the first request, then followed in the keyring.
async fn follow_client_keys(shared: &Arc<Shared>, tracker: &TaskTracker, cancel: &CancellationToken) {
    shared.client_keys.set(crate::clients::load(shared.client_key_names()).await);
    let names = Arc::clone(shared);
    tracker.spawn(crate::clients::watch(
        Arc::clone(&shared.client_keys),
        move || names.client_key_names(),
        cancel.clone(),
    ));
}

/// Edits go into `path` and its changes are applied as they land.
fn watch_config_file(
    path: std::path::PathBuf,
    shared: &Arc<Shared>,
    tracker: &TaskTracker,
    cancel: &CancellationToken,
) {
    shared.set_config_file(path.clone());
    match crate::reload::watch(path.clone(), Arc::clone(shared), Arc::clone(&shared.reload), cancel.clone()) {
        Ok(task) => {
            tracker.spawn(task);
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot watch the config file; edits need a restart")
        }
    }
}

/// The broker's telemetry; with `[telemetry] otlp_endpoint`, exporting traces through a task
/// that, like the store's writer, stops last, so the spans of drained requests leave too.
fn telemetry_for(
    config: &Config,
    store: Option<crate::store::Store>,
    bus: crate::telemetry::Bus,
    client: &reqwest::Client,
    cancel: &CancellationToken,
    tracker: &TaskTracker,
) -> Arc<crate::telemetry::Telemetry> {
    let telemetry = crate::telemetry::Telemetry::new(store, bus);
    let Some(url) = config.telemetry.traces_url() else { return Arc::new(telemetry) };
    tracing::info!(url = %crate::config::redacted_url(&url), "exporting traces (OTLP/HTTP)");
    let (telemetry, task) = telemetry.exporting(url, client.clone(), cancel.clone());
    tracker.spawn(task);
    Arc::new(telemetry)
}

/// Every problem of an invalid config, as one error.
fn refuse_invalid(config: &Config) -> Result<(), StartError> {
    let problems = config.validate();
    if problems.is_empty() {
        return Ok(());
    }
    Err(StartError::Config(crate::config::ConfigError {
        problems: problems
            .into_iter()
            .map(|(path, message)| crate::config::Problem { path, line: None, message })
            .collect(),
    }))
}

/// A reqwest client for nodes (probes, model operations, metadata, OpenAI-compatible nodes'
/// answers, OTLP export). Redirects are never followed: a node (or collector) that answers 3xx
/// would otherwise send the prompt, or a probe's verdict, to a host nobody configured.
fn node_reqwest(config: &Config) -> Result<reqwest::Client, StartError> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(config.proxy.connect_timeout())
        .tcp_nodelay(true)
        .pool_idle_timeout(std::time::Duration::from_secs(60))
        .build()
        .map_err(|e| StartError::Client(e.to_string()))
}

/// The HTTP clients: reqwest for probes, model operations and metadata, and the request
/// path's own client to nodes (`upstream::client`).
fn clients(config: &Config) -> Result<(reqwest::Client, crate::upstream::client::NodeClient), StartError> {
    let client = node_reqwest(config)?;
    let node_client = crate::upstream::client::NodeClient::new(config.proxy.connect_timeout())
        .map_err(|e| StartError::Client(e.to_string()))?;
    Ok((client, node_client))
}

impl Broker {
    pub async fn start(config: Config, options: StartOptions) -> Result<Self, StartError> {
        if let Some(t) = &options.admin_token {
            check_token(t)?;
        }
        for (path, message) in config.warnings() {
            tracing::warn!(%path, "{message}");
        }
        refuse_invalid(&config)?;
        // Entries from before keyring namespaces belong to the file a person started us with.
        crate::cloud::claim_legacy_keys(&config).await;
        let registry = Arc::new(
            Registry::new(&config.nodes, NodeTuning::of(&config)).map_err(|e| StartError::Client(e.to_string()))?,
        );
        let (client, node_client) = clients(&config)?;
        let sockets = Sockets::bind(&config).await?;
        let cancel = CancellationToken::new();
        let tracker = TaskTracker::new();
        // The store stops last, after every request has finished and been recorded.
        let store_cancel = CancellationToken::new();
        let store_tracker = TaskTracker::new();
        let store = open_store(&config, &store_cancel, &store_tracker).await?;
        let bus = crate::telemetry::Telemetry::bus();
        registry.on_state_change(crate::telemetry::Telemetry::state_sink(bus.clone()));
        let telemetry = telemetry_for(&config, store.clone(), bus, &client, &store_cancel, &store_tracker);
        if let Some(store) = store {
            tracker.spawn(record_node_events(telemetry.subscribe_notable(), store, cancel.clone()));
        }
        let shared = Arc::new(Shared::new(
            config,
            Arc::clone(&registry),
            client,
            node_client,
            cancel.clone(),
            telemetry,
            options.seed,
        ));
        let admin_token = Arc::new(options.admin_token.unwrap_or_else(generate_token));
        follow_client_keys(&shared, &tracker, &cancel).await;
        let fleet = shared.telemetry.store().and_then(crate::fleet::Fleet::of);
        if let Some(path) = &options.config_path {
            shared.set_config_file(path.clone());
        }
        // A fleet member serves the fleet's config from its first request on.
        let mut config_sync =
            fleet.as_ref().map(|f| crate::fleet::config::Sync::new(Arc::clone(f), Arc::clone(&shared)));
        if let (Some(fleet), Some(sync)) = (&fleet, config_sync.as_mut()) {
            crate::fleet::config::first_sync(sync).await;
            crate::fleet::keys::first_load(fleet, &shared.client_keys).await;
        }
        let (proxy_addrs, admin_addr) = sockets.serve(&shared, &admin_token, fleet.clone(), &tracker, &cancel).await?;
        shared.set_front(proxy_addrs.iter().map(|a| format!("http://{a}")).collect(), options.demo);
        shared.set_admin_addr(admin_addr);
        if let Some(path) = options.config_path {
            watch_config_file(path, &shared, &tracker, &cancel);
        }
        if let (Some(fleet), Some(sync)) = (&fleet, config_sync) {
            fleet.start(&shared, sync, &tracker, &cancel);
        }
        let probes = cancel.child_token();
        spawn_probes(&tracker, Arc::clone(&registry), &shared.config(), shared.health_config(), probes.clone())?;
        tracker.spawn(Arc::clone(&shared.admission).run(cancel.clone()));
        tracker.spawn(crate::memory::give_back_when_quiet(cancel.clone()));
        Ok(Self {
            shared,
            proxy_addrs,
            admin_addr,
            admin_token,
            cancel,
            tracker,
            store_cancel,
            store_tracker,
            _probes: probes.drop_guard(),
        })
    }

    /// The first proxy listener's address (the one clients use).
    pub fn proxy_addr(&self) -> SocketAddr {
        self.proxy_addrs[0]
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    pub fn proxy_addrs(&self) -> &[SocketAddr] {
        &self.proxy_addrs
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.shared.registry
    }

    pub fn config(&self) -> Arc<Config> {
        self.shared.config()
    }

    /// The state shared with the proxy (for the admin API and tests).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Requests waiting in the broker's queue right now.
    pub fn queue_depth(&self) -> usize {
        self.shared.admission.depth()
    }

    /// Stop accepting, let in-flight requests finish (bounded), stop the probes.
    pub async fn shutdown(self) {
        let in_flight: usize = self.registry().all().iter().map(|n| n.in_flight()).sum();
        tracing::info!(in_flight, "shutting down: no new connections, draining in-flight requests");
        self.cancel.cancel();
        self.tracker.close();
        self.shared.tasks.close();
        let drain = self.shared.config().proxy.drain_timeout();
        let drained = async {
            self.tracker.wait().await;
            self.shared.tasks.wait().await;
        };
        if tokio::time::timeout(drain, drained).await.is_err() {
            let left: usize = self.registry().all().iter().map(|n| n.in_flight()).sum();
            tracing::warn!(left, drain_ms = drain.as_millis() as u64, "drain timeout passed; dropping what is left");
        } else {
            tracing::info!("drained");
        }
        // Now flush the store: the writer drains its channel, then stops.
        self.store_cancel.cancel();
        self.store_tracker.close();
        if tokio::time::timeout(std::time::Duration::from_secs(10), self.store_tracker.wait()).await.is_err() {
            tracing::warn!("the request store did not finish flushing in 10 s");
        }
    }
}

/// Every listener, bound before anything is served: all of them or none.
struct Sockets {
    proxies: Vec<(TcpListener, crate::config::ListenerConfig)>,
    admin: TcpListener,
    admin_addr: SocketAddr,
}

impl Sockets {
    async fn bind(config: &Config) -> Result<Self, StartError> {
        let mut proxies = Vec::new();
        for l in &config.listeners {
            let listener =
                TcpListener::bind(&l.addr).await.map_err(|source| StartError::Bind { addr: l.addr.clone(), source })?;
            proxies.push((listener, l.clone()));
        }
        let bind_err = |source| StartError::Bind { addr: config.admin.addr.clone(), source };
        let admin = TcpListener::bind(&config.admin.addr).await.map_err(bind_err)?;
        let admin_addr = admin.local_addr().map_err(bind_err)?;
        Ok(Self { proxies, admin, admin_addr })
    }

    /// Serve the proxy and admin apps on the bound sockets; returns their addresses.
    async fn serve(
        self,
        shared: &Arc<Shared>,
        admin_token: &Arc<String>,
        fleet: Option<Arc<crate::fleet::Fleet>>,
        tracker: &TaskTracker,
        cancel: &CancellationToken,
    ) -> Result<(Vec<SocketAddr>, SocketAddr), StartError> {
        let (proxy_limits, admin_limits) = limits(&shared.config(), self.proxies.len());
        let mut proxy_addrs = Vec::new();
        // One store for every listener: a retry may come in through another one.
        let idempotency = Arc::new(proxy::idempotency::Idempotency::default());
        for (listener, lc) in self.proxies {
            let addr = listener.local_addr().map_err(|source| StartError::Bind { addr: lc.addr.clone(), source })?;
            proxy_addrs.push(addr);
            let app = proxy::router(ProxyState {
                shared: Arc::clone(shared),
                listener: Arc::new(lc.clone()),
                idempotency: Arc::clone(&idempotency),
            });
            let stop = cancel.clone();
            tracker.spawn(async move {
                tracing::info!(
                    %addr,
                    origin = ?lc.origin,
                    api_keys = lc.api_keys.len(),
                    max_connections = proxy_limits.max_connections,
                    "proxy listening"
                );
                crate::server::serve(listener, app, proxy_limits, stop).await;
            });
        }
        let admin_app = crate::admin::router(crate::admin::AdminState {
            shared: Arc::clone(shared),
            token: Arc::clone(admin_token),
            drills: Default::default(),
            latency: Default::default(),
            fleet,
        });
        let (stop, admin_addr, admin) = (cancel.clone(), self.admin_addr, self.admin);
        tracker.spawn(async move {
            tracing::info!(addr = %admin_addr, "admin API listening");
            crate::server::serve(admin, admin_app, admin_limits, stop).await;
        });
        Ok((proxy_addrs, admin_addr))
    }
}

/// Open file descriptors kept for everything but client connections: the store, node and
/// provider connections of the probes, the config watcher.
const FD_RESERVE: usize = 256;

/// Each listener's connection limits. The admin listener keeps its own budget; the proxy
/// listeners share what is left of the open-file limit, halved because a proxied request holds
/// a node connection too, so a proxy flood runs into its cap before the process runs out of
/// descriptors (which would make every listener unreachable).
fn limits(config: &Config, proxies: usize) -> (crate::server::Limits, crate::server::Limits) {
    let head_timeout = std::time::Duration::from_millis(config.proxy.header_read_timeout_ms);
    let keep_alive_timeout = std::time::Duration::from_millis(config.proxy.keep_alive_timeout_ms);
    let admin = crate::server::Limits {
        head_timeout,
        keep_alive_timeout,
        max_connections: config.admin.max_connections,
        max_connections_per_ip: config.admin.max_connections_per_ip,
    };
    let mut max_connections = config.proxy.max_connections;
    if let Some(fds) = crate::server::open_file_limit() {
        let room = fds.saturating_sub(FD_RESERVE + config.admin.max_connections) / 2 / proxies.max(1);
        if room < max_connections {
            tracing::warn!(
                open_file_limit = fds,
                configured = max_connections,
                used = room.max(1),
                "proxy.max_connections is above what the open-file limit leaves; using less (raise `ulimit -n`)"
            );
            max_connections = room.max(1);
        }
    }
    let proxy = crate::server::Limits {
        head_timeout,
        keep_alive_timeout,
        max_connections,
        max_connections_per_ip: config.proxy.max_connections_per_ip.min(max_connections),
    };
    (proxy, admin)
}

async fn open_store(
    config: &Config,
    cancel: &CancellationToken,
    tracker: &TaskTracker,
) -> Result<Option<crate::store::Store>, StartError> {
    if !config.store.enabled {
        return Ok(None);
    }
    let (store, tasks) = crate::store::Store::open(&config.store, cancel.clone()).await?;
    spawn_writer(tasks.writer, tracker);
    tracker.spawn(tasks.retention);
    tracing::info!(
        engine = store.pool().engine(),
        at = store.location(),
        broker = store.broker(),
        "request store open"
    );
    Ok(Some(store))
}

/// The store's writer, on a thread and runtime of its own: binding a batch of records and
/// handing it to the database is a few milliseconds of work every batch (about 8,000
/// instructions a record under callgrind, issue 16). On the request path's runtime (`corral
/// serve` runs a single-threaded one) every connection waited behind it. The tracker still
/// owns it: shutdown waits until it has written what it holds. Where a thread cannot be had,
/// it runs on the caller's runtime as before.
fn spawn_writer(writer: crate::store::Task, tracker: &TaskTracker) {
    let writer = match writer_thread() {
        Ok((hand, done)) => match hand.send(writer) {
            Ok(()) => {
                tracker.spawn(async move {
                    let _ = done.await;
                });
                return;
            }
            Err(std::sync::mpsc::SendError(writer)) => writer,
        },
        Err(e) => {
            tracing::warn!(error = %e, "no thread for the store writer; it shares the request path's runtime");
            writer
        }
    };
    tracker.spawn(writer);
}

/// A thread with a runtime, waiting to be handed the writer; `done` fires when it has run.
fn writer_thread() -> std::io::Result<(std::sync::mpsc::Sender<crate::store::Task>, tokio::sync::oneshot::Receiver<()>)>
{
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (hand, handed) = std::sync::mpsc::channel::<crate::store::Task>();
    let (done_tx, done) = tokio::sync::oneshot::channel();
    std::thread::Builder::new().name("corral-store".into()).spawn(move || {
        if let Ok(writer) = handed.recv() {
            // mimalloc gives back only the calling thread's free pages: this thread's own
            // quiet watch returns what a burst of batches left here.
            runtime.block_on(async move {
                let stop = CancellationToken::new();
                let quiet = tokio::spawn(crate::memory::collect_this_thread_when_quiet(stop.clone()));
                writer.await;
                stop.cancel();
                let _ = quiet.await;
            });
        }
        let _ = done_tx.send(());
    })?;
    Ok((hand, done))
}

/// Refuse an admin token a person could guess: shorter than 32 characters, or with fewer than
/// 8 different characters (`aaaa...`).
pub fn check_token(token: &str) -> Result<(), StartError> {
    if token.chars().count() < 32 {
        return Err(StartError::WeakToken("shorter than 32 characters"));
    }
    if token.chars().collect::<std::collections::BTreeSet<_>>().len() < 8 {
        return Err(StartError::WeakToken("fewer than 8 different characters"));
    }
    Ok(())
}

/// 32 random bytes, hex: the admin token when none is configured.
fn generate_token() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Write node state changes from the bus into the store.
async fn record_node_events(
    mut rx: tokio::sync::broadcast::Receiver<crate::telemetry::Event>,
    store: crate::store::Store,
    cancel: CancellationToken,
) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        let event = tokio::select! {
            _ = cancel.cancelled() => break,
            e = rx.recv() => e,
        };
        match event {
            Ok(crate::telemetry::Event::NodeState { node, from, to, reason, at }) => {
                store.node_event(crate::store::NodeEventRow {
                    at,
                    node,
                    from_state: from.name().to_string(),
                    to_state: to.name().to_string(),
                    reason,
                });
            }
            Ok(_) => {}
            Err(RecvError::Lagged(n)) => tracing::warn!(missed = n, "node events lagged behind"),
            Err(RecvError::Closed) => break,
        }
    }
}
