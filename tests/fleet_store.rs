//! A broker's records on a fleet's PostgreSQL (issue 18): every row names its broker, and
//! `/admin/requests?broker=` picks one broker's rows. Skipped without a test server (see
//! tests/common/pg.rs); with `CORRAL_PG=required` a missing one fails.

mod common;

use std::time::Duration;

use common::cluster;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread")]
async fn a_broker_writes_its_records_into_postgres_under_its_name() {
    let Some(url) = common::pg::fresh_database("fleet_store").await else { return };
    let c = cluster(1)
        .config(move |cfg| {
            cfg.store.url = Some(url);
            cfg.store.broker = Some("gw-a".into());
        })
        .start()
        .await;
    for _ in 0..3 {
        assert!(c.chat("llama3.2", false).await.status().is_success(), "served");
    }
    let list = |q: &'static str| {
        let req = c.admin(reqwest::Method::GET, q);
        async move { req.send().await.expect("answer").json::<Value>().await.expect("json") }
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut mine = Value::Null;
    while tokio::time::Instant::now() < deadline {
        mine = list("/admin/requests?broker=gw-a").await;
        if mine["total"] == 3 && mine["requests"].as_array().is_some_and(|r| r.iter().all(|r| r["status"] == "ok")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(mine["total"], 3, "the three requests are in PostgreSQL: {mine}");
    let rows = mine["requests"].as_array().expect("rows");
    assert!(rows.iter().all(|r| r["broker"] == "gw-a"), "every row names its broker: {mine}");
    let other = list("/admin/requests?broker=gw-b").await;
    assert_eq!(other["total"], 0, "no row of another broker: {other}");
    let all = list("/admin/requests").await;
    assert_eq!(all["total"], 3, "without a filter, the whole fleet's: {all}");
    let status = c.admin(reqwest::Method::GET, "/admin/status").send().await.expect("status");
    let store = status.json::<Value>().await.expect("json")["store"].clone();
    assert_eq!(store["engine"], "postgres", "{store}");
    assert_eq!(store["broker"], "gw-a", "{store}");
    assert!(store["last_error"].is_null(), "writes succeed: {store}");
}

/// A PostgreSQL cluster of this test's own (`scripts/pg-cluster`), so stopping it cuts off no
/// other test. Dropped, it is stopped and its directory removed, even if the test failed midway.
struct OwnCluster {
    dir: std::path::PathBuf,
}

impl OwnCluster {
    fn script(cmd: &str, dir: &std::path::Path) -> String {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/pg-cluster");
        let out = std::process::Command::new(script).arg(cmd).arg(dir).output().expect("run scripts/pg-cluster");
        assert!(out.status.success(), "pg-cluster {cmd}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// A new cluster; its server URL.
    fn start() -> (OwnCluster, String) {
        let parent = std::env::temp_dir().join(format!("corral-outage-{}", std::process::id()));
        std::fs::create_dir_all(&parent).expect("temp dir");
        #[cfg(unix)]
        std::fs::set_permissions(&parent, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
        let dir = parent.join("cluster");
        let url = Self::script("start", &dir);
        (OwnCluster { dir }, url)
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/pg-cluster");
        let _ = std::process::Command::new(script).arg("stop").arg(&self.dir).output();
        if let Some(parent) = self.dir.parent() {
            let _ = std::fs::remove_dir_all(parent);
        }
    }
}

/// Database outage: PostgreSQL stopped for 10 s under load. No client request fails because of
/// it, and afterwards every record from the outage is in the database: the load is bounded
/// (at most 600 requests, 2 records each, 1,200 in all), well within the writer's buffer
/// (`store.channel_capacity`, 10,000 by default, plus the batch in hand), so nothing may be
/// dropped. The config stays as it was.
#[tokio::test(flavor = "multi_thread")]
async fn a_database_outage_loses_no_record_and_fails_no_request() {
    if common::pg::fresh_database("fleet_outage").await.is_none() {
        return;
    }
    let (own, url) = OwnCluster::start();
    let store_url = url.clone();
    let c = cluster(1)
        .config(move |cfg| {
            cfg.store.url = Some(store_url);
            cfg.store.broker = Some("gw-out".into());
        })
        .start()
        .await;
    let config_before = c.broker.shared().config();
    let store = c.broker.shared().telemetry.store().expect("store on").clone();
    let client = reqwest::Client::new();
    let chat_url = c.url("/api/chat");
    // The load: one request every 20 ms, bounded in count (600) and so in time (~12 s and more).
    let load = tokio::spawn(async move {
        let mut failed = Vec::new();
        for i in 0..600 {
            let body = serde_json::json!({"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}], "stream": false});
            match client.post(&chat_url).json(&body).send().await {
                Ok(r) if r.status().is_success() => {}
                Ok(r) => failed.push(format!("request {i}: {}", r.status())),
                Err(e) => failed.push(format!("request {i}: {e}")),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        failed
    });
    OwnCluster::script("stop", &own.dir);
    // A deliberate wait: the outage is 10 s long by definition, not a race papered over.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let held = store.status();
    OwnCluster::script("start", &own.dir);
    let failed = load.await.expect("load task");
    assert!(failed.is_empty(), "no client request fails because of the outage: {failed:?}");
    assert!(held.last_error.is_some(), "status said the writes failed during the outage: {held:?}");
    let pool = sqlx::PgPool::connect(&url).await.expect("connect after the outage");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut written = 0i64;
    while tokio::time::Instant::now() < deadline {
        written = sqlx::query_scalar("SELECT COUNT(*) FROM requests WHERE broker = 'gw-out' AND status = 'ok'")
            .fetch_one(&pool)
            .await
            .expect("count");
        if written == 600 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(written, 600, "every request's finished row is in the database, none left running");
    assert_eq!(store.dropped(), 0, "within the buffer bound nothing is dropped");
    assert!(store.status().last_error.is_none(), "writes succeed again: {:?}", store.status());
    assert_eq!(*c.broker.shared().config(), *config_before, "the config stays as it was");
    pool.close().await;
    drop(c);
    drop(own);
}
