//! `corral`: the command line. Parses arguments, sets up tracing, and hands over to the library.
//!
//! Exit codes: 0 ok, 1 runtime failure, 2 usage or validation error. Errors go to stderr as
//! one line that says what is wrong and what to do.

mod cmd;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use corral::config::Config;
use corral::sim::SimSpec;
use corral::{Broker, StartOptions};

#[derive(Parser)]
#[command(name = "corral", version, about = "One endpoint in front of a cluster of Ollama nodes")]
struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the broker headless until SIGINT/SIGTERM, then drain gracefully.
    Serve {
        /// Config file; default: corral.toml in the platform config dir, or built-in defaults.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Raise desktop notifications (node down/back, failover storm, cloud fallback, failed
        /// reloads) through the session's notification server.
        #[arg(long)]
        notify: bool,
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
    /// Request metadata from the store.
    History(HistoryArgs),
    /// Charts of latency, time to first token, throughput, outcomes, queue and node health, on one page.
    Report {
        /// How far back: 15m, 1h, 7d.
        #[arg(long, default_value = "1h")]
        since: String,
        /// The output file: .png or .svg.
        #[arg(long)]
        out: PathBuf,
        /// The store file (default: from --config, else the platform data dir).
        #[arg(long)]
        db: Option<PathBuf>,
        #[arg(long)]
        config: Option<PathBuf>,
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
struct BenchArgs {
    /// The endpoint under test (Corral, or an Ollama directly).
    #[arg(long)]
    url: String,
    /// Concurrency steps.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    concurrency: Vec<usize>,
    /// Requests per step.
    #[arg(long, default_value_t = 200)]
    requests: usize,
    /// Longest a step may run, in seconds.
    #[arg(long, default_value_t = 60)]
    max_seconds: u64,
    #[arg(long, default_value = "llama3.2")]
    model: String,
    /// Stream the answers (time to first token is measured either way).
    #[arg(long)]
    stream: bool,
    /// Prompt length in words.
    #[arg(long, default_value_t = 32)]
    prompt_words: usize,
    /// Tokens to generate per request.
    #[arg(long, default_value_t = 16)]
    num_predict: i64,
    /// A second endpoint, run interleaved (A B A B) for side-by-side ratios.
    #[arg(long)]
    vs: Option<String>,
    /// Write results.md and bench.png here.
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(clap::Args)]
struct HistoryArgs {
    /// How far back: 30s, 15m, 1h, 7d.
    #[arg(long, default_value = "1h")]
    since: String,
    #[arg(long)]
    node: Option<String>,
    #[arg(long)]
    category: Option<String>,
    /// ok, client_error, error, interrupted, cancelled, unknown, running.
    #[arg(long)]
    status: Option<String>,
    #[arg(long, default_value_t = 100)]
    limit: i64,
    #[arg(long, value_enum, default_value_t = cmd::history::Format::Table)]
    format: cmd::history::Format,
    /// The store file (default: from --config, else the platform data dir).
    #[arg(long)]
    db: Option<PathBuf>,
    #[arg(long)]
    config: Option<PathBuf>,
}

#[derive(Subcommand)]
enum SecretCommand {
    /// Store a secret; the value is read from standard input (not echoed on a terminal).
    Set { name: String },
    /// Remove a secret.
    Delete { name: String },
    /// The names of the stored secrets (never values).
    List,
}

#[derive(Subcommand)]
enum ModelsCommand {
    /// Pull a model onto nodes, with a progress bar per node.
    Pull {
        name: String,
        /// Comma-separated node names (default: every available node).
        #[arg(long, value_delimiter = ',')]
        nodes: Vec<String>,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
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
        /// The config file to change (default: the platform config file).
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(run(cli.command))
}

fn init_tracing(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("CORRAL_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn run(command: Command) -> ExitCode {
    match command {
        Command::Serve { config, notify } => serve(config.as_deref(), notify).await,
        Command::Demo { port, nodes, admin_port, db } => demo(port, nodes, admin_port, db).await,
        Command::Sim { port, nodes, models, tps, ttft_ms, parallel, max_queue, cloud, api_key, echo } => {
            let spec = SimSpec {
                models,
                tps,
                ttft: Duration::from_millis(ttft_ms),
                parallel,
                max_queue,
                cloud,
                api_key,
                echo,
                ..SimSpec::default()
            };
            sim(port, nodes, spec).await
        }
        Command::Config { command: ConfigCommand::Check { file, verbose } } => config_check(&file, verbose),
        Command::Config { command: ConfigCommand::Export { config, out } } => {
            config_export(config.as_deref(), out.as_deref())
        }
        Command::Config { command: ConfigCommand::Import { file, merge: _, replace, dry_run, config } } => {
            let mode = if replace { corral::config::ImportMode::Replace } else { corral::config::ImportMode::Merge };
            config_import(&file, mode, dry_run, config.as_deref())
        }
        Command::History(args) => history(args).await,
        Command::Secret { command } => secret(command),
        Command::Bench(args) => bench(args).await,
        Command::Report { since, out, db, config } => report(&since, &out, db, config.as_deref()).await,
        Command::Models { url, command: None } => cmd::models::list(url.trim_end_matches('/')).await,
        Command::Models { url, command: Some(ModelsCommand::Pull { name, nodes }) } => {
            cmd::models::pull(url.trim_end_matches('/'), &name, &nodes).await
        }
    }
}

/// The config file in the platform config dir (`~/.config/corral/corral.toml` on Linux).
fn default_config_path() -> Option<PathBuf> {
    corral::config::default_path()
}

/// The config, where it came from (for the log), and the file to watch if there is one.
fn load_config(path: Option<&Path>) -> Result<(Config, String, Option<PathBuf>), ExitCode> {
    let (path, explicit) = match path {
        Some(p) => (p.to_path_buf(), true),
        None => match default_config_path() {
            Some(p) => (p, false),
            None => return Ok((Config::default(), "built-in defaults".into(), None)),
        },
    };
    if !explicit && !path.exists() {
        return Ok((Config::default(), format!("built-in defaults (no {})", path.display()), None));
    }
    match Config::load(&path) {
        Ok(c) => Ok((c, path.display().to_string(), Some(path))),
        Err(e) => {
            eprintln!("error: {}: {e}", path.display());
            eprintln!("fix the problems above, or check the file with: corral config check {}", path.display());
            Err(ExitCode::from(2))
        }
    }
}

async fn serve(config: Option<&Path>, notify: bool) -> ExitCode {
    let (config, source, watch) = match load_config(config) {
        Ok(c) => c,
        Err(code) => return code,
    };
    tracing::info!(config = %source, nodes = config.nodes.len(), "starting broker");
    for (name, state) in secret_states(&config) {
        if state != "set" {
            tracing::warn!(secret = %name, state, "a provider's secret is not in the OS keyring; set it with `corral secret set {name}`");
        }
    }
    let options = StartOptions { config_path: watch, ..start_options() };
    let broker = match Broker::start(config, options).await {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(if matches!(e, corral::broker::StartError::Config(_)) { 2 } else { 1 });
        }
    };
    eprintln!("Corral is serving the Ollama API on http://{}", broker.proxy_addr());
    eprintln!("Admin API on http://{} (token: {})", broker.admin_addr(), broker.admin_token());
    eprintln!("Open the UI: http://{}/ui/#token={}", broker.admin_addr(), broker.admin_token());
    let stop_notices = tokio_util::sync::CancellationToken::new();
    if notify {
        let muted = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        tokio::spawn(corral::alerts::run(broker.shared().telemetry.subscribe(), muted, stop_notices.clone()));
        tracing::info!("desktop notifications on");
    }
    wait_for_signal().await;
    stop_notices.cancel();
    broker.shutdown().await;
    ExitCode::SUCCESS
}

async fn demo(port: u16, n: usize, admin_port: u16, db: Option<PathBuf>) -> ExitCode {
    let mut config = Config::default();
    config.listeners[0].addr = SocketAddr::from(([127, 0, 0, 1], port)).to_string();
    config.admin.addr = SocketAddr::from(([127, 0, 0, 1], admin_port)).to_string();
    let db = db.unwrap_or_else(|| corral::store::default_path(&config.store).with_file_name("corral-demo.db"));
    config.store.path = Some(db.display().to_string());
    let (sims, nodes) = match corral::sim::demo_nodes(n).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: cannot start the simulated nodes: {e}");
            return ExitCode::from(1);
        }
    };
    config.nodes = nodes;
    let cloud = match corral::sim::demo_cloud().await {
        Ok((cloud, provider, categories)) => {
            config.providers.push(provider);
            config.categories.extend(categories);
            cloud
        }
        Err(e) => {
            eprintln!("error: cannot start the simulated cloud: {e}");
            return ExitCode::from(1);
        }
    };
    let broker = match Broker::start(config, start_options()).await {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: {e}");
            eprintln!("hint: pick another port with: corral demo --port 11500");
            return ExitCode::from(1);
        }
    };
    let url = format!("http://{}", broker.proxy_addr());
    println!("Corral demo: {} simulated Ollama nodes behind one endpoint.", sims.len());
    for (node, sim) in broker.config().nodes.iter().zip(&sims) {
        println!("  node {:<6} {}  (simulated)", node.name, sim.url());
    }
    println!();
    println!("  Ollama API:  {url}");
    println!("  OpenAI API:  {url}/v1");
    println!("  Admin API:   http://{}  (Authorization: Bearer {})", broker.admin_addr(), broker.admin_token());
    println!("  UI:          http://{}/ui/#token={}", broker.admin_addr(), broker.admin_token());
    println!();
    println!("Try:");
    println!("  curl {url}/api/tags");
    println!("  curl {url}/api/chat -d '{{\"model\":\"llama3.2\",\"messages\":[{{\"role\":\"user\",\"content\":\"hello\"}}]}}'");
    println!("  OLLAMA_HOST={url} ollama run llama3.2   # with the ollama CLI, if you have it");
    println!();
    println!(
        "Cloud fallback: category `public` may fall back to a simulated cloud ({}), `private` never.",
        cloud.url()
    );
    println!("  for n in {}; do curl -s -X POST $n/_sim/down -d '{{\"for_ms\":20000}}'; done   # take every node down for 20 s",
        sims.iter().map(|s| s.url()).collect::<Vec<_>>().join(" "));
    println!("  curl -i -H 'X-Corral-Category: public' {url}/api/chat -d '{{\"model\":\"llama3.2\",\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}]}}'   # X-Corral-Fallback: cloud-sim");
    println!("  curl -i -H 'X-Corral-Category: private' {url}/api/chat -d '{{\"model\":\"llama3.2\",\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}]}}'  # 503 cloud_not_allowed");
    println!();
    println!("Press Ctrl-C to stop.");
    wait_for_signal().await;
    broker.shutdown().await;
    drop(sims);
    drop(cloud);
    ExitCode::SUCCESS
}

