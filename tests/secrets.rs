//! Secrets in the real OS keyring (Secret Service: gnome-keyring in CI).
//!
//! These need a running, unlocked Secret Service, so they are `#[ignore]`d in the plain run and
//! run by `scripts/test` inside `dbus-run-session` with gnome-keyring started
//! (`cargo test --test secrets -- --ignored`). A canary value checks that a secret never shows
//! up where it must not.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::cluster;
use corral::config::ProviderConfig;
use reqwest::Method;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_corral");

fn corral(args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("corral runs");
    if let Some(input) = stdin {
        child.stdin.take().expect("stdin").write_all(input.as_bytes()).expect("write stdin");
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().expect("exits");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
#[ignore = "needs a Secret Service: run by scripts/test inside dbus-run-session"]
fn keyring_cli_sets_lists_and_deletes_without_showing_values() {
    let canary = "sk-canary-cli-7f3a";
    let (code, out, err) = corral(&["secret", "set", "cli-test"], Some(&format!("{canary}\n")));
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains(canary) && !err.contains(canary));
    assert_eq!(corral::secrets::get("cli-test").expect("stored"), canary, "the newline is not part of the key");
    let (code, out, _) = corral(&["secret", "list"], None);
    assert_eq!(code, 0);
    assert!(out.lines().any(|l| l == "cli-test"), "{out}");
    assert!(!out.contains(canary), "list prints names only");
    let (code, _, _) = corral(&["secret", "delete", "cli-test"], None);
    assert_eq!(code, 0);
    let (code, _, err) = corral(&["secret", "delete", "cli-test"], None);
    assert_eq!(code, 1);
    assert!(err.contains("no secret named \"cli-test\""), "{err}");
    let (code, _, err) = corral(&["secret", "set", "Bad Name"], Some("x"));
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = corral(&["secret", "set", "empty"], Some("\n"));
    assert_eq!(code, 2, "{err}");
}

#[tokio::test]
#[ignore = "needs a Secret Service: run by scripts/test inside dbus-run-session"]
async fn keyring_admin_api_stores_values_it_never_returns() {
    let canary = "sk-canary-api-91bd";
    let c = cluster(1)
        .config(|cfg| {
            cfg.providers.push(ProviderConfig {
                name: "openai".into(),
                base_url: "https://api.openai.com/v1".into(),
                secret: "api-test".into(),
                ..ProviderConfig::default()
            })
        })
        .start()
        .await;
    let v: Value = c.admin(Method::GET, "/admin/secrets").send().await.expect("answer").json().await.expect("json");
    assert_eq!(v["needed"]["api-test"], "missing");
    let r = c.admin(Method::PUT, "/admin/secrets/api-test").body(canary).send().await.expect("answer");
    assert_eq!(r.status(), 204);
    let text = c.admin(Method::GET, "/admin/secrets").send().await.expect("answer").text().await.expect("text");
    let v: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(v["needed"]["api-test"], "set");
    assert!(!text.contains(canary));
    // The canary is nowhere a user or a log collector could see it.
    let _ = c.chat("llama3.2", false).await;
    for path in ["/help", "/admin/status", "/admin/config/export", "/metrics", "/admin/requests"] {
        let body = c.admin(Method::GET, path).send().await.expect("answer").text().await.expect("text");
        assert!(!body.contains(canary), "{path} leaks the secret");
    }
    let db = c.broker.config().store.path.clone().expect("test store path");
    let store = c.broker.shared().telemetry.store().expect("store on").clone();
    for _ in 0..500 {
        if !store.requests(&corral::store::Query::default()).await.expect("query").is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    for suffix in ["", "-wal"] {
        if let Ok(bytes) = std::fs::read(format!("{db}{suffix}")) {
            assert!(!bytes.windows(canary.len()).any(|w| w == canary.as_bytes()), "the store file leaks it");
        }
    }
    assert_eq!(corral::secrets::get("api-test").expect("stored"), canary);
    let r = c.admin(Method::DELETE, "/admin/secrets/api-test").send().await.expect("answer");
    assert_eq!(r.status(), 204);
    let r = c.admin(Method::DELETE, "/admin/secrets/api-test").send().await.expect("answer");
    assert_eq!(r.status(), 404);
    assert_eq!(r.json::<Value>().await.expect("json")["code"], "secret_not_found");
}

/// The issue's scenario, as a user runs it: a key stored with `corral secret set`, every node
/// down, a category that may fall back. The cloud sees that key, and only the cloud does.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a Secret Service: run by scripts/test inside dbus-run-session"]
async fn keyring_key_reaches_the_cloud_during_fallback_and_nowhere_else() {
    use common::process::Proc;
    let canary = "sk-canary-fallback-5c1e";
    let (code, _, err) = corral(&["secret", "set", "fallback-key"], Some(canary));
    assert_eq!(code, 0, "{err}");
    let cloud =
        Proc::spawn(&["sim", "--port", "0", "--cloud", "--api-key", canary, "--models", "gpt-4o-mini", "--tps", "0"]);
    let cloud_url = cloud.url("simulated Ollama node on");
    let dead = std::net::TcpListener::bind("127.0.0.1:0").expect("port").local_addr().expect("addr");
    let dir = std::env::temp_dir().join(format!("corral-keyring-fallback-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let db = dir.join("corral.db");
    let cfg = dir.join("corral.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"[[listeners]]
addr = "127.0.0.1:0"
[admin]
addr = "127.0.0.1:0"
[store]
path = "{db}"
[[nodes]]
name = "gpu0"
url = "http://{dead}"
[[categories]]
name = "default"
cloud = "on-failure"
providers = ["cloudsim"]
[[providers]]
name = "cloudsim"
base_url = "{cloud_url}/v1"
secret = "fallback-key"
model_map = {{ "llama3.2" = "gpt-4o-mini" }}
"#,
            db = db.display()
        ),
    )
    .expect("config");
    let serve = Proc::spawn_with(&["serve", "--config", cfg.to_str().unwrap_or_default()], "debug");
    let base = serve.url("serving the Ollama API on");
    let client = reqwest::Client::new();
    let r = client
        .post(format!("{base}/api/chat"))
        .json(&serde_json::json!({"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-corral-fallback"], "cloudsim");
    let text = r.text().await.expect("body");
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).expect("ndjson")).collect();
    assert!(lines.len() > 2, "streamed: {text}");
    assert_eq!(lines.last().map(|l| l["done"].clone()), Some(Value::Bool(true)));
    let seen: Value =
        client.get(format!("{cloud_url}/_sim/received")).send().await.expect("sim").json().await.expect("json");
    assert_eq!(seen[0]["bearer"], canary, "the cloud got the key stored with `corral secret set`");

    // Nowhere else: logs (at debug), the store file, an export.
    let (code, export, _) = corral(&["config", "export", "--config", cfg.to_str().unwrap_or_default()], None);
    assert_eq!(code, 0);
    assert!(export.contains("secret = \"fallback-key\"") && !export.contains(canary));
    let store_bytes = || -> Vec<u8> {
        ["", "-wal"]
            .iter()
            .flat_map(|suffix| std::fs::read(format!("{}{suffix}", db.display())).unwrap_or_default())
            .collect()
    };
    let mut rows = 0;
    for _ in 0..500 {
        rows = store_bytes().windows(8).filter(|w| w == b"cloudsim").count();
        if rows > 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(rows > 0, "the fallback row reached the store file");
    assert!(!store_bytes().windows(canary.len()).any(|w| w == canary.as_bytes()), "the store file leaks it");
    let mut lines = serve.lines_until("answered by a cloud provider");
    lines.extend(serve.lines_so_far());
    let logs = lines.join("\n");
    assert!(!logs.contains(canary), "the logs leak the key");
    let (code, _, _) = corral(&["secret", "delete", "fallback-key"], None);
    assert_eq!(code, 0);
}

/// A listener with `api_keys`: each client's key lives in the keyring; no key, a wrong key or a
/// deleted client's key gets 401 before anything is forwarded, and the key never reaches a node.
#[tokio::test]
#[ignore = "needs a Secret Service: run by scripts/test inside dbus-run-session"]
async fn keyring_client_keys_guard_a_remote_listener() {
    use corral::config::{ListenerConfig, Origin};
    corral::secrets::set("client-team-a", "key-team-a-0d41").expect("stored");
    let c = cluster(1)
        .config(|cfg| {
            cfg.listeners.push(ListenerConfig {
                addr: "127.0.0.1:0".into(),
                origin: Origin::Remote,
                api_keys: vec!["client-team-a".into(), "client-gone".into()],
                ..ListenerConfig::default()
            })
        })
        .start()
        .await;
    let remote = c.url_on(1, "/api/chat");
    let body =
        serde_json::json!({"model": "llama3.2", "stream": false, "messages": [{"role": "user", "content": "hi"}]});
    for key in [None, Some("wrong"), Some("")] {
        let mut req = c.client.post(&remote).json(&body);
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        let r = req.send().await.expect("answer");
        assert_eq!(r.status(), 401, "key {key:?}");
        assert_eq!(r.headers()["x-corral-forwarded"], "false");
        assert_eq!(r.json::<Value>().await.expect("json")["code"], "unauthorized");
    }
    assert_eq!(c.sims[0].inference_count(), 0, "nothing reached the node");
    let r = c.client.post(&remote).bearer_auth("key-team-a-0d41").json(&body).send().await.expect("answer");
    assert_eq!(r.status(), 200);
    let seen = c.sims[0].received();
    assert!(seen.iter().all(|r| r.bearer.is_none()), "the client's key stays with Corral: {seen:?}");
    // The local listener has no keys: it answers as before.
    assert_eq!(c.chat("llama3.2", false).await.status(), 200);
    // Keys are live: revoking one stops it within a second, adding one starts it, no restart.
    corral::secrets::delete("client-team-a").expect("deleted");
    let status = |key: &'static str| {
        let req = c.client.post(&remote).bearer_auth(key).json(&body);
        async move { req.send().await.map(|r| r.status().as_u16()).unwrap_or(0) }
    };
    let started = tokio::time::Instant::now();
    while status("key-team-a-0d41").await != 401 {
        assert!(started.elapsed() < std::time::Duration::from_secs(3), "a deleted key still works after 3 s");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    println!("revoked key refused after {} ms", started.elapsed().as_millis());
    corral::secrets::set("client-gone", "key-gone-77aa").expect("stored");
    let started = tokio::time::Instant::now();
    while status("key-gone-77aa").await != 200 {
        assert!(started.elapsed() < std::time::Duration::from_secs(3), "an added key is not accepted after 3 s");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    println!("added key accepted after {} ms", started.elapsed().as_millis());
    corral::secrets::delete("client-gone").expect("deleted");
}
