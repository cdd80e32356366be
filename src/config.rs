//! The configuration file (`corral.toml`): schema, defaults, and validation.
//!
//! Config is data: one struct per section, `deny_unknown_fields`, defaults that work with no file
//! at all (one proxy listener on 127.0.0.1:11400 in front of one Ollama on 127.0.0.1:11434).
//! Parsing never stops at the first problem: each section is deserialized on its own, then the
//! whole is validated, and every problem is reported with its path (`nodes[1].url`) and the line
//! it sits on, found through `toml_edit`'s spans. Names here are the public contract
//! (CONTRACT.md); add fields freely, never rename one.

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub const DEFAULT_PROXY_ADDR: &str = "127.0.0.1:11400";
pub const DEFAULT_ADMIN_ADDR: &str = "127.0.0.1:11402";
pub const DEFAULT_NODE_URL: &str = "http://127.0.0.1:11434";

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
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
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
}

impl Default for ListenerConfig {
    fn default() -> Self {
        Self { addr: DEFAULT_PROXY_ADDR.into(), origin: Origin::Local, category: None, api_keys: Vec::new() }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    pub addr: String,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self { addr: DEFAULT_ADMIN_ADDR.into() }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum NodeKind {
    #[default]
    Ollama,
    Openai,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
}

impl Policy {
    pub const ALL: [Policy; 7] = [
        Policy::RoundRobin,
        Policy::Weighted,
        Policy::LeastConnections,
        Policy::LeastLatency,
        Policy::P2c,
        Policy::Priority,
        Policy::Sticky,
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
    pub models: Vec<String>,
    /// Prefer nodes that have the model loaded entirely in VRAM (`/api/ps`).
    pub affinity: bool,
    /// For `policy = "priority"`: node names, most preferred first; unlisted nodes follow in
    /// config order.
    pub order: Vec<String>,
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
            models: Vec::new(),
            affinity: true,
            order: Vec::new(),
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
    /// Until the first byte of the answer. Non-streamed generation sends nothing until it is
    /// done, so this bounds a whole non-streamed answer too.
    pub first_byte_timeout_ms: u64,
    /// Longest silence between two chunks of a streamed answer.
    pub idle_timeout_ms: u64,
    /// How long `serve` lets in-flight requests finish after SIGINT/SIGTERM.
    pub drain_timeout_ms: u64,
    /// Context window assumed when neither the request (`options.num_ctx`) nor a node's
    /// `/api/ps` says otherwise (Ollama's own default).
    pub default_num_ctx: u64,
    /// Refuse prompts that cannot fit the context instead of letting Ollama truncate them.
    pub context_guard: bool,
    /// A client must send its request headers within this (slowloris protection).
    pub header_read_timeout_ms: u64,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: 32 * 1024 * 1024,
            connect_timeout_ms: 2_000,
            first_byte_timeout_ms: 300_000,
            idle_timeout_ms: 120_000,
            drain_timeout_ms: 30_000,
            default_num_ctx: 4096,
            context_guard: true,
            header_read_timeout_ms: 10_000,
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

/// The request store (SQLite).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    pub enabled: bool,
    /// The SQLite file; default `corral.db` in the platform data dir.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
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
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self { max_requests: 1024, max_bytes: 256 * 1024 * 1024 }
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
    pub fn drain_timeout(&self) -> Duration {
        Duration::from_millis(self.drain_timeout_ms)
    }
}

/// One thing wrong with a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Dotted path of the offending value, e.g. `nodes[1].url`.
    pub path: String,
    /// 1-based line in the file, when the value could be located.
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "line {line}: ")?,
            None => write!(f, "")?,
        }
        if self.path.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Every problem found in one config text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    pub problems: Vec<Problem>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.problems.len();
        write!(f, "{n} problem{} in config", if n == 1 { "" } else { "s" })?;
        for p in &self.problems {
            write!(f, "\n  {p}")?;
        }
        Ok(())
    }
}

impl ConfigError {
    pub fn code(&self) -> &'static str {
        "invalid_config"
    }
}

