//! The `corral` binary as a user runs it: real processes, real signals, real loopback.

mod common;

use std::process::Command;
use std::time::Duration;

use common::process::{Proc, BIN};
use corral::sim::{Faults, SimNode, SimSpec};
use serde_json::{json, Value};

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).args(args).env("NO_COLOR", "1").output().expect("corral runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn temp_file(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("corral-cli-{}-{}", std::process::id(), name));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("corral.toml");
    std::fs::write(&path, text).expect("write config");
    path
}

/// A config for `nodes` with every address on a free port and the store in a file of its own.
fn config_for(name: &str, nodes: &[String]) -> String {
    let db = std::env::temp_dir().join(format!("corral-cli-{}-{name}.db", std::process::id()));
    let mut text = format!(
        "[[listeners]]\naddr = \"127.0.0.1:0\"\n\n[admin]\naddr = \"127.0.0.1:0\"\n\n[health]\ninterval_ms = 200\n\n[store]\npath = \"{}\"\n\n",
        db.display()
    );
    for (i, url) in nodes.iter().enumerate() {
        text += &format!("[[nodes]]\nname = \"gpu{i}\"\nurl = \"{url}\"\n\n");
    }
    text
}

#[tokio::test(flavor = "multi_thread")]
async fn serve_spreads_load_and_survives_a_sigkilled_node() {
    let sims: Vec<Proc> =
        (0..3).map(|_| Proc::spawn(&["sim", "--port", "0", "--tps", "0", "--ttft-ms", "50"])).collect();
    let urls: Vec<String> = sims.iter().map(|s| s.url("simulated Ollama node on")).collect();
    let cfg = temp_file("kill", &config_for("kill", &urls));
    let serve = Proc::spawn(&["serve", "--config", cfg.to_str().unwrap_or_default()]);
    let base = serve.url("serving the Ollama API on");
    let client = reqwest::Client::new();
    let chat = |stream: bool| {
        let client = client.clone();
        let url = format!("{base}/api/chat");
        async move {
            client
                .post(url)
                .json(&json!({"model": "llama3.2", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}))
                .send()
                .await
        }
    };

    let burst = futures_util::future::join_all((0..24).map(|i| chat(i % 2 == 0))).await;
    let mut served_by = std::collections::BTreeMap::new();
    for r in burst {
        let r = r.expect("answer");
        assert_eq!(r.status(), 200);
        let node = r.headers()["x-corral-node"].to_str().unwrap_or_default().to_string();
        *served_by.entry(node).or_insert(0) += 1;
        r.bytes().await.expect("whole body");
    }
    assert!(served_by.len() >= 2, "concurrent load spreads over at least two nodes: {served_by:?}");

    let mut sims = sims;
    let victim = &mut sims[0];
    victim.child.kill().expect("SIGKILL");
    victim.child.wait().expect("reaped");

    let mut ok = 0;
    for i in 0..20 {
        let r = chat(i % 2 == 1).await.expect("answer");
        let status = r.status();
        let node = r.headers().get("x-corral-node").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        let text = r.text().await.expect("body");
        assert_eq!(status, 200, "request {i} after the kill: {text}");
        assert_ne!(node, "gpu0", "the dead node served nothing");
        assert!(text.contains("\"done\":true"), "complete answer: {text}");
        ok += 1;
    }
    assert_eq!(ok, 20);
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_drains_a_running_stream_then_exits_zero() {
    let sim = Proc::spawn(&["sim", "--port", "0", "--tps", "20", "--ttft-ms", "0"]);
    let url = sim.url("simulated Ollama node on");
    let cfg = temp_file("drain", &config_for("drain", &[url]));
    let mut serve = Proc::spawn(&["serve", "--config", cfg.to_str().unwrap_or_default()]);
    let base = serve.url("serving the Ollama API on");
    let r = reqwest::Client::new()
        .post(format!("{base}/api/generate"))
        .json(&json!({"model": "llama3.2", "prompt": "tell me", "options": {"seed": 3}}))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), 200);
    serve.signal("-TERM");
    let text = r.text().await.expect("the stream finishes during the drain");
    let last: Value = serde_json::from_str(text.lines().last().unwrap_or_default()).expect("json line");
    assert_eq!(last["done"], true);
    assert_eq!(serve.wait_exit(Duration::from_secs(30)), Some(0), "clean exit after draining");
}

