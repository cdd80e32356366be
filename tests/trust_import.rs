//! Issue 12, finding 2: imports are reviewed, not trusted. A hostile shared file that
//! re-points a node and flips a private category to the cloud changes nothing of that without
//! a per-change confirmation, and its preview names each change in words, field by field. A
//! file that only adds a provider adds only that provider.

mod common;

use std::process::Command;

use common::cluster;
use corral::config::{CategoryConfig, ProviderConfig};
use corral::sim::{SimNode, SimSpec};
use reqwest::Method;
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_corral");

fn ids(v: &Value, key: &str) -> Vec<String> {
    v[key]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|t| t.as_str().map(str::to_string).or_else(|| t["id"].as_str().map(str::to_string)))
                .collect()
        })
        .unwrap_or_default()
}

fn hostile(evil: &str) -> String {
    format!(
        "[[nodes]]\nname = \"n0\"\nurl = \"{evil}\"\n\n[[categories]]\nname = \"private\"\ncloud = \"on-failure\"\nproviders = [\"backup\"]\nredact = false\n\n[[providers]]\nname = \"backup\"\nbase_url = \"{evil}/v1\"\n"
    )
}

async fn private_chat(c: &common::Cluster) -> reqwest::Response {
    c.client
        .post(c.url("/api/chat"))
        .header("x-corral-category", "private")
        .json(&json!({"model": "llama3.2", "stream": false, "messages": [{"role": "user", "content": "my diagnosis"}]}))
        .send()
        .await
        .expect("answer")
}

#[tokio::test]
async fn a_merge_import_that_re_points_a_node_and_flips_a_category_changes_nothing_without_confirmation() {
    let evil = SimNode::start(SimSpec::default()).await.expect("the attacker's node");
    let c = cluster(1)
        .config(|cfg| {
            cfg.categories.push(CategoryConfig { name: "private".into(), redact: true, ..CategoryConfig::default() })
        })
        .start()
        .await;
    let mine = c.broker.config().nodes[0].url.clone();
    let preview: Value = c
        .admin(Method::POST, "/admin/config/import?mode=merge&dry_run=true")
        .body(hostile(&evil.url()))
        .send()
        .await
        .expect("answer")
        .json()
        .await
        .expect("json");
    let node = preview["changes"].as_array().and_then(|a| a.iter().find(|c| c["name"] == "n0")).expect("n0 listed");
    assert_eq!(
        node["fields"],
        json!([{"field": "url", "old": format!("\"{mine}\""), "new": format!("\"{}\"", evil.url())}]),
        "every changed field, old -> new, and only those"
    );
    let trust = ids(&preview, "trust");
    for id in ["node:n0:url", "category:private:cloud", "category:private:redact", "category:private:providers"] {
        assert!(trust.contains(&id.to_string()), "{id} is a trust change: {preview}");
    }
    let words: Vec<&str> =
        preview["trust"].as_array().into_iter().flatten().filter_map(|t| t["message"].as_str()).collect();
    assert!(words.iter().any(|w| w.contains("node n0 would receive requests") && w.contains(&evil.url())), "{words:?}");
    assert!(words.iter().any(|w| w.contains("category private would send requests to cloud providers")), "{words:?}");
    assert!(words.iter().any(|w| w.contains("stop masking personal data")), "{words:?}");

    let applied: Value = c
        .admin(Method::POST, "/admin/config/import?mode=merge")
        .body(hostile(&evil.url()))
        .send()
        .await
        .expect("answer")
        .json()
        .await
        .expect("json");
    assert_eq!(ids(&applied, "held_back").len(), trust.len(), "every trust change is held back: {applied}");
    let config = c.broker.config();
    assert_eq!(config.nodes[0].url, mine, "the node still points where it did");
    let private = config.categories.iter().find(|k| k.name == "private").expect("private");
    assert_eq!(
        (private.cloud, private.redact, private.providers.len()),
        (corral::config::CloudPermission::Never, true, 0)
    );
    assert!(config.providers.iter().any(|p| p.name == "backup"), "the rest of the file applies");
    for _ in 0..6 {
        assert_eq!(private_chat(&c).await.status(), 200);
    }
    assert_eq!(evil.inference_count(), 0, "no private prompt reached the attacker's node");
    assert!(evil.received().is_empty());

    // Confirmed one by one: only the accepted change applies.
    let r = c
        .admin(Method::POST, "/admin/config/import?mode=merge&accept=node:n0:url")
        .body(hostile(&evil.url()))
        .send()
        .await;
    let v: Value = r.expect("answer").json().await.expect("json");
    assert!(!ids(&v, "held_back").contains(&"node:n0:url".to_string()), "{v}");
    let config = c.broker.config();
    assert_eq!(config.nodes[0].url, evil.url(), "accepted");
    let private = config.categories.iter().find(|k| k.name == "private").expect("private");
    assert_eq!(private.cloud, corral::config::CloudPermission::Never, "not accepted, still held back");
}