/// `corral.toml` in the platform config dir (`~/.config/corral/` on Linux).
pub fn default_path() -> Option<std::path::PathBuf> {
    directories::ProjectDirs::from("dev", "corral", "corral").map(|d| d.config_dir().join("corral.toml"))
}

impl Config {
    /// Parse and validate a config text, reporting every problem with its line.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let doc = match toml_edit::ImDocument::parse(text) {
            Ok(doc) => doc,
            Err(e) => {
                let line = e.span().map(|s| line_of(text, s.start));
                return Err(ConfigError {
                    problems: vec![Problem {
                        path: String::new(),
                        line,
                        message: format!("not valid TOML: {}", e.message()),
                    }],
                });
            }
        };
        let root: toml::Table = toml::from_str(text).map_err(|e| ConfigError {
            problems: vec![Problem {
                path: String::new(),
                line: e.span().map(|s| line_of(text, s.start)),
                message: e.message().to_string(),
            }],
        })?;
        let locator = Locator { text, doc: &doc };
        let mut problems = Vec::new();
        let mut config = Config::default();

        for (key, value) in &root {
            let path = key.as_str();
            match path {
                "listeners" => section_array(&locator, path, value, &mut problems, &mut config.listeners),
                "nodes" => section_array(&locator, path, value, &mut problems, &mut config.nodes),
                "categories" => section_array(&locator, path, value, &mut problems, &mut config.categories),
                "providers" => section_array(&locator, path, value, &mut problems, &mut config.providers),
                "admin" => section(&locator, path, value, &mut problems, &mut config.admin),
                "proxy" => section(&locator, path, value, &mut problems, &mut config.proxy),
                "health" => section(&locator, path, value, &mut problems, &mut config.health),
                "breaker" => section(&locator, path, value, &mut problems, &mut config.breaker),
                "retry" => section(&locator, path, value, &mut problems, &mut config.retry),
                "queue" => section(&locator, path, value, &mut problems, &mut config.queue),
                "store" => section(&locator, path, value, &mut problems, &mut config.store),
                "alerts" => section(&locator, path, value, &mut problems, &mut config.alerts),
                other => problems.push(Problem {
                    path: other.to_string(),
                    line: locator.line(other, None),
                    message:
                        "unknown section; known: listeners, admin, nodes, categories, providers, proxy, health, breaker, retry, queue, store, alerts"
                            .into(),
                }),
            }
        }
        // A file that lists no categories still gets the default one, so requests can be classified.
        if !root.contains_key("categories") {
            config.categories = vec![CategoryConfig::default()];
        }
        for (path, message) in config.validate() {
            let line = locator.line(&path, None);
            problems.push(Problem { path, line, message });
        }
        if problems.is_empty() {
            Ok(config)
        } else {
            problems.sort_by_key(|p| p.line.unwrap_or(usize::MAX));
            Err(ConfigError { problems })
        }
    }

    /// Read and parse a file; problems carry the file's lines.
    pub fn load(path: &std::path::Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            problems: vec![Problem {
                path: String::new(),
                line: None,
                message: format!("cannot read {}: {e}", path.display()),
            }],
        })?;
        Config::parse(&text)
    }

    /// Semantic checks over the whole config: `(path, message)` for every problem.
    pub fn validate(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut push = |path: String, msg: String| out.push((path, msg));

        if self.listeners.is_empty() {
            push("listeners".into(), "at least one proxy listener is needed".into());
        }
        let mut addrs = HashSet::new();
        for (i, l) in self.listeners.iter().enumerate() {
            match l.addr.parse::<SocketAddr>() {
                Err(_) => push(
                    format!("listeners[{i}].addr"),
                    format!("\"{}\" is not an address like 127.0.0.1:11400", l.addr),
                ),
                Ok(a) => {
                    // Port 0 means "any free port": never a clash.
                    if a.port() != 0 && !addrs.insert(a) {
                        push(format!("listeners[{i}].addr"), format!("{a} is used twice"));
                    }
                }
            }
            for (j, k) in l.api_keys.iter().enumerate() {
                if crate::secrets::check_name(k).is_err() {
                    push(
                        format!("listeners[{i}].api_keys[{j}]"),
                        format!("\"{k}\" is not a secret name (a-z, 0-9, '-', '_', '.')"),
                    );
                }
            }
            if let Some(c) = &l.category {
                if !self.categories.iter().any(|k| &k.name == c) {
                    push(format!("listeners[{i}].category"), format!("no category named \"{c}\""));
                }
            }
        }
        match self.admin.addr.parse::<SocketAddr>() {
            Err(_) => {
                push("admin.addr".into(), format!("\"{}\" is not an address like 127.0.0.1:11402", self.admin.addr))
            }
            Ok(a) => {
                if a.port() != 0 && addrs.contains(&a) {
                    push("admin.addr".into(), format!("{a} is also a proxy listener"));
                }
            }
        }

        if self.nodes.is_empty() {
            push("nodes".into(), "at least one node is needed".into());
        }
        let mut names = HashSet::new();
        for (i, n) in self.nodes.iter().enumerate() {
            if n.name.is_empty() {
                push(format!("nodes[{i}].name"), "a node needs a name".into());
            } else if !n.name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-_.".contains(c)) {
                push(format!("nodes[{i}].name"), format!("\"{}\" may only use a-z, 0-9, '-', '_' and '.'", n.name));
            } else if !names.insert(n.name.as_str()) {
                push(format!("nodes[{i}].name"), format!("\"{}\" is used by an earlier node", n.name));
            }
            match url::Url::parse(&n.url) {
                Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {}
                Ok(u) => push(
                    format!("nodes[{i}].url"),
                    format!("\"{}\" must be an http:// or https:// URL with a host (got scheme {})", n.url, u.scheme()),
                ),
                Err(e) => push(format!("nodes[{i}].url"), format!("\"{}\" is not a URL: {e}", n.url)),
            }
            if n.weight == 0 {
                push(format!("nodes[{i}].weight"), "must be greater than 0".into());
            }
            if n.max_concurrency == 0 {
                push(format!("nodes[{i}].max_concurrency"), "must be at least 1".into());
            }
        }

        let mut cats = HashSet::new();
        for (i, c) in self.categories.iter().enumerate() {
            if c.name.is_empty() {
                push(format!("categories[{i}].name"), "a category needs a name".into());
            } else if !cats.insert(c.name.as_str()) {
                push(format!("categories[{i}].name"), format!("\"{}\" is used by an earlier category", c.name));
            }
            for (j, o) in c.order.iter().enumerate() {
                if !self.nodes.iter().any(|n| &n.name == o) {
                    push(format!("categories[{i}].order[{j}]"), format!("no node named \"{o}\""));
                }
            }
            if c.queue_timeout_ms == 0 {
                push(format!("categories[{i}].queue_timeout_ms"), "must be greater than 0".into());
            }
            for (j, p) in c.providers.iter().enumerate() {
                if !self.providers.iter().any(|q| &q.name == p) {
                    push(format!("categories[{i}].providers[{j}]"), format!("no provider named \"{p}\""));
                }
            }
            if c.cloud == CloudPermission::OnFailure && c.providers.is_empty() {
                push(
                    format!("categories[{i}].providers"),
                    "cloud = \"on-failure\" needs at least one provider to fall back to".into(),
                );
            }
            for (j, m) in c.models.iter().enumerate() {
                if m.is_empty() {
                    push(format!("categories[{i}].models[{j}]"), "an empty pattern matches nothing".into());
                }
            }
        }

        let mut provs = HashSet::new();
        for (i, p) in self.providers.iter().enumerate() {
            if p.name.is_empty() {
                push(format!("providers[{i}].name"), "a provider needs a name".into());
            } else if !provs.insert(p.name.as_str()) {
                push(format!("providers[{i}].name"), format!("\"{}\" is used by an earlier provider", p.name));
            }
            match url::Url::parse(&p.base_url) {
                Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {}
                Ok(_) => push(
                    format!("providers[{i}].base_url"),
                    format!("\"{}\" must be an http:// or https:// URL", p.base_url),
                ),
                Err(e) => push(format!("providers[{i}].base_url"), format!("\"{}\" is not a URL: {e}", p.base_url)),
            }
            if !p.secret.is_empty() && crate::secrets::check_name(&p.secret).is_err() {
                push(
                    format!("providers[{i}].secret"),
                    format!("\"{}\" is not a secret name (a-z, 0-9, '-', '_', '.')", p.secret),
                );
            }
            for (field, v) in
                [("connect_timeout_ms", p.connect_timeout_ms), ("first_byte_timeout_ms", p.first_byte_timeout_ms)]
            {
                if v == 0 {
                    push(format!("providers[{i}].{field}"), "must be greater than 0".into());
                }
            }
        }

        for (field, v) in [
            ("proxy.connect_timeout_ms", self.proxy.connect_timeout_ms),
            ("proxy.first_byte_timeout_ms", self.proxy.first_byte_timeout_ms),
            ("proxy.idle_timeout_ms", self.proxy.idle_timeout_ms),
            ("proxy.max_body_bytes", self.proxy.max_body_bytes as u64),
            ("health.interval_ms", self.health.interval_ms),
            ("health.timeout_ms", self.health.timeout_ms),
            ("health.deep_interval_ms", self.health.deep_interval_ms),
            ("health.failures_to_down", u64::from(self.health.failures_to_down)),
            ("health.successes_to_up", u64::from(self.health.successes_to_up)),
            ("breaker.failures_to_open", u64::from(self.breaker.failures_to_open)),
            ("breaker.trial_requests", u64::from(self.breaker.trial_requests)),
            ("queue.max_requests", self.queue.max_requests as u64),
            ("store.max_rows", self.store.max_rows),
            ("store.channel_capacity", self.store.channel_capacity as u64),
            ("store.retention_interval_ms", self.store.retention_interval_ms),
            ("queue.max_bytes", self.queue.max_bytes as u64),
            ("proxy.default_num_ctx", self.proxy.default_num_ctx),
            ("proxy.header_read_timeout_ms", self.proxy.header_read_timeout_ms),
            ("retry.max_attempts", u64::from(self.retry.max_attempts)),
        ] {
            if v == 0 {
                push(field.into(), "must be greater than 0".into());
            }
        }
        if !(0.0..=1.0).contains(&self.alerts.fallback_share) {
            push("alerts.fallback_share".into(), "must be between 0 and 1 (0 turns the alert off)".into());
        }
        if self.alerts.fallback_window_ms < 1_000 {
            push("alerts.fallback_window_ms".into(), "must be at least 1000".into());
        }
        if !(0.0..=1.0).contains(&self.retry.budget_ratio) {
            push("retry.budget_ratio".into(), "must be between 0 and 1".into());
        }
        if self.retry.backoff_cap_ms < self.retry.backoff_base_ms {
            push("retry.backoff_cap_ms".into(), "must not be smaller than retry.backoff_base_ms".into());
        }
        out
    }

    pub fn category(&self, name: &str) -> Option<&CategoryConfig> {
        self.categories.iter().find(|c| c.name == name)
    }

    /// TOML text of this config, with every default written out.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot render config: {e}\n"))
    }
}

