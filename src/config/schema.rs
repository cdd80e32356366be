//! The schema of `corral.toml`: one struct per section, with serde and the defaults.
//!
//! Every section is `#[serde(deny_unknown_fields, default)]`, so a typo is a problem and a
//! missing field takes a default that works: `Config::default()` (and so an empty file) is one
//! proxy listener on 127.0.0.1:11400 in front of one Ollama on 127.0.0.1:11434, with the
//! `default` category. These types are plain data: they hold no runtime state and do no I/O;
//! whether values make sense together is `validate`'s job, not the deserializer's. Field and
//! variant names are the public contract (CONTRACT.md): add fields freely, never rename one.

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub const DEFAULT_PROXY_ADDR: &str = "127.0.0.1:11400";
pub const DEFAULT_ADMIN_ADDR: &str = "127.0.0.1:11402";
pub const DEFAULT_NODE_URL: &str = "http://127.0.0.1:11434";

/// In a listener's `api_keys`: every client key of the fleet (any verifier the fleet's
/// database holds), so keys created on any broker work here without naming each one.
pub const ANY_FLEET_KEY: &str = "*";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub listeners: Vec<ListenerConfig>,
    pub admin: AdminConfig,
    pub nodes: Vec<NodeConfig>,
    pub categories: Vec<CategoryConfig>,
    pub providers: Vec<ProviderConfig>,
    pub proxy: ProxyConfig,
    pub health: HealthConfig,
    pub breaker: BreakerConfig,
    pub retry: RetryConfig,
    pub queue: QueueConfig,
    pub store: StoreConfig,
    pub alerts: AlertsConfig,
    pub telemetry: TelemetryConfig,
    /// Per client key: requests and tokens per window (`quota.rs`; fleet-wide with a fleet).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub quotas: Vec<QuotaConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listeners: vec![ListenerConfig::default()],
            admin: AdminConfig::default(),
            nodes: vec![NodeConfig { name: "local".into(), url: DEFAULT_NODE_URL.into(), ..NodeConfig::default() }],
            categories: vec![CategoryConfig::default()],
            providers: Vec::new(),
            proxy: ProxyConfig::default(),
            health: HealthConfig::default(),
            breaker: BreakerConfig::default(),
            retry: RetryConfig::default(),
            queue: QueueConfig::default(),
            store: StoreConfig::default(),
            alerts: AlertsConfig::default(),
            telemetry: TelemetryConfig::default(),
            quotas: Vec::new(),
        }
    }
}

/// `[[quotas]]`: how much one client key (or each key, `key = "*"`) may use per window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QuotaConfig {
    /// A client key's name (as in a listener's `api_keys`), or `"*"`: each key on its own.
    pub key: String,
    /// Requests per window; 0: no limit.
    pub requests: u64,
    /// Prompt plus output tokens per window; 0: no limit.
    pub tokens: u64,
    /// The window in seconds, fixed from the unix epoch (86400: each UTC day).
    pub window_s: u64,
}

