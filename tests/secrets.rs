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
