//! `corral bench`: a load generator for Ollama-API endpoints.
//!
//! A plan is a concurrency sweep; each step sends a fixed number of requests (or runs for a
//! fixed time, whichever ends first; both are always bounded) with that many workers, streamed
//! or not, with a prompt of a chosen size. Per step it reports requests/s, tokens/s,
//! p50/p95/p99 latency and time to first token, and the error rate. With a second target the
//! same load runs interleaved, A B A B, so both see the same machine conditions, and the
//! report gives the ratios: comparisons are always side by side, never against a remembered
//! number.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use futures_util::StreamExt;
use serde::Serialize;
use serde_json::{json, Value};

#[derive(Debug, Clone)]
pub struct Plan {
    pub concurrency: Vec<usize>,
    /// Requests per step (split over rounds when comparing).
    pub requests: usize,
    /// Upper bound on a step's time.
    pub max_duration: Duration,
    pub model: String,
    pub stream: bool,
    /// Prompt size in words (about one token each).
    pub prompt_words: usize,
    pub num_predict: i64,
    /// Per-request timeout.
    pub timeout: Duration,
}

/// One request's measurements.
#[derive(Debug, Clone, Copy)]
struct Sample {
    ok: bool,
    latency: Duration,
    ttft: Duration,
    tokens: u64,
}

/// One step's results for one target.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Step {
    pub target: String,
    pub concurrency: usize,
    pub requests: usize,
    pub errors: usize,
    pub elapsed_s: f64,
    pub rps: f64,
    pub tokens_per_s: f64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p95_ms: f64,
    pub error_rate: f64,
}

use crate::charts::percentile as pct;

impl Step {
    fn from_samples(target: &str, concurrency: usize, samples: &[Sample], elapsed: Duration) -> Step {
        let ok: Vec<&Sample> = samples.iter().filter(|s| s.ok).collect();
        let mut lat: Vec<f64> = ok.iter().map(|s| s.latency.as_secs_f64() * 1000.0).collect();
        let mut ttft: Vec<f64> = ok.iter().map(|s| s.ttft.as_secs_f64() * 1000.0).collect();
        lat.sort_by(f64::total_cmp);
        ttft.sort_by(f64::total_cmp);
        let secs = elapsed.as_secs_f64().max(1e-9);
        let errors = samples.len() - ok.len();
        Step {
            target: target.to_string(),
            concurrency,
            requests: samples.len(),
            errors,
            elapsed_s: secs,
            rps: ok.len() as f64 / secs,
            tokens_per_s: ok.iter().map(|s| s.tokens).sum::<u64>() as f64 / secs,
            p50_ms: pct(&lat, 50.0),
            p95_ms: pct(&lat, 95.0),
            p99_ms: pct(&lat, 99.0),
            ttft_p50_ms: pct(&ttft, 50.0),
            ttft_p95_ms: pct(&ttft, 95.0),
            error_rate: if samples.is_empty() { 0.0 } else { errors as f64 / samples.len() as f64 },
        }
    }

    /// Merge rounds of the same target and concurrency.
    fn merge(parts: &[Step]) -> Option<Step> {
        let first = parts.first()?;
        let total: usize = parts.iter().map(|p| p.requests).sum();
        let w = |f: fn(&Step) -> f64| parts.iter().map(|p| f(p) * p.requests as f64).sum::<f64>() / total.max(1) as f64;
        let elapsed: f64 = parts.iter().map(|p| p.elapsed_s).sum();
        let ok: f64 = parts.iter().map(|p| p.rps * p.elapsed_s).sum();
        let tokens: f64 = parts.iter().map(|p| p.tokens_per_s * p.elapsed_s).sum();
        let errors: usize = parts.iter().map(|p| p.errors).sum();
        Some(Step {
            target: first.target.clone(),
            concurrency: first.concurrency,
            requests: total,
            errors,
            elapsed_s: elapsed,
            rps: ok / elapsed.max(1e-9),
            tokens_per_s: tokens / elapsed.max(1e-9),
            p50_ms: w(|s| s.p50_ms),
            p95_ms: w(|s| s.p95_ms),
            p99_ms: w(|s| s.p99_ms),
            ttft_p50_ms: w(|s| s.ttft_p50_ms),
            ttft_p95_ms: w(|s| s.ttft_p95_ms),
            error_rate: if total == 0 { 0.0 } else { errors as f64 / total as f64 },
        })
    }
}