impl Default for QuotaConfig {
    fn default() -> Self {
        Self { key: String::new(), requests: 0, tokens: 0, window_s: 86_400 }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Origin {
    #[default]
    Local,
    Remote,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ListenerConfig {
    pub addr: String,
    pub origin: Origin,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
    /// When not empty, every request on this listener must carry `Authorization: Bearer <key>`
    /// with one of these keys. Each entry names a keyring secret (`corral secret set NAME`)
    /// holding one client's key, so a client is revoked by deleting its secret.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub api_keys: Vec<String>,
    /// The categories this listener's clients may use (by header, listener default or model
    /// rule); empty: all.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub categories: Vec<String>,
    /// Web origins whose pages may call this listener, in addition to Ollama's own defaults
    /// (localhost, 127.0.0.1 and 0.0.0.0 on any port, `app://`, `file://`, `tauri://`,
    /// `vscode-webview://`, browser extensions), like `OLLAMA_ORIGINS`: `https://chat.example`,
    /// `http://*.lan:3000`, or `*` for any. A request with any other `Origin` gets 403.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allowed_origins: Vec<String>,
    /// Whether clients may pull, delete, create, copy and push models and upload blobs. Unset:
    /// yes on a `local` listener, no on a `remote` one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_ops: Option<bool>,
}

impl Default for ListenerConfig {
    fn default() -> Self {
        Self {
            addr: DEFAULT_PROXY_ADDR.into(),
            origin: Origin::Local,
            category: None,
            api_keys: Vec::new(),
            categories: Vec::new(),
            allowed_origins: Vec::new(),
            model_ops: None,
        }
    }
}

impl ListenerConfig {
    /// Whether this listener's clients may run model operations (an operator's right).
    pub fn allows_model_ops(&self) -> bool {
        self.model_ops.unwrap_or(self.origin == Origin::Local)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    pub addr: String,
    /// Open connections the admin listener holds at once; more get a 503 and are closed. Its
    /// own budget, apart from the proxy's, so a flooded proxy leaves the admin API reachable.
    pub max_connections: usize,
    /// Open connections from one address (IPv6: one /64) at once.
    pub max_connections_per_ip: usize,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self { addr: DEFAULT_ADMIN_ADDR.into(), max_connections: 256, max_connections_per_ip: 64 }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum NodeKind {
    #[default]
    Ollama,
    Openai,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct NodeConfig {
    pub name: String,
    pub url: String,
    pub kind: NodeKind,
    pub weight: u32,
    pub max_concurrency: u32,
    pub enabled: bool,
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            url: String::new(),
            kind: NodeKind::Ollama,
            weight: 1,
            max_concurrency: 4,
            enabled: true,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    RoundRobin,
    Weighted,
    #[default]
    LeastConnections,
    LeastLatency,
    P2c,
    Priority,
    Sticky,
    FastestFinish,
}

impl Policy {
    pub const ALL: [Policy; 8] = [
        Policy::RoundRobin,
        Policy::Weighted,
        Policy::LeastConnections,
        Policy::LeastLatency,
        Policy::P2c,
        Policy::Priority,
        Policy::Sticky,
        Policy::FastestFinish,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::RoundRobin => "round-robin",
            Self::Weighted => "weighted",
            Self::LeastConnections => "least-connections",
            Self::LeastLatency => "least-latency",
            Self::P2c => "p2c",
            Self::Priority => "priority",
            Self::Sticky => "sticky",
            Self::FastestFinish => "fastest-finish",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum CloudPermission {
    #[default]
    Never,
    OnFailure,
}

/// Where a category's local degrade chain stands beside its cloud fallback.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum DegradeOrder {
    /// A smaller local model first; the cloud only when the chain cannot answer either.
    #[default]
    BeforeCloud,
    /// The cloud first; the chain only when no provider answered.
    AfterCloud,
}

/// What the broker does with a request over one of its category's `limits`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum OverLimit {
    /// Lower it to the cap, and say so in `X-Corral-Clamped`.
    #[default]
    Clamp,
    /// 400 `over_limit`; nothing is sent.
    Refuse,
}

/// Per-category caps and defaults the broker applies to a generating request's body
/// (`proxy::limits`). Every cap is off by default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RequestLimits {
    /// Most tokens an answer may ask for (`options.num_predict`, OpenAI's `max_tokens` /
    /// `max_completion_tokens`); "no limit" (-1, -2) counts as over it. 0: no cap.
    pub max_predict: u64,
    /// Set when the request names no length. 0: none.
    pub default_predict: u64,
    /// Largest context a request may ask for (`options.num_ctx`). 0: no cap.
    pub max_num_ctx: u64,
    /// Set when the request names no context. 0: none.
    pub default_num_ctx: u64,
    /// Longest `keep_alive` (seconds) a request may ask of a node; "forever" (negative) counts
    /// as over it. 0: no cap.
    pub max_keep_alive_s: u64,
    /// Set when the request names no `keep_alive`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_keep_alive_s: Option<u64>,
    /// Allowed `temperature` range.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature_min: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature_max: Option<f64>,
    pub over_limit: OverLimit,
}

impl RequestLimits {
    /// Whether any cap or default is set (else bodies are never read for it).
    pub fn is_active(&self) -> bool {
        *self != Self { over_limit: self.over_limit, ..Self::default() }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CategoryConfig {
    pub name: String,
    pub policy: Policy,
    pub priority: u32,
    pub queue_timeout_ms: u64,
    pub cloud: CloudPermission,
    pub providers: Vec<String>,
    pub redact: bool,
    /// With `redact`: the most text (bytes, summed over every string scanned) one request may
    /// have redacted on its way to a provider; above it the request gets 413
    /// `redact_too_large` instead of leaving.
    pub redact_max_bytes: usize,
    pub models: Vec<String>,
    /// Prefer nodes that have the model loaded entirely in VRAM (`/api/ps`).
    pub affinity: bool,
    /// With `affinity`: rather wait for a node that has the model loaded but is busy than load
    /// it on an idle node (false: the cold idle node goes first, as a cold load is usually
    /// shorter than a whole answer; true for big models whose load takes longer than a turn).
    pub wait_for_warm: bool,
    /// For `policy = "priority"`: node names, most preferred first; unlisted nodes follow in
    /// config order.
    pub order: Vec<String>,
    /// 0: off. Else a node that has sent no first token this long after the request left is
    /// given up on (nothing has reached the client yet) and the request goes elsewhere; the
    /// node is not marked broken for it. Non-streamed requests are covered too: Ollama nodes
    /// are asked for a stream that Corral assembles.
    pub first_token_timeout_ms: u64,
    /// Longest silence between two chunks of an answer that has started; past it the stream
    /// ends with the error line (`stream_idle_timeout`).
    pub stream_idle_timeout_ms: u64,
    /// Opt-in: a stream that breaks or stalls after it started is continued on another node
    /// (what the client already has is sent as the assistant's partial message) and reaches
    /// the client as one answer.
    pub continue_on_cut: bool,
    /// How long a request's `Idempotency-Key` (or `X-Request-Id`) is remembered after it
    /// finished; a duplicate that comes while it runs joins it. 0: off (no deduplication).
    pub idempotency_window_ms: u64,
    /// Within the window, answer a duplicate of a finished request from memory (never disk)
    /// instead of 409 `duplicate_request`.
    pub replay_finished: bool,
    /// Caps and defaults for what a generating request may ask (`[categories.limits]`).
    pub limits: RequestLimits,
    /// Smaller local models, in order, served instead when the requested one cannot start
    /// within the queue timeout (its nodes all busy or down); the answer says
    /// `X-Corral-Degraded: <model>`.
    pub degrade: Vec<String>,
    pub degrade_order: DegradeOrder,
    /// The last resort after the chain (and the cloud, where allowed): a well-formed answer
    /// with this text, `done_reason: "degraded"` and `X-Corral-Degraded: static`, so a client
    /// that cannot wait gets a polite sentence instead of an error. TOML key `static`.
    #[serde(rename = "static", skip_serializing_if = "Option::is_none")]
    pub static_answer: Option<String>,
}

impl Default for CategoryConfig {
    fn default() -> Self {
        Self {
            name: "default".into(),
            policy: Policy::LeastConnections,
            priority: 1,
            queue_timeout_ms: 30_000,
            cloud: CloudPermission::Never,
            providers: Vec::new(),
            redact: false,
            redact_max_bytes: 1024 * 1024,
            models: Vec::new(),
            affinity: true,
            wait_for_warm: false,
            order: Vec::new(),
            first_token_timeout_ms: 0,
            stream_idle_timeout_ms: 30_000,
            continue_on_cut: false,
            idempotency_window_ms: 600_000,
            replay_finished: false,
            limits: RequestLimits::default(),
            degrade: Vec::new(),
            degrade_order: DegradeOrder::BeforeCloud,
            static_answer: None,
        }
    }
}

/// An OpenAI-compatible Chat Completions endpoint that categories may fall back to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProviderConfig {
    pub name: String,
    /// The API base, with or without its `/v1` (`https://api.openai.com/v1`).
    pub base_url: String,
    /// Name of the keyring entry holding the API key (`corral secret set NAME`); empty for a
    /// server that takes no key.
    pub secret: String,
    /// Local model name -> provider model; `"*"` catches the rest; unmapped names pass as-is.
    pub model_map: std::collections::BTreeMap<String, String>,
    pub connect_timeout_ms: u64,
    /// Until the first byte of the answer (a whole non-streamed answer included).
    pub first_byte_timeout_ms: u64,
}

impl Default for ProviderConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            base_url: String::new(),
            secret: String::new(),
            model_map: std::collections::BTreeMap::new(),
            connect_timeout_ms: 5_000,
            first_byte_timeout_ms: 60_000,
        }
    }
}

/// Thresholds that raise events for people (the desktop app turns them into notifications).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AlertsConfig {
    /// Share (0..1) of requests answered by a cloud provider over the window that raises the
    /// `fallback_share` event; 0 turns the alert off.
    pub fallback_share: f64,
    pub fallback_window_ms: u64,
    /// Fewer requests than this in the window never raise the alert (one fallback out of one
    /// request is not a trend).
    pub fallback_min_requests: u64,
}

impl Default for AlertsConfig {
    fn default() -> Self {
        Self { fallback_share: 0.25, fallback_window_ms: 300_000, fallback_min_requests: 20 }
    }
}

/// How requests are carried to nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProxyConfig {
    /// Largest request body accepted; bigger ones get 413 before anything is forwarded.
    pub max_body_bytes: usize,
    pub connect_timeout_ms: u64,
    /// Until the first byte of the answer: for inference, the first token (Ollama nodes are
    /// asked for a stream even when the client wants one JSON, which Corral assembles), so it
    /// does not grow with the answer's length. A node silent this long is taken out at once.
    /// It includes a cold model load: raise it for models that take longer to load.
    pub first_byte_timeout_ms: u64,
    /// Superseded by each category's `stream_idle_timeout_ms`, which every forwarded answer
    /// follows; still read so that older files load, and used only if a request's category
    /// vanished mid-flight.
    pub idle_timeout_ms: u64,
    /// How long `serve` lets in-flight requests finish after SIGINT/SIGTERM.
    pub drain_timeout_ms: u64,
    /// Context window assumed when neither the request (`options.num_ctx`) nor a node's
    /// `/api/ps` says otherwise (Ollama's own default).
    pub default_num_ctx: u64,
    /// Refuse prompts that cannot fit the context instead of letting Ollama truncate them.
    pub context_guard: bool,
    /// A new connection must send its first request head within this: protocol detection, the
    /// HTTP/2 preface and SETTINGS, and the headers (slowloris protection); HTTP/1.1 keep-alive
    /// requests after the first must send their headers within it too.
    pub header_read_timeout_ms: u64,
    /// A connection with no request in flight for this long is closed (HTTP/1.1 and h2).
    pub keep_alive_timeout_ms: u64,
    /// Longest silence while a request body is read; a stalled upload gets 408.
    pub body_read_timeout_ms: u64,
    /// Open connections one proxy listener holds at once (also kept below the process's open
    /// file limit); more get a 503 and are closed.
    pub max_connections: usize,
    /// Open connections from one address (IPv6: one /64) on one proxy listener.
    pub max_connections_per_ip: usize,
    /// Read-ahead per streamed answer: what a client reading slower than the node has not
    /// taken yet is held here, so the node's slot frees when the node finishes, not when the
    /// client does. Past it, backpressure reaches the node as without it. 0: off.
    pub stream_buffer_bytes: usize,
    /// All streams' read-ahead together (bound at start): when it is full, streams wait for
    /// their clients as without read-ahead.
    pub stream_buffer_total_bytes: usize,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: 32 * 1024 * 1024,
            connect_timeout_ms: 2_000,
            first_byte_timeout_ms: 60_000,
            idle_timeout_ms: 120_000,
            drain_timeout_ms: 30_000,
            default_num_ctx: 4096,
            context_guard: true,
            header_read_timeout_ms: 10_000,
            keep_alive_timeout_ms: 60_000,
            body_read_timeout_ms: 10_000,
            max_connections: 8192,
            max_connections_per_ip: 512,
            stream_buffer_bytes: 4 * 1024 * 1024,
            stream_buffer_total_bytes: 64 * 1024 * 1024,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    /// Liveness probe (`GET /api/version`) period.
    pub interval_ms: u64,
    pub timeout_ms: u64,
    /// Consecutive failed probes that take a healthy node down.
    pub failures_to_down: u32,
    /// Consecutive good probes that bring a down node back (hysteresis against flapping).
    pub successes_to_up: u32,
    /// Deep probe (`/api/tags`, `/api/ps`) period: which models each node has and has loaded.
    pub deep_interval_ms: u64,
    /// After a node comes back, its share of traffic ramps from 10% to 100% over this long.
    pub slow_start_ms: u64,
    /// Optional readiness probe: a 1-token generate on this model. Off by default: it loads
    /// the model and resets its keep-alive, pinning VRAM.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub readiness_model: Option<String>,
    /// Models to preload (`/api/generate` with only `model` and `keep_alive`) when a node
    /// joins or comes back, before it takes traffic.
    pub warm_models: Vec<String>,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            interval_ms: 2_000,
            timeout_ms: 1_000,
            failures_to_down: 2,
            successes_to_up: 2,
            deep_interval_ms: 10_000,
            slow_start_ms: 30_000,
            readiness_model: None,
            warm_models: Vec::new(),
        }
    }
}

