//! `corral bench`: load test an Ollama-API endpoint (Corral, or an Ollama directly) in steps of
//! concurrency, with a progress bar; prints requests/s, tokens/s, latency percentiles and errors
//! as Markdown, side by side with `--vs`, and with `--out DIR` writes results.md and bench.png.
//! The measuring is `corral::bench`; this only drives it and shows the result.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use super::args::BenchArgs;

pub async fn run(a: BenchArgs) -> ExitCode {
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
    for url in std::iter::once(&url_a).chain(url_b.as_ref()) {
        if let Err(why) = reachable(url).await {
            eprintln!("error: {why}\nIs Corral (`corral serve`, `corral demo`) or an Ollama running there?");
            // A runtime failure (CONTRACT.md: 1), not a usage error: the URL was well formed.
            return ExitCode::from(1);
        }
    }
    let rounds = if url_b.is_some() { 2 } else { 1 };
    let total = (a.requests.div_ceil(rounds) * rounds * plan.concurrency.len() * rounds) as u64;
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg:>24} [{bar:40}] {pos}/{len} {rate} ETA {eta}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            // The recent rate, whole requests per second (not a cumulative 4-decimal figure).
            .with_key("rate", |s: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = write!(w, "{:.0} req/s", s.per_sec());
            })
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
        if let Err(code) = write_out(dir, &steps, &url_a, url_b.as_deref(), &md) {
            return code;
        }
    }
    verdict(&steps, a.max_failed)
}

/// Whether the endpoint answers at all, before any load: a wrong port reads as "connection
/// refused at URL", not as a table of 100 % errors.
async fn reachable(url: &str) -> Result<(), String> {
    let client = reqwest::Client::new();
    // `/`: Ollama and Corral answer it ("Ollama is running"), and Corral does not record it.
    let probe = client.get(format!("{url}/"));
    match corral::upstream::probe::exchange(probe, Duration::from_secs(5)).await {
        Ok(()) => Ok(()),
        // It answers, just not that route (a bare OpenAI-compatible server): load can go on.
        Err(corral::upstream::probe::ProbeError::Status { .. }) => Ok(()),
        Err(e) => Err(e.at(url)),
    }
}

/// Exit 1 when more than `max_failed` of all requests failed, saying how many.
fn verdict(steps: &[corral::bench::Step], max_failed: f64) -> ExitCode {
    let errors: usize = steps.iter().map(|s| s.errors).sum();
    let sent: usize = steps.iter().map(|s| s.requests).sum();
    if errors == 0 {
        return ExitCode::SUCCESS;
    }
    let share = errors as f64 / sent.max(1) as f64;
    eprintln!("{errors} of {sent} request(s) failed ({:.1} %)", share * 100.0);
    if share > max_failed {
        eprintln!("error: more than --max-failed {:.1} % failed", max_failed * 100.0);
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}

/// `--out DIR`: results.md (the table under a header naming the endpoints) and bench.png.
fn write_out(
    dir: &Path,
    steps: &[corral::bench::Step],
    url_a: &str,
    url_b: Option<&str>,
    md: &str,
) -> Result<(), ExitCode> {
    if let Err(e) = std::fs::create_dir_all(dir) {
        eprintln!("error: cannot create {}: {e}", dir.display());
        return Err(ExitCode::from(1));
    }
    let header =
        format!("# corral bench\n\nA = {url_a}\n{}\n\n", url_b.map(|b| format!("B = {b}\n")).unwrap_or_default());
    if let Err(e) = std::fs::write(dir.join("results.md"), header + md) {
        eprintln!("error: cannot write results.md: {e}");
        return Err(ExitCode::from(1));
    }
    if let Err(e) = corral::bench::chart_png(steps, &dir.join("bench.png")) {
        eprintln!("error: cannot draw bench.png: {e}");
        return Err(ExitCode::from(1));
    }
    println!("wrote {}/results.md and bench.png", dir.display());
    Ok(())
}
