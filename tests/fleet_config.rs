//! The fleet's shared config (issue 18, item 2) and its one history: two `corral serve`
//! processes on one PostgreSQL. A category changed through broker A's admin API is in force on
//! broker B within 2 s (LISTEN/NOTIFY) and written into B's own file; a version typed into the
//! database by hand that does not validate is refused by both, reported in `/admin/status`,
//! and the config in force stays; the requests of both brokers are in one `corral history`.
//! Skipped without a test server (tests/common/pg.rs); `CORRAL_PG=required` fails instead.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::fleet::{serve, until};
use common::process::BIN;
use common::TOKEN;
use corral::sim::{SimNode, SimSpec};
use serde_json::{json, Value};

/// The bound from an edit on one broker to it being in force on another.
const IN_FORCE_BOUND: Duration = Duration::from_secs(2);

fn config_file(dir: &Path, broker: &str, node: &str, db: &str, policy: &str) -> PathBuf {
    let text = format!(
        "# {broker}'s own file: a comment that must survive the fleet's writes\n\
         [[listeners]]\naddr = \"127.0.0.1:0\"\n\n[admin]\naddr = \"127.0.0.1:0\"\n\n\
         [store]\nurl = \"{db}\"\nbroker = \"{broker}\"\n\n\
         [[nodes]]\nname = \"n0\"\nurl = \"{node}\"\n\n\
         [[categories]]\nname = \"default\"\npolicy = \"{policy}\"\n\n\
         [[providers]]\nname = \"openai\"\nbase_url = \"https://api.openai.com/v1\"\nsecret = \"fleet-test-openai\"\n"
    );
    let path = dir.join(format!("{broker}.toml"));
    std::fs::write(&path, text).expect("write");
    path
}

async fn get(client: &reqwest::Client, url: String) -> Value {
    match client.get(url).bearer_auth(TOKEN).send().await {
        Ok(r) => r.json().await.unwrap_or_default(),
        Err(_) => Value::Null,
    }
}

async fn chat(client: &reqwest::Client, proxy: &str, text: &str) -> u16 {
    let body = json!({"model": "llama3.2", "messages": [{"role": "user", "content": text}], "stream": false});
    client.post(format!("{proxy}/api/chat")).json(&body).send().await.map(|r| r.status().as_u16()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_edit_on_one_broker_is_in_force_on_the_other_and_both_keep_one_history() {
    let Some(db) = common::pg::fresh_database("fleet_config").await else { return };
    let sim = SimNode::start(SimSpec { models: vec!["llama3.2".into()], ..SimSpec::default() }).await.expect("sim");
    let dir = std::env::temp_dir().join(format!("corral-fleet-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    // A starts first and publishes its shared part as version 1; B's file says otherwise and
    // takes the fleet's (the database is the source of truth).
    let a_file = config_file(&dir, "gw-a", &sim.url(), &db, "least-connections");
    let (_a, a_proxy, a_admin) = serve(&a_file);
    let b_file = config_file(&dir, "gw-b", &sim.url(), &db, "round-robin");
    let (_b, b_proxy, b_admin) = serve(&b_file);
    let client = reqwest::Client::new();
    let b_category = format!("{b_admin}/admin/categories/default");
    let first = get(&client, b_category.clone()).await;
    assert_eq!(first["policy"], "least-connections", "B serves the fleet's version from its start: {first}");

    // The edit on A.
    let mut category = get(&client, format!("{a_admin}/admin/categories/default")).await;
    category["policy"] = json!("priority");
    let put = client
        .put(format!("{a_admin}/admin/categories/default"))
        .bearer_auth(TOKEN)
        .json(&category)
        .send()
        .await
        .expect("put");
    assert!(put.status().is_success(), "{}", put.text().await.unwrap_or_default());
    let took =
        until(Duration::from_secs(10), || async { get(&client, b_category.clone()).await["policy"] == "priority" })
            .await;
    let b_status = get(&client, format!("{b_admin}/admin/status")).await;
    eprintln!(
        "FLEET | category edited on A | in force on B after {took:?} | B's config {}",
        b_status["fleet"]["config"]
    );
    let took = took.expect("the edit never reached B");
    assert!(took <= IN_FORCE_BOUND, "the edit took {took:?} to reach B (bound {IN_FORCE_BOUND:?})");
    assert_eq!(b_status["fleet"]["config"]["version"], 2, "{b_status}");
    let b_text = std::fs::read_to_string(&b_file).expect("B's file");
    let on_disk = corral::Config::parse(&b_text).expect("B's file parses");
    assert_eq!(on_disk.categories[0].policy, corral::config::Policy::Priority, "written into B's file:\n{b_text}");
    assert!(b_text.starts_with("# gw-b's own file"), "B's comment kept:\n{b_text}");
    assert_eq!(on_disk.store.broker.as_deref(), Some("gw-b"), "B's own sections stay B's");
    // Secrets stay in each machine's keyring: B names the one it lacks (or why it cannot ask).
    let c = &b_status["fleet"]["config"];
    let lacks = c["missing_secrets"].as_array().is_some_and(|m| m.contains(&json!("fleet-test-openai")));
    assert!(lacks || c["secrets_error"].is_string(), "B reports its keyring's lack: {c}");

    // A version typed in by hand that does not validate: refused by both, the config stays.
    let pool = sqlx::PgPool::connect(&db).await.expect("connect");
    sqlx::query("INSERT INTO config_versions (version, config, author) VALUES (3, $1, 'by-hand')")
        .bind("[[nodes]]\nname = \"n0\"\nurl = \"ftp://nowhere\"\n")
        .execute(&pool)
        .await
        .expect("insert");
    for admin in [&a_admin, &b_admin] {
        let status = format!("{admin}/admin/status");
        let refused = until(IN_FORCE_BOUND, || async {
            get(&client, status.clone()).await["fleet"]["config"]["refused"]["version"] == 3
        })
        .await;
        let s = get(&client, status.clone()).await;
        assert!(refused.is_some(), "version 3 not reported refused: {}", s["fleet"]);
        let reason = s["fleet"]["config"]["refused"]["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("nodes[0].url"), "the reason names the key: {reason}");
        assert_eq!(s["fleet"]["config"]["version"], 2, "the version in force stays: {}", s["fleet"]);
    }
    assert_eq!(get(&client, b_category.clone()).await["policy"], "priority");

    // Requests through both brokers, in one history.
    assert_eq!(chat(&client, &a_proxy, "through a").await, 200);
    assert_eq!(chat(&client, &b_proxy, "through b").await, 200);
    let history = || {
        let out = std::process::Command::new(BIN)
            .args(["history", "--config", a_file.to_str().unwrap_or_default(), "--format", "json"])
            .output()
            .expect("corral history runs");
        let rows: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let mut brokers: Vec<String> = rows.iter().filter_map(|r| r["broker"].as_str().map(str::to_string)).collect();
        brokers.sort();
        brokers.dedup();
        brokers
    };
    let both = until(Duration::from_secs(10), || async { history() == ["gw-a", "gw-b"] }).await;
    assert!(both.is_some(), "one history shows both brokers' requests: {:?}", history());
}