fn prompt(words: usize) -> String {
    const W: &[&str] = &["please", "summarize", "the", "state", "of", "our", "cluster", "today"];
    (0..words.max(1)).map(|i| W[i % W.len()]).collect::<Vec<_>>().join(" ")
}

async fn one(client: &reqwest::Client, url: &str, plan: &Plan, seed: usize) -> Sample {
    let body = json!({
        "model": plan.model,
        "prompt": prompt(plan.prompt_words),
        "stream": plan.stream,
        "options": {"num_predict": plan.num_predict, "seed": seed},
    });
    let start = Instant::now();
    let fail = |start: Instant| Sample { ok: false, latency: start.elapsed(), ttft: start.elapsed(), tokens: 0 };
    let work = async {
        let resp = client.post(format!("{url}/api/generate")).json(&body).send().await.ok()?;
        if !resp.status().is_success() {
            return None;
        }
        let mut stream = resp.bytes_stream();
        let mut ttft = None;
        let mut tail = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.ok()?;
            if ttft.is_none() && !chunk.is_empty() {
                ttft = Some(start.elapsed());
            }
            tail.extend_from_slice(&chunk);
            if tail.len() > 64 * 1024 {
                tail.drain(..tail.len() - 16 * 1024);
            }
        }
        let last = tail.split(|b| *b == b'\n').rfind(|l| !l.is_empty())?;
        let v: Value = serde_json::from_slice(last).ok()?;
        if v.get("error").is_some() || v.get("done") != Some(&Value::Bool(true)) {
            return None;
        }
        Some(Sample {
            ok: true,
            latency: start.elapsed(),
            ttft: ttft.unwrap_or_else(|| start.elapsed()),
            tokens: v["eval_count"].as_u64().unwrap_or(0),
        })
    };
    match tokio::time::timeout(plan.timeout, work).await {
        Ok(Some(s)) => s,
        _ => fail(start),
    }
}

/// Run `requests` requests against `url` with `concurrency` workers, bounded by `max_duration`.
/// `on_done` is called after each request (for a progress bar).
pub async fn run_step(
    client: &reqwest::Client,
    target: &str,
    url: &str,
    plan: &Plan,
    concurrency: usize,
    requests: usize,
    on_done: Arc<dyn Fn() + Send + Sync>,
) -> Step {
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let deadline = start + plan.max_duration;
    let workers = (0..concurrency.max(1)).map(|_| {
        let (client, url, plan, next, on_done) =
            (client.clone(), url.to_string(), plan.clone(), Arc::clone(&next), Arc::clone(&on_done));
        async move {
            let mut samples = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= requests || Instant::now() >= deadline {
                    break;
                }
                samples.push(one(&client, &url, &plan, i).await);
                on_done();
            }
            samples
        }
    });
    let samples: Vec<Sample> = futures_util::future::join_all(workers).await.into_iter().flatten().collect();
    Step::from_samples(target, concurrency, &samples, start.elapsed())
}

