//! The `corral` command line as clap sees it: every command, flag, default and help text.
//!
//! These names are the public contract (CONTRACT.md); `main.rs` parses them and dispatches to
//! the module of the same name in `cmd/`.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(name = "corral", version, about = "One endpoint in front of a cluster of Ollama nodes")]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the broker headless until SIGINT/SIGTERM, then drain gracefully.
    Serve {
        /// Config file; default: corral.toml in the platform config dir, or built-in defaults.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Raise desktop notifications (node down/back, failover storm, cloud fallback, failed
        /// reloads) through the session's notification server.
        #[arg(long)]
        notify: bool,
        /// Serve the proxy on this address instead of the config's first listener.
        #[arg(long, value_name = "ADDR")]
        listen: Option<String>,
        /// Serve the admin API on this address instead of the config's.
        #[arg(long, value_name = "ADDR")]
        admin: Option<String>,
    },
    /// A running broker at a glance: nodes with their state, in-flight and queue, and the
    /// endpoint clients should use. Needs the admin token in CORRAL_ADMIN_TOKEN.
    Status {
        /// The broker's admin URL.
        #[arg(long, env = "CORRAL_ADMIN_URL", default_value = "http://127.0.0.1:11402")]
        url: String,
    },
    /// Rehearse failover on a running broker: take a node out (drain, or --fault on a sim), send a small batch of
    /// requests through each category, put the node back, and print what the clients saw
    /// (status, served by, attempts, ms, error), a table per category. Exit 0 when the drill
    /// ran, whatever the clients saw. Needs the admin token in CORRAL_ADMIN_TOKEN.
    Drill {
        /// The category to drill (default: every category).
        #[arg(long)]
        category: Option<String>,
        /// The node to take out (default: the busiest serving node).
        #[arg(long)]
        node: Option<String>,
        /// Requests per category, 1 to 20.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=20))]
        requests: u16,
        /// Take the node out by a simulated fault instead of a drain: every inference request
        /// it gets answers 500, so requests still reach it and fail over (only a `corral sim`
        /// node, as in `corral demo`, takes one).
        #[arg(long)]
        fault: bool,
        /// The broker's admin URL.
        #[arg(long, env = "CORRAL_ADMIN_URL", default_value = "http://127.0.0.1:11402")]
        url: String,
    },
    /// Shell completions, generated from this CLI's own definition.
    Completions { shell: clap_complete::Shell },
    /// The manual page in roff, generated from this CLI's own definition (`corral man | man -l -`).
    Man {
        /// Write corral.1 and one page per command (corral-serve.1, ...) into DIR instead.
        #[arg(long, value_name = "DIR")]
        out_dir: Option<PathBuf>,
    },
    /// Broker in front of simulated nodes on loopback: the zero-setup way to try Corral.
    Demo {
        /// Proxy port.
        #[arg(long, default_value_t = 11400)]
        port: u16,
        /// How many simulated nodes.
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// Admin API port (0: any free port).
        #[arg(long, default_value_t = 11402)]
        admin_port: u16,
        /// The demo's request store (default: corral-demo.db in the platform data dir).
        #[arg(long)]
        db: Option<PathBuf>,
    },
    /// Run simulated Ollama node(s) on loopback.
    Sim {
        /// Port of the (first) node.
        #[arg(long, alias = "base-port", default_value_t = 11434)]
        port: u16,
        /// Run N nodes on consecutive ports from --port (or --base-port).
        #[arg(long, default_value_t = 1)]
        nodes: usize,
        /// Models the node serves, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "llama3.2:latest,nomic-embed-text:latest")]
        models: Vec<String>,
        /// Tokens per second while streaming (0: as fast as possible).
        #[arg(long, default_value_t = 30.0)]
        tps: f64,
        /// Milliseconds before the first token.
        #[arg(long, default_value_t = 100)]
        ttft_ms: u64,
        /// Milliseconds a model that is not loaded takes to load (reported as `load_duration`).
        #[arg(long, default_value_t = 0)]
        load_ms: u64,
        /// Requests generating at once; more wait, up to --max-queue, then "server busy".
        #[arg(long, default_value_t = 4)]
        parallel: usize,
        #[arg(long, default_value_t = 512)]
        max_queue: usize,
        /// Play an OpenAI-compatible cloud API (only `/v1/*`), keeping request bodies for
        /// `/_sim/received`.
        #[arg(long)]
        cloud: bool,
        /// Require this bearer key on `/v1/*` (as a cloud API does).
        #[arg(long, env = "CORRAL_SIM_API_KEY", hide_env_values = true)]
        api_key: Option<String>,
        /// Answer with the last user message instead of generated text.
        #[arg(long)]
        echo: bool,
    },
    /// Work with config files.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Load test an Ollama-API endpoint: requests/s, tokens/s, latency percentiles, errors.
    Bench(BenchArgs),
    /// API keys in the OS keyring (names only ever leave it).
    Secret {
        #[command(subcommand)]
        command: SecretCommand,
    },
    /// Request metadata from the store: this broker's SQLite file, or with `store.url` the
    /// fleet's PostgreSQL (every broker's requests; `--broker NAME` for one's).
    History(HistoryArgs),
    /// Charts of latency, time to first token, throughput, outcomes, queue and node health, on one page.
    Report {
        /// How far back: 15m, 1h, 7d.
        #[arg(long, default_value = "1h")]
        since: String,
        /// The output file: .png or .svg.
        #[arg(long)]
        out: PathBuf,
        /// The store file (default: from --config, else the platform data dir; with the
        /// config's `store.url`, its PostgreSQL).
        #[arg(long)]
        db: Option<PathBuf>,
        #[arg(long)]
        config: Option<PathBuf>,
        /// Only this broker's requests (`store.broker`), in a fleet's store; default: every broker's.
        #[arg(long)]
        broker: Option<String>,
    },
    /// Which node has which model (loaded, in VRAM, or on disk); pull models onto nodes.
    Models {
        /// The broker's proxy URL.
        #[arg(long, global = true, env = "CORRAL_URL", default_value = "http://127.0.0.1:11400")]
        url: String,
        #[command(subcommand)]
        command: Option<ModelsCommand>,
    },
}

