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
