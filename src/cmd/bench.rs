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
        if let Err(code) = write_out(dir, &steps, &url_a, url_b.as_deref(), &md) {
            return code;
        }
    }
    let errors: usize = steps.iter().map(|s| s.errors).sum();
    if errors > 0 {
        eprintln!("{errors} request(s) failed");
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