/// Per-node circuit breaker, fed by the outcome of every request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerConfig {
    /// Consecutive failures (5xx, timeouts, broken streams) that open the breaker.
    pub failures_to_open: u32,
    /// How long an open breaker keeps the node out before a trial request.
    pub cooldown_ms: u64,
    /// Successful trials in a row that close it again.
    pub trial_requests: u32,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self { failures_to_open: 5, cooldown_ms: 10_000, trial_requests: 2 }
    }
}

/// Exporting traces (`[telemetry]`). Off unless `otlp_endpoint` is set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// An OTLP/HTTP collector's base URL (`http://127.0.0.1:4318`): spans are POSTed as
    /// protobuf to `{otlp_endpoint}/v1/traces`. Read at start (`state::RESTART_KEYS`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub otlp_endpoint: Option<String>,
}

impl TelemetryConfig {
    /// Where spans are POSTed: the endpoint with `/v1/traces` after its path.
    pub fn traces_url(&self) -> Option<String> {
        self.otlp_endpoint.as_ref().map(|e| format!("{}/v1/traces", e.trim_end_matches('/')))
    }
}

/// The request store: SQLite on one machine, or one PostgreSQL shared by a fleet of brokers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    pub enabled: bool,
    /// The SQLite file; default `corral.db` in the platform data dir. Unused with `url`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// `postgres://user@host:port/db`: a PostgreSQL that several brokers share (records,
    /// config, membership, capacity, client keys). Never holds a password: that is a keyring
    /// secret named by `password_secret`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The keyring secret holding the password for `url`, if the server asks for one: an
    /// entry stored with `corral secret set NAME` that no provider or listener names (a
    /// provider's key is never sent to a database).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password_secret: Option<String>,
    /// This broker's name among the fleet's (records' `broker` column, `/admin/brokers`);
    /// default: the host name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub broker: Option<String>,
    /// Rows older than this are deleted.
    pub max_age_days: u32,
    /// At most this many request rows are kept (newest first).
    pub max_rows: u64,
    /// Records waiting for the writer; past it they are dropped and counted.
    pub channel_capacity: usize,
    pub retention_interval_ms: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            path: None,
            url: None,
            password_secret: None,
            broker: None,
            max_age_days: 30,
            max_rows: 1_000_000,
            channel_capacity: 10_000,
            retention_interval_ms: 600_000,
        }
    }
}