#[test]
fn config_check_reports_every_problem_with_its_line_and_exits_2() {
    let bad = temp_file("bad", "[[nodes]]\nname = \"GPU 0\"\nurl = \"ftp://x\"\nweight = 0\n\n[[categories]]\nname = \"default\"\npolicy = \"fastest\"\n");
    let (code, _, err) = run(&["config", "check", bad.to_str().unwrap_or_default()]);
    assert_eq!(code, 2, "{err}");
    for want in ["line 2", "nodes[0].name", "line 3", "nodes[0].url", "line 4", "nodes[0].weight", "line 8", "fastest"]
    {
        assert!(err.contains(want), "{want:?} missing from:\n{err}");
    }
    let good = temp_file("good", "[[nodes]]\nname = \"gpu0\"\nurl = \"http://127.0.0.1:11434\"\n");
    let (code, out, _) = run(&["config", "check", good.to_str().unwrap_or_default(), "--verbose"]);
    assert_eq!(code, 0);
    assert!(out.contains("ok") && out.contains("[[categories]]"), "verbose prints the effective config:\n{out}");
    for (key, _) in corral::state::RESTART_KEYS {
        assert!(out.contains(&format!("#   {key}: ")), "verbose names {key} as taking effect at restart:\n{out}");
    }
    let (code, _, err) = run(&["config", "check", "/nonexistent/corral.toml"]);
    assert_eq!(code, 2);
    assert!(err.contains("cannot read"), "{err}");
}

#[test]
fn config_check_names_each_bad_node_at_its_own_line_when_two_in_a_row_are_broken() {
    // The wall: nodes[1]'s bad URL was reported against nodes[0], at nodes[0]'s line.
    let text = "[[nodes]]\nname = \"gpu0\"\nurl = \"ftp://a\"\n\n[[nodes]]\nname = \"gpu1\"\nurl = \"not a url\"\nweight = 0\n\n[[nodes]]\nname = \"gpu2\"\nurl = \"http://127.0.0.1:1\"\n";
    let bad = temp_file("two-bad-nodes", text);
    let (code, _, err) = run(&["config", "check", bad.to_str().unwrap_or_default()]);
    assert_eq!(code, 2, "{err}");
    let problem = |path: &str| err.lines().find(|l| l.contains(&format!(" {path}: "))).map(str::to_string);
    assert!(problem("nodes[0].url").is_some_and(|l| l.contains("line 3:")), "nodes[0].url at line 3:\n{err}");
    assert!(problem("nodes[1].url").is_some_and(|l| l.contains("line 7:")), "nodes[1].url at line 7:\n{err}");
    assert!(problem("nodes[1].weight").is_some_and(|l| l.contains("line 8:")), "nodes[1].weight at line 8:\n{err}");
    assert!(!err.contains("nodes[2]"), "the good node is not blamed:\n{err}");
    assert_eq!(err.matches("nodes[0]").count(), 1, "one problem in nodes[0]:\n{err}");
}

#[test]
fn serve_refuses_a_broken_config_with_exit_2() {
    let bad = temp_file("serve-bad", "[[nodes]]\nname = \"a\"\nurl = \"http://127.0.0.1:1\"\nwieght = 2\n");
    let (code, _, err) = run(&["serve", "--config", bad.to_str().unwrap_or_default()]);
    assert_eq!(code, 2);
    assert!(err.contains("wieght") && err.contains("line 4"), "{err}");
}

#[test]
fn serve_fails_clearly_when_its_port_is_taken() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr");
    let cfg = temp_file("taken", &format!("[[listeners]]\naddr = \"{addr}\"\n\n[admin]\naddr = \"127.0.0.1:0\"\n"));
    let (code, _, err) = run(&["serve", "--config", cfg.to_str().unwrap_or_default()]);
    assert_eq!(code, 1);
    assert!(err.contains(&addr.to_string()) && err.contains("cannot listen"), "{err}");
}