fn section<T: serde::de::DeserializeOwned>(
    loc: &Locator<'_>,
    path: &str,
    value: &toml::Value,
    problems: &mut Vec<Problem>,
    out: &mut T,
) {
    match T::deserialize(value.clone()) {
        Ok(v) => *out = v,
        Err(e) => problems.push(loc.serde_problem(path, e)),
    }
}

fn section_array<T: serde::de::DeserializeOwned>(
    loc: &Locator<'_>,
    path: &str,
    value: &toml::Value,
    problems: &mut Vec<Problem>,
    out: &mut Vec<T>,
) {
    let Some(items) = value.as_array() else {
        problems.push(Problem {
            path: path.into(),
            line: loc.line(path, None),
            message: format!("must be a list of tables, written [[{path}]]"),
        });
        return;
    };
    out.clear();
    for (i, item) in items.iter().enumerate() {
        let item_path = format!("{path}[{i}]");
        match T::deserialize(item.clone()) {
            Ok(v) => out.push(v),
            Err(e) => problems.push(loc.serde_problem(&item_path, e)),
        }
    }
}

/// Finds the line of a dotted path in the original text.
struct Locator<'a> {
    text: &'a str,
    doc: &'a toml_edit::ImDocument<&'a str>,
}

impl Locator<'_> {
    fn serde_problem(&self, path: &str, e: toml::de::Error) -> Problem {
        let message = e.message().trim().to_string();
        // serde names the offending field (or the offending value) in backticks: point at the
        // key it belongs to when the file has it.
        let quoted = message.split('`').nth(1).unwrap_or_default();
        let full = if self.item(&format!("{path}.{quoted}")).is_some() {
            format!("{path}.{quoted}")
        } else {
            self.key_with_value(path, quoted).map(|k| format!("{path}.{k}")).unwrap_or_else(|| path.to_string())
        };
        Problem { line: self.line(&full, None), path: full, message }
    }

    fn line(&self, path: &str, _hint: Option<usize>) -> Option<usize> {
        // Walk back up the path until something has a span.
        let mut p = path.to_string();
        loop {
            if let Some(span) = self.span(&p) {
                return Some(line_of(self.text, span.start));
            }
            match p.rfind(['.', '[']) {
                Some(i) => p.truncate(i),
                None => return None,
            }
        }
    }

    /// The key of the table at `path` whose value is the string `value`.
    fn key_with_value(&self, path: &str, value: &str) -> Option<String> {
        let table: Vec<(String, Option<String>)> = match self.item(path)? {
            Located::Table(t) => t.iter().map(|(k, v)| (k.to_string(), v.as_str().map(str::to_string))).collect(),
            Located::Item(toml_edit::Item::Table(t)) => {
                t.iter().map(|(k, v)| (k.to_string(), v.as_str().map(str::to_string))).collect()
            }
            Located::Item(toml_edit::Item::Value(toml_edit::Value::InlineTable(t)))
            | Located::Value(toml_edit::Value::InlineTable(t)) => {
                t.iter().map(|(k, v)| (k.to_string(), v.as_str().map(str::to_string))).collect()
            }
            _ => return None,
        };
        table.into_iter().find(|(_, v)| v.as_deref() == Some(value)).map(|(k, _)| k)
    }

    fn span(&self, path: &str) -> Option<std::ops::Range<usize>> {
        match self.item(path)? {
            Located::Item(item) => item.span(),
            Located::Table(t) => t.span(),
            Located::Value(v) => v.span(),
        }
    }

    fn item(&self, path: &str) -> Option<Located<'_>> {
        let mut cur = Located::Table(self.doc.as_table());
        for seg in path.split('.') {
            let (key, index) = match seg.split_once('[') {
                Some((k, rest)) => (k, rest.trim_end_matches(']').parse::<usize>().ok()),
                None => (seg, None),
            };
            let next = match cur {
                Located::Table(t) => Located::Item(t.get(key)?),
                Located::Item(toml_edit::Item::Table(t)) => Located::Item(t.get(key)?),
                Located::Item(toml_edit::Item::Value(toml_edit::Value::InlineTable(t))) => Located::Value(t.get(key)?),
                Located::Value(toml_edit::Value::InlineTable(t)) => Located::Value(t.get(key)?),
                _ => return None,
            };
            cur = match index {
                None => next,
                Some(i) => match next {
                    Located::Item(toml_edit::Item::ArrayOfTables(a)) => Located::Table(a.get(i)?),
                    Located::Item(toml_edit::Item::Value(toml_edit::Value::Array(a))) => Located::Value(a.get(i)?),
                    Located::Value(toml_edit::Value::Array(a)) => Located::Value(a.get(i)?),
                    _ => return None,
                },
            };
        }
        Some(cur)
    }
}

