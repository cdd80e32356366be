//! `corral drill`: rehearse failover on a running broker. Asks its admin API
//! (`POST /admin/drill`) to take a node out, send a small batch through each category and put
//! the node back, then prints what the clients saw: a table per category and a summary line.
//!
//! Exit code 0 when the drill ran, whatever the clients saw (failures are the finding, not an
//! error of the command); 2 when the broker refused the arguments (unknown node or category,
//! a count out of range, no token); 1 when the drill could not run otherwise.

use std::process::ExitCode;
use std::time::Duration;

use serde_json::{json, Value};

/// What to drill; `None` leaves the choice to the broker.
pub struct DrillArgs<'a> {
    pub url: &'a str,
    pub node: Option<&'a str>,
    pub category: Option<&'a str>,
    pub requests: Option<usize>,
    /// Take the node out by a simulated fault (every inference request answers 500) instead
    /// of a drain; only a `corral sim` node takes one.
    pub fault: bool,
}

pub async fn run(args: DrillArgs<'_>) -> ExitCode {
    let Some(token) = super::env_token() else {
        eprintln!("error: set CORRAL_ADMIN_TOKEN to the broker's admin token (corral serve prints it at start)");
        return ExitCode::from(2);
    };
    let base = args.url.trim_end_matches('/');
    let take_out = if args.fault { "fault" } else { "drain" };
    let body = json!({ "node": args.node, "category": args.category, "requests": args.requests, "take_out": take_out });
    // The broker bounds the drill (a few requests per category, each bounded); this is a backstop.
    let client = reqwest::Client::builder().connect_timeout(Duration::from_secs(5)).timeout(Duration::from_secs(3600));
    let sent = match client.build() {
        Ok(c) => c.post(format!("{base}/admin/drill")).bearer_auth(token).json(&body).send().await,
        Err(e) => {
            eprintln!("error: cannot set up an HTTP client: {e}");
            return ExitCode::from(1);
        }
    };
    let r = match sent {
        Ok(r) => r,
        Err(e) => {
            eprintln!(
                "error: cannot reach the admin API at {base} ({e}); is Corral running? (--url to point elsewhere)"
            );
            return ExitCode::from(1);
        }
    };
    let status = r.status().as_u16();
    let v: Value = r.json().await.unwrap_or(Value::Null);
    if status != 200 {
        return refused(base, status, &v);
    }
    print(&v);
    ExitCode::SUCCESS
}

/// The broker said no: its sentence and code, and the exit code that fits.
fn refused(base: &str, status: u16, v: &Value) -> ExitCode {
    let code = v["code"].as_str().unwrap_or("");
    match v["error"].as_str() {
        Some(e) => eprintln!("error: the drill did not run: {e} ({code})"),
        None => eprintln!("error: {base}/admin/drill answered HTTP {status}; is this Corral's admin API?"),
    }
    match (status, code) {
        (401, _) => {
            eprintln!("hint: CORRAL_ADMIN_TOKEN must be the token this broker printed at start");
            ExitCode::from(1)
        }
        (_, "not_found" | "malformed_json") => ExitCode::from(2),
        _ => ExitCode::from(1),
    }
}

fn print(v: &Value) {
    let node = v["node"].as_str().unwrap_or("?");
    println!(
        "Drill: took {node} out ({}), sent each category's batch through the proxy, put it back (now {}, breaker {}).",
        v["taken_out"].as_str().unwrap_or("drain"),
        v["restored"].as_str().unwrap_or("?"),
        v["breaker"].as_str().unwrap_or("?"),
    );
    if let Some(e) = v["restore_error"].as_str() {
        println!("WARNING: {node} may not be back as it was: {e}");
    }
    if let Some(note) = v["note"].as_str() {
        println!("Note: {note}");
    }
    let results = v["results"].as_array().map(Vec::as_slice).unwrap_or_default();
    for c in v["per_category"].as_array().into_iter().flatten() {
        let name = c["category"].as_str().unwrap_or("?");
        println!();
        if let Some(why) = c["skipped"].as_str() {
            println!("category {name}: not drilled: {why}");
            continue;
        }
        println!("category {name} (model {})", c["model"].as_str().unwrap_or("?"));
        println!("  {:>2}  {:<6}  {:<18} {:>8} {:>8}  error", "#", "status", "served by", "attempts", "ms");
        for r in results.iter().filter(|r| r["category"] == c["category"]) {
            println!("  {}", row(r).trim_end());
        }
        println!("  {name}: {}", summary(c));
    }
}

/// One request's row: #, status, served by, attempts, ms, error.
fn row(r: &Value) -> String {
    let status = r["status"].as_u64().map_or_else(|| "-".to_string(), |s| s.to_string());
    let attempts = r["attempts"].as_u64().map_or_else(|| "-".to_string(), |a| a.to_string());
    let error = match (r["code"].as_str(), r["error"].as_str()) {
        (Some(code), Some(text)) if text.chars().count() > 100 => {
            format!("{code}: {}…", text.chars().take(99).collect::<String>())
        }
        (Some(code), Some(text)) => format!("{code}: {text}"),
        (Some(code), None) => code.to_string(),
        _ => String::new(),
    };
    format!(
        "{:>2}  {status:<6}  {:<18} {attempts:>8} {:>8.0}  {error}",
        r["n"].as_u64().unwrap_or(0),
        r["served_by"].as_str().unwrap_or("-"),
        r["ms"].as_f64().unwrap_or(0.0),
    )
}

/// A category's tally in one line: served of sent, by whom, p50 and max, errors.
fn summary(c: &Value) -> String {
    let by: Vec<String> = c["by"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(who, n)| format!("{who} {}", n.as_u64().unwrap_or(0)))
        .collect();
    let errors: Vec<String> = c["errors"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| format!("{} x{}", e["code"].as_str().unwrap_or("?"), e["count"].as_u64().unwrap_or(0)))
        .collect();
    format!(
        "{}/{} served{}; p50 {:.0} ms, max {:.0} ms, {}",
        c["served"].as_u64().unwrap_or(0),
        c["sent"].as_u64().unwrap_or(0),
        if by.is_empty() { String::new() } else { format!(" ({})", by.join(", ")) },
        c["p50_ms"].as_f64().unwrap_or(0.0),
        c["max_ms"].as_f64().unwrap_or(0.0),
        if errors.is_empty() { "no errors".to_string() } else { format!("errors: {}", errors.join(", ")) },
    )
}