/// The broker's own queue for requests waiting for a free node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueueConfig {
    /// Most requests waiting at once; past it, 429.
    pub max_requests: usize,
    /// Most request-body bytes waiting at once; past it, 429.
    pub max_bytes: usize,
    /// Share of both bounds that requests from `remote` listeners may hold, so remote clients
    /// can never fill the queue against the owner's local ones (0..1).
    pub remote_share: f64,
    /// Longest a request from a `remote` listener may wait in the queue, whatever its
    /// `X-Corral-Queue-Timeout` or category asks.
    pub remote_max_wait_ms: u64,
    /// Most model operations (pull, delete, create, copy, push, blob uploads) running at once
    /// across every listener; more wait for one to end, up to their queue timeout.
    pub max_model_ops: usize,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            max_requests: 1024,
            max_bytes: 256 * 1024 * 1024,
            remote_share: 0.5,
            remote_max_wait_ms: 30_000,
            max_model_ops: 4,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// Attempts per request, the first included.
    pub max_attempts: u32,
    /// Full-jitter exponential backoff: attempt n sleeps uniform(0, min(cap, base * 2^n)).
    pub backoff_base_ms: u64,
    pub backoff_cap_ms: u64,
    /// Retry budget: retries may be at most this share of recent requests ...
    pub budget_ratio: f64,
    /// ... plus this many per second, so a quiet broker can still retry.
    pub budget_min_per_sec: u32,
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self { max_attempts: 3, backoff_base_ms: 25, backoff_cap_ms: 1_000, budget_ratio: 0.2, budget_min_per_sec: 10 }
    }
}