async fn sim(port: u16, n: usize, spec: SimSpec) -> ExitCode {
    let nodes = match corral::sim::start_many(n.max(1), port, &spec).await {
        Ok(nodes) => nodes,
        Err(e) => {
            eprintln!("error: cannot listen on 127.0.0.1:{port}: {e}; pick another --port");
            return ExitCode::from(1);
        }
    };
    for node in &nodes {
        println!("simulated Ollama node on {}", node.url());
    }
    wait_for_signal().await;
    ExitCode::SUCCESS
}

fn config_export(config: Option<&Path>, out: Option<&Path>) -> ExitCode {
    let (config, _, _) = match load_config(config) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let text = corral::config::export_text(&config);
    match out {
        None => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Some(path) => match std::fs::write(path, text) {
            Ok(()) => {
                eprintln!("wrote {}", path.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: cannot write {}: {e}", path.display());
                ExitCode::from(1)
            }
        },
    }
}

fn config_import(file: &Path, mode: corral::config::ImportMode, dry_run: bool, target: Option<&Path>) -> ExitCode {
    let incoming = match Config::load(file) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{}: {e}", file.display());
            eprintln!("nothing was changed");
            return ExitCode::from(2);
        }
    };
    let Some(target) = target.map(Path::to_path_buf).or_else(default_config_path) else {
        eprintln!("error: no platform config dir; pass --config FILE");
        return ExitCode::from(2);
    };
    let base = if target.exists() {
        match Config::load(&target) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("{}: {e}", target.display());
                eprintln!("fix your own config first; nothing was changed");
                return ExitCode::from(2);
            }
        }
    } else {
        Config::default()
    };
    let (next, changes) = corral::config::import(&base, &incoming, mode);
    let problems = next.validate();
    if !problems.is_empty() {
        eprintln!("the imported config would not be valid; nothing was changed:");
        for (path, msg) in problems {
            eprintln!("  {path}: {msg}");
        }
        return ExitCode::from(2);
    }
    if changes.is_empty() {
        println!("no changes: {} already has everything in {}", target.display(), file.display());
    }
    for c in &changes {
        println!("{c}");
    }
    let secrets = corral::config::secret_names(&next);
    if !secrets.is_empty() {
        println!("secrets this config needs (set each with `corral secret set NAME`): {}", secrets.join(", "));
    }
    if dry_run {
        println!("dry run: {} not changed", target.display());
        return ExitCode::SUCCESS;
    }
    // Write next to the target and rename over it, so a crash never leaves half a file.
    let tmp = target.with_extension("toml.tmp");
    let written = target
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|_| std::fs::write(&tmp, corral::config::export_text(&next)))
        .and_then(|_| std::fs::rename(&tmp, &target));
    match written {
        Ok(()) => {
            println!("wrote {} ({} change(s))", target.display(), changes.len());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: cannot write {}: {e}", target.display());
            ExitCode::from(1)
        }
    }
}