#[tokio::test]
async fn a_file_with_only_a_provider_adds_only_that_provider() {
    let c = cluster(2)
        .config(|cfg| {
            cfg.categories[0].policy = corral::config::Policy::RoundRobin;
            cfg.categories[0].queue_timeout_ms = 1234;
        })
        .start()
        .await;
    let before = c.broker.config();
    let file = "[[providers]]\nname = \"backup\"\nbase_url = \"https://backup.example/v1\"\n";
    let v: Value = c
        .admin(Method::POST, "/admin/config/import?mode=merge")
        .body(file)
        .send()
        .await
        .expect("answer")
        .json()
        .await
        .expect("json");
    assert_eq!(v["changes"].as_array().map(Vec::len), Some(1), "one change: {v}");
    assert_eq!(
        (v["changes"][0]["action"].as_str(), v["changes"][0]["kind"].as_str()),
        (Some("added"), Some("provider"))
    );
    let after = c.broker.config();
    assert_eq!(after.nodes, before.nodes, "no node `local` appears");
    assert_eq!(after.categories, before.categories, "the default category is not reset");
    let expected = vec![ProviderConfig {
        name: "backup".into(),
        base_url: "https://backup.example/v1".into(),
        ..ProviderConfig::default()
    }];
    assert_eq!(after.providers, expected);
}

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).args(args).output().expect("corral runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn temp_file(name: &str, text: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("corral-trust-import-{}-{name}.toml", std::process::id()));
    std::fs::write(&p, text).expect("write");
    p
}

#[test]
fn the_cli_previews_in_words_and_applies_trust_changes_only_when_accepted() {
    let mine = temp_file(
        "mine",
        "[[nodes]]\nname = \"gpu1\"\nurl = \"http://10.0.0.1:11434\"\n\n[[categories]]\nname = \"default\"\ncloud = \"never\"\n",
    );
    let theirs = temp_file(
        "theirs",
        "[[nodes]]\nname = \"gpu1\"\nurl = \"http://10.9.9.9:11434\"\n\n[[categories]]\nname = \"default\"\ncloud = \"on-failure\"\nproviders = [\"x\"]\n\n[[providers]]\nname = \"x\"\nbase_url = \"https://x.example/v1\"\n",
    );
    let (mine_s, theirs_s) = (mine.to_str().unwrap_or_default(), theirs.to_str().unwrap_or_default());
    let (code, out, err) = run(&["config", "import", theirs_s, "--config", mine_s, "--dry-run"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("~ node gpu1 (changed)"), "{out}");
    assert!(out.contains("    url: \"http://10.0.0.1:11434\" -> \"http://10.9.9.9:11434\""), "field by field: {out}");
    assert!(out.contains("! [node:gpu1:url] node gpu1 would receive requests"), "{out}");
    assert!(
        out.contains("! [category:default:cloud] category default would send requests to cloud providers"),
        "{out}"
    );

    let (code, out, _) = run(&["config", "import", theirs_s, "--config", mine_s, "--merge"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("held back 3 trust change(s)"), "{out}");
    let merged = corral::Config::load(&mine).expect("valid");
    assert_eq!(merged.nodes[0].url, "http://10.0.0.1:11434");
    assert_eq!(merged.categories[0].cloud, corral::config::CloudPermission::Never);
    assert_eq!(merged.providers.len(), 1, "the provider itself is added");

    let (code, out, _) =
        run(&["config", "import", theirs_s, "--config", mine_s, "--merge", "--accept-trust-changes=node:gpu1:url"]);
    assert_eq!(code, 0, "{out}");
    let merged = corral::Config::load(&mine).expect("valid");
    assert_eq!(merged.nodes[0].url, "http://10.9.9.9:11434", "the accepted change");
    assert_eq!(merged.categories[0].cloud, corral::config::CloudPermission::Never, "the others stay held back");

    let (code, out, _) = run(&["config", "import", theirs_s, "--config", mine_s, "--merge", "--accept-trust-changes"]);
    assert_eq!(code, 0, "{out}");
    let merged = corral::Config::load(&mine).expect("valid");
    assert_eq!(merged.categories[0].cloud, corral::config::CloudPermission::OnFailure, "all accepted");

    // An import whose only change is held back writes nothing, and says so.
    let repoint = temp_file("repoint", "[[nodes]]\nname = \"gpu1\"\nurl = \"http://10.7.7.7:11434\"\n");
    let before = std::fs::read_to_string(&mine).expect("read");
    let (code, out, _) =
        run(&["config", "import", repoint.to_str().unwrap_or_default(), "--config", mine_s, "--merge"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("nothing written") && !out.contains("wrote "), "{out}");
    assert_eq!(std::fs::read_to_string(&mine).expect("read"), before, "the file is as it was");
}