impl CategoryConfig {
    /// Whether a request that no node can answer may go to a cloud provider.
    pub fn may_fall_back(&self) -> bool {
        self.cloud == CloudPermission::OnFailure && !self.providers.is_empty()
    }
    pub fn stream_idle_timeout(&self) -> Duration {
        Duration::from_millis(self.stream_idle_timeout_ms)
    }
    /// How long a finished request's name is remembered; `None`: deduplication is off.
    pub fn idempotency_window(&self) -> Option<Duration> {
        (self.idempotency_window_ms > 0).then(|| Duration::from_millis(self.idempotency_window_ms))
    }
    /// The first-token deadline, when the category sets one.
    pub fn first_token_timeout(&self) -> Option<Duration> {
        (self.first_token_timeout_ms > 0).then(|| Duration::from_millis(self.first_token_timeout_ms))
    }
}

impl ProxyConfig {
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }
    pub fn first_byte_timeout(&self) -> Duration {
        Duration::from_millis(self.first_byte_timeout_ms)
    }
    pub fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_timeout_ms)
    }
    pub fn body_read_timeout(&self) -> Duration {
        Duration::from_millis(self.body_read_timeout_ms)
    }
    pub fn drain_timeout(&self) -> Duration {
        Duration::from_millis(self.drain_timeout_ms)
    }
}

