//! Client keys fleet-wide (issue 18, item 5): two `corral serve` processes on one PostgreSQL.
//! A key created through broker A's admin API authenticates on broker B (whose listener takes
//! every fleet key, `api_keys = ["*"]`) within 2 s; the database holds its SHA-256 verifier,
//! never the key; usage (requests, tokens) is summed over both brokers; a revoke on A stops
//! the key on B within 2 s. Skipped without a test server (tests/common/pg.rs).

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::fleet::{serve, until};
use common::TOKEN;
use corral::sim::{SimNode, SimSpec};
use serde_json::{json, Value};
use sha2::Digest;

const BOUND: Duration = Duration::from_secs(2);

/// The fleet-wide request quota of key team-b (in A's file; B takes it from the fleet).
const QUOTA: u64 = 8;

fn config_file(dir: &Path, broker: &str, node: &str, db: &str, keys: &str) -> PathBuf {
    // A 31-day window: the test never straddles two.
    let text = format!(
        "[[listeners]]\naddr = \"127.0.0.1:0\"\napi_keys = {keys}\n\n[admin]\naddr = \"127.0.0.1:0\"\n\n\
         [store]\nurl = \"{db}\"\nbroker = \"{broker}\"\n\n[[nodes]]\nname = \"n0\"\nurl = \"{node}\"\n\n\
         [[quotas]]\nkey = \"team-b\"\nrequests = {QUOTA}\nwindow_s = 2678400\n"
    );
    let path = dir.join(format!("{broker}.toml"));
    std::fs::write(&path, text).expect("write");
    path
}

async fn chat(client: &reqwest::Client, proxy: &str, key: Option<&str>) -> u16 {
    let body = json!({"model": "llama3.2", "messages": [{"role": "user", "content": "count me"}], "stream": false});
    let mut req = client.post(format!("{proxy}/api/chat")).json(&body);
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    req.send().await.map(|r| r.status().as_u16()).unwrap_or(0)
}