#[derive(clap::Args)]
pub struct BenchArgs {
    /// The endpoint under test (Corral, or an Ollama directly).
    #[arg(long)]
    pub url: String,
    /// Concurrency steps.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    pub concurrency: Vec<usize>,
    /// Requests per step.
    #[arg(long, default_value_t = 200)]
    pub requests: usize,
    /// Longest a step may run, in seconds.
    #[arg(long, default_value_t = 60)]
    pub max_seconds: u64,
    #[arg(long, default_value = "llama3.2")]
    pub model: String,
    /// Stream the answers (time to first token is measured either way).
    #[arg(long)]
    pub stream: bool,
    /// Prompt length in words.
    #[arg(long, default_value_t = 32)]
    pub prompt_words: usize,
    /// Tokens to generate per request.
    #[arg(long, default_value_t = 16)]
    pub num_predict: i64,
    /// A second endpoint, run interleaved (A B A B) for side-by-side ratios.
    #[arg(long)]
    pub vs: Option<String>,
    /// Write results.md and bench.png here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Exit 1 when more than this share of the requests failed (0 to 1; 0 = any failure).
    #[arg(long, default_value_t = 0.01, value_parser = share)]
    pub max_failed: f64,
}

fn share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a share between 0 and 1 (0.05 = 5 %)")),
    }
}

#[derive(clap::Args)]
pub struct HistoryArgs {
    /// How far back: 30s, 15m, 1h, 7d.
    #[arg(long, default_value = "1h")]
    pub since: String,
    #[arg(long)]
    pub node: Option<String>,
    #[arg(long)]
    pub category: Option<String>,
    /// ok, client_error, error, interrupted, cancelled, unknown, running.
    #[arg(long)]
    pub status: Option<String>,
    /// Only this broker's requests (`store.broker`), in a fleet's store; default: every broker's.
    #[arg(long)]
    pub broker: Option<String>,
    #[arg(long, default_value_t = 100)]
    pub limit: i64,
    #[arg(long, value_enum, default_value_t = super::history::Format::Table)]
    pub format: super::history::Format,
    /// The store file (default: from --config, else the platform data dir; with the config's
    /// `store.url`, its PostgreSQL: the requests of every broker in the fleet).
    #[arg(long)]
    pub db: Option<PathBuf>,
    #[arg(long)]
    pub config: Option<PathBuf>,
}

#[derive(Subcommand)]
pub enum SecretCommand {
    /// Store a secret; the value is read from standard input (not echoed on a terminal). A name
    /// the config's providers use becomes a provider key bound to their origins (scheme, host,
    /// port); a name a listener lists in `api_keys` becomes a client key.
    Set {
        name: String,
        /// Also bind the key to this provider origin (a URL); makes it a provider key.
        #[arg(long)]
        origin: Vec<String>,
        /// Store a client key (one a client of a remote listener presents).
        #[arg(long, conflicts_with = "origin")]
        client: bool,
        /// The config whose providers and listeners say what the key is for (default: the
        /// platform config file).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Confirm that a provider key may be sent to an origin (after its provider's base_url
    /// moved, or for a key stored before keys had origins).
    Bind {
        name: String,
        /// The provider URL (only its scheme, host and port count).
        #[arg(long)]
        origin: String,
    },
    /// Remove a secret.
    Delete { name: String },
    /// The names of the stored secrets (never values).
    List,
}

#[derive(Subcommand)]
pub enum ModelsCommand {
    /// Pull a model onto nodes, with a progress bar per node.
    Pull {
        name: String,
        /// Comma-separated node names (default: every available node).
        #[arg(long, value_delimiter = ',')]
        nodes: Vec<String>,
    },
}

#[derive(Subcommand)]
pub enum ConfigCommand {
    /// Validate a config file: exit 0, or 2 with every problem and its line.
    Check {
        file: PathBuf,
        /// Also print the effective config, defaults filled in.
        #[arg(long)]
        verbose: bool,
    },
    /// Write the config to share with a team (never secrets: providers only name them).
    Export {
        /// The config to export (default: the platform config file, else defaults).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Write here instead of standard output.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Bring a shared config into yours: shows what is added, changed, removed, then writes it.
    Import {
        file: PathBuf,
        /// Add and update nodes, categories and providers; keep the rest (the default).
        #[arg(long, conflicts_with = "replace")]
        merge: bool,
        /// Nodes, categories, providers and tuning become exactly the file's.
        #[arg(long)]
        replace: bool,
        /// Only show what would change.
        #[arg(long)]
        dry_run: bool,
        /// Apply trust changes (URLs, cloud permission, redaction, keys, where traffic goes):
        /// alone, every one listed; `=ID,ID` only those. Without it they are held back.
        #[arg(long, num_args = 0.., value_delimiter = ',', require_equals = true, value_name = "ID")]
        accept_trust_changes: Option<Vec<String>>,
        /// The config file to change (default: the platform config file).
        #[arg(long)]
        config: Option<PathBuf>,
    },
}
