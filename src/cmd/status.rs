//! `corral status`: a running broker at a glance, from its admin API (`/admin/status`), and
//! `corral completions`: shell completions from the CLI's own definition.

use std::process::ExitCode;

use clap::CommandFactory;
use corral::node::duration_text;
use serde_json::Value;

pub async fn run(url: &str) -> ExitCode {
    let Some(token) = std::env::var("CORRAL_ADMIN_TOKEN").ok().filter(|t| !t.is_empty()) else {
        eprintln!("error: set CORRAL_ADMIN_TOKEN to the broker's admin token (corral serve prints it at start)");
        return ExitCode::from(2);
    };
    let base = url.trim_end_matches('/');
    let sent = reqwest::Client::new()
        .get(format!("{base}/admin/status"))
        .bearer_auth(token)
        .timeout(std::time::Duration::from_secs(5))
        .send()
        .await;
    let status: Value = match sent {
        Ok(r) if r.status().is_success() => match r.json().await {
            Ok(v) => v,
            Err(e) => {
                eprintln!("error: {base} answered something that is not Corral's status ({e})");
                return ExitCode::from(1);
            }
        },
        Ok(r) if r.status() == 401 => {
            eprintln!("error: {base} refused the token in CORRAL_ADMIN_TOKEN (401)");
            return ExitCode::from(1);
        }
        Ok(r) => {
            eprintln!("error: {base}/admin/status answered HTTP {}", r.status().as_u16());
            return ExitCode::from(1);
        }
        Err(e) => {
            eprintln!(
                "error: cannot reach the admin API at {base} ({e}); is Corral running? (--url to point elsewhere)"
            );
            return ExitCode::from(1);
        }
    };
    print(&status);
    ExitCode::SUCCESS
}

fn print(status: &Value) {
    let connect = &status["connect"];
    let demo = if connect["demo"].as_bool() == Some(true) { "  (demo: simulated nodes)" } else { "" };
    println!("Point clients at: {}{demo}", connect["ollama"].as_str().unwrap_or("?"));
    println!("  OpenAI API: {}   {}", connect["openai"].as_str().unwrap_or("?"), connect["env"].as_str().unwrap_or(""));
    if status["accepting"].as_bool() == Some(false) {
        println!("PAUSED: new requests get 503 until an operator resumes");
    }
    let nodes: Vec<&Value> = status["nodes"].as_array().into_iter().flatten().collect();
    if !nodes.is_empty() && nodes.iter().all(|n| !serving(n)) {
        println!("NO CAPACITY: every node is disabled, draining or down; requests wait, then get 503");
    }
    println!();
    println!("{:<16} {:<11} {:>9}  {:<9} models", "node", "state", "in flight", "breaker");
    let now_ms = corral::store::now_ms();
    for n in nodes {
        let models = n["models"].as_array().map_or(0, Vec::len);
        let state = label(n["state"].as_str().unwrap_or("?"));
        println!(
            "{:<16} {:<11} {:>4} / {:<2}  {:<9} {models}",
            n["name"].as_str().unwrap_or("?"),
            state,
            n["in_flight"].as_u64().unwrap_or(0),
            n["max_concurrency"].as_u64().unwrap_or(0),
            n["breaker"].as_str().unwrap_or(""),
        );
        println!("  {}", since_line(n, state, now_ms));
        if n["stale"].as_bool() == Some(true) {
            if let Some(line) = last_known(n, now_ms) {
                println!("  {line}");
            }
        }
    }
    let q = &status["queue"];
    println!();
    println!(
        "queue: {} waiting ({} bytes) of {}",
        q["depth"].as_u64().unwrap_or(0),
        q["bytes"].as_u64().unwrap_or(0),
        q["max_requests"].as_u64().unwrap_or(0)
    );
}

/// A node state as people read it (the UI says "down" too).
fn label(state: &str) -> &str {
    if state == "unhealthy" {
        "down"
    } else {
        state
    }
}

/// Whether a node could take a request now.
fn serving(n: &Value) -> bool {
    matches!(n["state"].as_str(), Some("healthy" | "recovering" | "unknown"))
}

/// "down since 05:49:12 UTC (3 min): connection refused at http://10.0.0.6:11434".
fn since_line(n: &Value, state: &str, now_ms: i64) -> String {
    let reason = n["state_reason"].as_str().unwrap_or("no reason given");
    match n["state_since"].as_i64() {
        Some(at) => format!("{state} since {} ({}): {reason}", clock(at, now_ms), duration_text(now_ms - at)),
        None => format!("{state}: {reason}"),
    }
}

/// What a down node last reported, with its age: never shown as live.
fn last_known(n: &Value, now_ms: i64) -> Option<String> {
    let mut parts = Vec::new();
    if let Some(at) = n["loaded_as_of"].as_i64() {
        let names: Vec<&str> =
            n["loaded"].as_array().into_iter().flatten().filter_map(|m| m["name"].as_str()).collect();
        let what = if names.is_empty() { "nothing loaded".to_string() } else { format!("loaded {}", names.join(", ")) };
        parts.push(format!("{what} ({} ago)", duration_text(now_ms - at)));
    }
    if let (Some(ms), Some(at)) = (n["ttfb_ms"].as_f64(), n["ttfb_as_of"].as_i64()) {
        parts.push(format!("first token {ms:.0} ms ({} ago)", duration_text(now_ms - at)));
    }
    (!parts.is_empty()).then(|| format!("last known: {}", parts.join("; ")))
}

/// A wall time in UTC (as `corral history` prints times), with the date when not today.
fn clock(at_ms: i64, now_ms: i64) -> String {
    let t = |ms: i64| time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000).ok();
    let (Some(at), Some(now)) = (t(at_ms), t(now_ms)) else { return "?".into() };
    let fmt = if at.date() == now.date() {
        time::macros::format_description!("[hour]:[minute]:[second] UTC")
    } else {
        time::macros::format_description!("[year]-[month]-[day] [hour]:[minute] UTC")
    };
    at.format(&fmt).unwrap_or_default()
}

/// Completions for `shell` on standard output.
pub fn completions(shell: clap_complete::Shell) -> ExitCode {
    let mut cmd = super::args::Cli::command();
    clap_complete::generate(shell, &mut cmd, "corral", &mut std::io::stdout());
    ExitCode::SUCCESS
}
