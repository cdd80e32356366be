//! Issue 12, finding 1: secrets have owners. A provider may name only a provider key, and a
//! provider key goes only to the origin it was stored for. The attacker's tools are a shared
//! config file (merge import through the admin API) and a listener of their own on loopback
//! that records the `Authorization` header it receives.
//!
//! These run without a Secret Service: `secrets::use_memory_store()` puts this process's
//! keyring in memory (the same code paths over a map). Each test uses its own names.

mod common;

use common::{cluster, TOKEN};
use corral::config::{CloudPermission, ListenerConfig, Origin, ProviderConfig};
use corral::sim::{SimNode, SimSpec};
use reqwest::Method;
use serde_json::{json, Value};

async fn listener() -> SimNode {
    let spec = SimSpec { models: vec!["gpt-4o-mini".into()], cloud: true, ..SimSpec::default() };
    SimNode::start(spec).await.expect("the attacker's listener starts")
}

fn memory_keyring() {
    assert!(corral::secrets::use_memory_store(), "tests never touch the real keyring");
}

fn hostile(provider: &str, url: &str, secret: &str) -> String {
    format!(
        "[[categories]]\nname = \"default\"\ncloud = \"on-failure\"\nproviders = [\"{provider}\"]\n\n[[providers]]\nname = \"{provider}\"\nbase_url = \"{url}/v1\"\nsecret = \"{secret}\"\nmodel_map = {{ \"*\" = \"gpt-4o-mini\" }}\n"
    )
}

/// Every Authorization value the listener saw.
fn bearers(sim: &SimNode) -> Vec<String> {
    sim.received().into_iter().filter_map(|r| r.bearer).collect()
}

#[tokio::test]
async fn a_shared_file_naming_the_admin_token_or_a_client_key_as_a_provider_secret_is_refused() {
    memory_keyring();
    corral::secrets::set_client_key("trust-client-a", "client-canary-7c1d").expect("stored");
    let evil = listener().await;
    let c = cluster(1)
        .config(|cfg| {
            cfg.listeners.push(ListenerConfig {
                addr: "127.0.0.1:0".into(),
                origin: Origin::Remote,
                api_keys: vec!["trust-client-a".into()],
                ..ListenerConfig::default()
            })
        })
        .start()
        .await;
    for (secret, says) in [("admin-token", "internal admin token"), ("trust-client-a", "is a client key")] {
        let r = c
            .admin(Method::POST, "/admin/config/import?mode=merge&accept_all=true")
            .body(hostile("backup", &evil.url(), secret))
            .send()
            .await
            .expect("answer");
        assert_eq!(r.status(), 400, "a provider naming {secret} is refused even when every change is accepted");
        let v: Value = r.json().await.expect("json");
        assert_eq!(v["code"], "invalid_config");
        assert!(v["error"].as_str().is_some_and(|e| e.contains(says) && e.contains("providers[")), "{v}");
    }
    assert!(c.broker.config().providers.is_empty(), "the running config is untouched");
    c.sims[0].stop();
    let _ = c.chat("llama3.2", false).await;
    assert!(evil.received().is_empty(), "nothing reached the attacker");
    // Below validation, the keyring refuses too: a provider lookup never reads those entries.
    let url = format!("{}/v1", evil.url());
    for (name, code) in [("admin-token", "secret_wrong_purpose"), ("trust-client-a", "secret_wrong_purpose")] {
        let e = corral::secrets::provider_key(name, &url).expect_err("not a provider key");
        assert_eq!(e.code(), code, "{e}");
    }
}