/// Each secret the config names, and whether the keyring has it ("set", "missing", or why not).
fn secret_states(config: &Config) -> Vec<(String, String)> {
    corral::config::secret_names(config)
        .into_iter()
        .map(|name| {
            let state = match corral::secrets::is_set(&name) {
                Ok(true) => "set".to_string(),
                Ok(false) => "missing".to_string(),
                Err(e) => format!("unknown ({})", e.code()),
            };
            (name, state)
        })
        .collect()
}

fn config_check(file: &Path, verbose: bool) -> ExitCode {
    match Config::load(file) {
        Ok(c) => {
            for (name, state) in secret_states(&c) {
                println!("secret {name}: {state}");
            }
            println!(
                "{}: ok ({} node(s), {} categor{})",
                file.display(),
                c.nodes.len(),
                c.categories.len(),
                if c.categories.len() == 1 { "y" } else { "ies" }
            );
            if verbose {
                println!("\n# effective config, defaults filled in\n{}", c.to_toml());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{}: {e}", file.display());
            ExitCode::from(2)
        }
    }
}

async fn bench(a: BenchArgs) -> ExitCode {
    if a.concurrency.is_empty() || a.concurrency.contains(&0) || a.requests == 0 {
        eprintln!("error: --concurrency needs positive numbers and --requests at least 1");
        return ExitCode::from(2);
    }
    let plan = corral::bench::Plan {
        concurrency: a.concurrency.clone(),
        requests: a.requests,
        max_duration: Duration::from_secs(a.max_seconds.max(1)),
        model: a.model.clone(),
        stream: a.stream,
        prompt_words: a.prompt_words,
        num_predict: a.num_predict,
        timeout: Duration::from_secs(a.max_seconds.max(1)),
    };
    let url_a = a.url.trim_end_matches('/').to_string();
    let url_b = a.vs.as_ref().map(|u| u.trim_end_matches('/').to_string());
    let rounds = if url_b.is_some() { 2 } else { 1 };
    let total = (a.requests.div_ceil(rounds) * rounds * plan.concurrency.len() * rounds) as u64;
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg:>24} [{bar:40}] {pos}/{len} {per_sec}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let tick = bar.clone();
    let on_done: std::sync::Arc<dyn Fn() + Send + Sync> = std::sync::Arc::new(move || tick.inc(1));
    let label = bar.clone();
    let on_step = move |target: &str, c: usize| label.set_message(format!("{target} c={c}"));
    let steps = corral::bench::run(&plan, ("A", &url_a), url_b.as_deref().map(|u| ("B", u)), on_done, &on_step).await;
    bar.finish_and_clear();
    println!("A = {url_a}");
    if let Some(b) = &url_b {
        println!("B = {b}");
    }
    println!(
        "{} requests per step, {} prompt words, num_predict {}, {}\n",
        a.requests,
        a.prompt_words,
        a.num_predict,
        if a.stream { "streamed" } else { "not streamed" }
    );
    let md = corral::bench::markdown(&steps);
    println!("{md}");
    if let Some(dir) = &a.out {
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!("error: cannot create {}: {e}", dir.display());
            return ExitCode::from(1);
        }
        let header = format!(
            "# corral bench\n\nA = {url_a}\n{}\n\n",
            url_b.as_ref().map(|b| format!("B = {b}\n")).unwrap_or_default()
        );
        if let Err(e) = std::fs::write(dir.join("results.md"), header + &md) {
            eprintln!("error: cannot write results.md: {e}");
            return ExitCode::from(1);
        }
        if let Err(e) = corral::bench::chart_png(&steps, &dir.join("bench.png")) {
            eprintln!("error: cannot draw bench.png: {e}");
            return ExitCode::from(1);
        }
        println!("wrote {}/results.md and bench.png", dir.display());
    }
    let errors: usize = steps.iter().map(|s| s.errors).sum();
    if errors > 0 {
        eprintln!("{errors} request(s) failed");
    }
    ExitCode::SUCCESS
}