impl Config {
    pub fn category(&self, name: &str) -> Option<&CategoryConfig> {
        self.categories.iter().find(|c| c.name == name)
    }

    /// TOML text of this config, with every default written out.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot render config: {e}\n"))
    }
}

/// A model name as Ollama compares names (ollama/ollama `types/model/name.go`: `ParseName`,
/// `DisplayShortest`, `EqualFold`): case-insensitive, `:latest` when no tag is given, and the
/// default registry and namespace dropped, so `Llama3.2`, `llama3.2:LATEST`, `library/llama3.2`
/// and `registry.ollama.ai/library/llama3.2:latest` are one model, `llama3.2:latest`. Used as a
/// key only: what is forwarded keeps the client's spelling (Ollama resolves it itself).
pub fn normalize_model(name: &str) -> String {
    model_key(name).into_owned()
}

/// `normalize_model` without allocating when the name is already in that form (the hot path).
///
/// A name with no host or namespace, in lower case (`llama3.2:1b`, `llama3.2`: what clients
/// send nearly always) is its own key, or that with `:latest`: one pass over its bytes tells,
/// where the general path below takes several searches (it runs a few times per request;
/// callgrind: 2,500 instructions a request, issue 16).
pub fn model_key(name: &str) -> std::borrow::Cow<'_, str> {
    let (mut slash, mut upper, mut colon) = (false, false, false);
    for b in name.bytes() {
        slash |= b == b'/';
        upper |= b.is_ascii_uppercase();
        colon |= b == b':';
    }
    match (slash || upper, colon) {
        (false, true) => std::borrow::Cow::Borrowed(name),
        (false, false) => std::borrow::Cow::Owned([name, ":latest"].concat()),
        (true, _) => model_key_of_any(name),
    }
}

