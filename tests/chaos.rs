//! Fault scenarios under load, with real processes (SIGKILL) on loopback. Bounded in count and
//! time. Each test states what a client may and may not see.

mod common;

use std::time::Duration;

use common::process::Proc;
use serde_json::{json, Value};

fn config(name: &str, nodes: &[String], db: &std::path::Path, proxy: &str) -> std::path::PathBuf {
    let mut text = format!(
        "[[listeners]]\naddr = \"{proxy}\"\n\n[admin]\naddr = \"127.0.0.1:0\"\n\n[health]\ninterval_ms = 100\n\n[store]\npath = \"{}\"\n\n",
        db.display()
    );
    for (i, url) in nodes.iter().enumerate() {
        text += &format!("[[nodes]]\nname = \"n{i}\"\nurl = \"{url}\"\nmax_concurrency = 64\n\n");
    }
    let dir = std::env::temp_dir().join(format!("corral-chaos-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("corral.toml");
    std::fs::write(&path, text).expect("write");
    path
}

/// What one client saw.
#[derive(Debug)]
enum Seen {
    /// A whole answer: `done: true` at the end.
    Complete,
    /// A stream that ended with Corral's error line (and no `done: true`).
    Interrupted,
    /// Anything else (an HTTP error, a broken connection, a fake ending).
    Other(String),
}

async fn ask(client: &reqwest::Client, base: &str, stream: bool, i: usize) -> Seen {
    let body = json!({"model": "llama3.2", "prompt": format!("request {i}"), "stream": stream, "options": {"seed": i, "num_predict": 30}});
    let r = match client.post(format!("{base}/api/generate")).json(&body).send().await {
        Ok(r) => r,
        Err(e) => return Seen::Other(format!("send: {e}")),
    };
    let status = r.status();
    let text = match r.text().await {
        Ok(t) => t,
        Err(e) => return Seen::Other(format!("body: {e}")),
    };
    if !status.is_success() {
        return Seen::Other(format!("HTTP {status}: {text}"));
    }
    let lines: Vec<Value> =
        text.lines().filter(|l| !l.is_empty()).filter_map(|l| serde_json::from_str(l).ok()).collect();
    let done = lines.iter().filter(|l| l["done"] == true).count();
    let errors = lines.iter().filter(|l| l.get("error").is_some()).count();
    match (done, errors, lines.last()) {
        (1, 0, Some(last)) if last["done"] == true => Seen::Complete,
        (0, 1, Some(last)) if last["code"] == "stream_interrupted" => Seen::Interrupted,
        _ => Seen::Other(format!("{done} done lines, {errors} error lines: {text}")),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_sigkilled_under_mixed_load() {
    // Slow enough that streams are mid-answer when the node dies (30 tokens at 100/s).
    let mut sims: Vec<Proc> =
        (0..3).map(|_| Proc::spawn(&["sim", "--port", "0", "--tps", "100", "--ttft-ms", "20"])).collect();
    let urls: Vec<String> = sims.iter().map(|s| s.url("simulated Ollama node on")).collect();
    let db = std::env::temp_dir().join(format!("corral-chaos-{}-kill.db", std::process::id()));
    let cfg = config("kill", &urls, &db, "127.0.0.1:0");
    let serve = Proc::spawn(&["serve", "--config", cfg.to_str().unwrap_or_default()]);
    let base = serve.url("serving the Ollama API on");
    let client = reqwest::Client::new();
    // n0 stalls every stream after two chunks, so its streams are surely mid-answer when it dies.
    let r =
        client.post(format!("{}/_sim/faults", urls[0])).json(&json!({"hang_after": 2})).send().await.expect("control");
    assert_eq!(r.status(), 204);
    let load = (0..60).map(|i| {
        let (client, base) = (client.clone(), base.clone());
        tokio::spawn(async move { (i % 2 == 0, ask(&client, &base, i % 2 == 0, i).await) })
    });
    let load: Vec<_> = load.collect();
    // Kill n0 once three streams are past their first chunk on it.
    let stats = format!("{}/_sim/stats", urls[0]);
    let mut streaming = 0;
    for _ in 0..1000 {
        if let Ok(r) = client.get(&stats).send().await {
            streaming = r.json::<Value>().await.ok().and_then(|v| v["streaming"].as_u64()).unwrap_or(0);
            if streaming >= 3 {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(streaming >= 3, "n0 never had three streams going");
    sims[0].kill();
    let mut streamed = (0, 0);
    for task in load {
        let (is_stream, seen) = task.await.expect("task");
        match (is_stream, seen) {
            (false, Seen::Complete) => {}
            (false, other) => panic!("a non-streamed request must still succeed, got {other:?}"),
            (true, Seen::Complete) => streamed.0 += 1,
            (true, Seen::Interrupted) => streamed.1 += 1,
            (true, Seen::Other(s)) => panic!("a stream must end whole or with the error line, got {s}"),
        }
    }
    assert_eq!(streamed.0 + streamed.1, 30);
    assert!(streamed.1 > 0, "some streams were on the killed node mid-answer: {streamed:?}");
    // After the kill everything works.
    for i in 0..10 {
        assert!(matches!(ask(&client, &base, i % 2 == 0, 1000 + i).await, Seen::Complete));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_broker_sigkilled_under_load_restarts_with_a_sound_store() {
    let sims: Vec<Proc> = (0..2)
        .map(|_| Proc::spawn(&["sim", "--port", "0", "--tps", "200", "--ttft-ms", "0", "--parallel", "32"]))
        .collect();
    let urls: Vec<String> = sims.iter().map(|s| s.url("simulated Ollama node on")).collect();
    let db = std::env::temp_dir().join(format!("corral-chaos-{}-crash.db", std::process::id()));
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
    let cfg = config("crash", &urls, &db, "127.0.0.1:0");
    let mut serve = Proc::spawn(&["serve", "--config", cfg.to_str().unwrap_or_default()]);
    let base = serve.url("serving the Ollama API on");
    let client = reqwest::Client::new();
    // Twenty requests that finish, then ten long streams that are running at the crash.
    let mut finished_ids = Vec::new();
    for i in 0..20 {
        let r = client
            .post(format!("{base}/api/generate"))
            .header("x-request-id", format!("done-{i}"))
            .json(&json!({"model": "llama3.2", "prompt": "x", "stream": false, "options": {"num_predict": 3}}))
            .send()
            .await
            .expect("answer");
        assert_eq!(r.status(), 200);
        r.bytes().await.expect("body");
        finished_ids.push(format!("done-{i}"));
    }
    // The next streams stall after three chunks: they are running when the broker dies.
    for url in &urls {
        client.post(format!("{url}/_sim/faults")).json(&json!({"hang_after": 3})).send().await.expect("control");
    }
    let open: Vec<_> = (0..10)
        .map(|i| {
            let req = client
                .post(format!("{base}/api/generate"))
                .header("x-request-id", format!("open-{i}"))
                .json(&json!({"model": "llama3.2", "prompt": "long"}));
            tokio::spawn(async move {
                let r = req.send().await;
                // Hold the stream open until the broker dies under it.
                if let Ok(r) = r {
                    let _ = r.bytes().await;
                }
            })
        })
        .collect();
    // Let the writer flush what it has (it batches within milliseconds), then crash.
    let pool = corral::store::open_pool(&db, true).await.expect("open read-only");
    for _ in 0..500 {
        let rows =
            corral::store::query_requests(&pool, &corral::store::Query { limit: Some(1000), ..Default::default() })
                .await
                .expect("query");
        if rows.len() >= 30 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    pool.close().await;
    serve.kill();
    for task in open {
        task.await.expect("client task ends when the broker dies");
    }

    // Restart on the same store.
    let serve = Proc::spawn(&["serve", "--config", cfg.to_str().unwrap_or_default()]);
    let base = serve.url("serving the Ollama API on");
    assert_eq!(client.get(format!("{base}/api/version")).send().await.expect("answer").status(), 200);
    let pool = corral::store::open_pool(&db, true).await.expect("open read-only");
    let check: String = sqlx::query_scalar("PRAGMA integrity_check").fetch_one(&pool).await.expect("pragma");
    assert_eq!(check, "ok");
    let rows = corral::store::query_requests(&pool, &corral::store::Query { limit: Some(1000), ..Default::default() })
        .await
        .expect("query");
    for id in &finished_ids {
        let row = rows.iter().find(|r| &r.id == id).unwrap_or_else(|| panic!("finished request {id} has its row"));
        assert_eq!(row.status, "ok");
    }
    let crashed: Vec<_> = rows.iter().filter(|r| r.id.starts_with("open-")).collect();
    assert_eq!(crashed.len(), 10, "every request that was running has a row");
    assert!(crashed.iter().all(|r| r.status == "unknown"), "running at the crash -> unknown, never ok: {crashed:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flapping_node_costs_clients_under_one_percent_errors() {
    let sims: Vec<Proc> = (0..3)
        .map(|_| Proc::spawn(&["sim", "--port", "0", "--tps", "0", "--ttft-ms", "0", "--parallel", "16"]))
        .collect();
    let urls: Vec<String> = sims.iter().map(|s| s.url("simulated Ollama node on")).collect();
    let db = std::env::temp_dir().join(format!("corral-chaos-{}-flap.db", std::process::id()));
    let cfg = config("flap", &urls, &db, "127.0.0.1:0");
    let serve = Proc::spawn(&["serve", "--config", cfg.to_str().unwrap_or_default()]);
    let base = serve.url("serving the Ollama API on");
    let client = reqwest::Client::new();
    // n0 alternates between up and failing (every request 500) every 2 liveness probes.
    let r =
        client.post(format!("{}/_sim/faults", urls[0])).json(&json!({"flap_every": 2})).send().await.expect("control");
    assert_eq!(r.status(), 204);
    let mut seen = Vec::new();
    for round in 0..60 {
        let batch = (0..10).map(|i| {
            let (client, base) = (client.clone(), base.clone());
            tokio::spawn(async move { ask(&client, &base, (round + i) % 2 == 0, round * 10 + i).await })
        });
        for t in batch.collect::<Vec<_>>() {
            seen.push(t.await.expect("task"));
        }
    }
    let errors = seen.iter().filter(|s| !matches!(s, Seen::Complete)).count();
    let stats: Value =
        client.get(format!("{}/_sim/stats", urls[0])).send().await.expect("stats").json().await.expect("json");
    let received: Vec<Value> =
        client.get(format!("{}/_sim/received", urls[0])).send().await.expect("received").json().await.expect("json");
    let asked = received.iter().filter(|r| r["path"] == "/api/generate").count() as u64;
    let answered = stats["completed"].as_u64().unwrap_or(0);
    assert!(asked > answered, "the flapping node failed some requests it was sent ({asked} sent, {answered} answered)");
    assert!(
        errors * 100 < seen.len(),
        "{errors} of {} requests failed: {:?}",
        seen.len(),
        seen.iter().find(|s| !matches!(s, Seen::Complete))
    );
}