#[test]
fn usage_errors_exit_2_and_help_names_every_command() {
    let (code, _, _) = run(&["serve", "--no-such-flag"]);
    assert_eq!(code, 2);
    let (code, out, _) = run(&["help"]);
    assert_eq!(code, 0);
    for cmd in ["serve", "demo", "sim", "config", "drill"] {
        assert!(out.contains(cmd), "help lists {cmd}:\n{out}");
    }
    let (code, out, _) = run(&["help", "sim"]);
    assert_eq!(code, 0);
    for flag in ["--port", "--models", "--tps", "--ttft-ms", "--parallel", "--nodes"] {
        assert!(out.contains(flag), "help sim names {flag}:\n{out}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn demo_starts_and_serves() {
    // Port 0: a port found free and released here could be taken by a parallel test before the
    // demo binds it (seen once in CI).
    let db = std::env::temp_dir().join(format!("corral-cli-{}-demo.db", std::process::id()));
    let demo = Proc::spawn(&["demo", "--port", "0", "--admin-port", "0", "--db", db.to_str().unwrap_or_default()]);
    let nodes: Vec<String> = ["node sim-a", "node sim-b", "node sim-c"].iter().map(|n| demo.url(n)).collect();
    let base = demo.url("Ollama API:");
    let tags: Value = reqwest::get(format!("{base}/api/tags")).await.expect("answer").json().await.expect("json");
    assert!(tags["models"].as_array().is_some_and(|m| m.len() >= 3), "{tags}");
    let r = reqwest::Client::new()
        .post(format!("{base}/api/generate"))
        .json(&json!({"model": "qwen2.5:7b", "prompt": "hi", "stream": false, "options": {"num_predict": 3}}))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), 200);
    let node = r.headers()["x-corral-node"].to_str().unwrap_or_default().to_string();
    assert!(node == "sim-a" || node == "sim-c", "only nodes with qwen2.5 serve it, got {node}");

    // The demo's cloud: with every node down, `public` falls back, `private` does not.
    let client = reqwest::Client::new();
    for n in &nodes {
        let r = client.post(format!("{n}/_sim/down")).body(r#"{"for_ms": 30000}"#).send().await.expect("control");
        assert!(r.status().is_success());
    }
    let chat = json!({"model": "llama3.2", "stream": false, "messages": [{"role": "user", "content": "hi"}]});
    let r = client
        .post(format!("{base}/api/chat"))
        .header("x-corral-category", "public")
        .json(&chat)
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-corral-fallback"], "cloud-sim");
    let r = client
        .post(format!("{base}/api/chat"))
        .header("x-corral-category", "private")
        .json(&chat)
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), 503);
    assert_eq!(r.json::<Value>().await.expect("json")["code"], "cloud_not_allowed");
}

