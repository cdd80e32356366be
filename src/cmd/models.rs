//! `corral models`: which node has which model, loaded or not; `corral models pull` onto nodes
//! with a progress bar per node. Talks to the proxy listener like any Ollama client, using the
//! `nodes` Corral adds to `/api/tags` and `/api/ps` entries.

use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;
use std::time::Duration;

use futures_util::StreamExt;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use serde_json::Value;

/// A merged list from the broker, with the nodes it lacks (`X-Corral-Missing-Nodes`).
struct Listed {
    body: Value,
    missing: Option<String>,
}

/// Why a list could not be had: nothing answers at `url` (is Corral running?), or Corral
/// answered with an error of its own (every node down, say), which is said as it is.
async fn get_json(client: &reqwest::Client, url: &str) -> Result<Listed, String> {
    let r = client
        .get(url)
        .send()
        .await
        .map_err(|e| format!("cannot reach {url}: {e}; is Corral running? (corral serve, or --url)"))?;
    let status = r.status();
    let missing = r.headers().get("x-corral-missing-nodes").and_then(|v| v.to_str().ok()).map(str::to_string);
    let v: Value = r.json().await.map_err(|e| format!("{url} answered no JSON: {e}"))?;
    if !status.is_success() {
        let said = v["error"].as_str().unwrap_or("error");
        if v["code"] == "no_node_up" {
            return Err(format!("Corral is running, but {said} (corral status shows each node's state)"));
        }
        return Err(format!("{url}: {said}"));
    }
    Ok(Listed { body: v, missing })
}

/// Print a table: one row per model and node.
pub async fn list(base: &str) -> ExitCode {
    let client = reqwest::Client::new();
    let (tags_url, ps_url) = (format!("{base}/api/tags"), format!("{base}/api/ps"));
    let (tags, ps) = match tokio::try_join!(get_json(&client, &tags_url), get_json(&client, &ps_url)) {
        Ok(both) => both,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    let missing = tags.missing.clone();
    let (tags, ps) = (tags.body, ps.body);
    // (model, node) -> (size, size_vram) for loaded ones.
    let mut loaded: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
    for m in ps["models"].as_array().into_iter().flatten() {
        let name = m["name"].as_str().unwrap_or_default().to_string();
        let node = m["node"].as_str().unwrap_or_default().to_string();
        loaded.insert((name, node), (m["size"].as_u64().unwrap_or(0), m["size_vram"].as_u64().unwrap_or(0)));
    }
    let mut rows: BTreeSet<(String, String)> = BTreeSet::new();
    for m in tags["models"].as_array().into_iter().flatten() {
        let name = m["name"].as_str().unwrap_or_default().to_string();
        for node in m["nodes"].as_array().into_iter().flatten().filter_map(Value::as_str) {
            rows.insert((name.clone(), node.to_string()));
        }
    }
    rows.extend(loaded.keys().cloned());
    println!("{:<32} {:<16} STATE", "MODEL", "NODE");
    for (model, node) in &rows {
        let state = match loaded.get(&(model.clone(), node.clone())) {
            Some((size, vram)) if *size > 0 && vram >= size => "loaded, 100% GPU".to_string(),
            Some((size, vram)) if *size > 0 => {
                format!("loaded, {}% GPU / {}% CPU", vram * 100 / size, 100 - vram * 100 / size)
            }
            Some(_) => "loaded".to_string(),
            None => "on disk".to_string(),
        };
        println!("{model:<32} {node:<16} {state}");
    }
    if let Some(nodes) = missing {
        eprintln!(
            "note: not listed: the models of {nodes} (down, disabled or not answering; corral status shows which)"
        );
    }
    ExitCode::SUCCESS
}

/// Pull `model` onto `nodes` (all when empty), one progress bar per node.
pub async fn pull(base: &str, model: &str, nodes: &[String]) -> ExitCode {
    let client = reqwest::Client::new();
    let mut req = client.post(format!("{base}/api/pull")).json(&serde_json::json!({ "model": model }));
    if !nodes.is_empty() {
        req = req.header("x-corral-node", nodes.join(","));
    }
    let resp = match req.send().await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot reach {base}: {e}; is Corral running?");
            return ExitCode::from(1);
        }
    };
    if !resp.status().is_success() {
        let v: Value = resp.json().await.unwrap_or_default();
        eprintln!("error: {}", v["error"].as_str().unwrap_or("pull refused"));
        return ExitCode::from(if matches!(v["code"].as_str(), Some("bad_header" | "unknown_node")) { 2 } else { 1 });
    }
    let multi = MultiProgress::new();
    let style = ProgressStyle::with_template("{prefix:>12} [{bar:30}] {bytes}/{total_bytes} {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    let mut bars: BTreeMap<String, ProgressBar> = BTreeMap::new();
    let mut failed = Vec::new();
    let mut ok = false;
    let mut buf = Vec::new();
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let Ok(chunk) = chunk else {
            eprintln!("error: the pull stream broke off");
            return ExitCode::from(1);
        };
        buf.extend_from_slice(&chunk);
        while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            let Ok(v) = serde_json::from_slice::<Value>(&line) else { continue };
            let Some(node) = v["node"].as_str() else {
                // The summary line.
                if let Some(e) = v["error"].as_str() {
                    failed.push(e.to_string());
                } else {
                    ok = v["status"] == "success";
                }
                continue;
            };
            let bar = bars.entry(node.to_string()).or_insert_with(|| {
                let b = multi.add(ProgressBar::new(0));
                b.set_style(style.clone());
                b.set_prefix(node.to_string());
                b.enable_steady_tick(Duration::from_millis(200));
                b
            });
            if let (Some(total), Some(done)) = (v["total"].as_u64(), v["completed"].as_u64()) {
                bar.set_length(total);
                bar.set_position(done);
            }
            match (v["status"].as_str(), v["error"].as_str()) {
                (_, Some(e)) => bar.abandon_with_message(format!("failed: {e}")),
                (Some("success"), _) => bar.finish_with_message("done"),
                (Some(s), _) => bar.set_message(s.to_string()),
                _ => {}
            }
        }
    }
    for b in bars.values() {
        if !b.is_finished() {
            b.finish();
        }
    }
    if ok && failed.is_empty() {
        println!("{model} is on: {}", bars.keys().cloned().collect::<Vec<_>>().join(", "));
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "error: {}",
            if failed.is_empty() { "the pull did not finish".to_string() } else { failed.join("; ") }
        );
        ExitCode::from(1)
    }
}
