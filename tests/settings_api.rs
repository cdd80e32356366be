//! `/admin/settings` and `/admin/client-keys` against a running broker: settings apply and are
//! written into the config file with its comments, keys bound at start are saved and named as
//! waiting for a restart (never pretended), every bad key is named, and client keys are shown
//! once and revoked. Secrets live in this process's memory (`secrets::use_memory_store`).

mod common;

use reqwest::Method;
use serde_json::{json, Value};

async fn put(c: &common::Cluster, body: Value) -> (u16, Value) {
    let r = c.admin(Method::PUT, "/admin/settings").json(&body).send().await.expect("admin answers");
    (r.status().as_u16(), r.json().await.expect("json"))
}

fn problems(v: &Value) -> Vec<String> {
    v["problems"]
        .as_array()
        .map(|a| a.iter().filter_map(|p| p.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn tuning_applies_at_once_and_every_bad_key_is_named_with_nothing_applied() {
    let c = common::cluster(1).start().await;
    let (status, body) =
        put(&c, json!({ "health": { "interval_ms": 500 }, "breaker": { "failures_to_open": 3 } })).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["saved_to"], Value::Null, "no config file: applied, not saved");
    assert_eq!(body["restart_needed"], json!([]));
    let config = c.broker.shared().config();
    assert_eq!((config.health.interval_ms, config.breaker.failures_to_open), (500, 3), "in force now");

    let bad = json!({ "retry": { "max_attempts": "two", "nope": 1 }, "queue": { "max_requests": 0 }, "health": { "interval_ms": 900 } });
    let (status, body) = put(&c, bad).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["code"], "invalid_config");
    let said = problems(&body);
    assert!(said.contains(&"retry.max_attempts: must be a whole number, 0 or more".to_string()), "{said:?}");
    assert!(said.contains(&"retry.nope: is not a setting of this section".to_string()), "{said:?}");
    assert_eq!(c.broker.shared().config().health.interval_ms, 500, "a refused change applies nothing");
    let (status, body) = put(&c, json!({ "queue": { "max_requests": 0 } })).await;
    assert_eq!((status, problems(&body)), (400, vec!["queue.max_requests: must be greater than 0".to_string()]));
    let (status, body) = put(&c, json!({ "listeners": [{ "addr": "0.0.0.0:0" }] })).await;
    assert_eq!(status, 400, "an address cannot be kept without a file: {body}");
    assert!(problems(&body)[0].starts_with("listeners[0].addr: this broker runs without a config file"), "{body}");
    assert!(problems(&body)[0].contains("--listen ADDR"), "{body}");
}

#[tokio::test]
async fn addresses_and_client_keys_go_into_the_file_and_wait_for_a_restart() {
    assert!(corral::secrets::use_memory_store(), "tests never touch the real keyring");
    let c = common::cluster(1).start().await;
    let dir = std::env::temp_dir().join(format!("corral-settings-api-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("corral.toml");
    let text = format!("# my cluster: keep this comment\n{}", c.broker.shared().config().to_toml());
    std::fs::write(&path, text).expect("write config");
    c.broker.shared().set_config_file(path.clone());
    let bound = c.broker.proxy_addr().to_string();

    let (status, body) = put(&c, json!({ "listeners": [{ "addr": "0.0.0.0:0", "allowed_origins": ["https://chat.example"] }], "retry": { "max_attempts": 2 } })).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["saved_to"], path.display().to_string());
    assert_eq!(body["restart_needed"], json!(["listeners"]), "the socket does not move until a restart");
    assert_eq!(body["listeners"][0]["addr"], "0.0.0.0:0", "the next start's address");
    assert_eq!(body["listeners"][0]["bound"], format!("http://{bound}"), "still bound where it was");
    assert_eq!(body["listeners"][0]["exposed"], true);
    assert!(body["pending_restart"].as_array().is_some_and(|p| p.contains(&json!("listeners"))), "{body}");
    assert_eq!(c.broker.shared().config().listeners[0].addr, "127.0.0.1:0", "the running config keeps the bound one");
    let file = std::fs::read_to_string(&path).expect("read config");
    assert!(file.starts_with("# my cluster: keep this comment\n"), "{file}");
    assert!(file.contains("addr = \"0.0.0.0:0\"") && file.contains("max_attempts = 2"), "{file}");

    let r =
        c.admin(Method::POST, "/admin/client-keys").json(&json!({ "name": "team-a" })).send().await.expect("answers");
    assert_eq!(r.status(), 201);
    let made: Value = r.json().await.expect("json");
    let key = made["key"].as_str().unwrap_or_default().to_string();
    assert!(key.starts_with("ck-") && key.len() == 67, "{made}");
    assert_eq!(made["restart_needed"], true, "the bound listener asks for no key until a restart");
    assert_eq!(corral::secrets::client_key("team-a").ok().as_deref(), Some(key.as_str()), "stored as a client key");
    assert!(std::fs::read_to_string(&path).expect("read").contains("api_keys = [\"team-a\"]"));
    let r =
        c.admin(Method::POST, "/admin/client-keys").json(&json!({ "name": "team-a" })).send().await.expect("answers");
    assert_eq!(r.status(), 409, "a name is taken once");
    let listed = c.admin(Method::GET, "/admin/settings").send().await.expect("answers").text().await.expect("text");
    assert!(listed.contains("team-a") && !listed.contains(&key), "names, never values: {listed}");

    let r = c.admin(Method::DELETE, "/admin/client-keys/team-a").send().await.expect("answers");
    assert_eq!(r.status(), 200);
    let gone: Value = r.json().await.expect("json");
    assert_eq!(gone["kept_on"], json!([0]), "the listener's only key name stays, so it stays closed");
    assert!(corral::secrets::client_key("team-a").is_err(), "the value left the keyring");
    let r = c.admin(Method::DELETE, "/admin/client-keys/nobody").send().await.expect("answers");
    assert_eq!(r.status(), 404);
    let _ = std::fs::remove_dir_all(&dir);
}