fn secret(command: SecretCommand) -> ExitCode {
    use std::io::IsTerminal;
    let result = match command {
        SecretCommand::Set { name } => {
            let value = if std::io::stdin().is_terminal() {
                eprint!("value for {name} (not shown): ");
                rpassword::read_password().map_err(|e| e.to_string())
            } else {
                let mut v = String::new();
                std::io::Read::read_to_string(&mut std::io::stdin(), &mut v).map(|_| v).map_err(|e| e.to_string())
            };
            match value {
                Err(e) => {
                    eprintln!("error: cannot read the value: {e}");
                    return ExitCode::from(1);
                }
                Ok(v) => {
                    // A trailing newline from `echo` or a terminal is not part of a key.
                    let v = v.trim_end_matches(['\r', '\n']);
                    corral::secrets::set(&name, v).map(|()| format!("stored {name}"))
                }
            }
        }
        SecretCommand::Delete { name } => corral::secrets::delete(&name).map(|()| format!("deleted {name}")),
        SecretCommand::List => corral::secrets::list().map(|names| names.join("\n")),
    };
    match result {
        Ok(text) => {
            if !text.is_empty() {
                println!("{text}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(match e {
                corral::secrets::SecretError::BadName(_) | corral::secrets::SecretError::Empty => 2,
                _ => 1,
            })
        }
    }
}