async fn keys_listed(client: &reqwest::Client, admin: &str) -> Value {
    match client.get(format!("{admin}/admin/client-keys")).bearer_auth(TOKEN).send().await {
        Ok(r) => r.json().await.unwrap_or_default(),
        Err(_) => Value::Null,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_made_on_one_broker_works_on_the_other_and_its_usage_is_summed() {
    let Some(db) = common::pg::fresh_database("fleet_keys").await else { return };
    let sim = SimNode::start(SimSpec { models: vec!["llama3.2".into()], ..SimSpec::default() }).await.expect("sim");
    let dir = std::env::temp_dir().join(format!("corral-fleet-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let (_a, a_proxy, a_admin) = serve(&config_file(&dir, "gw-a", &sim.url(), &db, "[\"team-b\"]"));
    let (_b, b_proxy, b_admin) = serve(&config_file(&dir, "gw-b", &sim.url(), &db, "[\"*\"]"));
    let client = reqwest::Client::new();
    assert_eq!(chat(&client, &b_proxy, None).await, 401, "B asks for a key");
    assert_eq!(chat(&client, &b_proxy, Some("ck-guess")).await, 401, "a made-up key is refused");

    let made = client
        .post(format!("{a_admin}/admin/client-keys"))
        .bearer_auth(TOKEN)
        .json(&json!({"name": "team-b"}))
        .send()
        .await
        .expect("create");
    assert_eq!(made.status(), 201);
    let made: Value = made.json().await.expect("json");
    let key = made["key"].as_str().expect("the key, once").to_string();
    assert_eq!(made["fleet"], true, "{made}");
    // The poll stops at its first success: that one request counts.
    let on_b = until(BOUND, || async { chat(&client, &b_proxy, Some(&key)).await == 200 }).await;
    let mut served = usize::from(on_b.is_some());
    eprintln!("FLEET | client key created on A | authenticates on B after {on_b:?}");
    assert!(on_b.is_some(), "the key made on A did not work on B within {BOUND:?}");
    for _ in 0..3 {
        assert_eq!(chat(&client, &a_proxy, Some(&key)).await, 200, "and on A");
        served += 1;
    }
    assert_eq!(chat(&client, &b_proxy, Some(&key)).await, 200);
    served += 1;
    let again = client
        .post(format!("{a_admin}/admin/client-keys"))
        .bearer_auth(TOKEN)
        .json(&json!({"name": "team-b"}))
        .send()
        .await
        .expect("again");
    assert_eq!(again.status(), 409, "a fleet key's name is taken fleet-wide");

    // The database: a verifier, never the key.
    let pool = sqlx::PgPool::connect(&db).await.expect("connect");
    let stored: String = sqlx::query_scalar("SELECT verifier FROM client_keys WHERE name = 'team-b'")
        .fetch_one(&pool)
        .await
        .expect("row");
    let want: String = sha2::Sha256::digest(key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(stored, want, "the SHA-256 of the key");
    let anywhere: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM (SELECT verifier AS v FROM client_keys UNION ALL SELECT name FROM key_usage \
         UNION ALL SELECT config FROM config_versions) t WHERE v LIKE '%' || $1 || '%'",
    )
    .bind(&key)
    .fetch_one(&pool)
    .await
    .expect("count");
    assert_eq!(anywhere, 0, "the key itself is nowhere in the database");

    // Usage summed over both brokers.
    let summed = until(Duration::from_secs(5), || async {
        let l = keys_listed(&client, &a_admin).await;
        let row = l["keys"].as_array().and_then(|k| k.iter().find(|k| k["name"] == "team-b").cloned());
        row.is_some_and(|r| r["usage"]["requests"] == served as i64)
    })
    .await;
    let listed = keys_listed(&client, &a_admin).await;
    assert!(summed.is_some(), "usage of {served} requests over both brokers: {listed}");
    let row =
        listed["keys"].as_array().and_then(|k| k.iter().find(|k| k["name"] == "team-b").cloned()).unwrap_or_default();
    assert!(row["usage"]["prompt_tokens"].as_i64().unwrap_or(0) > 0, "prompt tokens counted: {row}");
    assert!(row["usage"]["output_tokens"].as_i64().unwrap_or(0) > 0, "output tokens counted: {row}");
    let per_broker: Vec<(String, i64)> =
        sqlx::query_as("SELECT broker, requests FROM key_usage WHERE name = 'team-b' ORDER BY broker")
            .fetch_all(&pool)
            .await
            .expect("rows");
    assert_eq!(per_broker.len(), 2, "both brokers counted: {per_broker:?}");

    // The quota holds across brokers: A learns B's count, takes the rest, then both refuse.
    let quota_used = |admin: String| {
        let client = client.clone();
        async move {
            let l = keys_listed(&client, &admin).await;
            let row = l["keys"].as_array().and_then(|k| k.iter().find(|k| k["name"] == "team-b").cloned());
            row.map(|r| r["quota"]["used"]["requests"].as_u64().unwrap_or(0)).unwrap_or(0)
        }
    };
    let want = served as u64;
    let known = until(Duration::from_secs(5), || {
        let used = quota_used(a_admin.clone());
        async move { used.await == want }
    })
    .await;
    assert!(
        known.is_some(),
        "A never counted B's requests against the quota: {}",
        keys_listed(&client, &a_admin).await
    );
    while (served as u64) < QUOTA {
        assert_eq!(chat(&client, &a_proxy, Some(&key)).await, 200, "within the quota ({served} of {QUOTA})");
        served += 1;
    }
    let over = client
        .post(format!("{a_proxy}/api/chat"))
        .bearer_auth(&key)
        .json(&json!({"model": "llama3.2", "messages": [{"role": "user", "content": "one more"}], "stream": false}))
        .send()
        .await
        .expect("answer");
    assert_eq!(over.status(), 429, "past the quota on A");
    assert!(over.headers().get("retry-after").is_some(), "says when the window ends");
    let body: Value = over.json().await.expect("json");
    assert_eq!(body["code"], "quota_exceeded", "{body}");
    let b_refuses = until(Duration::from_secs(5), || async { chat(&client, &b_proxy, Some(&key)).await == 429 }).await;
    eprintln!(
        "FLEET | quota of {QUOTA} over two brokers | A knew B's count after {known:?} | B refused after {b_refuses:?}"
    );
    assert!(b_refuses.is_some(), "B never refused past the fleet-wide quota");
    assert_eq!(quota_used(b_admin.clone()).await, QUOTA, "B's view: the fleet used all {QUOTA}");

    // Revoked on A: refused on B.
    let revoked =
        client.delete(format!("{a_admin}/admin/client-keys/team-b")).bearer_auth(TOKEN).send().await.expect("revoke");
    assert!(revoked.status().is_success(), "{}", revoked.text().await.unwrap_or_default());
    let refused = until(BOUND, || async { chat(&client, &b_proxy, Some(&key)).await == 401 }).await;
    assert!(refused.is_some(), "the revoked key still works on B");
    assert_eq!(chat(&client, &a_proxy, Some(&key)).await, 401, "and on A");
}