enum Located<'a> {
    Item(&'a toml_edit::Item),
    Table(&'a toml_edit::Table),
    Value(&'a toml_edit::Value),
}

fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())].iter().filter(|&&b| b == b'\n').count() + 1
}

/// Ollama treats `llama3.2` and `llama3.2:latest` as one model.
pub fn normalize_model(name: &str) -> String {
    model_key(name).into_owned()
}

/// `normalize_model` without allocating when the name already has a tag (the hot path).
pub fn model_key(name: &str) -> std::borrow::Cow<'_, str> {
    let last = name.rsplit('/').next().unwrap_or(name);
    if last.contains(':') {
        std::borrow::Cow::Borrowed(name)
    } else {
        std::borrow::Cow::Owned(format!("{name}:latest"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_gives_working_defaults() {
        let c = Config::parse("").expect("empty config is valid");
        assert_eq!(c.listeners[0].addr, DEFAULT_PROXY_ADDR);
        assert_eq!(c.nodes[0].url, DEFAULT_NODE_URL);
        assert_eq!(c.categories[0].name, "default");
    }

    #[test]
    fn contract_example_parses() {
        let text = r#"
[[listeners]]
addr = "127.0.0.1:11400"
origin = "local"
category = "default"

[admin]
addr = "127.0.0.1:11402"

[[nodes]]
name = "gpu0"
url = "http://127.0.0.1:11434"
kind = "ollama"
weight = 1
max_concurrency = 4
enabled = true

[[categories]]
name = "default"
policy = "least-connections"
priority = 1
queue_timeout_ms = 30000
cloud = "never"
providers = []
redact = false
models = []

[[providers]]
name = "openai"
base_url = "https://api.openai.com/v1"
secret = "openai"
model_map = { "llama3.1:8b" = "gpt-4o-mini" }
"#;
        let c = Config::parse(text).unwrap_or_else(|e| panic!("contract example must parse: {e}"));
        assert_eq!(c.nodes[0].name, "gpu0");
        assert_eq!(c.providers[0].model_map["llama3.1:8b"], "gpt-4o-mini");
    }

    #[test]
    fn every_problem_is_reported_with_its_line() {
        let text = "[[nodes]]\nname = \"a\"\nurl = \"http://127.0.0.1:1\"\n\n[[nodes]]\nname = \"a\"\nurl = \"not a url\"\nweight = 0\n\n[[categories]]\nname = \"default\"\npolicy = \"fastest\"\n\n[health]\ninterval_ms = \"soon\"\n";
        let err = Config::parse(text).expect_err("three sections are broken");
        let lines: Vec<_> = err.problems.iter().map(|p| (p.path.as_str(), p.line)).collect();
        assert!(lines.contains(&("nodes[1].name", Some(6))), "duplicate name on line 6: {lines:?}");
        assert!(lines.contains(&("nodes[1].url", Some(7))), "bad url on line 7: {lines:?}");
        assert!(lines.contains(&("nodes[1].weight", Some(8))), "zero weight on line 8: {lines:?}");
        assert!(
            err.problems
                .iter()
                .any(|p| p.path.starts_with("categories[0]") && p.line == Some(12) && p.message.contains("fastest")),
            "{err}"
        );
        assert!(err.problems.iter().any(|p| p.path.starts_with("health") && p.line.is_some()), "{err}");
    }

    #[test]
    fn cloud_settings_are_checked() {
        let text = "[[nodes]]\nname = \"a\"\nurl = \"http://127.0.0.1:1\"\nkind = \"openai\"\n\n[[categories]]\nname = \"default\"\ncloud = \"on-failure\"\n\n[[providers]]\nname = \"p\"\nbase_url = \"ftp://x\"\nsecret = \"Bad Name\"\nfirst_byte_timeout_ms = 0\n\n[alerts]\nfallback_share = 2.0\n";
        let err = Config::parse(text).expect_err("broken cloud settings");
        let paths: Vec<&str> = err.problems.iter().map(|p| p.path.as_str()).collect();
        for want in [
            "categories[0].providers",
            "providers[0].base_url",
            "providers[0].secret",
            "providers[0].first_byte_timeout_ms",
            "alerts.fallback_share",
        ] {
            assert!(paths.contains(&want), "{want} missing from {paths:?}");
        }
        assert!(!paths.iter().any(|p| p.starts_with("nodes")), "kind = openai is a valid node: {paths:?}");
        let ok = "[[nodes]]\nname = \"a\"\nurl = \"https://gpu.example:443\"\n\n[[providers]]\nname = \"local-vllm\"\nbase_url = \"http://10.0.0.9:8000/v1\"\n";
        let c = Config::parse(ok).unwrap_or_else(|e| panic!("https nodes and key-less providers are fine: {e}"));
        assert_eq!(c.providers[0].first_byte_timeout_ms, 60_000);
    }

    #[test]
    fn unknown_fields_and_sections_are_named() {
        let err = Config::parse("[[nodes]]\nname = \"a\"\nurl = \"http://x:1\"\nwieght = 2\n[bogus]\nx = 1\n")
            .expect_err("typos");
        let text = err.to_string();
        assert!(text.contains("line 4") && text.contains("wieght"), "{text}");
        assert!(text.contains("line 5") && text.contains("bogus"), "{text}");
    }

    #[test]
    fn syntax_errors_have_a_line() {
        let err = Config::parse("[[nodes]]\nname = \"a\nurl = 3\n").expect_err("unterminated string");
        assert_eq!(err.problems.len(), 1);
        assert_eq!(err.problems[0].line, Some(2), "{err}");
    }

    #[test]
    fn round_trips_through_toml() {
        let c = Config::default();
        let back = Config::parse(&c.to_toml()).expect("rendered config parses");
        assert_eq!(c, back);
    }

    #[test]
    fn model_names_normalize_like_ollama() {
        assert_eq!(normalize_model("llama3.2"), "llama3.2:latest");
        assert_eq!(normalize_model("llama3.2:1b"), "llama3.2:1b");
        assert_eq!(normalize_model("registry.io:5000/lib/m"), "registry.io:5000/lib/m:latest");
    }
}

/// How an imported config combines with the running one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ImportMode {
    /// Add the file's nodes, categories and providers; the file wins on a name both have;
    /// everything else stays.
    Merge,
    /// Nodes, categories and providers become exactly the file's.
    Replace,
}

/// One line of an import preview.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    /// "added" | "changed" | "removed"
    pub action: &'static str,
    /// "node" | "category" | "provider" | "section"
    pub kind: &'static str,
    pub name: String,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sign = match self.action {
            "added" => '+',
            "removed" => '-',
            _ => '~',
        };
        write!(f, "{sign} {} {} ({})", self.kind, self.name, self.action)
    }
}