fn store_path(db: Option<PathBuf>, config: Option<&Path>) -> Result<PathBuf, ExitCode> {
    match db {
        Some(db) => Ok(db),
        None => load_config(config).map(|(c, _, _)| corral::store::default_path(&c.store)),
    }
}

async fn report(since: &str, out: &Path, db: Option<PathBuf>, config: Option<&Path>) -> ExitCode {
    let Some(from) = corral::admin::parse_since(since) else {
        eprintln!("error: --since {since} is not like 15m, 1h or 7d");
        return ExitCode::from(2);
    };
    let ext = out.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    if !matches!(ext.as_deref(), Some("png" | "svg")) {
        eprintln!("error: --out must end in .png or .svg");
        return ExitCode::from(2);
    }
    let db = match store_path(db, config) {
        Ok(p) => p,
        Err(code) => return code,
    };
    if !db.exists() {
        eprintln!("error: no request store at {}; has `corral serve` run? (or pass --db FILE)", db.display());
        return ExitCode::from(1);
    }
    let result = async {
        let pool = corral::store::open_pool(&db, true).await.map_err(|e| e.to_string())?;
        let q = corral::store::Query { since_ms: Some(from), limit: Some(1_000_000), ..Default::default() };
        let rows = corral::store::query_requests(&pool, &q).await.map_err(|e| e.to_string())?;
        let events = corral::store::query_node_events(&pool, from).await.map_err(|e| e.to_string())?;
        let snap = corral::charts::Snapshot::build(&rows, &events, from, corral::store::now_ms(), 60);
        corral::charts::report(&snap, out).map_err(|e| e.to_string())?;
        Ok::<usize, String>(rows.len())
    }
    .await;
    match result {
        Ok(n) => {
            println!("wrote {} ({n} requests since {since})", out.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

async fn history(a: HistoryArgs) -> ExitCode {
    let Some(since_ms) = corral::admin::parse_since(&a.since) else {
        eprintln!("error: --since {} is not like 30s, 15m, 1h or 7d", a.since);
        return ExitCode::from(2);
    };
    let db = match store_path(a.db, a.config.as_deref()) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let query = corral::store::Query {
        since_ms: Some(since_ms),
        node: a.node,
        category: a.category,
        status: a.status,
        limit: Some(a.limit),
    };
    cmd::history::run(&db, query, a.format).await
}

/// The admin token from `CORRAL_ADMIN_TOKEN`, else one generated for this run.
fn start_options() -> StartOptions {
    StartOptions {
        admin_token: std::env::var("CORRAL_ADMIN_TOKEN").ok().filter(|t| !t.is_empty()),
        ..StartOptions::default()
    }
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
