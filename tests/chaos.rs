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
    let r = match client
        .post(format!("{base}/api/generate"))
        .header("x-request-id", format!("req-{i}"))
        .json(&body)
        .send()
        .await
    {
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
    // Round robin without affinity puts every third request on n0 whatever the timing: with
    // least-connections (the default) and a slow machine the streams arrived one by one, n0's
    // one hung stream made it the busiest node and it never got a second (CI).
    let cfg = config("kill", &urls, &db, "127.0.0.1:0");
    let text = std::fs::read_to_string(&cfg).expect("read config")
        + "[[categories]]\nname = \"default\"\npolicy = \"round-robin\"\naffinity = false\n";
    std::fs::write(&cfg, text).expect("write config");
    let serve = Proc::spawn(&["serve", "--config", cfg.to_str().unwrap_or_default()]);
    let base = serve.url("serving the Ollama API on");
    let client = reqwest::Client::new();
    // n0 stalls every stream after two chunks, so its streams are surely mid-answer when it dies.
    let r =
        client.post(format!("{}/_sim/faults", urls[0])).json(&json!({"hang_after": 2})).send().await.expect("control");
    assert_eq!(r.status(), 204);
    // Streams first: Corral sends non-streamed requests to a node as streams too (to see
    // their first token), so n0's stream count says which kind is on it only while it has
    // nothing but client streams.
    let spawn = |i: usize| {
        let (client, base) = (client.clone(), base.clone());
        tokio::spawn(async move { (i % 2 == 0, ask(&client, &base, i % 2 == 0, i).await) })
    };
    let mut load: Vec<_> = (0..60).step_by(2).map(spawn).collect();
    // Kill n0 once three client streams are past their first chunk on it.
    let stats = format!("{}/_sim/stats", urls[0]);
    let streaming = |client: reqwest::Client, stats: String| async move {
        match client.get(&stats).send().await {
            Ok(r) => r.json::<Value>().await.ok().and_then(|v| v["streaming"].as_u64()).unwrap_or(0),
            Err(_) => 0,
        }
    };
    // Bounded by time, not by polls: with the other chaos scenarios running beside it on two
    // cores, the streams once took longer than 1,000 polls to reach n0 (CI).
    let mut seen = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::time::Instant::now() < deadline {
        seen = streaming(client.clone(), stats.clone()).await;
        if seen >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(seen >= 3, "n0 never had three streams going in 30 s (it had {seen})");
    // Then the non-streamed half, mid-flight too when n0 dies.
    load.extend((1..60).step_by(2).map(spawn));
    for _ in 0..200 {
        if streaming(client.clone(), stats.clone()).await > seen {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
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
    report(Figures {
        scenario: "node SIGKILLed under load",
        load: "60 concurrent (half streamed), 3 nodes",
        faults: "n0 killed with 3+ streams mid-answer on it",
        sent: 60,
        ok: 30 + streamed.0,
        failed: 0,
        interrupted: streamed.1,
        note: "every non-streamed request succeeded; every stream ended whole or with the error line, none with a fake done",
    });
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
    // The finished requests are on disk before the crash scenario starts (the store is read
    // by another connection, as an operator would), so the kill below tests only the records
    // in flight.
    let pool = corral::store::open_pool(&db, true).await.expect("open read-only");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let rows =
            corral::store::query_requests(&pool, &corral::store::Query { limit: Some(100), ..Default::default() })
                .await
                .expect("query");
        if rows.iter().filter(|r| r.status == "ok").count() >= 20 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the finished requests never reached the store");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    pool.close().await;
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
    // Crash inside the writer's linger: as soon as every stream has its first bytes, with no
    // wait for the store to flush. Only records sent in the last moments may be lost.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while streaming_on(&client, &urls).await < 10 {
        assert!(tokio::time::Instant::now() < deadline, "the ten streams never all started on the nodes");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    serve.kill();
    for task in open {
        task.await.expect("client task ends when the broker dies");
    }

    // Restart on the same store.
    let serve = Proc::spawn(&["serve", "--config", cfg.to_str().unwrap_or_default()]);
    let base = serve.url("serving the Ollama API on");
    assert_eq!(client.get(format!("{base}/api/version")).send().await.expect("answer").status(), 200);
    let pool = corral::store::open_pool(&db, true).await.expect("open read-only");
    let check: String = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_one(pool.sqlite().expect("a SQLite file"))
        .await
        .expect("pragma");
    assert_eq!(check, "ok");
    let rows = corral::store::query_requests(&pool, &corral::store::Query { limit: Some(1000), ..Default::default() })
        .await
        .expect("query");
    let by_client = |id: &str| rows.iter().find(|r| r.client_request_id.as_deref() == Some(id));
    for id in &finished_ids {
        let row = by_client(id).unwrap_or_else(|| panic!("finished request {id} has its row"));
        assert_eq!(row.status, "ok");
    }
    let crashed: Vec<_> =
        rows.iter().filter(|r| r.client_request_id.as_deref().is_some_and(|c| c.starts_with("open-"))).collect();
    assert!(crashed.iter().all(|r| r.status == "unknown"), "running at the crash -> unknown, never ok: {crashed:?}");
    // The bound: a SIGKILL loses at most what was sent to the writer in its last linger
    // (100 ms) plus the batch it was writing; here that is at most the ten streams' start
    // records. Every request that had finished before them is on disk.
    let lost = 10 - crashed.len();
    report(Figures {
        scenario: "broker SIGKILLed under load, restarted",
        load: "20 finished + 10 streams running, 2 nodes",
        faults: "the broker process killed",
        sent: 30,
        ok: 20,
        failed: 0,
        interrupted: 10,
        note: &format!(
            "PRAGMA integrity_check = ok; 20/20 finished rows present and ok; {} running rows now unknown; \
             {lost} start records lost in the writer's last linger (bound: those sent within 100 ms of the kill)",
            crashed.len()
        ),
    });
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
    report(Figures {
        scenario: "flapping node",
        load: "600 requests in rounds of 10 (half streamed), 3 nodes",
        faults: "n0 fails everything every other 2 probes",
        sent: seen.len(),
        ok: seen.len() - errors,
        failed: errors,
        interrupted: 0,
        note: &format!(
            "n0 was sent {asked} and answered {answered}; client error rate {:.2}%",
            errors as f64 * 100.0 / seen.len() as f64
        ),
    });
}

/// Streams the simulated nodes at `urls` are sending right now.
async fn streaming_on(client: &reqwest::Client, urls: &[String]) -> u64 {
    let mut total = 0;
    for url in urls {
        let stats = client.get(format!("{url}/_sim/stats")).send().await.ok();
        if let Some(r) = stats {
            total += r.json::<Value>().await.ok().and_then(|v| v["streaming"].as_u64()).unwrap_or(0);
        }
    }
    total
}

/// One scenario's figures, printed as a line for docs/RELIABILITY.md
/// (`cargo test --test chaos -- --nocapture`).
struct Figures<'a> {
    scenario: &'a str,
    load: &'a str,
    faults: &'a str,
    sent: usize,
    ok: usize,
    failed: usize,
    interrupted: usize,
    note: &'a str,
}

fn report(f: Figures<'_>) {
    let line = format!(
        "RELIABILITY | {} | {} | {} | {} | {} | {} | {} | {} |",
        f.scenario, f.load, f.faults, f.sent, f.ok, f.failed, f.interrupted, f.note
    );
    println!("{line}");
    // Also kept where CI prints it after the run (scripts/test), since cargo hides the output
    // of passing tests.
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("reliability-figures.txt");
    if let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
        use std::io::Write;
        let _ = writeln!(file, "{line}");
    }
}

async fn post_faults(client: &reqwest::Client, url: &str, faults: Value) {
    let r = client.post(format!("{url}/_sim/faults")).json(&faults).send().await.expect("control");
    assert_eq!(r.status(), 204);
}

fn config_with(name: &str, nodes: &[String], extra: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let db = std::env::temp_dir().join(format!("corral-chaos-{}-{name}.db", std::process::id()));
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
    let path = config(name, nodes, &db, "127.0.0.1:0");
    let mut text = std::fs::read_to_string(&path).expect("read");
    text += extra;
    std::fs::write(&path, text).expect("write");
    (path, db)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_hanging_before_the_first_byte_fails_over_within_the_timeout() {
    let sims: Vec<Proc> = (0..3)
        .map(|_| Proc::spawn(&["sim", "--port", "0", "--tps", "0", "--ttft-ms", "0", "--parallel", "32"]))
        .collect();
    let urls: Vec<String> = sims.iter().map(|s| s.url("simulated Ollama node on")).collect();
    let (cfg, _) = config_with(
        "hang",
        &urls,
        "[proxy]\nfirst_byte_timeout_ms = 400\n\n[retry]\nbackoff_base_ms = 1\nbackoff_cap_ms = 5\n",
    );
    let serve = Proc::spawn(&["serve", "--config", cfg.to_str().unwrap_or_default()]);
    let base = serve.url("serving the Ollama API on");
    let client = reqwest::Client::new();
    post_faults(&client, &urls[0], json!({"hang": true})).await;
    let started = tokio::time::Instant::now();
    let load: Vec<_> = (0..60)
        .map(|i| {
            let (client, base) = (client.clone(), base.clone());
            tokio::spawn(async move {
                let t = tokio::time::Instant::now();
                (ask(&client, &base, i % 2 == 0, i).await, t.elapsed())
            })
        })
        .collect();
    let mut slowest = Duration::ZERO;
    let mut ok = 0;
    for t in load {
        let (seen, took) = t.await.expect("task");
        assert!(matches!(seen, Seen::Complete), "every request completes elsewhere: {seen:?}");
        ok += 1;
        slowest = slowest.max(took);
    }
    let hung: Vec<Value> =
        client.get(format!("{}/_sim/received", urls[0])).send().await.expect("sim").json().await.expect("json");
    let sent_to_hung = hung.iter().filter(|r| r["path"] == "/api/generate").count();
    assert!(sent_to_hung > 0, "some requests went to the hanging node first");
    // Each failed over after one first-byte timeout (400 ms), not after the client gave up.
    assert!(slowest < Duration::from_millis(400) * 5, "slowest {slowest:?}");
    report(Figures {
        scenario: "node hangs before the first byte",
        load: "60 concurrent (half streamed), 3 nodes",
        faults: "n0 never answers; first_byte_timeout 400 ms",
        sent: 60,
        ok,
        failed: 60 - ok,
        interrupted: 0,
        note: &format!(
            "{sent_to_hung} tried n0 first; slowest answer {} ms; wall {} ms",
            slowest.as_millis(),
            started.elapsed().as_millis()
        ),
    });
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_cut_mid_stream_interrupts_its_clients_and_runs_nothing_twice() {
    let sims: Vec<Proc> = (0..3)
        .map(|_| Proc::spawn(&["sim", "--port", "0", "--tps", "0", "--ttft-ms", "0", "--parallel", "32"]))
        .collect();
    let urls: Vec<String> = sims.iter().map(|s| s.url("simulated Ollama node on")).collect();
    // n0 takes every third request for the whole load, so streams reach it in whatever order
    // the requests arrive: with least-connections and the default five failures to open its
    // breaker, five cut single-JSON answers could take n0 out before any stream got there
    // (seen once under a full test run).
    let rotation = "[breaker]\nfailures_to_open = 1000\n\n[[categories]]\nname = \"default\"\npolicy = \"round-robin\"\naffinity = false\n";
    let (cfg, db) = config_with("cut", &urls, rotation);
    let serve = Proc::spawn(&["serve", "--config", cfg.to_str().unwrap_or_default()]);
    let base = serve.url("serving the Ollama API on");
    let client = reqwest::Client::new();
    post_faults(&client, &urls[0], json!({"cut_after": 3})).await;
    let load: Vec<_> = (0..60)
        .map(|i| {
            let (client, base) = (client.clone(), base.clone());
            tokio::spawn(async move { (i % 2 == 0, ask(&client, &base, i % 2 == 0, i).await) })
        })
        .collect();
    let (mut ok, mut interrupted) = (0, 0);
    for t in load {
        match t.await.expect("task") {
            (_, Seen::Complete) => ok += 1,
            (true, Seen::Interrupted) => interrupted += 1,
            // Nothing of a single JSON reaches the client before it is whole, so a cut one is
            // answered again elsewhere instead of arriving broken.
            (stream, other) => panic!("stream={stream}: {other:?}"),
        }
    }
    assert!(interrupted > 0, "streams on n0 were cut");
    assert_eq!(ok + interrupted, 60);
    // A stream runs once: after its first byte nothing is retried. A single JSON runs at most
    // twice: once on n0, which cut it, and once elsewhere.
    let mut runs: std::collections::HashMap<String, Vec<usize>> = std::collections::HashMap::new();
    for (n, u) in urls.iter().enumerate() {
        let r: Vec<Value> =
            client.get(format!("{u}/_sim/received")).send().await.expect("sim").json().await.expect("json");
        for id in r.iter().filter(|r| r["path"] == "/api/generate").filter_map(|r| r["request_id"].as_str()) {
            runs.entry(id.to_string()).or_default().push(n);
        }
    }
    assert_eq!(runs.len(), 60, "every request ran");
    let mut rerun = 0;
    for (id, nodes) in &runs {
        let i: usize = id.trim_start_matches("req-").parse().expect("id");
        match (i % 2 == 0, nodes.len()) {
            (_, 1) => {}
            (false, 2) if nodes.contains(&0) && nodes.iter().any(|&n| n != 0) => rerun += 1,
            other => panic!("{id} ran on {nodes:?} ({other:?})"),
        }
    }
    let broken = 0;
    // The records say so.
    let pool = corral::store::open_pool(&db, true).await.expect("store");
    let mut rows = Vec::new();
    for _ in 0..500 {
        rows = corral::store::query_requests(&pool, &corral::store::Query { limit: Some(1000), ..Default::default() })
            .await
            .expect("query");
        if rows.iter().filter(|r| r.status != "running").count() >= 60 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let recorded_interrupted = rows.iter().filter(|r| r.status == "interrupted").count();
    assert_eq!(recorded_interrupted, interrupted, "every cut stream is recorded as interrupted");
    report(Figures {
        scenario: "node cut mid-stream",
        load: "60 concurrent (half streamed), 3 nodes, round-robin, breaker kept closed",
        faults: "n0 breaks every answer after 3 chunks",
        sent: 60,
        ok,
        failed: broken,
        interrupted,
        note: &format!(
            "{} executions for 60 requests ({rerun} cut single-JSON answers rerun elsewhere, no stream rerun); {recorded_interrupted} rows interrupted; 0 rows lost",
            60 + rerun
        ),
    });
}

#[tokio::test(flavor = "multi_thread")]
async fn all_nodes_down_falls_back_where_allowed_and_refuses_where_not() {
    let sims: Vec<Proc> = (0..3).map(|_| Proc::spawn(&["sim", "--port", "0", "--tps", "0"])).collect();
    let urls: Vec<String> = sims.iter().map(|s| s.url("simulated Ollama node on")).collect();
    let cloud =
        Proc::spawn(&["sim", "--port", "0", "--cloud", "--models", "gpt-4o-mini", "--tps", "0", "--ttft-ms", "0"]);
    let cloud_url = cloud.url("simulated Ollama node on");
    let extra = format!(
        "[[categories]]\nname = \"default\"\ncloud = \"on-failure\"\nproviders = [\"cloudsim\"]\n\n[[categories]]\nname = \"hr\"\n\n\
         [[providers]]\nname = \"cloudsim\"\nbase_url = \"{cloud_url}/v1\"\nmodel_map = {{ \"*\" = \"gpt-4o-mini\" }}\n"
    );
    let (cfg, _) = config_with("alldown", &urls, &extra);
    let serve = Proc::spawn(&["serve", "--config", cfg.to_str().unwrap_or_default()]);
    let base = serve.url("serving the Ollama API on");
    drop(sims);
    let client = reqwest::Client::new();
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let (client, base) = (client.clone(), base.clone());
            tokio::spawn(async move {
                let hr = i % 2 == 1;
                let mut req = client.post(format!("{base}/api/generate")).json(
                    &json!({"model": "llama3.2", "prompt": format!("q{i}"), "stream": i % 4 < 2, "options": {"num_predict": 5}}),
                );
                if hr {
                    req = req.header("x-corral-category", "hr");
                }
                let r = req.send().await.expect("answer");
                let status = r.status().as_u16();
                let fallback = r.headers().get("x-corral-fallback").is_some();
                let forwarded = r.headers().get("x-corral-forwarded").map(|v| v.as_bytes().to_vec());
                let text = r.text().await.unwrap_or_default();
                (hr, status, fallback, forwarded, text)
            })
        })
        .collect();
    let (mut ok, mut refused) = (0, 0);
    for t in tasks {
        let (hr, status, fallback, forwarded, text) = t.await.expect("task");
        if hr {
            assert_eq!(status, 503, "{text}");
            assert_eq!(forwarded.as_deref(), Some(&b"false"[..]));
            assert!(text.contains("cloud_not_allowed"), "{text}");
            refused += 1;
        } else {
            assert_eq!(status, 200, "{text}");
            assert!(fallback && text.contains("\"done\":true"), "{text}");
            ok += 1;
        }
    }
    let seen: Vec<Value> =
        client.get(format!("{cloud_url}/_sim/received")).send().await.expect("sim").json().await.expect("json");
    assert_eq!(seen.len(), 20, "only the on-failure half reached the cloud");
    report(Figures {
        scenario: "all nodes down",
        load: "40 concurrent: 20 on-failure, 20 never (cloud); half streamed",
        faults: "3 nodes killed; a cloud sim as provider",
        sent: 40,
        ok,
        failed: 0,
        interrupted: 0,
        note: &format!("{ok} answered by the cloud with X-Corral-Fallback; {refused} got 503 cloud_not_allowed forwarded=false; cloud saw {}", seen.len()),
    });
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn ten_thousand_requests_against_a_saturated_cluster_stay_bounded() {
    let sim = Proc::spawn(&["sim", "--port", "0", "--tps", "0", "--ttft-ms", "0", "--parallel", "64"]);
    let url = sim.url("simulated Ollama node on");
    let nodes = [url.clone()];
    let (cfg, _) = config_with(
        "flood",
        &nodes,
        // The queue timeout outlasts the arrival of all 10,000, so the queue holds exactly its
        // bound while the rest overflow.
        "[queue]\nmax_requests = 1000\n\n[[categories]]\nname = \"default\"\nqueue_timeout_ms = 20000\n",
    );
    let text = std::fs::read_to_string(&cfg).expect("read").replace("max_concurrency = 64", "max_concurrency = 2");
    std::fs::write(&cfg, text).expect("write");
    let serve = Proc::spawn(&["serve", "--config", cfg.to_str().unwrap_or_default()]);
    let base = serve.url("serving the Ollama API on");
    let pid = serve.child.id();
    let control = reqwest::Client::new();
    // Every answer hangs: the node's two slots stay taken, everything else waits or overflows.
    post_faults(&control, &url, json!({"hang": true})).await;
    let before = rss_kib(pid);
    // Ten h2c connections carry 1,000 requests each, all at once.
    let clients: Vec<reqwest::Client> =
        (0..10).map(|_| reqwest::Client::builder().http2_prior_knowledge().build().expect("client")).collect();
    let started = tokio::time::Instant::now();
    let tasks: Vec<_> = (0..10_000)
        .map(|i| {
            let (client, base) = (clients[i % 10].clone(), base.clone());
            tokio::spawn(async move {
                let r = client
                    .post(format!("{base}/api/generate"))
                    .json(&json!({"model": "llama3.2", "prompt": "x", "stream": false}))
                    .timeout(Duration::from_secs(60))
                    .send()
                    .await;
                match r {
                    Ok(r) => {
                        let forwarded = r.headers().get("x-corral-forwarded").map(|v| v == "false");
                        (Some(r.status().as_u16()), forwarded)
                    }
                    Err(_) => (None, None),
                }
            })
        })
        .collect();
    let mut peak = before;
    let (mut over, mut timed_out, mut other) = (0, 0, 0);
    let mut pending = tasks;
    while !pending.is_empty() {
        peak = peak.max(rss_kib(pid));
        let (done, rest): (Vec<_>, Vec<_>) = pending.into_iter().partition(|t| t.is_finished());
        pending = rest;
        for t in done {
            match t.await.expect("task") {
                (Some(429), Some(true)) => over += 1,
                (Some(503), Some(true)) => timed_out += 1,
                r => {
                    other += 1;
                    assert!(other <= 2, "only the two running requests may end otherwise: {r:?}");
                }
            }
        }
        if !pending.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
            // The two hung requests never end on their own: release them once all else did.
            if pending.len() <= 2 && started.elapsed() > Duration::from_secs(3) {
                post_faults(&control, &url, json!({})).await;
                let r = control.post(format!("{url}/_sim/down")).json(&json!({"for_ms": 10})).send().await;
                assert!(r.is_ok());
            }
        }
    }
    let arrival = started.elapsed();
    assert_eq!(over + timed_out + other, 10_000);
    assert!(timed_out <= 1_000, "never more queued than queue.max_requests: {timed_out} timed out");
    assert!(over >= 8_998, "the overflow was refused with 429: {over} (arrival took {arrival:?})");
    let growth_mib = peak.saturating_sub(before) / 1024;
    assert!(growth_mib < 256, "memory grew {growth_mib} MiB for 10,000 requests");
    // Nothing panicked: the broker still answers, and serves again once the node is back up.
    let r = control.get(format!("{base}/")).send().await.expect("alive");
    assert_eq!(r.status(), 200);
    let mut served = false;
    for _ in 0..100 {
        let r = control.get(format!("{base}/api/version")).send().await.expect("answer");
        if r.status() == 200 {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(served, "the node came back and the broker served it");
    report(Figures {
        scenario: "10,000 requests on a saturated cluster",
        load: "10,000 at once over 10 h2c connections; 1 node with 2 slots, hung",
        faults: "queue.max_requests 1000, queue timeout 20 s",
        sent: 10_000,
        ok: 0,
        failed: over + timed_out + other,
        interrupted: 0,
        note: &format!(
            "{over} got 429 queue_full, {timed_out} got 503 queue_timeout, all forwarded=false; RSS {} -> {} MiB peak",
            before / 1024,
            peak / 1024
        ),
    });
}