#[tokio::test]
async fn a_provider_re_pointed_by_import_has_no_key_until_a_person_re_confirms_it() {
    memory_keyring();
    let canary = "sk-canary-trust-4e0b";
    let real = listener().await;
    let evil = listener().await;
    let real_url = format!("{}/v1", real.url());
    corral::secrets::set_provider_key("trust-openai", canary, std::slice::from_ref(&real_url)).expect("stored");
    let c = cluster(1)
        .config(move |cfg| {
            cfg.categories[0].cloud = CloudPermission::OnFailure;
            cfg.categories[0].providers = vec!["openai".into()];
            cfg.providers.push(ProviderConfig {
                name: "openai".into(),
                base_url: real_url,
                secret: "trust-openai".into(),
                model_map: [("*".to_string(), "gpt-4o-mini".to_string())].into(),
                ..ProviderConfig::default()
            });
        })
        .start()
        .await;
    c.sims[0].stop();
    assert_eq!(c.chat("llama3.2", false).await.status(), 200, "the real provider answers with its key");
    assert_eq!(bearers(&real), vec![canary.to_string()]);

    // The shared file moves the provider; the person even accepts every trust change.
    let file = format!("[[providers]]\nname = \"openai\"\nbase_url = \"{}/v1\"\n", evil.url());
    let preview: Value = c
        .admin(Method::POST, "/admin/config/import?mode=merge&dry_run=true")
        .body(file.clone())
        .send()
        .await
        .expect("answer")
        .json()
        .await
        .expect("json");
    let trust = preview["trust"].as_array().cloned().unwrap_or_default();
    assert!(
        trust.iter().any(|t| t["id"] == "provider:openai:base_url"
            && t["message"].as_str().is_some_and(|m| m.contains(&evil.url()) && m.contains("re-confirms"))),
        "the preview names the move in words: {preview}"
    );
    let r = c.admin(Method::POST, "/admin/config/import?mode=merge&accept_all=true").body(file).send().await;
    assert_eq!(r.expect("answer").status(), 200);
    let providers: Value =
        c.admin(Method::GET, "/admin/providers").send().await.expect("answer").json().await.expect("json");
    assert_eq!(providers[0]["secret_state"], "unbound", "{providers}");

    let r = c.chat("llama3.2", false).await;
    assert_ne!(r.status(), 200);
    let text = r.text().await.expect("body");
    assert!(text.contains("not bound to this origin") && text.contains("corral secret bind"), "{text}");
    assert!(evil.received().is_empty(), "the new origin received nothing, no Authorization header either");
    let test: Value =
        c.admin(Method::POST, "/admin/providers/openai/test").send().await.expect("answer").json().await.expect("json");
    assert_eq!(test["code"], "key_not_bound", "{test}");
    assert!(evil.received().is_empty(), "the test button sends no key there either");

    // A person confirms the new origin (the Providers screen's button): now the key goes there.
    let r = c.admin(Method::POST, "/admin/secrets/trust-openai/bind").json(&json!({"provider": "openai"})).send().await;
    assert_eq!(r.expect("answer").status(), 200);
    assert_eq!(c.chat("llama3.2", false).await.status(), 200);
    assert_eq!(bearers(&evil), vec![canary.to_string()], "only after the confirmation");
}

/// The canary: an echoing provider hands back whatever Authorization it got, in its error
/// text. Neither the client, the test button, nor the admin API shows the key, and the admin
/// token and client keys never leave as a provider's key.
#[tokio::test]
async fn canary_keys_never_come_back_through_an_echoing_provider() {
    memory_keyring();
    let canary = "sk-canary-echo-a91f0c";
    let echo = axum::Router::new().fallback(|headers: http::HeaderMap| async move {
        let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        let key = auth.trim_start_matches("Bearer ");
        (
            http::StatusCode::UNAUTHORIZED,
            axum::Json(json!({"error": {"message": format!("bad key {key} (sent as {auth}); prefix {}", &key[..key.len().min(10)])}})),
        )
    });
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}/v1", tcp.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(tcp, echo).await });
    corral::secrets::set_provider_key("trust-echo", canary, std::slice::from_ref(&url)).expect("stored");
    let c = cluster(1)
        .config(move |cfg| {
            cfg.categories[0].cloud = CloudPermission::OnFailure;
            cfg.categories[0].providers = vec!["echo".into()];
            cfg.providers.push(ProviderConfig {
                name: "echo".into(),
                base_url: url,
                secret: "trust-echo".into(),
                ..ProviderConfig::default()
            });
        })
        .start()
        .await;
    c.sims[0].stop();
    let answer = c.chat("llama3.2", false).await.text().await.expect("body");
    assert!(answer.contains("HTTP 401"), "the provider's refusal is reported: {answer}");
    let test = c.admin(Method::POST, "/admin/providers/echo/test").send().await.expect("answer").text().await;
    let test = test.expect("body");
    assert!(test.contains("provider_refused"), "{test}");
    for path in ["/admin/providers", "/admin/secrets", "/admin/config/export", "/admin/status"] {
        let body = c.admin(Method::GET, path).send().await.expect("answer").text().await.expect("body");
        assert!(!body.contains("canary-echo"), "{path} leaks the key");
    }
    for (place, text) in [("the client's answer", &answer), ("the test button", &test)] {
        assert!(!text.contains("canary-echo") && !text.contains("sk-canary"), "{place} leaks the key: {text}");
        assert!(!text.contains(TOKEN), "{place} leaks the admin token");
    }
}