/// Run the plan against `a`, and interleaved against `b` when given. Returns merged steps,
/// A's first then B's for each concurrency.
pub async fn run(
    plan: &Plan,
    a: (&str, &str),
    b: Option<(&str, &str)>,
    on_done: Arc<dyn Fn() + Send + Sync>,
    on_step: &(dyn Fn(&str, usize) + Send + Sync),
) -> Vec<Step> {
    let client = reqwest::Client::builder().pool_max_idle_per_host(256).tcp_nodelay(true).build().unwrap_or_default();
    let rounds = if b.is_some() { 2 } else { 1 };
    let mut out = Vec::new();
    for &c in &plan.concurrency {
        let per_round = plan.requests.div_ceil(rounds);
        let (mut parts_a, mut parts_b) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            on_step(a.0, c);
            parts_a.push(run_step(&client, a.0, a.1, plan, c, per_round, Arc::clone(&on_done)).await);
            if let Some((name, url)) = b {
                on_step(name, c);
                parts_b.push(run_step(&client, name, url, plan, c, per_round, Arc::clone(&on_done)).await);
            }
        }
        out.extend(Step::merge(&parts_a));
        out.extend(Step::merge(&parts_b));
    }
    out
}

/// A markdown table of the steps; with two targets, also A/B ratios per concurrency. Columns
/// are padded, so the table reads in a terminal as well as rendered.
pub fn markdown(steps: &[Step]) -> String {
    let head = [
        "target",
        "concurrency",
        "requests",
        "errors",
        "req/s",
        "tokens/s",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "TTFT p50 ms",
        "TTFT p95 ms",
    ];
    let rows: Vec<Vec<String>> = steps
        .iter()
        .map(|t| {
            let ms = |v: f64| format!("{v:.1}");
            vec![
                t.target.clone(),
                t.concurrency.to_string(),
                t.requests.to_string(),
                t.errors.to_string(),
                format!("{:.1}", t.rps),
                format!("{:.1}", t.tokens_per_s),
                ms(t.p50_ms),
                ms(t.p95_ms),
                ms(t.p99_ms),
                ms(t.ttft_p50_ms),
                ms(t.ttft_p95_ms),
            ]
        })
        .collect();
    let mut s = table(&head, &rows, 1);
    if let Some((a, b)) = two_targets(steps) {
        s += &format!("\nRatios {a} / {b} (req/s above 1 and latency below 1 favour {a}):\n\n");
        let r = |x: f64, y: f64| if y > 0.0 { format!("{:.2}", x / y) } else { "-".into() };
        let rows: Vec<Vec<String>> = steps
            .iter()
            .filter(|t| t.target == a)
            .filter_map(|ta| {
                let tb = steps.iter().find(|t| t.target == b && t.concurrency == ta.concurrency)?;
                Some(vec![
                    ta.concurrency.to_string(),
                    r(ta.rps, tb.rps),
                    r(ta.p50_ms, tb.p50_ms),
                    r(ta.p95_ms, tb.p95_ms),
                    r(ta.ttft_p50_ms, tb.ttft_p50_ms),
                ])
            })
            .collect();
        s += &table(&["concurrency", "req/s", "p50 latency", "p95 latency", "TTFT p50"], &rows, 0);
    }
    s
}

