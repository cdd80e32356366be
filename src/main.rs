//! `corral`: the command line. Parses arguments, sets up tracing, and dispatches to the
//! command's module in `cmd/`, which hands over to the library.
//!
//! Exit codes: 0 ok, 1 runtime failure, 2 usage or validation error. Errors go to stderr as
//! one line that says what is wrong and what to do.

mod cmd;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use cmd::args::{Cli, Command, ConfigCommand, LogFormat, ModelsCommand};
use corral::config::ImportMode;
use corral::sim::SimSpec;

/// mimalloc rather than glibc's malloc: a request makes many small short-lived allocations
/// (headers, body chunks, the record), and glibc's malloc/free/consolidate were about a sixth
/// of the request path's CPU in `perf` (issue 16); mimalloc's thread-local free lists make them
/// cheap. Built without transparent huge pages (`no_thp`): with them its arenas were backed by
/// 2 MiB pages, and RSS rose by a third (tests/flood.rs: 5,000 idle connections 61 -> 137 MiB
/// and a 303 MiB peak with four 30 MiB bodies; without them 44 -> 90 and 214, as glibc's).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Held to the end of main: dropping it flushes the log lines still queued.
    let _log_flush = init_tracing(cli.log_format);
    let runtime = match runtime_builder().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(run(cli.command))
}

/// Log lines go to stderr through a writer thread (`corral::log_writer`), so a request never
/// waits on a slow terminal or pipe (issue 16: the summary line per request). `None` when the
/// thread cannot start: lines then go straight to stderr.
fn init_tracing(format: LogFormat) -> Option<corral::log_writer::Flush> {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("CORRAL_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    // Colour only for a person at a terminal: a log file or a pipe gets plain text (and
    // NO_COLOR, https://no-color.org, turns it off anywhere).
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr()) && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_timer(corral::log_format::Clock)
        .fmt_fields(corral::log_format::Fields);
    let (writer, flush) = match corral::log_writer::LogWriter::spawn(std::io::stderr()) {
        Ok((w, f)) => (tracing_subscriber::fmt::writer::BoxMakeWriter::new(w), Some(f)),
        Err(e) => {
            eprintln!("warning: cannot start the log thread ({e}); logging to stderr directly");
            (tracing_subscriber::fmt::writer::BoxMakeWriter::new(std::io::stderr), None)
        }
    };
    let builder = builder.with_writer(writer);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    flush
}

/// The async runtime: a worker thread per two cores unless `TOKIO_WORKER_THREADS` says how
/// many. Workers beyond what the traffic needs cost more than they give: each request's tasks
/// are woken across threads and its memory freed on another thread's heap. Measured
/// side by side on two cores under wrk (issue 16), one worker against two: CPU per proxied
/// chat 82 against 109 us, 13.0k against 11.9k requests a second. One worker still serves
/// thousands of requests a second; an LLM cluster's nodes take tens at a time.
fn runtime_builder() -> tokio::runtime::Builder {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if std::env::var_os("TOKIO_WORKER_THREADS").is_none() {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        builder.worker_threads(cores.div_ceil(2));
    }
    builder
}

async fn run(command: Command) -> ExitCode {
    match command {
        Command::Serve { config, notify, listen, admin } => {
            cmd::serve::run(config.as_deref(), notify, listen.as_deref(), admin.as_deref()).await
        }
        Command::Status { url } => cmd::status::run(&url).await,
        Command::Drill { category, node, requests, fault, url } => {
            let args = cmd::drill::DrillArgs {
                url: &url,
                node: node.as_deref(),
                category: category.as_deref(),
                requests: Some(usize::from(requests)),
                fault,
            };
            cmd::drill::run(args).await
        }
        Command::Completions { shell } => cmd::status::completions(shell),
        Command::Man { out_dir } => cmd::man::run(out_dir.as_deref()),
        Command::Demo { port, nodes, admin_port, db } => cmd::demo::run(port, nodes, admin_port, db).await,
        Command::Sim { port, nodes, models, tps, ttft_ms, load_ms, parallel, max_queue, cloud, api_key, echo } => {
            let spec = SimSpec {
                models,
                tps,
                ttft: Duration::from_millis(ttft_ms),
                load_ms,
                parallel,
                max_queue,
                cloud,
                api_key,
                echo,
                ..SimSpec::default()
            };
            cmd::sim::run(port, nodes, spec).await
        }
        Command::Config { command: ConfigCommand::Check { file, verbose } } => cmd::config::check(&file, verbose),
        Command::Config { command: ConfigCommand::Export { config, out } } => {
            cmd::config::export(config.as_deref(), out.as_deref())
        }
        Command::Config {
            command: ConfigCommand::Import { file, merge: _, replace, dry_run, config, accept_trust_changes },
        } => {
            let mode = if replace { ImportMode::Replace } else { ImportMode::Merge };
            let accept = match accept_trust_changes {
                Some(ids) if ids.is_empty() => corral::config::Accept::All,
                Some(ids) => corral::config::Accept::Ids(ids.into_iter().collect()),
                None => corral::config::Accept::none(),
            };
            cmd::config::import(&file, mode, dry_run, config.as_deref(), &accept)
        }
        Command::History(args) => cmd::history::run(args).await,
        Command::Secret { command } => cmd::secret::run(command),
        Command::Bench(args) => cmd::bench::run(args).await,
        Command::Report { since, out, db, config, broker } => {
            cmd::report::run(&since, &out, cmd::report::Source { db, config, broker }).await
        }
        Command::Models { url, command: None } => cmd::models::list(url.trim_end_matches('/')).await,
        Command::Models { url, command: Some(ModelsCommand::Pull { name, nodes }) } => {
            cmd::models::pull(url.trim_end_matches('/'), &name, &nodes).await
        }
    }
}