/// The result of importing `incoming` into `base`: the config to run and what changes.
/// Addresses (listeners, admin) and the store location stay the base's: they belong to the
/// machine, not to the shared setup.
pub fn import(base: &Config, incoming: &Config, mode: ImportMode) -> (Config, Vec<Change>) {
    fn combine<T: Clone + PartialEq>(
        kind: &'static str,
        base: &[T],
        incoming: &[T],
        name: impl Fn(&T) -> &str,
        mode: ImportMode,
        changes: &mut Vec<Change>,
    ) -> Vec<T> {
        let mut out: Vec<T> = match mode {
            ImportMode::Merge => base.to_vec(),
            ImportMode::Replace => Vec::new(),
        };
        for item in incoming {
            let n = name(item);
            match base.iter().find(|b| name(b) == n) {
                None => changes.push(Change { action: "added", kind, name: n.to_string() }),
                Some(old) if old != item => changes.push(Change { action: "changed", kind, name: n.to_string() }),
                Some(_) => {}
            }
            match out.iter_mut().find(|o| name(o) == n) {
                Some(slot) => *slot = item.clone(),
                None => out.push(item.clone()),
            }
        }
        if mode == ImportMode::Replace {
            for old in base.iter().filter(|b| !incoming.iter().any(|i| name(i) == name(b))) {
                changes.push(Change { action: "removed", kind, name: name(old).to_string() });
            }
        }
        out
    }
    let mut changes = Vec::new();
    let mut next = base.clone();
    next.nodes = combine("node", &base.nodes, &incoming.nodes, |n| &n.name, mode, &mut changes);
    next.categories = combine("category", &base.categories, &incoming.categories, |c| &c.name, mode, &mut changes);
    next.providers = combine("provider", &base.providers, &incoming.providers, |p| &p.name, mode, &mut changes);
    for (name, differs) in [
        ("proxy", base.proxy != incoming.proxy),
        ("health", base.health != incoming.health),
        ("breaker", base.breaker != incoming.breaker),
        ("retry", base.retry != incoming.retry),
        ("queue", base.queue != incoming.queue),
        ("alerts", base.alerts != incoming.alerts),
    ] {
        if differs && mode == ImportMode::Replace {
            changes.push(Change { action: "changed", kind: "section", name: name.to_string() });
        }
    }
    if mode == ImportMode::Replace {
        next.proxy = incoming.proxy.clone();
        next.health = incoming.health.clone();
        next.breaker = incoming.breaker.clone();
        next.retry = incoming.retry.clone();
        next.queue = incoming.queue.clone();
        next.alerts = incoming.alerts.clone();
    }
    (next, changes)
}