#[tokio::test(flavor = "multi_thread")]
async fn models_pull_lands_on_the_named_nodes_only() {
    let sims: Vec<Proc> = (0..3).map(|_| Proc::spawn(&["sim", "--port", "0", "--tps", "200"])).collect();
    let urls: Vec<String> = sims.iter().map(|s| s.url("simulated Ollama node on")).collect();
    let cfg = temp_file("pull", &config_for("pull", &urls));
    let serve = Proc::spawn(&["serve", "--config", cfg.to_str().unwrap_or_default()]);
    let base = serve.url("serving the Ollama API on");
    let (code, out, err) = tokio::task::spawn_blocking({
        let base = base.clone();
        move || run(&["models", "--url", &base, "pull", "qwen3:4b", "--nodes", "gpu0,gpu2"])
    })
    .await
    .expect("join");
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("qwen3:4b is on: gpu0, gpu2"), "{out}");
    let (code, table, _) = tokio::task::spawn_blocking(move || run(&["models", "--url", &base])).await.expect("join");
    assert_eq!(code, 0);
    let rows: Vec<&str> = table.lines().filter(|l| l.starts_with("qwen3:4b")).collect();
    assert_eq!(rows.len(), 2, "{table}");
    assert!(rows.iter().any(|r| r.contains("gpu0")) && rows.iter().any(|r| r.contains("gpu2")), "{table}");
    for (i, url) in urls.iter().enumerate() {
        let tags: Value = reqwest::get(format!("{url}/api/tags")).await.expect("sim").json().await.expect("json");
        let has = tags["models"].as_array().is_some_and(|m| m.iter().any(|e| e["name"] == "qwen3:4b"));
        assert_eq!(has, i != 1, "gpu{i} has the model: {has}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn bench_history_and_metrics_agree() {
    let sims: Vec<Proc> =
        (0..2).map(|_| Proc::spawn(&["sim", "--port", "0", "--tps", "0", "--ttft-ms", "0"])).collect();
    let urls: Vec<String> = sims.iter().map(|s| s.url("simulated Ollama node on")).collect();
    let cfg_text = config_for("agree", &urls);
    let db = cfg_text
        .lines()
        .find(|l| l.starts_with("path = "))
        .map(|l| l.trim_start_matches("path = ").trim_matches('"').to_string())
        .unwrap_or_default();
    let _ = std::fs::remove_file(&db);
    let cfg = temp_file("agree", &cfg_text);
    let serve = Proc::spawn(&["serve", "--config", cfg.to_str().unwrap_or_default()]);
    let base = serve.url("serving the Ollama API on");
    let admin_line = serve.wait_for("Admin API on");
    let admin = admin_line.split_whitespace().find(|w| w.starts_with("http://")).unwrap_or_default().to_string();
    let token = admin_line.rsplit("token: ").next().unwrap_or_default().trim_end_matches(')').to_string();
    let out_dir = std::env::temp_dir().join(format!("corral-cli-{}-benchout", std::process::id()));
    let (code, out, err) = tokio::task::spawn_blocking({
        let (base, out_dir) = (base.clone(), out_dir.clone());
        move || {
            run(&[
                "bench",
                "--url",
                &base,
                "--concurrency",
                "1,4",
                "--requests",
                "30",
                "--out",
                out_dir.to_str().unwrap_or_default(),
            ])
        }
    })
    .await
    .expect("join");
    assert_eq!(code, 0, "{out}{err}");
    let row = out.lines().find(|l| l.starts_with("| A ") && l.split('|').nth(2).is_some_and(|c| c.trim() == "4"));
    let cells: Vec<&str> = row.unwrap_or_default().split('|').map(str::trim).collect();
    assert_eq!(cells.get(3..5), Some(&["30", "0"][..]), "30 requests at c=4, none failed:\n{out}");
    assert!(out_dir.join("results.md").exists() && out_dir.join("bench.png").exists());

    // Metrics count per node and outcome.
    let client = reqwest::Client::new();
    let metrics = client
        .get(format!("{admin}/metrics"))
        .bearer_auth(&token)
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    let mut from_metrics = std::collections::BTreeMap::new();
    for line in metrics.lines().filter(|l| l.starts_with("corral_requests_total{")) {
        let node = line.split("node=\"").nth(1).and_then(|s| s.split('"').next()).unwrap_or_default().to_string();
        let outcome = line.split("outcome=\"").nth(1).and_then(|s| s.split('"').next()).unwrap_or_default().to_string();
        let n: f64 = line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
        *from_metrics.entry((node, outcome)).or_insert(0.0) += n;
    }
    // The store, through the CLI, after the writer flushed (it batches within milliseconds).
    let mut from_history = std::collections::BTreeMap::new();
    for _ in 0..100 {
        let db = db.clone();
        let (code, json_out, _) = tokio::task::spawn_blocking(move || {
            run(&["history", "--db", &db, "--since", "1h", "--limit", "10000", "--format", "json"])
        })
        .await
        .expect("join");
        assert_eq!(code, 0);
        let rows: Vec<Value> = serde_json::from_str(&json_out).expect("json");
        from_history.clear();
        for r in &rows {
            let node = r["node"].as_str().unwrap_or("none").to_string();
            *from_history.entry((node, r["status"].as_str().unwrap_or_default().to_string())).or_insert(0.0) += 1.0;
        }
        if from_history == from_metrics {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(from_history, from_metrics, "history and /metrics agree per node and outcome");
    assert_eq!(from_history.values().sum::<f64>(), 60.0);

    let png = std::env::temp_dir().join(format!("corral-cli-{}-report.png", std::process::id()));
    let (code, out, err) = tokio::task::spawn_blocking({
        let (db, png) = (db.clone(), png.clone());
        move || run(&["report", "--db", &db, "--since", "1h", "--out", png.to_str().unwrap_or_default()])
    })
    .await
    .expect("join");
    assert_eq!(code, 0, "{out}{err}");
    let bytes = std::fs::read(&png).expect("report written");
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "a PNG file");
}

#[test]
fn config_export_and_import_share_a_setup_without_losing_anything() {
    let mine = temp_file("mine", "[[nodes]]\nname = \"gpu0\"\nurl = \"http://127.0.0.1:11434\"\n\n[[nodes]]\nname = \"old\"\nurl = \"http://127.0.0.1:11435\"\n");
    let theirs = temp_file(
        "theirs",
        "[[nodes]]\nname = \"gpu0\"\nurl = \"http://127.0.0.1:11434\"\nweight = 3\n\n[[nodes]]\nname = \"gpu9\"\nurl = \"http://10.0.0.9:11434\"\n\n[[providers]]\nname = \"openai\"\nbase_url = \"https://api.openai.com/v1\"\nsecret = \"openai-key\"\n",
    );
    let (mine_s, theirs_s) = (mine.to_str().unwrap_or_default(), theirs.to_str().unwrap_or_default());
    let before = std::fs::read_to_string(&mine).expect("read");

    let (code, out, err) = run(&["config", "import", theirs_s, "--config", mine_s, "--dry-run"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("+ node gpu9 (added)") && out.contains("~ node gpu0 (changed)"), "{out}");
    assert!(out.contains("openai-key"), "names the secrets it needs: {out}");
    assert_eq!(std::fs::read_to_string(&mine).expect("read"), before, "a dry run writes nothing");

    let bad = temp_file("bad-import", "[[nodes]\nname = \"x\"\n");
    let (code, _, err) = run(&["config", "import", bad.to_str().unwrap_or_default(), "--config", mine_s]);
    assert_eq!(code, 2);
    assert!(err.contains("line 1") && err.contains("nothing was changed"), "{err}");
    assert_eq!(std::fs::read_to_string(&mine).expect("read"), before, "a broken file changes nothing");

    let (code, out, _) = run(&["config", "import", theirs_s, "--config", mine_s, "--merge"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("node:gpu9:added"), "a new node is held back until accepted: {out}");
    let held = corral::Config::load(&mine).expect("still valid");
    assert!(held.nodes.iter().all(|n| n.name != "gpu9"), "{out}");
    let (code, out, _) =
        run(&["config", "import", theirs_s, "--config", mine_s, "--merge", "--accept-trust-changes=node:gpu9:added"]);
    assert_eq!(code, 0, "{out}");
    let merged = corral::Config::load(&mine).expect("still valid");
    let names: Vec<&str> = merged.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, vec!["gpu0", "old", "gpu9"]);
    assert_eq!(merged.nodes[0].weight, 3);

    let (code, out, _) = run(&["config", "import", theirs_s, "--config", mine_s, "--replace"]);
    assert_eq!(code, 0);
    assert!(out.contains("- node old (removed)"), "{out}");

    let (code, exported, _) = run(&["config", "export", "--config", mine_s]);
    assert_eq!(code, 0);
    assert!(exported.contains("Secrets are never included") && exported.contains("secret = \"openai-key\""));
    let back = corral::Config::parse(&exported).expect("an export is a valid config");
    assert_eq!(back, corral::Config::load(&mine).expect("valid"));
}

#[test]
fn config_check_warns_about_a_listener_open_to_the_network_without_keys() {
    let open = temp_file("open", "[[listeners]]\naddr = \"0.0.0.0:11400\"\n");
    let (code, out, err) = run(&["config", "check", open.to_str().unwrap_or_default()]);
    assert_eq!(code, 0, "valid, so it passes: {err}");
    assert!(out.contains("warning: listeners[0].addr") && out.contains("api_keys"), "{out}");
    let keyed = temp_file("keyed", "[[listeners]]\naddr = \"0.0.0.0:11400\"\napi_keys = [\"client-a\"]\n");
    let (_, out, _) = run(&["config", "check", keyed.to_str().unwrap_or_default()]);
    assert!(!out.contains("warning: listeners"), "keys given: no warning\n{out}");
}

#[test]
fn a_weak_admin_token_is_refused_at_start() {
    let cfg = temp_file(
        "weak",
        "[[listeners]]\naddr = \"127.0.0.1:0\"\n\n[admin]\naddr = \"127.0.0.1:0\"\n\n[store]\nenabled = false\n",
    );
    for weak in ["x", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"] {
        let out = Command::new(BIN)
            .args(["serve", "--config", cfg.to_str().unwrap_or_default()])
            .env("CORRAL_ADMIN_TOKEN", weak)
            .output()
            .expect("corral runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "token {weak:?} is refused: {err}");
        assert!(err.contains("admin token is too weak"), "{err}");
    }
}

#[test]
fn config_import_edits_the_file_in_place_keeping_comments() {
    let mine = temp_file(
        "mine",
        "# the team's cluster\n[[nodes]]\nname = \"gpu0\" # big box\nurl = \"http://127.0.0.1:11434\"\n",
    );
    let shared = temp_file("shared-node", "[[nodes]]\nname = \"gpu1\"\nurl = \"http://127.0.0.1:11435\"\n");
    let (shared, mine_s) = (shared.to_str().unwrap_or_default(), mine.to_str().unwrap_or_default());
    let (code, out, err) = run(&["config", "import", shared, "--config", mine_s, "--accept-trust-changes"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let text = std::fs::read_to_string(&mine).expect("read");
    assert!(text.contains("# the team's cluster") && text.contains("# big box"), "comments stay:\n{text}");
    assert!(text.contains("gpu1"), "the node is added:\n{text}");
    assert!(text.lines().count() <= 10, "4 lines become a few more, not 85:\n{text}");
}

#[test]
fn completions_are_generated_for_each_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let (code, out, err) = run(&["completions", shell]);
        assert_eq!(code, 0, "{shell}: {err}");
        assert!(out.contains("corral") && out.contains("serve") && out.contains("secret"), "{shell}: {out}");
    }
    let (code, _, _) = run(&["completions", "tcsh-9000"]);
    assert_eq!(code, 2, "an unknown shell is a usage error");
}

#[test]
fn status_shows_nodes_and_where_to_point_clients() {
    let token = "status-test-token-31415926535897932";
    let sim = Proc::spawn(&["sim", "--port", "0"]);
    let node = sim.url("simulated Ollama node on");
    let cfg =
        temp_file("status", &format!("[[nodes]]\nname = \"gpu0\"\nurl = \"{node}\"\n\n[store]\nenabled = false\n"));
    let serve = Proc::spawn_env(
        &["serve", "--config", cfg.to_str().unwrap_or_default(), "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"],
        &[("CORRAL_ADMIN_TOKEN", token)],
    );
    let proxy = serve.url("serving the Ollama API on");
    let admin = serve.url("Admin API on");
    let out = Command::new(BIN)
        .args(["status", "--url", &admin])
        .env("CORRAL_ADMIN_TOKEN", token)
        .output()
        .expect("corral runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains(&format!("Point clients at: {proxy}")), "--listen took effect and is shown:\n{text}");
    assert!(text.contains("gpu0"), "{text}");
    let refused = Command::new(BIN)
        .args(["status", "--url", &admin])
        .env("CORRAL_ADMIN_TOKEN", "wrong-token-wrong-token-wrong-token")
        .output()
        .expect("corral runs");
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("401"));
}

#[tokio::test(flavor = "multi_thread")]
async fn drill_against_the_demo_prints_a_table_per_category() {
    let token = "drill-test-token-27182818284590452";
    let db = std::env::temp_dir().join(format!("corral-cli-{}-drill.db", std::process::id()));
    let demo = Proc::spawn_env(
        &["demo", "--port", "0", "--admin-port", "0", "--db", db.to_str().unwrap_or_default()],
        &[("CORRAL_ADMIN_TOKEN", token)],
    );
    let admin = demo.url("Admin API:");
    // The drill picks each category's model from the nodes' lists: wait for the first deep probe.
    let client = reqwest::Client::new();
    let mut known = false;
    for _ in 0..100 {
        let nodes: Value = client
            .get(format!("{admin}/admin/nodes"))
            .bearer_auth(token)
            .send()
            .await
            .expect("admin answers")
            .json()
            .await
            .expect("json");
        known = nodes.as_array().is_some_and(|ns| ns.iter().all(|n| n["models"].is_array()));
        if known {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(known, "the demo's nodes report their models");
    let drill = |args: Vec<String>| {
        tokio::task::spawn_blocking(move || {
            let out = Command::new(BIN).args(&args).env("CORRAL_ADMIN_TOKEN", token).output().expect("corral runs");
            let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
            (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
        })
    };
    let args =
        |extra: &[&str]| [&["drill", "--url", admin.as_str()], extra].concat().iter().map(|s| s.to_string()).collect();
    let (code, out, err) = drill(args(&["--node", "sim-a"])).await.expect("join");
    assert_eq!(code, 0, "the drill ran:\n{out}{err}");
    assert!(out.contains("took sim-a out (drain)"), "{out}");
    for category in ["default", "public", "private"] {
        assert!(out.contains(&format!("category {category} (model")), "a table for {category}:\n{out}");
        assert!(out.contains(&format!("  {category}: 3/3 served")), "a summary for {category}:\n{out}");
    }
    assert_eq!(out.matches("#  status  served by").count(), 3, "one table head per category:\n{out}");
    let rows: Vec<&str> = out.lines().filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit())).collect();
    assert_eq!(rows.len(), 9, "three rows per category:\n{out}");
    assert!(rows.iter().all(|r| !r.contains("sim-a")), "the node taken out served nothing:\n{out}");
    let (code, _, err) = drill(args(&["--node", "nope"])).await.expect("join");
    assert_eq!(code, 2, "an unknown node is a usage error: {err}");
    assert!(err.contains("nope") && err.contains("not_found"), "{err}");
}

#[test]
fn status_tells_each_nodes_state_with_its_reason_and_since() {
    let token = "status-reason-token-27182818284590452";
    let sims: Vec<Proc> = (0..2).map(|_| Proc::spawn(&["sim", "--port", "0"])).collect();
    let urls: Vec<String> = sims.iter().map(|s| s.url("simulated Ollama node on")).collect();
    let mut text = config_for("status-reason", &urls);
    text = text.replace("[health]\ninterval_ms = 200\n", "[health]\ninterval_ms = 100\nfailures_to_down = 1\n");
    let cfg = temp_file("status-reason", &text);
    let serve =
        Proc::spawn_env(&["serve", "--config", cfg.to_str().unwrap_or_default()], &[("CORRAL_ADMIN_TOKEN", token)]);
    let admin = serve.url("Admin API on");
    let mut sims = sims;
    sims[1].kill();
    // The broker logs each health flip; wait for gpu1's.
    loop {
        let line = serve.wait_for("node health changed");
        if line.contains("gpu1") && line.contains("unhealthy") {
            break;
        }
    }
    let out = Command::new(BIN)
        .args(["status", "--url", &admin])
        .env("CORRAL_ADMIN_TOKEN", token)
        .output()
        .expect("corral runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("down since"))
        .unwrap_or_else(|| panic!("no 'down since' line:\n{text}"));
    assert!(
        line.contains(&format!("connection refused at {}", urls[1])),
        "the reason names the cause and the address:\n{text}"
    );
    assert!(line.contains(" UTC (") && line.contains(" s)"), "since when, and for how long:\n{text}");
    assert!(text.contains("healthy since "), "the live node says since when too:\n{text}");
}

#[test]
fn bench_says_when_nothing_answers_and_sends_no_load() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = closed.local_addr().expect("addr").port();
    drop(closed);
    let (code, out, err) =
        run(&["bench", "--url", &format!("http://127.0.0.1:{port}"), "--requests", "5", "--concurrency", "1"]);
    assert_eq!(code, 1, "a runtime failure, as CONTRACT.md says: {out}{err}");
    assert!(err.contains(&format!("connection refused at http://127.0.0.1:{port}")), "{err}");
    assert!(!out.contains("| A"), "no table of failures: {out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn bench_exits_non_zero_when_more_than_the_allowed_share_failed() {
    let sim = SimNode::start(SimSpec::default()).await.expect("sim");
    let url = sim.url();
    // Every inference answers 500; /api/version still answers, so the load runs.
    sim.set_faults(Faults::statuses(500, 1_000));
    let args = |max: &'static str| {
        let url = url.clone();
        move || run(&["bench", "--url", &url, "--requests", "4", "--concurrency", "2", "--max-failed", max])
    };
    let (code, out, err) = tokio::task::spawn_blocking(args("0.5")).await.expect("join");
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains("4 of 4 request(s) failed (100.0 %)"), "{err}");
    let (code, _, err) = tokio::task::spawn_blocking(args("1")).await.expect("join");
    assert_eq!(code, 0, "every failure allowed: {err}");
    let (code, _, err) = run(&["bench", "--url", &url, "--max-failed", "5"]);
    assert_eq!(code, 2, "a share above 1 is refused: {err}");
}

#[test]
fn logs_carry_no_colour_codes_when_stderr_is_not_a_terminal() {
    // Without NO_COLOR: only the terminal check keeps escape codes out of a captured stderr.
    let out = Command::new(BIN)
        .args(["config", "check", "/nonexistent/corral.toml"])
        .env_remove("NO_COLOR")
        .env("CORRAL_LOG", "debug")
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains('\u{1b}'), "no ANSI escapes in {err:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_broker_without_a_config_file_saves_what_it_runs_as_this_machines_config_and_keeps_it_after() {
    let home = std::env::temp_dir().join(format!("corral-cli-{}-saveas", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    std::fs::create_dir_all(&home).expect("home");
    let token = "save-as-token-0123456789abcdef0123";
    let serve = Proc::spawn_env(
        &["serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"],
        &[
            ("XDG_CONFIG_HOME", home.to_str().unwrap_or_default()),
            ("XDG_DATA_HOME", home.to_str().unwrap_or_default()),
            ("CORRAL_ADMIN_TOKEN", token),
        ],
    );
    let admin = serve.url("Admin API on");
    let client = reqwest::Client::new();
    let status: Value = client
        .get(format!("{admin}/admin/status"))
        .bearer_auth(token)
        .send()
        .await
        .expect("status")
        .json()
        .await
        .expect("json");
    assert_eq!(status["connect"]["config_file"], Value::Null, "no file yet: {}", status["connect"]);
    let r = client.post(format!("{admin}/admin/config/save")).bearer_auth(token).send().await.expect("save");
    assert_eq!(r.status(), 200);
    let saved: Value = r.json().await.expect("json");
    let path = home.join("corral").join("corral.toml");
    assert_eq!(saved["saved_to"], path.display().to_string());
    assert!(corral::Config::load(&path).is_ok(), "a valid config was written");
    // From now on an edit goes into the file.
    let r = client
        .put(format!("{admin}/admin/settings"))
        .bearer_auth(token)
        .json(&json!({"retry": {"max_attempts": 5}}))
        .send()
        .await
        .expect("edit");
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    assert_eq!(corral::Config::load(&path).expect("valid").retry.max_attempts, 5, "the edit is in the file");
    // A second save says where it already goes; an existing file is never overwritten.
    let again: Value = client
        .post(format!("{admin}/admin/config/save"))
        .bearer_auth(token)
        .send()
        .await
        .expect("save")
        .json()
        .await
        .expect("json");
    assert_eq!(again["new"], false);
    drop(serve);
    let before = std::fs::read_to_string(&path).expect("read");
    let demo = Proc::spawn_env(
        &["serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"],
        &[("XDG_CONFIG_HOME", home.to_str().unwrap_or_default()), ("CORRAL_ADMIN_TOKEN", token)],
    );
    let admin = demo.url("Admin API on");
    let r = client.post(format!("{admin}/admin/config/save")).bearer_auth(token).send().await.expect("save");
    // The next start without --config reads the saved file (the default path) and saves there.
    assert_eq!(r.status(), 200);
    let again: Value = r.json().await.expect("json");
    assert_eq!((again["saved_to"].as_str(), again["new"].as_bool()), (path.to_str(), Some(false)));
    assert_eq!(std::fs::read_to_string(&path).expect("read"), before, "saving again rewrote nothing");
}

#[tokio::test(flavor = "multi_thread")]
async fn history_right_after_the_demo_reads_the_demos_store() {
    let home = std::env::temp_dir().join(format!("corral-cli-{}-demohistory", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    std::fs::create_dir_all(&home).expect("home");
    let env =
        [("XDG_DATA_HOME", home.to_str().unwrap_or_default()), ("XDG_CONFIG_HOME", home.to_str().unwrap_or_default())];
    let demo = Proc::spawn_env(&["demo", "--port", "0", "--admin-port", "0", "--nodes", "1"], &env);
    let base = demo.url("Ollama API:");
    let r = reqwest::Client::new()
        .post(format!("{base}/api/generate"))
        .header("x-request-id", "after-the-demo-1")
        .json(&json!({"model": "llama3.2", "prompt": "hi", "stream": false, "options": {"num_predict": 2}}))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), 200);
    let dir = home.display().to_string();
    let history = move || {
        let out = Command::new(BIN)
            .args(["history", "--format", "json"])
            .env("XDG_DATA_HOME", &dir)
            .env("XDG_CONFIG_HOME", &dir)
            .env("NO_COLOR", "1")
            .output();
        out.map(|o| (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned()))
    };
    // The writer batches off the request path: the row lands within a moment.
    let mut seen = (String::new(), String::new());
    for _ in 0..100 {
        seen = tokio::task::spawn_blocking(history.clone()).await.expect("join").expect("runs");
        if seen.0.contains("after-the-demo-1") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(seen.0.contains("after-the-demo-1"), "the demo's request is listed: {seen:?}");
    assert!(seen.1.contains("using the demo's store at"), "it says which store: {}", seen.1);
}