/// `model_key` for any name: host and namespace dropped, lower-cased, tagged.
fn model_key_of_any(name: &str) -> std::borrow::Cow<'_, str> {
    let short = shortest(name);
    let tagged = short.rfind(':').is_some_and(|c| short.rfind('/').is_none_or(|s| c > s));
    let lower = !short.bytes().any(|b| b.is_ascii_uppercase());
    if tagged && lower && short.len() == name.len() {
        return std::borrow::Cow::Borrowed(name);
    }
    let mut key = String::with_capacity(short.len() + ":latest".len());
    // The bytes at once, then lower-cased in place (ASCII only, as char by char it was).
    key.push_str(short);
    key.make_ascii_lowercase();
    if !tagged {
        key.push_str(":latest");
    }
    std::borrow::Cow::Owned(key)
}

/// `name` without Ollama's default host (`registry.ollama.ai`, any scheme) and namespace
/// (`library`), as `DisplayShortest` writes it.
fn shortest(name: &str) -> &str {
    let path = match name.rfind(':') {
        Some(c) if name.rfind('/').is_none_or(|s| c > s) => &name[..c],
        _ => name,
    };
    // Host, namespace and model, counted from the end (no list: this runs per request).
    let mut parts = path.rsplitn(3, '/');
    let model = parts.next().unwrap_or(path);
    let (namespace, host) = (parts.next(), parts.next());
    let model_at = path.len() - model.len();
    let default_host =
        host.is_none_or(|h| h.rsplit("://").next().unwrap_or(h).eq_ignore_ascii_case("registry.ollama.ai"));
    let default_ns = namespace.is_some_and(|n| n.eq_ignore_ascii_case("library"));
    match (namespace, host) {
        (Some(_), _) if default_host && default_ns => &name[model_at..],
        (Some(ns), Some(_)) if default_host => &name[model_at - ns.len() - 1..],
        _ => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_names_normalize_like_ollama() {
        assert_eq!(normalize_model("llama3.2"), "llama3.2:latest");
        assert_eq!(normalize_model("llama3.2:1b"), "llama3.2:1b");
        assert_eq!(normalize_model("registry.io:5000/lib/m"), "registry.io:5000/lib/m:latest");
        for same in [
            "Llama3.2",
            "llama3.2:LATEST",
            "library/llama3.2",
            "registry.ollama.ai/library/llama3.2:latest",
            "https://Registry.Ollama.AI/Library/llama3.2",
        ] {
            assert_eq!(normalize_model(same), "llama3.2:latest", "{same}");
        }
        assert_eq!(normalize_model("registry.ollama.ai/jmorgan/m:7b"), "jmorgan/m:7b", "a namespace stays");
        assert_eq!(normalize_model("hf.co/Org/Repo:Q4_K_M"), "hf.co/org/repo:q4_k_m", "a foreign host stays");
        assert!(matches!(model_key("llama3.2:1b"), std::borrow::Cow::Borrowed(_)), "no copy on the hot path");
    }

    proptest::proptest! {
        /// The one-pass shortcut keys every name as the general path does, and borrows only
        /// where it does: names of the bytes that matter (slashes, colons, case, the default
        /// host and namespace) in any order.
        #[test]
        fn the_shortcut_keys_as_the_general_path(
            name in "(registry\\.ollama\\.ai/|library/|Library/|hf\\.co/|https://|[a-zA-Z0-9._:/-]){0,6}"
        ) {
            let (quick, general) = (model_key(&name), model_key_of_any(&name));
            proptest::prop_assert_eq!(&quick, &general);
            let borrowed = |k: &std::borrow::Cow<'_, str>| matches!(k, std::borrow::Cow::Borrowed(_));
            proptest::prop_assert_eq!(borrowed(&quick), borrowed(&general), "{}", name);
        }
    }
}