/// Secret names a config refers to (values live in the OS keyring, never in the file).
pub fn secret_names(config: &Config) -> Vec<String> {
    let mut names: Vec<String> = config
        .providers
        .iter()
        .map(|p| p.secret.clone())
        .chain(config.listeners.iter().flat_map(|l| l.api_keys.iter().cloned()))
        .filter(|s| !s.is_empty())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The text `config export` writes: a header, then the whole config with defaults filled in.
pub fn export_text(config: &Config) -> String {
    format!(
        "# Corral config, exported by corral {} (format 1). Secrets are never included:\n# providers name keyring entries; set them with `corral secret set NAME`.\n{}",
        env!("CARGO_PKG_VERSION"),
        config.to_toml()
    )
}

#[cfg(test)]
mod import_tests {
    use super::*;

    fn node(name: &str, url: &str) -> NodeConfig {
        NodeConfig { name: name.into(), url: url.into(), ..NodeConfig::default() }
    }

    #[test]
    fn merge_adds_and_updates_but_keeps_the_rest() {
        let base = Config { nodes: vec![node("a", "http://a:1"), node("b", "http://b:1")], ..Config::default() };
        let mut incoming =
            Config { nodes: vec![node("b", "http://b:2"), node("c", "http://c:1")], ..Config::default() };
        incoming.listeners[0].addr = "0.0.0.0:9".into();
        let (next, changes) = import(&base, &incoming, ImportMode::Merge);
        let names: Vec<_> = next.nodes.iter().map(|n| (n.name.as_str(), n.url.as_str())).collect();
        assert_eq!(names, vec![("a", "http://a:1"), ("b", "http://b:2"), ("c", "http://c:1")]);
        assert!(changes.contains(&Change { action: "changed", kind: "node", name: "b".into() }));
        assert!(changes.contains(&Change { action: "added", kind: "node", name: "c".into() }));
        assert_eq!(next.listeners, base.listeners, "addresses belong to the machine");
    }

    #[test]
    fn replace_removes_what_the_file_lacks() {
        let base = Config { nodes: vec![node("a", "http://a:1"), node("b", "http://b:1")], ..Config::default() };
        let incoming = Config { nodes: vec![node("b", "http://b:1")], ..Config::default() };
        let (next, changes) = import(&base, &incoming, ImportMode::Replace);
        assert_eq!(next.nodes.len(), 1);
        assert_eq!(changes, vec![Change { action: "removed", kind: "node", name: "a".into() }]);
    }

    #[test]
    fn export_round_trips() {
        let c = Config::default();
        assert_eq!(Config::parse(&export_text(&c)).expect("parses"), c);
    }
}