/// The first target and the other one, when the steps have exactly two.
fn two_targets(steps: &[Step]) -> Option<(String, String)> {
    let mut names: Vec<&str> = steps.iter().map(|t| t.target.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    let a = steps.first()?.target.clone();
    let b = names.iter().find(|t| **t != a)?.to_string();
    (names.len() == 2).then_some((a, b))
}

/// A markdown table with every column padded to its widest cell; the first `left` columns
/// are left-aligned (names), the rest right-aligned (numbers).
fn table(head: &[&str], rows: &[Vec<String>], left: usize) -> String {
    let width = |i: usize| rows.iter().map(|r| r[i].chars().count()).chain([head[i].len()]).max().unwrap_or(0);
    let widths: Vec<usize> = (0..head.len()).map(width).collect();
    let cell = |i: usize, v: &str| {
        if i < left {
            format!("{v:<w$}", w = widths[i])
        } else {
            format!("{v:>w$}", w = widths[i])
        }
    };
    let line = |cells: Vec<String>| format!("| {} |\n", cells.join(" | "));
    let mut s = line(head.iter().enumerate().map(|(i, h)| cell(i, h)).collect());
    let rule: Vec<String> = widths
        .iter()
        .enumerate()
        .map(|(i, w)| if i < left { "-".repeat(*w) } else { format!("{}:", "-".repeat(w.saturating_sub(1))) })
        .collect();
    s += &line(rule);
    for r in rows {
        s += &line(r.iter().enumerate().map(|(i, v)| cell(i, v)).collect());
    }
    s
}

/// Requests/s and p50 latency against concurrency, one line per target, as a PNG.
pub fn chart_png(steps: &[Step], path: &std::path::Path) -> Result<(), String> {
    use plotters::prelude::*;
    crate::charts::ensure_font();
    let root = BitMapBackend::new(path, (1100, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (left, right) = root.split_horizontally(550);
    let mut targets: Vec<String> = steps.iter().map(|s| s.target.clone()).collect();
    targets.dedup();
    targets.sort();
    targets.dedup();
    let mut levels: Vec<usize> = steps.iter().map(|s| s.concurrency).collect();
    levels.sort_unstable();
    levels.dedup();
    let slot = |c: usize| SegmentValue::CenterOf(levels.iter().position(|l| *l == c).unwrap_or(0) as i32);
    for (area, title, get) in [
        (&left, "Requests per second", (|s: &Step| s.rps) as fn(&Step) -> f64),
        (&right, "Latency p50 (ms)", |s: &Step| s.p50_ms),
    ] {
        let max_y = steps.iter().map(get).fold(0.0, f64::max).max(1.0) * 1.1;
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(55)
            .build_cartesian_2d((0..levels.len() as i32).into_segmented(), 0.0..max_y)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_desc("concurrency")
            .x_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) => levels.get(*i as usize).map(|c| c.to_string()).unwrap_or_default(),
                _ => String::new(),
            })
            .label_style(("sans-serif", 12))
            .draw()
            .map_err(|e| e.to_string())?;
        for (i, t) in targets.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let pts: Vec<(SegmentValue<i32>, f64)> =
                steps.iter().filter(|s| &s.target == t).map(|s| (slot(s.concurrency), get(s))).collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                .map_err(|e| e.to_string())?
                .label(t.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], color.stroke_width(2)));
            chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 4, color.filled()))).map_err(|e| e.to_string())?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK.mix(0.3))
            .label_font(("sans-serif", 12))
            .draw()
            .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_statistics() {
        let ms = Duration::from_millis;
        let samples: Vec<Sample> =
            (1..=100).map(|i| Sample { ok: i % 10 != 0, latency: ms(i), ttft: ms(i / 2), tokens: 10 }).collect();
        let s = Step::from_samples("a", 4, &samples, Duration::from_secs(2));
        assert_eq!(s.requests, 100);
        assert_eq!(s.errors, 10);
        assert!((s.error_rate - 0.1).abs() < 1e-9);
        assert!((s.rps - 45.0).abs() < 1e-9, "90 good requests in 2 s");
        assert!((s.tokens_per_s - 450.0).abs() < 1e-9);
        assert!((s.p50_ms - 51.0).abs() < 1.5, "{}", s.p50_ms);
    }

    #[test]
    fn markdown_has_ratios_for_two_targets() {
        let mk = |t: &str, rps: f64, p50: f64| Step {
            target: t.into(),
            concurrency: 4,
            requests: 10,
            errors: 0,
            elapsed_s: 1.0,
            rps,
            tokens_per_s: 0.0,
            p50_ms: p50,
            p95_ms: p50,
            p99_ms: p50,
            ttft_p50_ms: p50,
            ttft_p95_ms: p50,
            error_rate: 0.0,
        };
        let md = markdown(&[mk("corral", 90.0, 11.0), mk("direct", 100.0, 10.0)]);
        assert!(md.contains("|           4 |  0.90 |        1.10 |"), "{md}");
        let widths: Vec<usize> = md.lines().take(3).map(|l| l.chars().count()).collect();
        assert!(widths.iter().all(|w| *w == widths[0]), "the columns line up:\n{md}");
    }
}
