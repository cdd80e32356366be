//! `corral status`: a running broker at a glance, from its admin API (`/admin/status`), and
//! `corral completions`: shell completions from the CLI's own definition.

use std::process::ExitCode;

use clap::CommandFactory;
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
    println!();
    println!("{:<16} {:<11} {:>9}  {:<9} models", "node", "state", "in flight", "breaker");
    for n in status["nodes"].as_array().into_iter().flatten() {
        let models = n["models"].as_array().map_or(0, Vec::len);
        println!(
            "{:<16} {:<11} {:>4} / {:<2}  {:<9} {models}",
            n["name"].as_str().unwrap_or("?"),
            n["state"].as_str().unwrap_or("?"),
            n["in_flight"].as_u64().unwrap_or(0),
            n["max_concurrency"].as_u64().unwrap_or(0),
            n["breaker"].as_str().unwrap_or(""),
        );
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

/// Completions for `shell` on standard output.
pub fn completions(shell: clap_complete::Shell) -> ExitCode {
    let mut cmd = super::args::Cli::command();
    clap_complete::generate(shell, &mut cmd, "corral", &mut std::io::stdout());
    ExitCode::SUCCESS
}
