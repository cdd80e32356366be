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
///
/// Called through its plain entry points wherever the alignment allows: the `mimalloc` crate's
/// allocator asks for every block with `mi_malloc_aligned`, whose generic path (any block over
/// 1 KiB, or a free block that happens to sit off the alignment) cost about three plain
/// allocations; all allocation was 7,600 of a proxied request's 235,000 instructions under
/// callgrind (issue 16). Every mimalloc block is aligned to a machine word at least (its size
/// classes are whole words), so Rust's alignments up to that need nothing more, as std's own
/// `System` allocator reasons for glibc.
#[global_allocator]
static ALLOCATOR: Mimalloc = Mimalloc;

struct Mimalloc;

/// The alignment every mimalloc block has (`MI_INTPTR_SIZE`).
const MI_BLOCK_ALIGN: usize = std::mem::size_of::<usize>();

// SAFETY: mimalloc's entry points return blocks of at least the size asked for (or null),
// aligned to `MI_BLOCK_ALIGN` and, through the `_aligned` ones, to any larger power of two;
// every block is freed by `mi_free` and resized by `mi_realloc*`, whichever call made it.
unsafe impl std::alloc::GlobalAlloc for Mimalloc {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        use libmimalloc_sys::{mi_malloc, mi_malloc_aligned};
        // SAFETY: a non-zero size (GlobalAlloc's contract) and a power-of-two alignment.
        unsafe {
            match layout.align() <= MI_BLOCK_ALIGN {
                true => mi_malloc(layout.size()),
                false => mi_malloc_aligned(layout.size(), layout.align()),
            }
        }
        .cast()
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        use libmimalloc_sys::{mi_zalloc, mi_zalloc_aligned};
        // SAFETY: as `alloc`.
        unsafe {
            match layout.align() <= MI_BLOCK_ALIGN {
                true => mi_zalloc(layout.size()),
                false => mi_zalloc_aligned(layout.size(), layout.align()),
            }
        }
        .cast()
    }

    unsafe fn dealloc(&self, ptr: *mut u8, _layout: std::alloc::Layout) {
        // SAFETY: `ptr` came from this allocator, so from mimalloc.
        unsafe { libmimalloc_sys::mi_free(ptr.cast()) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        use libmimalloc_sys::{mi_realloc, mi_realloc_aligned};
        // SAFETY: `ptr` came from this allocator with `layout`; `new_size` is non-zero.
        unsafe {
            match layout.align() <= MI_BLOCK_ALIGN {
                true => mi_realloc(ptr.cast(), new_size),
                false => mi_realloc_aligned(ptr.cast(), new_size, layout.align()),
            }
        }
        .cast()
    }
}

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
    // mimalloc keeps freed pages until its next call; the broker asks it to give them back
    // once quiet (`corral::memory`).
    // SAFETY: mi_collect only walks mimalloc's own heap of the calling thread.
    corral::memory::set_collector(|| unsafe { libmimalloc_sys::mi_collect(true) });
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
///
/// Where that is one worker, the runtime is tokio's single-threaded one on the main thread:
/// no work-stealing queues, no cross-thread wake-ups. Measured side by side (oha, c=16, two
/// fake nodes, 3 interleaved rounds): CPU per proxied chat 63.0 against 57.3 us, per stream
/// 73.0 against 61.0 us. Blocking work (keyring, large request bodies, files) goes to the
/// blocking pool either way.
fn runtime_builder() -> tokio::runtime::Builder {
    let workers = match std::env::var("TOKIO_WORKER_THREADS").ok().and_then(|n| n.parse::<usize>().ok()) {
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, std::num::NonZero::get).div_ceil(2),
    };
    if workers <= 1 {
        return tokio::runtime::Builder::new_current_thread();
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.worker_threads(workers);
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

#[cfg(test)]
mod tests {
    use std::alloc::{alloc, alloc_zeroed, dealloc, realloc, Layout};

    /// Blocks from the binary's allocator (this test binary has it too) are aligned as asked,
    /// zeroed when asked, and keep their bytes when resized, for the plain and the aligned
    /// entry points and sizes on both sides of mimalloc's small-block limit.
    #[test]
    fn blocks_are_aligned_zeroed_and_kept_as_asked() {
        for align in [1, 2, 4, 8, 16, 32, 64, 128, 4096] {
            for size in [1, 7, 8, 9, 24, 40, 100, 1023, 1025, 4096, 70_000] {
                let layout = Layout::from_size_align(size, align).expect("layout");
                // SAFETY: non-zero sizes; each block is freed once with the layout it has.
                unsafe {
                    let zeroed = alloc_zeroed(layout);
                    assert!(!zeroed.is_null() && zeroed as usize % align == 0, "{size}/{align}");
                    assert!(std::slice::from_raw_parts(zeroed, size).iter().all(|&b| b == 0), "{size}/{align}");
                    dealloc(zeroed, layout);
                    let p = alloc(layout);
                    assert!(!p.is_null() && p as usize % align == 0, "{size}/{align}");
                    for i in 0..size {
                        p.add(i).write(i as u8);
                    }
                    let kept = |q: *mut u8, n: usize| (0..n).all(|i| q.add(i).read() == i as u8);
                    let grown = realloc(p, layout, size * 3);
                    assert!(!grown.is_null() && grown as usize % align == 0 && kept(grown, size), "{size} up/{align}");
                    let grown_layout = Layout::from_size_align(size * 3, align).expect("layout");
                    let shrunk = realloc(grown, grown_layout, size.div_ceil(2));
                    let half = size.div_ceil(2);
                    assert!(
                        !shrunk.is_null() && shrunk as usize % align == 0 && kept(shrunk, half),
                        "{size} down/{align}"
                    );
                    dealloc(shrunk, Layout::from_size_align(half, align).expect("layout"));
                }
            }
        }
    }
}
